"""The conformance suite: every op x every backend against the float64 reference, on
random, edge and adversarial inputs.

Every op's check cases (its cases module's workloads, ``kernels/<op>_cases.py``) run on
every backend implementing it by :func:`test_check_cases_agree_with_the_reference`, with
nothing to write here for a new op. Ops whose suites are written by hand (each suite's
``ops`` here, and the box metrics in ``test_box_iou.py``) test more than those cases (jit,
grad, dtypes, inputs left unmodified): one base class per kernel (:class:`GiouConformance`,
...) holds that kernel's whole suite, written against ``self.backend``; each backend runs it
by one subclass naming the kernels it implements (``class TestXla(GiouConformance,
NmsConformance, ...): backend = "xla"``).
:func:`test_every_backend_runs_the_suite_of_each_kernel_it_implements` keeps that list
complete: a backend registered for a kernel without its base here fails it."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest
from conftest import backends_under_test, require
from test_box_iou import METRICS, PAIRWISE

import asickernels
from asickernels.backends.pallas_tpu import lowering
from asickernels.benchmarking import harness
from asickernels.kernels import oracle, registry
from asickernels.kernels.case_tables import WORKLOADS
from asickernels.kernels.declaration import Op
from asickernels.kernels.giou_cases import giou_cases
from asickernels.kernels.int8_matmul_cases import matmul_cases
from asickernels.kernels.nms_cases import nms_cases
from asickernels.kernels.roi_cases import RoiCase, roi_cases


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


class Conformance:
    """What every kernel's suite shares: the backend under test (set by the subclass),
    skipped with the reason where it cannot run on this machine; each kernel's suite names
    the ops whose kernels it tests (``ops``)."""

    backend: str
    ops: tuple[Op, ...] = ()

    @pytest.fixture(autouse=True)
    def _runs_here(self):
        require(self.backend)

    def require_jax(self):
        """For tests of JAX transformations: skips host (numpy) backends."""
        if registry.backend(self.backend).array_kind != "jax":
            pytest.skip(f"{self.backend} runs on host numpy arrays: no jit/vmap/grad")
        require_traceable(self.backend)


class GiouConformance(Conformance):
    ops = (asickernels.giou,)

    @pytest.mark.parametrize("case", _params(giou_cases()))
    def test_giou(self, case):
        backend = self.backend
        before = _snapshot(case.boxes1, case.boxes2)
        call = lambda: asickernels.giou(case.boxes1, case.boxes2, backend=backend)  # noqa: E731
        if refuses_float64(backend, asickernels.giou, [case.boxes1], call):
            return
        got = call()
        wide = case.boxes1.dtype == np.float64
        assert got.shape == case.boxes1.shape[:-1]
        assert got.dtype == (np.float64 if wide else np.float32)
        want = oracle.expected(asickernels.giou, {"boxes1": case.boxes1, "boxes2": case.boxes2}, {})
        oracle.assert_agrees(asickernels.giou, got, want)
        _assert_unchanged(before, [case.boxes1, case.boxes2])

    def test_giou_jax_grad_and_jit(self):
        """``jax.grad`` through the public op, under ``jit``, equals the reference gradient."""
        self.require_jax()
        backend = self.backend
        case = next(c for c in giou_cases() if c.name == "random_257")
        grad = jax.jit(
            jax.grad(lambda a, b: asickernels.giou(a, b, backend=backend).sum(), argnums=(0, 1))
        )
        got = grad(case.boxes1, case.boxes2)
        arrays = {"boxes1": case.boxes1, "boxes2": case.boxes2, "cotangent": np.ones(257)}
        oracle.assert_agrees(
            asickernels.giou_vjp, got, oracle.expected(asickernels.giou_vjp, arrays, {})
        )

    @pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
    def test_giou_loss_masked_padding(self, reduction):
        """Padding (mask False) may hold NaN and zero boxes: it contributes exactly 0."""
        rng = np.random.default_rng(3)
        preds = rng.uniform(0, 5, (4, 37, 2)).astype(np.float32)
        preds = np.concatenate([preds, preds + 1], -1)
        targets = preds + rng.uniform(-0.5, 0.5, preds.shape).astype(np.float32)
        mask = rng.uniform(size=(4, 37)) < 0.6
        preds[~mask] = np.nan
        targets[~mask] = 0.0
        got = asickernels.giou_loss(
            preds, targets, mask=mask, reduction=reduction, backend=self.backend
        )
        arrays = {"preds": preds, "targets": targets, "mask": mask}
        want = oracle.expected(asickernels.giou_loss, arrays, {"reduction": reduction})
        oracle.assert_agrees(asickernels.giou_loss, got, want)
        assert np.all(np.isfinite(np.asarray(got)))

    def test_giou_loss_mean_with_no_valid_box_is_zero(self):
        boxes = np.full((3, 4), np.nan, np.float32)
        got = asickernels.giou_loss(boxes, boxes, mask=np.zeros(3, bool), backend=self.backend)
        assert float(got) == 0.0


class GiouVjpConformance(Conformance):
    ops = (asickernels.giou_vjp,)

    @pytest.mark.parametrize(
        "case", _params([c for c in giou_cases() if c.boxes1.dtype != ml_dtypes.bfloat16])
    )
    def test_giou_gradient(self, case):
        backend = self.backend
        rng = np.random.default_rng(7)
        cotangent = rng.normal(size=case.boxes1.shape[:-1]).astype(np.float32)
        call = lambda: asickernels.giou_vjp(  # noqa: E731
            case.boxes1, case.boxes2, cotangent, backend=backend
        )
        if refuses_float64(backend, asickernels.giou_vjp, [case.boxes1], call):
            return
        got = call()
        arrays = {"boxes1": case.boxes1, "boxes2": case.boxes2, "cotangent": cotangent}
        oracle.assert_agrees(
            asickernels.giou_vjp, got, oracle.expected(asickernels.giou_vjp, arrays, {})
        )


class NmsConformance(Conformance):
    ops = (asickernels.nms,)

    @pytest.mark.parametrize("case", _params(nms_cases()))
    def test_nms(self, case):
        backend = self.backend
        before = _snapshot(case.boxes, case.scores, case.categories)
        call = lambda: asickernels.nms(case.boxes, case.scores, backend=backend, **case.kwargs())  # noqa: E731
        if refuses_float64(backend, asickernels.nms, [case.boxes, case.scores], call):
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
        op = asickernels.nms if case.categories is None else asickernels.batched_nms
        arrays = {"boxes": case.boxes, "scores": case.scores}
        if case.categories is not None:
            arrays["idxs"] = case.categories
        want = oracle.expected(op, arrays, case.kwargs())
        oracle.assert_agrees(op, (indices, num_valid), want)
        _assert_unchanged(before, [case.boxes, case.scores, case.categories])

    def test_nms_under_jit_and_vmap(self):
        self.require_jax()
        backend = self.backend
        case = next(c for c in nms_cases() if c.name == "batch_2x3")
        run = jax.jit(
            jax.vmap(lambda b, s: asickernels.nms(b, s, backend=backend, **case.kwargs()))
        )
        indices, num_valid = run(case.boxes, case.scores)
        eager_idx, eager_n = asickernels.nms(
            case.boxes, case.scores, backend="reference", **case.kwargs()
        )
        np.testing.assert_array_equal(np.asarray(indices), np.asarray(eager_idx))
        np.testing.assert_array_equal(np.asarray(num_valid), np.asarray(eager_n))


class Int8MatmulConformance(Conformance):
    ops = (asickernels.int8_matmul,)

    @pytest.mark.parametrize("case", _params(matmul_cases()))
    def test_int8_matmul(self, case):
        before = _snapshot(case.x, case.y)
        got = asickernels.int8_matmul(case.x, case.y, backend=self.backend, **case.kwargs())
        arrays = {"x": case.x, "y": case.y, "x_scale": case.x_scale, "y_scale": case.y_scale}
        want = oracle.expected(asickernels.int8_matmul, arrays, {"out_dtype": case.out_dtype})
        assert got.dtype == np.dtype(
            case.out_dtype or (np.float32 if want.dtype == np.float64 else np.int32)
        )
        oracle.assert_agrees(asickernels.int8_matmul, got, want)
        _assert_unchanged(before, [case.x, case.y])


# Each RoI pooling op: its gradient op and its statics from a case.
_POOLING = {
    asickernels.roi_align: (asickernels.roi_align_vjp, RoiCase.align_statics),
    asickernels.roi_pool: (asickernels.roi_pool_vjp, RoiCase.pool_statics),
}


def _check_pooling(backend, op, case):
    """RoI pooling op ``op`` (``roi_align``, ``roi_pool``) on ``case`` against the
    reference: shape, dtype, values, inputs untouched."""
    statics = _POOLING[op][1](case)
    before = _snapshot(case.input, case.rois)
    call = lambda: op(case.input, case.rois, backend=backend, **statics)  # noqa: E731
    if refuses_float64(backend, op, [case.input], call):
        return
    got = call()
    assert got.shape == (len(case.rois), case.input.shape[1], *case.output_size)
    assert got.dtype == case.input.dtype
    want = oracle.expected(op, {"input": case.input, "rois": case.rois}, statics)
    oracle.assert_agrees(op, got, want)
    _assert_unchanged(before, [case.input, case.rois])


def _cotangent(case, seed):
    shape = (len(case.rois), case.input.shape[1], *case.output_size)
    return np.random.default_rng(seed).standard_normal(shape).astype(case.input.dtype)


def _check_pooling_gradient(backend, op, case):
    """The gradient op of ``op`` on ``case`` against the reference."""
    vjp, statics_of = _POOLING[op]
    statics = statics_of(case)
    cotangent = _cotangent(case, 8)
    call = lambda: vjp(case.input, case.rois, cotangent, backend=backend, **statics)  # noqa: E731
    if refuses_float64(backend, vjp, [case.input], call):
        return
    got = call()
    assert got.shape == case.input.shape and got.dtype == case.input.dtype
    arrays = {"input": case.input, "rois": case.rois, "cotangent": cotangent}
    oracle.assert_agrees(vjp, got, oracle.expected(vjp, arrays, statics))


def _check_pooling_jax_grad(backend, op):
    """``jax.grad`` of ``op`` under ``jit`` is the reference gradient."""
    vjp, statics_of = _POOLING[op]
    case = next(c for c in roi_cases() if c.name == "random_f32")
    statics = statics_of(case)
    cotangent = _cotangent(case, 9)
    loss = lambda x: (op(x, case.rois, backend=backend, **statics) * cotangent).sum()  # noqa: E731
    grad = jax.jit(jax.grad(loss))(case.input)
    arrays = {"input": case.input, "rois": case.rois, "cotangent": cotangent}
    oracle.assert_agrees(vjp, grad, oracle.expected(vjp, arrays, statics))


def _pooling_test(check, op):
    """A suite's test method: ``check`` (:func:`_check_pooling` or
    :func:`_check_pooling_gradient`) of RoI pooling op ``op`` on every RoI case."""

    @pytest.mark.parametrize("case", _params(roi_cases()))
    def test(self, case):
        check(self.backend, op, case)

    return test


class RoiAlignConformance(Conformance):
    """RoIAlign and its gradient (``roi_align_vjp``), which every backend has with it."""

    ops = (asickernels.roi_align, asickernels.roi_align_vjp)

    test_roi_align = _pooling_test(_check_pooling, asickernels.roi_align)
    test_roi_align_gradient = _pooling_test(_check_pooling_gradient, asickernels.roi_align)

    def test_roi_align_jax_grad_under_jit_and_vmap(self):
        """``jax.grad`` under ``jit`` is the reference gradient; ``vmap`` over a batch of
        feature maps is the op per map."""
        self.require_jax()
        _check_pooling_jax_grad(self.backend, asickernels.roi_align)
        case = next(c for c in roi_cases() if c.name == "random_f32")
        statics, backend = case.align_statics(), self.backend
        maps = np.stack([case.input, case.input[::-1]])
        batched = jax.jit(
            jax.vmap(lambda x: asickernels.roi_align(x, case.rois, backend=backend, **statics))
        )(maps)
        for got, x in zip(batched, maps, strict=True):
            want = oracle.expected(asickernels.roi_align, {"input": x, "rois": case.rois}, statics)
            oracle.assert_agrees(asickernels.roi_align, got, want)


class RoiPoolConformance(Conformance):
    """RoIPool and its argmax-routed gradient (``roi_pool_vjp``)."""

    ops = (asickernels.roi_pool, asickernels.roi_pool_vjp)

    test_roi_pool = _pooling_test(_check_pooling, asickernels.roi_pool)
    test_roi_pool_gradient = _pooling_test(_check_pooling_gradient, asickernels.roi_pool)

    def test_roi_pool_jax_grad_under_jit(self):
        self.require_jax()
        _check_pooling_jax_grad(self.backend, asickernels.roi_pool)


class RoiAlignNonFiniteConformance(Conformance):
    """NaN and infinities in the features and the cotangent give torchvision's results:
    for backends whose arithmetic could spread them (a product with a zero weight gives
    NaN); the others join once they take them as torchvision does."""

    def test_roi_align_and_gradient_take_non_finite_values_as_torchvision_does(self):
        """NaN where a NaN is sampled, an infinity is sampled with weight 0 (at the map's
        last row, or a sample on a pixel) or both infinities are; +-inf where one is; the
        rest exact, however many bins share the channel."""
        rng = np.random.default_rng(6)
        features = rng.standard_normal((2, 3, 7, 9)).astype(np.float32)
        features[0, 0, 2, 3] = np.nan
        features[0, 1, 4, 4] = np.inf
        features[0, 2, 0, 0], features[0, 2, 1, 0] = np.inf, -np.inf
        features[1, 1, 6, 2] = np.inf  # the last row: clamped samples weigh it 0 too
        features[1, 2, 6, 8] = -np.inf
        # Binary fractions: every sample position is exact in float32 (one on the pixel
        # lattice is in or out of a pixel by its last bit otherwise), some whole pixels.
        rois = np.array(
            [[0, 0.5, 0.5, 6.5, 4.5], [0, 2.0, 1.0, 6.0, 5.0], [1, 1.25, 4.25, 8.75, 7.75],
             [1, 0.0, 0.0, 8.0, 6.0], [0, 6.25, 6.25, 8.75, 8.75]],
            np.float32,
        )  # fmt: skip
        cotangent = rng.standard_normal((5, 3, 2, 2)).astype(np.float32)
        cotangent[0, 0, 0, 0], cotangent[1, 1, 1, 1] = np.nan, np.inf
        cotangent[2, 2, 0, 1], cotangent[3, 2, 1, 1] = -np.inf, np.inf
        statics = {"output_size": (2, 2), "spatial_scale": 1.0, "sampling_ratio": 2}
        arrays = {"input": features, "rois": rois, "cotangent": cotangent}
        got = asickernels.roi_align(features, rois, backend=self.backend, **statics)
        want = oracle.expected(asickernels.roi_align, {"input": features, "rois": rois}, statics)
        assert np.isnan(want).any() and np.isinf(want).any() and np.isfinite(want).any()
        oracle.assert_agrees(asickernels.roi_align, got, want)
        grad = asickernels.roi_align_vjp(**arrays, backend=self.backend, **statics)
        want = oracle.expected(asickernels.roi_align_vjp, arrays, statics)
        assert np.isnan(want).any() and np.isinf(want).any() and np.isfinite(want).any()
        oracle.assert_agrees(asickernels.roi_align_vjp, grad, want)


# -- the backends: one subclass each, naming the kernels it implements ----------------------


# The suites of the kernels that most backends implement; each adds its others.
COMMON_SUITES = (
    GiouConformance,
    GiouVjpConformance,
    NmsConformance,
    Int8MatmulConformance,
    RoiAlignConformance,
)


class TestXla(*COMMON_SUITES, RoiPoolConformance):
    backend = "xla"


class TestCpu(*COMMON_SUITES, RoiPoolConformance):
    backend = "cpu"


class TestPallasTpu(*COMMON_SUITES, RoiAlignNonFiniteConformance):
    backend = "pallas_tpu"


class TestPallasTpuInterpret(*COMMON_SUITES):
    backend = "pallas_tpu_interpret"


class TestGpsimd(GiouConformance, NmsConformance):
    backend = "gpsimd"


class TestNki(*COMMON_SUITES, RoiAlignNonFiniteConformance):
    backend = "nki"


# The suite of each op whose kernel has one here.
SUITES = {
    op: suite
    for suite in Conformance.__subclasses__()  # the kernels' suites, not the backends'
    for op in suite.ops
}


def test_every_backend_runs_the_suite_of_each_kernel_it_implements():
    tested = {
        cls.backend: cls
        for cls in globals().values()
        if isinstance(cls, type) and issubclass(cls, Conformance) and hasattr(cls, "backend")
    }
    for op, suite in SUITES.items():
        for backend in backends_under_test(op):
            assert issubclass(tested.get(backend, object), suite), (
                f"backend {backend!r} implements {op.name!r}: add {suite.__name__} to its "
                "Test class here"
            )


# The ops whose kernels are tested by a suite written by hand: here, and the box metrics
# in test_box_iou.py.
WRITTEN_BY_HAND = {*SUITES, *PAIRWISE, *METRICS}


@pytest.mark.parametrize(
    ("name", "backend"),
    [
        pytest.param(name, backend, marks=[pytest.mark.slow] if "interpret" in backend else [])
        for name, workload in WORKLOADS.items()
        if workload.op.kernel not in WRITTEN_BY_HAND
        for backend in backends_under_test(workload.op)
    ],
)
def test_check_cases_agree_with_the_reference(name, backend):
    """An op without a suite written by hand: its check cases on ``backend``, as
    ``asickernels check`` runs them (TPU interpret mode, seconds a call, in the slow tier)."""
    require(backend)
    rows = harness.check([name], [backend])
    assert rows and all(row.status in ("ok", "n/a") for row in rows), [
        (row.case, row.status, row.max_error, row.detail) for row in rows if row.status != "ok"
    ]
