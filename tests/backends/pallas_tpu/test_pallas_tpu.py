"""Pallas TPU backend specifics: TPU interpret mode's race detection, block-size configs,
generation handling. Numerical agreement is the conformance suite's job."""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import asickernels
from asickernels import tpu_generations
from asickernels.backends.pallas_tpu import lowering
from asickernels.backends.pallas_tpu.giou import GiouConfig
from asickernels.backends.pallas_tpu.int8_matmul import Int8MatmulConfig
from asickernels.backends.pallas_tpu.nms import NmsConfig
from asickernels.backends.pallas_tpu.roi_align import RoiAlignConfig
from asickernels.kernels import oracle
from asickernels.kernels.cases import random_boxes
from asickernels.kernels.giou import reference_giou
from asickernels.kernels.int8_matmul import reference_int8_matmul
from asickernels.pallas_home import pl


def _copy_blocks(out_index_map):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    def run(x):
        call = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid=(x.shape[0] // 8,),
            in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
            out_specs=pl.BlockSpec((8, 128), out_index_map),
            compiler_params=lowering.compiler_params(("parallel",), 0),
            interpret=lowering.tpu_interpret_params(),
        )
        return call(x)

    return run


def test_tpu_interpret_mode_catches_a_kernel_whose_parallel_steps_collide():
    x = jnp.zeros((64, 128), jnp.float32)
    jax.block_until_ready(_copy_blocks(lambda i: (i, 0))(x))
    lowering.check_no_races("tpu_interpret")  # disjoint blocks: no race

    jax.block_until_ready(_copy_blocks(lambda i: (0, 0))(x))  # every step writes block 0
    with pytest.raises(RuntimeError, match="data race"):
        lowering.check_no_races("tpu_interpret")


@pytest.mark.parametrize(
    "config",
    [Int8MatmulConfig(32, 128, 128), Int8MatmulConfig(64, 256, 384)],
)
def test_int8_matmul_block_override(config):
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (100, 300), dtype=np.int8)
    y = rng.integers(-128, 128, (300, 200), dtype=np.int8)
    got = asickernels.int8_matmul(x, y, backend="pallas_tpu", config=config)
    np.testing.assert_array_equal(np.asarray(got), reference_int8_matmul(x, y))


def test_giou_and_nms_block_overrides():
    rng = np.random.default_rng(1)
    a, b = random_boxes(rng, (700,)), random_boxes(rng, (700,))
    got = asickernels.giou(a, b, backend="pallas_tpu", config=GiouConfig(block_rows=16))
    np.testing.assert_allclose(np.asarray(got), reference_giou(a, b), atol=2e-5)
    scores = rng.permutation(700).astype(np.float32)
    kwargs = dict(iou_threshold=0.2, max_output_size=300)
    got_idx, _ = asickernels.nms(
        a, scores, backend="pallas_tpu", config=NmsConfig(tile=128), **kwargs
    )
    want_idx, _ = asickernels.nms(a, scores, backend="reference", **kwargs)
    np.testing.assert_array_equal(np.asarray(got_idx), np.asarray(want_idx))


@pytest.mark.parametrize(
    "make, error",
    [
        (
            lambda: Int8MatmulConfig(30, 128, 128),
            "block_m must be a positive multiple of 32",
        ),
        (
            lambda: Int8MatmulConfig(32, 100, 128),
            "block_n must be a positive multiple of 128",
        ),
        (lambda: NmsConfig(tile=64), "tile must be a positive multiple of 128"),
        (lambda: GiouConfig(block_rows=0), "block_rows must be a positive multiple of 16"),
        (lambda: RoiAlignConfig(4), "block_channels must be a positive multiple of 8"),
        (lambda: RoiAlignConfig(band_rows=12), "band_rows must be a positive multiple of 8"),
    ],
)
def test_bad_configs_are_refused(make, error):
    with pytest.raises(ValueError, match=error):
        make()


@pytest.mark.parametrize("config", [RoiAlignConfig(8, band_rows=8), RoiAlignConfig(16)])
def test_roi_align_in_bands_and_channel_blocks_with_an_image_without_rois(config):
    """21 rows in bands of 8 (the last one partial), 11 channels in blocks of 8 or all at
    once; RoIs alternate between images 2 and 0, image 1 has none (its gradient is 0)."""
    rng = np.random.default_rng(4)
    features = rng.standard_normal((3, 11, 21, 9)).astype(np.float32)
    corners = rng.uniform(-4.0, 24.0, (8, 4))
    boxes = np.concatenate(
        [np.minimum(corners[:, :2], corners[:, 2:]), np.maximum(corners[:, :2], corners[:, 2:])], 1
    )
    rois = np.concatenate([np.tile([[2.0], [0.0]], (4, 1)), boxes], 1).astype(np.float32)
    cotangent = rng.standard_normal((8, 11, 3, 2)).astype(np.float32)
    statics = {"output_size": (3, 2), "spatial_scale": 0.75, "sampling_ratio": -1, "aligned": False}
    got = asickernels.roi_align(features, rois, backend="pallas_tpu", config=config, **statics)
    arrays = {"input": features, "rois": rois}
    oracle.assert_agrees(
        asickernels.roi_align, got, oracle.expected(asickernels.roi_align, arrays, statics)
    )
    grad = asickernels.roi_align_vjp(
        features, rois, cotangent, backend="pallas_tpu", config=config, **statics
    )
    arrays["cotangent"] = cotangent
    oracle.assert_agrees(
        asickernels.roi_align_vjp, grad, oracle.expected(asickernels.roi_align_vjp, arrays, statics)
    )
    assert not np.any(np.asarray(grad)[1])


def test_config_of_the_wrong_kind_is_refused():
    boxes = np.zeros((3, 4), np.float32)
    with pytest.raises(TypeError, match="config: backend 'pallas_tpu' takes a GiouConfig"):
        asickernels.giou(boxes, boxes, backend="pallas_tpu", config=NmsConfig())


@pytest.mark.parametrize(
    "kind, generation",
    [
        ("TPU v4", "v4"),
        ("TPU v5 lite", "v5e"),
        ("TPU v5e", "v5e"),
        ("TPU v5p", "v5p"),
        ("TPU v5", "v5p"),
        ("TPU v6 lite", "v6e"),
        ("TPU7x", "v7x"),
        ("cpu", None),
        ("TPU v9000", None),
    ],
)
def test_generation_from_device_kind(kind, generation):
    assert tpu_generations.generation_of(kind) == generation


def test_a_cpu_device_has_no_generation():
    assert tpu_generations.generation_of(jax.devices("cpu")[0]) is None


def test_generation_table_is_consistent():
    for name, facts in tpu_generations.GENERATIONS.items():
        assert facts.name == name
        assert all(tpu_generations.generation_of(kind) == name for kind in facts.device_kinds)
        assert facts.peak_bf16_ops_per_s > 0 and facts.hbm_bytes_per_s > 0
    assert frozenset({"v5e", "v5p", "v6e"}) == tpu_generations.INT8_MXU
    with pytest.raises(ValueError, match="unknown TPU generation"):
        tpu_generations.get("v9")


def test_on_cpu_a_jitted_kernel_lowers_to_interpret_mode():
    x = jnp.ones((64, 128), jnp.int8)
    text = (
        jax.jit(lambda a, b: asickernels.int8_matmul(a, b, backend="pallas_tpu"))
        .lower(x, x.T)
        .as_text()
    )
    assert "tpu_custom_call" not in text


def test_vmapped_kernel_matches_the_reference():
    rng = np.random.default_rng(2)
    a, b = random_boxes(rng, (3, 200)), random_boxes(rng, (3, 200))
    got = jax.vmap(lambda p, q: asickernels.giou(p, q, backend="pallas_tpu"))(a, b)
    want = np.stack([reference_giou(p, q) for p, q in zip(a, b, strict=True)])
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-5)


@pytest.mark.parametrize(
    "n, seed, iou_threshold, max_output_size, tile, scale",
    [(1024, 0, 0.1, 128, 256, 1.0), (600, 1, 0.5, 600, 128, 0.125), (300, 2, 0.7, 50, 128, 0.125)],
)
def test_nms_loop_trip_model_matches_the_kernels_own_count(
    n, seed, iou_threshold, max_output_size, tile, scale
):
    """The schedule estimate takes the NMS kernel's data-dependent trip counts from
    ``nms.loop_trips``; the kernel, built to count its own loop trips, must agree."""
    from asickernels.backends.pallas_tpu import nms
    from asickernels.simulate.tpu_estimate.seed_kernels import seed_nms_inputs

    boxes, scores = seed_nms_inputs(n, seed=seed)
    boxes = boxes * scale  # smaller boxes: more kept, more tiles and passes
    kwargs = dict(iou_threshold=iou_threshold, max_output_size=max_output_size)
    model = nms.loop_trips(boxes, scores, tile=tile, **kwargs)
    counted = nms.counted_loop_trips(boxes, scores, config=NmsConfig(tile), **kwargs)
    assert model == counted
    assert model.tiles >= 1 and all(p >= 1 for p in model.passes)


def test_nms_ranks_in_kernel_and_after_an_xla_sort_agree():
    rng = np.random.default_rng(5)
    boxes = random_boxes(rng, (500,))
    scores = rng.integers(0, 50, 500).astype(np.float32)  # many ties: broken by index
    kwargs = dict(iou_threshold=0.3, max_output_size=200)
    results = [
        asickernels.nms(boxes, scores, backend="pallas_tpu", config=NmsConfig(128, limit), **kwargs)
        for limit in (0, 4096)
    ]
    want, _ = asickernels.nms(boxes, scores, backend="reference", **kwargs)
    for indices, _ in results:
        np.testing.assert_array_equal(np.asarray(indices), np.asarray(want))


def test_a_cpu_call_does_not_import_the_pallas_kernels():
    """A backend's kernel modules are imported when the policy first considers it: a CPU
    host's default call never does for Pallas (and ``import asickernels`` imports none)."""
    if jax.default_backend() != "cpu":
        pytest.skip("the default call runs on a CPU host only here")
    code = (
        "import sys, numpy as np, asickernels\n"
        "pallas = lambda: sorted(m for m in sys.modules if 'pallas_tpu.' in m)\n"
        "print(pallas())\n"
        "boxes = np.zeros((2, 4), np.float32)\n"
        "asickernels.giou(boxes, boxes)\n"
        "print(pallas())\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["[]", "[]"]
