"""The ``nl`` compute functions of both NKI generations run one implementation (the legacy
ones are adapters over the current API's): on the same inputs their results are identical,
bit for bit, so the generations cannot drift apart."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from asickernels.simulate import nki as current
from asickernels.simulate.nki import language as core_nl
from asickernels.simulate.nki import legacy
from asickernels.simulate.nki.legacy import language as legacy_nl

RNG = np.random.default_rng(11)


def legacy_result(compute: Callable[..., Any], *arrays: np.ndarray) -> np.ndarray:
    def kernel(*inputs: Any) -> Any:
        result = compute(legacy_nl, *(legacy_nl.load(x) for x in inputs))
        out = legacy_nl.ndarray(result.shape, dtype=result.dtype, buffer=legacy_nl.shared_hbm)
        legacy_nl.store(out, result)
        return out

    return np.asarray(legacy.simulate_kernel(kernel, *arrays))


def current_result(compute: Callable[..., Any], *arrays: np.ndarray) -> np.ndarray:
    def kernel(*inputs: Any) -> Any:
        result = compute(core_nl, *(core_nl.load(x) for x in inputs))
        if result.buffer is core_nl.psum:
            result = core_nl.copy(result)
        out = core_nl.ndarray(result.shape, dtype=result.dtype, buffer=core_nl.shared_hbm)
        core_nl.store(out, result)
        return out

    return np.asarray(current.simulate(kernel)(*arrays))


def assert_same(compute: Callable[..., Any], *arrays: np.ndarray) -> None:
    expected = current_result(compute, *arrays)
    np.testing.assert_array_equal(legacy_result(compute, *arrays), expected)


UNARY = [
    "abs", "negative", "exp", "log", "sqrt", "rsqrt", "reciprocal", "square", "sign", "sin",
    "cos", "tan", "tanh", "arctan", "ceil", "floor", "trunc", "sigmoid", "relu", "gelu",
    "gelu_apprx_tanh", "silu", "softplus", "mish", "erf", "erf_dx", "gelu_dx", "silu_dx",
]  # fmt: skip


@pytest.mark.parametrize("name", UNARY)
def test_unary_functions_agree(name: str) -> None:
    x = RNG.uniform(0.1, 4.0, (8, 33)).astype(np.float32)  # in every function's domain
    x[:, ::2] *= -1 if name not in ("log", "sqrt", "rsqrt") else 1
    assert_same(lambda nl, t: getattr(nl, name)(t), x)


BINARY = [
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "fmod", "mod",
    "equal", "greater", "less_equal", "logical_and", "logical_xor",
]  # fmt: skip


@pytest.mark.parametrize("name", BINARY)
def test_binary_functions_agree_with_an_explicit_dtype(name: str) -> None:
    """(The default result dtypes follow each generation's own promotion rule.)"""
    x = RNG.uniform(0.5, 3.0, (16, 20)).astype(np.float32)
    y = np.round(RNG.uniform(0.5, 3.0, (16, 20))).astype(np.float32)
    assert_same(lambda nl, a, b: getattr(nl, name)(a, b, dtype=nl.float32), x, y)


@pytest.mark.parametrize("name", ["sum", "max", "min", "mean", "prod", "var", "all"])
def test_reductions_agree(name: str) -> None:
    x = RNG.uniform(-2.0, 2.0, (8, 4, 16)).astype(np.float32)
    assert_same(lambda nl, t: getattr(nl, name)(t, axis=2, dtype=nl.float32), x)


@pytest.mark.parametrize("name", ["sum", "max", "mean"])
def test_reductions_over_every_free_axis_agree_with_keepdims(name: str) -> None:
    x = RNG.uniform(-2.0, 2.0, (8, 4, 16)).astype(np.float32)
    assert_same(lambda nl, t: getattr(nl, name)(t, axis=(1, 2), keepdims=True), x)


def test_softmax_where_and_transpose_agree() -> None:
    x = RNG.standard_normal((32, 48)).astype(np.float32)
    assert_same(lambda nl, t: nl.softmax(t, axis=1), x)
    assert_same(lambda nl, t: nl.where(nl.greater(t, 0.0, dtype=nl.float32), t, 0.0), x)
    assert_same(lambda nl, t: nl.transpose(t), x)


def test_rand_and_dropout_draw_the_same_numbers_after_the_same_seed() -> None:
    def draw(nl: Any, t: Any) -> Any:
        nl.random_seed(3)
        mask = nl.rand((t.shape[0], t.shape[1]), dtype=nl.float32)
        return nl.multiply(nl.dropout(t, 0.5), mask, dtype=nl.float32)

    assert_same(draw, RNG.standard_normal((16, 24)).astype(np.float32))
