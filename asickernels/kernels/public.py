"""Every public op, each an :class:`asickernels.kernels.declaration.Op` declared in its
family's module beside this one: :mod:`asickernels` exports every public name here (a star
import, so keep helpers private), and the frontends derive from :data:`OPS`. A new op is
imported here and added to :data:`OPS`."""

from __future__ import annotations

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
from asickernels.kernels.int8_matmul import int8_matmul, quantize_int8
from asickernels.kernels.linear_sum_assignment import linear_sum_assignment
from asickernels.kernels.nms import batched_nms, nms
from asickernels.kernels.roi_align import roi_align, roi_align_vjp
from asickernels.kernels.roi_pool import roi_pool, roi_pool_vjp

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
