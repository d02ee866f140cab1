"""The front of every op (asickernels.kernels.eager_front): the C route lookup and its
Python twin look up, miss and key alike, and the ops run the same on either."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import asickernels
from asickernels.kernels import eager_front
from asickernels.kernels.declaration import Op
from asickernels.testing.cases import random_boxes

FRONTS = [eager_front.PythonFront]
if eager_front.FRONT_KIND == "C":
    FRONTS.append(eager_front.Front)


def _recording(front: type) -> Any:
    """An instance of ``front`` whose misses are recorded and answered with "missed"."""

    class Recording(front):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self._numpy_routes = {}
            self.missed: list[tuple[Any, ...]] = []

        def _miss(self, numpy_key: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            self.missed.append((numpy_key, args, kwargs))
            return "missed"

    return Recording()


class _ShapeRaises:
    @property
    def shape(self) -> Any:
        raise ValueError("no shape today")


_DTYPES = [np.float32, np.float64, np.int32, np.int64, ml_dtypes.bfloat16, np.dtype(">f4")]
_arrays = st.builds(
    lambda shape, dtype: np.zeros(shape, dtype),
    st.lists(st.integers(0, 3), max_size=3).map(tuple),
    st.sampled_from(_DTYPES),
)
_JAX_ARRAYS = [jnp.zeros((2, 4)), jnp.zeros(3, jnp.int32), jnp.zeros(())]
_arguments = st.one_of(
    _arrays,
    st.sampled_from(_JAX_ARRAYS),
    st.none(),
    st.integers(),
    st.floats(allow_nan=False),
    st.booleans(),
    st.lists(st.integers(), max_size=2),  # no shape
)
_keywords = st.dictionaries(
    st.sampled_from(["iou_threshold", "max_output_size", "backend", "x"]),
    st.one_of(
        st.integers(),
        st.floats(allow_nan=False),
        st.booleans(),
        st.none(),
        st.sampled_from(["", "xla", "cpu"]),
        st.lists(st.integers(), max_size=2),
    ),
    max_size=3,
)


@pytest.mark.skipif(eager_front.FRONT_KIND != "C", reason=eager_front.UNAVAILABLE_REASON or "")
@given(args=st.lists(_arguments, max_size=4).map(tuple), kwargs=_keywords)
def test_the_c_key_is_the_python_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    assert eager_front.numpy_key(args, kwargs) == eager_front.python_numpy_key(args, kwargs)


@pytest.mark.parametrize("front", FRONTS)
def test_a_hit_calls_the_route_with_the_positional_arguments_only(front: type) -> None:
    op = _recording(front)
    a, b = np.zeros((2, 4), np.float32), np.ones(3, np.int64)
    key = eager_front.python_numpy_key((a, b), {"k": 1})
    op._numpy_routes[key] = lambda *given: ("route", given)
    assert op(a, b, k=1) == ("route", (a, b))
    assert op.missed == []
    # Another keyword value, its type (True == 1), their order, another dtype: other keys.
    for args, kwargs in [
        ((a, b), {"k": 2}),
        ((a, b), {"k": True}),
        ((a, b), {"k": 1.0}),
        ((a, b.astype(np.int32)), {"k": 1}),
        ((a, jnp.asarray(b)), {"k": 1}),
        ((a,), {"k": 1}),
    ]:
        assert op(*args, **kwargs) == "missed"
        assert op.missed[-1] == (eager_front.python_numpy_key(args, kwargs), args, kwargs)


@pytest.mark.parametrize("front", FRONTS)
def test_a_call_without_a_key_misses_with_none(front: type) -> None:
    op = _recording(front)
    a = np.zeros(3)
    assert op(a, [1, 2]) == "missed"  # a list has no shape
    assert op(a, k=[1]) == "missed"  # an unhashable keyword value
    assert op(a, None) == "missed"
    assert [m[0] for m in op.missed] == [None, None, None]
    assert op.missed[1][2] == {"k": [1]}
    with pytest.raises(ValueError, match="no shape today"):  # only those two errors mean "no key"
        op(a, _ShapeRaises())


@pytest.mark.parametrize("front", FRONTS)
def test_a_route_may_replace_the_routes_while_it_runs(front: type) -> None:
    op = _recording(front)
    a = np.zeros(3)

    def route(*given: Any) -> str:
        op._numpy_routes = {}
        return "ran"

    op._numpy_routes[eager_front.python_numpy_key((a,), {})] = route
    assert op(a) == "ran"
    assert op(a) == "missed"


@pytest.mark.skipif(eager_front.FRONT_KIND != "C", reason=eager_front.UNAVAILABLE_REASON or "")
def test_the_c_front_keeps_its_routes_in_a_dict() -> None:
    op = _recording(eager_front.Front)
    with pytest.raises(TypeError, match="must be a dict"):
        op._numpy_routes = [1]
    with pytest.raises(TypeError, match="must be a dict"):
        del op._numpy_routes


def test_ops_are_fronts_and_a_repeated_call_runs_no_python_of_the_op(monkeypatch) -> None:
    assert isinstance(asickernels.nms, eager_front.Front)
    rng = np.random.default_rng(0)
    a, b = random_boxes(rng, (5, 7)), random_boxes(rng, (5, 7))
    first = np.asarray(asickernels.giou(a, b))

    def no_python(*args: Any) -> Any:
        raise AssertionError("a repeated call went through Op._miss")

    monkeypatch.setattr(Op, "_miss", no_python)
    np.testing.assert_array_equal(np.asarray(asickernels.giou(a, b)), first)
    with pytest.raises(AssertionError, match="_miss"):
        asickernels.giou(a, b.astype(np.float64))


_SCRIPT = """
import json, numpy as np, asickernels
from asickernels.kernels import eager_front
from asickernels.testing.cases import random_boxes
rng = np.random.default_rng(1)
a, b = random_boxes(rng, (3, 9)), random_boxes(rng, (3, 9))
boxes, scores = random_boxes(rng, (40,), scale=32.0), rng.random(40).astype(np.float32)
calls = [lambda: asickernels.giou(a, b), lambda: asickernels.giou(a, b, backend="xla"),
         lambda: asickernels.nms(boxes, scores, iou_threshold=0.3, max_output_size=9)]
def plain(out):
    return [np.asarray(o).tolist() for o in (out if isinstance(out, tuple) else (out,))]
results = [plain(call()) for call in calls for _ in range(3)]
print(json.dumps({"front": eager_front.FRONT_KIND, "results": results}))
"""


def _run_script(env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_the_python_front_runs_the_ops_as_the_c_one_does() -> None:
    env = {k: v for k, v in os.environ.items() if k != eager_front.FRONT_ENV}
    python = _run_script({**env, eager_front.FRONT_ENV: "python"})
    assert python["front"] == "Python"
    default = _run_script(env)
    assert default["front"] == eager_front.FRONT_KIND
    assert python["results"] == default["results"]
