"""``asickernels estimate``: the estimate table of our kernels (:mod:`.tpu_cases`) beside the
seeds' and XLA's, the calibration against published TPU v5e figures, and the block-size
sweeps, as text or markdown.

Everything here compiles with libtpu (one subprocess per kernel and generation, seconds
each on a small machine), so it is a command, never part of the fast tests.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from asickernels import tpu_generations
from asickernels.estimates import tpu_cases
from asickernels.kernels import giou_cases, int8_matmul_cases, nms_cases
from asickernels.simulate.tpu_estimate import cases, parsing, program_facts, published
from asickernels.simulate.tpu_estimate import estimate as cost
from asickernels.simulate.tpu_estimate import seed_kernels as seeds

KEPT_DUMPS = 3
UNITS = ("MXU", "VALU", "XLU", "VLOAD", "VSTORE")
DISCLAIMER = (
    "These are **compiler-schedule estimates, not measurements**: libtpu compiled each "
    "kernel for the named TPU on a CPU machine, and the time is the walk of its final VLIW "
    "schedule (bundles x trip counts, plus waits on DMAs at the chip's HBM bandwidth and a "
    "calibrated per-DMA latency, and on MXUs busy with earlier pushes). No TPU ran anything."
)


class Runner:
    """Compiles and walks cases, remembering results, and reports progress on stderr."""

    def __init__(self, progress: Callable[[str], None] | None = None) -> None:
        self.progress = progress or (lambda message: print(message, file=sys.stderr, flush=True))
        # Parsed dumps are large: keep the last few (calibration walks one several times).
        self._dumps: dict[
            tuple[cost.EstimateTarget, str], tuple[parsing.Dump, program_facts.ProgramFacts | None]
        ] = {}
        self._estimates: dict[tuple[cost.EstimateTarget, str, float], cost.Estimate] = {}
        self._failed: set[tuple[cost.EstimateTarget, str]] = set()
        self.errors: list[str] = []

    def dump(
        self, case: cost.EstimateTarget, generation: str
    ) -> tuple[parsing.Dump, program_facts.ProgramFacts | None] | None:
        key = (case, generation)
        if key in self._failed:
            return None
        if key not in self._dumps:
            while len(self._dumps) >= KEPT_DUMPS:
                del self._dumps[next(iter(self._dumps))]
            start = time.perf_counter()
            with tempfile.TemporaryDirectory(prefix="asickernels-tpu-dump-") as directory:
                try:
                    listings = cost.compile_with_dumps(case, generation, Path(directory))
                    self._dumps[key] = (parsing.load_dump(listings), cost.load_facts(listings))
                except (cost.EstimateError, parsing.ScheduleError) as error:
                    self._failed.add(key)
                    self.errors.append(str(error))
                    self.progress(f"  {case.name} on {generation}: FAILED")
                    return None
            self.progress(
                f"  compiled {case.name} for {generation} ({time.perf_counter() - start:.0f}s)"
            )
        return self._dumps[key]

    def estimate(
        self, case: cost.EstimateTarget, generation: str, dma_latency_s: float = cost.DMA_LATENCY_S
    ) -> cost.Estimate | None:
        key = (case, generation, dma_latency_s)
        if key in self._estimates:
            return self._estimates[key]
        loaded = self.dump(case, generation)
        if loaded is None:
            return None
        try:
            estimate = cost.estimate_case_dump(
                case, generation, *loaded, dma_latency_s=dma_latency_s
            )
        except cost.EstimateError as error:
            self.errors.append(str(error))
            return None
        self._estimates[key] = estimate
        return estimate


# -- calibration ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The published timings against the estimate (:mod:`.published`), and the seed's
    int8-over-bf16 speedup (a ratio: no constant enters it)."""

    validation: published.Validation
    int8_speedup: float | None


def calibrate(runner: Runner) -> Calibration | None:
    """Walks every published program on v5e and fits the shared constants (in-sample and
    leaving each source out); compares the seed matmuls' int8 speedup."""
    validation = published.validate(
        lambda target, latency: runner.estimate(target, "v5e", dma_latency_s=latency)
    )
    if validation is None:
        return None
    bf16 = runner.estimate(cases.SEED_MATMUL_BF16, "v5e")
    int8 = runner.estimate(cases.SEED_MATMUL_INT8, "v5e")
    speedup = bf16.device_s / int8.device_s if bf16 and int8 else None
    return Calibration(validation, speedup)


def calibration_markdown(calibration: Calibration) -> list[str]:
    lines = published.validation_markdown(calibration.validation)
    if calibration.int8_speedup is not None:
        lines += [
            "",
            f"The seed's int8 Pallas matmul at 8192^3 ran {seeds.SEED_INT8_OVER_BF16_SPEEDUP:.2f}x "
            f"as fast as its bf16 one on v5e; estimated: {calibration.int8_speedup:.2f}x.",
        ]
    return lines


# -- estimates -------------------------------------------------------------------------------


def estimate_cases(
    generation: str, ops: Sequence[str] | None = None
) -> tuple[cost.EstimateTarget, ...]:
    """What the estimate table shows for ``generation``: the seed-equivalent kernels, and
    ours beside plain XLA at the seeds' workloads and at the shapes users run (issue #15):
    int8 over ``INT8_USER_M`` x ``INT8_USER_KN`` and 8192^3 (XLA's W8A8 and bfloat16 dots
    beside it at ``W8A8_AND_BF16_M`` and 8192^3), GIOU forward and gradient over 10^4..10^6 pairs, NMS over 1024..16384 boxes.
    ``ops`` keeps only cases of those ops (``"int8_matmul"``, ``"giou"``, ...)."""
    matmul_shapes = [
        (m, k, n) for k, n in int8_matmul_cases.INT8_USER_KN for m in int8_matmul_cases.INT8_USER_M
    ]
    size = seeds.SEED_MATMUL_SIZE
    matmul_shapes.append((size, size, size))
    found: list[cost.EstimateTarget] = [*cases.SEED_CASES]
    for m, k, n in matmul_shapes:
        found += [tpu_cases.int8_matmul_case(mkn=(m, k, n)), cases.xla_matmul_case(m, k, n, "int8")]
        if m in tpu_cases.W8A8_AND_BF16_M or m == size:  # the other XLA dots: fewer M (compiles)
            found += [cases.xla_matmul_case(m, k, n, variant) for variant in ("w8a8", "bf16")]
    for pairs in (cases.GIOU_PAIRS, *giou_cases.GIOU_USER_PAIRS):
        for gradient in (False, True):
            found += [tpu_cases.giou_case(pairs, impl, gradient) for impl in ("pallas_tpu", "xla")]
    tile = tpu_cases.default_nms_tile()
    for n in nms_cases.NMS_USER_N:
        found += [tpu_cases.nms_case(tile, n=n), tpu_cases.nms_xla_case(n)]
    return tuple(case for case in found if ops is None or case.op in ops)


@dataclasses.dataclass(frozen=True)
class Row:
    """One estimate with its labels and roofline: a row of the table and of the JSON."""

    case: cost.EstimateTarget
    estimate: cost.Estimate

    @property
    def roofline_s(self) -> float:
        work = self.case.work
        return work.seconds(self.estimate.generation) if work else math.nan

    @property
    def below_roofline(self) -> bool:
        """The walk came out faster than physics: a cost the walk does not model (see
        :data:`.estimate.BELOW_FLOOR_NOTE`). Printed beside the row, never hidden by a clamp."""
        return self.estimate.device_s < self.roofline_s * (1 - 1e-9)

    def as_json(self) -> dict[str, Any]:
        e = self.estimate
        return {
            "name": self.case.name,
            "op": self.case.op,
            "impl": self.case.impl,
            "shape": self.case.shape,
            "generation": e.generation,
            "program_ms": e.device_s * 1e3,
            "kernel_ms": e.kernel_s * 1e3 if e.kernels else None,
            "roofline_ms": self.roofline_s * 1e3,
            "calibrated_ms": e.per_call_s * 1e3,
            "mxu_stall_ms": e.mxu_stall_cycles / _clock(e.generation) * 1e3,
            "below_floor": self.below_roofline,
        }


def _clock(generation: str) -> float:
    return tpu_generations.get(generation).clock_hz or math.nan


Record = dict[str, Any]  # one JSON row (see Row.as_json)


def normalize(record: Record) -> Record:
    """A JSON row in the current form: rows written when the report clamped the walk to
    the roofline carry the walk as ``schedule_ms``, which becomes ``program_ms``."""
    record = dict(record)
    if "schedule_ms" in record:
        schedule = record.pop("schedule_ms")
        overhead = record["calibrated_ms"] - record["program_ms"]
        record["program_ms"], record["calibrated_ms"] = schedule, schedule + overhead
        record.pop("floored", None)
    record.setdefault("mxu_stall_ms", None)
    roof = record["roofline_ms"]
    record["below_floor"] = roof == roof and record["program_ms"] < roof * (1 - 1e-9)
    return record


def comparisons(records: Sequence[Record]) -> list[tuple[Record, Record]]:
    """(ours, XLA's) pairs: same op (int8 matmul ours against XLA's int8 dot), shape and
    generation."""
    xla = {(r["op"], r["shape"], r["generation"]): r for r in records if r["impl"] == "xla"}
    return [
        (r, xla[key])
        for r in records
        if r["impl"] == "pallas_tpu" and (key := (r["op"], r["shape"], r["generation"])) in xla
    ]


def _util(estimate: cost.Estimate) -> str:
    return " ".join(f"{unit} {estimate.utilization.get(unit, 0.0):.0%}" for unit in UNITS)


def _loops_note(estimate: cost.Estimate) -> str:
    """How the walk settled loops it could not count: trips from the case, or assumed."""
    given = sum("trips given" in note for note in estimate.unresolved)
    assumed = sum("assumed 1 trip" in note for note in estimate.unresolved)
    parts = [f"{given} loop(s) from the workload"] if given else []
    parts += [f"{assumed} loop(s) assumed 1 trip"] if assumed else []
    return ", ".join(parts) or "none"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4f}"


def _fraction(record: Record) -> str:
    return f"{record['roofline_ms'] / record['program_ms']:.0%}"


def estimates_markdown(records: Sequence[Record]) -> list[str]:
    lines = [
        "| case | op | impl | TPU | program ms | of which MXU-busy stalls ms | Pallas kernel ms | roofline ms | roofline / program | per call ms |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        kernel = "-" if r["kernel_ms"] is None else f"{r['kernel_ms']:.4f}"
        stalls = "-" if r["mxu_stall_ms"] is None else f"{r['mxu_stall_ms']:.4f}"
        mark = " (below floor)" if r["below_floor"] else ""
        lines.append(
            f"| {r['name']} | {r['op']} | {r['impl']} | {r['generation']} | "
            f"{r['program_ms']:.4f}{mark} | {stalls} | {kernel} | "
            f"{r['roofline_ms']:.4f} | {_fraction(r)} | {r['calibrated_ms']:.4f} |"
        )
    return lines


def comparison_markdown(records: Sequence[Record]) -> list[str]:
    lines = [
        "| op | shape | TPU | ours (program ms) | XLA (program ms) | ours / XLA | ours: roofline / program | XLA: roofline / program |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for ours, xla in comparisons(records):
        marks = [" (below floor)" if r["below_floor"] else "" for r in (ours, xla)]
        lines.append(
            f"| {ours['op']} | {ours['shape']} | {ours['generation']} | "
            f"{ours['program_ms']:.4f}{marks[0]} | {xla['program_ms']:.4f}{marks[1]} | "
            f"{ours['program_ms'] / xla['program_ms']:.2f} | {_fraction(ours)} | "
            f"{_fraction(xla)} |"
        )
    return lines


def estimates_text(rows: Sequence[Row], verbose: bool) -> list[str]:
    lines = [
        f"{'case':<52} {'TPU':<4} {'program ms':>10} {'kernel ms':>10} {'roofline ms':>11} "
        f"{'roof/prog':>9}  utilisation"
    ]
    for row in rows:
        e = row.estimate
        flag = f"  (below floor: {cost.BELOW_FLOOR_NOTE})" if row.below_roofline else ""
        lines.append(
            f"{row.case.name:<52} {e.generation:<4} {_ms(e.device_s):>10} "
            f"{_ms(e.kernel_s) if e.kernels else '-':>10} "
            f"{_ms(row.roofline_s):>11} {row.roofline_s / e.device_s:>9.0%}  {_util(e)}{flag}"
        )
        if verbose:
            lines += [f"    {line}" for line in e.loops]
            lines += [f"    assumes: {line}" for line in e.assumptions]
            top = sorted(e.programs.items(), key=lambda item: -item[1][1])[1:6]
            lines += [
                f"    {name}: {calls} call(s), {seconds * 1e3:.4f} ms"
                for name, (calls, seconds) in top
            ]
    return lines


# -- tuning ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TuningRow:
    generation: str
    config: str
    device_s: float
    kernel_s: float
    mxu: float
    note: str  # loops the walk could not count


@dataclasses.dataclass(frozen=True)
class Tuning:
    """One sweep: our kernel under several configs against a seed-equivalent baseline,
    compared kernel to kernel (Pallas custom calls) and program to program (all of the
    jitted function). The winner is the fastest Pallas kernel: block sizes change nothing
    else."""

    op: str
    baseline: str
    baseline_s: dict[str, tuple[float, float]]  # generation -> (device s, kernel s)
    rows: tuple[TuningRow, ...]

    def best(self, generation: str) -> TuningRow | None:
        rows = [row for row in self.rows if row.generation == generation]
        return min(rows, key=lambda row: row.kernel_s, default=None)


def _tuning_row(generation: str, config: str, estimate: cost.Estimate) -> TuningRow:
    return TuningRow(
        generation,
        config,
        estimate.device_s,
        estimate.kernel_s,
        estimate.utilization.get("MXU", 0.0),
        _loops_note(estimate),
    )


def _sweep(
    runner: Runner,
    generations: Sequence[str],
    op: str,
    baseline: cost.EstimateTarget,
    configs: Sequence[tuple[str, cost.EstimateTarget]],
) -> Tuning:
    base, rows = {}, []
    for generation in generations:
        if seed := runner.estimate(baseline, generation):
            base[generation] = (seed.device_s, seed.kernel_s)
        for config, case in configs:
            if estimate := runner.estimate(case, generation):
                rows.append(_tuning_row(generation, config, estimate))
    return Tuning(op, baseline.name, base, tuple(rows))


def tune(runner: Runner, generations: Sequence[str]) -> list[Tuning]:
    """Sweeps our int8 matmul blocks (8192^3, the seed's size, and 2048^3) and NMS tiles (the
    seed's workload)."""
    tunings = [
        _sweep(
            runner,
            generations,
            f"int8 matmul {size}^3 (block_m x block_n x block_k)",
            cases.seed_int8_matmul_case(size),
            [
                ("{}x{}x{}".format(*blocks), tpu_cases.int8_matmul_case(blocks, size))
                for blocks in tpu_cases.INT8_MATMUL_SWEEP
            ],
        )
        for size in tpu_cases.INT8_MATMUL_SWEEP_SIZES
    ]
    tunings.append(
        _sweep(
            runner,
            generations,
            "NMS 1024 boxes / 128 outputs (tile)",
            cases.SEED_NMS_PALLAS,
            [(f"tile {tile}", tpu_cases.nms_case(tile)) for tile in nms_cases.NMS_TILE_SWEEP],
        )
    )
    return tunings


def tuning_markdown(tunings: Sequence[Tuning]) -> list[str]:
    lines: list[str] = []
    for tuning in tunings:
        lines += [
            f"#### {tuning.op}",
            "",
            f"Baseline: {tuning.baseline}. Gains are baseline time / this time.",
            "",
            "| TPU | config | Pallas kernel | gain (kernel) | device program | gain (program) "
            "| MXU | data-dependent loops |",
            "|---|---|---:|---:|---:|---:|---:|---|",
        ]
        for row in tuning.rows:
            device, kernel = tuning.baseline_s.get(row.generation, (math.nan, math.nan))
            mark = " **(best)**" if tuning.best(row.generation) == row else ""
            lines.append(
                f"| {row.generation} | {row.config}{mark} | {row.kernel_s * 1e3:.4f} ms | "
                f"{kernel / row.kernel_s:.2f}x | {row.device_s * 1e3:.4f} ms | "
                f"{device / row.device_s:.2f}x | {row.mxu:.0%} | {row.note} |"
            )
        lines.append("")
    return lines


# -- the command -----------------------------------------------------------------------------


def run(
    generations: Sequence[str],
    *,
    tune_blocks: bool,
    markdown: str | None,
    verbose: bool,
    json_path: str | None = None,
    ops: Sequence[str] | None = None,
    recorded: Sequence[str] = (),
) -> int:
    """Estimates ``generations`` (or, with ``recorded`` JSON files, re-renders those rows,
    merged and normalized, compiling nothing: no calibration) and writes the table, JSON
    and markdown."""
    runner = Runner()
    if not recorded:
        runner.progress("compiling with libtpu (a few seconds per kernel and generation)...")
    # Later files win: a row re-estimated in a later file replaces the earlier one.
    merged = {
        (r["name"], r["generation"]): normalize(r)
        for path in recorded
        for r in json.loads(Path(path).read_text())
    }
    records: list[Record] = list(merged.values())
    if recorded:
        generations = sorted({r["generation"] for r in records}, key=tpu_generations.NAMES.index)
    # Calibration first: it walks each published program twice while its dump is cached.
    fresh = not recorded and ops is None
    calibration = calibrate(runner) if fresh and "v5e" in generations else None
    rows: list[Row] = []
    for generation in generations if not recorded else ():
        for case in estimate_cases(generation, ops):
            if estimate := runner.estimate(case, generation):
                rows.append(Row(case, estimate))
        if json_path:  # written as each generation completes: a long run keeps its rows
            _write_json(json_path, [normalize(r.as_json()) for r in rows])
    records += [normalize(r.as_json()) for r in rows]
    print(DISCLAIMER.replace("**", ""))
    print()
    if rows:
        print("\n".join(estimates_text(rows, verbose)))
        print()
    print("\n".join(comparison_markdown(records)))
    if calibration:
        print()
        print("\n".join(calibration_markdown(calibration)))
    tunings = tune(runner, list(generations)) if tune_blocks else []
    if tunings:
        print()
        print("\n".join(tuning_markdown(tunings)))
    if markdown:
        Path(markdown).write_text(
            "\n".join(markdown_document(generations, records, calibration, tunings)) + "\n"
        )
        print(f"wrote {markdown}")
    if json_path:
        _write_json(json_path, records)
        print(f"wrote {json_path}")
    for error in runner.errors:
        print(f"error: {error}", file=sys.stderr)
    low = [f"{r['name']} on {r['generation']}" for r in records if r["below_floor"]]
    for row in low:
        print(f"below its floor: {row} (the walk misses {cost.BELOW_FLOOR_NOTE})", file=sys.stderr)
    return 1 if runner.errors or low else 0


def _write_json(path: str, records: Sequence[Record]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(list(records), indent=1) + "\n")


def markdown_document(
    generations: Sequence[str],
    rows: Sequence[Record],
    calibration: Calibration | None,
    tunings: Sequence[Tuning],
) -> list[str]:
    facts = [tpu_generations.get(g) for g in generations]
    gens = ", ".join(
        f"{g.name} ({(g.clock_hz or 0) / 1e9:.2f} GHz, {g.per_device(g.hbm_bytes_per_s) / 1e9:.0f}"
        f" GB/s HBM{' shared by 2 TensorCores' if g.cores_per_device == 2 else ''})"
        for g in facts
    )
    lines = [
        "## TPU time estimates from the compiler's schedule",
        "",
        DISCLAIMER,
        "",
        f"Generations: {gens}. Generated by `asickernels estimate --markdown PATH`.",
        "",
        LIMITS_NOTE,
        "",
    ]
    if calibration:
        lines += [
            "### Against published TPU timings (calibration and cross-validation)",
            "",
            *calibration_markdown(calibration),
            "",
        ]
        lines += [CALIBRATION_NOTE, ""]
    lines += [
        "### Ours against XLA",
        "",
        "Program against program (the whole jitted function each), same op, shape and TPU; "
        "int8 matmul is ours against XLA's int8 dot (`preferred_element_type=int32`). "
        "*Roofline / program*: the fraction of the physical bound reached (see below).",
        "",
        *comparison_markdown(rows),
        "",
        "### Estimates per case",
        "",
        ROOFLINE_NOTE,
        "",
        "*Program*: the whole jitted function (XLA fusions and Pallas kernels); *per call* "
        "adds the calibrated per-call overhead (the `calibrated_ms` of the JSON). A row whose "
        "*MXU-busy stalls* reads `-` was recorded by an earlier walk that issued MXU pushes "
        "without holding the MXU, with the constants of its day (DMA latency 0.33 us, "
        "per-call overhead 116 us): its program time is low by up to the stalls a dense "
        "matmul shows here (~5-25%); `asickernels estimate --json ... --markdown ...` "
        "re-records every row (about two hours on 2 cores).",
        "",
        *estimates_markdown(rows),
        "",
    ]
    if tunings:
        lines += ["### Block-size tuning (estimated)", "", *tuning_markdown(tunings)]
    return lines


ROOFLINE_NOTE = (
    "*Roofline*: the least time the op can take on that TPU, the larger of its bytes (inputs "
    "read once, outputs written once) over the chip's HBM bandwidth and its operations over "
    "the chip's peak (MXU int8 or bf16, or VPU f32 for GIOU's 28 operations per pair). "
    "*Program*: the walk, never clamped. The compiler issues MXU pushes faster than the "
    "MXU takes them (on paper a dense schedule beats the datasheet peak): the walk holds "
    "each push on its MXU for the rows it moves at the datasheet rate and stalls the next, "
    "shown as *MXU-busy stalls*. A program below its roofline is marked *(below floor)*: "
    "it misses " + cost.BELOW_FLOOR_NOTE + "; the test on the recorded JSON refuses any."
)
CALIBRATION_NOTE = (
    "Every published figure here was timed from Python (`timeit` around "
    "`block_until_ready`), so the estimate compared is the device program plus a per-call "
    "host overhead. That overhead and a latency per DMA are the only fitted constants, shared "
    "by every row; *source held out* scores each source with constants fitted to the other "
    "sources alone. The published programs were rebuilt from the sources' descriptions (the "
    "guide's kernel and block sizes, `jnp.matmul`, the seed's NMS designs) and compiled by "
    "today's libtpu, not the compiler that ran them in 2024."
)
LIMITS_NOTE = (
    "Not modelled: stalls the static schedule does not show beyond MXU occupancy (MXU "
    "result-path latency, VMEM bank conflicts), more than one DMA in flight sharing HBM "
    "beyond a single queue (at the share of the bandwidth libtpu's cost model gives a copy), "
    "the other TensorCore's HBM traffic on v5p (each core gets half the bandwidth instead), "
    "and loops whose exit depends on data where no example values decide them (their trips "
    "come from the workload where the table says so, else they run once). Only v5e's clock "
    "is published; the others are libtpu's (see `asickernels/tpu_generations.py`)."
)
