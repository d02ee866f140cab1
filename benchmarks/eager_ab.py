"""Eager call time of two source trees' public API, interleaved in one process.

Each tree's ``asickernels`` (with its built cpu library) is imported into the same process
under its own set of modules; a round times a block of calls of each tree in turn (the order
alternating), with that tree's modules installed as ``asickernels`` while it runs, so load
drift falls on both alike. Every case is a small eager call of the public API on the
default backend (the cpu backend's native kernels here): on numpy inputs (the host path)
and on JAX arrays (JAX's dispatch of the jitted kernel). Both trees' results must agree
before anything is timed.

    python benchmarks/eager_ab.py --before /tmp/main-checkout --after . --json out.json

Prints, per case and clock (``cpu``: the process's CPU time, all threads; ``wall``), each
tree's median time per call (10-90% range over the blocks) and the median after/before ratio
of adjacent blocks.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

_PACKAGE = "asickernels"


def _package_modules() -> dict[str, ModuleType]:
    return {
        name: module
        for name, module in sys.modules.items()
        if name == _PACKAGE or name.startswith(_PACKAGE + ".")
    }


def _install(modules: dict[str, ModuleType]) -> None:
    for name in _package_modules():
        del sys.modules[name]
    sys.modules.update(modules)


def _import_tree(tree: Path) -> dict[str, ModuleType]:
    """``tree``'s asickernels imported (its cpu backend loaded), as a module set."""
    _install({})
    sys.path.insert(0, str(tree))
    try:
        package = importlib.import_module(_PACKAGE)
        if Path(package.__file__ or "").resolve().parent != (tree / _PACKAGE).resolve():
            raise SystemExit(f"{tree}: imported {package.__file__} instead")
        importlib.import_module(f"{_PACKAGE}.backends.cpu")
    finally:
        sys.path.remove(str(tree))
    return _package_modules()


def _boxes(rng: np.random.Generator, n: int) -> np.ndarray:
    corner = rng.uniform(0, 100, (n, 2))
    return np.concatenate([corner, corner + rng.uniform(1, 30, (n, 2))], -1).astype(np.float32)


def _cases(ak: Any) -> dict[str, Callable[[], Any]]:
    """The timed calls of one tree's package ``ak`` (same inputs for both trees)."""
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    cases: dict[str, Callable[[], Any]] = {}
    statics = {"iou_threshold": 0.5, "max_output_size": 16}
    for n in (32, 256):
        boxes, scores = _boxes(rng, n), rng.random(n).astype(np.float32)
        on_device = jnp.asarray(boxes), jnp.asarray(scores)
        cases[f"nms N={n} numpy"] = lambda b=boxes, s=scores: ak.nms(b, s, **statics)
        cases[f"nms N={n} jax"] = lambda d=on_device: ak.nms(*d, **statics)
    for n, m in ((8, 8), (300, 100)):
        boxes1, boxes2 = _boxes(rng, n), _boxes(rng, m)
        on_device = jnp.asarray(boxes1), jnp.asarray(boxes2)
        cases[f"box_iou {n}x{m} numpy"] = lambda a=boxes1, b=boxes2: ak.box_iou(a, b)
        cases[f"box_iou {n}x{m} jax"] = lambda d=on_device: ak.box_iou(*d)
    return cases


def _outputs(result: Any) -> list[np.ndarray]:
    return [np.asarray(a) for a in (result if isinstance(result, (tuple, list)) else (result,))]


def _block(call: Callable[[], Any], calls: int) -> tuple[float, float]:
    """Seconds per call over ``calls`` calls (results made ready): wall time and the
    process's CPU time (all its threads; what other processes' load disturbs least)."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        result = call()
    for array in result if isinstance(result, (tuple, list)) else (result,):
        getattr(array, "block_until_ready", lambda: None)()
    return (time.perf_counter() - wall) / calls, (time.process_time() - cpu) / calls


def _quantile(values: list[float], q: float) -> float:
    return sorted(values)[round(q * (len(values) - 1))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="a source tree, built")
    parser.add_argument("--after", type=Path, required=True, help="a source tree, built")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--calls", type=int, default=100, help="calls per timed block")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    modules = {name: _import_tree(tree) for name, tree in trees.items()}
    cases = {}
    for name, mods in modules.items():
        _install(mods)
        cases[name] = _cases(mods[_PACKAGE])
    for case in cases["before"]:  # same results, and everything compiled and warm
        got = {}
        for name in trees:
            _install(modules[name])
            got[name] = _outputs(cases[name][case]())
            for _ in range(3 * args.calls):
                cases[name][case]()
        for b, a in zip(got["before"], got["after"], strict=True):
            np.testing.assert_array_equal(a, b, err_msg=case)

    clocks = ("cpu", "wall")
    times: dict[tuple[str, str], dict[str, list[float]]] = {
        (c, clock): {n: [] for n in trees} for c in cases["before"] for clock in clocks
    }
    for round_ in range(args.rounds):
        order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
        for case in cases["before"]:
            for name in order:
                _install(modules[name])
                wall, cpu = _block(cases[name][case], args.calls)
                times[case, "wall"][name].append(wall)
                times[case, "cpu"][name].append(cpu)

    rows = []
    for (case, clock), by_tree in sorted(times.items(), key=lambda item: item[0][1]):
        ratios = [a / b for b, a in zip(by_tree["before"], by_tree["after"], strict=True)]
        row: dict[str, Any] = {"case": case, "clock": clock}
        for name, values in (*by_tree.items(), ("after/before", ratios)):
            row[name] = {
                "median": statistics.median(values),
                "p10": _quantile(values, 0.1),
                "p90": _quantile(values, 0.9),
            }
        rows.append(row)
    print(
        f"{'':4} {'case':26} {'before µs (p10-p90)':>24} {'after µs (p10-p90)':>24} {'after/before':>20}"
    )
    for row in rows:
        cells = [
            f"{row[n]['median'] * 1e6:8.2f} ({row[n]['p10'] * 1e6:.1f}-{row[n]['p90'] * 1e6:.1f})"
            for n in trees
        ]
        r = row["after/before"]
        ratio = f"{r['median']:.3f} ({r['p10']:.2f}-{r['p90']:.2f})"
        print(f"{row['clock']:4} {row['case']:26} {cells[0]:>24} {cells[1]:>24} {ratio:>20}")
    if args.json:
        document = {
            "command": "python " + shlex.join(sys.argv),
            "recorded": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
            "python": platform.python_version(),
            "load_average": os.getloadavg(),
            "trees": {name: str(tree) for name, tree in trees.items()},
            "rounds": args.rounds,
            "calls_per_block": args.calls,
            "rows": rows,
        }
        Path(args.json).write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
