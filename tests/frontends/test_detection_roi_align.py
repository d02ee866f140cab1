"""``asickernels.roi_align`` and its gradient on every backend that has them, against the
float64 reference (a transcription of torchvision's CPU kernel): random, edge (RoIs
partly or wholly off the map, zero-size and reversed RoIs, the map's last row and column)
and adversarial (huge RoIs whose adaptive grid is large) inputs, every sampling mode. The
comparison with torchvision itself is in test_torchvision_compat.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import feature_map_draws
from hypothesis import given, settings
from hypothesis import strategies as st

import asickernels
from asickernels.kernels import registry
from asickernels.kernels.roi_align import reference_roi_align, reference_roi_align_vjp
from asickernels.kernels.roi_cases import random_rois

# The backends that compute in float64 too; float32-only ones (pallas_tpu, nki) run
# RoiAlignConformance in tests/kernels/test_conformance.py.
BACKENDS = [
    b
    for b in registry.backends_for(asickernels.roi_align)
    if b != "reference" and "float64" in registry.support(asickernels.roi_align, b).dtypes
]
# (aligned, sampling_ratio, spatial_scale): both alignments, adaptive (-1 and 0) and fixed
# grids, whole and fractional scales.
MODES = [(False, -1, 1.0), (False, 0, 0.5), (False, 2, 0.25), (True, -1, 0.5), (True, 1, 1.0)]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    features = rng.standard_normal((2, 3, 7, 9))
    return features, random_rois(rng, 10, 2, 8.0), rng


def _statics(aligned, ratio, scale):
    return dict(spatial_scale=scale, sampling_ratio=ratio, aligned=aligned)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("aligned, ratio, scale", MODES)
def test_forward_matches_the_reference(data, backend, aligned, ratio, scale):
    features, rois, _ = data
    statics = _statics(aligned, ratio, scale)
    want = reference_roi_align(features, rois, (2, 3), **statics)
    got64 = asickernels.roi_align(features, rois, (2, 3), backend=backend, **statics)
    assert got64.dtype == np.float64
    np.testing.assert_allclose(np.asarray(got64), want, rtol=0, atol=1e-12)
    got32 = asickernels.roi_align(
        features.astype(np.float32), rois.astype(np.float32), (2, 3), backend=backend, **statics
    )
    assert got32.dtype == np.float32 and got32.shape == (len(rois), 3, 2, 3)
    np.testing.assert_allclose(np.asarray(got32), want, rtol=0, atol=2e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("aligned, ratio, scale", MODES)
def test_gradient_matches_the_reference(data, backend, aligned, ratio, scale):
    features, rois, rng = data
    statics = _statics(aligned, ratio, scale)
    cotangent = rng.standard_normal((len(rois), 3, 2, 3))
    want = reference_roi_align_vjp(features, rois, cotangent, (2, 3), **statics)
    got = asickernels.roi_align_vjp(features, rois, cotangent, (2, 3), backend=backend, **statics)
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-12)
    # jax.grad of the forward runs the same gradient.
    grad = jax.grad(
        lambda x: jnp.sum(
            asickernels.roi_align(x, rois.astype(np.float32), (2, 3), backend=backend, **statics)
            * cotangent.astype(np.float32)
        )
    )(features.astype(np.float32))
    np.testing.assert_allclose(np.asarray(grad), want, rtol=0, atol=5e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_jit_equals_eager_and_half_precision_keeps_its_dtype(data, backend):
    features, rois, _ = data
    x, r = features.astype(np.float32), rois.astype(np.float32)
    eager = asickernels.roi_align(x, r, 3, backend=backend)
    jitted = jax.jit(lambda a, b: asickernels.roi_align(a, b, 3, backend=backend))(x, r)
    np.testing.assert_array_equal(np.asarray(eager), np.asarray(jitted))
    half = asickernels.roi_align(x.astype(np.float16), r.astype(np.float16), 3, backend=backend)
    assert half.dtype == np.float16


@settings(max_examples=25, deadline=None)
@given(
    **feature_map_draws(6),
    aligned=st.booleans(),
    ratio=st.integers(-1, 2),
)
def test_random_maps_match_the_reference(seed, height, width, aligned, ratio):
    rng = np.random.default_rng(seed)
    features = rng.standard_normal((1, 2, height, width))
    boxes = random_rois(rng, 4, 1, float(max(height, width)))
    statics = _statics(aligned, ratio, 0.75)
    want = reference_roi_align(features, boxes, (3, 2), **statics)
    got = asickernels.roi_align(features, boxes, (3, 2), backend="xla", **statics)
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-12)


def test_no_rois_give_an_empty_result():
    out = asickernels.roi_align(np.ones((1, 4, 5, 5), np.float32), np.zeros((0, 5), np.float32), 2)
    assert out.shape == (0, 4, 2, 2)


@pytest.mark.parametrize(
    "rois, kwargs, error",
    [
        (np.zeros((2, 4), np.float32), {}, ValueError),
        (np.zeros((2, 5), np.int32), {}, TypeError),
        (np.zeros((2, 5), np.float32), {"output_size": 0}, ValueError),
        (np.zeros((2, 5), np.float32), {"output_size": (2, 2, 2)}, TypeError),
        (np.zeros((2, 5), np.float32), {"output_size": None}, TypeError),
        (np.zeros((2, 5), np.float32), {"spatial_scale": -1.0}, ValueError),
        (np.zeros((2, 5), np.float32), {"aligned": 1}, TypeError),
    ],
)
def test_bad_arguments_are_refused_by_name(rois, kwargs, error):
    arguments = {"output_size": 2} | kwargs
    size = arguments.pop("output_size")
    with pytest.raises(error):
        asickernels.roi_align(np.ones((1, 1, 4, 4), np.float32), rois, size, **arguments)
    with pytest.raises(ValueError, match="input"):
        asickernels.roi_align(np.ones((4, 4), np.float32), np.zeros((1, 5), np.float32), 2)
