"""Tables (plain text and markdown), the JSON document and the PNG plot of check/bench rows."""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import os
import platform
import sys
from collections.abc import Collection, Iterable, Sequence
from typing import Any, TypedDict

from asickernels.benchmarking import schema
from asickernels.benchmarking.harness import BenchRow, BenchSettings, CheckRow

VERSIONED_PACKAGES = (
    "asickernels",
    "jax",
    "jaxlib",
    "libtpu",
    "numpy",
    "ml_dtypes",
    "torch",
    "torchvision",
    "torch_xla",
    "matplotlib",
)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class Machine(TypedDict):
    """Where a document's figures were measured."""

    cpu_model: str
    cores: int
    platform: str
    python: str
    jax_backend: str
    devices: list[str]
    load_average: list[float]


def machine() -> Machine:
    import jax

    return {
        "cpu_model": cpu_model(),
        "cores": os.cpu_count() or 0,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "jax_backend": jax.default_backend(),
        "devices": [f"{d.platform}:{d.device_kind}" for d in jax.devices()],
        # Other processes compete for the cores: timings are only as quiet as the machine.
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else [],
    }


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for package in VERSIONED_PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


# -- numbers -------------------------------------------------------------------------------


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def format_error(value: float | None) -> str:
    if value is None:
        return "-"
    return "0" if value == 0 else f"{value:.2g}"


# -- tables --------------------------------------------------------------------------------

BENCH_HEADERS = (
    "op",
    "size",
    "implementation",
    "role",
    "runs",
    "result",
    "max err",
    "median",
    "±",
    "n",
    "vs fastest peer",
    "notes",
)
CHECK_HEADERS = ("op", "backend", "runs", "cases ok", "worst err", "tol", "result", "details")
CHECK_LEGEND = (
    "worst err = the largest error against the float64 reference over the cases, in units of "
    "the op's allowed error: it passes at tol = 1 or less. Where the result must be exact (tol "
    "0: NMS indices, int8 matmul's int32) any error fails; int8 matmul with scales: the "
    "relative error (tol 1e-06). runs: native on this machine, or simulated (its kernel in a "
    "CPU simulator of the device)."
)


def _counter(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.4g}"


def bench_table(rows: Sequence[BenchRow]) -> list[list[str]]:
    """One line per row that could run here (see :func:`missing_lines` for the others); op
    and size are written only where they change."""
    lines = []
    previous: tuple[str, str] | None = None
    for row in rows:
        if row.status == "missing":
            continue
        timing = row.timing
        notes = [row.detail] if row.detail else []
        if timing is not None and timing.first_call_s is not None:
            notes.append(f"first call {format_seconds(timing.first_call_s)}")
        if row.checked not in (None, "all"):
            notes.append(f"checked {row.checked}")
        notes += [f"{k}={_counter(v)}" for k, v in row.counters.items()]
        lines.append(
            [
                row.op if (row.op, row.size) != previous else "",
                row.size if (row.op, row.size) != previous else "",
                row.implementation,
                row.role,
                row.mode,
                row.status if row.status in ("ok", "skipped", "n/a") else row.status.upper(),
                format_error(row.max_error),
                format_seconds(timing.median_s if timing else None),
                f"{timing.spread:.0%}" if timing else "",
                str(timing.repeats) if timing else "",
                f"{row.ratio_to_fastest_peer:.2f}x"
                if row.ratio_to_fastest_peer is not None
                else "",
                "; ".join(notes),
            ]
        )
        previous = (row.op, row.size)
    return lines


def missing_lines(rows: Sequence[BenchRow | CheckRow]) -> list[str]:
    """One line per implementation that cannot run here: its ops, why, how to install it."""
    ops: dict[str, list[str]] = {}
    details: dict[str, str] = {}
    for row in rows:
        if row.status == "missing":
            ops.setdefault(row.implementation, [])
            if row.op not in ops[row.implementation]:
                ops[row.implementation].append(row.op)
            details[row.implementation] = row.detail
    return [f"{name} ({', '.join(names)}): {details[name]}" for name, names in ops.items()]


def check_table(rows: Sequence[CheckRow]) -> list[list[str]]:
    """One line per (op, backend) that could run here: how many cases passed (of those
    that apply), the worst error, what failed and what does not apply."""
    groups: dict[tuple[str, str], list[CheckRow]] = {}
    for row in rows:
        groups.setdefault((row.op, row.implementation), []).append(row)
    lines = []
    for (op, backend), group in groups.items():
        if group[0].status == "missing":
            continue
        bad = [r for r in group if r.status in ("fail", "error")]
        not_applicable = [r for r in group if r.status == "n/a"]
        applied = len(group) - len(not_applicable)
        errors = [r.max_error for r in group if r.max_error is not None]
        worst = max(errors) if errors else None
        tolerances = {r.tolerance for r in group if r.tolerance is not None}
        reasons: dict[str, list[str]] = {}
        for r in not_applicable:
            reasons.setdefault(r.detail, []).append(r.case)
        details = "; ".join(
            [f"{r.case}: {r.detail or f'error {format_error(r.max_error)}'}" for r in bad]
            + [f"{', '.join(cases)}: n/a ({reason})" for reason, cases in reasons.items()]
        )
        lines.append(
            [
                op,
                backend,
                group[0].mode,
                f"{applied - len(bad)}/{applied}"
                + (f" +{len(not_applicable)} n/a" if not_applicable else ""),
                format_error(worst),
                "/".join(format_error(t) for t in sorted(tolerances)),
                "FAIL" if bad else "ok" if applied else "n/a",
                details,
            ]
        )
    return lines


def text_table(
    headers: Sequence[str], lines: Iterable[Sequence[str]], *, right: Collection[int] = ()
) -> str:
    """Columns as wide as their widest cell (the last one unpadded), numbered columns in
    ``right`` right-aligned."""
    lines = [list(headers)] + [list(line) for line in lines]
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers) - 1)]
    rendered = []
    for line in lines:
        cells = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=False))
        ]
        rendered.append("  ".join([*cells, line[-1]]).rstrip())
    rendered.insert(1, "-" * len(rendered[0]))
    return "\n".join(rendered)


def markdown_table(headers: Sequence[str], lines: Iterable[Sequence[str]]) -> str:
    def row(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    return "\n".join([row(headers), row(["---"] * len(headers))] + [row(line) for line in lines])


BENCH_LEGEND = (
    "vs fastest peer = median / the fastest peer's median at the same op and size (< 1: faster "
    "than every peer). ± = half the 10-90 percentile range of the timed calls, relative to "
    "the median; n = timed calls. Rows that run 'simulated' time a CPU simulation of the "
    "kernel (e.g. Pallas interpret mode), not the device. Every row's result was checked "
    "against the float64 reference before it was timed."
)


# -- JSON ----------------------------------------------------------------------------------


def settings_json(settings: BenchSettings) -> dict[str, Any]:
    described = dataclasses.asdict(settings)
    described["sizes"] = {
        op: [size.label for size in sizes] for op, sizes in settings.sizes.items()
    }
    described["selected"] = sorted(settings.selected) if settings.selected is not None else None
    return described


def document(
    command: str,
    *,
    checks: Sequence[CheckRow] = (),
    results: Sequence[BenchRow] = (),
    settings: BenchSettings | None = None,
) -> dict[str, Any]:
    """The schema's document (see :mod:`asickernels.benchmarking.schema`)."""

    def bench_json(row: BenchRow) -> dict[str, Any]:
        described = dataclasses.asdict(row)
        described["timing"] = row.timing.to_json() if row.timing is not None else None
        return described

    doc = {
        "schema": schema.SCHEMA,
        "command": command,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "versions": versions(),
        "settings": settings_json(settings) if settings is not None else None,
        "checks": [dataclasses.asdict(row) for row in checks],
        "results": [bench_json(row) for row in results],
    }
    schema.validate(doc)
    return doc


# -- plot ----------------------------------------------------------------------------------


def plot(results: Sequence[BenchRow], path: str) -> None:
    """One panel per op: median time per size, a bar per implementation (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [row for row in results if row.timing is not None]
    ops = list(dict.fromkeys(row.op for row in timed))
    if not ops:
        raise ValueError("nothing was timed: no plot to draw")
    figure, axes = plt.subplots(len(ops), 1, figsize=(10, 3.2 * len(ops)), squeeze=False)
    for axis, op in zip(axes[:, 0], ops, strict=True):
        rows = [row for row in timed if row.op == op]
        sizes = list(dict.fromkeys(row.size for row in rows))
        names = list(dict.fromkeys(row.implementation for row in rows))
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            points = [
                (sizes.index(r.size), r.timing.median_s * 1e3)
                for r in rows
                if r.implementation == name and r.timing
            ]
            axis.bar([x + i * width for x, _ in points], [y for _, y in points], width, label=name)
        axis.set_xticks([x + 0.4 - width / 2 for x in range(len(sizes))], sizes)
        axis.set_yscale("log")
        axis.set_ylabel("median ms")
        axis.set_title(op)
        axis.legend(fontsize="small", ncol=min(len(names), 4))
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
