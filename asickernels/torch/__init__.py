"""PyTorch frontend: the asickernels ops on torch tensors, as ``torch.ops.asickernels.*``.

Importing this module registers one ``torch.library`` operator per op declaration (with
fake implementations, so they trace under ``torch.compile``, and autograd for the
differentiable ops; :mod:`asickernels.torch.ops`) and their torch_xla kernels
(:mod:`asickernels.torch.xla`). The functions below take the arguments of the JAX op of
the same name in :mod:`asickernels`, without ``config`` (``out_dtype`` is a torch dtype;
Python numbers, lists or numpy arrays where an array is expected become tensors on the
device of the tensors given), validate them as that op does, and return what it returns,
as torch tensors on the inputs' device. Each calls ``torch.ops.asickernels.<name>``: CPU
tensors run the JAX op's own path (selection policy included); torch_xla tensors run the
JAX/Pallas kernels inside the torch_xla graph through ``call_jax``.

``backend`` is a name from :func:`asickernels.available_backends`, or None for the first
backend of the selection policy that runs natively where the inputs live.

``import asickernels`` never imports torch; ``import asickernels.torch`` needs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np

try:
    import torch
except ImportError as error:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "asickernels.torch needs PyTorch: pip install torch (and torch_xla for XLA tensors)"
    ) from error

from torch import Tensor

import asickernels
from asickernels.kernels.declaration import Op
from asickernels.torch import xla as _xla  # noqa: F401  (registers the operators)

__all__ = [
    "batched_nms",
    "box_iou",
    "ciou",
    "ciou_loss",
    "ciou_vjp",
    "diou",
    "diou_loss",
    "diou_vjp",
    "generalized_box_iou",
    "giou",
    "giou_loss",
    "giou_vjp",
    "int8_matmul",
    "nms",
    "quantize_int8",
    "roi_align",
    "roi_align_vjp",
    "roi_pool",
    "roi_pool_vjp",
]

ArrayLike: TypeAlias = "Tensor | float | Sequence[object] | np.ndarray"  # what becomes a tensor


def _call(op: Op, *values: object) -> Any:  # each caller states what its op returns
    """``torch.ops.asickernels.<op.name>`` on the calling function's parameters, given in
    its signature's order: ``op``'s parameters in declaration order, then ``backend`` (a
    test holds each function's signature to that). Positional rather than ``locals()``,
    which ``torch.compile`` cannot trace. The arrays go by position (in declaration order),
    the rest by keyword, as the operator's schema takes them."""
    names = [*(p.name for p in op.params), "backend"]
    given = dict(zip(names, values, strict=True))
    arrays = tuple(given.pop(name) for name in op.array_names)
    if not all(a is None or isinstance(a, Tensor) for a in arrays):
        device = next((a.device for a in arrays if isinstance(a, Tensor)), None)
        arrays = tuple(
            _as_tensor(a, name, device) for name, a in zip(op.array_names, arrays, strict=True)
        )
    try:
        return getattr(torch.ops.asickernels, op.name)(*arrays, **given)
    except RuntimeError as error:  # the dispatcher's check of the schema's argument types
        message = str(error)
        if message.startswith(f"asickernels::{op.name}() Expected a value of type"):
            raise TypeError(message.split("\n", 1)[0]) from None
        raise


def _as_tensor(value: object, name: str, device: torch.device | None) -> Tensor | None:
    if value is None or isinstance(value, Tensor):
        return value
    try:
        return torch.as_tensor(value, device=device)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(
            f"{name} must be a tensor or array-like, got {type(value).__name__}: {error}"
        ) from None


def giou(boxes1: ArrayLike, boxes2: ArrayLike, *, backend: str | None = None) -> Tensor:
    """Generalized IoU of paired ``[..., 4]`` boxes ``(x1, y1, x2, y2)`` of one shape ->
    ``[...]`` in ``[-1, 1]``, float32 (float64 for float64 boxes); differentiable.
    Contract: :func:`asickernels.giou`."""
    return _call(asickernels.giou, boxes1, boxes2, backend)


def giou_vjp(
    boxes1: ArrayLike, boxes2: ArrayLike, cotangent: ArrayLike, *, backend: str | None = None
) -> tuple[Tensor, Tensor]:
    """``(d_boxes1, d_boxes2)`` ``[..., 4]``: the gradient of ``sum(cotangent * giou(boxes1,
    boxes2))`` for ``cotangent [...]``. Contract: :func:`asickernels.giou_vjp`."""
    return _call(asickernels.giou_vjp, boxes1, boxes2, cotangent, backend)


def giou_loss(
    preds: ArrayLike,
    targets: ArrayLike,
    *,
    mask: ArrayLike | None = None,
    reduction: str = "mean",
    backend: str | None = None,
) -> Tensor:
    """``1 - giou(preds, targets)`` over the boxes where ``mask [...]`` is true (None: all),
    reduced by ``reduction`` (``"none"``, ``"sum"``, ``"mean"`` over valid boxes);
    differentiable, with exactly 0 loss and gradient at padding. Contract:
    :func:`asickernels.giou_loss`."""
    return _call(asickernels.giou_loss, preds, targets, mask, reduction, backend)


def nms(
    boxes: ArrayLike,
    scores: ArrayLike,
    *,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float | None = None,
    backend: str | None = None,
) -> tuple[Tensor, Tensor]:
    """Greedy NMS of ``boxes [..., N, 4]`` by ``scores [..., N]`` -> ``(indices
    [..., max_output_size], num_valid [...])``, int32, indices padded with -1. Contract:
    :func:`asickernels.nms`."""
    return _call(
        asickernels.nms, boxes, scores, iou_threshold, max_output_size, score_threshold, backend
    )


def batched_nms(
    boxes: ArrayLike,
    scores: ArrayLike,
    idxs: ArrayLike,
    *,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float | None = None,
    backend: str | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`nms` within each category of ``idxs [..., N]`` (integers). Contract:
    :func:`asickernels.batched_nms`."""
    return _call(
        asickernels.batched_nms,
        boxes,
        scores,
        idxs,
        iou_threshold,
        max_output_size,
        score_threshold,
        backend,
    )


def int8_matmul(
    x: ArrayLike,
    y: ArrayLike,
    *,
    x_scale: ArrayLike | None = None,
    y_scale: ArrayLike | None = None,
    out_dtype: torch.dtype | None = None,
    backend: str | None = None,
) -> Tensor:
    """``x @ y`` of int8 ``x [M, K]`` and ``y [K, N]``, exact in int32; with ``x_scale``
    (scalar or ``[M]``), ``y_scale`` (scalar or ``[N]``) or a float ``out_dtype``, dequantized
    to ``out_dtype`` (default float32). Contract: :func:`asickernels.int8_matmul`."""
    return _call(asickernels.int8_matmul, x, y, x_scale, y_scale, out_dtype, backend)


def quantize_int8(
    x: ArrayLike, axis: int | None = None, *, backend: str | None = None
) -> tuple[Tensor, Tensor]:
    """Symmetric int8 quantization of finite float ``x`` -> ``(q, scale)``: ``q`` int8 of
    ``x``'s shape, ``scale`` float32 ``[x.shape[axis]]`` (``()`` for ``axis=None``).
    Contract: :func:`asickernels.quantize_int8`."""
    return _call(asickernels.quantize_int8, x, axis, backend)


def box_iou(boxes1: ArrayLike, boxes2: ArrayLike, *, backend: str | None = None) -> Tensor:
    """IoU of every pair of ``boxes1 [..., N, 4]`` and ``boxes2 [..., M, 4]`` -> ``[..., N,
    M]``, float32 (float64 for float64 boxes). Contract: :func:`asickernels.box_iou`."""
    return _call(asickernels.box_iou, boxes1, boxes2, backend)


def generalized_box_iou(
    boxes1: ArrayLike, boxes2: ArrayLike, *, backend: str | None = None
) -> Tensor:
    """Generalized IoU of every pair of ``boxes1 [..., N, 4]`` and ``boxes2 [..., M, 4]`` ->
    ``[..., N, M]``; differentiable. Contract: :func:`asickernels.generalized_box_iou`."""
    return _call(asickernels.generalized_box_iou, boxes1, boxes2, backend)


def diou(boxes1: ArrayLike, boxes2: ArrayLike, *, backend: str | None = None) -> Tensor:
    """Distance IoU of paired ``[..., 4]`` boxes -> ``[...]``; differentiable. Contract:
    :func:`asickernels.diou`."""
    return _call(asickernels.diou, boxes1, boxes2, backend)


def diou_vjp(
    boxes1: ArrayLike, boxes2: ArrayLike, cotangent: ArrayLike, *, backend: str | None = None
) -> tuple[Tensor, Tensor]:
    """The gradient of ``sum(cotangent * diou(boxes1, boxes2))``. Contract:
    :func:`asickernels.diou_vjp`."""
    return _call(asickernels.diou_vjp, boxes1, boxes2, cotangent, backend)


def diou_loss(
    preds: ArrayLike,
    targets: ArrayLike,
    *,
    mask: ArrayLike | None = None,
    reduction: str = "mean",
    backend: str | None = None,
) -> Tensor:
    """``1 - diou(preds, targets)`` with :func:`giou_loss`'s ``mask`` and ``reduction``.
    Contract: :func:`asickernels.diou_loss`."""
    return _call(asickernels.diou_loss, preds, targets, mask, reduction, backend)


def ciou(boxes1: ArrayLike, boxes2: ArrayLike, *, backend: str | None = None) -> Tensor:
    """Complete IoU of paired ``[..., 4]`` boxes -> ``[...]``; differentiable. Contract:
    :func:`asickernels.ciou`."""
    return _call(asickernels.ciou, boxes1, boxes2, backend)


def ciou_vjp(
    boxes1: ArrayLike, boxes2: ArrayLike, cotangent: ArrayLike, *, backend: str | None = None
) -> tuple[Tensor, Tensor]:
    """The gradient of ``sum(cotangent * ciou(boxes1, boxes2))``. Contract:
    :func:`asickernels.ciou_vjp`."""
    return _call(asickernels.ciou_vjp, boxes1, boxes2, cotangent, backend)


def ciou_loss(
    preds: ArrayLike,
    targets: ArrayLike,
    *,
    mask: ArrayLike | None = None,
    reduction: str = "mean",
    backend: str | None = None,
) -> Tensor:
    """``1 - ciou(preds, targets)`` with :func:`giou_loss`'s ``mask`` and ``reduction``.
    Contract: :func:`asickernels.ciou_loss`."""
    return _call(asickernels.ciou_loss, preds, targets, mask, reduction, backend)


def roi_align(
    input: ArrayLike,
    rois: ArrayLike,
    output_size: int | Sequence[int],
    *,
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = False,
    backend: str | None = None,
) -> Tensor:
    """RoIAlign of feature maps ``input [N, C, H, W]`` over ``rois [K, 5]`` rows
    ``(batch index, x1, y1, x2, y2)`` -> ``[K, C, PH, PW]``, as ``torchvision.ops.roi_align``;
    differentiable in ``input``. Contract: :func:`asickernels.roi_align`."""
    return _call(
        asickernels.roi_align,
        input,
        rois,
        output_size,
        spatial_scale,
        sampling_ratio,
        aligned,
        backend,
    )


def roi_align_vjp(
    input: ArrayLike,
    rois: ArrayLike,
    cotangent: ArrayLike,
    output_size: int | Sequence[int],
    *,
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = False,
    backend: str | None = None,
) -> Tensor:
    """The gradient ``[N, C, H, W]`` of ``sum(cotangent * roi_align(input, rois, ...))`` with
    respect to ``input`` (whose shape it takes), for ``cotangent [K, C, PH, PW]``. Contract:
    :func:`asickernels.roi_align_vjp`."""
    return _call(
        asickernels.roi_align_vjp,
        input,
        rois,
        cotangent,
        output_size,
        spatial_scale,
        sampling_ratio,
        aligned,
        backend,
    )


def roi_pool(
    input: ArrayLike,
    rois: ArrayLike,
    output_size: int | Sequence[int],
    *,
    spatial_scale: float = 1.0,
    backend: str | None = None,
) -> Tensor:
    """RoIPool (max per bin) of feature maps ``input [N, C, H, W]`` over ``rois [K, 5]`` rows
    ``(batch index, x1, y1, x2, y2)`` -> ``[K, C, PH, PW]``, as ``torchvision.ops.roi_pool``;
    differentiable in ``input``. Contract: :func:`asickernels.roi_pool`."""
    return _call(asickernels.roi_pool, input, rois, output_size, spatial_scale, backend)


def roi_pool_vjp(
    input: ArrayLike,
    rois: ArrayLike,
    cotangent: ArrayLike,
    output_size: int | Sequence[int],
    *,
    spatial_scale: float = 1.0,
    backend: str | None = None,
) -> Tensor:
    """The gradient ``[N, C, H, W]`` of ``sum(cotangent * roi_pool(input, rois, ...))`` with
    respect to ``input``, for ``cotangent [K, C, PH, PW]``. Contract:
    :func:`asickernels.roi_pool_vjp`."""
    return _call(
        asickernels.roi_pool_vjp, input, rois, cotangent, output_size, spatial_scale, backend
    )
