"""``benchmarks/README.md`` from the JSON that ``asickernels bench --json`` writes (never by hand).

``benchmarks/render.py`` calls :func:`render` on every ``benchmarks/results/*.json`` and
links every ``benchmarks/results/*.md`` (sections other tools write, e.g. TPU time
estimates). Summaries compare only rows that ran natively: a simulated row (Pallas
interpret mode, the NKI simulator, the GpSimd host shim) times a CPU stand-in, not the
device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from asickernels.benchmarking import schema
from asickernels.benchmarking.harness import BenchRow, CheckRow
from asickernels.benchmarking.report import (
    CHECK_HEADERS,
    check_table,
    format_seconds,
    markdown_table,
    missing_lines,
)
from asickernels.benchmarking.timing import Timing

COMMAND = "python benchmarks/render.py"

# The eager targets of issue 22: an eager call on numpy inputs within EAGER_ON_NUMPY of
# `jax.jit` called on the same numpy inputs, and within EAGER_ON_DEVICE of the jitted call
# on device inputs wherever that call takes at least LONG_CALL_S.
EAGER_ON_NUMPY = 1.2
EAGER_ON_DEVICE = 1.3
LONG_CALL_S = 200e-6


def bench_rows(document: dict[str, Any]) -> list[BenchRow]:
    rows = []
    for raw in document["results"]:
        fields = dict(raw)
        fields["timing"] = Timing(**raw["timing"]) if raw["timing"] is not None else None
        rows.append(BenchRow(**fields))
    return rows


def check_rows(document: dict[str, Any]) -> list[CheckRow]:
    return [CheckRow(**raw) for raw in document["checks"]]


def _environment(document: dict[str, Any]) -> str:
    machine, versions = document["machine"], document["versions"]
    installed = ", ".join(f"{name} {version}" for name, version in versions.items() if version)
    busy = f" (above the {machine['cores']} cores: other processes competed)"
    return "\n".join(
        [
            f"- Recorded {document['created']} on {machine['cpu_model']}, {machine['cores']} "
            f"cores, Python {machine['python']}, JAX platform `{machine['jax_backend']}`",
            "- Load average (1 / 5 / 15 min): "
            + " / ".join(f"{load:.1f}" for load in machine["load_average"])
            + (busy if max(machine["load_average"], default=0.0) > machine["cores"] else ""),
            f"- Versions: {installed}",
        ]
    )


def _times(factor: float) -> str:
    return f"{factor:.0f}×" if factor >= 100 else f"{factor:.3g}×"


def _median(row: BenchRow) -> float:
    assert row.timing is not None
    return row.timing.median_s


def _groups(rows: Sequence[BenchRow]) -> dict[tuple[str, str], list[BenchRow]]:
    groups: dict[tuple[str, str], list[BenchRow]] = {}
    for row in rows:
        groups.setdefault((row.op, row.size), []).append(row)
    return groups


def native_comparisons(rows: Sequence[BenchRow]) -> list[tuple[BenchRow, BenchRow]]:
    """(our row, fastest peer) for every timed row of ours that ran natively, against the
    fastest peer that ran natively at the same op and size."""
    pairs = []
    for group in _groups(rows).values():
        timed = [r for r in group if r.timing is not None and r.mode == "native"]
        peers = [r for r in timed if r.role == "peer"]
        if not peers:
            continue
        fastest = min(peers, key=_median)
        pairs += [(row, fastest) for row in timed if row.role == "ours"]
    return pairs


def _summary(rows: Sequence[BenchRow]) -> list[str]:
    """Per implementation of ours that ran natively: at how many op sizes it beats the
    fastest native peer (by how much), and where it does not."""
    by_name: dict[str, list[tuple[BenchRow, BenchRow]]] = {}
    for ours, peer in native_comparisons(rows):
        by_name.setdefault(ours.implementation, []).append((ours, peer))
    lines = []
    for name, pairs in by_name.items():
        speedups = [_median(peer) / _median(ours) for ours, peer in pairs]
        ahead = [s for s in speedups if s > 1]
        behind = [
            f"{ours.op} {ours.size} ({_times(_median(ours) / _median(peer))} slower than "
            f"{peer.implementation})"
            for ours, peer in pairs
            if _median(ours) >= _median(peer)
        ]
        line = f"- {name}: faster than the fastest native peer at {len(ahead)} of {len(pairs)}"
        line += f" sizes ({_times(min(ahead))} to {_times(max(ahead))})" if ahead else " sizes"
        lines.append(line + (f"; not at {'; '.join(behind)}." if behind else "."))
    simulated = sorted({r.implementation for r in rows if r.mode == "simulated"})
    if simulated:
        lines.append(
            f"- Simulated here, so not compared: {', '.join(simulated)} (their times are the "
            "cost of the CPU simulation, not of the device)."
        )
    return lines


def _eager_table(rows: Sequence[BenchRow]) -> str | None:
    """``backend=None`` called eagerly on numpy inputs (``default-eager``), against the same
    call under ``jax.jit`` on the same numpy inputs (``default-jit-numpy``) and on inputs
    already on the device (``default``)."""
    timed = {(r.op, r.size, r.implementation): _median(r) for r in rows if r.timing is not None}
    lines = []
    for (op, size, name), eager in timed.items():
        jitted = timed.get((op, size, "default"))
        on_numpy = timed.get((op, size, "default-jit-numpy"))
        if name != "default-eager" or jitted is None or on_numpy is None:
            continue
        numpy_ratio, device_ratio = eager / on_numpy, eager / jitted
        device_bound = jitted >= LONG_CALL_S
        lines.append(
            [
                op,
                size,
                format_seconds(jitted),
                format_seconds(on_numpy),
                format_seconds(eager),
                f"{numpy_ratio:.2f}" + ("" if numpy_ratio <= EAGER_ON_NUMPY else " **no**"),
                f"{device_ratio:.2f}"
                + ("" if not device_bound or device_ratio <= EAGER_ON_DEVICE else " **no**"),
            ]
        )
    if not lines:
        return None
    headers = (
        "op",
        "size",
        "jitted",
        "jitted, numpy in",
        "eager, numpy in",
        f"eager / jitted numpy (≤ {EAGER_ON_NUMPY})",
        f"eager / jitted (≤ {EAGER_ON_DEVICE} from {format_seconds(LONG_CALL_S)})",
    )
    return markdown_table(headers, lines)


def _medians_table(rows: Sequence[BenchRow]) -> str | None:
    """One line per op and size, one column per implementation: median ± spread."""
    names = list(dict.fromkeys(r.implementation for r in rows if r.timing is not None))
    if not names:
        return None
    modes = {r.implementation: r.mode for r in rows if r.timing is not None}
    lines = []
    for (op, size), group in _groups(rows).items():
        cells = {
            r.implementation: f"{format_seconds(r.timing.median_s)} ±{r.timing.spread:.0%}"
            for r in group
            if r.timing is not None
        }
        lines.append([op, size, *(cells.get(name, "") for name in names)])
    headers = [
        "op",
        "size",
        *(name + (" (simulated)" if modes[name] == "simulated" else "") for name in names),
    ]
    return markdown_table(headers, lines)


def _not_run(rows: Sequence[BenchRow]) -> list[str]:
    lines = [f"- cannot run here: {line}" for line in missing_lines(rows)]
    labels = {
        "skipped": "skipped (per-call time, extrapolated from a smaller size, above the limit)",
        "n/a": "not applicable (the backend cannot run this call here by design)",
        "fail": "FAILED the reference check",
        "error": "raised an error",
    }
    for status, label in labels.items():
        by_name: dict[str, list[str]] = {}
        for row in rows:
            if row.status == status:
                by_name.setdefault(row.implementation, []).append(f"{row.op} {row.size}")
        if by_name:
            lines.append(
                f"- {label}: "
                + "; ".join(f"{name} at {', '.join(where)}" for name, where in by_name.items())
            )
    return lines


def _document(document: dict[str, Any]) -> list[str]:
    schema.validate(document)
    rows = bench_rows(document)
    parts = [f"## `{document['command']}`", _environment(document)]
    if rows:
        parts += ["### Summary", "\n".join(_summary(rows))]
    eager = _eager_table(rows)
    if eager:
        parts += [
            "### Eager against jitted (`backend=None`)",
            "The public op called eagerly on numpy inputs, against `jax.jit` of the same "
            "call on the same numpy inputs (what JAX itself costs) and on inputs already on "
            "the device; timed in turns, so drift falls on all three alike.",
            eager,
        ]
    medians = _medians_table(rows)
    if medians:
        parts += [
            "### Medians",
            "± is half the 10–90 percentile range of the timed calls, relative to the median.",
            medians,
        ]
    not_run = _not_run(rows)
    if not_run:
        parts += ["Not run or not timed here:", "\n".join(not_run)]
    checks = check_rows(document)
    if checks:
        parts += ["### Correctness", markdown_table(CHECK_HEADERS, check_table(checks))]
    return parts


def _percent(fraction: float) -> str:
    return f"{fraction:+.1%}"


def nki_calibration(document: dict[str, Any], source: str) -> list[str]:
    """The NKI cost model's calibration (``document``: the ``calibration.json`` at
    ``source``, written by ``benchmarks/nki_estimate/calibrate.py``): each published device
    figure beside the estimate and its error, the median |error| and the rank order."""
    model = document["model"]
    rows = model["rows"]
    lines = [
        [
            row["kernel"],
            row["family"],
            row["device"],
            row["method"],
            f"{row['published_ms']:g}",
            f"{row['estimate_ms']:.3f}",
            _percent(row["error"]) if row["absolute"] else "ratio only",
            row["bound"],
        ]
        for row in rows
    ]
    table = markdown_table(
        ("kernel", "workload", "device", "method", "published ms", "estimate ms", "error", "bound"),
        lines,
    )
    absolute = sum(bool(row["absolute"]) for row in rows)
    rank = "; ".join(
        f"{family}: {'agrees' if agrees else '**does not agree**'}"
        for family, agrees in model["rank_order_agrees"].items()
    )
    steps = "; ".join(
        f"{family}: published {ratio['published']:g}×, estimated {ratio['estimate']:g}×"
        for family, ratio in model["first_over_last_step"].items()
    )
    sources = "\n".join(f"- {text}" for text in sorted({row["source"] for row in rows}))
    return [
        "## NKI cost model against published device figures",
        f"`{document['command']}` (recorded in [{source}]({source})): AWS's tutorial kernels "
        "run in the NKI simulator at their published shapes, and `nki.benchmark`'s cost "
        "model (`asickernels/simulate/nki/estimate.py`) estimates each; no Neuron device ran "
        "anything here. Error = estimate / published - 1; *ratio only* rows are compared "
        "only as a ratio between the kernel's steps. The model fits shared constants, never "
        "per-kernel ones (see [nki_estimate/README.md](nki_estimate/README.md)).",
        table,
        f"Median |error| over the {absolute} absolute rows: "
        f"{model['median_abs_error']:.1%} (`DMA_BUFFER_NS` = {model['dma_buffer_ns']:g} ns; "
        f"the best fit on this set is {document['fitted_dma_buffer_ns']:g} ns).\n\n"
        f"Rank order of the steps within each workload: {rank}.\n\n"
        f"First step over last step: {steps}.",
        "Published figures from:\n" + sources,
    ]


def render(
    documents: Sequence[dict[str, Any]],
    other_results: Sequence[str] = (),
    nki_calibration_document: tuple[dict[str, Any], str] | None = None,
) -> str:
    """The whole ``benchmarks/README.md``: per document its environment, summary and tables;
    the NKI cost model's calibration (``(calibration.json contents, its path relative to
    benchmarks/)``) when given; then a link to each of ``other_results`` (paths relative to
    ``benchmarks/``, each a markdown file another tool wrote)."""
    parts = [
        "# Benchmarks",
        f"Generated by `{COMMAND}` from `benchmarks/results/*.json` (each written by the "
        "command in its section's title); `tests/docs/test_benchmarks_readme.py` checks that this "
        "file is what the script renders. Every result was checked against the float64 "
        "reference before it was timed, through the public API. Rows marked *simulated* "
        "time a CPU stand-in for the device; summaries compare only rows that ran natively.",
    ]
    for document in documents:
        parts += _document(document)
    if nki_calibration_document is not None:
        parts += nki_calibration(*nki_calibration_document)
    if other_results:
        parts += [
            "## Other recorded results",
            "\n".join(f"- [{path}]({path})" for path in other_results),
        ]
    return "\n\n".join(parts) + "\n"
