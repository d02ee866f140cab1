"""GIOU and its gradient on the native CPU kernels: the paired box-metric kernels of
:mod:`asickernels.backends.cpu.box_iou` with the GIOU metric (JAX entry points with a
``custom_vjp``, and numpy host twins). float64 boxes are computed in float64, anything else
in float32."""

from __future__ import annotations

from asickernels.backends.cpu.box_iou import (
    paired_metric,
    paired_metric_host,
    paired_metric_vjp,
    paired_metric_vjp_host,
)

giou = paired_metric("giou")
giou_vjp = paired_metric_vjp("giou")
giou_host = paired_metric_host("giou")
giou_vjp_host = paired_metric_vjp_host("giou")
