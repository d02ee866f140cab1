"""The NKI cost model (asickernels.simulate.nki.estimate) over the simulator's trace, and
``nki.benchmark`` reporting its estimate."""

from __future__ import annotations

import json
import math
import sys
import warnings

import numpy as np
import pytest
from conftest import DATA, REPO

from asickernels.simulate import nki
from asickernels.simulate.nki import estimate as cost_model
from asickernels.simulate.nki import isa as nisa
from asickernels.simulate.nki import language as nl
from asickernels.simulate.nki import runtime
from asickernels.simulate.nki import typing as nt
from asickernels.simulate.nki.benchmarking import NoDeviceTimeWarning
from asickernels.simulate.nki.install import install
from asickernels.simulate.nki.trace import Access, Instruction

TUTORIAL = DATA / "vendor/aws-neuron-sdk@72825d5/general/nki/examples/matrix_multiplication"
KERNELS = (
    "nki_matmul_tiled_",
    "nki_matmul_hoist_load_",
    "nki_matmul_block_free_dimension_",
    "nki_matmul_fully_optimized_",
)


def tile(key, shape, dtype="bfloat16", memory="sbuf", low=0, high=None, runs=1):
    itemsize = 4 if dtype == "float32" else 2
    size = math.prod(shape)
    high = size - 1 if high is None else high
    return Access(memory, shape[0], key, low, high, shape, dtype, itemsize, runs)


def op(engine, api, reads=(), writes=()):
    return Instruction(engine, api, tuple(reads), tuple(writes))


# -- per-instruction costs ---------------------------------------------------------------
def test_matmul_costs_max_of_64_and_moving_free_size_and_4x_for_fp32():
    """trainium_inferentia2_arch.rst@72825d5: max(N, MM_INIT_LATENCY=64) TensorE cycles at
    2.8 GHz on NeuronCore-v2, roughly 4x for fp32 inputs."""

    def matmul_ns(n, dtype="bfloat16"):
        reads = (tile(1, (128, 128), dtype), tile(2, (128, n), dtype))
        trace = [op("tensor", "matmul", reads, (tile(3, (128, n), "float32", "psum"),))]
        return cost_model.estimate(trace, 2).latency_us * 1000

    assert matmul_ns(512) == pytest.approx(512 / 2.8)
    assert matmul_ns(16) == pytest.approx(64 / 2.8)  # the initiation interval's floor
    assert matmul_ns(512, "float32") == pytest.approx(4 * matmul_ns(512))


def test_vector_costs_n_per_input_tile_plus_access_overhead():
    """One input tile ~N VectorE cycles, two ~2N (the arch guide), plus the ~60-cycle
    SBUF access overhead, at 1.12 GHz (v2); NeuronCore-v3's VectorE takes 4 bf16 per cycle."""
    one = op("vector", "copy", (tile(1, (128, 1024)),), (tile(2, (128, 1024)),))
    two = op("vector", "add", (tile(1, (128, 1024)), tile(3, (128, 1024))), (tile(2, (128, 1024)),))
    assert cost_model.estimate([one], 2).latency_us * 1000 == pytest.approx((60 + 1024) / 1.12)
    assert cost_model.estimate([two], 2).latency_us * 1000 == pytest.approx((60 + 2048) / 1.12)
    assert cost_model.estimate([one], 3).latency_us * 1000 == pytest.approx((60 + 256) / 0.96)


def test_dependent_instructions_wait_and_independent_engines_overlap():
    load = op("dma", "load", (tile(10, (128, 512), memory="hbm"),), (tile(1, (128, 512)),))
    scale = op("scalar", "activation", (tile(1, (128, 512)),), (tile(2, (128, 512)),))
    other = op("vector", "copy", (tile(5, (128, 512)),), (tile(6, (128, 512)),))
    alone = {name: cost_model.estimate([x], 2).latency_us for name, x in
             (("load", load), ("scale", scale), ("other", other))}  # fmt: skip
    chained = cost_model.estimate([load, scale], 2).latency_us
    assert chained == pytest.approx(alone["load"] + alone["scale"])
    parallel = cost_model.estimate([load, other], 2).latency_us
    assert parallel == pytest.approx(max(alone["load"], alone["other"]))


def test_reading_a_disjoint_part_of_a_tile_does_not_wait_for_the_other_part():
    first = op(
        "dma",
        "load",
        (tile(10, (128, 512), memory="hbm"),),
        (tile(1, (128, 512), low=0, high=999),),
    )
    read_other = op(
        "vector", "copy", (tile(1, (128, 512), low=1000, high=1999),), (tile(2, (128, 512)),)
    )
    read_same = op(
        "vector", "copy", (tile(1, (128, 512), low=500, high=1500),), (tile(2, (128, 512)),)
    )
    load_us = cost_model.estimate([first], 2).latency_us
    assert cost_model.estimate([first, read_other], 2).latency_us == pytest.approx(load_us)
    assert cost_model.estimate([first, read_same], 2).latency_us > load_us


def test_dma_small_contiguous_pieces_cost_more_than_large_ones():
    """The DMA bandwidth guide: < 256 B per partition is overhead-bound; >= 2-4 KiB per
    partition approaches the 16 engines' peak."""
    nbytes = 128 * 4096
    few = op("dma", "load", (tile(10, (128, 2048), memory="hbm"),), (tile(1, (128, 2048)),))
    many = op(
        "dma", "load", (tile(10, (128, 2048), memory="hbm", runs=32),), (tile(1, (128, 2048)),)
    )
    fast = cost_model.estimate([few], 2).latency_us - cost_model.DMA_LATENCY_NS / 1000
    assert nbytes / (fast * 1000) <= 16 * 17.0  # never above the 16 engines' peak
    assert cost_model.estimate([many], 2).latency_us > 2 * cost_model.estimate([few], 2).latency_us


def test_assign_and_zeroing_psum_cost_nothing_but_keep_dependencies():
    load = op("dma", "load", (tile(10, (128, 512), memory="hbm"),), (tile(1, (128, 512)),))
    assign = op("vector", "assign", (tile(1, (128, 512)),), (tile(2, (128, 512)),))
    use = op("scalar", "activation", (tile(2, (128, 512)),), (tile(3, (128, 512)),))
    zero_psum = op("vector", "full", (), (tile(4, (128, 512), "float32", "psum"),))
    zero_sbuf = op("vector", "full", (), (tile(5, (128, 512)),))
    direct = op("scalar", "activation", (tile(1, (128, 512)),), (tile(3, (128, 512)),))
    chained = cost_model.estimate([load, assign, use], 2).latency_us
    assert chained == pytest.approx(cost_model.estimate([load, direct], 2).latency_us)
    assert cost_model.estimate([zero_psum], 2).latency_us == 0
    assert cost_model.estimate([zero_sbuf], 2).latency_us > 0


def test_unknown_generation_is_a_clear_error():
    with pytest.raises(ValueError, match="NeuronCore-v9"):
        cost_model.estimate([], 9)


def test_chrome_trace_has_one_lane_per_engine_and_one_event_per_instruction(tmp_path):
    load = op("dma", "load", (tile(10, (128, 512), memory="hbm"),), (tile(1, (128, 512)),))
    scale = op("scalar", "activation", (tile(1, (128, 512)),), (tile(2, (128, 512)),))
    result = cost_model.estimate([load, scale], 2, timeline=True)
    path = tmp_path / "timeline.json"
    result.write_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert [e["name"] for e in spans] == ["load", "activation"]
    assert spans[1]["ts"] >= spans[0]["ts"] + spans[0]["dur"]  # the dependency
    assert {e["args"]["name"] for e in events if e["ph"] == "M"} >= {"TensorE", "DMA/HBM"}


# -- nki.benchmark ---------------------------------------------------------------------------
def _scaled_add(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=nl.multiply(nl.load(a), 2.0))
    return out


def test_benchmark_reports_an_estimate_marked_as_such_and_the_bound_engine():
    bench = nki.benchmark(warmup=1, iters=2)(_scaled_add)
    x = np.ones((128, 2048), np.float32)
    with pytest.warns(
        NoDeviceTimeWarning,
        match="no device time was measured; latencies are a cost-model estimate",
    ):
        np.testing.assert_array_equal(bench(x), 2 * x)
    result = bench.benchmark_result
    assert result.device_time_measured is False and "estimate" in result.note
    assert result.nc_latency.estimated and not result.nc_latency.measured
    p99 = result.nc_latency.get_latency_percentile(99)
    assert p99 == result.estimate.latency_us > 0
    assert result.estimate.bound in {"DMA/HBM", "VectorE", "ScalarE", "GpSimdE", "TensorE"}
    assert max(result.estimate.busy_share.values()) <= 1.0 + 1e-9
    assert result.estimate.instructions == 3  # load, multiply, dma_copy


def test_benchmark_result_writes_its_timeline_as_a_chrome_trace(tmp_path):
    bench = nki.benchmark(_scaled_add)
    with pytest.warns(NoDeviceTimeWarning):
        bench(nt.tensor[[128, 512], nl.float32])
    path = tmp_path / "timeline.json"
    bench.benchmark_result.write_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in spans] == ["load", "multiply", "dma_copy"]
    assert trace["otherData"]["estimate"] is True
    end = max(e["ts"] + e["dur"] for e in spans)
    assert end == pytest.approx(bench.benchmark_result.estimate.latency_us)


def test_placeholder_inputs_trace_only_and_estimate_as_arrays_do():
    bench = nki.benchmark(_scaled_add)
    with pytest.warns(NoDeviceTimeWarning):
        bench(np.zeros((128, 4096), np.float32))
    from_values = bench.benchmark_result.estimate.latency_us
    with pytest.warns(NoDeviceTimeWarning):
        bench(nt.tensor[[128, 4096], nl.float32])
    assert bench.benchmark_result.estimate.latency_us == pytest.approx(from_values)


def test_benchmark_estimates_for_the_simulated_target(monkeypatch):
    """NEURON_PLATFORM_TARGET_OVERRIDE picks the generation whose clocks and bandwidths
    price the trace; a DMA-heavy kernel is faster on trn3's faster DMA engines."""
    latency = {}
    for target in ("trn1", "trn3"):
        monkeypatch.setenv(runtime.TARGET_ENV, target)
        bench = nki.benchmark(_scaled_add)
        with pytest.warns(NoDeviceTimeWarning):
            bench(nt.tensor[[128, 8192], nl.float32])
        assert target in bench.benchmark_result.estimate.generation
        latency[target] = bench.benchmark_result.estimate.latency_us
    assert latency["trn3"] < latency["trn1"]


def _legacy_tutorial():
    install()
    if str(TUTORIAL) not in sys.path:
        sys.path.insert(0, str(TUTORIAL))
    import matrix_multiplication_nki_kernels as tutorial  # type: ignore[import-not-found]
    import neuronxcc.nki as legacy_nki  # type: ignore[import-not-found]
    import neuronxcc.nki.language as legacy_nl  # type: ignore[import-not-found]
    import neuronxcc.nki.typing as legacy_nt  # type: ignore[import-not-found]

    return tutorial, legacy_nki, legacy_nl, legacy_nt


# Recorded estimates (us, trn1) of the tutorial's kernels at K=1024, M=2048, N=1024: a
# change to the model or the trace that moves one fails here; re-record deliberately.
RECORDED_US = {
    "nki_matmul_tiled_": 562.6025882352995,
    "nki_matmul_hoist_load_": 455.0223529411804,
    "nki_matmul_block_free_dimension_": 321.9814117647072,
    "nki_matmul_fully_optimized_": 81.48178151260555,
}


@pytest.mark.parametrize("name", KERNELS)
def test_tutorial_estimates_stay_at_their_recorded_values(name):
    tutorial, legacy_nki, legacy_nl, legacy_nt = _legacy_tutorial()
    shapes = ([1024, 2048], [1024, 1024], [2048, 1024])
    placeholders = [legacy_nt.tensor[s, legacy_nl.bfloat16] for s in shapes]
    bench = legacy_nki.benchmark(warmup=5, iters=10)(getattr(tutorial, name))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoDeviceTimeWarning)
        bench(*placeholders)
    got = bench.benchmark_result.nc_latency.get_latency_percentile(99)
    assert got == pytest.approx(RECORDED_US[name], rel=1e-6)


def test_tutorial_kernel_computes_the_product_with_array_inputs():
    """Array inputs still compute values (only placeholders skip them)."""
    tutorial, legacy_nki, _, _ = _legacy_tutorial()
    rng = np.random.default_rng(0)
    lhs_t = rng.standard_normal((256, 128)).astype(np.float32)
    rhs = rng.standard_normal((256, 512)).astype(np.float32)
    out = np.zeros((128, 512), np.float32)
    bench = legacy_nki.benchmark(warmup=1, iters=1)(tutorial.nki_matmul_tiled_)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoDeviceTimeWarning)
        bench(lhs_t, rhs, out)
    np.testing.assert_allclose(out, lhs_t.T @ rhs, rtol=1e-4, atol=1e-3)
    assert bench.benchmark_result.estimate.latency_us > 0
    assert runtime.last_traces()[0][0] == 2  # the legacy API's default target: trn1


@pytest.mark.slow
def test_sdk_tutorial_main_prints_four_estimated_latencies():
    """``python -m asickernels.simulate.nki`` runs the 2.20 tutorial file unchanged: its
    ``__main__`` benchmarks [4096, 8192] @ [8192, 8192] bf16 placeholders four times."""
    import subprocess

    script = TUTORIAL / "matrix_multiplication_nki_kernels.py"
    done = subprocess.run(
        [sys.executable, "-m", "asickernels.simulate.nki", str(script)],
        capture_output=True,
        text=True,
        timeout=3600,
        check=True,
    )
    latencies = [
        float(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("Latency:")
    ]
    assert len(latencies) == 4 and all(ms > 0 for ms in latencies), done.stdout
    assert latencies[3] < latencies[2] < latencies[1] < latencies[0]  # the tutorial's order
    assert "cost-model estimate" in done.stderr


def test_legacy_isa_adapters_trace_the_kernels_tiles():
    """Legacy ``nisa`` calls that run through the current API's implementation are traced
    with the kernel's own tiles, so they depend on the load that wrote their input."""
    _, legacy_nki, legacy_nl, legacy_nt = _legacy_tutorial()
    import neuronxcc.nki.isa as legacy_nisa  # type: ignore[import-not-found]

    def kernel(x, out):
        tile = legacy_nl.load(x)
        summed = legacy_nisa.tensor_tensor(tile, tile, op=legacy_nl.add)
        legacy_nl.store(out, summed)

    bench = legacy_nki.benchmark(kernel)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoDeviceTimeWarning)
        bench(
            legacy_nt.tensor[[128, 512], legacy_nl.float32],
            legacy_nt.tensor[[128, 512], legacy_nl.float32],
        )
    ((_, trace),) = runtime.last_traces()
    load, add, store = trace
    assert (load.api, add.api, store.api) == ("load", "tensor_tensor", "store")
    assert add.reads[0].key == load.writes[0].key and store.reads[0].key == add.writes[0].key


def test_recorded_calibration_matches_the_models_constants():
    """benchmarks/nki_estimate/calibration.json was recorded with the model's DMA constant;
    re-run the script when a constant changes."""
    path = REPO / "benchmarks/nki_estimate/calibration.json"
    record = json.loads(path.read_text())
    assert record["model"]["dma_buffer_ns"] == cost_model.DMA_BUFFER_NS
    rows = [r for r in record["model"]["rows"] if r["absolute"]]
    errors = sorted(abs(r["estimate_ms"] / r["published_ms"] - 1) for r in rows)
    assert record["model"]["median_abs_error"] == pytest.approx(errors[len(errors) // 2], abs=1e-3)
