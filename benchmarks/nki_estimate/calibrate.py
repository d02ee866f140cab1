"""Calibrates the NKI cost model on published device latencies and records the table.

    PYTHONPATH=. python benchmarks/nki_estimate/calibrate.py [--out FILE]

Runs AWS's tutorial kernels (aws-neuron-sdk@72825d5, stored verbatim under
tests/data/vendor/) through ``nki.benchmark`` on ``nt.tensor`` placeholders of the published
shapes (trace-only mode), estimates each on trn1 (NeuronCore-v2), fits the one shared
constant ``DMA_BUFFER_NS`` (per-kernel constants are never fitted) and writes
calibration.json: figure against estimate, the median |error|, and whether the estimates
order each family's successive optimisation steps as the figures do.
"""

from __future__ import annotations

import argparse
import dataclasses
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
EXAMPLES = HERE.parents[1] / "tests/data/vendor/aws-neuron-sdk@72825d5/general/nki/examples"
DOCS = "aws-neuron-sdk@72825d5 general/nki/tutorials/"
BUFFER_NS_GRID = [float(ns) for ns in range(0, 401, 5)]


@dataclasses.dataclass(frozen=True)
class Figure:
    """One published device latency and how to reproduce its kernel call."""

    family: str  # rank order is judged within a family (same workload, successive steps)
    module: str
    kernel: str
    shapes: tuple[tuple[int, ...], ...]
    dtype: str
    published_ms: float
    method: str
    source: str


MATMUL = ((8192, 4096), (8192, 8192), (4096, 8192))  # lhsT, rhs, result


def mamba(seq_len: int, channels: int) -> tuple[tuple[int, ...], ...]:
    batch, state = 1, 16  # delta, u, A, B, C, output
    return ((batch, channels, seq_len),) * 2 + ((channels, state),) + (
        (batch, state, seq_len),) * 2 + ((batch, channels, seq_len),)  # fmt: skip


MM_DOC = DOCS + "matrix_multiplication.rst (Performance table; Trn1.32xlarge, Neuron SDK 2.20)"
MAMBA_DOC = DOCS + "fused_mamba.rst (neuron-profile device execution time; Neuron SDK 2.20)"
FIGURES = (
    Figure("matmul 4096x8192x8192 bf16", "matrix_multiplication_nki_kernels",
           "nki_matmul_tiled_", MATMUL, "bfloat16", 51.80, "P99 of nki.benchmark", MM_DOC),
    Figure("matmul 4096x8192x8192 bf16", "matrix_multiplication_nki_kernels",
           "nki_matmul_hoist_load_", MATMUL, "bfloat16", 42.96, "P99 of nki.benchmark", MM_DOC),
    Figure("matmul 4096x8192x8192 bf16", "matrix_multiplication_nki_kernels",
           "nki_matmul_block_free_dimension_", MATMUL, "bfloat16", 22.07,
           "P99 of nki.benchmark", MM_DOC),
    Figure("matmul 4096x8192x8192 bf16", "matrix_multiplication_nki_kernels",
           "nki_matmul_fully_optimized_", MATMUL, "bfloat16", 6.97, "P99 of nki.benchmark",
           MM_DOC),
    Figure("mamba seq 512, 256 channels", "mamba_nki_kernels", "mamba_v1", mamba(512, 256),
           "float32", 0.17293, "profile", MAMBA_DOC),
    Figure("mamba seq 512, 4096 channels", "mamba_nki_kernels", "mamba_v1", mamba(512, 4096),
           "float32", 2.34, "profile", MAMBA_DOC),
    Figure("mamba seq 512, 4096 channels", "mamba_nki_kernels", "mamba_v2", mamba(512, 4096),
           "float32", 1.61, "profile", MAMBA_DOC),
    Figure("mamba seq 2048, 4096 channels", "mamba_nki_kernels", "mamba_v2", mamba(2048, 4096),
           "float32", 8.9, "profile (seq_len sweep table)", MAMBA_DOC),
    Figure("mamba seq 2048, 4096 channels", "mamba_nki_kernels", "mamba_v3", mamba(2048, 4096),
           "float32", 6.6, "profile (seq_len sweep table)", MAMBA_DOC),
)  # fmt: skip


def traces() -> list[tuple[Figure, list, float]]:
    """Each figure's trn1 trace and the seconds its benchmark call took."""
    install()
    for folder in ("matrix_multiplication", "fused_mamba"):
        sys.path.insert(0, str(EXAMPLES / folder))
    import neuronxcc.nki as nki  # type: ignore[import-not-found]
    import neuronxcc.nki.language as nl  # type: ignore[import-not-found]
    import neuronxcc.nki.typing as nt  # type: ignore[import-not-found]

    found = []
    for figure in FIGURES:
        kernel = getattr(__import__(figure.module), figure.kernel)
        dtype = getattr(nl, figure.dtype)
        placeholders = [nt.tensor[list(shape), dtype] for shape in figure.shapes]
        started = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nki.benchmark(warmup=5, iters=10)(kernel)(*placeholders)
        ((version, trace),) = runtime.last_traces()
        assert version == 2, "the published figures are trn1 (NeuronCore-v2)"
        found.append((figure, trace, time.perf_counter() - started))
        print(f"{figure.kernel} {figure.family}: {time.perf_counter() - started:.1f} s",
              file=sys.stderr, flush=True)  # fmt: skip
    return found


def table(found: list[tuple[Figure, list, float]], buffer_ns: float) -> dict:
    rows = []
    for figure, trace, seconds in found:
        result = cost_model.estimate(trace, 2, dma_buffer_ns=buffer_ns)
        estimate_ms = result.latency_us / 1000.0
        rows.append({
            "family": figure.family,
            "kernel": figure.kernel,
            "device": "trn1",
            "method": figure.method,
            "source": figure.source,
            "published_ms": figure.published_ms,
            "estimate_ms": round(estimate_ms, 4),
            "error": round(estimate_ms / figure.published_ms - 1.0, 4),
            "bound": result.bound,
            "busy_share": {k: round(v, 3) for k, v in result.busy_share.items()},
            "instructions": result.instructions,
            "simulate_and_estimate_s": round(seconds, 1),
        })  # fmt: skip
    families = {}
    for family in dict.fromkeys(r["family"] for r in rows):
        members = [r for r in rows if r["family"] == family]
        if len(members) > 1:
            by_figure = [r["kernel"] for r in sorted(members, key=lambda r: r["published_ms"])]
            by_estimate = [r["kernel"] for r in sorted(members, key=lambda r: r["estimate_ms"])]
            families[family] = by_figure == by_estimate
    return {
        "dma_buffer_ns": buffer_ns,
        "rows": rows,
        "median_abs_error": round(statistics.median(abs(r["error"]) for r in rows), 4),
        "rank_order_agrees": families,
    }


def fit(found: list[tuple[Figure, list, float]]) -> float:
    """The shared DMA_BUFFER_NS minimising the median |log(estimate / figure)|."""

    def loss(buffer_ns: float) -> float:
        rows = table(found, buffer_ns)["rows"]
        return statistics.median(abs(math.log(1 + r["error"])) for r in rows)

    return min(BUFFER_NS_GRID, key=loss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "calibration.json"))
    args = parser.parse_args()
    found = traces()
    record = {
        "command": "PYTHONPATH=. python benchmarks/nki_estimate/calibrate.py",
        "fitted_dma_buffer_ns": fit(found),
        "model": table(found, cost_model.DMA_BUFFER_NS),
    }
    pathlib.Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print("| kernel | workload | published ms | estimate ms | error | bound |")
    print("|---|---|---:|---:|---:|---|")
    for row in record["model"]["rows"]:
        print(f"| {row['kernel']} | {row['family']} | {row['published_ms']} | "
              f"{row['estimate_ms']:.3f} | {row['error']:+.1%} | {row['bound']} |")  # fmt: skip
    model = record["model"]
    print(f"median |error| {model['median_abs_error']:.1%}; rank order {model['rank_order_agrees']}; "
          f"DMA_BUFFER_NS {model['dma_buffer_ns']} (best fit {record['fitted_dma_buffer_ns']})")  # fmt: skip


if __name__ == "__main__":
    main()
