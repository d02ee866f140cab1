"""NKIBench's kernels against the trn1 profiles published with them: the cost model's
end-to-end error, its sub-models (HBM bytes, per-engine busy time) against the profiler's,
and leave-one-family-out cross-validation of the shared DMA constants.

    PYTHONPATH=. python benchmarks/nki_estimate/nkibench.py ACCELOPT [--traces DIR] [--out FILE]

ACCELOPT is github.com/zhang677/AccelOpt: a clone, or the git directory the search tool's
``fetch`` brings; files are read at 47e29a7 with ``git show 47e29a7:PATH``. Its code
is read at run time and never committed; ``nkibench.json`` records only figures and
citations. Each kernel (``NKIBench/kernels/*_0.py``, the legacy ``neuronxcc.nki`` API) runs
unchanged through ``nki.benchmark`` in trace-only mode on ``nt.tensor`` placeholders of the
shapes its reference's ``transform_to_nki_inputs`` gives. Simulating takes minutes per
kernel; ``--traces DIR`` keeps the traces so a second run only re-estimates.

The figures (experiments/full_complete_local/profile_results.csv@47e29a7): one
``neuron-profile`` capture per kernel on trn1.32xlarge (README.md@47e29a7: Deep Learning AMI
Neuron, Ubuntu 22.04, the PyTorch 2.7 Neuron venv), re-run until the spread of repeated
captures is within tolerance; ``latency`` is the profile's total time (ms), with the
profiler's HBM read/write bytes, spill bytes and engine active-time fractions.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import itertools
import json
import math
import pathlib
import pickle
import statistics
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np

from asickernels.simulate.nki import estimate as cost_model
from asickernels.simulate.nki.install import install

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import calibrate  # noqa: E402  (the tutorial figures, and the trn1 trace of a kernel)

COMMIT = "47e29a7"
PROFILES = "experiments/full_complete_local/profile_results.csv"
SOURCE = f"zhang677/AccelOpt@{COMMIT} {PROFILES}"
METHOD = "neuron-profile total time of one capture (ms), trn1.32xlarge, PyTorch 2.7 Neuron AMI"
# What each NKIBench problem is: cross-validation leaves one family out at a time.
FAMILIES = {
    "matmul": "matmul",
    "transpose_matmul": "matmul",
    "lora": "matmul",
    "bmm": "matmul",
    "rmsnorm_matmul": "norm + matmul",
    "add_rmsnorm_matmul": "norm + matmul",
    "matmul_add_rmsnorm": "norm + matmul",
    "swiglu": "norm + matmul",
    "gqa_full": "attention",
    "bmm_softmax": "attention",
    "silu": "elementwise",
    "adamw": "elementwise",
    "rope_single_freq_apply": "elementwise",
    "mamba": "scan",
}
# The SDK 2.20 tutorials (calibrate.py) with ``--tutorials``: their own families.
TUTORIAL_FAMILIES = {
    "matrix_multiplication_nki_kernels": "SDK 2.20 matmul tutorial",
    "mamba_nki_kernels": "SDK 2.20 mamba tutorial",
}
# The per-piece overhead is held at calibrate.py's fit on the tutorials (10 ns; one value
# keeps the grid's estimates, minutes each on the large kernels, to one per efficiency);
# each compiler release's DMA efficiency is fitted on its own figures (estimate.py).
BUFFER_NS_GRID = [10.0]
EFFICIENCY_GRID = {
    "current": [round(0.05 * step, 2) for step in range(10, 21)],
    "sdk-2.20": [round(0.025 * step, 3) for step in range(14, 21)],
}
SHIPPED_EFFICIENCY = {
    "current": cost_model.DMA_EFFICIENCY,
    "sdk-2.20": cost_model.DMA_EFFICIENCY_SDK_2_20,
}


class PinnedRepo:
    """Files of a repository at ``commit``, read with ``git show`` from a clone or from the
    git directory ``fetch`` brings (a clone's working tree may be at another commit)."""

    def __init__(self, path: pathlib.Path, commit: str) -> None:
        self.git_dir = path / ".git" if (path / ".git").exists() else path
        self.commit = commit

    def read(self, name: str) -> str:
        return subprocess.run(
            ["git", f"--git-dir={self.git_dir}", "show", f"{self.commit}:{name}"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip


def profiles(source: PinnedRepo) -> list[dict[str, Any]]:
    """One row per kernel: its problem, kernel and reference files, and the profile."""
    rows = []
    for row in csv.DictReader(io.StringIO(source.read(PROFILES))):
        rows.append({
            "problem": row["problem"],
            "kernel": "NKIBench/kernels/" + pathlib.PurePath(row["kernel"]).name,
            "reference": "NKIBench/reference/" + pathlib.PurePath(row["task"]).name,
            "profile": json.loads(row["profile"]),
        })  # fmt: skip
    return rows


def _module(source: PinnedRepo, name: str, folder: pathlib.Path) -> Any:
    path = folder / pathlib.PurePath(name).name
    path.write_text(source.read(name))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kernel_of(source: PinnedRepo, row: dict[str, Any]) -> tuple[Any, list[Any]]:
    """``row``'s kernel and its arguments: ``nt.tensor`` placeholders of the shapes its
    reference's ``transform_to_nki_inputs`` gives."""
    install()
    import neuronxcc.nki.language as nl  # type: ignore[import-not-found]
    import neuronxcc.nki.typing as nt  # type: ignore[import-not-found]

    with tempfile.TemporaryDirectory() as folder:
        reference = _module(source, row["reference"], pathlib.Path(folder))
        kernel = _module(source, row["kernel"], pathlib.Path(folder)).kernel
        np.random.seed(0)
        arrays = reference.transform_to_nki_inputs(reference.get_inputs())
    placeholders = [
        nt.tensor[list(a.shape), getattr(nl, a.dtype.name)] if isinstance(a, np.ndarray) else a
        for a in arrays
    ]
    return kernel, placeholders


def trace_of(source: PinnedRepo, row: dict[str, Any], cache: pathlib.Path | None) -> tuple:
    """``row``'s kernel's trn1 trace and the simulator's counters (from ``cache`` when there)."""
    cached = cache / (pathlib.PurePath(row["kernel"]).stem + ".pkl") if cache else None
    if cached is not None and cached.is_file():
        return pickle.loads(cached.read_bytes())
    kernel, placeholders = kernel_of(source, row)  # installs neuronxcc
    import neuronxcc.nki as nki  # type: ignore[import-not-found]

    trace, seconds = calibrate.trn1_trace(kernel, placeholders, warmup=1, iters=1)
    found = (trace, dict(nki.last_counters()), seconds)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_bytes(pickle.dumps(found))
    return found


def rows_at(
    found: list[tuple[dict, tuple]], buffer_ns: float, efficiency: float, band: bool = False
) -> list[dict]:
    """Each kernel's estimate at the given DMA constants beside its profile (``band``: with
    :attr:`Estimate.band_us`)."""
    rows = []
    for row, (trace, counters, seconds) in found:
        profile = row["profile"]
        result = cost_model.estimate(
            trace, 2, dma_buffer_ns=buffer_ns, dma_efficiency=efficiency, band=band
        )
        latency_ms = result.latency_us / 1000.0
        active = {
            engine: profile[f"{engine}_engine_active_time_percent"] * profile["latency"]
            for engine in ("scalar", "vector", "gpsimd")
        }
        rows.append({
            "problem": row["problem"],
            "family": FAMILIES[row["problem"]],
            "kernel": row["kernel"],
            "device": "trn1",
            "method": METHOD,
            "source": SOURCE,
            "published_ms": profile["latency"],
            "estimate_ms": round(latency_ms, 4),
            "error": round(latency_ms / profile["latency"] - 1.0, 4),
            "bound": result.bound,
            "band_ms": [round(b / 1000.0, 4) for b in result.band_us or (0.0, 0.0)],
            # simulator: what the source issues; model: after hoisting loop-invariant loads
            "hbm_read_bytes": {"profiler": profile["hbm_read_bytes"],
                               "profiler_without_spills": profile["hbm_read_bytes"]
                               - profile["spill_reload_bytes"],
                               "simulator": int(counters.get("hbm_to_sbuf_bytes", 0)),
                               "model": result.hbm_read_bytes},
            "hbm_write_bytes": {"profiler": profile["hbm_write_bytes"],
                                "simulator": int(counters.get("sbuf_to_hbm_bytes", 0)),
                                "model": result.hbm_write_bytes},
            "spill_bytes": {"profiler": profile["spill_save_bytes"]
                            + profile["spill_reload_bytes"], "model": result.spill_bytes},
            "engine_busy_ms": {
                engine: {"profiler": round(active[engine], 4),
                         "estimate": round(result.busy_share[engine] * latency_ms, 4)}
                for engine in active
            },
            "simulate_s": round(seconds, 1),
        })  # fmt: skip
    return rows


def cases_of(found: list[tuple[dict, tuple]]) -> list[dict[str, Any]]:
    """NKIBench's kernels as calibration cases: family, figure (ms), trace, compiler."""
    return [
        {"problem": row["problem"], "family": FAMILIES[row["problem"]],
         "published_ms": row["profile"]["latency"], "trace": trace, "release": "current"}
        for row, (trace, _, _) in found
    ]  # fmt: skip


def tutorial_cases(traces: pathlib.Path) -> list[dict[str, Any]]:
    """The SDK 2.20 tutorial figures calibrate.py estimates (its absolute rows), from the
    traces its ``--traces DIR`` kept: another compiler release, fitted with its own DMA rate."""
    cases = []
    for index, figure in enumerate(calibrate.FIGURES):
        cached = traces / f"{index}_{figure.kernel}.pkl"
        if figure.absolute and cached.is_file():
            trace, _ = pickle.loads(cached.read_bytes())
            cases.append({"problem": f"{figure.kernel} ({figure.family})",
                          "family": TUTORIAL_FAMILIES[figure.module],
                          "published_ms": figure.published_ms, "trace": trace,
                          "release": "sdk-2.20"})  # fmt: skip
    return cases


def estimate_ms(case: dict[str, Any], buffer_ns: float, efficiency: float) -> float:
    """``case``'s estimate (ms) with its compiler's load hoisting at the given DMA constants."""
    result = cost_model.estimate(case["trace"], 2, dma_buffer_ns=buffer_ns,
                                 dma_efficiency=efficiency, band=False,
                                 hoist_loads=case["release"] == "current")  # fmt: skip
    return result.latency_us / 1000.0


def grid(cases: list[dict[str, Any]]) -> list[dict[tuple[float, float], float]]:
    """Each case's estimate (ms) at every (DMA_BUFFER_NS, efficiency) of its release's grid,
    computed once for the fit and the cross-validation."""
    return [
        {(b, e): estimate_ms(case, b, e)
         for b, e in itertools.product(BUFFER_NS_GRID, EFFICIENCY_GRID[case["release"]])}
        for case in cases
    ]  # fmt: skip


def fit(cases: list[dict[str, Any]], table: list[dict], members: list[int]) -> dict[str, float]:
    """The shared DMA_BUFFER_NS and each compiler release's DMA efficiency minimising the
    mean |log(estimate / figure)| over the cases ``members`` (indices into ``cases``)."""

    def loss(index: int, constants: tuple[float, float]) -> float:
        return abs(math.log(table[index][constants] / cases[index]["published_ms"]))

    best: dict[str, float] = {}
    best_loss = math.inf
    for buffer_ns in BUFFER_NS_GRID:
        fitted: dict[str, float] = {"dma_buffer_ns": buffer_ns}
        total = 0.0
        for release, efficiencies in EFFICIENCY_GRID.items():
            mine = [i for i in members if cases[i]["release"] == release]
            if not mine:
                fitted[release] = SHIPPED_EFFICIENCY[release]
                continue
            fitted[release] = min(
                efficiencies, key=lambda e: sum(loss(i, (buffer_ns, e)) for i in mine)
            )
            total += sum(loss(i, (buffer_ns, fitted[release])) for i in mine)
        if total < best_loss:
            best, best_loss = fitted, total
    return best


def errors_at(
    cases: list[dict[str, Any]], table: list[dict], constants: dict[str, float], members: list[int]
) -> dict[str, list[float]]:
    """Each family's errors (estimate / figure - 1) over ``members`` at ``constants``."""
    errors: dict[str, list[float]] = {}
    for i in members:
        release = cases[i]["release"]
        estimate = table[i].get((constants["dma_buffer_ns"], constants[release]))
        if estimate is None:  # a shipped constant off the grid
            estimate = estimate_ms(cases[i], constants["dma_buffer_ns"], constants[release])
        error = round(estimate / cases[i]["published_ms"] - 1.0, 4)
        errors.setdefault(cases[i]["family"], []).append(error)
    return errors


def summary(errors: dict[str, list[float]]) -> dict[str, Any]:
    every = [abs(e) for family in errors.values() for e in family]
    return {
        "median_abs_error": round(statistics.median(every), 4),
        "max_abs_error": round(max(every), 4),
        "by_family": {f: round(statistics.median(abs(e) for e in v), 4) for f, v in errors.items()},
    }


def cross_validate(cases: list[dict[str, Any]], table: list[dict]) -> dict[str, Any]:
    """Leave one family out: fit the shared constants on the others, estimate it."""
    errors: dict[str, list[float]] = {}
    constants = {}
    for family in dict.fromkeys(case["family"] for case in cases):
        held = [i for i, case in enumerate(cases) if case["family"] == family]
        fitted = fit(cases, table, [i for i, case in enumerate(cases) if case["family"] != family])
        constants[family] = fitted
        errors |= errors_at(cases, table, fitted, held)
    return {**summary(errors), "constants_fitted_without": constants}


START, END = "<!-- nkibench.py: start -->", "<!-- nkibench.py: end -->"


def render(record: dict[str, Any]) -> str:
    """The README section: the table and the generalisation figures, from ``record``."""
    current, fitted, held = (
        record["current_constants"],
        record["fitted_constants"],
        record["leave_one_family_out"],
    )

    def constants(c: dict[str, Any]) -> str:
        return (f"`DMA_BUFFER_NS` {c['dma_buffer_ns']}, `DMA_EFFICIENCY` {c['current']}, "
                f"`DMA_EFFICIENCY_SDK_2_20` {c['sdk-2.20']}")  # fmt: skip

    lines = [
        START,
        f"Generated by `{record['command']}` from {record['source']} ({METHOD}) and, as a "
        "second compiler release, the SDK 2.20 tutorial figures of calibrate.py (loads not "
        f"hoisted); the estimates at the shipped constants ({constants(current)}).",
        "",
    ]
    if record.get("not_simulated"):
        lines += [
            "Not simulated in this run (`--cached-only`: their traces were not ready): "
            + ", ".join(f"`{pathlib.PurePath(k).stem}`" for k in record["not_simulated"])
            + ".",
            "",
        ]
    lines += [
        "| kernel | family | profiler ms | estimate ms (band) | error | HBM reads / profiler's "
        "without spills: source, model (hoisted) | spill MB (stored and reloaded) est / "
        "profiler | VectorE busy ms est / profiler "
        "| ScalarE busy ms est / profiler |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in record["rows"]:
        reads = r["hbm_read_bytes"]
        busy = r["engine_busy_ms"]
        lines.append(
            f"| {r['problem']} | {r['family']} | {r['published_ms']:.3f} | "
            f"{r['estimate_ms']:.3f} ({r['band_ms'][0]:.2f}-{r['band_ms'][1]:.2f}) | "
            f"{r['error']:+.0%} | {reads['simulator'] / reads['profiler_without_spills']:.2f}, "
            f"{reads['model'] / reads['profiler_without_spills']:.2f} | "
            f"{r['spill_bytes']['model'] / 1e6:.0f} / {r['spill_bytes']['profiler'] / 1e6:.0f} | "
            f"{busy['vector']['estimate']:.2f} / "
            f"{busy['vector']['profiler']:.2f} | {busy['scalar']['estimate']:.2f} / "
            f"{busy['scalar']['profiler']:.2f} |"
        )

    for r in record.get("tutorial_rows", []):
        lines.append(f"| {r['problem']} | {r['family']} | {r['published_ms']:.3f} | "
                     f"{r['estimate_ms']:.3f} | {r['error']:+.0%} | | | | |")  # fmt: skip

    def by_family(summary: dict[str, Any]) -> str:
        return ", ".join(f"{f} {e:.0%}" for f, e in summary["by_family"].items())

    lines += [
        "",
        r"| median \|error\| (all rows of both releases) | all | worst | by family (median) |",
        "|---|---:|---:|---|",
        f"| shipped constants, in-sample | {current['median_abs_error']:.0%} | "
        f"{current['max_abs_error']:.0%} | {by_family(current)} |",
        f"| refitted on all rows ({constants(fitted)}), in-sample | "
        f"{fitted['median_abs_error']:.0%} | {fitted['max_abs_error']:.0%} | "
        f"{by_family(fitted)} |",
        f"| leave one family out (refitted without it, then estimated) | "
        f"{held['median_abs_error']:.0%} | {held['max_abs_error']:.0%} | {by_family(held)} |",
        END,
    ]
    return "\n".join(lines)


def keep_trace(cached: pathlib.Path | None, found: tuple[Any, ...], name: str) -> None:
    """Reports a fresh trace's simulation time (``found`` ends with its seconds) and keeps
    ``found`` in ``cached`` for the next run."""
    print(f"{name}: {found[-1]:.0f} s", file=sys.stderr, flush=True)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_bytes(pickle.dumps(found))


def write_section(section: str, readme: pathlib.Path) -> None:
    """Replaces the part of ``readme`` between ``section``'s first and last lines (its
    start and end markers) with ``section``, or appends it when ``readme`` has none."""
    lines = section.splitlines()
    start, end = lines[0], lines[-1]
    text = readme.read_text()
    if start not in text:
        readme.write_text(text.rstrip("\n") + "\n\n" + section + "\n")
        return
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    readme.write_text(head + section + tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("accelopt", type=pathlib.Path)
    parser.add_argument("--traces", type=pathlib.Path)
    parser.add_argument("--out", default=str(HERE / "nkibench.json"))
    parser.add_argument("--readme", action="store_true", help="rewrite README.md's section")
    parser.add_argument(
        "--cached-only", action="store_true", help="only the kernels with a trace in --traces"
    )
    parser.add_argument(
        "--tutorials", type=pathlib.Path, help="calibrate.py's --traces DIR: add its figures"
    )
    args = parser.parse_args()
    if args.cached_only and args.traces is None:
        parser.error("--cached-only needs --traces DIR")
    source = PinnedRepo(args.accelopt, COMMIT)
    found = []
    # the quickest first (simulating takes roughly as long as the device did, times ~1e5)
    skipped = []
    for row in sorted(profiles(source), key=lambda r: r["profile"]["latency"]):
        if (
            args.cached_only
            and not (args.traces / (pathlib.PurePath(row["kernel"]).stem + ".pkl")).is_file()
        ):
            skipped.append(row["kernel"])
            continue
        found.append((row, trace_of(source, row, args.traces)))
        print(f"{row['kernel']}: {found[-1][1][2]:.0f} s", file=sys.stderr, flush=True)
    current = rows_at(found, cost_model.DMA_BUFFER_NS, cost_model.DMA_EFFICIENCY, band=True)
    cases = cases_of(found) + (tutorial_cases(args.tutorials) if args.tutorials else [])
    table = grid(cases)
    every = list(range(len(cases)))
    shipped = {"dma_buffer_ns": cost_model.DMA_BUFFER_NS, **SHIPPED_EFFICIENCY}
    fitted = fit(cases, table, every)
    tutorial_rows = [
        {"problem": case["problem"], "family": case["family"], "release": "Neuron SDK 2.20",
         "published_ms": case["published_ms"],
         "estimate_ms": round(estimate_ms(case, shipped["dma_buffer_ns"], shipped["sdk-2.20"]), 4),
         "error": errors_at(cases, table, shipped, [i])[case["family"]][0]}
        for i, case in enumerate(cases) if case["release"] == "sdk-2.20"
    ]  # fmt: skip
    record = {
        "command": "PYTHONPATH=. python benchmarks/nki_estimate/nkibench.py ACCELOPT"
        + (" --traces DIR" if args.traces else "")
        + (" --cached-only" if args.cached_only else "")
        + (" --tutorials CALIBRATE_TRACES" if args.tutorials else ""),
        "source": SOURCE,
        "not_simulated": skipped,
        "current_constants": {**shipped, **summary(errors_at(cases, table, shipped, every))},
        "fitted_constants": {**fitted, **summary(errors_at(cases, table, fitted, every))},
        "leave_one_family_out": cross_validate(cases, table),
        "rows": current,
        "tutorial_rows": tutorial_rows,
    }  # fmt: skip
    pathlib.Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    if args.readme:
        write_section(render(record), HERE / "README.md")
    print(json.dumps({k: v for k, v in record.items() if not k.startswith("rows")}, indent=1))


if __name__ == "__main__":
    main()
