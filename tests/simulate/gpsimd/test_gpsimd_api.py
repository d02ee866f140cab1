"""The documented GpSimd custom-operator API in the host shim (custom-ops-ref-guide.rst):
tensor factories, element-wise ops, torch::Scalar, Tensor members, the standard and streaming
accessors and their coherence policy, single-core return values and get_dst_tensor(), each
checked against numpy; and the single-core rules a kernel or shape function can break."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from asickernels.simulate import gpsimd as shim

pytestmark = pytest.mark.skipif(shim.compiler() is None, reason="no C++ compiler for the shim")

KERNELS = r"""
#include <stdint.h>
#include <torch/torch.h>
#include <neuron/neuron-utils.hpp>

// ((x + 2 y) * s) - x / 2, through op() and op_out() forms; s arrives as a torch::Scalar.
torch::Tensor arithmetic(const torch::Tensor& x, const torch::Tensor& y, const torch::Scalar& s) {
  torch::Tensor scaled = torch::mul(torch::add(x, y, 2), s);
  torch::Tensor half = torch::empty(x.sizes(), torch::kFloat);
  torch::div_out(half, x, 2.0);
  return torch::sub(scaled, half);
}

// clamp(|x| + floor(y), -1, 3) + exp(sin(x)) + pow(x, 2) + log(1 + x^2) - cos(y)
torch::Tensor transcendental(const torch::Tensor& x, const torch::Tensor& y) {
  torch::Tensor out = torch::clamp(torch::add(torch::abs(x), torch::floor(y)), -1, 3);
  torch::Tensor e = torch::empty(x.sizes(), torch::kFloat);
  torch::exp_out(e, torch::sin(x));
  torch::Tensor square = torch::pow(x, 2);
  torch::Tensor logs = torch::log(torch::add(square, 1));
  return torch::sub(torch::add(torch::add(torch::add(out, e), square), logs), torch::cos(y));
}

// (a & b) | ~a, and a | 6 on int32.
torch::Tensor bitwise(const torch::Tensor& a, const torch::Tensor& b) {
  torch::Tensor mixed = torch::bitwise_or(torch::bitwise_and(a, b), torch::bitwise_not(a));
  return torch::add(mixed, torch::bitwise_or(a, 6));
}

// eye(n, m) + full(s) + ones - zeros, with n = x.size(0) and m = x.size(-1).
torch::Tensor factories(const torch::Tensor& x, double s) {
  const int64_t n = x.size(0), m = x.size(-1);
  torch::Tensor out = torch::add(torch::eye(n, m, torch::kFloat), torch::full({n, m}, s, torch::kFloat));
  return torch::sub(torch::add(out, torch::ones({n, m}, torch::kFloat)), torch::zeros({n, m}, torch::kFloat));
}

// The transpose of a 2-D tensor through accessor<float, 2>, written into get_dst_tensor()
// (the returned tensor is then ignored).
torch::Tensor transpose(const torch::Tensor& x) {
  torch::Tensor out = get_dst_tensor();
  auto in = x.accessor<float, 2>();
  auto result = out.accessor<float, 2>();
  for (int64_t i = 0; i < x.size(0); ++i) {
    for (int64_t j = 0; j < x.size(1); ++j) result[j][i] = in[i][j];
  }
  return torch::zeros({1}, torch::kFloat);
}

// float16 in through a read stream, float32 out through a write stream, plus s.
torch::Tensor widen(const torch::Tensor& x, double s) {
  torch::Tensor out = torch::empty(x.sizes(), torch::kFloat);
  out.fill_(0);
  auto in = x.read_stream_accessor<c10::Half>();
  auto writer = out.write_stream_accessor<float>();
  for (int64_t i = 0; i < x.numel(); ++i) writer.write(static_cast<float>(in.read()) + s);
  in.close();
  writer.close();
  return out;
}

// A read stream and a write stream on one tensor: an error under the default policy.
torch::Tensor incoherent(const torch::Tensor& x, double quiet) {
  torch::Tensor out = torch::zeros(x.sizes(), torch::kFloat);
  if (quiet != 0) out.set_accessor_coherence_policy(torch::CoherencyEnforcer::INCOHERENT_QUIET);
  auto reader = static_cast<const torch::Tensor&>(out).read_stream_accessor<float>();
  auto writer = out.write_stream_accessor<float>();
  writer.write(reader.read() + 1);
  return out;
}

torch::Tensor reads_too_far(const torch::Tensor& x) {
  auto in = x.read_stream_accessor<float>();
  for (int64_t i = 0; i <= x.numel(); ++i) in.read();
  return torch::zeros(x.sizes(), torch::kFloat);
}

torch::Tensor writes_input(torch::Tensor x) {
  x.accessor<float, 1>()[0] = 42;
  return torch::zeros(x.sizes(), torch::kFloat);
}

torch::Tensor wrong_shape(const torch::Tensor& x) { return torch::zeros({2}, torch::kFloat); }
"""

SHAPES = r"""
#include <torch/torch.h>
#include "torchneuron/register.h"

torch::Tensor like_x(torch::Tensor x, torch::Tensor y, torch::Scalar s) { return torch::zeros(x.sizes(), torch::kFloat); }
torch::Tensor like_x2(torch::Tensor x, torch::Tensor y) { return torch::zeros(x.sizes(), torch::kFloat); }
torch::Tensor like_a(torch::Tensor a, torch::Tensor b) { return torch::zeros(a.sizes(), torch::kInt); }
torch::Tensor like_xs(torch::Tensor x, double s) { return torch::zeros(x.sizes(), torch::kFloat); }
torch::Tensor transposed(torch::Tensor x) { return torch::zeros({x.size(1), x.size(0)}, torch::kFloat); }
torch::Tensor same(torch::Tensor x) { return torch::zeros(x.sizes(), torch::kFloat); }

NEURON_LIBRARY(api, m) {
  m.def("arithmetic", &like_x, "arithmetic");
  m.def("transcendental", &like_x2, "transcendental");
  m.def("bitwise", &like_a, "bitwise");
  m.def("factories", &like_xs, "factories");
  m.def("transpose", &transposed, "transpose");
  m.def("widen", &like_xs, "widen");
  m.def("incoherent", &like_xs, "incoherent");
  m.def("reads_too_far", &same, "reads_too_far");
  m.def("writes_input", &same, "writes_input");
  m.def("wrong_shape", &same, "wrong_shape");
}
"""

# A shape function must not read tensor data: at trace time inputs are data-less XLA tensors.
DATA_READING_SHAPE = r"""
#include <torch/torch.h>
#include "torchneuron/register.h"
torch::Tensor peeks(torch::Tensor x) {
  const float first = x.accessor<float, 1>()[0];
  return torch::zeros({static_cast<int64_t>(first)}, torch::kFloat);
}
NEURON_LIBRARY(peek, m) { m.def("same", &peeks, "wrong_shape"); }
"""


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> shim.CustomOpLibrary:
    directory = tmp_path_factory.mktemp("gpsimd_api")
    (directory / "kernels.cpp").write_text(KERNELS)
    (directory / "shapes.cpp").write_text(SHAPES)
    return shim.load("api", [directory / "kernels.cpp"], [directory / "shapes.cpp"])


def floats(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-3, 3, shape).astype(np.float32)


def test_arithmetic_with_scalars(api):
    x, y = floats(4, 5), floats(4, 5, seed=1)
    want = (x + 2 * y) * np.float32(1.5) - x / 2
    np.testing.assert_allclose(api.arithmetic(x, y, 1.5), want, rtol=1e-6, atol=1e-6)


def test_transcendental_ops(api):
    x, y = floats(33), floats(33, seed=2)
    want = np.clip(np.abs(x) + np.floor(y), -1, 3) + np.exp(np.sin(x)) + x**2
    want += np.log1p(x**2) - np.cos(y)
    np.testing.assert_allclose(api.transcendental(x, y), want, rtol=1e-5, atol=1e-5)


def test_bitwise_ops_on_int32(api):
    rng = np.random.default_rng(3)
    a, b = (rng.integers(-1000, 1000, 17, dtype=np.int32) for _ in range(2))
    np.testing.assert_array_equal(api.bitwise(a, b), ((a & b) | ~a) + (a | 6))


def test_factories_and_size_with_negative_dims(api):
    got = api.factories(floats(3, 5), 0.25)
    np.testing.assert_array_equal(got, np.eye(3, 5, dtype=np.float32) + 1.25)


def test_standard_accessor_into_get_dst_tensor(api):
    x = floats(6, 9)
    np.testing.assert_array_equal(api.transpose(x), x.T)


def test_stream_accessors_and_half_elements(api):
    x = floats(2, 300).astype(np.float16)
    np.testing.assert_array_equal(api.widen(x, 0.5), x.astype(np.float32) + np.float32(0.5))
    assert api.stats()["tcm_peak_bytes"] == 8192  # two streams of 4 KB


def test_the_coherence_policy(api):
    with pytest.raises(shim.ShimError, match="potentially incoherent access under the COHERENT"):
        api.incoherent(floats(3), 0)
    np.testing.assert_array_equal(api.incoherent(floats(3), 1), [1, 0, 0])


@pytest.mark.parametrize(
    ("op", "message"),
    [
        ("reads_too_far", r"read\(\) past the end of a stream over 4 elements"),
        ("writes_input", r"the kernel wrote into input 1 \(operator inputs are read-only\)"),
        ("wrong_shape", r"the kernel returned \[2\] kFloat, but the shape function declares \[4\]"),
    ],
)
def test_single_core_findings(api, op, message):
    x = floats(4)
    before = x.copy()
    with pytest.raises(shim.ShimError, match=message):
        api.ops[op](x)
    np.testing.assert_array_equal(x, before)  # the caller's array is never modified


def test_arguments_are_checked_before_the_kernel_runs(api):
    with pytest.raises(TypeError, match="takes 3 arguments, got 2"):
        api.arithmetic(floats(2), floats(2))
    with pytest.raises(TypeError, match="argument 3 must be a number"):
        api.arithmetic(floats(2), floats(2), floats(2))
    with pytest.raises(TypeError, match="float64, which GpSimd custom operators do not support"):
        api.transpose(np.zeros((2, 2)))
    bf16 = floats(2, 3).astype(ml_dtypes.bfloat16)
    with pytest.raises(shim.ShimError, match=r"accessor<kFloat, 2> on a kBFloat16 tensor"):
        api.transpose(bf16)


def test_a_shape_function_may_not_read_tensor_data(tmp_path, api):
    (tmp_path / "kernels.cpp").write_text(KERNELS)
    (tmp_path / "shape.cpp").write_text(DATA_READING_SHAPE)
    library = shim.load("peek", [tmp_path / "kernels.cpp"], [tmp_path / "shape.cpp"])
    with pytest.raises(shim.ShimError, match="a shape function read tensor data"):
        library.same(floats(4))
