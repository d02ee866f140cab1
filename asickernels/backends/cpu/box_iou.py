"""Box-pair metrics (IoU, GIOU, DIoU, CIoU) on the native CPU kernels (``box_iou.cpp``),
paired (``[P, 4]`` x2 -> ``[P]``) and pairwise (``[B, N, 4]`` x ``[B, M, 4]`` -> ``[B, N, M]``),
with their gradients. Each kernel is one function for JAX arrays (XLA's FFI; a
``custom_vjp`` whose backward pass is the native gradient kernel, so ``jax.grad`` works under
``jit`` and ``vmap``) and numpy arrays (the host). float64 boxes are computed in float64,
anything else in float32."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from asickernels.backends.cpu import BACKEND, _library
from asickernels.kernels import public as ops
from asickernels.kernels.declaration import Array, Op
from asickernels.kernels.registry import FLOAT32_AND_64

# The kernels' calls: the handler asickernels_cpu_ffi_<kind> on the arrays (of one float
# dtype), its metric named by the "metric" attribute.


def _paired_call(metric: str, boxes1: Array, boxes2: Array) -> Any:
    result = (boxes1.shape[:-1], boxes1.dtype)
    return _library.call("paired_box_metric", (boxes1, boxes2), [result], metric=metric)


def _paired_vjp_call(metric: str, boxes1: Array, boxes2: Array, cotangent: Array) -> Any:
    result = (boxes1.shape, boxes1.dtype)
    arrays = (boxes1, boxes2, cotangent)
    return _library.call("paired_box_metric_vjp", arrays, [result, result], metric=metric)


def _paired_vjp_first_call(metric: str, boxes1: Array, boxes2: Array, cotangent: Array) -> Any:
    """The gradient with respect to ``boxes1`` alone."""
    result = (boxes1.shape, boxes1.dtype)
    arrays = (boxes1, boxes2, cotangent)
    return _library.call("paired_box_metric_vjp_first", arrays, [result], metric=metric)


def _pairwise_call(metric: str, boxes1: Array, boxes2: Array) -> Any:
    result = (boxes1.shape[:-1] + boxes2.shape[-2:-1], boxes1.dtype)
    return _library.call("pairwise_box_metric", (boxes1, boxes2), [result], metric=metric)


def _pairwise_vjp_call(metric: str, boxes1: Array, boxes2: Array, cotangent: Array) -> Any:
    results = [(boxes1.shape, boxes1.dtype), (boxes2.shape, boxes2.dtype)]
    arrays = (boxes1, boxes2, cotangent)
    return _library.call("pairwise_box_metric_vjp", arrays, results, metric=metric)


# -- JAX: differentiable ---------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _paired(metric: str, boxes1: jax.Array, boxes2: jax.Array) -> jax.Array:
    return _paired_call(metric, boxes1, boxes2)


Residuals = tuple[jax.Array, jax.Array, bool, bool]


def _paired_forward(metric: str, boxes1: Any, boxes2: Any) -> tuple[jax.Array, Residuals]:
    # symbolic_zeros: the arguments are CustomVJPPrimal, saying which are differentiated.
    residuals = (boxes1.value, boxes2.value, boxes1.perturbed, boxes2.perturbed)
    return _paired_call(metric, boxes1.value, boxes2.value), residuals


def _paired_backward(
    metric: str, residuals: Residuals, cotangent: Any
) -> tuple[jax.Array | None, ...]:
    boxes1, boxes2, wants1, wants2 = residuals
    if isinstance(cotangent, jax.custom_derivatives.SymbolicZero):
        return None, None
    cotangent = cotangent.astype(boxes1.dtype)
    if wants1 and not wants2:  # e.g. predictions against fixed targets
        return _paired_vjp_first_call(metric, boxes1, boxes2, cotangent), None
    return _paired_vjp_call(metric, boxes1, boxes2, cotangent)


_paired.defvjp(_paired_forward, _paired_backward, symbolic_zeros=True)


def _with_both_gradients(
    call: Callable[..., jax.Array], vjp_call: Callable[..., tuple[jax.Array, jax.Array]]
) -> Callable[..., jax.Array]:
    """``call(metric, boxes1, boxes2)``, differentiable: its backward pass is ``vjp_call(metric,
    boxes1, boxes2, cotangent)``, the gradients of both boxes."""

    @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
    def run(metric: str, boxes1: jax.Array, boxes2: jax.Array) -> jax.Array:
        return call(metric, boxes1, boxes2)

    def forward(
        metric: str, boxes1: jax.Array, boxes2: jax.Array
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        return call(metric, boxes1, boxes2), (boxes1, boxes2)

    def backward(
        metric: str, residuals: tuple[jax.Array, jax.Array], cotangent: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        boxes1, boxes2 = residuals
        return vjp_call(metric, boxes1, boxes2, cotangent.astype(boxes1.dtype))

    run.defvjp(forward, backward)
    return run


_paired_without_symbolic_zeros = _with_both_gradients(_paired_call, _paired_vjp_call)


def _differentiable_paired(metric: str, boxes1: Array, boxes2: Array) -> jax.Array:
    try:
        return _paired(metric, boxes1, boxes2)  # type: ignore[no-any-return]
    except NotImplementedError as error:
        # shard_map has no custom_vjp symbolic zeros (jax 0.10): there both gradients are
        # computed whichever is wanted.
        if "symbolic_zeros" not in str(error):
            raise
        return _paired_without_symbolic_zeros(metric, boxes1, boxes2)


_pairwise = _with_both_gradients(_pairwise_call, _pairwise_vjp_call)


def paired_metric(metric: str) -> Callable[..., Any]:
    """``(boxes1 [P, 4], boxes2 [P, 4]) -> [P]`` ``metric``: differentiable for JAX arrays."""

    def run(boxes1: Array, boxes2: Array) -> Any:
        boxes1, boxes2 = _library.float_arrays(boxes1, boxes2)
        if _library.on_host(boxes1, boxes2):
            return _paired_call(metric, boxes1, boxes2)
        return _differentiable_paired(metric, boxes1, boxes2)

    run.__doc__ = f"""``[P, 4]`` x2 -> ``[P]`` {metric} (float64 for float64 boxes, else
    float32); differentiable (the backward pass is the native gradient kernel)."""
    return run


def paired_metric_vjp(metric: str) -> Callable[..., Any]:
    """``(boxes1, boxes2 [P, 4], cotangent [P]) -> (d_boxes1, d_boxes2)`` of ``metric``."""

    def run(boxes1: Array, boxes2: Array, cotangent: Array) -> Any:
        return _paired_vjp_call(metric, *_library.float_arrays(boxes1, boxes2, cotangent))

    run.__doc__ = f"""``[P, 4]``, ``[P, 4]``, ``[P]`` -> gradients ``[P, 4]`` x2 of
    ``sum(cotangent * {metric})``."""
    return run


def _pairwise_metric(metric: str) -> Callable[..., Any]:
    def run(boxes1: Array, boxes2: Array) -> Any:
        """``[B, N, 4]`` x ``[B, M, 4]`` -> ``[B, N, M]`` (float64 for float64 boxes, else
        float32); differentiable for JAX arrays (the backward pass is the native gradient
        kernel)."""
        boxes1, boxes2 = _library.float_arrays(boxes1, boxes2)
        if _library.on_host(boxes1, boxes2):
            return _pairwise_call(metric, boxes1, boxes2)
        return _pairwise(metric, boxes1, boxes2)

    return run


def declared(kernel: Op, run: Callable[..., Any]) -> Callable[..., Any]:
    """``run`` declared as the backend's ``kernel``, for JAX and numpy arrays alike."""
    return BACKEND.host_twin(kernel)(BACKEND.implements(kernel, dtypes=FLOAT32_AND_64)(run))


box_iou = declared(ops.box_iou, _pairwise_metric("iou"))
generalized_box_iou = declared(ops.generalized_box_iou, _pairwise_metric("giou"))
diou = declared(ops.diou, paired_metric("diou"))
ciou = declared(ops.ciou, paired_metric("ciou"))
diou_vjp = declared(ops.diou_vjp, paired_metric_vjp("diou"))
ciou_vjp = declared(ops.ciou_vjp, paired_metric_vjp("ciou"))
