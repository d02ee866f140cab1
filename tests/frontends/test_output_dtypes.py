"""The dtype every op returns, as docs/jax.md ("Output dtypes") and the docstrings state it:
decided by the op's declaration, so the same on every backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import asickernels as ak
from asickernels.kernels import registry
from asickernels.kernels.cases import random_boxes

F16, BF16, F32, F64 = (
    np.dtype(d) for d in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64)
)
I8, I32 = np.dtype(np.int8), np.dtype(np.int32)


def _metric(name: str) -> Callable[[np.dtype, np.dtype], Any]:
    return lambda a, b: getattr(ak, name)(_boxes(8, a), _boxes(8, b))


def _boxes(n: int, dtype: np.dtype) -> np.ndarray:
    return random_boxes(np.random.default_rng(n), (n,)).astype(dtype)


def _vjp(name: str) -> Callable[[np.dtype, np.dtype], Any]:
    return lambda a, b: getattr(ak, name)(_boxes(8, a), _boxes(8, b), np.ones(8, a))


def _features(dtype: np.dtype) -> np.ndarray:
    return np.random.default_rng(0).normal(size=(1, 3, 8, 8)).astype(dtype)


_ROIS = np.array([[0, 0.5, 0.5, 6, 5]])
_SCORES = np.linspace(0, 1, 8)

# op -> its call on two input dtypes: the boxes' (or features') and the other array's.
FLOAT_OUT: dict[str, Callable[[np.dtype, np.dtype], Any]] = {
    **{name: _metric(name) for name in ("giou", "diou", "ciou", "box_iou")},
    "generalized_box_iou": lambda a, b: ak.generalized_box_iou(_boxes(5, a), _boxes(6, b)),
    **{f"{m}_loss": _metric(f"{m}_loss") for m in ("giou", "diou", "ciou")},
    **{f"{m}_vjp": _vjp(f"{m}_vjp") for m in ("giou", "diou", "ciou")},
}
ROI_OUT: dict[str, Callable[[np.dtype, np.dtype], Any]] = {
    "roi_align": lambda a, b: ak.roi_align(_features(a), _ROIS.astype(b), 2),
    "roi_pool": lambda a, b: ak.roi_pool(_features(a), _ROIS.astype(b), 2),
    "roi_align_vjp": lambda a, b: ak.roi_align_vjp(
        _features(a), _ROIS.astype(b), np.ones((1, 3, 2, 2), a), 2
    ),
    "roi_pool_vjp": lambda a, b: ak.roi_pool_vjp(
        _features(a), _ROIS.astype(b), np.ones((1, 3, 2, 2), a), 2
    ),
}
INPUTS = [(F16, F16), (BF16, BF16), (F32, F32), (F64, F64), (F16, F64)]


def _dtypes(result: Any) -> list[np.dtype]:
    return [np.dtype(r.dtype) for r in (result if isinstance(result, tuple) else (result,))]


def _wide(a: np.dtype, b: np.dtype) -> np.dtype:
    """The documented float result: float64 if either input is float64, else float32."""
    return F64 if F64 in (a, b) else F32


@pytest.mark.parametrize(("a", "b"), INPUTS, ids=lambda d: d.name)
@pytest.mark.parametrize("op", FLOAT_OUT)
def test_box_metrics_return_float32_or_float64(op, a, b):
    """float16 and bfloat16 boxes are computed in float32 and come back float32."""
    got = _dtypes(FLOAT_OUT[op](a, b))
    assert got == [_wide(a, b)] * len(got), (op, a, b)


@pytest.mark.parametrize(("a", "b"), INPUTS, ids=lambda d: d.name)
@pytest.mark.parametrize("op", ROI_OUT)
def test_roi_ops_return_the_features_dtype(op, a, b):
    assert _dtypes(ROI_OUT[op](a, b)) == [a], (op, a, b)


@pytest.mark.parametrize("dtype", [F16, BF16, F32, F64], ids=lambda d: d.name)
def test_nms_returns_int32_and_quantize_int8_a_float32_scale(dtype):
    boxes, scores = _boxes(8, dtype), _SCORES.astype(dtype)
    assert _dtypes(ak.nms(boxes, scores, iou_threshold=0.5, max_output_size=4)) == [I32, I32]
    categories = np.arange(8) % 2
    got = ak.batched_nms(boxes, scores, categories, iou_threshold=0.5, max_output_size=4)
    assert _dtypes(got) == [I32, I32]
    x = np.random.default_rng(0).normal(size=(4, 8)).astype(dtype)
    assert _dtypes(ak.quantize_int8(x, axis=0)) == [I8, F32]


@pytest.mark.parametrize(
    ("kwargs", "want"),
    [
        ({}, I32),
        ({"out_dtype": np.int32}, I32),
        ({"x_scale": np.float32(2.0), "y_scale": np.float32(0.5)}, F32),
        ({"out_dtype": np.float16}, F16),
        ({"out_dtype": ml_dtypes.bfloat16}, BF16),
        ({"out_dtype": np.float64, "x_scale": np.ones(4), "y_scale": np.ones(3)}, F64),
    ],
)
def test_int8_matmul_returns_int32_or_out_dtype(kwargs, want):
    x, y = np.ones((4, 5), np.int8), np.ones((5, 3), np.int8)
    assert _dtypes(ak.int8_matmul(x, y, **kwargs)) == [want]


def test_the_declaration_decides_so_every_backend_agrees():
    """float16 boxes give float32 on each backend that runs GIOU here, and under jit."""
    boxes = _boxes(8, F16)
    available = ak.available_backends()
    ran = []
    for backend in registry.backends_for(ak.giou):
        if available[backend].mode != "missing":
            assert _dtypes(ak.giou(boxes, boxes, backend=backend)) == [F32], backend
            ran.append(backend)
    assert {"reference", "xla", "cpu"} <= set(ran)
    assert jax.jit(lambda b: ak.giou(b, b))(jnp.asarray(boxes)).dtype == F32
