"""How long ``nki.benchmark`` takes here in trace-only mode: per kernel, its instructions,
the seconds simulating it (the trace) and estimating it (estimate.py), and whether both grow
linearly with the instructions (the same kernel at two sizes: the time per instruction).

    PYTHONPATH=. python benchmarks/nki_estimate/speed.py [--accelopt DIR] [--problems P ...]

The kernels: calibrate.py's SDK 2.20 tutorial figures (tests/fetch_vendor.py's files), the
tiled matmul tutorial again at half its contraction (half the instructions), and with
``--accelopt`` (nkibench.py's ACCELOPT) the NKIBench problems ``--problems`` names (by
default the three slowest to simulate). Each runs once through ``nki.benchmark`` on
placeholders; the estimate it makes is timed again alone on its trace, and simulating is
the call's time less that. Seconds are wall-clock and this process's CPU time: the machine
is shared, so the CPU seconds are the ones to compare between runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

from asickernels.simulate.nki import estimate as cost_model
from asickernels.simulate.nki import runtime

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import calibrate  # noqa: E402  (the tutorial figures and their kernels)
import nkibench  # noqa: E402  (NKIBench's kernels)

SLOWEST = ["gqa_full", "matmul", "lora"]


def _seconds(call: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = call()
    return result, {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}


def timed(name: str, kernel: Any, placeholders: list[Any]) -> dict[str, Any]:
    """One trace-only ``nki.benchmark`` call of ``kernel``: its instructions, and the
    seconds simulating and estimating took."""
    import neuronxcc.nki as nki  # type: ignore[import-not-found]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, call = _seconds(lambda: nki.benchmark(warmup=1, iters=1)(kernel)(*placeholders))
    ((version, trace),) = runtime.last_traces()
    _, estimating = _seconds(lambda: cost_model.estimate(trace, version))
    simulating = {clock: call[clock] - estimating[clock] for clock in call}
    row = {
        "kernel": name,
        "instructions": len(trace),
        "simulate_s": {clock: round(s, 2) for clock, s in simulating.items()},
        "estimate_s": {clock: round(s, 2) for clock, s in estimating.items()},
        "benchmark_call_s": {clock: round(s, 2) for clock, s in call.items()},
    }
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def tutorial_figures() -> list[tuple[str, calibrate.Figure]]:
    """calibrate.py's figures, and the tiled matmul at half the contraction (K 4096)."""
    figures = [(f"{f.kernel} ({f.family})", f) for f in calibrate.FIGURES]
    tiled = next(f for f in calibrate.FIGURES if f.kernel == "nki_matmul_tiled_")
    half = ((4096, 4096), (4096, 8192), (4096, 8192))  # lhsT [K, M], rhs [K, N], result
    name = f"{tiled.kernel} (matmul 4096x8192, K 4096)"
    figures.append((name, dataclasses.replace(tiled, args=half)))
    return figures


def linear_growth(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each kernel run at two or more sizes: CPU microseconds per instruction, simulating
    and estimating, at its fewest and most instructions (equal when time is linear)."""
    by_kernel: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_kernel.setdefault(row["kernel"].split(" ")[0], []).append(row)
    checks = []
    for kernel, runs in by_kernel.items():
        small = min(runs, key=lambda r: r["instructions"])
        large = max(runs, key=lambda r: r["instructions"])
        if large["instructions"] < 2 * small["instructions"]:
            continue  # sizes that do not change the instruction count test nothing

        def per_instruction(row: dict[str, Any], phase: str) -> float:
            return round(row[phase]["cpu"] / row["instructions"] * 1e6, 1)

        checks.append({
            "kernel": kernel,
            "instructions": [small["instructions"], large["instructions"]],
            **{f"{phase}_cpu_us_per_instruction": [per_instruction(small, phase),
                                                   per_instruction(large, phase)]
               for phase in ("simulate_s", "estimate_s")},
        })  # fmt: skip
    return checks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelopt", type=pathlib.Path, help="nkibench.py's ACCELOPT")
    parser.add_argument("--problems", nargs="*", default=SLOWEST, help="NKIBench problems")
    parser.add_argument("--out", default=str(HERE / "speed.json"))
    args = parser.parse_args()
    load = os.getloadavg()[0]
    rows = [timed(name, *calibrate.kernel_of(figure)) for name, figure in tutorial_figures()]
    if args.accelopt is not None:
        source = nkibench.PinnedRepo(args.accelopt, nkibench.COMMIT)
        for row in nkibench.profiles(source):
            if row["problem"] in args.problems:
                name = f"{row['problem']} ({pathlib.PurePath(row['kernel']).stem})"
                rows.append(timed(name, *nkibench.kernel_of(source, row)))
    record = {
        "command": "PYTHONPATH=. python benchmarks/nki_estimate/speed.py"
        + (" --accelopt ACCELOPT --problems " + " ".join(args.problems) if args.accelopt else ""),
        "load_average_at_start": round(load, 1),
        "cpus": os.cpu_count(),
        "rows": rows,
        "linear_growth": linear_growth(rows),
    }
    pathlib.Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record["linear_growth"], indent=1))


if __name__ == "__main__":
    main()
