"""The native CPU backend (asickernels.backends.cpu) against the float64 reference: both paths
of every kernel (JAX through XLA's FFI, and numpy arrays on the host, the same handler) on the
conformance cases, float64 and hidden-size/adversarial inputs, jit/vmap/grad, the handlers'
checks of their calls, and an ASan + UBSan build.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from conftest import run_pytest_sanitized

import asickernels
from asickernels import _native_build
from asickernels.backends.cpu import _library
from asickernels.backends.cpu import box_iou as cpu_box
from asickernels.backends.cpu import giou as cpu_giou
from asickernels.backends.cpu import int8_matmul as cpu_matmul
from asickernels.backends.cpu import nms as cpu_nms
from asickernels.kernels import box_iou as box_metrics
from asickernels.kernels.box_iou import (
    reference_generalized_box_iou,
    reference_metric_vjp,
    reference_pairwise,
)
from asickernels.kernels.box_iou_cases import pairwise_cases
from asickernels.kernels.cases import grid_boxes, random_boxes
from asickernels.kernels.eager import x64_scope
from asickernels.kernels.giou import reference_giou, reference_giou_vjp
from asickernels.kernels.giou_cases import giou_cases
from asickernels.kernels.int8_matmul import reference_int8_matmul
from asickernels.kernels.int8_matmul_cases import matmul_cases
from asickernels.kernels.nms import greedy_nms
from asickernels.kernels.nms_cases import nms_cases

GIOU_ATOL = 2e-5
GRAD_RTOL, GRAD_ATOL = 2e-4, 2e-5

pytestmark = pytest.mark.skipif(
    _library.unavailable_reason() is not None, reason=str(_library.unavailable_reason())
)


def _params(cases):
    return [
        pytest.param(c, id=c.name, marks=[pytest.mark.slow] if getattr(c, "slow", False) else [])
        for c in cases
    ]


def _entry_points(fn):
    """Both paths of a kernel as ``entry``: jitted (XLA), its outputs as numpy; and called
    on numpy arrays (the host)."""

    def run_jax(*args, **kwargs):
        out = jax.jit(lambda *a: fn(*a, **kwargs))(*args)
        return jax.tree.map(np.asarray, out)

    return pytest.mark.parametrize("entry", [run_jax, fn], ids=["jax", "host"])


def _copies(*arrays):
    return [None if a is None else np.array(a, copy=True) for a in arrays]


def _assert_unchanged(before, arrays):
    for old, new in zip(before, arrays, strict=True):
        if old is not None:
            np.testing.assert_array_equal(np.asarray(new), old)


# -- GIOU ----------------------------------------------------------------------------------


_GIOU_CASES = [c for c in giou_cases() if c.boxes1.size]


@_entry_points(cpu_giou.giou)
@pytest.mark.parametrize("case", _params(_GIOU_CASES))
def test_giou(entry, case):
    b1, b2 = case.boxes1.reshape(-1, 4), case.boxes2.reshape(-1, 4)
    before = _copies(b1, b2)
    wide = b1.dtype == np.float64  # decided in float64, JAX's x64 mode on for the call
    with x64_scope(wide):
        got = entry(b1, b2)
    assert got.dtype == (np.float64 if wide else np.float32) and got.shape == b1.shape[:-1]
    np.testing.assert_allclose(got, reference_giou(b1, b2), atol=GIOU_ATOL, rtol=0)
    _assert_unchanged(before, [b1, b2])


@_entry_points(cpu_giou.giou_vjp)
@pytest.mark.parametrize("case", _params([c for c in _GIOU_CASES if c.boxes1.dtype == np.float32]))
def test_giou_vjp(entry, case):
    b1, b2 = case.boxes1.reshape(-1, 4), case.boxes2.reshape(-1, 4)
    cotangent = np.random.default_rng(7).normal(size=b1.shape[0]).astype(np.float32)
    d1, d2 = entry(b1, b2, cotangent)
    want1, want2 = reference_giou_vjp(b1, b2, cotangent)
    np.testing.assert_allclose(d1, want1, rtol=GRAD_RTOL, atol=GRAD_ATOL)
    np.testing.assert_allclose(d2, want2, rtol=GRAD_RTOL, atol=GRAD_ATOL)


def test_giou_grad_under_jit_and_vmap():
    """``jax.grad`` goes through the custom_vjp (the native backward kernel); vmap adds a
    batch dimension the kernels flatten."""
    case = next(c for c in giou_cases() if c.name == "random_257")
    grad = jax.jit(jax.grad(lambda a, b: cpu_giou.giou(a, b).sum(), argnums=(0, 1)))
    d1, d2 = grad(case.boxes1, case.boxes2)
    want1, want2 = reference_giou_vjp(case.boxes1, case.boxes2, np.ones(257))
    np.testing.assert_allclose(np.asarray(d1), want1, rtol=GRAD_RTOL, atol=GRAD_ATOL)
    np.testing.assert_allclose(np.asarray(d2), want2, rtol=GRAD_RTOL, atol=GRAD_ATOL)
    # One argument differentiated (predictions against targets): boxes1 runs the kernel
    # that writes only boxes1's gradient; boxes2 alone the full one.
    only1 = jax.jit(jax.grad(lambda a, b: cpu_giou.giou(a, b).sum()))(case.boxes1, case.boxes2)
    only2 = jax.jit(jax.grad(lambda a, b: cpu_giou.giou(a, b).sum(), argnums=1))(
        case.boxes1, case.boxes2
    )
    np.testing.assert_allclose(np.asarray(only1), want1, rtol=GRAD_RTOL, atol=GRAD_ATOL)
    np.testing.assert_allclose(np.asarray(only2), want2, rtol=GRAD_RTOL, atol=GRAD_ATOL)
    stacked1 = np.stack([case.boxes1, case.boxes2])
    stacked2 = np.stack([case.boxes2, case.boxes1])
    got = jax.jit(jax.vmap(cpu_giou.giou))(stacked1, stacked2)
    np.testing.assert_allclose(
        np.asarray(got), reference_giou(stacked1, stacked2), atol=GIOU_ATOL, rtol=0
    )


def test_giou_float64_is_computed_in_float64():
    rng = np.random.default_rng(5)
    b1 = grid_boxes(rng, (130,)).astype(np.float64) * 1.000001 + 1e6
    b2 = b1 + rng.uniform(-1, 1, b1.shape)
    cotangent = rng.normal(size=130)
    want = reference_giou(b1, b2)
    want1, want2 = reference_giou_vjp(b1, b2, cotangent)
    host = cpu_giou.giou(b1, b2)
    assert host.dtype == np.float64
    np.testing.assert_allclose(host, want, rtol=0, atol=1e-9)
    # float32 cannot: the 1e6 offset leaves about 0.06 of resolution on each coordinate.
    assert np.abs(cpu_giou.giou(b1.astype(np.float32), b2.astype(np.float32)) - want).max() > 1e-4
    d1, d2 = cpu_giou.giou_vjp(b1, b2, cotangent)
    np.testing.assert_allclose(d1, want1, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(d2, want2, rtol=1e-9, atol=1e-12)
    with x64_scope(True):
        got = jax.jit(cpu_giou.giou)(b1, b2)
        assert got.dtype == np.float64
        np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-9)
        grads = jax.jit(jax.grad(lambda a, b: (cpu_giou.giou(a, b) * cotangent).sum(), (0, 1)))
        g1, g2 = grads(b1, b2)
        np.testing.assert_allclose(np.asarray(g1), want1, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(np.asarray(g2), want2, rtol=1e-9, atol=1e-12)


# -- IoU, GIOU (pairwise), DIoU, CIoU -------------------------------------------------------

_PAIRWISE = {"box_iou": "iou", "generalized_box_iou": "giou"}
_PAIRED = ("diou", "ciou")


def _box_tolerance(boxes):
    # float32 loses ~1e-7 relative in the areas and centre distances of the 1e4 boxes.
    return 5e-5 if np.abs(np.asarray(boxes, np.float32)).max(initial=0) > 1e3 else GIOU_ATOL


def _images(boxes):
    """``[..., N, 4]`` as ``[B, N, 4]`` (B = 1 for one image; N may be 0)."""
    return boxes.reshape((int(np.prod(boxes.shape[:-2])), *boxes.shape[-2:]))


def _pairwise_reference_vjp(metric, boxes1, boxes2, cotangent):
    """The reference gradient of ``sum(cotangent [B, N, M] * metric)``: the paired one on
    every pair, summed over the other side's boxes."""
    d1, d2 = reference_metric_vjp(
        metric, boxes1[..., :, None, :], boxes2[..., None, :, :], cotangent
    )
    return d1.sum(-2), d2.sum(-3)


@pytest.mark.parametrize("entry", ["jax", "host"])
@pytest.mark.parametrize("op", list(_PAIRWISE))
@pytest.mark.parametrize("case", _params(pairwise_cases()))
def test_pairwise_box_metric(entry, op, case):
    """``[B, N, 4] x [B, M, 4]``, N or M possibly 0, every adversarial pair, bfloat16 in."""
    b1, b2 = _images(case.boxes1), _images(case.boxes2)
    before = _copies(b1, b2)
    fn = getattr(cpu_box, op)
    got = np.asarray(jax.jit(fn)(b1, b2)) if entry == "jax" else fn(b1, b2)
    want = reference_pairwise(_PAIRWISE[op], b1, b2)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=_box_tolerance(b1), rtol=0)
    _assert_unchanged(before, [b1, b2])


@pytest.mark.parametrize("op", list(_PAIRWISE))
@pytest.mark.parametrize("name", ["batch_3x9x20", "adversarial_all_pairs", "n_zero", "m_zero"])
def test_pairwise_box_metric_grad_under_jit(op, name):
    """``jax.grad`` of the public op on the cpu backend runs the native pairwise gradient
    kernel (ties at the adversarial pairs follow the reference's rules)."""
    case = next(c for c in pairwise_cases() if c.name == name)
    b1, b2 = case.boxes1, case.boxes2
    weights = np.random.default_rng(4).normal(size=b1.shape[:-1] + b2.shape[-2:-1])
    public = getattr(asickernels, op)
    grad = jax.jit(jax.grad(lambda a, b: (public(a, b, backend="cpu") * weights).sum(), (0, 1)))
    d1, d2 = grad(b1, b2)
    want1, want2 = _pairwise_reference_vjp(_PAIRWISE[op], b1, b2, weights)
    scale = max(1.0, np.abs(want1).max(initial=0), np.abs(want2).max(initial=0))
    np.testing.assert_allclose(np.asarray(d1), want1, rtol=GRAD_RTOL, atol=GRAD_ATOL * scale)
    np.testing.assert_allclose(np.asarray(d2), want2, rtol=GRAD_RTOL, atol=GRAD_ATOL * scale)


def test_pairwise_box_metric_vmap_and_large_parallel_sizes():
    """vmap adds an image dimension the kernels treat as a batch; 300 x 520 pairs per image
    split into several row chunks on the thread pool (the gradient sums their partials)."""
    rng = np.random.default_rng(9)
    b1, b2 = random_boxes(rng, (2, 3, 300)), random_boxes(rng, (2, 3, 520))
    got = jax.jit(jax.vmap(cpu_box.generalized_box_iou))(b1, b2)
    np.testing.assert_allclose(
        np.asarray(got), reference_generalized_box_iou(b1, b2), atol=GIOU_ATOL, rtol=0
    )
    weights = rng.normal(size=(2, 3, 300, 520))
    loss = lambda a, b: (jax.vmap(cpu_box.box_iou)(a, b) * weights).sum()  # noqa: E731
    d1, d2 = jax.jit(jax.grad(loss, (0, 1)))(b1, b2)
    want1, want2 = _pairwise_reference_vjp("iou", b1, b2, weights)
    np.testing.assert_allclose(np.asarray(d1), want1, rtol=GRAD_RTOL, atol=GRAD_ATOL * 10)
    np.testing.assert_allclose(np.asarray(d2), want2, rtol=GRAD_RTOL, atol=GRAD_ATOL * 10)


_PAIRED_CASES = [c for c in giou_cases() if c.boxes1.size]


@pytest.mark.parametrize("entry", ["jax", "host"])
@pytest.mark.parametrize("metric", _PAIRED)
@pytest.mark.parametrize("case", _params(_PAIRED_CASES))
def test_paired_box_metric(entry, metric, case):
    b1, b2 = case.boxes1.reshape(-1, 4), case.boxes2.reshape(-1, 4)
    before = _copies(b1, b2)
    wide = b1.dtype == np.float64
    with x64_scope(wide):
        if entry == "jax":
            got = np.asarray(jax.jit(getattr(cpu_box, metric))(b1, b2))
        else:
            got = getattr(cpu_box, metric)(b1, b2)
    assert got.dtype == (np.float64 if wide else np.float32) and got.shape == b1.shape[:-1]
    want = getattr(box_metrics, f"reference_{metric}")(b1, b2)
    np.testing.assert_allclose(got, want, atol=1e-12 if wide else _box_tolerance(b1), rtol=0)
    assert np.all(np.isfinite(got)), "degenerate boxes must not give NaN"
    _assert_unchanged(before, [b1, b2])


@pytest.mark.parametrize("entry", ["jax", "host"])
@pytest.mark.parametrize("metric", _PAIRED)
@pytest.mark.parametrize(
    "case", _params([c for c in _PAIRED_CASES if c.boxes1.dtype != ml_dtypes.bfloat16])
)
def test_paired_box_metric_vjp(entry, metric, case):
    b1, b2 = case.boxes1.reshape(-1, 4), case.boxes2.reshape(-1, 4)
    wide = b1.dtype == np.float64
    cotangent = np.random.default_rng(7).normal(size=b1.shape[0]).astype(b1.dtype)
    with x64_scope(wide):
        if entry == "jax":
            d1, d2 = jax.jit(getattr(cpu_box, f"{metric}_vjp"))(b1, b2, cotangent)
        else:
            d1, d2 = getattr(cpu_box, f"{metric}_vjp")(b1, b2, cotangent)
    want1, want2 = getattr(box_metrics, f"reference_{metric}_vjp")(b1, b2, cotangent)
    assert np.asarray(d1).dtype == b1.dtype
    # Gradients scale with 1 / box size: compare relative to the largest one.
    scale = max(1.0, np.abs(want1).max(initial=0), np.abs(want2).max(initial=0))
    rtol, atol = (1e-9, 1e-12) if wide else (GRAD_RTOL, GRAD_ATOL)
    np.testing.assert_allclose(np.asarray(d1), want1, rtol=rtol, atol=atol * scale)
    np.testing.assert_allclose(np.asarray(d2), want2, rtol=rtol, atol=atol * scale)


@pytest.mark.parametrize("metric", _PAIRED)
def test_paired_box_metric_grad_under_jit_and_vmap(metric):
    """``jax.grad`` through the public op (and its loss) on the cpu backend: the native
    backward kernel, with boxes1's alone when only it is differentiated; vmap batches."""
    case = next(c for c in giou_cases() if c.name == "random_257")
    b1, b2 = case.boxes1, case.boxes2
    cotangent = np.random.default_rng(3).normal(size=257)
    public = getattr(asickernels, metric)
    loss = lambda a, b: (public(a, b, backend="cpu") * cotangent).sum()  # noqa: E731
    want1, want2 = getattr(box_metrics, f"reference_{metric}_vjp")(b1, b2, cotangent)
    d1, d2 = jax.jit(jax.grad(loss, (0, 1)))(b1, b2)
    only1 = jax.jit(jax.grad(loss))(b1, b2)
    only2 = jax.jit(jax.grad(loss, 1))(b1, b2)
    for got, want in ((d1, want1), (d2, want2), (only1, want1), (only2, want2)):
        np.testing.assert_allclose(np.asarray(got), want, rtol=GRAD_RTOL, atol=GRAD_ATOL)
    public_loss = getattr(asickernels, f"{metric}_loss")
    mean_grad = jax.jit(jax.grad(lambda a: public_loss(a, b2, backend="cpu")))(b1)
    np.testing.assert_allclose(np.asarray(mean_grad), -want1 / cotangent[:, None] / 257, rtol=1e-3)
    stacked1, stacked2 = np.stack([b1, b2]), np.stack([b2, b1])
    got = jax.jit(jax.vmap(getattr(cpu_box, metric)))(stacked1, stacked2)
    want = getattr(box_metrics, f"reference_{metric}")(stacked1, stacked2)
    np.testing.assert_allclose(np.asarray(got), want, atol=GIOU_ATOL, rtol=0)


@pytest.mark.parametrize("op", ["box_iou", "generalized_box_iou", "diou", "ciou"])
def test_box_metrics_float64_are_computed_in_float64(op):
    rng = np.random.default_rng(5)
    b1 = grid_boxes(rng, (1, 130)).astype(np.float64) * 1.000001 + 1e6
    b2 = b1 + rng.uniform(-1, 1, b1.shape)
    if op in _PAIRED:
        b1, b2 = b1[0], b2[0]
    want = getattr(box_metrics, f"reference_{op}")(b1, b2)
    host = getattr(cpu_box, op)(b1, b2)
    assert host.dtype == np.float64
    np.testing.assert_allclose(host, want, rtol=0, atol=1e-9)
    # float32 cannot: the 1e6 offset leaves about 0.06 of resolution on each coordinate.
    rounded = getattr(cpu_box, op)(b1.astype(np.float32), b2.astype(np.float32))
    assert np.abs(rounded - want).max() > 1e-4
    with x64_scope(True):
        got = jax.jit(getattr(cpu_box, op))(b1, b2)
        assert got.dtype == np.float64
        np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-9)


_BOXES = np.array([[[0, 0, 2, 2], [1, 1, 3, 3]]], np.float32)
_SCORES = np.array([[0.9, 0.8]], np.float32)
_NMS_RESULTS = [((1, 2), np.int32), ((1,), np.int32)]
_NMS_STATICS = {"iou_threshold": 0.5, "max_output_size": 2, "score_threshold": 0.0}


@pytest.mark.parametrize("entry", ["jax", "host"])
@pytest.mark.parametrize(
    "kernel, arrays, results, statics, message",
    [
        ("nms", (_BOXES, _SCORES), _NMS_RESULTS, _NMS_STATICS, None),
        ("paired_box_metric", (_BOXES[0], _BOXES[0]), [((2,), np.float32)], {"metric": "xiou"},
         "iou, giou, diou or ciou expected, got xiou"),
        ("nms", (_BOXES, _SCORES), _NMS_RESULTS, {**_NMS_STATICS, "score_threshold": None},
         "attribute of type NoneType"),
        ("nms", (_BOXES, _SCORES), _NMS_RESULTS, {"iou_threshold": 0.5, "max_output_size": 2},
         "Wrong number of attributes"),
        ("nms", (_BOXES, _SCORES), _NMS_RESULTS, {**_NMS_STATICS, "max_output_size": 2.0},
         "Wrong scalar data type: expected S64 but got F64"),
        ("nms", (_BOXES, _SCORES), _NMS_RESULTS, {**_NMS_STATICS, "iou": 0.5},
         "Wrong number of attributes"),
        ("nms", (_BOXES.astype(np.float64), _SCORES), _NMS_RESULTS, _NMS_STATICS,
         "Wrong buffer dtype: expected F64 but got F32"),
        ("nms", (_BOXES.astype(np.int32), _SCORES), _NMS_RESULTS, _NMS_STATICS,
         "nms: float32 or float64 expected, got S32"),
        ("nms", (_BOXES,), _NMS_RESULTS, _NMS_STATICS, "Wrong number of arguments"),
        ("nms", (_BOXES, _SCORES), [((1, 3), np.int32), ((1,), np.int32)], _NMS_STATICS,
         "indices or num_valid of the wrong size"),
        ("roi_pool", (np.ones((1, 1, 4, 4), np.float32), np.array([[2, 0, 0, 1, 1]], np.float32)),
         [((1, 1, 2, 2), np.float32)], {"output_size": (2, 2), "spatial_scale": 1.0},
         r"rois\[:, 0\] must be image indices"),
        ("roi_pool", (np.ones((1, 1, 4, 4), np.float32), np.array([[0, 0, 0, 1, 1]], np.float32)),
         [((1, 1, 2, 2), np.float32)], {"output_size": (2.0, 2.0), "spatial_scale": 1.0},
         "output_size: a native kernel takes no attribute of type tuple"),
    ],
    ids=["valid", "metric", "none", "missing", "type", "unknown", "dtypes", "int", "arity",
         "result_shape", "roi_image", "float_tuple"],
)  # fmt: skip
def test_a_handler_refuses_a_malformed_call_on_either_path(
    entry, kernel, arrays, results, statics, message
):
    """Each kernel's handler checks its call (XLA's decoding: counts, element types,
    attribute names and types; the handler: shapes and values), on the host as under XLA."""
    if entry == "host":
        call = lambda: _library.call(kernel, arrays, results, **statics)  # noqa: E731
        error = _library.NativeCpuError
    else:
        jitted = jax.jit(lambda *a: _library.call(kernel, a, results, **statics))
        call = lambda: jax.block_until_ready(jitted(*arrays))  # noqa: E731
        error = Exception
    with x64_scope(True):
        if message is None:
            indices, num_valid = call()
            np.testing.assert_array_equal(np.asarray(indices), [[0, 1]])
            np.testing.assert_array_equal(np.asarray(num_valid), [2])
            return
        if "attribute of type" in message:  # refused in Python, on either path
            error = TypeError
        with pytest.raises(error, match=message):
            call()


_STATICS_SOURCE = """
#include "csrc/kernels.h"
struct Statics {
  double iou_threshold;
  int64_t max_output_size;
  double score_threshold;
};
AK_ATTRIBUTES(Statics, %s);
"""


@pytest.mark.slow
@pytest.mark.skipif(_native_build.compiler() is None, reason="needs a C++ compiler")
@pytest.mark.parametrize(
    "fields, compiles",
    [
        ("iou_threshold, max_output_size, score_threshold", True),
        ("iou_threshold, max_output_size", False),  # would leave score_threshold 0
        ("score_threshold, max_output_size, iou_threshold", False),  # would swap two doubles
        ("iou_threshold, iou_threshold, score_threshold", False),
    ],
    ids=["every_field", "one_missing", "reordered", "repeated"],
)
def test_a_statics_struct_is_registered_with_every_field_in_order(tmp_path, fields, compiles):
    """AK_ATTRIBUTES builds a handler's statics struct from the attributes it lists, in
    order: a list that misses, repeats or reorders a field (two doubles swapped would
    compile and run silently wrong) must not compile."""
    source = tmp_path / "statics.cpp"
    source.write_text(_STATICS_SOURCE % fields)
    command = [
        *_native_build.require_compiler("the statics check"), "-std=c++17", "-fsyntax-only",
        "-I", str(Path(_library.__file__).parent), "-isystem", jax.ffi.include_dir(), str(source),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert (result.returncode == 0) == compiles, result.stderr[-2000:]
    if not compiles:
        assert "must list every field, in declaration order" in result.stderr


# -- NMS -----------------------------------------------------------------------------------


def _reference_nms(boxes, scores, categories, **kwargs):
    with np.errstate(invalid="ignore"):  # infinite boxes: the reference masks them after
        return greedy_nms(boxes, scores, categories, **kwargs)


def _nms_inputs(case):
    n = case.scores.shape[-1]
    batch = int(np.prod(case.scores.shape[:-1]))
    categories = None if case.categories is None else case.categories.reshape(batch, n)
    kwargs = {
        "iou_threshold": case.iou_threshold,
        "max_output_size": case.max_output_size,
        "score_threshold": -np.inf if case.score_threshold is None else case.score_threshold,
    }
    return case.boxes.reshape(batch, n, 4), case.scores.reshape(batch, n), categories, kwargs


_NMS_CASES = [c for c in nms_cases() if c.scores.size and c.max_output_size]


@_entry_points(cpu_nms.nms)
@pytest.mark.parametrize("case", _params(_NMS_CASES))
def test_nms(entry, case):
    boxes, scores, categories, kwargs = _nms_inputs(case)
    if categories is not None:  # dense int32 ranks, as the op layer passes them
        categories = np.unique(categories, return_inverse=True)[1].reshape(categories.shape)
        categories = categories.astype(np.int32)
    before = _copies(boxes, scores, categories)
    with x64_scope(boxes.dtype == np.float64):
        indices, num_valid = entry(boxes, scores, categories, **kwargs)
    want_indices, want_count = _reference_nms(boxes, scores, categories, **kwargs)
    assert indices.dtype == np.int32 and num_valid.dtype == np.int32
    np.testing.assert_array_equal(indices, want_indices)
    np.testing.assert_array_equal(num_valid, want_count)
    _assert_unchanged(before, [boxes, scores, categories])


def _random_nms_problem(seed: int, n: int, dtype=np.float32):
    """Off-grid boxes (IoUs are not exact in float32: the kernel must decide in float64 as
    the reference does), many tied scores, some NaN scores and non-finite boxes, and sizes
    that exercise the sorted blocks and the sweeps (dense or sparse, small max_output)."""
    rng = np.random.default_rng(seed)
    spread = [50.0, 400.0, 5000.0][seed % 3]  # dense to sparse
    xy = rng.uniform(0, spread, (n, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(1, 60, (n, 2))], axis=1).astype(dtype)
    scores = (rng.integers(0, 40, n) / 40).astype(dtype)
    scores[rng.uniform(size=n) < 0.03] = np.nan
    boxes[rng.uniform(size=n) < 0.02, rng.integers(0, 4)] = np.inf
    categories = rng.integers(0, 3, n).astype(np.int32) if seed % 2 else None
    kwargs = {
        "iou_threshold": float(rng.choice([0.0, 0.1, 0.3, 0.5, 0.7, 1.0])),
        "max_output_size": int(rng.choice([1, 5, 64, 300, n])),
        "score_threshold": float(rng.choice([-np.inf, 0.25])),
    }
    return boxes[None], scores[None], None if categories is None else categories[None], kwargs


@_entry_points(cpu_nms.nms)
@pytest.mark.parametrize("n", [1, 7, 130, 257, 1500])
@pytest.mark.parametrize("seed", range(6))
def test_nms_random_off_grid(entry, n, seed):
    boxes, scores, categories, kwargs = _random_nms_problem(seed, n)
    got = entry(boxes, scores, categories, **kwargs)
    want = _reference_nms(boxes, scores, categories, **kwargs)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_nms_empty_image_and_batch_under_vmap():
    empty = cpu_nms.nms(
        np.zeros((2, 0, 4), np.float32),
        np.zeros((2, 0), np.float32),
        None,
        iou_threshold=0.5,
        max_output_size=3,
        score_threshold=-np.inf,
    )
    np.testing.assert_array_equal(empty[0], np.full((2, 3), -1))
    np.testing.assert_array_equal(empty[1], [0, 0])
    case = next(c for c in nms_cases() if c.name == "batch_2x3")
    kwargs = case.kwargs() | {"score_threshold": -np.inf}
    run = jax.jit(jax.vmap(lambda b, s: cpu_nms.nms(b, s, None, **kwargs)))
    indices, num_valid = run(case.boxes, case.scores)
    for v in range(2):
        want = _reference_nms(case.boxes[v], case.scores[v], None, **kwargs)
        np.testing.assert_array_equal(np.asarray(indices[v]), want[0])
        np.testing.assert_array_equal(np.asarray(num_valid[v]), want[1])


def _float64_only_decisions():
    """Boxes 1e6 from the origin whose IoU is 0.5 + ~1e-10 in float64: the second box is
    suppressed at threshold 0.5; rounded to float32 the two boxes coincide (IoU 1) or not,
    but the decision differs from the float64 one on at least one pair."""
    base = 1e6
    boxes = np.array(
        [
            [base, base, base + 4.0, base + 2.0],
            [base, base, base + 4.0, base + 1.0000000002],
            [base + 0.3, base, base + 4.3, base + 2.0],
            [base + 0.30000001, base, base + 4.30000001, base + 2.0],
        ],
        np.float64,
    )
    scores = np.array([0.9, 0.8, 0.7, 0.6], np.float64)
    return boxes[None], scores[None]


@_entry_points(cpu_nms.nms)
def test_nms_float64_decided_in_float64(entry):
    boxes, scores = _float64_only_decisions()
    kwargs = {"iou_threshold": 0.5, "max_output_size": 4, "score_threshold": -np.inf}
    want = _reference_nms(boxes, scores, None, **kwargs)
    rounded = _reference_nms(boxes.astype(np.float32), scores, None, **kwargs)
    assert not np.array_equal(want[0], rounded[0]), "the case must need float64"
    with x64_scope(True):
        got = entry(boxes, scores, None, **kwargs)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("seed", range(3))
def test_nms_float64_random_matches_reference(seed):
    boxes, scores, categories, kwargs = _random_nms_problem(seed, 700, np.float64)
    boxes = boxes + 1e6
    got = cpu_nms.nms(boxes, scores, categories, **kwargs)
    want = _reference_nms(boxes, scores, categories, **kwargs)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


# -- int8 matmul ---------------------------------------------------------------------------


def _matmul_args(case):
    m, n = case.x.shape[0], case.y.shape[1]
    scaled = case.x_scale is not None or case.y_scale is not None or case.out_dtype is not None
    if not scaled:
        return {"x_scale": None, "y_scale": None, "out_dtype": np.dtype(np.int32)}
    ones = np.float32(1)
    return {
        "x_scale": np.broadcast_to(ones if case.x_scale is None else case.x_scale, (m,)),
        "y_scale": np.broadcast_to(ones if case.y_scale is None else case.y_scale, (n,)),
        "out_dtype": np.dtype(case.out_dtype or np.float32),
    }


_BLOCKED = [  # beyond one K block (512), one row block (192) and one column block (256)
    ("blocked_401x1100x300", 401, 1100, 300),
    ("ragged_5x3x33", 5, 3, 33),
]


def _matmul_cases():
    rng = np.random.default_rng(11)
    cases = matmul_cases()
    for name, m, k, n in _BLOCKED:
        x = rng.integers(-128, 128, (m, k), dtype=np.int8)
        y = rng.integers(-128, 128, (k, n), dtype=np.int8)
        cases.append(type(cases[0])(name, x, y))
    return cases


@_entry_points(cpu_matmul.int8_matmul)
@pytest.mark.parametrize("case", _params(_matmul_cases()))
def test_int8_matmul(entry, case):
    args = _matmul_args(case)
    before = _copies(case.x, case.y)
    got = entry(case.x, case.y, **args)
    out_dtype = args["out_dtype"]
    assert got.dtype == out_dtype and got.shape == (case.x.shape[0], case.y.shape[1])
    if out_dtype == np.int32:
        np.testing.assert_array_equal(got, reference_int8_matmul(case.x, case.y))
    else:
        want = reference_int8_matmul(
            case.x, case.y, x_scale=args["x_scale"], y_scale=args["y_scale"], out_dtype=np.float64
        )
        rtol = 1e-2 if out_dtype == ml_dtypes.bfloat16 else 1e-6
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=1e-6)
    _assert_unchanged(before, [case.x, case.y])


def test_int8_matmul_float64_out_and_vmap():
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (2, 37, 70), dtype=np.int8)
    y = rng.integers(-128, 128, (2, 70, 19), dtype=np.int8)
    xs, ys = rng.uniform(0, 1, (2, 37)), rng.uniform(0, 1, (2, 19))
    want = [
        reference_int8_matmul(
            x[b], y[b], x_scale=xs[b].astype(np.float32), y_scale=ys[b].astype(np.float32),
            out_dtype=np.float64,
        )
        for b in range(2)
    ]  # fmt: skip
    host = cpu_matmul.int8_matmul(x[0], y[0], x_scale=xs[0], y_scale=ys[0], out_dtype=np.float64)
    assert host.dtype == np.float64
    np.testing.assert_array_equal(host, want[0])  # rounded once from the exact product
    with x64_scope(True):
        run = jax.jit(
            jax.vmap(
                lambda a, b, s, t: cpu_matmul.int8_matmul(
                    a, b, x_scale=s, y_scale=t, out_dtype=jnp.float64
                )
            )
        )
        got = run(x, y, xs.astype(np.float32), ys.astype(np.float32))
        assert got.dtype == np.float64
        np.testing.assert_array_equal(np.asarray(got), np.stack(want))
    unscaled = jax.jit(
        jax.vmap(
            lambda a, b: cpu_matmul.int8_matmul(
                a, b, x_scale=None, y_scale=None, out_dtype=jnp.int32
            )
        )
    )
    np.testing.assert_array_equal(
        np.asarray(unscaled(x, y)), np.stack([reference_int8_matmul(x[b], y[b]) for b in range(2)])
    )


# -- backend -------------------------------------------------------------------------------


def test_config_is_refused():
    boxes = np.zeros((1, 4), np.float32)
    with pytest.raises(TypeError, match="config: backend 'cpu' takes no config"):
        asickernels.giou(boxes, boxes, backend="cpu", config=object())


def _every_kernel_on_random_inputs() -> list[np.ndarray]:
    """Each host entry point on inputs with vector-width tails, both float types; NMS and
    int8 matmul at sizes that reach their blocked and vector paths."""
    rng = np.random.default_rng(5)
    outputs: list[np.ndarray] = []
    for dtype in (np.float32, np.float64):
        b1, b2 = (random_boxes(rng, (1037,)).astype(dtype) for _ in range(2))
        cotangent = rng.normal(size=1037).astype(dtype)
        for module, metric in ((cpu_giou, "giou"), (cpu_box, "diou"), (cpu_box, "ciou")):
            outputs.append(getattr(module, metric)(b1, b2))
            outputs.extend(getattr(module, f"{metric}_vjp")(b1, b2, cotangent))
        p1, p2 = random_boxes(rng, (2, 37)).astype(dtype), random_boxes(rng, (2, 53))
        outputs.append(cpu_box.box_iou(p1, p2.astype(dtype)))
        outputs.append(cpu_box.generalized_box_iou(p1, p2.astype(dtype)))
        for seed in range(4):
            boxes, scores, categories, kwargs = _random_nms_problem(seed, 3000, dtype)
            outputs.extend(cpu_nms.nms(boxes, scores, categories, **kwargs))
    for _, m, k, n in _BLOCKED:
        x = rng.integers(-128, 128, (m, k), dtype=np.int8)
        y = rng.integers(-128, 128, (k, n), dtype=np.int8)
        outputs.append(cpu_matmul.int8_matmul(x, y, x_scale=None, y_scale=None, out_dtype=np.int32))
        x_scale = rng.uniform(0.5, 2, m).astype(np.float32)
        y_scale = rng.uniform(0.5, 2, n).astype(np.float32)
        outputs.append(
            cpu_matmul.int8_matmul(x, y, x_scale=x_scale, y_scale=y_scale, out_dtype=np.float64)
        )
    return outputs


def test_every_instruction_set_level_computes_the_same_bits():
    """The wheel's one library runs the best level a CPU has: each level this CPU can run
    must give bit-identical results (so a machine with fewer features computes the same)."""
    best = _library.best_isa_level()
    levels = _library.ISA_LEVELS[: _library.ISA_LEVELS.index(best) + 1]
    try:
        expected = _every_kernel_on_random_inputs()
        for level in levels[:-1]:
            assert _library.use_isa_level(level) == level
            for got, want in zip(_every_kernel_on_random_inputs(), expected, strict=True):
                np.testing.assert_array_equal(got, want, err_msg=level)
    finally:
        _library.use_isa_level(best)
    assert _library.isa_level() == best
    with pytest.raises(ValueError, match="level must be one of"):
        _library.use_isa_level("sse9")


# /proc/cpuinfo's names of the features each level needs (csrc/dispatch.cpp), the OS's
# support of the vector state included (Linux lists avx and avx512* only where it saves it).
_LEVEL_FLAGS = {
    "avx2": {"avx", "avx2", "fma", "bmi1", "bmi2", "f16c"},
    "avx512": {"avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512_vnni"},
}


def _cpuinfo_flags() -> set[str] | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    line = next((line for line in text.splitlines() if line.startswith("flags")), None)
    return None if line is None else set(line.split(":", 1)[1].split())


@pytest.mark.skipif(
    _cpuinfo_flags() is None or os.uname().machine != "x86_64", reason="x86-64 Linux only"
)
def test_the_best_level_is_what_the_cpu_has():
    """The library's own CPU detection (CPUID, not the compiler runtime's: zig's, which
    builds the wheel, reports no features) agrees with the kernel's view of the CPU."""
    flags = _cpuinfo_flags()
    assert flags is not None
    want = "baseline"
    # The sanitizer build (run by the slow test below) compiles the baseline level alone.
    if os.environ.get(_library.SANITIZE_ENV) != "1" and _LEVEL_FLAGS["avx2"] <= flags:
        want = "avx512" if _LEVEL_FLAGS["avx512"] <= flags else "avx2"
    assert _library.best_isa_level() == want


def test_runs_without_a_compiler_and_compiles_nothing(tmp_path):
    """The library comes built: a process with no compiler anywhere (an empty PATH, $CXX
    pointing nowhere) and an unwritable home runs every kernel; nothing lands in a cache."""
    script = (
        "import numpy as np, asickernels\n"
        "from asickernels.backends import cpu\n"
        "assert cpu.BACKEND.probe().mode == 'native', cpu.BACKEND.probe()\n"
        "b = np.array([[0, 0, 2, 2], [1, 1, 3, 3]], np.float32)\n"
        "print(asickernels.giou(b, b, backend='cpu'))\n"
        "scores = np.array([0.9, 0.8], np.float32)\n"
        "print(asickernels.nms(b, scores, iou_threshold=0.1, max_output_size=2, backend='cpu'))\n"
        "x = np.ones((4, 4), np.int8)\n"
        "print(asickernels.int8_matmul(x, x, backend='cpu'))\n"
    )
    env = {
        "PATH": str(tmp_path / "empty"),
        "CXX": str(tmp_path / "no-compiler"),
        "HOME": "/",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "PYTHONPATH": str(Path(asickernels.__file__).parent.parent),
        "JAX_PLATFORMS": "cpu",
    }
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert not (tmp_path / "cache").exists()


@pytest.mark.slow
def test_under_address_and_undefined_behaviour_sanitizers():
    """This file's fast tests against the ASan + UBSan build, in a child process (Python can
    load an ASan library only with the runtime preloaded); any finding aborts the child."""
    arguments = [
        "-m", "not slow", "-k", "not without_a_compiler", "tests/backends/cpu/test_cpu_backend.py",
    ]  # fmt: skip
    run_pytest_sanitized(arguments, _library.SANITIZE_ENV, _library.sanitizer_preload(), 150)
