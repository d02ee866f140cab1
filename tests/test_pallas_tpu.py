"""Pallas TPU backend specifics: TPU interpret mode's race detection, block-size configs,
generation handling. Numerical agreement is the conformance suite's job."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

import asickernels
from asickernels import reference
from asickernels.backends.pallas_tpu import tuning
from asickernels.testing.cases import random_boxes


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
            compiler_params=tuning.compiler_params(("parallel",), 0),
            interpret=tuning.interpret_param("tpu_interpret"),
        )
        return call(x)

    return run


def test_tpu_interpret_mode_catches_a_kernel_whose_parallel_steps_collide():
    x = jnp.zeros((64, 128), jnp.float32)
    jax.block_until_ready(_copy_blocks(lambda i: (i, 0))(x))
    tuning.check_no_races("tpu_interpret")  # disjoint blocks: no race

    jax.block_until_ready(_copy_blocks(lambda i: (0, 0))(x))  # every step writes block 0
    with pytest.raises(RuntimeError, match="data race"):
        tuning.check_no_races("tpu_interpret")


@pytest.mark.parametrize(
    "config",
    [tuning.Int8MatmulConfig(32, 128, 128), tuning.Int8MatmulConfig(64, 256, 384)],
)
def test_int8_matmul_block_override(config):
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (100, 300), dtype=np.int8)
    y = rng.integers(-128, 128, (300, 200), dtype=np.int8)
    got = asickernels.int8_matmul(x, y, backend="pallas_tpu", config=config)
    np.testing.assert_array_equal(np.asarray(got), reference.int8_matmul(x, y))


def test_giou_and_nms_block_overrides():
    rng = np.random.default_rng(1)
    a, b = random_boxes(rng, (700,)), random_boxes(rng, (700,))
    got = asickernels.giou(a, b, backend="pallas_tpu", config=tuning.GiouConfig(block_rows=16))
    np.testing.assert_allclose(np.asarray(got), reference.giou(a, b), atol=2e-5)
    scores = rng.permutation(700).astype(np.float32)
    kwargs = dict(iou_threshold=0.2, max_output_size=300)
    got_idx, _ = asickernels.nms(
        a, scores, backend="pallas_tpu", config=tuning.NmsConfig(tile=128), **kwargs
    )
    want_idx, _ = asickernels.nms(a, scores, backend="reference", **kwargs)
    np.testing.assert_array_equal(np.asarray(got_idx), np.asarray(want_idx))


@pytest.mark.parametrize(
    "make, error",
    [
        (
            lambda: tuning.Int8MatmulConfig(30, 128, 128),
            "block_m must be a positive multiple of 32",
        ),
        (
            lambda: tuning.Int8MatmulConfig(32, 100, 128),
            "block_n must be a positive multiple of 128",
        ),
        (lambda: tuning.NmsConfig(tile=64), "tile must be a positive multiple of 128"),
        (lambda: tuning.GiouConfig(block_rows=0), "block_rows must be a positive multiple of 16"),
    ],
)
def test_bad_configs_are_refused(make, error):
    with pytest.raises(ValueError, match=error):
        make()


def test_config_of_the_wrong_kind_is_refused():
    boxes = np.zeros((3, 4), np.float32)
    with pytest.raises(TypeError, match="config must be a GiouConfig"):
        asickernels.giou(boxes, boxes, backend="pallas_tpu", config=tuning.NmsConfig())


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
    ],
)
def test_generation_from_device_kind(kind, generation):
    assert tuning.generation_of(kind) == generation


def test_unknown_generation_is_refused():
    with pytest.raises(ValueError, match="unknown TPU generation"), tuning.compile_for("v9"):
        pass


def test_int8_matmul_on_a_generation_without_int8_mxu_warns_and_uses_xla():
    x = np.full((4, 8), 3, np.int8)
    with tuning.compile_for("v4"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = asickernels.int8_matmul(x, x.T.copy(), backend="pallas_tpu")
    np.testing.assert_array_equal(np.asarray(got), np.full((4, 4), 72))
    assert any("no int8 MXU" in str(w.message) for w in caught)
