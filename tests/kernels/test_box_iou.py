"""Pairwise IoU/GIOU and paired DIoU/CIoU (+ gradients and losses): every backend against the
float64 reference, on random, ragged, empty and adversarial boxes."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest
from conftest import backends_under_test, require

import asickernels
from asickernels.estimates import compile_gate
from asickernels.kernels import registry
from asickernels.kernels.box_iou import (
    reference_ciou,
    reference_ciou_vjp,
    reference_diou,
    reference_generalized_box_iou,
    reference_metric_vjp,
    reference_pairwise,
)
from asickernels.kernels.box_iou_cases import pairwise_cases
from asickernels.kernels.cases import random_boxes
from asickernels.kernels.giou import reference_giou_vjp
from asickernels.kernels.giou_cases import giou_cases
from asickernels.simulate import tpu_compile

ATOL = 2e-5
GRAD_RTOL, GRAD_ATOL = 2e-4, 2e-5
PAIRWISE = (asickernels.box_iou, asickernels.generalized_box_iou)
METRICS = (asickernels.diou, asickernels.ciou)
# The 1024x256 case is GIOU's benchmark size: the conformance suite runs it for GIOU.
PAIRED_CASES = [c for c in giou_cases() if c.name != "random_1024x256"]


def _backends(kernel, jax_only=False):
    """Backends under test; TPU interpret mode (seconds per call) runs in the slow tier, and
    on one case per op in the fast tier (:func:`test_tpu_interpret_mode_on_adversarial_boxes`)."""
    names = backends_under_test(kernel)
    if jax_only:
        names = [b for b in names if registry.backend(b).array_kind == "jax"]
    return [
        pytest.param(b, marks=[pytest.mark.slow] if b == "pallas_tpu_interpret" else [])
        for b in names
    ]


def _refuses_float64(backend, kernel, boxes, call):
    """A backend without float64 refuses float64 boxes with a clear TypeError (nothing is
    silently computed in float32); returns whether it did."""
    if boxes.dtype == np.float64 and "float64" not in registry.support(kernel, backend).dtypes:
        with pytest.raises(TypeError, match="float64"):
            call()
        return True
    return False


def _ids(cases):
    return [c.name for c in cases]


def _tolerance(boxes):
    # bfloat16 boxes are exact in float32, so only the float32 arithmetic differs; the
    # "large_coords" boxes (1e4) lose ~1e-7 relative in their areas and centre distances.
    return 5e-5 if np.abs(np.asarray(boxes, np.float32)).max(initial=0) > 1e3 else ATOL


@pytest.mark.parametrize("op", PAIRWISE, ids=lambda op: op.name)
@pytest.mark.parametrize("backend", _backends(asickernels.box_iou))
@pytest.mark.parametrize("case", pairwise_cases(), ids=_ids(pairwise_cases()))
def test_pairwise(op, backend, case):
    require(backend)
    before = (case.boxes1.copy(), case.boxes2.copy())
    got = np.asarray(op(case.boxes1, case.boxes2, backend=backend))
    n, m = case.boxes1.shape[-2], case.boxes2.shape[-2]
    assert got.shape == case.boxes1.shape[:-2] + (n, m) and got.dtype == np.float32
    want = op.reference(case.boxes1, case.boxes2)
    np.testing.assert_allclose(got, want, atol=_tolerance(case.boxes1), rtol=0)
    np.testing.assert_array_equal(case.boxes1, before[0])
    np.testing.assert_array_equal(case.boxes2, before[1])


@pytest.mark.parametrize("op", METRICS, ids=lambda op: op.name)
@pytest.mark.parametrize("backend", _backends(asickernels.diou))
@pytest.mark.parametrize("case", PAIRED_CASES, ids=_ids(PAIRED_CASES))
def test_paired_metric(op, backend, case):
    require(backend)
    call = lambda: op(case.boxes1, case.boxes2, backend=backend)  # noqa: E731
    if _refuses_float64(backend, op, case.boxes1, call):
        return
    got = np.asarray(call())
    wide = case.boxes1.dtype == np.float64
    assert got.shape == case.boxes1.shape[:-1] and got.dtype == (np.float64 if wide else np.float32)
    want = op.reference(case.boxes1, case.boxes2)
    np.testing.assert_allclose(got, want, atol=1e-12 if wide else _tolerance(case.boxes1), rtol=0)
    assert np.all(np.isfinite(got)), "degenerate boxes must not give NaN"


@pytest.mark.parametrize("vjp", (asickernels.diou_vjp, asickernels.ciou_vjp), ids=lambda o: o.name)
@pytest.mark.parametrize("backend", _backends(asickernels.diou_vjp))
@pytest.mark.parametrize(
    "case",
    [c for c in PAIRED_CASES if c.boxes1.dtype != ml_dtypes.bfloat16],
    ids=_ids([c for c in PAIRED_CASES if c.boxes1.dtype != ml_dtypes.bfloat16]),
)
def test_metric_vjp(vjp, backend, case):
    require(backend)
    cotangent = np.random.default_rng(7).normal(size=case.boxes1.shape[:-1]).astype(np.float32)
    call = lambda: vjp(case.boxes1, case.boxes2, cotangent, backend=backend)  # noqa: E731
    if _refuses_float64(backend, vjp, case.boxes1, call):
        return
    d1, d2 = call()
    want1, want2 = vjp.reference(case.boxes1, case.boxes2, cotangent)
    # Gradients scale with 1 / box size: compare relative to the largest one.
    scale = max(1.0, np.abs(want1).max(initial=0), np.abs(want2).max(initial=0))
    np.testing.assert_allclose(np.asarray(d1), want1, rtol=GRAD_RTOL, atol=GRAD_ATOL * scale)
    np.testing.assert_allclose(np.asarray(d2), want2, rtol=GRAD_RTOL, atol=GRAD_ATOL * scale)


@pytest.mark.parametrize(
    "backend",
    [
        b
        for b in backends_under_test(asickernels.box_iou)
        if registry.backend(b).array_kind == "jax"
    ],
)
def test_pairwise_giou_jax_grad_is_the_paired_gradient_summed(backend):
    require(backend)
    rng = np.random.default_rng(2)
    a, b = random_boxes(rng, (2, 9)), random_boxes(rng, (2, 140))
    weights = rng.normal(size=(2, 9, 140))

    def loss(x, y):
        return (asickernels.generalized_box_iou(x, y, backend=backend) * weights).sum()

    d1, d2 = jax.grad(loss, argnums=(0, 1))(a, b)
    shape = weights.shape + (4,)
    w1, w2 = reference_giou_vjp(
        np.broadcast_to(a[:, :, None], shape), np.broadcast_to(b[:, None], shape), weights
    )
    np.testing.assert_allclose(np.asarray(d1), w1.sum(2), rtol=GRAD_RTOL, atol=1e-4)
    np.testing.assert_allclose(np.asarray(d2), w2.sum(1), rtol=GRAD_RTOL, atol=1e-4)


@pytest.mark.parametrize("backend", _backends(asickernels.diou, jax_only=True))
def test_ciou_loss_jax_grad_under_jit(backend):
    require(backend)
    rng = np.random.default_rng(4)
    preds, targets = random_boxes(rng, (37,)), random_boxes(rng, (37,))
    grad = jax.jit(jax.grad(lambda p: asickernels.ciou_loss(p, targets, backend=backend)))
    want, _ = reference_ciou_vjp(preds, targets, np.full(37, -1.0 / 37))
    np.testing.assert_allclose(np.asarray(grad(preds)), want, rtol=GRAD_RTOL, atol=GRAD_ATOL)


@pytest.mark.parametrize(
    "loss", (asickernels.diou_loss, asickernels.ciou_loss), ids=lambda o: o.name
)
@pytest.mark.parametrize("backend", _backends(asickernels.diou))
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_loss_masked_padding(loss, backend, reduction):
    """Padding (mask False) may hold NaN and zero boxes: it contributes exactly 0."""
    require(backend)
    rng = np.random.default_rng(3)
    preds = random_boxes(rng, (3, 21))
    targets = preds + rng.uniform(-0.5, 0.5, preds.shape).astype(np.float32)
    mask = rng.uniform(size=(3, 21)) < 0.6
    preds[~mask] = np.nan
    targets[~mask] = 0.0
    got = np.asarray(loss(preds, targets, mask=mask, reduction=reduction, backend=backend))
    want = loss.reference(preds, targets, mask=mask, reduction=reduction)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=ATOL)
    assert np.all(np.isfinite(got))


@pytest.mark.parametrize(
    "loss", (asickernels.diou_loss, asickernels.ciou_loss), ids=lambda o: o.name
)
def test_loss_gradient_is_zero_at_padding(loss):
    rng = np.random.default_rng(8)
    preds, targets = random_boxes(rng, (10,)), random_boxes(rng, (10,))
    mask = np.arange(10) < 6
    preds[~mask] = np.nan
    grad = np.asarray(jax.grad(lambda p: loss(p, targets, mask=mask, reduction="sum"))(preds))
    assert np.all(grad[~mask] == 0) and np.all(np.isfinite(grad))


@pytest.mark.parametrize("op", PAIRWISE + METRICS, ids=lambda op: op.name)
@pytest.mark.parametrize("backend", ["xla", "reference"])
def test_float64_is_computed_in_float64(op, backend):
    rng = np.random.default_rng(9)
    a = random_boxes(rng, (6,)).astype(np.float64) + 1e-9
    b = random_boxes(rng, (6,)).astype(np.float64)
    got = np.asarray(op(a, b, backend=backend))
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, op.reference(a, b), atol=1e-12, rtol=0)


def test_pairwise_giou_is_paired_giou_on_every_pair():
    rng = np.random.default_rng(10)
    a, b = random_boxes(rng, (5,)), random_boxes(rng, (8,))
    pairwise = np.asarray(asickernels.generalized_box_iou(a, b, backend="xla"))
    paired = np.asarray(asickernels.giou(np.repeat(a, 8, 0), np.tile(b, (5, 1)), backend="xla"))
    np.testing.assert_allclose(pairwise, paired.reshape(5, 8), atol=1e-6)


@pytest.mark.parametrize("metric", ["giou", "iou"])
def test_reference_gradient_matches_the_hand_written_giou_gradient_and_finite_differences(metric):
    """The forward-mode reference gradients agree with GIOU's hand-derived one and with
    central differences, so they can serve as the reference for DIoU and CIoU."""
    rng = np.random.default_rng(11)
    a, b = random_boxes(rng, (20,)).astype(np.float64), random_boxes(rng, (20,)).astype(np.float64)
    g = rng.normal(size=20)
    d1, d2 = reference_metric_vjp(metric, a, b, g)
    if metric == "giou":
        w1, w2 = reference_giou_vjp(a, b, g)
        np.testing.assert_allclose(d1, w1, atol=1e-12)
        np.testing.assert_allclose(d2, w2, atol=1e-12)
    step = 1e-6
    for k in range(4):
        shift = np.zeros(4)
        shift[k] = step
        up = reference_pairwise(metric, a + shift, b)
        down = reference_pairwise(metric, a - shift, b)
        numeric = (np.diagonal(up) - np.diagonal(down)) / (2 * step) * g
        np.testing.assert_allclose(d1[:, k], numeric, atol=1e-5)


def _aspect_term(x, y):
    """CIoU's ``v`` of paired boxes (the reference's formula)."""
    angle = np.arctan((y[:, 2] - y[:, 0]) / (y[:, 3] - y[:, 1] + 1e-7)) - np.arctan(
        (x[:, 2] - x[:, 0]) / (x[:, 3] - x[:, 1] + 1e-7)
    )
    return 4 / np.pi**2 * angle**2


@pytest.mark.parametrize("metric", ["diou", "ciou"])
def test_reference_gradient_of_diou_and_ciou_matches_finite_differences(metric):
    """CIoU's ``alpha`` is held constant: the differences are taken of ``diou - alpha * v``
    with ``alpha`` frozen at the unshifted boxes."""
    rng = np.random.default_rng(12)
    a, b = random_boxes(rng, (20,)).astype(np.float64), random_boxes(rng, (20,)).astype(np.float64)
    g = rng.normal(size=20)
    d1, d2 = reference_metric_vjp(metric, a, b, g)
    alpha = (reference_diou(a, b) - reference_ciou(a, b)) / _aspect_term(a, b)

    def value(x, y):
        if metric == "diou":
            return reference_diou(x, y)
        return reference_diou(x, y) - alpha * _aspect_term(x, y)

    step = 1e-6
    for side, grad in ((0, d1), (1, d2)):
        for k in range(4):
            shift = np.zeros(4)
            shift[k] = step
            up = value(a + shift, b) if side == 0 else value(a, b + shift)
            down = value(a - shift, b) if side == 0 else value(a, b - shift)
            np.testing.assert_allclose(grad[:, k], (up - down) / (2 * step) * g, atol=1e-5)


def test_bad_inputs_are_refused_before_any_kernel_runs():
    boxes = np.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match="same leading dims"):
        asickernels.box_iou(np.zeros((2, 3, 4), np.float32), np.zeros((3, 3, 4), np.float32))
    with pytest.raises(ValueError, match=r"\[..., 4\]"):
        asickernels.generalized_box_iou(np.zeros(4, np.float32), boxes)
    with pytest.raises(TypeError, match="floating"):
        asickernels.box_iou(boxes.astype(np.int32), boxes)
    with pytest.raises(ValueError, match="same shape"):
        asickernels.diou(boxes, np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match="reduction"):
        asickernels.ciou_loss(boxes, boxes, reduction="xyz")
    with pytest.raises(ValueError, match="cotangent"):
        asickernels.ciou_vjp(boxes, boxes, np.zeros(2, np.float32))


SMALL_SHAPES = tuple(
    compile_gate.KernelShape(name, shape, build)
    for name, shape, build in (
        (
            "giou_pairwise",
            "3x7x130",
            lambda: compile_gate._box_metric("generalized_box_iou", False, (3, 7, 4), (3, 130, 4)),
        ),
        (
            "box_iou_pairwise",
            "7x130",
            lambda: compile_gate._box_metric("box_iou", False, (7, 4), (130, 4)),
        ),
        (
            "ciou_backward",
            "1000 pairs",
            lambda: compile_gate._box_metric("ciou", True, (1000, 4), (1000, 4)),
        ),
    )
)


@pytest.mark.skipif(tpu_compile.libtpu_status() is not None, reason="libtpu is not installed")
@pytest.mark.parametrize(
    "generation",
    [
        pytest.param(g, marks=[] if g == "v5e" else [pytest.mark.slow])
        for g in compile_gate.GATE_GENERATIONS
    ],
)
def test_pallas_kernels_compile_for_tpu_at_ragged_shapes(generation):
    results = compile_gate.compile_all([generation], targets=SMALL_SHAPES)
    assert all(r.ok for r in results), compile_gate.format_table(results)


def test_spmd_wrappers_shard_the_batch_and_psum_the_loss():
    """The generated SPMD wrappers: pairwise GIOU per image on its device; the masked CIoU
    loss's sum and count psum-ed, so its mean (and gradient) is the global one."""
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    from asickernels.frontends import jax_spmd

    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    rng = np.random.default_rng(13)
    a, b, c = (random_boxes(rng, (4, n)) for n in (9, 13, 9))
    mask = rng.uniform(size=(4, 9)) < 0.7
    matrix = jax_spmd.generalized_box_iou(a, b, mesh=mesh, batch_spec=P("data"))
    assert matrix.sharding.spec == P("data")
    np.testing.assert_allclose(np.asarray(matrix), reference_generalized_box_iou(a, b), atol=ATOL)

    def loss(p):
        return jax_spmd.ciou_loss(p, c, mesh=mesh, batch_spec=P("data"), mask=mask)

    np.testing.assert_allclose(
        float(loss(a)), asickernels.ciou_loss.reference(a, c, mask=mask), rtol=1e-5
    )
    want, _ = reference_ciou_vjp(a, c, -mask.astype(np.float64) / mask.sum())
    np.testing.assert_allclose(np.asarray(jax.grad(loss)(a)), want, rtol=GRAD_RTOL, atol=GRAD_ATOL)
