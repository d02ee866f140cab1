"""Published TPU timings of programs nobody here tuned, and how the estimate fares on them.

Each figure carries its source (file@commit or URL), generation, method and compiler era.
All sources timed whole calls from Python (``timeit`` around ``jax.block_until_ready``),
so each is compared with the estimate's ``per_call_s`` (device program plus the per-call
host overhead). Two shared constants stand in for what no schedule shows (a latency per
DMA, the per-call overhead): they are fitted to all rows (in-sample) and, to judge them on
data they were not fitted to, to all sources but one, then scored on the one left out
(leave-one-source-out).

* JAX Pallas TPU matmul guide (jax-ml/jax ``docs/pallas/tpu/matmul.ipynb`` @ d0d0815,
  notebook outputs, TPU v5e, 2024): the guide's blocked bf16 matmul at two block sizes and
  ``jnp.matmul``, 1024^3 to 8192^3, ``timeit`` over 100 calls; the same block-size sweeps
  of its fused right-hand-side transpose and fused ReLU. The kernels are the seeds'
  blocked matmul design (:func:`.seed_kernels.matmul_pallas`) and the guide's fused
  variants (:func:`.guide_kernels.guide_matmul`), written here, not copied.
* JAX Pallas TPU sparse guide (jax-ml/jax ``docs/pallas/tpu/sparse.ipynb`` @ 1082251,
  notebook outputs, TPU v5e, 2024-09, ``timeit`` over 100 calls): the dense @ dense matmul
  with a lower-triangular block-sparse output mask (16384^3, blocks 512/512/1024;
  :mod:`.guide_kernels`), its reference ``mask * (x @ y)`` and the plain ``x @ y`` of its
  sparse @ dense section. The masked kernel's branches and fetches depend on its mask: its
  estimate takes them from a run on the guide's mask (:mod:`.observed`). The guide's
  sparse @ dense kernel is left out: its block pattern is a ``jax.random`` draw that the
  jax of today does not reproduce.
* The seed article "Implementing Sequential Algorithms on TPU" (Towards Data Science,
  2024-10-07; /work/shared/seeds): NMS over 1024 boxes to 128 outputs, Pallas and jitted
  JAX, on TPU v5e, ``timeit``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from asickernels.simulate.tpu_estimate import cases, guide_kernels, observed, roofline
from asickernels.simulate.tpu_estimate import estimate as cost
from asickernels.simulate.tpu_estimate import seed_kernels as seeds

GUIDE = "JAX Pallas TPU matmul guide (jax-ml/jax docs/pallas/tpu/matmul.ipynb@d0d0815)"
SPARSE = "JAX Pallas TPU sparse guide (jax-ml/jax docs/pallas/tpu/sparse.ipynb@1082251)"
SEED = "seed: Implementing Sequential Algorithms on TPU (TDS, 2024-10-07)"
TIMEIT = "timeit incl. dispatch"


@dataclasses.dataclass(frozen=True)
class PublishedTiming:
    source: str
    generation: str
    method: str
    era: str
    seconds: float
    target: cost.EstimateTarget
    # Example arguments deciding the program's data-dependent control flow (None: none).
    example: Callable[[], Sequence[Any]] | None = None

    def counted_target(self) -> cost.EstimateTarget:
        """The target with the counts of a run on :attr:`example` (:mod:`.observed`)."""
        if self.example is None:
            return self.target
        return _counted(self.target, self.example)


def _guide_pallas(size: int, blocks: tuple[int, int, int]) -> cost.EstimateTarget:
    bm, bk, bn = blocks
    return cases.make_case(
        f"guide Pallas matmul bf16 {size}^3, blocks bm={bm} bk={bk} bn={bn}",
        f"{seeds.__name__}:matmul_case",
        {"dtype": "bfloat16", "size": size, "blocks": blocks},
        op="bf16_matmul",
        impl="pallas_tpu",
        shape=f"{size}x{size}x{size}",
        work=roofline.matmul(size, size, size, dtype="bfloat16", out_bytes=2),
    )


def _guide_fused(variant: str, size: int, blocks: tuple[int, int, int]) -> cost.EstimateTarget:
    bm, bk, bn = blocks
    return cases.make_case(
        f"guide Pallas matmul bf16 {size}^3 {variant}, blocks bm={bm} bk={bk} bn={bn}",
        f"{guide_kernels.__name__}:guide_matmul_case",
        {"size": size, "blocks": blocks, "variant": variant},
        op="bf16_matmul",
        impl="pallas_tpu",
        shape=f"{size}x{size}x{size}",
        work=roofline.matmul(size, size, size, dtype="bfloat16", out_bytes=2),
    )


def _guide_xla(size: int) -> cost.EstimateTarget:
    return cases.xla_matmul_case(size, size, size, "bf16")


# (size, blocks or None for jnp.matmul, seconds per call) from the guide's outputs.
_GUIDE_FIGURES = (
    (1024, (128, 128, 128), 0.00029766598949208854),
    (4096, (128, 128, 128), 0.011771515250438824),
    (8192, (128, 128, 128), 0.09183577066054567),
    (1024, (512, 1024, 1024), 0.00012708659982308746),
    (4096, (512, 1024, 1024), 0.00088908776990138),
    (8192, (512, 1024, 1024), 0.006099433819763363),
    (1024, None, 0.00011943008983507753),
    (4096, None, 0.0008272899803705514),
    (8192, None, 0.006047147869830951),
)
# Seconds per call from the guide's "Fused right-hand-side transpose" and "Fused
# activation function" outputs, at the sizes and blocks of its first sweep.
_GUIDE_SWEEP = tuple((size, blocks) for size, blocks, _ in _GUIDE_FIGURES if blocks is not None)
_GUIDE_FUSED_FIGURES = {
    "transpose_rhs": (
        0.0003029372810851783,
        0.012017967159627005,
        0.09500920018996112,
        0.00012131539988331496,
        0.0008790623804088682,
        0.006107717020204291,
    ),
    "relu": (
        0.00030103540048003196,
        0.011807117109419778,
        0.09181861146935262,
        0.00012622540001757442,
        0.000896632740041241,
        0.006130605939542875,
    ),
}


def published_timings() -> tuple[PublishedTiming, ...]:
    guide = tuple(
        PublishedTiming(
            GUIDE,
            "v5e",
            TIMEIT,
            "2024 (jax 0.4.x)",
            seconds,
            _guide_xla(size) if blocks is None else _guide_pallas(size, blocks),
        )
        for size, blocks, seconds in _GUIDE_FIGURES
    ) + tuple(
        PublishedTiming(
            GUIDE, "v5e", TIMEIT, "2024 (jax 0.4.x)", seconds, _guide_fused(variant, size, blocks)
        )
        for variant, figures in _GUIDE_FUSED_FIGURES.items()
        for (size, blocks), seconds in zip(_GUIDE_SWEEP, figures, strict=True)
    )
    sparse = tuple(
        PublishedTiming(SPARSE, "v5e", TIMEIT, "2024-09 (jax 0.4.3x)", seconds, target, example)
        for seconds, target, example in _sparse_programs(SPARSE_SIZE)
    )
    seed = (
        PublishedTiming(SEED, "v5e", TIMEIT, "2024", seeds.SEED_NMS_PALLAS_MS * 1e-3, cases.SEED_NMS_PALLAS),
        PublishedTiming(SEED, "v5e", TIMEIT, "2024", seeds.SEED_NMS_JAX_MS * 1e-3, cases.SEED_NMS_JAX),
    )  # fmt: skip
    return guide + sparse + seed


SPARSE_SIZE = 16384


def _sparse_programs(
    size: int,
) -> list[tuple[float, cost.EstimateTarget, Callable[[], Sequence[Any]] | None]]:
    """The sparse guide's masked matmul, its reference and ``x @ y`` (published seconds,
    target, example arguments deciding its control flow)."""
    blocks = size // guide_kernels.BLOCK_MN
    computed = blocks * (blocks + 1) // 2  # the lower triangle's blocks

    def program(name: str, builder: str, impl: str, work: roofline.Work) -> cost.EstimateTarget:
        return cases.make_case(
            name,
            f"{guide_kernels.__name__}:{builder}",
            {"size": size},
            op="bf16_matmul",
            impl=impl,
            shape=f"{size}x{size}x{size}",
            work=work,
        )

    masked = program(
        f"sparse guide Pallas matmul bf16 {size}^3, lower-triangular output mask",
        "masked_case",
        "pallas_tpu",
        # x and y read once, the output written once; the computed blocks' products.
        roofline.Work(
            3 * 2.0 * size * size, 2.0 * computed * guide_kernels.BLOCK_MN**2 * size, "mxu_bf16"
        ),
    )
    reference = program(
        f"sparse guide reference mask * (x @ y) {size}^3, xla",
        "masked_reference_case",
        "xla",
        # bf16 x, y and output, the int32 mask.
        roofline.Work((2 + 2 + 4 + 2) * size * size, 2.0 * size**3, "mxu_bf16"),
    )
    return [
        (28.648e-3, masked, functools.partial(guide_kernels.masked_example, size)),
        (49.988e-3, reference, None),
        (46.953e-3, _guide_xla(size), None),
    ]


@functools.cache
def _counted(
    target: cost.EstimateTarget, example: Callable[[], Sequence[Any]]
) -> cost.EstimateTarget:
    import jax

    from asickernels.pallas_home import pltpu

    function, _ = target.build()
    with jax.default_device(jax.devices("cpu")[0]), pltpu.force_tpu_interpret_mode():
        seen = observed.observe(function, list(example()))
    return dataclasses.replace(target, kernel_runs=seen.kernels, observed_trips=seen.while_trips)


@dataclasses.dataclass(frozen=True)
class Walked:
    """A published figure beside the walk of its program at DMA latency 0 and the slope of
    the device time in the DMA latency (the walk is linear in it over the fitted range)."""

    timing: PublishedTiming
    device_at_zero_s: float
    slope: float  # device seconds per second of DMA latency
    floor_s: float

    def per_call(self, latency_s: float, overhead_s: float) -> float:
        return self.device_at_zero_s + self.slope * latency_s + overhead_s

    def error(self, latency_s: float, overhead_s: float) -> float:
        return self.per_call(latency_s, overhead_s) / self.timing.seconds - 1


LATENCY_GRID_S = tuple(i * 0.05e-6 for i in range(21))  # 0 .. 1 us
OVERHEAD_GRID_S = tuple(i * 1e-6 for i in range(301))  # 0 .. 300 us


def fit(rows: Sequence[Walked]) -> tuple[float, float]:
    """(DMA latency, per-call overhead) minimising the mean |error| over ``rows`` (a grid
    search: two constants, a handful of rows). Not the median: fitted to the five rows
    of two sources (a source held out), a median is the third row's error, and which two
    rows it gives up flips on small changes of any row."""

    def score(pair: tuple[float, float]) -> tuple[float, float]:
        errors = [abs(row.error(*pair)) for row in rows]
        return sum(errors) / len(errors), max(errors)

    return min(((lat, over) for lat in LATENCY_GRID_S for over in OVERHEAD_GRID_S), key=score)


@dataclasses.dataclass(frozen=True)
class Validation:
    rows: tuple[Walked, ...]
    in_sample: tuple[float, float]  # constants fitted to every row
    held_out: dict[str, tuple[float, float]]  # source -> constants fitted without it

    def in_sample_errors(self) -> list[float]:
        return [row.error(*self.in_sample) for row in self.rows]

    def held_out_errors(self) -> list[float]:
        return [row.error(*self.held_out[row.timing.source]) for row in self.rows]

    def below_floor(self) -> list[Walked]:
        return [row for row in self.rows if row.device_at_zero_s < row.floor_s * (1 - 1e-9)]


def validate(
    walk: Callable[[cost.EstimateTarget, float], cost.Estimate | None],
) -> Validation | None:
    """Walks every published program (``walk(target, dma_latency_s)``, on v5e) and fits the
    constants in-sample and leaving each source out."""
    rows = []
    for timing in published_timings():
        target = timing.counted_target()
        at_zero = walk(target, 0.0)
        probe = walk(target, 1e-6)
        if at_zero is None or probe is None:
            return None
        work = timing.target.work
        rows.append(
            Walked(
                timing,
                at_zero.device_s,
                (probe.device_s - at_zero.device_s) / 1e-6,
                work.seconds(timing.generation) if work else math.nan,
            )
        )
    sources = sorted({row.timing.source for row in rows})
    held_out = {
        source: fit([row for row in rows if row.timing.source != source]) for source in sources
    }
    return Validation(tuple(rows), fit(rows), held_out)


def validation_markdown(validation: Validation) -> list[str]:
    latency, overhead = validation.in_sample
    lines = [
        "| source | TPU | method | era | program | published ms | estimate ms (in-sample) | error | estimate ms (source held out) | error | floor ms |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row, inside, outside in zip(
        validation.rows, validation.in_sample_errors(), validation.held_out_errors(), strict=True
    ):
        t = row.timing
        held = validation.held_out[t.source]
        lines.append(
            f"| {t.source} | {t.generation} | {t.method} | {t.era} | {t.target.name} | "
            f"{t.seconds * 1e3:.4f} | {row.per_call(latency, overhead) * 1e3:.4f} | "
            f"{inside:+.0%} | {row.per_call(*held) * 1e3:.4f} | {outside:+.0%} | "
            f"{row.floor_s * 1e3:.4f} |"
        )
    fitted = [abs(e) for e in validation.in_sample_errors()]
    unseen = [abs(e) for e in validation.held_out_errors()]
    lines += [
        "",
        f"Median |error|: in-sample {statistics.median(fitted):.0%} (max {max(fitted):.0%}); "
        f"leave-one-source-out {statistics.median(unseen):.0%} (max {max(unseen):.0%}). "
        f"Device programs below their floor: {len(validation.below_floor())} of "
        f"{len(validation.rows)}.",
        "",
        f"Constants fitted to every row: DMA latency {latency * 1e6:.2f} us, per-call overhead "
        f"{overhead * 1e6:.0f} us (stored in `tpu_estimate/estimate.py`: "
        f"{cost.DMA_LATENCY_S * 1e6:.2f} us, {cost.CALL_OVERHEAD_S * 1e6:.0f} us). "
        + "; ".join(
            f"without {source.split(' (')[0]}: {lat * 1e6:.2f} us, {over * 1e6:.0f} us"
            for source, (lat, over) in sorted(validation.held_out.items())
        )
        + ".",
    ]
    return lines
