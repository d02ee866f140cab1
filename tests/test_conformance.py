"""The conformance suite: every op x every backend against the float64 reference, on
random, edge and adversarial inputs. A backend joins it by registering its op modules."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest
from conftest import backends_under_test, require

import asickernels
from asickernels import reference
from asickernels.backends.pallas_tpu import tuning
from asickernels.kernels import registry
from asickernels.kernels.giou import differentiable_backends
from asickernels.testing.cases import giou_cases, matmul_cases, nms_cases

GIOU_ATOL = 2e-5
GRAD_RTOL, GRAD_ATOL = 2e-4, 2e-5


def require_traceable(backend):
    """TPU interpret mode under jit needs jax >= 0.8; older JAX must refuse it clearly."""
    if backend == "pallas_tpu_interpret" and not tuning.tpu_interpret_traceable():
        boxes = np.zeros((3, 4), np.float32)
        with pytest.raises(NotImplementedError, match="cannot run under jit"):
            jax.jit(lambda b: asickernels.giou(b, b, backend=backend))(boxes)
        pytest.skip(f"TPU interpret mode cannot be traced with jax {jax.__version__}")


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
    got = asickernels.giou(case.boxes1, case.boxes2, backend=backend)
    assert got.shape == case.boxes1.shape[:-1] and got.dtype == np.float32
    np.testing.assert_allclose(
        np.asarray(got), reference.giou(case.boxes1, case.boxes2), atol=GIOU_ATOL, rtol=0
    )
    _assert_unchanged(before, [case.boxes1, case.boxes2])


@pytest.mark.parametrize("backend", [b for b in differentiable_backends() if b != "reference"])
@pytest.mark.parametrize(
    "case", _params([c for c in giou_cases() if c.boxes1.dtype != ml_dtypes.bfloat16])
)
def test_giou_gradient(backend, case):
    require(backend)
    rng = np.random.default_rng(7)
    cotangent = rng.normal(size=case.boxes1.shape[:-1]).astype(np.float32)
    d1, d2 = asickernels.giou_vjp(case.boxes1, case.boxes2, cotangent, backend=backend)
    want1, want2 = reference.giou_vjp(case.boxes1, case.boxes2, cotangent)
    np.testing.assert_allclose(np.asarray(d1), want1, rtol=GRAD_RTOL, atol=GRAD_ATOL)
    np.testing.assert_allclose(np.asarray(d2), want2, rtol=GRAD_RTOL, atol=GRAD_ATOL)


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
    d1, d2 = grad(case.boxes1, case.boxes2)
    want1, want2 = reference.giou_vjp(case.boxes1, case.boxes2, np.ones(257))
    np.testing.assert_allclose(np.asarray(d1), want1, rtol=GRAD_RTOL, atol=GRAD_ATOL)
    np.testing.assert_allclose(np.asarray(d2), want2, rtol=GRAD_RTOL, atol=GRAD_ATOL)


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
    want = reference.giou_loss(preds, targets, mask=mask, reduction=reduction)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=GIOU_ATOL)
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
    n = case.scores.shape[-1]
    batch = int(np.prod(batch_shape))
    want_idx, want_n = reference.nms(
        case.boxes.reshape(batch, n, 4),
        case.scores.reshape(batch, n),
        None if case.categories is None else case.categories.reshape(batch, n),
        iou_threshold=case.iou_threshold,
        max_output_size=case.max_output_size,
        score_threshold=-np.inf if case.score_threshold is None else case.score_threshold,
    )
    np.testing.assert_array_equal(np.asarray(indices).reshape(want_idx.shape), want_idx)
    np.testing.assert_array_equal(np.asarray(num_valid).reshape(want_n.shape), want_n)
    _assert_unchanged(before, [case.boxes, case.scores, case.categories])


@pytest.mark.parametrize("backend", backends_under_test("int8_matmul"))
@pytest.mark.parametrize("case", _params(matmul_cases()))
def test_int8_matmul(backend, case):
    require(backend)
    before = _snapshot(case.x, case.y)
    got = asickernels.int8_matmul(case.x, case.y, backend=backend, **case.kwargs())
    scaled = case.x_scale is not None or case.y_scale is not None or case.out_dtype is not None
    if not scaled:
        assert got.dtype == np.int32
        np.testing.assert_array_equal(np.asarray(got), reference.int8_matmul(case.x, case.y))
    else:
        out_dtype = np.dtype(case.out_dtype or np.float32)
        assert got.dtype == out_dtype
        m, n = case.x.shape[0], case.y.shape[1]
        xs = np.broadcast_to(np.float32(1) if case.x_scale is None else case.x_scale, (m,))
        ys = np.broadcast_to(np.float32(1) if case.y_scale is None else case.y_scale, (n,))
        want = reference.int8_matmul(case.x, case.y, x_scale=xs, y_scale=ys, out_dtype=np.float64)
        rtol = 1e-2 if out_dtype == ml_dtypes.bfloat16 else 1e-5
        np.testing.assert_allclose(np.asarray(got).astype(np.float64), want, rtol=rtol, atol=1e-6)
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
