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
    """Facts about one TPU generation. Rates and memory are per chip unless named per core
    or per device (a JAX device is a chip, except on v7x: each of its two TensorCores is a
    device, Google's TPU7x page: "the Ironwood programming model lets you access two TPU
    devices instead of the single logical core (also known as megacore)").

    ``clock_hz``: the scalar unit's bundle rate. v5e: 1.50 GHz, stated in the scaling book
    ("about 5e13 bf16 FLOPs/s per MXU at 1.5GHz on TPU v5e", jax-ml/scaling-book
    tpus.md@0819a7d). No public document states another generation's; these come from
    libtpu's own cost model (``Compiled.cost_analysis()["optimal_seconds"]``, libtpu
    0.0.42.1; ``tests/simulate/tpu_estimate/test_generations.py`` re-derives them), which
    charges a transcendental-bound fusion one vreg per cycle of the EUP (one EUP slot per
    bundle in every generation's utilisation table) at 1.50e9 vregs/s on v5e (its stated
    clock), 1.75e9 on v6e and 1.90e9 per device on v7x. v6e: 1.75 GHz also makes its
    datasheet peak (918 TFLOP/s) the two MXUs the schedule names (capacity 2 per bundle,
    as Google's v6e page says) each taking one 16x256 bf16 push per 8 cycles, the rate
    libtpu's dense-matmul schedule issues them at (8.2 bundles per push per MXU); 3.5 GHz
    would halve every issue-bound estimate and have the compiler issue pushes at twice the
    rate the MXUs take them. v5p: 1.75 GHz, derived from its datasheet peak over 2 cores x
    4 MXUs of 128x128 (its schedule issues pushes as v5e's does; libtpu's EUP rate, 3.0e9
    per chip, would instead say 1.5 GHz: unsettled). v4: 1.05 GHz. ``vpu_ops_per_cycle``
    is per core: ``valu_slots`` vector ALU slots per bundle (from the compiler's
    per-bundle utilisation table) x one 8x128 f32 vreg each.

    ``hbm_efficiency``: the share of the datasheet HBM bandwidth a copy gets, as libtpu's
    cost model charges a copy-bound fusion (the same command: 737.7 GB/s on v5e = 0.90 x
    819, 2350 on v5p = 0.85 x 2765, 1638 on v6e and 3686 per v7x device = 1.00); v4 not
    measured (1.0). The floor stays at the datasheet rate; the walk moves DMAs at this one.
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
    hbm_efficiency: float = 1.0
    devices_per_chip: int = 1
    peak_fp8_ops_per_s: float | None = None  # None: fp8 at the bf16 rate

    @property
    def int8_mxu(self) -> bool:
        """Whether the MXU multiplies int8 x int8 natively (else Mosaic refuses the kernel)."""
        return self.peak_int8_ops_per_s is not None

    @property
    def cores_per_device(self) -> int:
        return self.cores_per_chip // self.devices_per_chip

    def per_device(self, rate: float) -> float:
        """A per-chip rate's share of one JAX device."""
        return rate / self.devices_per_chip

    @property
    def vpu_f32_ops_per_s(self) -> float:
        """Peak elementwise f32 operations per second over a device's cores."""
        if self.clock_hz is None:
            raise ValueError(f"no clock known for {self.name}")
        return self.valu_slots * 8 * 128 * self.clock_hz * self.cores_per_device

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
            819e9, 16 << 30, 197e12, 394e12, 4, 128 << 20, 16 << 20, hbm_efficiency=0.90,
        ),
        Generation(
            "v5p", ("TPU v5", "TPU v5p"), "v5p:2x2x1", 2, True, 1.75e9, 2765e9, 95 << 30,
            459e12, 918e12, 4, 64 << 20, 16 << 20, hbm_efficiency=0.85,
        ),
        Generation(
            "v6e", ("TPU v6 lite", "TPU v6e"), "v6e:2x2", 1, False, 1.75e9, 1640e9, 32 << 30,
            918e12, 1836e12, 4, 128 << 20, 32 << 20,
        ),
        Generation(
            "v7x", ("TPU7x", "TPU v7x", "TPU7"), "tpu7x:2x2x1", 2, False, 1.90e9, 7380e9,
            192 << 30, 2307e12, None, 4, 64 << 20, 32 << 20, devices_per_chip=2,
            peak_fp8_ops_per_s=4614e12,
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
