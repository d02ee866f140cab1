"""GIOU and its gradient on the native CPU kernels: the paired box-metric kernels of
:mod:`asickernels.backends.cpu.box_iou` with the GIOU metric, for JAX arrays (differentiable)
and numpy arrays alike. float64 boxes are computed in float64, anything else in float32."""

from __future__ import annotations

from asickernels.backends.cpu.box_iou import declared, paired_metric, paired_metric_vjp
from asickernels.kernels import public as ops

giou = declared(ops.giou, paired_metric("giou"))
giou_vjp = declared(ops.giou_vjp, paired_metric_vjp("giou"))
