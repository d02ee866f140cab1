"""int8 x int8 -> int32 matmul Pallas kernel, with optional fused dequantization.

Grid ``(M/bm, N/bn, K/bk)`` with K last and "arbitrary": an int32 VMEM accumulator is
zeroed at k == 0 and written out (dequantized when scales are given) at the last k step.
Ragged M, N, K are zero-padded to whole blocks: zero rows/columns add exactly 0 to the
integer sums, and the padding is sliced off the result.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from asickernels.backends.pallas_tpu import tuning
from asickernels.backends.xla import int8_matmul as xla_int8_matmul


def _kernel(x_ref: Any, y_ref: Any, *refs: Any, k_steps: int, scaled: bool) -> None:
    # x_ref [bm, bk] int8, y_ref [bk, bn] int8; with scales: xs_ref [bm, 1], ys_ref [1, bn]
    # float32; out_ref [bm, bn]; acc_ref [bm, bn] int32 scratch.
    if scaled:
        xs_ref, ys_ref, out_ref, acc_ref = refs
    else:
        out_ref, acc_ref = refs
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _zero() -> None:
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.int32)

    @pl.when(k == k_steps - 1)
    def _write() -> None:
        if scaled:
            scaled_acc = acc_ref[...].astype(jnp.float32) * xs_ref[...] * ys_ref[...]
            out_ref[...] = scaled_acc.astype(out_ref.dtype)
        else:
            out_ref[...] = acc_ref[...]


def _round_up(value: int, multiple: int) -> int:
    return pl.cdiv(value, multiple) * multiple


def int8_matmul(
    x: jax.Array,
    y: jax.Array,
    *,
    x_scale: jax.Array | None,
    y_scale: jax.Array | None,
    out_dtype: Any,
    config: tuning.Int8MatmulConfig | None = None,
    mode: tuning.InterpretMode = None,
) -> jax.Array:
    """``x [M, K]`` int8 @ ``y [K, N]`` int8 -> ``[M, N]`` int32, or ``out_dtype`` when
    ``x_scale [M]`` and ``y_scale [N]`` (float32) are given. On TPUs without an int8 MXU
    (v4, v7x) this warns and runs XLA's int8 dot instead."""
    generation = tuning.target_generation()
    if mode is None and generation in tuning.NO_INT8_MXU:
        warnings.warn(
            f"TPU {generation} has no int8 MXU path; int8_matmul falls back to XLA",
            RuntimeWarning,
            stacklevel=2,
        )
        return xla_int8_matmul.int8_matmul(
            x, y, x_scale=x_scale, y_scale=y_scale, out_dtype=out_dtype
        )
    return pallas_int8_matmul(
        x, y, x_scale=x_scale, y_scale=y_scale, out_dtype=out_dtype, config=config, mode=mode
    )


def pallas_int8_matmul(
    x: jax.Array,
    y: jax.Array,
    *,
    x_scale: jax.Array | None,
    y_scale: jax.Array | None,
    out_dtype: Any,
    config: tuning.Int8MatmulConfig | None = None,
    mode: tuning.InterpretMode = None,
) -> jax.Array:
    """The Pallas kernel itself, with no fallback (see :func:`int8_matmul`)."""
    cfg = tuning.config_for(
        tuning.INT8_MATMUL_CONFIGS, tuning.Int8MatmulConfig(), config, tuning.Int8MatmulConfig
    )
    (m, k), n = x.shape, y.shape[1]
    bm = min(cfg.block_m, _round_up(m, 32))
    bn = min(cfg.block_n, _round_up(n, 128))
    bk = min(cfg.block_k, _round_up(k, 128))
    mp, np_, kp = _round_up(m, bm), _round_up(n, bn), _round_up(k, bk)
    x = jnp.pad(x, ((0, mp - m), (0, kp - k)))
    y = jnp.pad(y, ((0, kp - k), (0, np_ - n)))
    scaled = x_scale is not None and y_scale is not None
    out_dtype = jnp.dtype(out_dtype) if scaled else jnp.dtype(jnp.int32)

    in_specs = [
        pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
        pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
    ]
    operands = [x, y]
    if scaled:
        assert x_scale is not None and y_scale is not None
        in_specs += [
            pl.BlockSpec((bm, 1), lambda i, j, kk: (i, 0)),
            pl.BlockSpec((1, bn), lambda i, j, kk: (0, j)),
        ]
        operands += [
            jnp.pad(x_scale.astype(jnp.float32), (0, mp - m)).reshape(mp, 1),
            jnp.pad(y_scale.astype(jnp.float32), (0, np_ - n)).reshape(1, np_),
        ]
    # Double-buffered int8 inputs and output, the int32 accumulator, the (lane-padded) scales.
    vmem = 2 * (bm * bk + bk * bn) + 2 * bm * bn * out_dtype.itemsize + 4 * bm * bn
    vmem += 2 * 4 * (bm * 128 + 8 * bn) if scaled else 0
    kernel_call = pl.pallas_call(
        functools.partial(_kernel, k_steps=kp // bk, scaled=scaled),
        out_shape=jax.ShapeDtypeStruct((mp, np_), out_dtype),
        grid=(mp // bm, np_ // bn, kp // bk),
        in_specs=in_specs,
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.int32)],
        compiler_params=tuning.compiler_params(("parallel", "parallel", "arbitrary"), vmem),
        interpret=tuning.interpret_param(mode),
        name="int8_matmul",
    )
    out = tuning.batchable(kernel_call, mode)(*operands)
    if not isinstance(out, jax.core.Tracer):
        tuning.check_no_races(mode)
    return out[:m, :n]
