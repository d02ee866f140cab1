"""The ``torch.ops.asickernels`` operators: schemas, fake (meta) implementations, the CPU
implementations and autograd.

Every operator runs the library's own op (``asickernels.giou`` and so on): the validation,
the semantics and the dtypes are those of the JAX API. On CPU tensors the op runs on
:data:`CPU_BACKEND`, jitted when it is a JAX backend. float64 inputs to GIOU and the GIOU
loss are the exception: they are computed in float64 by the numpy reference (and return
float64), so that ``torch.autograd.gradcheck`` can check the gradient. Device kernels for
torch_xla tensors are added by :mod:`asickernels.torch.xla`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import ml_dtypes
import numpy as np
import torch

import asickernels
from asickernels import reference
from asickernels.kernels import registry

# The fastest CPU implementation the library has, measured at the seed sizes (see the
# README's "PyTorch" section for the numbers and the command).
CPU_BACKEND = "xla"

# Arguments of each public op that are Python values rather than arrays (static under jit).
_STATIC_ARGS = {
    "giou": ("backend", "config"),
    "giou_vjp": ("backend", "config"),
    "giou_loss": ("reduction", "backend", "config"),
    "nms": ("iou_threshold", "max_output_size", "score_threshold", "backend", "config"),
    "batched_nms": ("iou_threshold", "max_output_size", "score_threshold", "backend", "config"),
    "int8_matmul": ("out_dtype", "backend", "config"),
    "quantize_int8": ("axis",),
}


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy (or ml_dtypes) dtype of a torch dtype."""
    if dtype == torch.bfloat16:
        return np.dtype(ml_dtypes.bfloat16)
    return torch.empty((), dtype=dtype).numpy().dtype


def _to_host(tensor: torch.Tensor | None) -> np.ndarray | None:
    if tensor is None:
        return None
    tensor = tensor.detach().contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def _to_torch(array: Any) -> torch.Tensor:
    if isinstance(array, jax.Array):
        return torch.from_dlpack(array)
    return torch.from_numpy(np.array(array))


@functools.cache
def _jitted(op: str) -> Callable[..., Any]:
    return jax.jit(getattr(asickernels, op), static_argnames=_STATIC_ARGS[op])


def _split(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Keyword arguments -> (tensors, other values)."""
    arrays = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    return arrays, {k: v for k, v in kwargs.items() if k not in arrays}


def run_on_cpu(op: str, *tensors: torch.Tensor, **kwargs: Any) -> Any:
    """Runs the public op ``asickernels.<op>`` on CPU tensors; returns torch tensors.

    Keyword arguments that are tensors are passed as arrays, the rest as static
    values. ``backend=None`` means :data:`CPU_BACKEND`. A JAX backend runs jitted (one
    compile per shape and static arguments); a host backend runs eagerly on numpy arrays.
    """
    arrays, static = _split(kwargs)
    if "backend" in _STATIC_ARGS[op]:
        static["backend"] = static.get("backend") or CPU_BACKEND
        host = registry.backend(static["backend"]).array_kind == "numpy"
    else:
        host = False
    function = getattr(asickernels, op) if host else _jitted(op)
    host_arrays = {k: _to_host(v) for k, v in arrays.items()}
    result = function(*(_to_host(t) for t in tensors), **host_arrays, **static)
    return jax.tree.map(_to_torch, result)


def check_like_jax(op: str, *tensors: torch.Tensor, **kwargs: Any) -> None:
    """Runs the JAX op's validation on the shapes and dtypes of the tensors (float64 seen
    as float32), without computing anything: for the paths that do not call the JAX op."""

    def spec(t: torch.Tensor) -> jax.ShapeDtypeStruct:
        dtype = np.float32 if t.dtype == torch.float64 else numpy_dtype(t.dtype)
        return jax.ShapeDtypeStruct(tuple(t.shape), dtype)

    arrays, static = _split(kwargs)
    specs = {k: spec(v) for k, v in arrays.items()}
    jax.eval_shape(
        functools.partial(getattr(asickernels, op), **static), *map(spec, tensors), **specs
    )


def _is_float64(*tensors: torch.Tensor | None) -> bool:
    return any(t is not None and t.dtype == torch.float64 for t in tensors)


def _giou_out_dtype(*tensors: torch.Tensor) -> torch.dtype:
    return torch.float64 if _is_float64(*tensors) else torch.float32


# GIOU -------------------------------------------------------------------------------------


@torch.library.custom_op("asickernels::giou", mutates_args=(), device_types="cpu")
def giou(boxes1: torch.Tensor, boxes2: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    if _is_float64(boxes1, boxes2):
        check_like_jax("giou", boxes1, boxes2)
        return torch.from_numpy(reference.giou(_to_host(boxes1), _to_host(boxes2)))
    return run_on_cpu("giou", boxes1, boxes2, backend=backend)


@giou.register_fake
def _(boxes1: torch.Tensor, boxes2: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    return boxes1.new_empty(boxes1.shape[:-1], dtype=_giou_out_dtype(boxes1, boxes2))


@torch.library.custom_op("asickernels::giou_backward", mutates_args=(), device_types="cpu")
def giou_backward(
    boxes1: torch.Tensor, boxes2: torch.Tensor, grad: torch.Tensor, backend: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradient of ``sum(grad * giou(boxes1, boxes2))`` w.r.t. both boxes (float32, or
    float64 from the reference for float64 inputs)."""
    if _is_float64(boxes1, boxes2, grad):
        check_like_jax("giou_vjp", boxes1, boxes2, grad)
        d1, d2 = reference.giou_vjp(_to_host(boxes1), _to_host(boxes2), _to_host(grad))
        return torch.from_numpy(d1), torch.from_numpy(d2)
    return run_on_cpu("giou_vjp", boxes1, boxes2, grad, backend=backend)


@giou_backward.register_fake
def _(
    boxes1: torch.Tensor, boxes2: torch.Tensor, grad: torch.Tensor, backend: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = _giou_out_dtype(boxes1, boxes2, grad)
    return boxes1.new_empty(boxes1.shape, dtype=dtype), boxes2.new_empty(boxes2.shape, dtype=dtype)


def _giou_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    boxes1, boxes2, backend = inputs
    ctx.save_for_backward(boxes1, boxes2)
    ctx.backend = backend


def _giou_grad(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    boxes1, boxes2 = ctx.saved_tensors
    d1, d2 = torch.ops.asickernels.giou_backward(boxes1, boxes2, grad, ctx.backend)
    return d1.to(boxes1.dtype), d2.to(boxes2.dtype), None


giou.register_autograd(_giou_grad, setup_context=_giou_setup)


# GIOU loss --------------------------------------------------------------------------------


@torch.library.custom_op("asickernels::giou_loss", mutates_args=(), device_types="cpu")
def giou_loss(
    preds: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor | None = None,
    reduction: str = "mean",
    backend: str | None = None,
) -> torch.Tensor:
    if _is_float64(preds, targets):
        check_like_jax("giou_loss", preds, targets, mask=mask, reduction=reduction)
        loss = reference.giou_loss(
            _to_host(preds), _to_host(targets), mask=_to_host(mask), reduction=reduction
        )
        return torch.from_numpy(np.asarray(loss, np.float64))
    return run_on_cpu("giou_loss", preds, targets, mask=mask, reduction=reduction, backend=backend)


@giou_loss.register_fake
def _(
    preds: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor | None = None,
    reduction: str = "mean",
    backend: str | None = None,
) -> torch.Tensor:
    shape = preds.shape[:-1] if reduction == "none" else ()
    return preds.new_empty(shape, dtype=_giou_out_dtype(preds, targets))


def _giou_loss_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    preds, targets, mask, reduction, backend = inputs
    ctx.save_for_backward(preds, targets, mask)
    ctx.reduction, ctx.backend = reduction, backend


def _giou_loss_grad(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    """The loss is ``sum(-giou * weight)`` with ``weight`` 0 at padding (and ``1 / count``
    for "mean"), so its gradient is ``giou_backward`` with ``-weight * grad`` as the
    cotangent. Padding boxes are zeroed first so that NaN there cannot leak into 0 * NaN."""
    preds, targets, mask = ctx.saved_tensors
    batch_shape = preds.shape[:-1]
    valid = torch.ones(batch_shape, dtype=torch.bool, device=preds.device)
    if mask is not None:
        valid = mask != 0
    weight = valid.to(grad.dtype)
    if ctx.reduction == "mean":
        weight = weight / valid.sum().clamp(min=1).to(grad.dtype)
    cotangent = -(weight * grad)
    where_valid = valid.unsqueeze(-1)
    d_preds, d_targets = torch.ops.asickernels.giou_backward(
        torch.where(where_valid, preds, 0), torch.where(where_valid, targets, 0), cotangent,
        ctx.backend,
    )  # fmt: skip
    return d_preds.to(preds.dtype), d_targets.to(targets.dtype), None, None, None


giou_loss.register_autograd(_giou_loss_grad, setup_context=_giou_loss_setup)


# NMS --------------------------------------------------------------------------------------


@torch.library.custom_op("asickernels::nms", mutates_args=(), device_types="cpu")
def nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return run_on_cpu(
        "nms", boxes, scores, iou_threshold=iou_threshold, max_output_size=max_output_size,
        score_threshold=score_threshold, backend=backend,
    )  # fmt: skip


@torch.library.custom_op("asickernels::batched_nms", mutates_args=(), device_types="cpu")
def batched_nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    idxs: torch.Tensor,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return run_on_cpu(
        "batched_nms", boxes, scores, idxs, iou_threshold=iou_threshold,
        max_output_size=max_output_size, score_threshold=score_threshold, backend=backend,
    )  # fmt: skip


def _nms_outputs(scores: torch.Tensor, max_output_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    batch_shape = scores.shape[:-1]
    return (
        scores.new_empty((*batch_shape, max_output_size), dtype=torch.int32),
        scores.new_empty(batch_shape, dtype=torch.int32),
    )


@nms.register_fake
def _(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _nms_outputs(scores, max_output_size)


@batched_nms.register_fake
def _(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    idxs: torch.Tensor,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _nms_outputs(scores, max_output_size)


# int8 matmul and quantization -------------------------------------------------------------


@torch.library.custom_op("asickernels::int8_matmul", mutates_args=(), device_types="cpu")
def int8_matmul(
    x: torch.Tensor,
    y: torch.Tensor,
    x_scale: torch.Tensor | None = None,
    y_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    return run_on_cpu(
        "int8_matmul", x, y, x_scale=x_scale, y_scale=y_scale,
        out_dtype=None if out_dtype is None else numpy_dtype(out_dtype), backend=backend,
    )  # fmt: skip


@int8_matmul.register_fake
def _(
    x: torch.Tensor,
    y: torch.Tensor,
    x_scale: torch.Tensor | None = None,
    y_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    return x.new_empty(
        (x.shape[0], y.shape[1]), dtype=matmul_out_dtype(x_scale, y_scale, out_dtype)
    )


def matmul_out_dtype(
    x_scale: torch.Tensor | None, y_scale: torch.Tensor | None, out_dtype: torch.dtype | None
) -> torch.dtype:
    """As :func:`asickernels.int8_matmul`: int32 unless scales or a float dtype are given."""
    if out_dtype is not None:
        return out_dtype
    return torch.int32 if x_scale is None and y_scale is None else torch.float32


@torch.library.custom_op("asickernels::quantize_int8", mutates_args=(), device_types="cpu")
def quantize_int8(x: torch.Tensor, axis: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return run_on_cpu("quantize_int8", x, axis=axis)


@quantize_int8.register_fake
def _(x: torch.Tensor, axis: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    scale_shape = () if axis is None else (x.shape[axis],)
    return x.new_empty(x.shape, dtype=torch.int8), x.new_empty(scale_shape, dtype=torch.float32)
