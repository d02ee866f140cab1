"""The registration table: which backend implements which op, one line each.

Adding a backend: a subpackage here whose ``__init__`` defines ``BACKEND`` (a
:class:`~asickernels.kernels.registry.Backend`), one module per op, and one ``register``
line per op below. Implementations are imported only when first used.
"""

from __future__ import annotations

from asickernels.backends import gpsimd, nki, pallas_tpu, reference_backend, xla
from asickernels.kernels.registry import register, register_backend

for backend in (
    reference_backend.BACKEND,
    xla.BACKEND,
    pallas_tpu.BACKEND,
    pallas_tpu.INTERPRET_BACKEND,
    gpsimd.BACKEND,
    nki.BACKEND,
):
    register_backend(backend)

register("giou", "reference", "asickernels.reference:giou")
register("giou_vjp", "reference", "asickernels.reference:giou_vjp")
register("nms", "reference", "asickernels.reference:nms")
register("int8_matmul", "reference", "asickernels.reference:int8_matmul")

register("giou", "xla", "asickernels.backends.xla.giou:giou")
register("nms", "xla", "asickernels.backends.xla.nms:nms")
register("int8_matmul", "xla", "asickernels.backends.xla.int8_matmul:int8_matmul")

_PALLAS = "asickernels.backends.pallas_tpu"
register("giou", "pallas_tpu", f"{_PALLAS}.giou:giou")
register("nms", "pallas_tpu", f"{_PALLAS}.nms:nms")
register("int8_matmul", "pallas_tpu", f"{_PALLAS}.int8_matmul:int8_matmul")
register("giou", "pallas_tpu_interpret", f"{_PALLAS}.giou:giou", mode="tpu_interpret")
register("nms", "pallas_tpu_interpret", f"{_PALLAS}.nms:nms", mode="tpu_interpret")
register(
    "int8_matmul",
    "pallas_tpu_interpret",
    f"{_PALLAS}.int8_matmul:int8_matmul",
    mode="tpu_interpret",
)

register("giou", "gpsimd", "asickernels.backends.gpsimd.giou:giou")
register("nms", "gpsimd", "asickernels.backends.gpsimd.nms:nms")

register("giou", "nki", "asickernels.backends.nki.giou:giou")
register("giou_vjp", "nki", "asickernels.backends.nki.giou:giou_vjp")
register("nms", "nki", "asickernels.backends.nki.nms:nms")
register("int8_matmul", "nki", "asickernels.backends.nki.int8_matmul:int8_matmul")
