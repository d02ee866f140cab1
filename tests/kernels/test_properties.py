"""Hypothesis property tests: the mathematics of GIOU and greedy NMS, checked on the float64
reference, and the "xla" backend checked against the reference on generated inputs.

JAX compiles once per new shape (and per static argument), so the JAX inputs are padded to a
few fixed shapes and the static arguments drawn from small sets.
"""

from __future__ import annotations

import functools
import math

import jax
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import asickernels
from asickernels.kernels.giou import reference_giou, reference_giou_vjp
from asickernels.kernels.nms import greedy_nms

FEW = settings(max_examples=40, deadline=None)

# --------------------------------------------------------------------------------------------
# GIOU


# Box sizes for float32 comparisons: 0 (degenerate boxes), or not so thin that float32
# rounding of a width dominates the result.
FLOAT32_SAFE_SIZES = st.one_of(st.just(0.0), st.floats(0.25, 20.0))


@st.composite
def box_pairs(draw, coord=20.0, sizes=FLOAT32_SAFE_SIZES, max_pairs=16):
    """Two ``[P, 4]`` float64 arrays of valid boxes (``x1 <= x2``, ``y1 <= y2``)."""
    count = draw(st.integers(1, max_pairs))

    def boxes():
        # Corners exact in float32 and never subnormal there: XLA's CPU kernels flush float32
        # subnormals to zero, which turns a corner of 1e-45 into a tie with 0 (another
        # subgradient) where the reference keeps the two apart.
        corner = draw(
            arrays(
                np.float64,
                (count, 2),
                elements=st.floats(-coord, coord, width=32, allow_subnormal=False),
            )
        )
        size = draw(arrays(np.float64, (count, 2), elements=sizes))
        return np.concatenate([corner, corner + size], axis=-1)

    return boxes(), boxes()


@FEW
@given(box_pairs(coord=100.0, sizes=st.floats(0.0, 100.0)))
def test_giou_is_symmetric_and_within_minus_one_one(pair):
    a, b = pair
    forward = reference_giou(a, b)
    np.testing.assert_array_equal(forward, reference_giou(b, a))
    assert np.all(np.abs(forward) <= 1 + 1e-9), forward


@FEW
@given(box_pairs(sizes=st.floats(0.1, 20.0)))
def test_giou_of_a_box_with_itself_is_one(pair):
    a, _ = pair
    np.testing.assert_allclose(reference_giou(a, a), 1.0, rtol=0, atol=1e-5)


@FEW
@given(
    box_pairs(coord=10.0, sizes=st.floats(0.0, 10.0)),
    st.floats(-10.0, 10.0),
    st.floats(-10.0, 10.0),
)
def test_giou_is_translation_invariant(pair, dx, dy):
    a, b = pair
    shift = np.array([dx, dy, dx, dy])
    # Only approximately: the shifted coordinates are rounded; the 1e-7 eps of the formula
    # bounds how much that rounding can move the result.
    np.testing.assert_allclose(
        reference_giou(a + shift, b + shift), reference_giou(a, b), rtol=0, atol=1e-5
    )


GIOU_PAD = 16
PAD_BOX = np.array([0.0, 0.0, 1.0, 1.0], np.float32)


@jax.jit
def _xla_giou_and_vjp(a, b, cotangent):
    forward = asickernels.giou(a, b, backend="xla")
    return forward, asickernels.giou_vjp(a, b, cotangent, backend="xla")


@FEW
@given(box_pairs(max_pairs=GIOU_PAD), st.integers(0, 2**32 - 1))
def test_xla_giou_and_its_gradient_match_the_reference(pair, seed):
    count = pair[0].shape[0]
    # Padded to one shape so that JAX compiles once.
    a, b = (
        np.concatenate([p.astype(np.float32), np.tile(PAD_BOX, (GIOU_PAD - count, 1))])
        for p in pair
    )
    cotangent = np.random.default_rng(seed).normal(size=GIOU_PAD).astype(np.float32)
    forward, grads = _xla_giou_and_vjp(a, b, cotangent)
    np.testing.assert_allclose(np.asarray(forward), reference_giou(a, b), rtol=0, atol=2e-5)
    # Where a box has zero width or height, gradient terms of order 1/eps cancel, which
    # float32 cannot resolve: compare the gradient on boxes of positive size only.
    sizes = np.concatenate([a[:, 2:] - a[:, :2], b[:, 2:] - b[:, :2]], axis=1)
    proper = np.all(sizes >= 0.2, axis=1)
    for got_d, want_d in zip(grads, reference_giou_vjp(a, b, cotangent), strict=True):
        np.testing.assert_allclose(np.asarray(got_d)[proper], want_d[proper], rtol=2e-4, atol=2e-5)


@st.composite
def kink_free_intervals(draw):
    """Two intervals ``(x1, x2)``, ``(u1, u2)`` whose four ends are at least 0.25 apart, so no
    max/min in GIOU is near a tie and no intersection width is near 0."""
    ends = draw(st.lists(st.integers(0, 40), min_size=4, max_size=4, unique=True))
    jitter = draw(st.lists(st.floats(0.0, 0.25), min_size=4, max_size=4))
    values = [0.5 * e + j - 10.0 for e, j in zip(ends, jitter, strict=True)]
    return sorted(values[:2]), sorted(values[2:])


@st.composite
def kink_free_box_pairs(draw):
    count = draw(st.integers(1, 4))
    a, b = np.zeros((count, 4)), np.zeros((count, 4))
    for i in range(count):
        (a[i, 0], a[i, 2]), (b[i, 0], b[i, 2]) = draw(kink_free_intervals())
        (a[i, 1], a[i, 3]), (b[i, 1], b[i, 3]) = draw(kink_free_intervals())
    cotangent = draw(arrays(np.float64, (count,), elements=st.floats(-2.0, 2.0)))
    return a, b, cotangent


@FEW
@given(kink_free_box_pairs())
def test_reference_giou_gradient_matches_central_differences(inputs):
    a, b, cotangent = inputs
    step = 1e-6
    grads = reference_giou_vjp(a, b, cotangent)
    for side, boxes in enumerate((a, b)):
        for coord in range(4):
            delta = np.zeros_like(boxes)
            delta[:, coord] = step

            def perturbed(d, side=side, boxes=boxes):
                pair = [a, b]
                pair[side] = boxes + d
                return reference_giou(*pair)

            numeric = cotangent * (perturbed(delta) - perturbed(-delta)) / (2 * step)
            np.testing.assert_allclose(grads[side][:, coord], numeric, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------
# NMS, on integer-grid boxes: areas and intersections are exact small integers, so an IoU
# cannot fall between float32 and float64 roundings of a threshold.

NMS_PAD = 24
SCORE_VALUES = (0.0, -0.0, 0.25, 0.5, 0.75, 1.0, math.nan)  # few values: many ties
THRESHOLDS = (0.0, 0.3, 0.5, 1.0)


@st.composite
def grid_images(draw, min_size=0, max_boxes=NMS_PAD):
    """One image: ``boxes [n, 4]`` float32 on an integer grid, ``scores [n]`` float32 with
    ties and NaNs, ``categories [n]`` int32 in 0..2."""
    n = draw(st.integers(1, max_boxes))
    corner = draw(arrays(np.int64, (n, 2), elements=st.integers(0, 16)))
    size = draw(arrays(np.int64, (n, 2), elements=st.integers(min_size, 8)))
    boxes = np.concatenate([corner, corner + size], axis=-1).astype(np.float32)
    scores = draw(arrays(np.float32, (n,), elements=st.sampled_from(SCORE_VALUES)))
    categories = draw(arrays(np.int32, (n,), elements=st.integers(0, 2)))
    return boxes, scores, categories


nms_settings = st.fixed_dictionaries(
    {
        "iou_threshold": st.sampled_from(THRESHOLDS),
        "max_output_size": st.sampled_from((1, 5, 30)),
        "score_threshold": st.sampled_from((None, 0.5)),
    }
)


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    # In float64, as the reference: float32 boxes would round an IoU of exactly the
    # threshold up under numpy 1.x's promotion (0.3 -> 0.30000001).
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    inter = max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(
        0.0, min(a[3], b[3]) - max(a[1], b[1])
    )
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return float(inter / union) if union > 0 else 0.0


def _visit_key(scores: np.ndarray, i: int) -> tuple[float, int]:
    """Greedy NMS visiting order: descending score, then ascending index."""
    return (-float(scores[i]), i)


@FEW
@given(grid_images(), nms_settings, st.booleans())
def test_reference_nms_is_greedy_suppression(image, kwargs, per_category):
    boxes, scores, categories = image
    if per_category:
        indices, num_valid = asickernels.batched_nms(
            boxes, scores, categories, backend="reference", **kwargs
        )
    else:
        indices, num_valid = asickernels.nms(boxes, scores, backend="reference", **kwargs)
        categories = np.zeros_like(categories)
    indices, count = np.asarray(indices), int(num_valid)
    thr, limit = kwargs["iou_threshold"], kwargs["max_output_size"]
    floor = -math.inf if kwargs["score_threshold"] is None else kwargs["score_threshold"]

    assert indices.shape == (limit,) and 0 <= count <= limit
    kept = [int(i) for i in indices[:count]]
    assert np.all(indices[count:] == -1)
    assert len(set(kept)) == count and all(0 <= i < len(scores) for i in kept)
    eligible = ~np.isnan(scores) & (scores >= floor)
    assert all(eligible[i] for i in kept)
    keys = [_visit_key(scores, i) for i in kept]
    assert keys == sorted(keys), "not in selection order (score desc, index asc)"
    for p, i in enumerate(kept):
        for j in kept[:p]:
            if categories[i] == categories[j]:
                assert _iou(boxes[i], boxes[j]) <= thr, f"kept {j} and {i} overlap"
    # Every eligible box that was visited but not kept is suppressed by an earlier kept box.
    last_visited = keys[-1] if count == limit else (math.inf, 0)
    for i in np.flatnonzero(eligible):
        if i in kept or _visit_key(scores, i) > last_visited:
            continue
        assert any(
            categories[j] == categories[i]
            and _visit_key(scores, j) < _visit_key(scores, i)
            and _iou(boxes[i], boxes[j]) > thr
            for j in kept
        ), f"box {i} neither kept nor suppressed"


@FEW
@given(grid_images(), nms_settings)
def test_batched_nms_is_per_category_nms_merged(image, kwargs):
    boxes, scores, categories = image
    indices, num_valid = asickernels.batched_nms(
        boxes, scores, categories, backend="reference", **kwargs
    )
    merged = []
    for category in np.unique(categories):
        members = np.flatnonzero(categories == category)
        sub_indices, sub_count = asickernels.nms(
            boxes[members], scores[members], backend="reference", **kwargs
        )
        merged += [int(members[i]) for i in np.asarray(sub_indices)[: int(sub_count)]]
    merged = sorted(merged, key=lambda i: _visit_key(scores, i))[: kwargs["max_output_size"]]
    got = np.asarray(indices)[: int(num_valid)].tolist()
    assert got == merged, f"batched_nms kept {got}, per-category NMS merged: {merged}"


@functools.partial(jax.jit, static_argnames=("iou_threshold", "max_output_size", "score_threshold"))
def _xla_nms(boxes, scores, categories, **kwargs):
    if categories is None:
        return asickernels.nms(boxes, scores, backend="xla", **kwargs)
    return asickernels.batched_nms(boxes, scores, categories, backend="xla", **kwargs)


def _pad_image(boxes: np.ndarray, scores: np.ndarray, categories: np.ndarray):
    """Pads to ``NMS_PAD`` boxes with NaN scores: never kept, so the result is unchanged."""
    extra = NMS_PAD - len(scores)
    return (
        np.concatenate([boxes, np.zeros((extra, 4), np.float32)]),
        np.concatenate([scores, np.full(extra, np.nan, np.float32)]),
        np.concatenate([categories, np.zeros(extra, np.int32)]),
    )


# Each static combination compiles anew: a few that cover every value.
XLA_NMS_SETTINGS = [
    {"iou_threshold": t, "max_output_size": m, "score_threshold": s}
    for t, m, s in ((0.0, 5, None), (0.3, 30, None), (0.5, 1, 0.5), (0.5, 5, None), (1.0, 30, 0.5))
]


@FEW
@given(
    st.lists(grid_images(min_size=-2), min_size=2, max_size=2),
    st.sampled_from(XLA_NMS_SETTINGS),
    st.booleans(),
)
def test_xla_nms_matches_the_reference(images, kwargs, per_category):
    """Two images per call (the leading batch dim), each padded to NMS_PAD boxes. Sizes
    down to -2 give inverted boxes (negative areas), which the reference also defines."""
    boxes, scores, categories = (
        np.stack(parts) for parts in zip(*(_pad_image(*im) for im in images), strict=True)
    )
    indices, num_valid = _xla_nms(boxes, scores, categories if per_category else None, **kwargs)
    for b, (im_boxes, im_scores, im_categories) in enumerate(images):
        want_indices, want_count = greedy_nms(
            im_boxes[None],
            im_scores[None],
            im_categories[None] if per_category else None,
            iou_threshold=kwargs["iou_threshold"],
            max_output_size=kwargs["max_output_size"],
            score_threshold=-math.inf
            if kwargs["score_threshold"] is None
            else kwargs["score_threshold"],
        )
        np.testing.assert_array_equal(np.asarray(indices[b]), want_indices[0])
        assert int(num_valid[b]) == int(want_count[0])


# --------------------------------------------------------------------------------------------
# int8 matmul and quantization


@st.composite
def int8_operands(draw):
    m, k, n = (draw(st.integers(1, 70)) for _ in range(3))
    x = draw(arrays(np.int8, (m, k), elements=st.integers(-128, 127)))
    y = draw(arrays(np.int8, (k, n), elements=st.integers(-128, 127)))
    return x, y


@FEW
@given(int8_operands())
def test_xla_int8_matmul_is_exact(operands):
    x, y = operands
    got = asickernels.int8_matmul(x, y, backend="xla")
    assert got.dtype == np.int32 and got.shape == (x.shape[0], y.shape[1])
    np.testing.assert_array_equal(np.asarray(got), x.astype(np.int64) @ y.astype(np.int64))


_quantize = jax.jit(asickernels.quantize_int8, static_argnames="axis")
MAGNITUDES = st.floats(2.0**-100, 2.0**100, width=32)  # smaller: see the tiny-scale test


@st.composite
def quantize_inputs(draw):
    shape = draw(st.sampled_from([(5,), (3, 4), (2, 3, 2)]))
    axis = draw(st.sampled_from([None, *range(len(shape)), -1]))
    element = st.one_of(st.just(0.0), MAGNITUDES, MAGNITUDES.map(lambda v: -v))
    return draw(arrays(np.float32, shape, elements=element)), axis


def _assert_round_trip(x: np.ndarray, axis: int | None, q: np.ndarray, scale: np.ndarray) -> None:
    assert q.dtype == np.int8 and q.shape == x.shape and np.all(np.abs(q.astype(np.int32)) <= 127)
    scale = np.asarray(scale, np.float64)
    assert np.all(scale > 0), scale
    if axis is not None:
        scale = np.expand_dims(scale, tuple(i for i in range(x.ndim) if i != axis % x.ndim))
    error = np.abs(x.astype(np.float64) - q * scale)
    # Half a step, plus the float32 rounding of x / scale (|x / scale| <= 127).
    assert np.all(error <= scale * (0.5 + 1e-5)), (error / scale).max()


@FEW
@given(quantize_inputs())
def test_quantize_int8_round_trip(inputs):
    x, axis = inputs
    q, scale = _quantize(x, axis=axis)
    _assert_round_trip(x, axis, np.asarray(q), np.asarray(scale))


def test_quantize_int8_tiny_values_keep_a_positive_scale():
    x = np.array([1e-37, -5e-38], np.float32)
    q, scale = asickernels.quantize_int8(x)
    _assert_round_trip(x, None, np.asarray(q), np.asarray(scale))
