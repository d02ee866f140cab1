"""DETR's matching step, timed per batch: ``asickernels.linear_sum_assignment`` (one call
for the padded batch, targets masked) against what DETR runs, SciPy's
``linear_sum_assignment`` image by image on the host, on the CPU, interleaved in one
process (each repetition runs every implementation once, in turn).

Cost matrices are DETR's matching cost (:func:`asickernels.matcher.matching_cost`, weights
1/5/2) of random outputs (100 queries, 92 classes) and targets, float32; image ``b`` of a
batch has a random number of targets in ``[1, T]``, padded to ``T``. Every result is
checked against SciPy's before timing. With ``--compile`` the Pallas kernel is also compiled
for v5e, v6e and v5p at batch 64 x 100 x 100 (libtpu; no TPU runtime is measured here).

    python benchmarks/linear_sum_assignment/bench.py --json benchmarks/linear_sum_assignment/results.json --compile
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from scipy.optimize import linear_sum_assignment as scipy_lsa

import asickernels
from asickernels import matcher
from asickernels.benchmarking import timing
from asickernels.kernels.linear_sum_assignment import assert_agrees

QUERIES, CLASSES = 100, 92
SIZES = [(batch, targets) for targets in (20, 100) for batch in (2, 8, 64)]


def detr_inputs(batch: int, targets: int, seed: int) -> tuple[np.ndarray, ...]:
    """DETR's outputs and padded targets: logits ``[batch, 100, 92]``, boxes
    ``[batch, 100, 4]``, target labels ``[batch, targets]`` int32, target boxes
    ``[batch, targets, 4]`` and the target mask ``[batch, targets]`` (image ``b`` has a random
    number of targets in ``[1, targets]``)."""
    rng = np.random.default_rng(seed)

    def boxes(*shape: int) -> np.ndarray:
        centre = rng.uniform(0.1, 0.9, (*shape, 2))
        return np.concatenate([centre, rng.uniform(0.02, 0.5, (*shape, 2))], -1).astype(np.float32)

    counts = rng.integers(1, targets + 1, batch)
    mask = np.arange(targets)[None, :] < counts[:, None]
    return (
        rng.normal(size=(batch, QUERIES, CLASSES)).astype(np.float32),
        boxes(batch, QUERIES),
        rng.integers(0, CLASSES - 1, (batch, targets)).astype(np.int32),
        boxes(batch, targets),
        mask,
    )


def problem(batch: int, targets: int, seed: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """DETR matching costs ``[batch, 100, targets]`` float32, the target mask, the counts."""
    *outputs_and_targets, mask = detr_inputs(batch, targets, seed)
    cost = matcher.matching_cost(
        *outputs_and_targets, cost_class=1.0, cost_bbox=5.0, cost_giou=2.0, backend="xla"
    )
    return np.asarray(cost), mask, [int(c) for c in mask.sum(1)]


def implementations(
    cost: np.ndarray, mask: np.ndarray, counts: list[int]
) -> dict[str, Callable[[], Any]]:
    device_cost, device_mask = jax.device_put(cost), jax.device_put(mask)

    def scipy_per_image() -> Any:  # DETR's models/matcher.py
        return [scipy_lsa(cost[b][:, : counts[b]]) for b in range(len(counts))]

    def ours(backend: str, on_device: bool) -> Callable[[], Any]:
        c, m = (device_cost, device_mask) if on_device else (cost, mask)
        return lambda: jax.block_until_ready(
            asickernels.linear_sum_assignment(c, col_mask=m, backend=backend)
        )

    return {
        "scipy (per image, host)": scipy_per_image,
        "cpu (numpy in)": ours("cpu", False),
        "cpu (jax array in)": ours("cpu", True),
        "xla (jax array in)": ours("xla", True),
    }


def measure(repeats: int) -> list[dict[str, Any]]:
    rows = []
    for batch, targets in SIZES:
        cost, mask, counts = problem(batch, targets, seed=batch * 1000 + targets)
        runs = implementations(cost, mask, counts)
        for name, run in runs.items():  # warm up (compiles) and check
            out = run()
            if not name.startswith("scipy"):
                assert_agrees(cost, out, col_mask=mask, dtype=np.float32)
        times = timing.round_robin(runs, repeats)
        peer = statistics.median(times["scipy (per image, host)"])
        for name, samples in times.items():
            median = statistics.median(samples)
            rows.append(
                {
                    "batch": batch,
                    "queries": QUERIES,
                    "targets": targets,
                    "mean_targets": float(np.mean(counts)),
                    "implementation": name,
                    "median_ms": 1e3 * median,
                    "min_ms": 1e3 * min(samples),
                    "speedup_vs_scipy": peer / median,
                    "repeats": repeats,
                }
            )
            print(
                f"B={batch:3d} Q={QUERIES} T<={targets:3d}  {name:26s} "
                f"{1e3 * median:9.3f} ms  (x{peer / median:.2f} vs SciPy)",
                flush=True,
            )
    return rows


def compile_for_tpu() -> list[dict[str, Any]]:
    from asickernels.estimates import compile_gate
    from asickernels.simulate import tpu_compile

    def build() -> tpu_compile.Built:
        def function(cost: jax.Array, col_mask: jax.Array) -> Any:
            return asickernels.linear_sum_assignment(cost, col_mask=col_mask, backend="pallas_tpu")

        return function, [((64, QUERIES, 100), "float32"), ((64, 100), "bool")]

    target = compile_gate.KernelShape("linear_sum_assignment", "64x100x100", build)
    results = compile_gate.compile_all(compile_gate.GATE_GENERATIONS, targets=[target])
    print(compile_gate.format_table(results))
    return [r.as_dict() for r in results]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--compile", action="store_true", help="also compile for TPUs")
    args = parser.parse_args()
    document: dict[str, Any] = {
        "command": "python benchmarks/linear_sum_assignment/bench.py " + " ".join(sys.argv[1:]),
        "machine": {
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "jax": jax.__version__,
            "cpu_backend": asickernels.available_backends()["cpu"].detail,
        },
        "rows": measure(args.repeats),
    }
    if args.compile:
        document["tpu_compile"] = compile_for_tpu()
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
