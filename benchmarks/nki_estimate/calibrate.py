"""Calibrates the NKI cost model on published device latencies and records the table.

    PYTHONPATH=. python benchmarks/nki_estimate/calibrate.py [--out FILE]

Runs AWS's matrix multiplication tutorial kernels (aws-neuron-sdk@72825d5, stored verbatim
under tests/data/vendor/) through ``nki.benchmark`` on ``nt.tensor`` placeholders of the
tutorial's shapes (trace-only mode), estimates each on trn1, fits the one shared constant
``DMA_BUFFER_NS`` (per-kernel constants are never fitted) and writes calibration.json:
figure against estimate, the median |error| and whether the rank order agrees.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import sys
import time
import warnings

from asickernels.simulate.nki import estimate as cost_model
from asickernels.simulate.nki import runtime
from asickernels.simulate.nki.install import install

HERE = pathlib.Path(__file__).resolve().parent
TUTORIAL = (
    HERE.parents[1]
    / "tests/data/vendor/aws-neuron-sdk@72825d5/general/nki/examples/matrix_multiplication"
)
# general/nki/tutorials/matrix_multiplication.rst@72825d5 ("Performance" table): P99 of
# nki.benchmark on trn1, Neuron SDK 2.20, [4096, 8192] @ [8192, 8192] bf16.
PUBLISHED_MS = {
    "nki_matmul_tiled_": 51.80,
    "nki_matmul_hoist_load_": 42.96,
    "nki_matmul_block_free_dimension_": 22.07,
    "nki_matmul_fully_optimized_": 6.97,
}
SOURCE = "aws-neuron-sdk@72825d5 general/nki/tutorials/matrix_multiplication.rst"
SHAPES = {"lhsT": (8192, 4096), "rhs": (8192, 8192), "result": (4096, 8192)}
BUFFER_NS_GRID = [float(ns) for ns in range(0, 401, 5)]


def traces(shapes: dict[str, tuple[int, int]]) -> dict[str, tuple[list, float]]:
    """Each tutorial kernel's trn1 trace and the seconds its benchmark call took."""
    install()
    sys.path.insert(0, str(TUTORIAL))
    import matrix_multiplication_nki_kernels as tutorial  # type: ignore[import-not-found]
    import neuronxcc.nki as nki  # type: ignore[import-not-found]
    import neuronxcc.nki.language as nl  # type: ignore[import-not-found]
    import neuronxcc.nki.typing as nt  # type: ignore[import-not-found]

    found = {}
    for name in PUBLISHED_MS:
        placeholders = [nt.tensor[list(shapes[k]), nl.bfloat16] for k in shapes]
        started = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nki.benchmark(warmup=5, iters=10)(getattr(tutorial, name))(*placeholders)
        ((version, trace),) = runtime.last_traces()
        assert version == 2, "the tutorial's figures are trn1 (NeuronCore-v2)"
        found[name] = (trace, time.perf_counter() - started)
    return found


def table(found: dict[str, tuple[list, float]], buffer_ns: float) -> dict:
    rows = []
    for name, (trace, seconds) in found.items():
        result = cost_model.estimate(trace, 2, dma_buffer_ns=buffer_ns)
        estimate_ms = result.latency_us / 1000.0
        rows.append({
            "kernel": name,
            "device": "trn1",
            "method": "P99 of nki.benchmark",
            "release": "Neuron SDK 2.20",
            "source": SOURCE,
            "published_ms": PUBLISHED_MS[name],
            "estimate_ms": round(estimate_ms, 4),
            "error": round(estimate_ms / PUBLISHED_MS[name] - 1.0, 4),
            "bound": result.bound,
            "busy_share": {k: round(v, 3) for k, v in result.busy_share.items()},
            "instructions": result.instructions,
            "simulate_and_estimate_s": round(seconds, 1),
        })  # fmt: skip
    published = sorted(rows, key=lambda r: r["published_ms"])
    estimated = sorted(rows, key=lambda r: r["estimate_ms"])
    return {
        "dma_buffer_ns": buffer_ns,
        "rows": rows,
        "median_abs_error": round(statistics.median(abs(r["error"]) for r in rows), 4),
        "rank_order_agrees": [r["kernel"] for r in published] == [r["kernel"] for r in estimated],
    }


def fit(found: dict[str, tuple[list, float]]) -> float:
    """The shared DMA_BUFFER_NS minimising the median |log(estimate / figure)|."""

    def loss(buffer_ns: float) -> float:
        rows = table(found, buffer_ns)["rows"]
        return statistics.median(abs(math.log(1 + r["error"])) for r in rows)

    return min(BUFFER_NS_GRID, key=loss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "calibration.json"))
    args = parser.parse_args()
    found = traces(SHAPES)
    fitted = fit(found)
    record = {
        "command": "PYTHONPATH=. python benchmarks/nki_estimate/calibrate.py",
        "fitted_dma_buffer_ns": fitted,
        "model_dma_buffer_ns": cost_model.DMA_BUFFER_NS,
        "with_model_constant": table(found, cost_model.DMA_BUFFER_NS),
        "with_fitted_constant": table(found, fitted),
    }
    pathlib.Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    for row in record["with_model_constant"]["rows"]:
        print(f"{row['kernel']:36s} published {row['published_ms']:7.2f} ms  estimate "
              f"{row['estimate_ms']:8.2f} ms  ({row['error']:+.1%}, {row['bound']}, "
              f"{row['simulate_and_estimate_s']} s)")  # fmt: skip
    print(json.dumps({k: v for k, v in record.items() if not k.startswith("with")}))


if __name__ == "__main__":
    main()
