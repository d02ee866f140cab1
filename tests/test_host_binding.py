"""Bound host routes (asickernels.kernels.host_binding): small numpy eager calls replayed as
one host-kernel call bound to their signature, or compiled, whichever measured faster."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import asickernels
from asickernels.backends.cpu import _library
from asickernels.kernels import host_binding
from asickernels.kernels.declaration import Spec
from asickernels.testing import oracle
from asickernels.testing.cases import random_boxes
from tests.conftest import require

pytestmark = pytest.mark.usefixtures("_cpu_backend")


@pytest.fixture
def _cpu_backend() -> None:
    require("cpu")


def _signature(name: str, args: tuple[np.ndarray, ...], kwargs: dict) -> tuple:
    """(op, backend, plan, arrays by name) of a public call, as its first eager call sees
    them."""
    op = oracle.op_named(name)
    given, statics, backend, config = op.bind(args, kwargs)
    arrays = op.prepared(given)
    plan = op.plan(arrays, statics)
    return op, op.choose(plan, backend, arrays), plan, arrays, config


def _bound(name: str, *args: np.ndarray, **kwargs) -> host_binding.Route | None:
    op, backend, plan, arrays, _ = _signature(name, args, kwargs)
    return host_binding.bound_route(op.compute, backend, plan, arrays)


def _outputs(value) -> list[np.ndarray]:
    return [np.asarray(v) for v in (value if isinstance(value, tuple) else (value,))]


def _nms_inputs(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    return random_boxes(rng, shape, scale=64.0), rng.random(shape).astype(np.float32)


def _calls(rng: np.random.Generator) -> list[tuple[str, tuple[np.ndarray, ...], dict]]:
    """Small calls of every op with a bindable host kernel, in sizes that divide by no block
    and with batch dimensions."""
    a, b = random_boxes(rng, (3, 37)), random_boxes(rng, (3, 37))
    boxes, scores = _nms_inputs(rng, (2, 37))
    ids = rng.integers(0, 3, (2, 37)).astype(np.int32)
    nms_statics = {"iou_threshold": 0.3, "max_output_size": 11}
    return [
        ("giou", (a, b), {}),
        ("diou", (a, b), {}),
        ("ciou", (a, b), {}),
        ("giou_vjp", (a, b, rng.random((3, 37)).astype(np.float32)), {}),
        ("box_iou", (a[0], b[1, :29]), {}),
        ("generalized_box_iou", (a[0], b[1, :29]), {}),
        ("nms", (boxes, scores), nms_statics),
        ("batched_nms", (boxes, scores, ids), nms_statics),
    ]


@pytest.mark.parametrize("index", range(8))
def test_a_bound_route_gives_what_the_compiled_call_gives(index):
    """Ops of one output bind to their host kernel, with the compiled call's results; ops of
    two outputs do not bind (their compiled call is as fast)."""
    name, args, kwargs = _calls(np.random.default_rng(index))[index]
    op, backend, plan, arrays, config = _signature(name, args, kwargs)
    bound = host_binding.bound_route(op.compute, backend, plan, arrays)
    if not isinstance(plan.outputs, Spec):
        assert bound is None
        return
    assert bound is not None, f"{name} should bind to its host kernel"
    compiled = op._compiled_for(backend, plan, config, arrays)
    got, want = bound(*args), compiled(*args)
    assert isinstance(got, jax.Array) and got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))  # one native kernel
    oracle.assert_agrees(name, got, oracle.expected(name, arrays, dict(plan.statics)))


def test_binding_is_tried_where_one_output_replaces_larger_inputs():
    rng = np.random.default_rng(4)
    a, b = random_boxes(rng, (64, 64)), random_boxes(rng, (64, 64))
    for name, args, kwargs, worth in [
        ("giou", (a, b), {}, True),  # [64, 64] out for 2 x [64, 64, 4] in
        ("box_iou", (a[0, :30], b[0, :10]), {}, False),  # [30, 10] out for [30, 4], [10, 4]
        ("giou_vjp", (a, b, a[..., 0]), {}, False),  # two outputs
    ]:
        _, _, plan, arrays, _ = _signature(name, args, kwargs)
        present = [x for x in arrays.values() if x is not None]
        assert host_binding.worth_binding(plan, present) is worth, name


def test_a_bound_route_reads_strided_inputs_of_its_signature_in_c_order():
    """The route key holds shapes and dtypes, not layouts: later calls may pass Fortran-order
    or strided arrays of the same shape, which the bound kernel reads as the op's reshape
    would (a C-order copy), leaving them unchanged."""
    rng = np.random.default_rng(5)
    a, b = random_boxes(rng, (6, 7)), random_boxes(rng, (6, 7))
    route = _bound("giou", a, b)
    assert route is not None
    wide = random_boxes(rng, (6, 14))
    strided, fortran = wide[:, ::2], np.asfortranarray(random_boxes(rng, (6, 7)))
    before = (strided.copy(), fortran.copy())
    got = route(strided, fortran)
    want = oracle.expected("giou", {"boxes1": strided, "boxes2": fortran}, {})
    oracle.assert_agrees("giou", got, want)
    np.testing.assert_array_equal(strided, before[0])
    np.testing.assert_array_equal(fortran, before[1])


def test_calls_that_are_not_one_kernel_on_their_own_inputs_get_no_bound_route():
    rng = np.random.default_rng(6)
    a, b = random_boxes(rng, (9,)), random_boxes(rng, (9,))
    assert _bound("giou", a, a) is None  # one array twice: later calls could not be told apart
    half = a.astype(np.float16), b.astype(np.float16)
    assert _bound("giou", *half) is None  # converted to float32 before the kernel
    assert _bound("giou_loss", a, b, reduction="sum") is None  # a kernel, then a reduction
    boxes, scores = _nms_inputs(rng, (9,))
    narrow_ids = rng.integers(0, 3, 9).astype(np.int16)  # widened to int32: a copy
    statics = {"iou_threshold": 0.5, "max_output_size": 4}
    assert _bound("batched_nms", boxes, scores, narrow_ids, **statics) is None


@pytest.mark.parametrize("choice", ["bound", "compiled"])
def test_eager_calls_replay_either_route_with_the_same_results(monkeypatch, choice):
    """Repeated small numpy calls keep one route per signature, bound or compiled, and give
    the first call's results; a JAX array of the same shape takes its own route."""
    op = asickernels.giou
    monkeypatch.setattr(op, "_numpy_routes", {})
    monkeypatch.setattr(op, "_routes", {})
    asked = []

    def worth(plan, present):
        asked.append(choice)
        return choice == "bound"

    monkeypatch.setattr(host_binding, "worth_binding", worth)
    rng = np.random.default_rng(7)
    a, b = random_boxes(rng, (5, 11)), random_boxes(rng, (5, 11))
    first = np.asarray(op(a, b))
    for _ in range(3):
        again = op(a, b)
        assert isinstance(again, jax.Array)
        np.testing.assert_array_equal(np.asarray(again), first)
    assert asked == [choice] and len(op._numpy_routes) == 1
    route = next(iter(op._numpy_routes.values()))
    assert (route.__module__ == host_binding.__name__) is (choice == "bound")
    c = random_boxes(rng, (5, 11))
    oracle.assert_agrees("giou", op(a, c), oracle.expected("giou", {"boxes1": a, "boxes2": c}, {}))
    on_device = op(jnp.asarray(a), jnp.asarray(b))
    np.testing.assert_array_equal(np.asarray(on_device), first)
    assert len(op._numpy_routes) == 1 and len(op._routes) == 1


def test_a_bound_route_hands_its_output_to_the_current_default_device(monkeypatch):
    op = asickernels.diou
    monkeypatch.setattr(op, "_numpy_routes", {})
    rng = np.random.default_rng(8)
    a, b = random_boxes(rng, (13,)), random_boxes(rng, (13,))
    first = op(a, b)
    assert next(iter(op._numpy_routes.values())).__module__ == host_binding.__name__
    other = jax.devices()[-1]
    assert other != jax.devices()[0]
    with jax.default_device(other):
        moved = op(a, b)
    assert moved.devices() == {other}
    np.testing.assert_array_equal(np.asarray(moved), np.asarray(first))
    assert op(a, b).devices() == first.devices()


def test_contiguous_data_is_the_pointer_of_c_contiguous_arrays_only():
    read = _library.contiguous_data()
    array = np.arange(12.0).reshape(3, 4)
    assert read(array) == array.__array_interface__["data"][0]
    assert read(array[1:]) == array[1:].__array_interface__["data"][0]
    assert read(array[:, ::2]) is None
    assert read(array.T) is None


def test_other_byte_orders_and_read_only_inputs_of_a_bound_signature():
    """A byte-swapped array is another signature (its dtype differs): validated, not read
    as native floats by the bound kernel; a read-only array of the bound signature is read
    in place."""
    rng = np.random.default_rng(9)
    a, b = random_boxes(rng, (4, 6)), random_boxes(rng, (4, 6))
    op = asickernels.giou
    for _ in range(2):
        op(a, b)
    swapped = a.astype(a.dtype.newbyteorder(">")), b.astype(b.dtype.newbyteorder(">"))
    want = oracle.expected("giou", {"boxes1": a, "boxes2": b}, {})
    for _ in range(2):
        with pytest.raises(TypeError, match=">f4"):
            op(*swapped)
    frozen = a.copy(), b.copy()
    for array in frozen:
        array.flags.writeable = False
    oracle.assert_agrees("giou", op(*frozen), want)
