"""PyTorch frontend: the asickernels ops on torch tensors, as ``torch.ops.asickernels.*``.

Importing this module registers the operators with ``torch.library`` (with fake
implementations, so they trace under ``torch.compile``, and autograd for GIOU and the GIOU
loss). The functions below take the arguments of the JAX API in :mod:`asickernels` and
return what it returns, as torch tensors on the inputs' device:

* CPU tensors run the fastest CPU implementation the library has
  (:data:`asickernels.torch.ops.CPU_BACKEND`, jitted); float64 GIOU and GIOU loss run in
  float64 on the reference, for ``torch.autograd.gradcheck``.
* torch_xla tensors run the JAX/Pallas kernels inside the torch_xla graph through
  ``torch_xla.core.xla_builder.call_jax`` (see :mod:`asickernels.torch.xla`).

``import asickernels`` never imports torch; ``import asickernels.torch`` needs it.
"""

from __future__ import annotations

from typing import Any

try:
    import torch
except ImportError as error:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "asickernels.torch needs PyTorch: pip install torch (and torch_xla for XLA tensors)"
    ) from error

from asickernels.kernels.giou import Reduction

# Registers the operators (asickernels.torch.ops) and their XLA device kernels.
from asickernels.torch import xla as _xla  # noqa: F401


def giou(boxes1: torch.Tensor, boxes2: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """Generalized IoU of paired boxes ``[..., 4]`` -> ``[...]`` float32 (float64 for
    float64 inputs); ``1 - torchvision.ops.generalized_box_iou_loss``. Differentiable."""
    return torch.ops.asickernels.giou(boxes1, boxes2, backend)


def giou_loss(
    preds: torch.Tensor,
    targets: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    reduction: Reduction = "mean",
    backend: str | None = None,
) -> torch.Tensor:
    """``1 - giou`` over valid boxes (``mask [...]`` True); padding contributes exactly 0 to
    the loss and its gradient. ``"mean"`` is over the valid boxes (0 when there are none).
    See :func:`asickernels.giou_loss`. Differentiable."""
    return torch.ops.asickernels.giou_loss(preds, targets, mask, reduction, backend)


def nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    *,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy NMS with torchvision's rule and a static output shape: ``boxes [..., N, 4]``,
    ``scores [..., N]`` -> (``indices [..., max_output_size]`` int32 padded with -1,
    ``num_valid [...]`` int32). See :func:`asickernels.nms`."""
    return torch.ops.asickernels.nms(
        boxes, scores, iou_threshold, max_output_size, score_threshold, backend
    )


def batched_nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    idxs: torch.Tensor,
    *,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-category NMS (``torchvision.ops.batched_nms``'s rule), output as :func:`nms`."""
    return torch.ops.asickernels.batched_nms(
        boxes, scores, idxs, iou_threshold, max_output_size, score_threshold, backend
    )


def int8_matmul(
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    x_scale: torch.Tensor | float | None = None,
    y_scale: torch.Tensor | float | None = None,
    out_dtype: torch.dtype | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """``x [M, K] @ y [K, N]`` for int8 tensors, exact in int32, or dequantized with scales
    (scalar or ``[M]`` / ``[N]``) to ``out_dtype``. See :func:`asickernels.int8_matmul`."""
    return torch.ops.asickernels.int8_matmul(
        x, y, _scale_tensor(x_scale, x), _scale_tensor(y_scale, x), out_dtype, backend
    )


def quantize_int8(x: torch.Tensor, axis: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantization -> ``(q int8, scale float32)``, ``x ~= q * scale``.
    See :func:`asickernels.quantize_int8`."""
    return torch.ops.asickernels.quantize_int8(x, axis)


def _scale_tensor(scale: Any, like: torch.Tensor) -> torch.Tensor | None:
    if scale is None or isinstance(scale, torch.Tensor):
        return scale
    return torch.tensor(scale, dtype=torch.float32, device=like.device)


__all__ = ["batched_nms", "giou", "giou_loss", "int8_matmul", "nms", "quantize_int8"]
