"""One table of TPU generation facts, read by the Pallas kernels' tuning, the compile gate,
the schedule estimator and the SPMD planner.

Sources: Google Cloud's per-generation pages (cloud.google.com/tpu/docs/v4, v5e, v5p, v6e,
tpu7x: peak bf16 / int8 per chip, HBM capacity and bandwidth per chip) and JAX's own chip
table (``jax/_src/pallas/mosaic/tpu_info.py``: VMEM per TensorCore, MXU count, which
operand dtypes the MXU takes natively). Google publishes no clocks; see
:attr:`Generation.clock_hz` for which are stated elsewhere and which are assumptions.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# How to get libtpu, which compiles for TPUs on any host: for a wheel's user, and in a clone
# (the tpu extra; see README, Install).
LIBTPU_INSTALL = 'pip install "jax[tpu]" (in a clone: pip install -e ".[tpu]")'


@dataclasses.dataclass(frozen=True)
class Generation:
    """Facts about one TPU generation. Rates and memory are per chip unless named per core.

    ``clock_hz``: the clock at which the datasheet's bf16 peak equals the chip's MXU
    multiply-adds per cycle. v5e: 4 MXUs of 128x128 -> 1.50 GHz, which the scaling book
    states ("about 5e13 bf16 FLOPs/s per MXU at 1.5GHz on TPU v5e",
    jax-ml/scaling-book tpus.md@0819a7d). v5p: 2 cores x 4 x 128x128 -> 1.75 GHz, derived
    (no public source states it). v6e: 1.75 GHz is an assumption: 918 TFLOP/s over four
    256x256 arrays; Google's v6e page (cloud.google.com/tpu/docs/v6e, "Each TensorCore has
    2 matrix-multiply units") and JAX's table list two, which at one 256x256 pass per cycle
    would mean 3.5 GHz, halving every issue-bound v6e estimate; no public source states the
    clock, and no v6e timing here decides it. ``vpu_ops_per_cycle`` is per core:
    ``valu_slots`` vector ALU slots per bundle (from the compiler's per-bundle utilisation
    table) x one 8x128 f32 vreg each.
    """

    name: str
    device_kinds: tuple[str, ...]  # jax.Device.device_kind strings
    topology: str | None  # a libtpu topology name to compile for (None: not compilable here)
    cores_per_chip: int
    megacore: bool  # "parallel" grid axes split over the chip's cores
    clock_hz: float | None
    hbm_bytes_per_s: float
    hbm_bytes: int
    peak_bf16_ops_per_s: float
    peak_int8_ops_per_s: float | None  # None: no int8 x int8 MXU path
    valu_slots: int
    vmem_bytes_per_core: int
    default_scoped_vmem_bytes: int  # what Mosaic grants a kernel unless it asks for more

    @property
    def int8_mxu(self) -> bool:
        """Whether the MXU multiplies int8 x int8 natively (else Mosaic refuses the kernel)."""
        return self.peak_int8_ops_per_s is not None

    @property
    def vpu_f32_ops_per_s(self) -> float:
        """Peak elementwise f32 operations per second over the chip's cores."""
        if self.clock_hz is None:
            raise ValueError(f"no clock known for {self.name}")
        return self.valu_slots * 8 * 128 * self.clock_hz * self.cores_per_chip

    @property
    def max_vmem_limit_bytes(self) -> int:
        """The largest scoped-VMEM limit a kernel should ask for: physical VMEM less a
        margin Mosaic keeps for its own spills and internal scratch."""
        return self.vmem_bytes_per_core * 25 // 32


GENERATIONS: dict[str, Generation] = {
    g.name: g
    for g in (
        Generation(
            "v4", ("TPU v4",), "v4:2x2x1", 2, True, 1.05e9, 1200e9, 32 << 30,
            275e12, None, 4, 16 << 20, 16 << 20,
        ),
        Generation(
            "v5e", ("TPU v5 lite", "TPU v5e", "TPU v5litepod"), "v5e:2x2", 1, False, 1.50e9,
            819e9, 16 << 30, 197e12, 394e12, 4, 128 << 20, 16 << 20,
        ),
        Generation(
            "v5p", ("TPU v5", "TPU v5p"), "v5p:2x2x1", 2, True, 1.75e9, 2765e9, 95 << 30,
            459e12, 918e12, 4, 64 << 20, 16 << 20,
        ),
        Generation(
            "v6e", ("TPU v6 lite", "TPU v6e"), "v6e:2x2", 1, False, 1.75e9, 1640e9, 32 << 30,
            918e12, 1836e12, 4, 128 << 20, 32 << 20,
        ),
        Generation(
            "v7x", ("TPU7x", "TPU v7x", "TPU7"), None, 2, False, None, 7370e9, 192 << 30,
            2307e12, None, 4, 64 << 20, 32 << 20,
        ),
    )
}  # fmt: skip
NAMES = tuple(GENERATIONS)
DEFAULT = "v5e"  # whose tables a kernel uses when the TPU's generation cannot be known
INT8_MXU = frozenset(name for name, g in GENERATIONS.items() if g.int8_mxu)
COMPILABLE = tuple(name for name, g in GENERATIONS.items() if g.topology)

_BY_KIND = {kind.lower(): g.name for g in GENERATIONS.values() for kind in g.device_kinds}


def generation_of(device_or_kind: Any) -> str | None:
    """A ``jax.Device`` (or its ``device_kind`` string) -> generation name (``"TPU v5
    lite"`` -> ``"v5e"``); None for anything that is not a TPU of a known generation."""
    if not isinstance(device_or_kind, str):
        if getattr(device_or_kind, "platform", "tpu") != "tpu":
            return None
        device_or_kind = getattr(device_or_kind, "device_kind", "")
    return _BY_KIND.get(device_or_kind.strip().lower())


def get(name: str) -> Generation:
    """The facts for ``name``; ValueError naming the known generations otherwise."""
    if name not in GENERATIONS:
        raise ValueError(f"unknown TPU generation {name!r}; known: {', '.join(NAMES)}")
    return GENERATIONS[name]
