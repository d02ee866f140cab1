"""The conformance suite: every op x every backend against the float64 reference, on
random, edge and adversarial inputs. A backend joins it by registering its op modules."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest
from conftest import backends_under_test, require

import asickernels
from asickernels.backends.pallas_tpu import lowering
from asickernels.kernels import registry
from asickernels.kernels.giou import differentiable_backends
from asickernels.testing import oracle
from asickernels.testing.cases import giou_cases, matmul_cases, nms_cases


def require_traceable(backend):
    """TPU interpret mode under jit needs jax >= 0.8; older JAX must refuse it clearly."""
    if backend == "pallas_tpu_interpret" and not lowering.tpu_interpret_traceable():
        boxes = np.zeros((3, 4), np.float32)
        with pytest.raises(NotImplementedError, match="cannot run under jit"):
            jax.jit(lambda b: asickernels.giou(b, b, backend=backend))(boxes)
        pytest.skip(f"TPU interpret mode cannot be traced with jax {jax.__version__}")


def refuses_float64(backend, kernel, arrays, call):
    """A backend without float64 refuses float64 inputs with a clear TypeError (nothing is
    silently computed in float32); returns whether it did."""
    wide = any(a is not None and np.dtype(a.dtype) == np.float64 for a in arrays)
    if wide and "float64" not in registry.support(kernel, backend).dtypes:
        with pytest.raises(TypeError, match="float64"):
            call()
        return True
    return False


def _params(cases, ids=lambda c: c.name):
    return [
        pytest.param(c, id=ids(c), marks=[pytest.mark.slow] if getattr(c, "slow", False) else [])
        for c in cases
    ]


def _snapshot(*arrays):
    return [None if a is None else np.array(a, copy=True) for a in arrays]


def _assert_unchanged(before, arrays):
    for old, new in zip(before, arrays, strict=True):
        if old is not None:
            np.testing.assert_array_equal(np.asarray(new), old, err_msg="an input was modified")


@pytest.mark.parametrize("backend", backends_under_test("giou"))
@pytest.mark.parametrize("case", _params(giou_cases()))
def test_giou(backend, case):
    require(backend)
    before = _snapshot(case.boxes1, case.boxes2)
    call = lambda: asickernels.giou(case.boxes1, case.boxes2, backend=backend)  # noqa: E731
    if refuses_float64(backend, "giou", [case.boxes1], call):
        return
    got = call()
    wide = case.boxes1.dtype == np.float64
    assert got.shape == case.boxes1.shape[:-1] and got.dtype == (np.float64 if wide else np.float32)
    want = oracle.expected("giou", {"boxes1": case.boxes1, "boxes2": case.boxes2}, {})
    oracle.assert_agrees("giou", got, want)
    _assert_unchanged(before, [case.boxes1, case.boxes2])


@pytest.mark.parametrize("backend", [b for b in differentiable_backends() if b != "reference"])
@pytest.mark.parametrize(
    "case", _params([c for c in giou_cases() if c.boxes1.dtype != ml_dtypes.bfloat16])
)
def test_giou_gradient(backend, case):
    require(backend)
    rng = np.random.default_rng(7)
    cotangent = rng.normal(size=case.boxes1.shape[:-1]).astype(np.float32)
    call = lambda: asickernels.giou_vjp(case.boxes1, case.boxes2, cotangent, backend=backend)  # noqa: E731
    if refuses_float64(backend, "giou_vjp", [case.boxes1], call):
        return
    got = call()
    arrays = {"boxes1": case.boxes1, "boxes2": case.boxes2, "cotangent": cotangent}
    oracle.assert_agrees("giou_vjp", got, oracle.expected("giou_vjp", arrays, {}))


@pytest.mark.parametrize(
    "backend", [b for b in backends_under_test("giou") if registry.backend(b).array_kind == "jax"]
)
def test_giou_jax_grad_and_jit(backend):
    """``jax.grad`` through the public op, under ``jit``, equals the reference gradient."""
    require(backend)
    require_traceable(backend)
    case = next(c for c in giou_cases() if c.name == "random_257")
    grad = jax.jit(
        jax.grad(lambda a, b: asickernels.giou(a, b, backend=backend).sum(), argnums=(0, 1))
    )
    got = grad(case.boxes1, case.boxes2)
    arrays = {"boxes1": case.boxes1, "boxes2": case.boxes2, "cotangent": np.ones(257)}
    oracle.assert_agrees("giou_vjp", got, oracle.expected("giou_vjp", arrays, {}))


@pytest.mark.parametrize("backend", backends_under_test("giou"))
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_giou_loss_masked_padding(backend, reduction):
    """Padding (mask False) may hold NaN and zero boxes: it contributes exactly 0."""
    require(backend)
    rng = np.random.default_rng(3)
    preds = rng.uniform(0, 5, (4, 37, 2)).astype(np.float32)
    preds = np.concatenate([preds, preds + 1], -1)
    targets = preds + rng.uniform(-0.5, 0.5, preds.shape).astype(np.float32)
    mask = rng.uniform(size=(4, 37)) < 0.6
    preds[~mask] = np.nan
    targets[~mask] = 0.0
    got = asickernels.giou_loss(preds, targets, mask=mask, reduction=reduction, backend=backend)
    arrays = {"preds": preds, "targets": targets, "mask": mask}
    want = oracle.expected("giou_loss", arrays, {"reduction": reduction})
    oracle.assert_agrees("giou_loss", got, want)
    assert np.all(np.isfinite(np.asarray(got)))


@pytest.mark.parametrize("backend", backends_under_test("giou"))
def test_giou_loss_mean_with_no_valid_box_is_zero(backend):
    require(backend)
    boxes = np.full((3, 4), np.nan, np.float32)
    got = asickernels.giou_loss(boxes, boxes, mask=np.zeros(3, bool), backend=backend)
    assert float(got) == 0.0


@pytest.mark.parametrize("backend", backends_under_test("nms"))
@pytest.mark.parametrize("case", _params(nms_cases()))
def test_nms(backend, case):
    require(backend)
    before = _snapshot(case.boxes, case.scores, case.categories)
    call = lambda: asickernels.nms(case.boxes, case.scores, backend=backend, **case.kwargs())  # noqa: E731
    if refuses_float64(backend, "nms", [case.boxes, case.scores], call):
        return
    if case.categories is None:
        indices, num_valid = asickernels.nms(
            case.boxes, case.scores, backend=backend, **case.kwargs()
        )
    else:
        indices, num_valid = asickernels.batched_nms(
            case.boxes, case.scores, case.categories, backend=backend, **case.kwargs()
        )
    batch_shape = case.scores.shape[:-1]
    assert indices.shape == batch_shape + (case.max_output_size,) and indices.dtype == np.int32
    assert num_valid.shape == batch_shape and num_valid.dtype == np.int32
    op = "nms" if case.categories is None else "batched_nms"
    arrays = {"boxes": case.boxes, "scores": case.scores}
    if case.categories is not None:
        arrays["idxs"] = case.categories
    oracle.assert_agrees(op, (indices, num_valid), oracle.expected(op, arrays, case.kwargs()))
    _assert_unchanged(before, [case.boxes, case.scores, case.categories])


@pytest.mark.parametrize("backend", backends_under_test("int8_matmul"))
@pytest.mark.parametrize("case", _params(matmul_cases()))
def test_int8_matmul(backend, case):
    require(backend)
    before = _snapshot(case.x, case.y)
    got = asickernels.int8_matmul(case.x, case.y, backend=backend, **case.kwargs())
    arrays = {"x": case.x, "y": case.y, "x_scale": case.x_scale, "y_scale": case.y_scale}
    want = oracle.expected("int8_matmul", arrays, {"out_dtype": case.out_dtype})
    assert got.dtype == np.dtype(
        case.out_dtype or (np.float32 if want.dtype == np.float64 else np.int32)
    )
    oracle.assert_agrees("int8_matmul", got, want)
    _assert_unchanged(before, [case.x, case.y])


@pytest.mark.parametrize(
    "backend", [b for b in backends_under_test("nms") if registry.backend(b).array_kind == "jax"]
)
def test_nms_under_jit_and_vmap(backend):
    require(backend)
    require_traceable(backend)
    case = next(c for c in nms_cases() if c.name == "batch_2x3")
    run = jax.jit(jax.vmap(lambda b, s: asickernels.nms(b, s, backend=backend, **case.kwargs())))
    indices, num_valid = run(case.boxes, case.scores)
    eager_idx, eager_n = asickernels.nms(
        case.boxes, case.scores, backend="reference", **case.kwargs()
    )
    np.testing.assert_array_equal(np.asarray(indices), np.asarray(eager_idx))
    np.testing.assert_array_equal(np.asarray(num_valid), np.asarray(eager_n))
