"""GIOU and its gradient on the native CPU kernels: the paired box-metric kernels of
:mod:`asickernels.backends.cpu.box_iou` with the GIOU metric (JAX entry points with a
``custom_vjp``, and numpy host twins). float64 boxes are computed in float64, anything else
in float32."""

from __future__ import annotations

from asickernels.backends.cpu import BACKEND
from asickernels.backends.cpu.box_iou import (
    paired_metric,
    paired_metric_host,
    paired_metric_vjp,
    paired_metric_vjp_host,
)
from asickernels.kernels.registry import FLOAT32_AND_64

giou = BACKEND.implements("giou", dtypes=FLOAT32_AND_64)(paired_metric("giou"))
giou_vjp = BACKEND.implements("giou_vjp", dtypes=FLOAT32_AND_64)(paired_metric_vjp("giou"))
giou_host = BACKEND.host_twin("giou")(paired_metric_host("giou"))
giou_vjp_host = BACKEND.host_twin("giou_vjp")(paired_metric_vjp_host("giou"))
