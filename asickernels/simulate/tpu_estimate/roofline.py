"""The roofline: the least time an op can take on a TPU generation, whatever the kernel.

A case's :class:`Work` is the HBM traffic its inputs and outputs force (each read once,
each written once) and the arithmetic it must do on its unit (the MXU at its int8 or bf16
peak, or the VPU at its f32 rate). The bound is the larger of bytes / HBM bandwidth and
operations / peak rate, both per chip (:mod:`asickernels.tpu_generations`). An estimate
below its bound is a bug in the estimate (the report and the tests refuse it).

Operation counts are lower bounds: a matmul's ``2 M N K``; GIOU's 28 elementwise
operations per pair (its formula with each min/max/add/mul/div counted once, divisions as
cheap as adds); NMS counts none (its bound is its bytes).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from asickernels import tpu_generations

Unit = Literal["mxu_int8", "mxu_bf16", "vpu"]

GIOU_OPS_PER_PAIR = 28


@dataclasses.dataclass(frozen=True)
class Work:
    """What a case must move and compute: ``hbm_bytes`` and ``ops`` on ``unit``."""

    hbm_bytes: float
    ops: float = 0.0
    unit: Unit = "vpu"

    def seconds(self, generation: str) -> float:
        """The roofline bound on ``generation``, in seconds."""
        facts = tpu_generations.get(generation)
        rates = {
            "mxu_int8": facts.per_device(facts.peak_int8_ops_per_s or facts.peak_bf16_ops_per_s),
            "mxu_bf16": facts.per_device(facts.peak_bf16_ops_per_s),
            "vpu": facts.vpu_f32_ops_per_s,
        }
        hbm_s = self.hbm_bytes / facts.per_device(facts.hbm_bytes_per_s)
        return max(hbm_s, self.ops / rates[self.unit])


def matmul(m: int, k: int, n: int, *, dtype: str, out_bytes: int, scales: bool = False) -> Work:
    """``[M, K] @ [K, N]`` in ``dtype`` (``"int8"`` or ``"bfloat16"``) with an output of
    ``out_bytes`` per element (and per-row / per-column float32 scales)."""
    size = 1 if dtype == "int8" else 2
    moved = size * (m * k + k * n) + out_bytes * m * n + (4 * (m + n) if scales else 0)
    return Work(moved, 2.0 * m * n * k, "mxu_int8" if dtype == "int8" else "mxu_bf16")


def giou(pairs: int, *, gradient: bool) -> Work:
    """GIOU of ``pairs`` float32 box pairs: forward reads 2 x 16 bytes and writes 4 per
    pair; the gradient (of the sum, as estimated) reads the boxes and writes both box
    gradients (its all-ones cotangent can be made on chip: XLA keeps it in VMEM)."""
    moved = pairs * (32 + (32 if gradient else 4))
    return Work(moved, GIOU_OPS_PER_PAIR * pairs, "vpu")


def nms(n: int, max_output_size: int) -> Work:
    """NMS of ``n`` float32 boxes and scores to ``max_output_size`` int32 indices."""
    return Work(20 * n + 4 * max_output_size + 4)
