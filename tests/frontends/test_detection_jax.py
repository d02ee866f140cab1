"""The static-shape detection post-processing (:mod:`asickernels.detection`) in JAX, under
``jax.jit``, against plain numpy definitions of torchvision's steps (filter by score, top-k,
remove small boxes, per-class NMS as the float64 reference runs it, keep the first D)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asickernels
from asickernels import detection
from asickernels.kernels.cases import random_boxes

top_candidates = jax.jit(detection.top_candidates, static_argnames=("k", "score_threshold"))
select_detections = jax.jit(
    detection.select_detections,
    static_argnames=("iou_threshold", "max_detections", "min_size", "backend"),
)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 12), k=st.integers(0, 12))
def test_top_candidates_are_the_best_scores_above_the_threshold(seed, n, k):
    k = min(k, n)
    rng = np.random.default_rng(seed)
    scores = rng.permutation(np.linspace(0.0, 1.0, 2 * n, dtype=np.float32)).reshape(2, n)
    indices, valid = top_candidates(scores, k=k, score_threshold=0.5)
    assert indices.shape == valid.shape == (2, k) and indices.dtype == np.int32
    for image in range(2):
        passing = np.flatnonzero(scores[image] > 0.5)
        want = passing[np.argsort(-scores[image][passing], kind="stable")][:k]
        assert np.asarray(valid[image]).sum() == len(want)
        np.testing.assert_array_equal(np.asarray(indices[image])[: len(want)], want)
        assert not np.asarray(valid[image])[len(want) :].any()


def _expected(boxes, scores, labels, valid, iou, keep, min_size):
    """torchvision's order of steps on one image, with the float64 reference NMS."""
    width, height = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    real = np.flatnonzero(valid & (width >= min_size) & (height >= min_size))
    indices, count = asickernels.batched_nms(
        boxes[real],
        scores[real],
        labels[real],
        iou_threshold=iou,
        max_output_size=len(real),
        backend="reference",
    )
    return real[np.asarray(indices)[: int(count)]][:keep]


@pytest.mark.parametrize("backend", [None, "xla"])
@pytest.mark.parametrize("min_size", [None, 8.0])
def test_select_detections_is_torchvisions_selection_padded(backend, min_size):
    rng = np.random.default_rng(3)
    boxes = random_boxes(rng, (2, 60)).astype(np.float32) * 4
    scores = rng.permutation(np.linspace(0.01, 1.0, 120, dtype=np.float32)).reshape(2, 60)
    labels = rng.integers(0, 3, (2, 60)).astype(np.int32)
    valid = rng.random((2, 60)) < 0.8
    out_boxes, out_scores, out_labels, count = select_detections(
        boxes,
        scores,
        labels,
        valid,
        iou_threshold=0.3,
        max_detections=25,
        min_size=min_size,
        backend=backend,
    )
    assert out_boxes.shape == (2, 25, 4) and out_labels.dtype == np.int32
    for image in range(2):
        want = _expected(
            boxes[image], scores[image], labels[image], valid[image], 0.3, 25, min_size or 0.0
        )
        n = int(count[image])
        assert n == len(want)
        np.testing.assert_array_equal(np.asarray(out_boxes[image])[:n], boxes[image][want])
        np.testing.assert_array_equal(np.asarray(out_scores[image])[:n], scores[image][want])
        np.testing.assert_array_equal(np.asarray(out_labels[image])[:n], labels[image][want])
        assert (np.asarray(out_boxes[image])[n:] == 0).all()
        assert (np.asarray(out_scores[image])[n:] == 0).all()
        assert (np.asarray(out_labels[image])[n:] == -1).all()


def test_no_valid_candidate_gives_no_detection():
    boxes = np.tile(np.array([0.0, 0.0, 4.0, 4.0], np.float32), (1, 5, 1))
    out = select_detections(
        boxes,
        np.ones((1, 5), np.float32),
        np.zeros((1, 5), np.int32),
        np.zeros((1, 5), bool),
        iou_threshold=0.5,
        max_detections=3,
    )
    assert int(out[3][0]) == 0 and (np.asarray(out[2]) == -1).all()


def test_k_outside_the_scores_is_refused():
    with pytest.raises(ValueError, match="k must be"):
        detection.top_candidates(np.zeros((1, 3), np.float32), k=4, score_threshold=0.0)


_CANDIDATES = {
    "boxes": np.tile(np.array([0.0, 0.0, 4.0, 4.0], np.float32), (1, 5, 1)),
    "scores": np.ones((1, 5), np.float32),
    "labels": np.zeros((1, 5), np.int32),
    "valid": np.ones((1, 5), bool),
}
# Each public function with valid arguments; min_size and backend may be None.
_VALID_CALLS = {
    "top_candidates": {"scores": np.zeros((2, 3), np.float32), "k": 2, "score_threshold": 0.0},
    "large_enough": {"boxes": _CANDIDATES["boxes"], "min_size": 1.0},
    "select_detections": {**_CANDIDATES, "iou_threshold": 0.5, "max_detections": 3},
}


@pytest.mark.parametrize(
    ("function", "name"),
    [(function, name) for function, kwargs in _VALID_CALLS.items() for name in kwargs],
)
def test_every_argument_given_as_none_is_refused_by_name(function, name):
    kwargs = dict(_VALID_CALLS[function])
    getattr(detection, function)(**kwargs)
    kwargs[name] = None
    with pytest.raises((TypeError, ValueError), match=name):
        getattr(detection, function)(**kwargs)


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [
        ("boxes", np.zeros((5, 4), np.float32), ValueError),
        ("scores", np.ones((1, 4), np.float32), ValueError),
        ("labels", np.zeros((1, 5), np.float32), TypeError),
        ("valid", np.ones((1, 5), np.int32), TypeError),
        ("max_detections", -1, ValueError),
        ("iou_threshold", 1.5, ValueError),
    ],
)
def test_select_detections_refuses_misshapen_or_mistyped_candidates(name, value, error):
    kwargs = {**_VALID_CALLS["select_detections"], name: value}
    with pytest.raises(error, match=name):
        detection.select_detections(**kwargs)
