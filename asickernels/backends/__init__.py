"""The registration table: which backend implements which op, one line each.

Adding a backend: a subpackage here whose ``__init__`` defines ``BACKEND`` (a
:class:`~asickernels.kernels.registry.Backend`), one module per kernel, and one ``register``
line per kernel below, stating what it supports (:class:`~asickernels.kernels.registry.Support`).
Where it stands among the others is :data:`asickernels.kernels.policy.PREFERENCE`.
Implementations are imported only when first used.
"""

from __future__ import annotations

from typing import Any

from asickernels import tpu_generations
from asickernels.backends import cpu, gpsimd, nki, pallas_tpu, reference_backend, xla
from asickernels.kernels.registry import FLOAT32_AND_64, Support, register, register_backend

for backend in (
    reference_backend.BACKEND,
    xla.BACKEND,
    cpu.BACKEND,
    pallas_tpu.BACKEND,
    pallas_tpu.INTERPRET_BACKEND,
    gpsimd.BACKEND,
    nki.BACKEND,
):
    register_backend(backend)

FLOAT64 = Support(dtypes=FLOAT32_AND_64)
_AUTODIFF = "asickernels.backends.autodiff:paired_vjp"

register("giou", "reference", "asickernels.reference:giou", support=FLOAT64)
register("giou_vjp", "reference", "asickernels.reference:giou_vjp", support=FLOAT64)
register("nms", "reference", "asickernels.reference:nms", support=FLOAT64)
register("int8_matmul", "reference", "asickernels.reference:int8_matmul")

_XLA = "asickernels.backends.xla"
register("giou", "xla", f"{_XLA}.giou:giou", support=FLOAT64)
register("giou_vjp", "xla", _AUTODIFF, support=FLOAT64, forward=f"{_XLA}.giou:giou")
register("nms", "xla", f"{_XLA}.nms:nms", support=FLOAT64)
register("int8_matmul", "xla", f"{_XLA}.int8_matmul:int8_matmul")

_CPU = "asickernels.backends.cpu"
register("giou", "cpu", f"{_CPU}.giou:giou", support=FLOAT64, host=f"{_CPU}.giou:giou_host")
register(
    "giou_vjp", "cpu", f"{_CPU}.giou:giou_vjp", support=FLOAT64, host=f"{_CPU}.giou:giou_vjp_host"
)
register("nms", "cpu", f"{_CPU}.nms:nms", support=FLOAT64, host=f"{_CPU}.nms:nms_host")
register(
    "int8_matmul",
    "cpu",
    f"{_CPU}.int8_matmul:int8_matmul",
    host=f"{_CPU}.int8_matmul:int8_matmul_host",
)

_PALLAS = "asickernels.backends.pallas_tpu"
# v4 and v7x have no int8 MXU path: the policy runs XLA there (and says so).
PALLAS_INT8 = Support(generations=tpu_generations.INT8_MXU)
# One kernel module serves both Pallas backends; TPU interpret mode is a bound argument.
PALLAS_MODES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("pallas_tpu", {}),
    ("pallas_tpu_interpret", {"mode": "tpu_interpret"}),
)
for name, mode in PALLAS_MODES:
    register("giou", name, f"{_PALLAS}.giou:giou", **mode)
    register("giou_vjp", name, _AUTODIFF, forward=f"{_PALLAS}.giou:giou", **mode)
    register("nms", name, f"{_PALLAS}.nms:nms", **mode)
    register("int8_matmul", name, f"{_PALLAS}.int8_matmul:int8_matmul", support=PALLAS_INT8, **mode)

register("giou", "gpsimd", "asickernels.backends.gpsimd.giou:giou")
register("nms", "gpsimd", "asickernels.backends.gpsimd.nms:nms")

register("giou", "nki", "asickernels.backends.nki.giou:giou")
register("giou_vjp", "nki", "asickernels.backends.nki.giou:giou_vjp")
register("nms", "nki", "asickernels.backends.nki.nms:nms")
register("int8_matmul", "nki", "asickernels.backends.nki.int8_matmul:int8_matmul")

# Pairwise IoU/GIOU, DIoU/CIoU (asickernels.kernels.box_iou).
_BOX = ("box_iou", "generalized_box_iou", "diou", "ciou")
for kernel in _BOX:
    register(kernel, "reference", f"asickernels.reference:{kernel}", support=FLOAT64)
    register(kernel, "xla", f"{_XLA}.box_iou:{kernel}", support=FLOAT64)
    for name, mode in PALLAS_MODES:
        register(kernel, name, f"{_PALLAS}.box_iou:{kernel}", **mode)
    register(kernel, "nki", f"asickernels.backends.nki.box_iou:{kernel}")
    cpu_box = f"{_CPU}.box_iou:{kernel}"
    register(kernel, "cpu", cpu_box, support=FLOAT64, host=f"{cpu_box}_host")
for metric in ("diou", "ciou"):
    vjp = f"{metric}_vjp"
    register(vjp, "reference", f"asickernels.reference:{vjp}", support=FLOAT64)
    cpu_vjp = f"{_CPU}.box_iou:{vjp}"
    register(vjp, "cpu", cpu_vjp, support=FLOAT64, host=f"{cpu_vjp}_host")
    register(vjp, "xla", _AUTODIFF, support=FLOAT64, forward=f"{_XLA}.box_iou:{metric}")
    for name, mode in PALLAS_MODES:
        register(vjp, name, _AUTODIFF, forward=f"{_PALLAS}.box_iou:{metric}", **mode)

# RoIAlign (asickernels.kernels.roi_align); Pallas TPU, cpu and NKI kernels are still to come.
_ROI = "asickernels.kernels.roi_align"
register("roi_align", "reference", f"{_ROI}:_reference_kernel", support=FLOAT64)
register("roi_align_vjp", "reference", f"{_ROI}:_reference_vjp_kernel", support=FLOAT64)
register("roi_align", "xla", f"{_XLA}.roi_align:roi_align", support=FLOAT64)
register("roi_align_vjp", "xla", f"{_XLA}.roi_align:roi_align_vjp", support=FLOAT64)
