"""``asickernels estimate --neuron``: modelled NeuronCore times of our NKI kernels beside their
roofline (estimates, not measurements: no Neuron device ran anything).

Each kernel runs once in the NKI simulator, on the bench workload
(:data:`asickernels.kernels.case_tables.WORKLOADS`, seed 0) at the size in :data:`KERNELS`, through
the public op with ``backend="nki"``, with the simulator's target set to the oldest
generation asked for (``NEURON_PLATFORM_TARGET_OVERRIDE``: its limits are checked); the cost
model (:mod:`asickernels.simulate.nki.estimate`) schedules the recorded instruction trace on
each generation. What it does not see: the compiler's scheduling, fusion and buffer
allocation, and other NeuronCores sharing HBM.

The roofline (:func:`roofline_us`) is the least time the op can take on one NeuronCore
whatever the kernel: what it must move and compute (:class:`asickernels.kernels.cases.Work`,
declared with each op's cases) at each generation's clocks and rates
(:data:`asickernels.simulate.nki.estimate.GENERATIONS`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from asickernels.kernels.case_tables import NKI_ESTIMATES, WORKLOADS
from asickernels.kernels.cases import NkiEstimate, Size, Work
from asickernels.simulate.nki import runtime
from asickernels.simulate.nki.estimate import (
    ENGINES,
    PARTITIONS,
    UNCALIBRATED_BAND_FACTOR,
    Estimate,
    Generation,
    estimate,
    generation_of,
)
from asickernels.simulate.nki.trace import Instruction

__all__ = ["KERNELS", "Row", "add_arguments", "kernel_rows", "roofline_us", "run_cli"]

# The generations `--neuron` estimates by default (one row each; trn1 and inf2 share one).
DEFAULT_VERSIONS = (2, 3, 4)
# The rows, with each op's sizes and work declared with its cases (``NKI_ESTIMATES`` in
# ``kernels/<op>_cases.py``).
KERNELS = NKI_ESTIMATES
KERNEL_NAMES = tuple(case.op for case in KERNELS)


@dataclasses.dataclass(frozen=True)
class Row:
    """One kernel on one generation: the model's :class:`Estimate` and the roofline."""

    case: NkiEstimate
    version: int  # NeuronCore-v<version>
    estimate: Estimate
    roofline_us: float

    def as_json(self) -> dict[str, Any]:
        e = self.estimate
        return {
            "op": self.case.op,
            "size": parsed_size(self.case).label,
            "generation": e.generation,
            "neuroncore": f"v{self.version}",
            "estimate_us": e.latency_us,
            "band_us": None if e.band_us is None else list(e.band_us),
            "calibrated": e.calibrated,
            "roofline_us": self.roofline_us,
            "bound": e.bound,
            "busy_share": {engine: round(share, 4) for engine, share in e.busy_share.items()},
            "instructions": e.instructions,
        }


def roofline_us(work: Work, generation: Generation) -> float:
    """The least time ``work`` takes on one NeuronCore of ``generation``, in microseconds: the
    larger of its bytes over the HBM bandwidth and its operations over its engine's peak
    (TensorE: a 128 x 128 multiply-accumulate array, one moving column per cycle; VectorE:
    128 partitions x its float32 elements per cycle)."""
    if work.engine == "tensor":
        ops_per_ns = 2 * PARTITIONS * PARTITIONS * generation.clock_ghz["tensor"]
    else:
        ops_per_ns = PARTITIONS * generation.vector_rate[1] * generation.clock_ghz["vector"]
    return max(work.hbm_bytes / generation.hbm_bytes_per_ns, work.ops / ops_per_ns) / 1000


def parsed_size(case: NkiEstimate) -> Size:
    """``case``'s size, parsed by its workload."""
    return WORKLOADS[case.op].parse_size(case.size)


def kernel_trace(case: NkiEstimate, version: int) -> list[Instruction]:
    """The instruction trace of ``case``'s one NKI kernel launch on NeuronCore-v``version``.

    Raises RuntimeError when the Neuron SDK runs the kernels (its simulator records no
    trace) or the op launched other than one single-core kernel."""
    import numpy as np

    import asickernels
    from asickernels.backends.nki import sdk

    if sdk.USING_SDK:
        raise RuntimeError(
            "the Neuron SDK is installed, so the nki backend runs its kernels there; the "
            "estimate needs asickernels' simulator (it records the instruction trace)"
        )
    op = WORKLOADS[case.op]
    inputs = op.bench_case(parsed_size(case), np.random.default_rng(0))
    launches: list[Any] = []
    with (
        runtime.targeting(f"gen{version}"),
        sdk.observing_kernels(lambda kernel, args, kwargs: launches.append(kernel)),
        runtime.recording(),
    ):
        getattr(asickernels, case.op)(*inputs.arrays, backend="nki", **inputs.static)
    traces = runtime.last_traces()
    if len(launches) != 1 or len(traces) != 1:
        raise RuntimeError(
            f"{case.op} launched {len(launches)} kernel(s) on {len(traces)} core(s); the "
            "estimate covers one single-core launch"
        )
    return traces[0][1]


def kernel_rows(
    versions: Sequence[int] = DEFAULT_VERSIONS,
    ops: Sequence[str] | None = None,
    *,
    timeline: bool = False,
) -> list[Row]:
    """A :class:`Row` per kernel of :data:`KERNELS` (those named in ``ops``, default all) and
    NeuronCore version in ``versions`` (2, 3 or 4; ValueError otherwise); ``timeline`` keeps each
    estimate's engine timeline (:meth:`Estimate.chrome_trace`)."""
    generations = {version: generation_of(version) for version in versions}
    if not generations:
        raise ValueError("versions: give at least one NeuronCore version (2, 3 or 4)")
    unknown = sorted(set(ops or ()) - set(KERNEL_NAMES))
    if unknown:
        raise ValueError(f"no NKI kernel estimate for {unknown}; choose from {list(KERNEL_NAMES)}")
    rows = []
    for case in KERNELS:
        if ops is not None and case.op not in ops:
            continue
        work = case.work(parsed_size(case))
        # One run on the oldest generation asked for (the smallest SBUF, the fewest
        # instructions): the simulator checks a target's limits but issues the same
        # instructions on every target, so its trace is each generation's trace.
        trace = kernel_trace(case, min(generations))
        for version, generation in generations.items():
            modelled = estimate(trace, version, timeline=timeline)
            rows.append(Row(case, version, modelled, roofline_us(work, generation)))
    return rows


# -- the command -----------------------------------------------------------------------------

DISCLAIMER = (
    "NKI kernel estimates: a cost model over the NKI simulator's instruction trace "
    "(asickernels.simulate.nki.estimate), not measurements; no Neuron device ran anything. "
    "Not modelled: the compiler's scheduling, fusion and buffer allocation, and other "
    "NeuronCores sharing HBM."
)
TPU_ONLY_OPTIONS = ("generation", "tune", "render", "op")


def parse_generations(text: str) -> list[int]:
    """``--neuron``'s value: comma-separated Neuron names (``trn1``, ``inf2``, ``trn2``,
    ``trn3``, ``gen2``..``gen4``) as NeuronCore versions, each once; empty: all."""
    names = [name for name in text.split(",") if name.strip()]
    try:
        versions = [runtime.target_named(name, "--neuron").version for name in names]
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return list(dict.fromkeys(versions)) or list(DEFAULT_VERSIONS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--neuron``, ``--kernel`` and ``--timeline`` on the ``estimate`` command."""
    parser.add_argument(
        "--neuron",
        nargs="?",
        const="",
        type=parse_generations,
        metavar="GEN[,GEN...]",
        help="estimate our NKI kernels instead (NKI simulator + cost model; no libtpu): "
        "trn1/inf2 (NeuronCore-v2), trn2, trn3 (default: all three)",
    )
    parser.add_argument(
        "--kernel",
        action="append",
        choices=KERNEL_NAMES,
        metavar="KERNEL",
        help=f"with --neuron: only this kernel (repeatable; default: all): {', '.join(KERNEL_NAMES)}",
    )
    parser.add_argument(
        "--timeline",
        metavar="PATH",
        help="with --neuron, one kernel and one generation: write its modelled engine "
        "timeline, as a PNG (PATH ending .png; needs matplotlib) or Chrome/Perfetto trace "
        "JSON (.json)",
    )


def usage_error(args: argparse.Namespace) -> str | None:
    """What is wrong with combining the ``estimate`` command's options, or None."""
    if args.neuron is None:
        given = [f"--{name}" for name in ("kernel", "timeline") if getattr(args, name, None)]
        verb = "needs" if len(given) == 1 else "need"
        return f"{' and '.join(given)} {verb} --neuron" if given else None
    tpu = [f"--{name}" for name in TPU_ONLY_OPTIONS if getattr(args, name, None)]
    if tpu:
        return f"{', '.join(tpu)} apply to TPU estimates, not to --neuron"
    if args.timeline:
        kernels = args.kernel or KERNEL_NAMES
        if len(set(kernels)) != 1 or len(args.neuron) != 1:
            return (
                "--timeline draws one kernel on one generation: give --kernel NAME and --neuron GEN"
            )
        suffix = Path(args.timeline).suffix.lower()
        if suffix not in (".png", ".json"):
            return f"--timeline {args.timeline}: the file name must end in .png or .json"
        if suffix == ".png" and importlib.util.find_spec("matplotlib") is None:
            return (
                f"--timeline {args.timeline}: a PNG needs matplotlib (pip install matplotlib); "
                "a .json timeline needs nothing"
            )
    return None


def _band(e: Estimate) -> str:
    """The band, marked ``*`` where no measured latency calibrates the generation."""
    if e.band_us is None:
        return ""
    return f"{e.band_us[0]:.2f}-{e.band_us[1]:.2f}" + ("" if e.calibrated else "*")


UNCALIBRATED_NOTE = (
    f"* no measured latency calibrates this generation (trn2, trn3): the band is widened "
    f"x{UNCALIBRATED_BAND_FACTOR:g}, the model's largest error on trn1 data it was not fitted on"
)


def text_table(rows: Sequence[Row]) -> list[str]:
    engines = " ".join(engine[0].upper() for engine in ENGINES)
    lines = [
        f"{'kernel':<20} {'size':<24} {'NeuronCore':<26} {'estimate us':>11} {'band us':>17} "
        f"{'roofline us':>11} {'roof/est':>8}  {'bound':<8} busy % ({engines})"
    ]
    for row in rows:
        e = row.estimate
        busy = " ".join(f"{e.busy_share[engine]:.0%}" for engine in ENGINES)
        lines.append(
            f"{row.case.op:<20} {parsed_size(row.case).label:<24} {e.generation:<26} "
            f"{e.latency_us:>11.2f} {_band(e):>17} {row.roofline_us:>11.2f} "
            f"{row.roofline_us / e.latency_us:>8.0%}  {e.bound:<8} {busy}"
        )
    return lines


# aws-neuron/aws-neuron-sdk#1322 (the NxD Inference release notes it quotes): "NKI 0.3.0
# kernels are not supported on Trn1/Inf2".
TRN1_NOTE = (
    "Our kernels are written for the current `nki` API (Neuron 2.27+), whose kernels AWS says "
    "do not run on trn1/inf2 from NKI 0.3 on (aws-neuron/aws-neuron-sdk#1322). The trn1/inf2 "
    "column is the same instruction trace on NeuronCore-v2's engines, clocks and DMA: what the "
    "kernels would take ported instruction for instruction to the legacy `neuronxcc.nki` API, "
    "which runs there. It is also the generation the model's constants are calibrated on; "
    "trn2 and trn3, where these kernels run, have no measured latency to calibrate on."
)


def markdown_page(rows: Sequence[Row], command: str | None) -> str:
    """The estimates as a markdown page: one line per kernel, a column per generation
    (``estimate us (band)``, the roofline and the bound engine)."""
    versions = sorted({row.version for row in rows})
    names = {v: generation_of(v).name for v in versions}
    cases = list(dict.fromkeys(row.case for row in rows))
    lines = [
        "## NKI kernel estimates (a cost model, not measurements)",
        "",
        DISCLAIMER + (f" Generated by `{command}`." if command else ""),
        "",
        TRN1_NOTE,
        "",
        "Each cell: estimate us (band us), its roofline us, the engine it is bound by.",
        "",
        "| kernel | size | " + " | ".join(names[v] for v in versions) + " |",
        "|---|---|" + "---:|" * len(versions),
    ]
    by_key = {(row.case, row.version): row for row in rows}
    for case in cases:
        cells = []
        for version in versions:
            row = by_key.get((case, version))
            if row is None:
                cells.append("")
                continue
            e = row.estimate
            cells.append(f"{e.latency_us:.2f} ({_band(e)}), {row.roofline_us:.2f}, {e.bound}")
        lines.append(f"| {case.op} | {parsed_size(case).label} | " + " | ".join(cells) + " |")
    if not all(row.estimate.calibrated for row in rows):
        lines += ["", UNCALIBRATED_NOTE]
    lines += ["", "Sizes (bench workloads, seed 0; nki_estimates.KERNELS):", ""]
    lines += [f"- {case.op} {parsed_size(case).label}: {case.why}" for case in cases]
    return "\n".join(lines) + "\n"


def run_cli(args: argparse.Namespace) -> int:
    """``asickernels estimate --neuron [...]``: the table, ``--json`` rows, ``--timeline``."""
    problem = usage_error(args)
    if problem:
        print(f"asickernels estimate: error: {problem}", file=sys.stderr)
        return 2
    rows = kernel_rows(args.neuron, args.kernel, timeline=bool(args.timeline))
    print(DISCLAIMER)
    print()
    print("\n".join(text_table(rows)))
    if not all(row.estimate.calibrated for row in rows):
        print(UNCALIBRATED_NOTE)
    print()
    print("Sizes (bench workloads, seed 0; nki_estimates.KERNELS):")
    for case in dict.fromkeys(row.case for row in rows):
        print(f"  {case.op} {parsed_size(case).label}: {case.why}")
    if args.json:
        document = {
            "command": getattr(args, "command_line", None),
            "note": DISCLAIMER,
            "rows": [row.as_json() for row in rows],
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(document, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(markdown_page(rows, getattr(args, "command_line", None)))
        print(f"wrote {args.markdown}")
    if args.timeline:
        (row,) = rows
        if Path(args.timeline).suffix.lower() == ".json":
            row.estimate.write_chrome_trace(args.timeline)
        else:
            from asickernels.simulate.nki.timeline_png import write_timeline_png

            title = f"{row.case.op} {parsed_size(row.case).label}"
            write_timeline_png(row.estimate.chrome_trace(), args.timeline, title=title)
        print(f"wrote {args.timeline}")
    return 0
