"""The GpSimd host shim: it must catch every device rule a kernel breaks (as a Python
exception, never a crash), and the real kernels must pass it on awkward shapes.

Faulty kernels are small C++ ops written here against the same device API as the real ones;
each breaks one rule, among them the seed article's GIOU defects (an offset mixing units, a
TCM buffer never freed, a batch assumed divisible by 8).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import re

import numpy as np
import pytest

import asickernels
from asickernels import reference
from asickernels.backends import gpsimd
from asickernels.backends.gpsimd import _library
from asickernels.kernels import registry
from asickernels.simulate import gpsimd as shim

pytestmark = pytest.mark.skipif(shim.compiler() is None, reason="no C++ compiler for the shim")

# Every op copies x [rows, cols] float32 to the output, one row per TCM round trip.
FAULTY_KERNELS = r"""
#include <stdint.h>
#include <algorithm>
#include <neuron/neuron-utils.hpp>
#include <torch/torch.h>
#include "asickernels_shim/runner.hpp"
#include "torchneuron/register.h"

namespace {
void copy_rows(const torch::Tensor& x, torch::Tensor& out, size_t begin, size_t end) {
  const size_t cols = x.sizes()[1];
  float* row = static_cast<float*>(torch::neuron::tcm_malloc(sizeof(float) * cols));
  auto in = x.tcm_accessor();
  auto result = out.tcm_accessor();
  for (size_t r = begin; r < end; ++r) {
    in.tensor_to_tcm<float>(row, r * cols, cols);
    result.tcm_to_tensor<float>(row, r * cols, cols);
  }
  torch::neuron::tcm_free(row);
}

// Rows [begin, end) of this core when the rows are split as evenly as possible.
size_t split(size_t rows, size_t core) {
  const size_t cores = get_cpu_count();
  return core * (rows / cores) + std::min(core, rows % cores);
}
}  // namespace

torch::Tensor correct(const torch::Tensor& x) {
  torch::Tensor out = get_dst_tensor();
  const size_t rows = x.sizes()[0], core = get_cpu_id();
  copy_rows(x, out, split(rows, core), split(rows, core + 1));
  return out;
}

torch::Tensor overlapping(const torch::Tensor& x) {
  torch::Tensor out = get_dst_tensor();
  const size_t rows = x.sizes()[0], core = get_cpu_id();
  copy_rows(x, out, split(rows, core) - (core == 1 ? 1 : 0), split(rows, core + 1));
  return out;
}

torch::Tensor assumes_divisible(const torch::Tensor& x) {
  torch::Tensor out = get_dst_tensor();
  const size_t partition = x.sizes()[0] / get_cpu_count();
  copy_rows(x, out, partition * get_cpu_id(), partition * (get_cpu_id() + 1));
  return out;
}

// The seed's offset: partition * cpu_id + i * row_size adds rows to elements.
torch::Tensor seed_offset(const torch::Tensor& x) {
  torch::Tensor out = get_dst_tensor();
  const size_t cols = x.sizes()[1];
  const size_t partition = x.sizes()[0] / get_cpu_count();
  float* row = static_cast<float*>(torch::neuron::tcm_malloc(sizeof(float) * cols));
  auto in = x.tcm_accessor();
  auto result = out.tcm_accessor();
  for (size_t i = 0; i < partition; ++i) {
    in.tensor_to_tcm<float>(row, partition * get_cpu_id() + i * cols, cols);
    result.tcm_to_tensor<float>(row, partition * get_cpu_id() + i * cols, cols);
  }
  torch::neuron::tcm_free(row);
  return out;
}

torch::Tensor tcm_hog(const torch::Tensor& x) {
  torch::Tensor out = get_dst_tensor();
  void* first = torch::neuron::tcm_malloc(10 * 1024);
  void* second = torch::neuron::tcm_malloc(10 * 1024);
  torch::neuron::tcm_free(second);
  torch::neuron::tcm_free(first);
  return correct(x);
}

torch::Tensor tcm_leak(const torch::Tensor& x) {
  torch::neuron::tcm_malloc(64);
  return correct(x);
}

// One tensor_to_tcm<T> of `count` elements at `offset` into a TCM buffer of `capacity`.
template <typename T>
torch::Tensor one_read(const torch::Tensor& x, size_t capacity, size_t offset, size_t count) {
  torch::Tensor out = get_dst_tensor();
  T* buffer = static_cast<T*>(torch::neuron::tcm_malloc(sizeof(T) * capacity));
  x.tcm_accessor().tensor_to_tcm<T>(buffer, offset, count);
  torch::neuron::tcm_free(buffer);
  return out;
}

torch::Tensor tcm_overrun(const torch::Tensor& x) { return one_read<float>(x, 1, 0, 2); }

torch::Tensor out_of_bounds(const torch::Tensor& x) { return one_read<float>(x, 1, x.numel(), 1); }

torch::Tensor wrong_dtype(const torch::Tensor& x) { return one_read<int32_t>(x, 1, 0, 1); }

torch::Tensor writes_input(const torch::Tensor& x) {
  torch::Tensor alias = x;
  torch::Tensor out = get_dst_tensor();
  float* value = static_cast<float*>(torch::neuron::tcm_malloc(sizeof(float)));
  alias.tcm_accessor().tcm_to_tensor<float>(value, 0, 1);
  torch::neuron::tcm_free(value);
  return out;
}

torch::Tensor no_dst(const torch::Tensor& x) { return torch::zeros(x.sizes(), torch::kFloat); }

torch::Tensor misregistered(const torch::Tensor& x) { return correct(x); }

torch::Tensor same_shape(const torch::Tensor& x) { return torch::zeros(x.sizes(), torch::kFloat); }

torch::Tensor one_row_shape(const torch::Tensor& x) {
  return torch::zeros({1, x.sizes()[1]}, torch::kFloat);
}

NEURON_LIBRARY(faulty, m) {
  m.def("correct", &same_shape, "correct");
  m.def("overlapping", &same_shape, "overlapping");
  m.def("assumes_divisible", &same_shape, "assumes_divisible");
  m.def("seed_offset", &same_shape, "seed_offset");
  m.def("tcm_hog", &same_shape, "tcm_hog");
  m.def("tcm_leak", &same_shape, "tcm_leak");
  m.def("tcm_overrun", &same_shape, "tcm_overrun");
  m.def("out_of_bounds", &same_shape, "out_of_bounds");
  m.def("wrong_dtype", &same_shape, "wrong_dtype");
  m.def("writes_input", &same_shape, "writes_input");
  m.def("no_dst", &same_shape, "no_dst");
  m.def("misregistered", &same_shape, "another_kernel");
  m.def("wrong_shape", &one_row_shape, "correct");
}

#define ENTRY(op, kernel)                                                                   \
  extern "C" int run_##op(const float* x, int64_t rows, int64_t cols, float* out,           \
                          char* error, size_t error_size) {                                 \
    return asickernels_shim::guarded(error, error_size, [&] {                               \
      asickernels_shim::run_op(#op, #kernel, &kernel,                                       \
                               asickernels_shim::output(out, {rows, cols}),                 \
                               asickernels_shim::input(x, {rows, cols}));                   \
    });                                                                                     \
  }
ENTRY(correct, correct)
ENTRY(overlapping, overlapping)
ENTRY(assumes_divisible, assumes_divisible)
ENTRY(seed_offset, seed_offset)
ENTRY(tcm_hog, tcm_hog)
ENTRY(tcm_leak, tcm_leak)
ENTRY(tcm_overrun, tcm_overrun)
ENTRY(out_of_bounds, out_of_bounds)
ENTRY(wrong_dtype, wrong_dtype)
ENTRY(writes_input, writes_input)
ENTRY(no_dst, no_dst)
ENTRY(misregistered, misregistered)
ENTRY(wrong_shape, correct)
ENTRY(unregistered, correct)
"""

# A read-only accessor (from a const Tensor) has no tcm_to_tensor, on the device as here.
WRITE_THROUGH_CONST = r"""
#include <torch/torch.h>
void write(const torch::Tensor& x, float* tcm) { x.tcm_accessor().tcm_to_tensor<float>(tcm, 0, 1); }
"""


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    source = tmp_path_factory.mktemp("gpsimd") / "faulty_kernels.cpp"
    source.write_text(FAULTY_KERNELS)
    return shim.load([source])


def run_faulty(library: ctypes.CDLL, op: str, x: np.ndarray) -> np.ndarray:
    out = np.full(x.shape, np.nan, np.float32)
    entry = getattr(library, f"run_{op}")
    entry.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    entry.argtypes += shim.ERROR_ARGTYPES
    shim.call(entry, x.ctypes.data, x.shape[0], x.shape[1], out.ctypes.data)
    return out


def rows_of(rows: int, cols: int = 5) -> np.ndarray:
    return np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)


@pytest.mark.parametrize("rows", [1, 7, 8, 13, 64])
def test_a_correct_kernel_passes(faulty, rows):
    x = rows_of(rows)
    np.testing.assert_array_equal(run_faulty(faulty, "correct", x), x)
    stats = shim.last_run_stats(faulty)
    assert stats["active_cores"] == min(rows, shim.CORE_COUNT)
    assert stats["bytes_to_tcm"] == stats["bytes_from_tcm"] == x.nbytes


@pytest.mark.parametrize(
    ("op", "rows", "message"),
    [
        ("overlapping", 16, r"cores 0 and 1 both wrote output elements \[5, 10\)"),
        ("seed_offset", 16, r"cores 0 and 1 both wrote output elements"),
        ("assumes_divisible", 13, r"25 of 65 output elements were written by no core .*\[40, 65\)"),
        ("tcm_hog", 8, r"tcm_malloc\(10240\) does not fit the 16384-byte TCM pool \(10240 bytes"),
        ("tcm_leak", 8, r"1 TCM buffer\(s\) \(64 pool bytes\) never passed to tcm_free"),
        ("tcm_overrun", 8, r"tensor_to_tcm: 8 bytes at offset 0 overrun the 4-byte TCM buffer"),
        ("out_of_bounds", 8, r"elements \[40, 41\) is out of bounds of a tensor of 40 elements"),
        ("wrong_dtype", 8, r"tensor_to_tcm<kInt> on a kFloat tensor"),
        ("writes_input", 8, r"tcm_to_tensor into an input tensor"),
        ("no_dst", 8, r"never called get_dst_tensor\(\)"),
        ("misregistered", 8, r"registered with kernel \"another_kernel\", not \"misregistered\""),
        ("wrong_shape", 8, r"shape function gives \[1, 5\] kFloat, the output buffer is \[8, 5\]"),
        ("unregistered", 8, r"op \"unregistered\" has no m.def"),
    ],
)
def test_the_shim_catches_a_broken_rule(faulty, op, rows, message):
    with pytest.raises(shim.ShimError, match=message):
        run_faulty(faulty, op, rows_of(rows))
    # The shim is still usable afterwards.
    np.testing.assert_array_equal(run_faulty(faulty, "correct", rows_of(9)), rows_of(9))


def test_every_core_reports_its_own_violation(faulty):
    with pytest.raises(shim.ShimError) as error:
        run_faulty(faulty, "tcm_leak", rows_of(8))
    assert [f"core {i}:" for i in range(8)] == re.findall(r"core \d:", str(error.value))


def test_tensor_shapes_beyond_the_device_limits_are_rejected(faulty):
    tall = rows_of(70000, cols=1)  # 2 dims of <= 2^32-1: allowed
    np.testing.assert_array_equal(run_faulty(faulty, "correct", tall), tall)
    boxes, out = np.zeros((1, 4), np.float32), np.zeros(1, np.float32)
    with pytest.raises(shim.ShimError, match=r"\[4294967296, 4\] exceeds the device limits"):
        # The claimed pair count is checked against the device limits before any access.
        giou_entry = _library.host_library().asickernels_gpsimd_giou
        shim.call(giou_entry, boxes, boxes, 2**32, out)


def test_writing_through_a_const_tensor_does_not_compile(tmp_path):
    source = tmp_path / "write_through_const.cpp"
    source.write_text(WRITE_THROUGH_CONST)
    with pytest.raises(shim.ShimError, match="tcm_to_tensor"):
        shim.build([source])


def test_builds_are_cached_by_content_and_safe_to_race(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    source = tmp_path / "tiny.cpp"
    source.write_text('extern "C" int tiny() { return 7; }\n')
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        paths = list(pool.map(lambda _: shim.build([source]), range(2)))
    assert paths[0] == paths[1] and paths[0].parent == tmp_path / "cache" / "asickernels"
    assert [p.name for p in paths[0].parent.iterdir()] == [paths[0].name]  # no temp files
    assert ctypes.CDLL(str(paths[0])).tiny() == 7
    source.write_text('extern "C" int tiny() { return 8; }\n')
    assert shim.cached_path([source]) != paths[0]


def test_a_sanitized_build_needs_the_asan_runtime_preloaded(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "")
    with pytest.raises(shim.ShimError, match=r"LD_PRELOAD=.*libasan"):
        shim.load([*_library.COMPUTE_SOURCES], sanitize=True)


def test_probe(monkeypatch):
    assert gpsimd.BACKEND.probe().mode == "simulated"
    monkeypatch.setattr(shim, "compiler", lambda: None)
    status = gpsimd.BACKEND.probe()
    assert status.mode == "missing" and "compiler" in status.detail and status.install_hint


def test_config_is_rejected():
    with pytest.raises(ValueError, match="no tuning config"):
        asickernels.giou(
            np.zeros((2, 4), np.float32),
            np.zeros((2, 4), np.float32),
            backend="gpsimd",
            config={"block": 8},
        )


def random_boxes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    xy = rng.uniform(-10, 10, (*shape, 2))
    return np.concatenate([xy, xy + rng.uniform(0, 10, (*shape, 2))], -1).astype(np.float32)


@pytest.mark.parametrize("pairs", [*range(1, 18), 1001])
def test_kernel_giou_any_pair_count(pairs):
    rng = np.random.default_rng(pairs)
    a, b = random_boxes(rng, (pairs,)), random_boxes(rng, (pairs,))
    got = asickernels.giou(a, b, backend="gpsimd")
    np.testing.assert_allclose(np.asarray(got), reference.giou(a, b), atol=2e-5, rtol=0)


def test_kernel_giou_rows_of_boxes_land_in_their_rows():
    """The seed kernel's offset bug shows on several rows of several boxes per core."""
    rng = np.random.default_rng(0)
    a, b = random_boxes(rng, (8 * 3, 37)), random_boxes(rng, (8 * 3, 37))
    got = asickernels.giou(a, b, backend="gpsimd")
    np.testing.assert_allclose(np.asarray(got), reference.giou(a, b), atol=2e-5, rtol=0)
    stats = registry.backend("gpsimd").counters()
    assert stats["active_cores"] == 8 and stats["tcm_peak_bytes"] <= shim.TCM_POOL_BYTES


@pytest.mark.parametrize(("batch", "max_output_size"), [(1, 3), (13, 40), (9, 2500)])
def test_kernel_nms_any_batch_and_output_size(batch, max_output_size):
    """Images are dealt to cores round-robin (13 = 8 + 5); rows longer than the 1024-int
    TCM stage are written in pieces."""
    rng = np.random.default_rng(batch)
    n = 300
    boxes = rng.integers(0, 50, (batch, n, 4)).astype(np.float32)
    boxes[..., 2:] += boxes[..., :2]
    scores = (rng.integers(0, 20, (batch, n)) / 20).astype(np.float32)
    cats = rng.integers(0, 3, (batch, n)).astype(np.int32)
    kwargs = {"iou_threshold": 0.3, "max_output_size": max_output_size}
    indices, count = asickernels.batched_nms(
        boxes, scores, cats, score_threshold=0.2, backend="gpsimd", **kwargs
    )
    want_indices, want_count = reference.nms(boxes, scores, cats, score_threshold=0.2, **kwargs)
    np.testing.assert_array_equal(np.asarray(indices), want_indices)
    np.testing.assert_array_equal(np.asarray(count), want_count)
    assert registry.backend("gpsimd").counters()["active_cores"] == min(batch, 8)


def test_kernel_nms_float64_scores_that_float32_would_tie():
    boxes = np.array([[0, 0, 2, 2], [0, 0, 2, 2], [5, 5, 6, 6], [5, 5, 6, 6]], np.float64)
    scores = np.array([0.5, 0.5 + 1e-12, 0.25 + 1e-12, 0.25], np.float64)
    for threshold in (None, 0.25 + 1e-12):
        kwargs = {"iou_threshold": 0.5, "max_output_size": 4, "score_threshold": threshold}
        indices, count = asickernels.nms(boxes, scores, backend="gpsimd", **kwargs)
        kwargs["score_threshold"] = -np.inf if threshold is None else threshold
        want_indices, want_count = reference.nms(boxes[None], scores[None], None, **kwargs)
        np.testing.assert_array_equal(np.asarray(indices), want_indices[0])
        assert int(count) == want_count[0]


def test_kernel_calls_from_several_python_threads_do_not_mix():
    """Runs share one pool of core threads; concurrent callers are served one at a time."""
    rng = np.random.default_rng(5)
    pairs = [(random_boxes(rng, (n,)), random_boxes(rng, (n,))) for n in (5, 300, 4097, 64)]

    def run(pair: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        return np.asarray(asickernels.giou(*pair, backend="gpsimd"))

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, pairs * 5))
    for (a, b), got in zip(pairs * 5, results, strict=True):
        np.testing.assert_allclose(got, reference.giou(a, b), atol=2e-5, rtol=0)
