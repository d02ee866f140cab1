"""asickernels: GIOU, NMS and int8 matmul kernels for TPUs (Pallas) and AWS Neuron
(NKI, GpSimd), with CPU simulation paths and one shared numerical reference."""

from __future__ import annotations

from asickernels import backends as _backends  # noqa: F401  (fills the registry)
from asickernels.kernels.box_iou import (
    box_iou,
    ciou,
    ciou_loss,
    ciou_vjp,
    diou,
    diou_loss,
    diou_vjp,
    generalized_box_iou,
)
from asickernels.kernels.giou import giou, giou_loss, giou_vjp
from asickernels.kernels.int8_matmul import INT8_MATMUL_MAX_K, int8_matmul, quantize_int8
from asickernels.kernels.linear_sum_assignment import linear_sum_assignment
from asickernels.kernels.nms import batched_nms, nms
from asickernels.kernels.registry import Availability, BackendUnavailableError
from asickernels.kernels.roi_align import roi_align, roi_align_vjp
from asickernels.kernels.roi_pool import roi_pool, roi_pool_vjp

# Every public op, each an asickernels.kernels.declaration.Op: the frontends derive from these.
OPS = (
    giou,
    giou_vjp,
    giou_loss,
    nms,
    batched_nms,
    int8_matmul,
    quantize_int8,
    box_iou,
    generalized_box_iou,
    diou,
    diou_vjp,
    diou_loss,
    ciou,
    ciou_vjp,
    ciou_loss,
    roi_align,
    roi_align_vjp,
    roi_pool,
    roi_pool_vjp,
    linear_sum_assignment,
)


def available_backends() -> dict[str, Availability]:
    """Every registered backend and how it runs here: ``native``, ``simulated`` or
    ``missing`` (with the reason and an install hint)."""
    from asickernels.kernels import registry

    return {name: registry.availability(name) for name in registry.backend_names()}


__all__ = [
    "INT8_MATMUL_MAX_K",
    "OPS",
    "Availability",
    "BackendUnavailableError",
    "available_backends",
    *(op.name for op in OPS),
]
__version__ = "0.1.0"
