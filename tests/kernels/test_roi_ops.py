"""RoIAlign and RoIPool beyond the conformance cases: random maps against the float64
reference (hypothesis), the cpu kernel's host and FFI entries and thread counts giving the
same bits, and RoIs that name no image refused by name."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from conftest import backends_under_test, feature_map_draws, require
from hypothesis import given, settings
from hypothesis import strategies as st

import asickernels
from asickernels.kernels import oracle, registry
from asickernels.kernels.roi_cases import random_rois


def _map_and_rois(seed, height, width, dtype):
    rng = np.random.default_rng(seed)
    features = rng.standard_normal((2, 3, height, width)).astype(dtype)
    return features, random_rois(rng, 5, 2, float(max(height, width))).astype(dtype)


@pytest.mark.parametrize("backend", backends_under_test(asickernels.roi_align))
@settings(max_examples=8, deadline=None)
@given(
    **feature_map_draws(7),
    aligned=st.booleans(),
    ratio=st.integers(-1, 3),
    scale=st.sampled_from([1.0, 0.5, 0.3, 1.7]),
)
def test_roi_align_on_random_maps_matches_the_reference(
    backend, seed, height, width, aligned, ratio, scale
):
    require(backend)
    # float64 where the backend computes in it; float32 against the same reference otherwise.
    wide = "float64" in registry.support(asickernels.roi_align, backend).dtypes
    features, boxes = _map_and_rois(seed, height, width, np.float64 if wide else np.float32)
    statics = dict(output_size=(3, 2), spatial_scale=scale, sampling_ratio=ratio, aligned=aligned)
    got = asickernels.roi_align(features, boxes, backend=backend, **statics)
    arrays = {"input": features, "rois": boxes}
    oracle.assert_agrees(
        asickernels.roi_align, got, oracle.expected(asickernels.roi_align, arrays, statics)
    )


@pytest.mark.parametrize("backend", backends_under_test(asickernels.roi_pool))
@settings(max_examples=8, deadline=None)
@given(
    **feature_map_draws(7),
    size=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    scale=st.sampled_from([1.0, 0.5, 0.25, 2.0]),
)
def test_roi_pool_on_random_maps_matches_the_reference(backend, seed, height, width, size, scale):
    """float64 maps, with ties (values rounded to a coarse grid) so that the argmax rule
    (the first maximum in row-major order) decides the gradient."""
    require(backend)
    features, boxes = _map_and_rois(seed, height, width, np.float64)
    features = np.round(features)
    cotangent = np.random.default_rng(seed).standard_normal((len(boxes), 3, *size))
    statics = dict(output_size=size, spatial_scale=scale)
    arrays = {"input": features, "rois": boxes}
    got = asickernels.roi_pool(features, boxes, backend=backend, **statics)
    oracle.assert_agrees(
        asickernels.roi_pool, got, oracle.expected(asickernels.roi_pool, arrays, statics)
    )
    grad = asickernels.roi_pool_vjp(features, boxes, cotangent, backend=backend, **statics)
    want = oracle.expected(asickernels.roi_pool_vjp, {**arrays, "cotangent": cotangent}, statics)
    oracle.assert_agrees(asickernels.roi_pool_vjp, grad, want)


@pytest.mark.parametrize(
    "op", [asickernels.roi_align, asickernels.roi_pool], ids=lambda op: op.name
)
@pytest.mark.parametrize("index", [2.0, -1.0, float("nan")])
def test_a_roi_naming_no_image_is_refused_by_name(op, index):
    features = np.ones((2, 1, 4, 4), np.float32)
    boxes = np.array([[0, 0, 0, 2, 2], [index, 0, 0, 2, 2]], np.float32)
    for backend in registry.backends_for(op):
        if registry.availability(backend).mode == "missing":
            continue
        with pytest.raises(ValueError, match=r"rois\[:, 0\]"):
            op(features, boxes, 2, backend=backend)
    # Indices are truncated, as torchvision truncates them: 1.9 is image 1.
    np.asarray(op(features, np.array([[1.9, 0, 0, 2, 2]], np.float32), 2))


def test_cpu_roi_align_refuses_a_roi_naming_no_image_under_jit():
    require("cpu")
    features = np.ones((1, 1, 4, 4), np.float32)
    boxes = np.array([[3, 0, 0, 2, 2]], np.float32)
    run = jax.jit(lambda x, b: asickernels.roi_align(x, b, 2, backend="cpu"))
    with pytest.raises(Exception, match=r"rois\[:, 0\]"):
        np.asarray(run(features, boxes))


def test_cpu_roi_align_host_and_ffi_entries_and_thread_counts_give_the_same_bits():
    """The host twin (numpy, as CPU torch tensors run) and the FFI handler (jit) are one
    kernel; the gradient's channel chunks over threads add in one fixed order."""
    require("cpu")
    from asickernels.backends.cpu import _library

    rng = np.random.default_rng(5)
    features = rng.standard_normal((2, 7, 19, 23)).astype(np.float32)
    boxes = random_rois(rng, 40, 2, 22.0).astype(np.float32)
    cotangent = rng.standard_normal((len(boxes), 7, 3, 3)).astype(np.float32)
    statics = dict(output_size=(3, 3), spatial_scale=0.7, sampling_ratio=-1, aligned=True)
    host = registry.implementation(asickernels.roi_align, "cpu", host=True)
    host_vjp = registry.implementation(asickernels.roi_align_vjp, "cpu", host=True)
    jitted = jax.jit(lambda x, b: asickernels.roi_align(x, b, backend="cpu", **statics))
    forward = np.asarray(jitted(features, boxes))
    np.testing.assert_array_equal(host(features, boxes, **statics), forward)
    gradients = []
    lib = _library.library()
    try:
        for threads in (1, 2, 3):
            lib.asickernels_cpu_set_max_threads(threads)
            gradients.append(host_vjp(features, boxes, cotangent, **statics))
    finally:
        lib.asickernels_cpu_set_max_threads(_library.os.cpu_count() or 1)
    for grad in gradients[1:]:
        np.testing.assert_array_equal(grad, gradients[0])
    grad = jax.jit(
        jax.grad(
            lambda x: (asickernels.roi_align(x, boxes, backend="cpu", **statics) * cotangent).sum()
        )
    )(features)
    np.testing.assert_array_equal(np.asarray(grad), gradients[0])


@pytest.mark.parametrize(
    "op", [asickernels.roi_align, asickernels.roi_pool], ids=lambda op: op.name
)
def test_no_rois_and_no_channels_give_empty_results(op):
    features = np.ones((1, 4, 5, 5), np.float32)
    assert op(features, np.zeros((0, 5), np.float32), 2).shape == (0, 4, 2, 2)
    empty = op(np.ones((1, 0, 5, 5), np.float32), np.array([[0, 0, 0, 2, 2]], np.float32), 3)
    assert empty.shape == (1, 0, 3, 3)


def test_cpu_roi_pool_host_and_ffi_entries_and_thread_counts_give_the_same_bits():
    require("cpu")
    from asickernels.backends.cpu import _library

    rng = np.random.default_rng(6)
    features = np.round(rng.standard_normal((2, 5, 17, 19)), 1).astype(np.float32)  # ties
    boxes = random_rois(rng, 40, 2, 18.0).astype(np.float32)
    cotangent = rng.standard_normal((len(boxes), 5, 4, 3)).astype(np.float32)
    statics = dict(output_size=(4, 3), spatial_scale=0.8)
    host = registry.implementation(asickernels.roi_pool, "cpu", host=True)
    host_vjp = registry.implementation(asickernels.roi_pool_vjp, "cpu", host=True)
    jitted = jax.jit(lambda x, b: asickernels.roi_pool(x, b, backend="cpu", **statics))
    np.testing.assert_array_equal(
        host(features, boxes, **statics), np.asarray(jitted(features, boxes))
    )
    gradients = []
    lib = _library.library()
    try:
        for threads in (1, 3):
            lib.asickernels_cpu_set_max_threads(threads)
            gradients.append(host_vjp(features, boxes, cotangent, **statics))
    finally:
        lib.asickernels_cpu_set_max_threads(_library.os.cpu_count() or 1)
    np.testing.assert_array_equal(gradients[1], gradients[0])
    grad = jax.jit(
        jax.grad(
            lambda x: (asickernels.roi_pool(x, boxes, backend="cpu", **statics) * cotangent).sum()
        )
    )(features)
    np.testing.assert_array_equal(np.asarray(grad), gradients[0])


@pytest.mark.parametrize("ratio", [2**31, -(2**31) - 1])
def test_a_sampling_ratio_past_a_c_int_is_refused_by_name(ratio):
    features, boxes = np.ones((1, 1, 4, 4), np.float32), np.zeros((1, 5), np.float32)
    with pytest.raises(ValueError, match="sampling_ratio"):
        asickernels.roi_align(features, boxes, 2, sampling_ratio=ratio)


@pytest.mark.parametrize("backend", ["reference", *backends_under_test(asickernels.roi_pool)])
@pytest.mark.parametrize(("dtype", "last_column"), [(np.float32, 28), (np.float64, 29)])
def test_roi_pool_bins_end_where_the_compute_dtype_puts_them(backend, dtype, last_column):
    """A RoI 29 pixels wide in 7 bins: the last bin ends at 7 * (29 / 7), which is 29 in
    float32 and just past it in float64 (so it takes pixel 29 too), as in torchvision."""
    require(backend)
    features = np.arange(40, dtype=dtype).reshape(1, 1, 1, 40)
    boxes = np.array([[0, 0, 0, 28, 0]], dtype)
    got = asickernels.roi_pool(features, boxes, (1, 7), backend=backend)
    assert np.asarray(got)[0, 0, 0, -1] == last_column


@pytest.mark.parametrize("backend", ["reference", *backends_under_test(asickernels.roi_align)])
def test_roi_align_places_float32_samples_in_float32(backend):
    """A sample exactly on the map's last row in float64 (y = 3 on a 3-row map) lies just
    past it in float32 (3.0000002), where torchvision, computing in float32, gives 0."""
    require(backend)
    features = np.random.default_rng(0).standard_normal((2, 3, 3, 3)).astype(np.float32)
    boxes = np.array([[1, 6, 6, 2, 1]], np.float32)
    statics = dict(output_size=(3, 2), spatial_scale=1.0, sampling_ratio=1, aligned=True)
    got = np.asarray(asickernels.roi_align(features, boxes, backend=backend, **statics))
    assert np.all(got[0, :, 1, 1] == 0)
    if "float64" in registry.support(asickernels.roi_align, backend).dtypes:
        wide = asickernels.roi_align(features.astype(np.float64), boxes, backend=backend, **statics)
        assert np.all(np.asarray(wide)[0, :, 1, 1] != 0)


@pytest.mark.parametrize("backend", backends_under_test(asickernels.roi_align))
def test_roi_align_rounds_float32_sample_positions_as_torchvision(backend):
    """Samples near x = 900 (an ulp is 6e-5 pixel) across columns of alternating sign: a
    sample position rounded once (a fused multiply-add of ``bin * bin_size + start``, as XLA
    on CPU emits) instead of twice moves the bin by about 5x the float32 tolerance."""
    require(backend)
    rng = np.random.default_rng(1)
    columns = np.where(np.arange(1024) % 2 == 0, 1.0, -1.0)
    features = np.broadcast_to(columns, (1, 8, 4, 1024)).astype(np.float32)
    x1 = rng.uniform(800.0, 900.0, 32)
    y1 = rng.uniform(0.0, 2.0, 32)
    sizes = rng.uniform(3.0, 60.0, (2, 32))
    boxes = np.stack([np.zeros(32), x1, y1, x1 + sizes[0], y1 + sizes[1] / 30], axis=1)
    boxes = boxes.astype(np.float32)
    statics = dict(output_size=(2, 7), spatial_scale=1.0, sampling_ratio=2, aligned=True)
    got = asickernels.roi_align(features, boxes, backend=backend, **statics)
    arrays = {"input": features, "rois": boxes}
    oracle.assert_agrees(
        asickernels.roi_align, got, oracle.expected(asickernels.roi_align, arrays, statics)
    )
