"""GIOU forward and backward Pallas kernels.

Layout: boxes ``[P, 4]`` become coordinate planes ``[4, R, 128]`` (boxes on lanes, so every
vector op uses all 128 lanes, not 4 of them), padded with zero boxes to whole blocks of
``block_rows`` x 128. The grid walks row blocks; each step is independent ("parallel").
The backward kernel differentiates the same elementwise body (``jax.vjp`` inside the
kernel), so forward and gradient can never disagree on the formula.
"""

from __future__ import annotations

import functools
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


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _giou_planes(
    planes1: jax.Array, planes2: jax.Array, block_rows: int, mode: tuning.InterpretMode
) -> jax.Array:
    """``[4, R, 128]`` x2 -> ``[R, 128]`` float32; R a multiple of ``block_rows``."""
    planes_spec, rows_spec = _specs(block_rows)
    rows = planes1.shape[1]
    forward = pl.pallas_call(
        _forward_kernel,
        out_shape=jax.ShapeDtypeStruct((rows, LANES), jnp.float32),
        grid=(rows // block_rows,),
        in_specs=[planes_spec, planes_spec],
        out_specs=rows_spec,
        compiler_params=tuning.compiler_params(
            ("parallel",), _vmem_bytes(block_rows, planes1.dtype.itemsize, backward=False)
        ),
        interpret=tuning.interpret_param(mode),
        name="giou_forward",
    )
    return tuning.batchable(forward, mode)(planes1, planes2)


def _giou_planes_fwd(
    planes1: jax.Array, planes2: jax.Array, block_rows: int, mode: tuning.InterpretMode
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return _giou_planes(planes1, planes2, block_rows, mode), (planes1, planes2)


def _giou_planes_bwd(
    block_rows: int,
    mode: tuning.InterpretMode,
    residuals: tuple[jax.Array, jax.Array],
    g: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    planes1, planes2 = residuals
    planes_spec, rows_spec = _specs(block_rows)
    grad_shape = jax.ShapeDtypeStruct(planes1.shape, jnp.float32)
    backward = pl.pallas_call(
        _backward_kernel,
        out_shape=(grad_shape, grad_shape),
        grid=(planes1.shape[1] // block_rows,),
        in_specs=[planes_spec, planes_spec, rows_spec],
        out_specs=(planes_spec, planes_spec),
        compiler_params=tuning.compiler_params(
            ("parallel",), _vmem_bytes(block_rows, planes1.dtype.itemsize, backward=True)
        ),
        interpret=tuning.interpret_param(mode),
        name="giou_backward",
    )
    d1, d2 = tuning.batchable(backward, mode)(planes1, planes2, g.astype(jnp.float32))
    return d1.astype(planes1.dtype), d2.astype(planes2.dtype)


_giou_planes.defvjp(_giou_planes_fwd, _giou_planes_bwd)


def giou(
    boxes1: jax.Array,
    boxes2: jax.Array,
    *,
    config: tuning.GiouConfig | None = None,
    mode: tuning.InterpretMode = None,
) -> jax.Array:
    """``[P, 4]`` x2 (float32 or bfloat16; others are cast to float32) -> ``[P]`` float32."""
    cfg = tuning.config_for(tuning.GIOU_CONFIGS, tuning.GiouConfig(), config, tuning.GiouConfig)
    if boxes1.dtype not in (jnp.float32, jnp.bfloat16):
        boxes1, boxes2 = boxes1.astype(jnp.float32), boxes2.astype(jnp.float32)
    count = boxes1.shape[0]
    sublanes = 8 if boxes1.dtype == jnp.float32 else 16  # native sublane tiling of the dtype
    rows_needed = pl.cdiv(count, LANES)
    block_rows = min(cfg.block_rows, pl.cdiv(rows_needed, sublanes) * sublanes)
    rows = pl.cdiv(rows_needed, block_rows) * block_rows

    def to_planes(boxes: jax.Array) -> jax.Array:
        padded = jnp.pad(boxes.T, ((0, 0), (0, rows * LANES - count)))
        return padded.reshape(4, rows, LANES)

    out = _giou_planes(to_planes(boxes1), to_planes(boxes2), block_rows, mode)
    if not isinstance(out, jax.core.Tracer):
        tuning.check_no_races(mode)
    return out.reshape(-1)[:count]
