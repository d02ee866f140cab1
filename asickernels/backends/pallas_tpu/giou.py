"""GIOU forward and backward Pallas kernels.

Layout: boxes ``[P, 4]`` become coordinate planes ``[4, R, 128]`` (boxes on lanes, so every
vector op uses all 128 lanes, not 4 of them), padded with zero boxes to whole blocks of
``block_rows`` x 128. The grid walks row blocks; each step is independent ("parallel").
The backward kernel differentiates the same elementwise body (``jax.vjp`` inside the
kernel), so forward and gradient can never disagree on the formula.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from asickernels.backends.pallas_tpu import tuning
from asickernels.backends.xla.giou import giou_from_planes

LANES = 128


def _forward_kernel(b1_ref: Any, b2_ref: Any, out_ref: Any) -> None:
    # b*_ref: [4, block_rows, 128] input dtype; out_ref: [block_rows, 128] float32.
    coords = [ref[i].astype(jnp.float32) for ref in (b1_ref, b2_ref) for i in range(4)]
    out_ref[...] = giou_from_planes(*coords)


def _backward_kernel(b1_ref: Any, b2_ref: Any, g_ref: Any, d1_ref: Any, d2_ref: Any) -> None:
    # d*_ref: [4, block_rows, 128] float32 gradients of the planes.
    coords = [ref[i].astype(jnp.float32) for ref in (b1_ref, b2_ref) for i in range(4)]
    _, pullback = jax.vjp(giou_from_planes, *coords)
    grads = pullback(g_ref[...])
    for i in range(4):
        d1_ref[i] = grads[i]
        d2_ref[i] = grads[4 + i]


def _specs(block_rows: int) -> tuple[pl.BlockSpec, pl.BlockSpec]:
    planes = pl.BlockSpec((4, block_rows, LANES), lambda i: (0, i, 0))
    rows = pl.BlockSpec((block_rows, LANES), lambda i: (i, 0))
    return planes, rows


def _vmem_bytes(block_rows: int, itemsize: int, backward: bool) -> int:
    plane_block = 4 * block_rows * LANES
    row_block = block_rows * LANES * 4
    if backward:  # 2 planes in + g in, 2 planes out (f32), all double-buffered
        return 2 * (2 * plane_block * itemsize + row_block + 2 * plane_block * 4)
    return 2 * (2 * plane_block * itemsize + row_block)


def _layout(count: int, dtype: Any, block_rows: int) -> tuple[int, int]:
    """(block rows, padded rows) for ``count`` boxes: whole blocks of ``block_rows`` x 128,
    shrunk to the native sublane tiling of ``dtype`` for small inputs."""
    sublanes = 8 if dtype == jnp.float32 else 16
    rows_needed = pl.cdiv(count, LANES)
    block = min(block_rows, pl.cdiv(rows_needed, sublanes) * sublanes)
    return block, pl.cdiv(rows_needed, block) * block


def _to_planes(boxes: jax.Array, rows: int) -> jax.Array:
    padded = jnp.pad(boxes.T, ((0, 0), (0, rows * LANES - boxes.shape[0])))
    return padded.reshape(4, rows, LANES)


def _forward(
    config: tuning.GiouConfig | None, target: tuning.Target
) -> Callable[[jax.Array, jax.Array], jax.Array]:
    cfg = tuning.config_for(tuning.GIOU_CONFIGS, tuning.GiouConfig(), config, target.generation)

    def forward(boxes1: jax.Array, boxes2: jax.Array) -> jax.Array:
        count = boxes1.shape[0]
        block_rows, rows = _layout(count, boxes1.dtype, cfg.block_rows)
        planes_spec, rows_spec = _specs(block_rows)
        call = pl.pallas_call(
            _forward_kernel,
            out_shape=jax.ShapeDtypeStruct((rows, LANES), jnp.float32),
            grid=(rows // block_rows,),
            in_specs=[planes_spec, planes_spec],
            out_specs=rows_spec,
            compiler_params=tuning.compiler_params(
                ("parallel",),
                _vmem_bytes(block_rows, boxes1.dtype.itemsize, backward=False),
                target.generation,
            ),
            interpret=target.interpret,
            name="giou_forward",
        )
        return call(_to_planes(boxes1, rows), _to_planes(boxes2, rows)).reshape(-1)[:count]

    return forward


def _backward(
    config: tuning.GiouConfig | None, target: tuning.Target
) -> Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]:
    cfg = tuning.config_for(tuning.GIOU_CONFIGS, tuning.GiouConfig(), config, target.generation)

    def backward(boxes1: jax.Array, boxes2: jax.Array, g: jax.Array) -> tuple[jax.Array, jax.Array]:
        count = boxes1.shape[0]
        block_rows, rows = _layout(count, boxes1.dtype, cfg.block_rows)
        planes_spec, rows_spec = _specs(block_rows)
        grad_shape = jax.ShapeDtypeStruct((4, rows, LANES), jnp.float32)
        call = pl.pallas_call(
            _backward_kernel,
            out_shape=(grad_shape, grad_shape),
            grid=(rows // block_rows,),
            in_specs=[planes_spec, planes_spec, rows_spec],
            out_specs=(planes_spec, planes_spec),
            compiler_params=tuning.compiler_params(
                ("parallel",),
                _vmem_bytes(block_rows, boxes1.dtype.itemsize, backward=True),
                target.generation,
            ),
            interpret=target.interpret,
            name="giou_backward",
        )
        g_rows = jnp.pad(g.astype(jnp.float32), (0, rows * LANES - count)).reshape(rows, LANES)
        d1, d2 = call(_to_planes(boxes1, rows), _to_planes(boxes2, rows), g_rows)
        return tuple(  # type: ignore[return-value]
            d.reshape(4, -1)[:, :count].T.astype(b.dtype) for d, b in ((d1, boxes1), (d2, boxes2))
        )

    return backward


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _giou(
    boxes1: jax.Array,
    boxes2: jax.Array,
    config: tuning.GiouConfig | None,
    mode: tuning.InterpretMode,
) -> jax.Array:
    return tuning.run(tuning.Build(_forward, (config,)), mode, boxes1, boxes2)  # type: ignore[no-any-return]


def _giou_fwd(
    boxes1: jax.Array,
    boxes2: jax.Array,
    config: tuning.GiouConfig | None,
    mode: tuning.InterpretMode,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return _giou(boxes1, boxes2, config, mode), (boxes1, boxes2)


def _giou_bwd(
    config: tuning.GiouConfig | None,
    mode: tuning.InterpretMode,
    residuals: tuple[jax.Array, jax.Array],
    g: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    boxes1, boxes2 = residuals
    return tuning.run(tuning.Build(_backward, (config,)), mode, boxes1, boxes2, g)  # type: ignore[no-any-return]


_giou.defvjp(_giou_fwd, _giou_bwd)


def giou(
    boxes1: jax.Array,
    boxes2: jax.Array,
    *,
    config: tuning.GiouConfig | None = None,
    mode: tuning.InterpretMode = None,
) -> jax.Array:
    """``[P, 4]`` x2 (float32 or bfloat16; others are cast to float32) -> ``[P]`` float32."""
    tuning.check_config(config, tuning.GiouConfig)
    if boxes1.dtype not in (jnp.float32, jnp.bfloat16):
        boxes1, boxes2 = boxes1.astype(jnp.float32), boxes2.astype(jnp.float32)
    return _giou(boxes1, boxes2, config, mode)
