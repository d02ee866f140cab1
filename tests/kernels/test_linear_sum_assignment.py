"""linear_sum_assignment on every backend against SciPy: the conformance cases (random,
degenerate, adversarial), hypothesis-drawn tied and masked matrices, jit/vmap, SciPy's
refusals (eager) and their sentinel (traced), and the argument checks."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from conftest import backends_under_test, require
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import asickernels
from asickernels.kernels import registry
from asickernels.kernels.linear_sum_assignment import assert_agrees
from asickernels.kernels.linear_sum_assignment_cases import lsa_cases

lsa = asickernels.linear_sum_assignment


def _params(cases, fast=None):
    """The cases as parameters: a case is slow if it says so or if ``fast`` (a set of names)
    leaves it out."""
    return [
        pytest.param(
            c,
            id=c.name,
            marks=[pytest.mark.slow] if c.slow or (fast is not None and c.name not in fast) else [],
        )
        for c in cases
    ]


def _decision_dtype(cost: np.ndarray) -> type:
    return np.float64 if cost.dtype == np.float64 else np.float32


def _refuses_float64(backend: str, cost: np.ndarray, call) -> bool:
    """A backend without float64 refuses float64 costs with a TypeError naming float64
    (nothing is silently decided in float32); whether it did."""
    supported = registry.support(asickernels.linear_sum_assignment, backend).dtypes
    if cost.dtype == np.float64 and "float64" not in supported:
        with pytest.raises(TypeError, match="float64"):
            call()
        return True
    return False


@st.composite
def tied_problems(draw):
    """Three images of small integer costs (many ties) in one ``[3, 7, 7]`` array (one
    compile per dtype): each image's own N x M (0 to 7 each) and random padding, as masks."""
    cost = draw(arrays(np.float64, (3, 7, 7), elements=st.integers(-3, 3).map(float)))
    sizes = draw(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), min_size=3, max_size=3))
    rows = np.arange(7)[None, :] < np.array([n for n, _ in sizes])[:, None]
    cols = np.arange(7)[None, :] < np.array([m for _, m in sizes])[:, None]
    rows &= draw(arrays(np.bool_, (3, 7), elements=st.booleans() | st.just(True)))
    cols &= draw(arrays(np.bool_, (3, 7), elements=st.booleans() | st.just(True)))
    return cost, rows, cols


# CI time: the native and reference backends run every case in the fast tier; XLA (a compile
# per case, about 1 s) runs FAST_CASES there and the rest in the slow tier; the Pallas kernel
# in interpret mode (about 1 s a case) runs PALLAS_CASES, FAST_CASES of them in the fast tier;
# TPU interpret mode (DMA and race checks, about 3 s a case) runs INTERPRET_CASES, slow.
FAST_CASES = frozenset({"random_3x7_float32", "detr_masked_targets", "ties_rectangular_f32"})
PALLAS_CASES = FAST_CASES | {
    "masked_rows_and_columns",
    "every_row_masked",
    "zero_rows",
    "forbidden_pairs_feasible",
    "anti_greedy",
}
INTERPRET_CASES = FAST_CASES | {"forbidden_pairs_feasible"}


def pytest_generate_tests(metafunc):
    """Each conformance class's ``test_case`` cases: ``cases`` (None: every case), ``fast`` of
    them in the fast tier (None: all)."""
    cls = metafunc.cls
    if metafunc.function.__name__ == "test_case" and issubclass(cls, LsaConformance):
        cases = [c for c in lsa_cases() if cls.cases is None or c.name in cls.cases]
        metafunc.parametrize("case", _params(cases, cls.fast))


class LsaConformance:
    backend: str
    cases: frozenset[str] | None = None  # None: every case
    fast: frozenset[str] | None = None  # None: every case in the fast tier

    @pytest.fixture(autouse=True)
    def _runs_here(self):
        require(self.backend)

    def test_case(self, case):
        before = [None if a is None else a.copy() for a in (case.cost, *case.kwargs().values())]
        call = lambda: lsa(case.cost, **case.kwargs(), backend=self.backend)  # noqa: E731
        if _refuses_float64(self.backend, case.cost, call):
            return
        got = call()
        assignment, count = got
        assert assignment.shape == case.cost.shape[:-1] and assignment.dtype == np.int32
        assert count.shape == case.cost.shape[:-2] and count.dtype == np.int32
        assert_agrees(
            case.cost, got, **case.kwargs(), dtype=_decision_dtype(case.cost), unique=case.unique
        )
        for old, new in zip(before, (case.cost, *case.kwargs().values()), strict=True):
            if old is not None:
                np.testing.assert_array_equal(new, old, err_msg="an input was modified")

    def _require_jax(self):
        if registry.backend(self.backend).array_kind != "jax":
            pytest.skip(f"{self.backend} runs on host numpy arrays: no jit/vmap")

    def test_under_jit_and_vmap(self):
        self._require_jax()
        case = next(c for c in lsa_cases() if c.name == "batch_2x3_f64")
        backend = self.backend
        cost = case.cost
        if "float64" not in registry.support(asickernels.linear_sum_assignment, backend).dtypes:
            cost = cost.astype(np.float32)
        with jax.enable_x64(True) if hasattr(jax, "enable_x64") else _x64():
            run = jax.jit(jax.vmap(lambda c: lsa(c, backend=backend)))
            got = run(cost)
        want = lsa(cost, backend="reference")
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))

    def test_traced_calls_give_the_sentinel_where_scipy_raises(self):
        """Under jit an image SciPy refuses (infeasible, NaN, -inf) gets -1 everywhere and a
        count of -1; the other images are solved."""
        self._require_jax()
        cost = np.tile(np.eye(4, dtype=np.float32)[None], (4, 1, 1))
        cost[1] = np.inf
        cost[1, :, 0] = 1.0  # every row can only take column 0
        cost[2, 1, 2] = np.nan
        cost[3, 0, 0] = -np.inf
        backend = self.backend
        assignment, count = jax.jit(lambda c: lsa(c, backend=backend))(cost)
        np.testing.assert_array_equal(np.asarray(count), [4, -1, -1, -1])
        np.testing.assert_array_equal(np.asarray(assignment)[1:], -1)
        assert sorted(np.asarray(assignment)[0].tolist()) == [0, 1, 2, 3]


def _x64():
    from jax.experimental import enable_x64  # type: ignore[attr-defined]  # jax < 0.8

    return enable_x64()


class TestXla(LsaConformance):
    backend = "xla"
    fast = FAST_CASES


class TestCpu(LsaConformance):
    backend = "cpu"

    @pytest.mark.parametrize("case", _params(lsa_cases()))
    def test_ties_resolve_as_scipy_resolves_them(self, case):
        """The native kernel is SciPy's algorithm in double: the same assignment, ties
        included."""
        got = lsa(case.cost, **case.kwargs(), backend="cpu")
        want = lsa(case.cost, **case.kwargs(), backend="reference")
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


class TestPallasTpu(LsaConformance):
    backend = "pallas_tpu"
    cases = PALLAS_CASES
    fast = FAST_CASES

    @pytest.mark.slow
    def test_under_jit_and_vmap(self):
        super().test_under_jit_and_vmap()

    @pytest.mark.slow
    def test_traced_calls_give_the_sentinel_where_scipy_raises(self):
        super().test_traced_calls_give_the_sentinel_where_scipy_raises()


class TestPallasTpuInterpret(LsaConformance):
    """pallas_tpu's kernel with TPU interpret mode's checks: its jit/vmap and sentinel
    behaviour are pallas_tpu's (tested there)."""

    backend = "pallas_tpu_interpret"
    cases = INTERPRET_CASES
    fast = frozenset()

    def test_under_jit_and_vmap(self):
        pytest.skip("pallas_tpu's kernel: tested as pallas_tpu")

    def test_traced_calls_give_the_sentinel_where_scipy_raises(self):
        pytest.skip("pallas_tpu's kernel: tested as pallas_tpu")


class TestReference(LsaConformance):
    backend = "reference"


def test_the_case_subsets_name_cases():
    assert {c.name for c in lsa_cases()} >= PALLAS_CASES >= INTERPRET_CASES


def test_every_backend_runs_the_suite():
    tested = {cls.backend for cls in globals().values()
              if isinstance(cls, type) and issubclass(cls, LsaConformance) and hasattr(cls, "backend")}  # fmt: skip
    for backend in backends_under_test(asickernels.linear_sum_assignment):
        assert backend in tested, (
            f"backend {backend!r} implements linear_sum_assignment: test it here"
        )


@pytest.mark.parametrize(
    "backend",
    [pytest.param(b, marks=[pytest.mark.slow] if b == "pallas_tpu" else [])
     for b in ["reference", *backends_under_test(asickernels.linear_sum_assignment)]
     if b != "pallas_tpu_interpret"],  # its kernel is pallas_tpu's: drawn there
)  # fmt: skip
@settings(max_examples=30, deadline=None)
@given(problem=tied_problems(), dtype=st.sampled_from([np.float32, np.float64]))
def test_tied_and_masked_matrices(backend, problem, dtype):
    require(backend)
    cost, row_mask, col_mask = problem
    cost = cost.astype(dtype)
    call = lambda: lsa(cost, row_mask=row_mask, col_mask=col_mask, backend=backend)  # noqa: E731
    if _refuses_float64(backend, cost, call):
        return
    got = call()
    assert_agrees(cost, got, row_mask=row_mask, col_mask=col_mask, dtype=dtype)


# -- SciPy's refusals on eager calls, and the argument checks ----------------------------------


@pytest.mark.parametrize(
    ("value", "match"),
    [(np.nan, "cost contains NaN"), (-np.inf, "cost contains -inf")],
)
def test_eager_calls_refuse_nan_and_minus_inf_as_scipy_does(value, match):
    cost = np.zeros((2, 3, 3))
    cost[1, 2, 0] = value
    with pytest.raises(ValueError, match=match + r" among its valid entries \(image 1\)"):
        lsa(cost)
    # Padding is not looked at.
    lsa(cost, row_mask=np.array([[True] * 3, [True, True, False]]))


def test_eager_calls_refuse_an_infeasible_matrix_as_scipy_does():
    cost = np.full((3, 2), np.inf)
    cost[0, 0] = 1.0  # two columns, but only row 0 may take any
    with pytest.raises(ValueError, match="cost is infeasible"):
        lsa(cost)
    from scipy.optimize import linear_sum_assignment as scipy_lsa

    with pytest.raises(ValueError, match="infeasible"):
        scipy_lsa(cost)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"cost": None}, TypeError, "cost must be an array"),
        ({"cost": np.zeros((3, 3), np.int32)}, TypeError, "cost must be a floating array"),
        ({"cost": np.zeros(3)}, ValueError, r"cost must have shape \[..., N, M\]"),
        ({"row_mask": np.ones(4, bool)}, ValueError, r"row_mask must have shape \(3,\)"),
        ({"col_mask": np.ones(5, np.int32)}, TypeError, "col_mask must be a bool array"),
    ],
)
def test_bad_arguments_are_refused_naming_them(kwargs, error, match):
    arguments = {"cost": np.zeros((3, 5))} | kwargs
    with pytest.raises(error, match=match):
        lsa(**arguments)
