"""int8 x int8 -> int32 matmul Pallas kernel, with optional fused dequantization.

Grid ``(M/bm, N/bn, K/bk)`` with K last and "arbitrary": an int32 VMEM accumulator takes
the first K step's product, adds the middle ones, and the last step's sum is written out
(dequantized when scales are given); with K in one block there is no accumulator.
A dimension no larger than its block is one whole block; a ragged K is zero-padded (zeros
add exactly 0 to the integer sums); ragged M and N end in partial blocks, whose
out-of-range rows and columns only reach outputs Pallas does not write. Block sizes come
per generation and per shape class (:func:`block_sizes`, from
:data:`~asickernels.backends.pallas_tpu.tuned_block_sizes.INT8_MATMUL`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from asickernels import tpu_generations as generations
from asickernels.backends.pallas_tpu import BACKEND, lowering, tuned_block_sizes
from asickernels.kernels import public as ops
from asickernels.pallas_home import pl, pltpu


@dataclasses.dataclass(frozen=True)
class Int8MatmulConfig:
    """int8 matmul blocks: ``block_m`` a multiple of 32 (int8 sublane tiling), ``block_n``
    and ``block_k`` multiples of 128 (lanes). K is the last, sequential grid axis."""

    block_m: int = 512
    block_n: int = 512
    block_k: int = 1024

    def __post_init__(self) -> None:
        if self.block_m <= 0 or self.block_m % 32:
            raise ValueError(f"block_m must be a positive multiple of 32, got {self.block_m}")
        for name in ("block_n", "block_k"):
            value = getattr(self, name)
            if value <= 0 or value % 128:
                raise ValueError(f"{name} must be a positive multiple of 128, got {value}")


def block_sizes(generation: str, m: int) -> Int8MatmulConfig:
    """The tuned blocks for ``m`` rows on ``generation`` (the defaults where it has none)."""
    for largest, blocks in tuned_block_sizes.INT8_MATMUL.get(generation, ()):
        if largest is None or m <= largest:
            return Int8MatmulConfig(*blocks)
    return Int8MatmulConfig()


def _kernel(x_ref: Any, y_ref: Any, *refs: Any, k_steps: int, scaled: bool) -> None:
    # x_ref [bm, bk] int8, y_ref [bk, bn] int8; with scales: xs_ref [bm, 1], ys_ref [1, bn]
    # float32; out_ref [bm, bn]; with more than one K step, acc_ref [bm, bn] int32 scratch.
    xs_ref, ys_ref = refs[:2] if scaled else (None, None)
    out_ref = refs[2 if scaled else 0]

    def write(total: jax.Array) -> None:
        if xs_ref is not None and ys_ref is not None:
            out_ref[...] = (total.astype(jnp.float32) * xs_ref[...] * ys_ref[...]).astype(
                out_ref.dtype
            )
        else:
            out_ref[...] = total

    product = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.int32)
    if k_steps == 1:  # the whole K in one block: no accumulator round trips
        write(product)
        return
    acc_ref = refs[-1]
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _first() -> None:
        acc_ref[...] = product

    @pl.when((k > 0) & (k < k_steps - 1))
    def _accumulate() -> None:
        acc_ref[...] += product

    @pl.when(k == k_steps - 1)
    def _last() -> None:
        write(acc_ref[...] + product)


def _k_block(k: int, block_k: int) -> int:
    """K's block: all of K when it fits, else the largest multiple of 128 up to ``block_k``
    that divides K when there is one of at least half ``block_k`` (no padding), else
    ``block_k`` (K is zero-padded)."""
    if k <= block_k:
        return k
    for candidate in range(block_k, block_k // 2 - 1, -128):
        if k % candidate == 0:
            return candidate
    return block_k


def _round_up(value: int, multiple: int) -> int:
    return pl.cdiv(value, multiple) * multiple


def _build(
    config: Int8MatmulConfig | None, out_dtype: str, target: lowering.Target
) -> Callable[..., jax.Array]:
    if target.mosaic and target.generation not in generations.INT8_MXU:
        # Mosaic refuses int8 x int8 there; say so before its compiler error does.
        raise NotImplementedError(
            f"TPU {target.generation} has no int8 MXU path (int8 MXU: "
            f"{', '.join(sorted(generations.INT8_MXU))}); use backend='xla' on it"
        )

    def matmul(x: jax.Array, y: jax.Array, *scales: jax.Array) -> jax.Array:
        (m, k), n = x.shape, y.shape[1]
        cfg = config or block_sizes(target.generation, m)
        # A dimension no larger than its block is one whole block (legal at any size).
        bm, bn = min(m, cfg.block_m), min(n, cfg.block_n)
        bk = _k_block(k, cfg.block_k)
        kp = _round_up(k, bk)
        scaled = bool(scales)
        dtype = jnp.dtype(out_dtype) if scaled else jnp.dtype(jnp.int32)
        in_specs = [
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
        ]
        # Only K is zero-padded (zeros add exactly 0 to the sums). Ragged M and N end in
        # partial blocks: their out-of-range rows/columns meet only out-of-range outputs,
        # whose writes Pallas drops.
        operands = [
            x if kp == k else jnp.pad(x, ((0, 0), (0, kp - k))),
            y if kp == k else jnp.pad(y, ((0, kp - k), (0, 0))),
        ]
        if scaled:
            x_scale, y_scale = scales
            in_specs += [
                pl.BlockSpec((bm, 1), lambda i, j, kk: (i, 0)),
                pl.BlockSpec((1, bn), lambda i, j, kk: (0, j)),
            ]
            operands += [
                x_scale.astype(jnp.float32).reshape(m, 1),
                y_scale.astype(jnp.float32).reshape(1, n),
            ]
        # Double-buffered int8 inputs and output, the int32 accumulator, the (lane-padded)
        # scales.
        vmem = 2 * (bm * bk + bk * bn) + 2 * bm * bn * dtype.itemsize + 4 * bm * bn * (kp > bk)
        vmem += 2 * 4 * (bm * 128 + 8 * bn) if scaled else 0
        call = pl.pallas_call(
            functools.partial(_kernel, k_steps=kp // bk, scaled=scaled),
            out_shape=jax.ShapeDtypeStruct((m, n), dtype),
            grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), kp // bk),
            in_specs=in_specs,
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.int32)] if kp > bk else [],
            compiler_params=lowering.compiler_params(
                ("parallel", "parallel", "arbitrary"), vmem, target.generation
            ),
            interpret=target.interpret,
            name="int8_matmul",
        )
        return call(*operands)  # type: ignore[no-any-return]

    return matmul


# v4 and v7x have no int8 MXU path: the policy runs XLA there (and says so).
@BACKEND.implements(ops.int8_matmul, generations=generations.INT8_MXU, config=Int8MatmulConfig)
def int8_matmul(
    x: jax.Array,
    y: jax.Array,
    *,
    config: Int8MatmulConfig | None = None,
    mode: lowering.InterpretMode = None,
    x_scale: jax.Array | None,
    y_scale: jax.Array | None,
    out_dtype: np.dtype,
) -> jax.Array:
    """``x [M, K]`` int8 @ ``y [K, N]`` int8 -> ``[M, N]`` int32, or ``out_dtype`` when
    ``x_scale [M]`` and ``y_scale [N]`` (float32) are given. Lowered for a TPU without an
    int8 MXU path (see :data:`asickernels.tpu_generations.INT8_MXU`) it raises
    NotImplementedError: choosing another backend there is the selection policy's job."""
    scales = () if x_scale is None or y_scale is None else (x_scale, y_scale)
    dtype = jnp.dtype(out_dtype).name if scales else "int32"
    build = lowering.Build(_build, (config, dtype))
    return lowering.run(build, mode, x, y, *scales)  # type: ignore[no-any-return]
