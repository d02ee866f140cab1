"""Box-pair metrics (IoU, GIOU, DIoU, CIoU) on the native CPU kernels, paired (``[P, 4]`` x2
-> ``[P]``) and pairwise (``[B, N, 4]`` x ``[B, M, 4]`` -> ``[B, N, M]``), with their
gradients: JAX entry points (FFI; ``custom_vjp`` whose backward pass is the native gradient
kernel, so ``jax.grad`` works under ``jit`` and ``vmap``) and host twins (numpy in and out).
float64 boxes are computed in float64, anything else in float32."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from asickernels.backends.cpu import BACKEND, _library
from asickernels.kernels.registry import FLOAT32_AND_64

# The kernels' metric codes (asickernels_cpu::BoxMetric).
METRIC_CODES = {"iou": 0, "giou": 1, "diou": 2, "ciou": 3}
_I, _P = _library.INT, _library.POINTER
_I64 = _library.INT64
# The host entry points (csrc/box_iou.cpp): metric code, dtype code, input pointers, sizes,
# output pointers.
_HOST_ARGTYPES = {
    "paired_box_metric": (_I, _I, _P, _P, _I64, _P),
    "paired_box_metric_vjp": (_I, _I, _P, _P, _P, _I64, _P, _P),
    "pairwise_box_metric": (_I, _I, _P, _P, _I64, _I64, _I64, _P),
    "pairwise_box_metric_vjp": (_I, _I, _P, _P, _P, _I64, _I64, _I64, _P, _P),
}


def _ffi(
    kind: str,
    metric: str,
    dtype: np.dtype,
    results: jax.ShapeDtypeStruct | tuple[jax.ShapeDtypeStruct, ...],
) -> Callable[..., Any]:
    """The FFI call of ``kind`` (e.g. ``"paired_box_metric_vjp"``) for ``metric``."""
    target = _library.ffi_target(f"{kind}_{_library.FLOAT_SUFFIX[np.dtype(dtype)]}")
    call = jax.ffi.ffi_call(target, results, vmap_method="broadcast_all")
    return functools.partial(call, metric=np.int64(METRIC_CODES[metric]))


# -- JAX: paired ---------------------------------------------------------------------------


def _paired_call(metric: str, boxes1: jax.Array, boxes2: jax.Array) -> jax.Array:
    result = jax.ShapeDtypeStruct(boxes1.shape[:-1], boxes1.dtype)
    return _ffi("paired_box_metric", metric, boxes1.dtype, result)(boxes1, boxes2)  # type: ignore[no-any-return]


def _paired_vjp_call(
    metric: str, boxes1: jax.Array, boxes2: jax.Array, cotangent: jax.Array
) -> tuple[jax.Array, jax.Array]:
    result = jax.ShapeDtypeStruct(boxes1.shape, boxes1.dtype)
    call = _ffi("paired_box_metric_vjp", metric, boxes1.dtype, (result, result))
    d1, d2 = call(boxes1, boxes2, cotangent)
    return d1, d2


def _paired_vjp_first_call(
    metric: str, boxes1: jax.Array, boxes2: jax.Array, cotangent: jax.Array
) -> jax.Array:
    """The gradient with respect to ``boxes1`` alone."""
    result = jax.ShapeDtypeStruct(boxes1.shape, boxes1.dtype)
    call = _ffi("paired_box_metric_vjp_first", metric, boxes1.dtype, result)
    return call(boxes1, boxes2, cotangent)  # type: ignore[no-any-return]


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


def _differentiable_paired(metric: str, boxes1: jax.Array, boxes2: jax.Array) -> jax.Array:
    try:
        return _paired(metric, boxes1, boxes2)  # type: ignore[no-any-return]
    except NotImplementedError as error:
        # shard_map has no custom_vjp symbolic zeros (jax 0.10): there both gradients are
        # computed whichever is wanted.
        if "symbolic_zeros" not in str(error):
            raise
        return _paired_without_symbolic_zeros(metric, boxes1, boxes2)


# -- JAX: pairwise -------------------------------------------------------------------------


def _pairwise_call(metric: str, boxes1: jax.Array, boxes2: jax.Array) -> jax.Array:
    result = jax.ShapeDtypeStruct(boxes1.shape[:-1] + boxes2.shape[-2:-1], boxes1.dtype)
    return _ffi("pairwise_box_metric", metric, boxes1.dtype, result)(boxes1, boxes2)  # type: ignore[no-any-return]


def _pairwise_vjp_call(
    metric: str, boxes1: jax.Array, boxes2: jax.Array, cotangent: jax.Array
) -> tuple[jax.Array, jax.Array]:
    result1 = jax.ShapeDtypeStruct(boxes1.shape, boxes1.dtype)
    result2 = jax.ShapeDtypeStruct(boxes2.shape, boxes2.dtype)
    call = _ffi("pairwise_box_metric_vjp", metric, boxes1.dtype, (result1, result2))
    d1, d2 = call(boxes1, boxes2, cotangent)
    return d1, d2


_pairwise = _with_both_gradients(_pairwise_call, _pairwise_vjp_call)


def _jax_inputs(*arrays: jax.Array) -> list[jax.Array]:
    dtype = _library.float_kernel_dtype(*(a.dtype for a in arrays))
    return [jnp.asarray(a).astype(dtype) for a in arrays]


def paired_metric(metric: str) -> Callable[..., jax.Array]:
    """``(boxes1 [P, 4], boxes2 [P, 4]) -> [P]`` ``metric``, differentiable."""

    def run(boxes1: jax.Array, boxes2: jax.Array) -> jax.Array:
        return _differentiable_paired(metric, *_jax_inputs(boxes1, boxes2))

    run.__doc__ = f"""``[P, 4]`` x2 -> ``[P]`` {metric} (float64 for float64 boxes, else
    float32); differentiable (the backward pass is the native gradient kernel)."""
    return run


def paired_metric_vjp(metric: str) -> Callable[..., tuple[jax.Array, jax.Array]]:
    """``(boxes1, boxes2 [P, 4], cotangent [P]) -> (d_boxes1, d_boxes2)`` of ``metric``."""

    def run(
        boxes1: jax.Array, boxes2: jax.Array, cotangent: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        return _paired_vjp_call(metric, *_jax_inputs(boxes1, boxes2, cotangent))

    run.__doc__ = f"""``[P, 4]``, ``[P, 4]``, ``[P]`` -> gradients ``[P, 4]`` x2 of
    ``sum(cotangent * {metric})``."""
    return run


def _pairwise_metric(metric: str) -> Callable[..., jax.Array]:
    def run(boxes1: jax.Array, boxes2: jax.Array) -> jax.Array:
        """``[B, N, 4]`` x ``[B, M, 4]`` -> ``[B, N, M]`` (float64 for float64 boxes, else
        float32); differentiable (the backward pass is the native gradient kernel)."""
        return _pairwise(metric, *_jax_inputs(boxes1, boxes2))

    return run


# -- host (numpy) --------------------------------------------------------------------------


Shapes = tuple[tuple[int, ...], ...]
# A host entry's sizes and output shapes, from its input arrays.
Layout = Callable[..., tuple[tuple[int, ...], Shapes]]


def _metric_host(entry: str, metric: str, layout: Layout, doc: str) -> Callable[..., Any]:
    """The host twin of ``asickernels_cpu_<entry>`` for ``metric``: float inputs of one
    kernel dtype (:func:`_library.float_host_arrays`), sizes and outputs of that dtype as ``layout``
    says."""

    def host(*arrays: np.ndarray) -> Any:
        arrays = tuple(_library.float_host_arrays(*arrays))
        dtype = arrays[0].dtype
        sizes, shapes = layout(*arrays)
        codes = (METRIC_CODES[metric], _library.FLOAT_CODES[dtype])
        function = _library.host_entry(entry, *_HOST_ARGTYPES[entry])
        return _library.run_entry(function, codes, arrays, sizes, [(s, dtype) for s in shapes])

    host.__doc__ = doc
    return host


def _paired_layout(boxes1: np.ndarray, boxes2: np.ndarray) -> tuple[tuple[int, ...], Shapes]:
    shape = boxes1.shape[:-1]
    return (math.prod(shape),), (shape,)


def _paired_vjp_layout(
    boxes1: np.ndarray, boxes2: np.ndarray, cotangent: np.ndarray
) -> tuple[tuple[int, ...], Shapes]:
    return (cotangent.size,), (boxes1.shape, boxes1.shape)


def _pairwise_layout(boxes1: np.ndarray, boxes2: np.ndarray) -> tuple[tuple[int, ...], Shapes]:
    *batch, n, _ = boxes1.shape
    m = boxes2.shape[-2]
    return (math.prod(batch), n, m), ((*batch, n, m),)


def paired_metric_host(metric: str) -> Callable[..., Any]:
    """Host twin of :func:`paired_metric`: numpy ``[P, 4]`` x2 -> numpy ``[P]``."""
    doc = f"numpy ``[P, 4]`` x2 -> ``[P]`` {metric}."
    return _metric_host("paired_box_metric", metric, _paired_layout, doc)


def paired_metric_vjp_host(metric: str) -> Callable[..., Any]:
    """Host twin of :func:`paired_metric_vjp`."""
    doc = f"numpy ``[P, 4]``, ``[P, 4]``, ``[P]`` -> gradients ``[P, 4]`` x2 of {metric}."
    return _metric_host("paired_box_metric_vjp", metric, _paired_vjp_layout, doc)


def _pairwise_metric_host(metric: str) -> Callable[..., Any]:
    doc = f"numpy ``[B, N, 4]`` x ``[B, M, 4]`` -> ``[B, N, M]`` {metric}."
    return _metric_host("pairwise_box_metric", metric, _pairwise_layout, doc)


_FLOATS = FLOAT32_AND_64
box_iou = BACKEND.implements("box_iou", dtypes=_FLOATS)(_pairwise_metric("iou"))
generalized_box_iou = BACKEND.implements("generalized_box_iou", dtypes=_FLOATS)(
    _pairwise_metric("giou")
)
diou = BACKEND.implements("diou", dtypes=_FLOATS)(paired_metric("diou"))
ciou = BACKEND.implements("ciou", dtypes=_FLOATS)(paired_metric("ciou"))
diou_vjp = BACKEND.implements("diou_vjp", dtypes=_FLOATS)(paired_metric_vjp("diou"))
ciou_vjp = BACKEND.implements("ciou_vjp", dtypes=_FLOATS)(paired_metric_vjp("ciou"))

box_iou_host = BACKEND.host_twin("box_iou")(_pairwise_metric_host("iou"))
generalized_box_iou_host = BACKEND.host_twin("generalized_box_iou")(_pairwise_metric_host("giou"))
diou_host = BACKEND.host_twin("diou")(paired_metric_host("diou"))
ciou_host = BACKEND.host_twin("ciou")(paired_metric_host("ciou"))
diou_vjp_host = BACKEND.host_twin("diou_vjp")(paired_metric_vjp_host("diou"))
ciou_vjp_host = BACKEND.host_twin("ciou_vjp")(paired_metric_vjp_host("ciou"))
