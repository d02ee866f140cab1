"""The cpu backend's in-place eager route (asickernels.backends.cpu.in_place, csrc/in_place.cpp)
and its C call (eager_front.InPlaceCall): repeated eager numpy calls read the caller's arrays
where they are and give exactly what the compiled call on device arrays gives."""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asickernels
from asickernels.backends.cpu import _library, in_place
from asickernels.benchmarking import workloads
from asickernels.kernels import eager_front, registry
from asickernels.kernels.declaration import Op
from asickernels.testing.cases import random_boxes

pytestmark = pytest.mark.skipif(
    registry.backend("cpu").probe().mode != "native", reason="no native cpu backend here"
)
needs_c_front = pytest.mark.skipif(
    eager_front.InPlaceCall is None, reason=f"Python front: {eager_front.UNAVAILABLE_REASON}"
)


def _route(op: Any, arrays: tuple[np.ndarray, ...], static: dict[str, Any]) -> Any:
    """The route an eager call of ``op`` on ``arrays`` stored (its first call)."""
    op._numpy_routes.clear()
    op(*arrays, **static)
    (route,) = op._numpy_routes.values()
    return route


def _device_result(op: Any, arrays: tuple[np.ndarray, ...], static: dict[str, Any]) -> Any:
    function = jax.jit(functools.partial(op, backend="cpu", **static))
    return function(*[jax.device_put(a) for a in arrays])


def _assert_same(got: Any, want: Any) -> None:
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves, strict=True):
        assert isinstance(g, jax.Array)
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def _misaligned(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``array`` that is not aligned for its dtype."""
    raw = np.empty(array.nbytes + 1, np.uint8)
    out = raw[1:].view(array.dtype).reshape(array.shape)
    out[...] = array
    assert not out.flags.aligned
    return out


BENCH_CASES = [(name, size) for name, op in workloads.OPS.items() for size in op.default_sizes[:1]]


@needs_c_front
@pytest.mark.parametrize(("name", "size"), BENCH_CASES)
def test_every_bench_op_repeats_in_place_and_agrees_with_the_compiled_call(name, size):
    """Each op's second eager call on numpy arrays is the in-place call, and it gives what
    the compiled call on device arrays gives, bit for bit (the same kernel)."""
    bench = workloads.OPS[name]
    case = bench.bench_case(bench.parse_size(size), np.random.default_rng(0))
    op = getattr(asickernels, name)
    route = _route(op, case.arrays, case.static)
    assert isinstance(route, eager_front.InPlaceCall)
    copies = [a.copy() for a in case.arrays]
    _assert_same(op(*case.arrays, **case.static), _device_result(op, case.arrays, case.static))
    for before, after in zip(copies, case.arrays, strict=True):
        np.testing.assert_array_equal(before, after)  # read, never written


@needs_c_front
@settings(max_examples=12, deadline=None)
@given(
    pairs=st.integers(0, 70),
    batch=st.integers(1, 3),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**16),
)
def test_giou_gradient_in_place_on_random_shapes(pairs, batch, dtype, seed):
    """Any shape (empty included) and float dtype: the repeated call agrees with the
    compiled one (float64 and empty calls take no route: x64 and trivial plans)."""
    rng = np.random.default_rng(seed)
    arrays = (
        random_boxes(rng, (batch, pairs)).astype(dtype),
        random_boxes(rng, (batch, pairs)).astype(dtype),
        rng.standard_normal((batch, pairs)).astype(dtype),
    )
    asickernels.giou_vjp._numpy_routes.clear()
    first = asickernels.giou_vjp(*arrays)
    again = asickernels.giou_vjp(*arrays)
    routes = list(asickernels.giou_vjp._numpy_routes.values())
    if dtype == np.float32 and pairs > 0:
        assert len(routes) == 1 and isinstance(routes[0], eager_front.InPlaceCall)
    _assert_same(again, first)


@needs_c_front
@pytest.mark.parametrize("layout", ["unaligned", "fortran", "strided"])
def test_arrays_it_cannot_read_in_place_take_the_compiled_call(layout):
    """Same shapes and dtypes, other memory: unaligned, Fortran-order or strided arrays
    hit the route's key and are given to the compiled call, with the same results."""
    rng = np.random.default_rng(3)
    boxes, scores = random_boxes(rng, (300,)), rng.random(300).astype(np.float32)
    static = {"iou_threshold": 0.3, "max_output_size": 50}
    route = _route(asickernels.nms, (boxes, scores), static)
    assert isinstance(route, eager_front.InPlaceCall)
    if layout == "unaligned":
        other = (_misaligned(boxes), _misaligned(scores))
    elif layout == "fortran":
        other = (np.asfortranarray(boxes), scores)
    else:
        other = (np.repeat(boxes, 2, axis=0)[::2], np.repeat(scores, 2)[::2])
    assert asickernels.nms._numpy_routes[eager_front.numpy_key(other, static)] is route
    _assert_same(asickernels.nms(*other, **static), _device_result(asickernels.nms, other, static))


@needs_c_front
def test_results_are_xla_buffers_the_caller_may_overwrite_its_arrays_after():
    """The call waits for its results: changing or dropping the arrays afterwards changes
    nothing in them."""
    rng = np.random.default_rng(4)
    arrays = [random_boxes(rng, (64, 64)), random_boxes(rng, (64, 64))]
    asickernels.giou(*arrays)
    out = asickernels.giou(*arrays)
    kept = np.asarray(out).copy()
    for a in arrays:
        a[...] = np.nan
    del arrays
    np.testing.assert_array_equal(np.asarray(out), kept)


def test_the_python_front_has_no_in_place_route(monkeypatch):
    monkeypatch.setattr(eager_front, "InPlaceCall", None)
    rng = np.random.default_rng(5)
    arrays = (random_boxes(rng, (40,)), random_boxes(rng, (40,)))
    compiled = jax.jit(registry.implementation("giou", "cpu"))
    assert in_place.numpy_route(compiled, arrays) is None


def _giou_kernel() -> Any:
    return registry.implementation("giou", "cpu")


@needs_c_front
@pytest.mark.parametrize(
    "function",
    [
        lambda a, b: _giou_kernel()(a + 1.0, b),  # a computed argument
        lambda a, b: a + b,  # no kernel
        lambda a, b: _giou_kernel()(a, b) + _giou_kernel()(b, a),  # two kernel calls
        lambda a, b: (_giou_kernel()(a, b), a),  # an input returned
        lambda a, b: _giou_kernel()(a.T.T[::-1], b),  # a reversed input
    ],
    ids=["computed", "no-kernel", "two-kernels", "input-returned", "reversed"],
)
def test_computations_that_are_not_one_kernel_on_their_inputs_get_no_route(function):
    rng = np.random.default_rng(6)
    arrays = (random_boxes(rng, (40,)), random_boxes(rng, (40,)))
    assert in_place.numpy_route(jax.jit(function), arrays) is None


@needs_c_front
def test_inputs_jax_converts_get_no_route():
    """int64 without x64 becomes int32 in JAX: those are not the caller's bytes."""
    scores = np.arange(10, dtype=np.int64)
    boxes = random_boxes(np.random.default_rng(7), (10,))
    function = jax.jit(lambda b, s: _giou_kernel()(b, b + s[:, None].astype(b.dtype)))
    assert in_place.numpy_route(function, (boxes, scores)) is None


@needs_c_front
def test_work_after_the_kernel_stays_in_the_route():
    """Reshapes before the kernel and any computation after it."""
    rng = np.random.default_rng(8)
    arrays = (random_boxes(rng, (8, 5)), random_boxes(rng, (8, 5)))

    def function(a: jax.Array, b: jax.Array) -> jax.Array:
        return _giou_kernel()(a.reshape(40, 4), b.reshape(40, 4)).reshape(8, 5) * 2.0 - 1.0

    route = in_place.numpy_route(jax.jit(function), arrays)
    assert isinstance(route, eager_front.InPlaceCall)
    _assert_same(route(*arrays), jax.jit(function)(*arrays))


class _Ready:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def block_until_ready(self) -> _Ready:
        self.log.append(self.name)
        return self


@needs_c_front
def test_in_place_call_passes_addresses_waits_on_each_result_and_falls_back():
    log: list[str] = []
    tables: list[np.ndarray] = []

    def function(table: np.ndarray) -> tuple[_Ready, _Ready]:
        tables.append(table)
        return _Ready(log, "first"), _Ready(log, "second")

    def fallback(*arrays: Any) -> str:
        log.append("fallback")
        return "fell back"

    call = eager_front.InPlaceCall(function, fallback)
    a, b = np.arange(6.0), np.zeros((2, 3), np.int8)
    out = call(a, b)
    assert [r.name for r in out] == ["first", "second"] and log == ["first", "second"]
    (table,) = tables
    assert table.dtype == np.uint32 and table.shape == (4,)
    assert list(table.view(np.uint64)) == [a.ctypes.data, b.ctypes.data]
    log.clear()
    assert call(a[::2], b) == "fell back" and log == ["fallback"]
    assert call([1.0], b) == "fell back"
    with pytest.raises(TypeError, match="by position"):
        call(a, b=b)


def _in_place_ffi(layout: list[int], target: int, table: np.ndarray) -> jax.Array:
    _library.ffi_targets()
    call = jax.ffi.ffi_call(
        _library.ffi_name(_library.IN_PLACE_TARGET), jax.ShapeDtypeStruct((4,), np.float32)
    )
    return call(
        table,
        metric=np.int64(1),
        in_place_target=np.int64(target),
        in_place_layout=np.array(layout, np.int64),
    )


@pytest.mark.parametrize(
    ("layout", "target", "table_size", "message"),
    [
        ([0, 11, 2, 4, 4, 1, 11, 2, 4, 4], 10**6, 4, "in_place_target"),
        ([0, 11, 2, 4, 4, 5, 11, 2, 4, 4], None, 4, "malformed"),
        ([0, 11, 2, 4], None, 4, "malformed"),
        ([0, 11, 2, 4, 4, 1, 11, 2, 4, 4], None, 3, "uint32 pairs"),
        ([0, 11, 2, 4, -4, 1, 11, 2, 4, 4], None, 4, "negative"),
    ],
    ids=["target", "slot", "short", "odd-table", "negative-dim"],
)
def test_the_ffi_handler_refuses_malformed_calls(layout, target, table_size, message):
    """What only a hand-made call could get wrong is an error from XLA, not a crash."""
    paired = _library.ffi_target_names().index("paired_box_metric_f32")
    boxes = random_boxes(np.random.default_rng(9), (4,))
    addresses = np.array([boxes.ctypes.data, boxes.ctypes.data], np.uint64).view(np.uint32)
    with pytest.raises(Exception, match=message):
        jax.block_until_ready(
            _in_place_ffi(layout, paired if target is None else target, addresses[:table_size])
        )


def test_the_ffi_target_names_are_the_librarys_handlers():
    names = _library.ffi_target_names()
    assert len(set(names)) == len(names) and {"nms_f32", "int8_matmul"} <= set(names)
    library = _library.library()
    for name in (*names, _library.IN_PLACE_TARGET):
        assert getattr(library, _library.ffi_name(name)) is not None


@needs_c_front
def test_the_first_call_of_a_signature_runs_the_route_it_stores(monkeypatch):
    """One compilation per signature: the first call goes through its new route, not
    through ``Op.run`` and then the route."""

    def no_run(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("Op.run was called")

    rng = np.random.default_rng(10)
    arrays = (random_boxes(rng, (37, 3)), random_boxes(rng, (37, 3)))
    want = _device_result(asickernels.diou, arrays, {})
    monkeypatch.setattr(Op, "run", no_run)
    asickernels.diou._numpy_routes.clear()
    first = asickernels.diou(*arrays)
    (route,) = asickernels.diou._numpy_routes.values()
    assert isinstance(route, eager_front.InPlaceCall)
    _assert_same(first, want)
