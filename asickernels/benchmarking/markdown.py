"""``BENCHMARKS.md`` from the JSON that ``asickernels bench --json`` writes (never by hand).

``benchmarks/render.py`` calls :func:`render` on every ``benchmarks/results/*.json`` and
appends every ``benchmarks/results/*.md`` verbatim (sections other tools write, e.g. TPU
time estimates).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from asickernels.benchmarking import schema
from asickernels.benchmarking.harness import BenchRow, CheckRow
from asickernels.benchmarking.report import (
    BENCH_HEADERS,
    BENCH_LEGEND,
    CHECK_HEADERS,
    bench_table,
    check_table,
    format_seconds,
    markdown_table,
    missing_lines,
)
from asickernels.benchmarking.timing import Timing


@dataclasses.dataclass(frozen=True)
class SeedFigure:
    """A device time published in a seed article, and the row of ours to set beside it."""

    op: str
    params: dict[str, Any]
    workload: str
    what: str
    seconds: float
    hardware: str
    our_row: str  # implementation name of our closest row


_NMS_SEED = {"n": 1024, "max_output_size": 128, "iou_threshold": 0.1}
_GIOU_SEED = {"shape": [1024, 256]}
_NMS_LABEL = "NMS, 1024 boxes, 128 outputs, IoU 0.1"
_GIOU_LABEL = "GIOU, 1024×256 box pairs"
SEED_FIGURES = (
    SeedFigure(
        "nms", _NMS_SEED, _NMS_LABEL, "numpy NMS", 2.99e-3, "CPU of a TPU v5e host", "numpy"
    ),
    SeedFigure(
        "nms", _NMS_SEED, _NMS_LABEL, "jitted JAX NMS", 1.231e-3, "CPU of a TPU v5e host", "xla"
    ),
    SeedFigure("nms", _NMS_SEED, _NMS_LABEL, "jitted JAX NMS", 0.416e-3, "TPU v5e", "xla"),
    SeedFigure(
        "nms", _NMS_SEED, _NMS_LABEL, "Pallas NMS kernel", 0.139e-3, "TPU v5e", "pallas_tpu"
    ),
    SeedFigure(
        "giou", _GIOU_SEED, _GIOU_LABEL, "NKI GIOU kernel", 0.211e-3, "inf2 (NeuronCore-v2)", "nki"
    ),
    SeedFigure(
        "giou",
        _GIOU_SEED,
        _GIOU_LABEL,
        "PyTorch GIOU",
        0.293e-3,
        "inf2 (NeuronCore-v2)",
        "torchvision",
    ),
    SeedFigure(
        "giou",
        _GIOU_SEED,
        _GIOU_LABEL,
        "GpSimd C++ GIOU",
        0.061e-3,
        "inf2 (NeuronCore-v2)",
        "gpsimd",
    ),
)
SEED_NOTES = (
    "int8 matmul 8192³ on TPU v5e: the seed's int8 Pallas kernel was 71% faster than its bf16 "
    "Pallas kernel and still slower than XLA's int8 matmul (no absolute times published).",
    "GIOU 1024×256 on TPU v5e: the jitted JAX function was slightly faster than the seed's "
    "Pallas kernel (no absolute times published).",
)


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
    absent = ", ".join(name for name, version in versions.items() if not version)
    busy = f", above the {machine['cores']} cores: other processes competed, timings are noisy"
    return "\n".join(
        [
            f"- Command: `{document['command']}` ({document['created']})",
            f"- Machine: {machine['cpu_model']}, {machine['cores']} cores, {machine['platform']}, "
            f"Python {machine['python']}; JAX platform `{machine['jax_backend']}` "
            f"({', '.join(machine['devices'])})",
            "- Load average when written (1 / 5 / 15 min): "
            + " / ".join(f"{load:.1f}" for load in machine["load_average"])
            + (busy if max(machine["load_average"], default=0.0) > machine["cores"] else ""),
            f"- Versions: {installed}" + (f"; not installed: {absent}" if absent else ""),
        ]
    )


def _times(factor: float) -> str:
    return f"{factor:.0f}×" if factor >= 100 else f"{factor:.3g}×"


def _reading(rows: Sequence[BenchRow]) -> list[str]:
    """Per op and size: the fastest peer, and each of our timed rows against it."""
    lines = []
    groups: dict[tuple[str, str], list[BenchRow]] = {}
    for row in rows:
        groups.setdefault((row.op, row.size), []).append(row)
    for (op, size), group in groups.items():
        peers = [r for r in group if r.role == "peer" and r.timing is not None]
        ours = [r for r in group if r.role == "ours" and r.timing is not None]
        if not peers or not ours:
            continue
        fastest = min(peers, key=lambda r: r.timing.median_s if r.timing else 0.0)
        verdicts = []
        for row in ours:
            ratio = row.ratio_to_fastest_peer or 0.0
            verdict = f"{_times(1 / ratio)} faster" if ratio < 1 else f"{_times(ratio)} slower"
            verdicts.append(f"{row.implementation} ({row.mode}) {verdict}")
        median = fastest.timing.median_s if fastest.timing else None
        lines.append(
            f"- {op} {size}: fastest peer {fastest.implementation} {format_seconds(median)}; "
            + "; ".join(verdicts)
            + "."
        )
    return lines


def _summary(rows: Sequence[BenchRow]) -> list[str]:
    """Where our timed rows beat the fastest peer, and how many did not."""
    ours = [r for r in rows if r.role == "ours" and r.ratio_to_fastest_peer is not None]
    ahead = [r for r in ours if (r.ratio_to_fastest_peer or 0.0) < 1]
    native = sorted({r.implementation for r in ours if r.mode == "native"})
    lines = [
        "- Ahead of the fastest peer: "
        + (
            ", ".join(
                f"{r.implementation} at {r.op} {r.size} ({_times(1 / (r.ratio_to_fastest_peer or 1))} faster)"
                for r in ahead
            )
            or "nowhere"
        )
        + f"; behind in the other {len(ours) - len(ahead)} of our {len(ours)} timed rows.",
        "- Our rows that ran natively (on the hardware they target): "
        + (", ".join(native) or "none: this machine has no TPU and no Neuron device"),
    ]
    return lines


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


# The eager target: a public call on numpy inputs within this factor of the same call jitted.
EAGER_TARGET = 1.5


def _eager_table(rows: Sequence[BenchRow]) -> str | None:
    """Per op and size, ``backend=None`` eager (numpy inputs) against jitted (inputs on the
    device), and the jitted call on the same numpy inputs: the rows ``default-eager``,
    ``default`` and ``default-jit-numpy`` of the harness."""
    timed = {
        (r.op, r.size, r.implementation): r.timing.median_s for r in rows if r.timing is not None
    }
    lines = []
    for (op, size, name), eager in timed.items():
        jitted = timed.get((op, size, "default"))
        if name != "default-eager" or not jitted:
            continue
        ratio = eager / jitted
        on_numpy = timed.get((op, size, "default-jit-numpy"))
        lines.append(
            [
                op,
                size,
                format_seconds(jitted),
                format_seconds(on_numpy) if on_numpy else "",
                format_seconds(eager),
                f"{ratio:.2f}",
                "yes" if ratio <= EAGER_TARGET else "**no**",
                f"{on_numpy / jitted:.2f}" if on_numpy else "",
            ]
        )
    if not lines:
        return None
    headers = (
        "op",
        "size",
        "jitted",
        "jitted, numpy inputs",
        "eager",
        "eager / jitted",
        f"<= {EAGER_TARGET}",
        "jitted on numpy / jitted",
    )
    return markdown_table(headers, lines)


def _seed_table(rows: Sequence[BenchRow]) -> str:
    lines = []
    for figure in SEED_FIGURES:
        ours = next(
            (
                r
                for r in rows
                if r.op == figure.op
                and r.params == figure.params
                and r.implementation == figure.our_row
            ),
            None,
        )
        if ours is None:
            measured, runs = "not measured", ""
        elif ours.timing is None:
            measured, runs = ours.status, ours.detail
        else:
            measured, runs = (
                format_seconds(ours.timing.median_s),
                f"{ours.mode}, this machine's CPU",
            )
        lines.append(
            [
                figure.workload,
                figure.what,
                format_seconds(figure.seconds),
                figure.hardware,
                figure.our_row,
                measured,
                runs,
            ]
        )
    headers = (
        "workload",
        "seed's implementation",
        "seed's time",
        "seed's hardware",
        "our row",
        "ours here",
        "how ours ran",
    )
    return markdown_table(headers, lines)


def render(documents: Sequence[dict[str, Any]], extra_sections: Sequence[str] = ()) -> str:
    """The whole ``BENCHMARKS.md``: per document its environment, reading, tables and
    checks; then the seeds' published figures; then ``extra_sections`` verbatim."""
    parts = [
        "# Benchmarks",
        "Generated by `python benchmarks/render.py` from `benchmarks/results/*.json`, which "
        "`asickernels bench --json` wrote. Do not edit by hand: rerun the command and the "
        "script.",
    ]
    all_rows: list[BenchRow] = []
    for document in documents:
        schema.validate(document)
        rows = bench_rows(document)
        all_rows += rows
        parts += [f"## Measured: `{document['command']}`", _environment(document)]
        reading = _reading(rows)
        if reading:
            parts += [
                "### Reading",
                "Our rows against the fastest peer at the same op and size. On a machine "
                "without a TPU or a Neuron device, our kernels run *simulated* (Pallas "
                "interpret mode, the NKI simulator, the GpSimd host shim): these times are "
                "the cost of the simulation on this CPU, not device performance.",
                "\n".join(_summary(rows)),
                "Per op and size:",
                "\n".join(reading),
            ]
        eager = _eager_table(rows)
        if eager:
            parts += [
                "### Eager against jitted (`backend=None`)",
                "What a user's first calls cost: the public op called eagerly on the bench's "
                "numpy inputs, as the README's examples do, against the same call under "
                "`jax.jit` with the inputs already on the device (medians). The jitted call "
                "on the same numpy inputs shows what JAX itself spends taking numpy "
                "arguments (converting each, and copying those not 64-byte aligned), which "
                "an eager call cannot avoid either. The three are timed in turns of a few "
                "calls (each turn after one untimed call), so that the machine's drift falls "
                "on all alike and no call is timed in caches another call left cold.",
                eager,
            ]
        not_run = _not_run(rows)
        if not_run:
            parts += ["Not run or not timed here:", "\n".join(not_run)]
        if rows:
            parts += ["### Timings", BENCH_LEGEND, markdown_table(BENCH_HEADERS, bench_table(rows))]
        checks = check_rows(document)
        if checks:
            parts += ["### Correctness", markdown_table(CHECK_HEADERS, check_table(checks))]
    parts += [
        "## The seeds' published device figures (different hardware)",
        "Times the seed articles report, measured on TPU v5e and inf2 hardware by their "
        "authors, beside our closest row measured here on CPU. The two columns are different "
        "hardware and must not be read as a speed-up.",
        _seed_table(all_rows),
        "\n".join(f"- {note}" for note in SEED_NOTES),
    ]
    parts += [section.strip() for section in extra_sections]
    return "\n\n".join(parts) + "\n"
