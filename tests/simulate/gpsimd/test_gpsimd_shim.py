"""The GpSimd host shim: it must catch every device rule a kernel breaks (as a Python
exception, never a crash), and the real kernels must pass it on awkward shapes.

Faulty kernels are small C++ ops written here against the same device API as the real ones;
each breaks one rule, among them the seed article's GIOU defects (an offset mixing units, a
TCM buffer never freed, a batch assumed divisible by 8).
"""

from __future__ import annotations

import concurrent.futures
import re

import numpy as np
import pytest

import asickernels
from asickernels.backends import gpsimd
from asickernels.backends.gpsimd import _library
from asickernels.backends.gpsimd import nms as gpsimd_nms
from asickernels.kernels import registry
from asickernels.kernels.giou import reference_giou
from asickernels.kernels.nms import greedy_nms
from asickernels.simulate import gpsimd as shim

pytestmark = pytest.mark.skipif(shim.compiler() is None, reason="no C++ compiler for the shim")

# Every kernel copies x [rows, cols] float32 to the output, one row per TCM round trip; each
# faulty one breaks one device rule. They run in multicore mode (all 8 cores).
FAULTY_KERNELS = r"""
#include <stdint.h>
#include <stdio.h>
#include <algorithm>
#include <neuron/neuron-utils.hpp>
#include <torch/torch.h>

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

torch::Tensor tcm_leak(const torch::Tensor& x) {
  torch::neuron::tcm_malloc(64);
  return correct(x);
}

// One tensor_to_tcm<T> of `count` elements at `offset` into a TCM buffer of `capacity`.
template <typename T>
torch::Tensor one_read(const torch::Tensor& x, size_t capacity, size_t offset, size_t count) {
  T* buffer = static_cast<T*>(torch::neuron::tcm_malloc(sizeof(T) * capacity));
  x.tcm_accessor().tensor_to_tcm<T>(buffer, offset, count);
  torch::neuron::tcm_free(buffer);
  return correct(x);
}

torch::Tensor tcm_overrun(const torch::Tensor& x) { return one_read<float>(x, 1, 0, 2); }

torch::Tensor out_of_bounds(const torch::Tensor& x) { return one_read<float>(x, 1, x.numel(), 1); }

torch::Tensor wrong_dtype(const torch::Tensor& x) { return one_read<int32_t>(x, 1, 0, 1); }

torch::Tensor writes_input(torch::Tensor x) {
  float* value = static_cast<float*>(torch::neuron::tcm_malloc(sizeof(float)));
  x.tcm_accessor().tcm_to_tensor<float>(value, 0, 1);
  torch::neuron::tcm_free(value);
  return correct(x);
}

torch::Tensor no_dst(const torch::Tensor& x) { return torch::zeros(x.sizes(), torch::kFloat); }

torch::Tensor standard_accessor(const torch::Tensor& x) {
  auto values = x.accessor<float, 2>();
  (void)values;
  return correct(x);
}

torch::Tensor prints_everywhere(const torch::Tensor& x) {
  printf("core %u of %u\n", get_cpu_id(), get_cpu_count());
  return correct(x);
}

torch::Tensor asserts(const torch::Tensor& x) {
  assert(x.dim() == 3);
  return correct(x);
}

// The pool is 16 KB: the second allocation fails and the kernel copes with it.
torch::Tensor checks_tcm_malloc(const torch::Tensor& x) {
  void* first = torch::neuron::tcm_malloc(10 * 1024);
  void* second = torch::neuron::tcm_malloc(10 * 1024);
  torch::neuron::tcm_free(second);
  torch::neuron::tcm_free(first);
  return second == nullptr ? correct(x) : torch::Tensor();
}

// Ignores a failed tcm_malloc and writes through the null pointer.
torch::Tensor unchecked_tcm_malloc(const torch::Tensor& x) {
  void* hog = torch::neuron::tcm_malloc(16 * 1024);
  float* buffer = static_cast<float*>(torch::neuron::tcm_malloc(64));
  buffer[get_cpu_id()] = 1.0f;
  torch::neuron::tcm_free(hog);
  return correct(x);
}

torch::Tensor divides_by_zero(const torch::Tensor& x) {
  volatile int zero = 0;
  volatile int quotient = static_cast<int>(x.numel()) / zero;
  (void)quotient;
  return correct(x);
}

torch::Tensor long_tensor(const torch::Tensor& x) {
  torch::Tensor scratch = torch::zeros({2}, torch::kLong);
  (void)scratch;
  return correct(x);
}
"""

SAME_SHAPE = """
torch::Tensor same_shape(torch::Tensor x) { return torch::zeros(x.sizes(), torch::kFloat); }
"""
SHAPE_PREAMBLE = '#include <torch/torch.h>\n#include "torchneuron/register.h"\n'

# Libraries hold at most 10 ops, so the faulty ones are split in two.
FAULTY_OPS = (
    ("correct", "overlapping", "assumes_divisible", "tcm_leak", "tcm_overrun", "out_of_bounds",
     "wrong_dtype", "writes_input", "no_dst", "standard_accessor"),
    ("prints_everywhere", "asserts", "checks_tcm_malloc", "long_tensor", "unchecked_tcm_malloc",
     "divides_by_zero"),
)  # fmt: skip


def shape_source(library: str, ops: tuple[str, ...]) -> str:
    """The shape file of a library whose ``ops`` each run the kernel of the same name and
    return a float32 tensor shaped as their first input."""
    definitions = "".join(f'  m.def("{op}", &same_shape, "{op}");\n' for op in ops)
    return f"{SHAPE_PREAMBLE}{SAME_SHAPE}NEURON_LIBRARY({library}, m) {{\n{definitions}}}\n"


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> dict[str, shim.CustomOp]:
    directory = tmp_path_factory.mktemp("gpsimd")
    compute = directory / "faulty_kernels.cpp"
    compute.write_text(FAULTY_KERNELS)
    ops: dict[str, shim.CustomOp] = {}
    for index, names in enumerate(FAULTY_OPS):
        shape = directory / f"faulty_shape_{index}.cpp"
        shape.write_text(shape_source(f"faulty{index}", names))
        library = shim.load(f"faulty{index}", [compute], [shape], multicore=True)
        ops.update(library.ops)
    return ops


def rows_of(rows: int, cols: int = 5) -> np.ndarray:
    return np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)


@pytest.mark.parametrize("rows", [1, 7, 8, 13, 64])
def test_a_correct_kernel_passes(faulty, rows):
    x = rows_of(rows)
    np.testing.assert_array_equal(faulty["correct"](x), x)
    stats = faulty["correct"].library.stats()
    assert stats["active_cores"] == min(rows, shim.CORE_COUNT)
    assert stats["bytes_to_tcm"] == stats["bytes_from_tcm"] == x.nbytes


@pytest.mark.parametrize(
    ("op", "rows", "message"),
    [
        ("overlapping", 16, r"cores 0 and 1 both wrote output elements \[5, 10\)"),
        ("assumes_divisible", 13, r"25 of 65 output elements were written by no core: \[40, 65\)"),
        ("tcm_leak", 8, r"1 TCM buffer\(s\) \(64 bytes\) never passed to tcm_free"),
        ("tcm_overrun", 8, r"tensor_to_tcm: 8 bytes at offset 0 overrun the 4-byte TCM buffer"),
        ("out_of_bounds", 8, r"elements \[40, 41\) is out of bounds of a tensor of 40 elements"),
        ("wrong_dtype", 8, r"tensor_to_tcm<kInt> on a kFloat tensor"),
        ("writes_input", 8, r"tcm_to_tensor into an input tensor"),
        ("no_dst", 8, r"never called get_dst_tensor\(\)"),
        ("standard_accessor", 8, r"a standard tensor accessor in multicore mode"),
        ("prints_everywhere", 8, r"core 3: called printf 1 time\(s\): printf is only supported"),
        ("asserts", 8, r"assertion failed: x.dim\(\) == 3"),
        ("long_tensor", 8, r"kLong \(64-bit\) tensors are not supported"),
        (
            "unchecked_tcm_malloc",
            8,
            r"core 7: the kernel faulted: SIGSEGV accessing address "
            r"0x1c \(a null pointer: a tcm_malloc that returned nullptr\?\)",
        ),
        ("divides_by_zero", 8, r"core 0: the kernel faulted: SIGFPE"),
    ],
)
def test_the_shim_catches_a_broken_rule(faulty, op, rows, message):
    with pytest.raises(shim.ShimError, match=message):
        faulty[op](rows_of(rows))
    # The shim is still usable afterwards.
    np.testing.assert_array_equal(faulty["correct"](rows_of(9)), rows_of(9))


def test_every_core_reports_its_own_violation(faulty):
    with pytest.raises(shim.ShimError) as error:
        faulty["tcm_leak"](rows_of(8))
    assert [f"core {i}:" for i in range(8)] == re.findall(r"core \d:", str(error.value))


def test_printf_on_core_0_is_kept_and_a_failed_tcm_malloc_returns_null(faulty):
    with pytest.raises(shim.ShimError) as error:
        faulty["prints_everywhere"](rows_of(8))
    assert len(re.findall(r"called printf", str(error.value))) == 7  # cores 1..7
    assert faulty["prints_everywhere"].library.last_stdout == "core 0 of 8\n"
    x = rows_of(8)
    np.testing.assert_array_equal(faulty["checks_tcm_malloc"](x), x)
    assert faulty["checks_tcm_malloc"].library.stats()["failed_tcm_mallocs"] == 8


def test_library_rules_are_all_reported_at_load(tmp_path):
    compute = tmp_path / "kernels.cpp"
    compute.write_text(
        "#include <torch/torch.h>\n"
        "torch::Tensor takes_long(const torch::Tensor& x, int64_t n) { return x; }\n"
        "torch::Tensor two_tensors(const torch::Tensor& x, const torch::Tensor& y) { return x; }\n"
        "torch::Tensor nothing() { return torch::zeros({1}, torch::kFloat); }\n"
    )
    shape = tmp_path / "shape.cpp"
    shape.write_text(
        SHAPE_PREAMBLE
        + "torch::Tensor s_long(torch::Tensor x, int64_t n) { return x; }\n"
        + "torch::Tensor s_one(torch::Tensor x) { return x; }\n"
        + "torch::Tensor s_none() { return torch::zeros({1}, torch::kFloat); }\n"
        + "NEURON_LIBRARY(lib_a, m) {\n"
        + '  m.def("takes_long", &s_long, "takes_long");\n'
        + '  m.def("mismatch", &s_one, "two_tensors");\n'
        + '  m.def("nothing", &s_none, "nothing");\n'
        + '  m.def("missing", &s_one, "not_defined_anywhere");\n'
        + "}\n"
        + "NEURON_LIBRARY(lib_b, m) {\n"
        + "".join(f'  m.def("extra{i}", &s_one, "two_tensors");\n' for i in range(7))
        + "}\n"
    )
    with pytest.raises(shim.ShimError) as error:
        shim.load("bad", [compute], [shape])
    message = str(error.value)
    for expected in [
        r"several NEURON_LIBRARY names \(lib_a, lib_b\): each model can only have one",
        r"11 functions registered: a CustomOp library can have 10",
        r'op "takes_long" shape function: parameter 2 has type long; .* double',
        r"kernel takes_long\(torch::Tensor const&, long\): parameter 2 has type long",
        r'op "mismatch": kernel two_tensors\(torch::Tensor const&, torch::Tensor const&\) does '
        r"not take the arguments of its shape function \(torch::Tensor\)",
        r'op "nothing" has no inputs',
        r'op "missing": no kernel function "not_defined_anywhere"',
    ]:
        assert re.search(expected, message), (expected, message)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "builtin"}, "reserved keyword"),
        ({"extra_cflags": ["-DSTACK_SIZE=500000"]}, "maximum supported stack size is 400KB"),
    ],
)
def test_load_refuses_documented_limits(tmp_path, kwargs, message):
    source = tmp_path / "empty.cpp"
    source.write_text("")
    with pytest.raises(ValueError, match=message):
        shim.load(**{"name": "ok", "compute_srcs": [source], "shape_srcs": [source], **kwargs})


def test_tensor_shapes_beyond_the_device_limits_are_rejected(faulty):
    tall = rows_of(70000, cols=1)  # 2 dims of <= 2^32-1: allowed
    np.testing.assert_array_equal(faulty["correct"](tall), tall)
    five_dims = np.zeros((70000, 1, 1, 1, 1), np.float32)
    with pytest.raises(shim.ShimError, match=r"\[70000, 1, 1, 1, 1\] exceeds the device limits"):
        faulty["correct"](five_dims)
    with pytest.raises(TypeError, match=r"int64.*not supported"):
        faulty["correct"](np.zeros((2, 2), np.int64))


# A read-only accessor (from a const Tensor) has no tcm_to_tensor, on the device as here.
WRITE_THROUGH_CONST = r"""
#include <torch/torch.h>
void write(const torch::Tensor& x, float* tcm) { x.tcm_accessor().tcm_to_tensor<float>(tcm, 0, 1); }
"""


def test_writing_through_a_const_tensor_does_not_compile(tmp_path):
    source = tmp_path / "write_through_const.cpp"
    source.write_text(WRITE_THROUGH_CONST)
    with pytest.raises(shim.ShimError, match="tcm_to_tensor"):
        shim.load("const_write", [source], [source])


def test_builds_are_cached_by_content(tmp_path, faulty):
    compute, shape = tmp_path / "copy.cpp", tmp_path / "shape.cpp"
    compute.write_text(FAULTY_KERNELS)
    shape.write_text(shape_source("cached", ("correct",)))
    first = shim.load("cached", [compute], [shape], multicore=True)
    assert shim.load("cached", [compute], [shape], multicore=True).path == first.path
    shape.write_text(shape_source("cached", ("correct", "tcm_leak")))
    assert shim.load("cached", [compute], [shape], multicore=True).path != first.path
    shim.load("cached", [compute], [shape], build_directory=tmp_path / "build")
    assert (tmp_path / "build" / "libcached.so").is_file()


def test_a_sanitized_build_needs_the_asan_runtime_preloaded(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "")
    with pytest.raises(shim.ShimError, match=r"LD_PRELOAD=.*libasan"):
        shim.load(
            _library.LIBRARY_NAME, _library.COMPUTE_SOURCES, _library.SHAPE_SOURCES, sanitize=True
        )


def test_probe(monkeypatch):
    assert gpsimd.BACKEND.probe().mode == "simulated"
    monkeypatch.setattr(shim, "compiler", lambda: None)
    status = gpsimd.BACKEND.probe()
    assert status.mode == "missing" and "compiler" in status.detail and status.install_hint


def test_config_is_rejected():
    with pytest.raises(TypeError, match="config: backend 'gpsimd' takes no config"):
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
    np.testing.assert_allclose(np.asarray(got), reference_giou(a, b), atol=2e-5, rtol=0)


def test_kernel_giou_rows_of_boxes_land_in_their_rows():
    """The seed kernel's offset bug shows on several rows of several boxes per core."""
    rng = np.random.default_rng(0)
    a, b = random_boxes(rng, (8 * 3, 37)), random_boxes(rng, (8 * 3, 37))
    got = asickernels.giou(a, b, backend="gpsimd")
    np.testing.assert_allclose(np.asarray(got), reference_giou(a, b), atol=2e-5, rtol=0)
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
    want_indices, want_count = greedy_nms(boxes, scores, cats, score_threshold=0.2, **kwargs)
    np.testing.assert_array_equal(np.asarray(indices), want_indices)
    np.testing.assert_array_equal(np.asarray(count), want_count)
    assert registry.backend("gpsimd").counters()["active_cores"] == min(batch, 8)


def test_kernel_nms_float64_scores_that_float32_would_tie():
    """The implementation itself (called as the op layer calls it): float64 scores that
    float32 would round together keep their order."""
    boxes = np.array([[[0, 0, 2, 2], [0, 0, 2, 2], [5, 5, 6, 6], [5, 5, 6, 6]]], np.float64)
    scores = np.array([[0.5, 0.5 + 1e-12, 0.25 + 1e-12, 0.25]], np.float64)
    for threshold in (-np.inf, 0.25 + 1e-12):
        kwargs = {"iou_threshold": 0.5, "max_output_size": 4, "score_threshold": threshold}
        indices, count = gpsimd_nms.nms(boxes, scores, None, **kwargs)
        want_indices, want_count = greedy_nms(boxes, scores, None, **kwargs)
        np.testing.assert_array_equal(indices, want_indices)
        np.testing.assert_array_equal(count, want_count)


def test_kernel_calls_from_several_python_threads_do_not_mix():
    """Runs share one pool of core threads; concurrent callers are served one at a time."""
    rng = np.random.default_rng(5)
    pairs = [(random_boxes(rng, (n,)), random_boxes(rng, (n,))) for n in (5, 300, 4097, 64)]

    def run(pair: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        return np.asarray(asickernels.giou(*pair, backend="gpsimd"))

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, pairs * 5))
    for (a, b), got in zip(pairs * 5, results, strict=True):
        np.testing.assert_allclose(got, reference_giou(a, b), atol=2e-5, rtol=0)


# 16 KB of locals: beyond the ~8KB local-memory stack unless -DSTACK_SIZE says so.
DEEP_STACK = r"""
#include <torch/torch.h>
#include "torchneuron/register.h"
torch::Tensor deep(const torch::Tensor& x) {
  volatile float scratch[4096];
  for (int i = 0; i < 4096; ++i) scratch[i] = static_cast<float>(i);
  torch::Tensor out = torch::zeros(x.sizes(), torch::kFloat);
  out.fill_(scratch[4095]);
  return out;
}
"""
DEEP_STACK_SHAPE = shape_source("stack", ("deep",))


def test_the_stack_limit(tmp_path):
    source, shape = tmp_path / "deep.cpp", tmp_path / "shape.cpp"
    source.write_text(DEEP_STACK)
    shape.write_text(DEEP_STACK_SHAPE)
    x = np.zeros(3, np.float32)
    default = shim.load("stack", [source], [shape])
    if default.sanitized:
        pytest.skip("stack depth is not measured in sanitized builds")
    with pytest.raises(shim.ShimError, match=r"used \d+ bytes of stack .* more than the 8192"):
        default.deep(x)
    declared = shim.load("stack", [source], [shape], extra_cflags=["-DSTACK_SIZE=20000"])
    np.testing.assert_array_equal(declared.deep(x), [4095.0] * 3)
    assert 16384 <= declared.stats()["stack_peak_bytes"] <= 20000


# Stack frames written in one place only: the rule must see the frame's full depth wherever
# the kernel writes into it (near the entry, at the far end, or not at all beyond the top).
FRAMES = r"""
#include <torch/torch.h>
#include "torchneuron/register.h"
#define FRAME_KERNEL(name, bytes, first, last)                  \
  torch::Tensor name(const torch::Tensor& x) {                  \
    volatile char frame[bytes];                                 \
    for (size_t i = (first); i < (last); ++i) frame[i] = 1;     \
    torch::Tensor out = torch::zeros(x.sizes(), torch::kFloat); \
    out.fill_(static_cast<float>(frame[(first)]));              \
    return out;                                                 \
  }
// 500 KB, written only in its 64 bytes nearest the entry (its top) or farthest from it.
FRAME_KERNEL(top, 500 * 1024, 500 * 1024 - 64, 500 * 1024)
FRAME_KERNEL(bottom, 500 * 1024, 0, 64)
// 300 KB written only near its top: within a 400 KB stack.
FRAME_KERNEL(within, 300 * 1024, 300 * 1024 - 64, 300 * 1024)
// 64 MB: past any stack, and past the zone the shim watches beyond the limit.
FRAME_KERNEL(huge, 64 << 20, (64 << 20) - 64, 64 << 20)
"""
FRAMES_SHAPE = shape_source("frames", ("top", "bottom", "within", "huge"))


@pytest.mark.parametrize("declared", [None, 400 * 1024])
def test_the_stack_rule_sees_a_frame_wherever_it_is_written(tmp_path, declared):
    source, shape = tmp_path / "frames.cpp", tmp_path / "shape.cpp"
    source.write_text(FRAMES)
    shape.write_text(FRAMES_SHAPE)
    flags = [] if declared is None else [f"-DSTACK_SIZE={declared}"]
    library = shim.load("frames", [source], [shape], extra_cflags=flags)
    if library.sanitized:
        pytest.skip("stack depth is not measured in sanitized builds")
    limit = declared or 8192
    x = np.zeros(3, np.float32)
    for op in ("top", "bottom"):
        with pytest.raises(shim.ShimError, match=rf"more than the {limit} bytes") as caught:
            getattr(library, op)(x)
        used = re.search(r"used (\d+) bytes of stack", str(caught.value))
        assert used is not None and int(used.group(1)) >= 500 * 1024 - 4096, str(caught.value)
    with pytest.raises(shim.ShimError, match=r"the kernel's stack overflowed"):
        library.huge(x)
    if declared is None:
        with pytest.raises(shim.ShimError, match=r"more than the 8192 bytes"):
            library.within(x)
    else:  # within the limit, also after the overflows above
        np.testing.assert_array_equal(library.within(x), [1.0] * 3)
        assert 300 * 1024 <= library.stats()["stack_peak_bytes"] <= declared
