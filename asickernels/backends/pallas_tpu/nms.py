"""Tiled greedy NMS Pallas kernel (the design of TF's padded NMS, in VMEM-sized tiles).

Mosaic has no sort, so candidates are sorted outside the kernel (descending score, ties by
index); the kernel then decides boxes ``tile`` at a time, in that order:

1. cross suppression: a box of the current tile dies if a box *kept* in an earlier tile
   overlaps it (IoU > threshold, same category). Per earlier tile that is one
   ``[tile, tile]`` IoU mask and one MXU product with the earlier tile's keep flags;
2. self suppression: within the tile, greedy order is resolved by iterating
   ``alive = start & not(any earlier alive box in the tile suppresses it)`` to its fixed
   point, which is exactly the greedy result (box b depends only on boxes before it, so
   each pass fixes at least one more position) and usually takes a few passes.

The loop over tiles stops once ``max_output_size`` boxes are kept. Memory is O(N) for the
boxes plus O(tile^2) for one mask, instead of the N x N masks of the seed design, so N =
16384 fits. Keep flags come back in sorted order and are compacted to padded indices in XLA.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from asickernels.backends.pallas_tpu import tuning
from asickernels.backends.xla.nms import indices_from_keep, sort_candidates

# Rows of the per-box input: coordinates, area, eligibility, dense category rank.
X1, Y1, X2, Y2, AREA, ELIGIBLE, CATEGORY = range(7)
ROWS = 8  # padded to a full sublane tile


def _suppression_mask(columns: jax.Array, rows: jax.Array, iou_threshold: float) -> jax.Array:
    """``[T, 1]``-shaped fields of tile A (``columns [T, 8]``) against tile B's ``rows
    [8, T]`` -> ``[T_A, T_B]`` float32, 1 where they overlap by IoU > threshold and share a
    category (the reference's NMS IoU: 0 when the union is not positive)."""

    def col(field: int) -> jax.Array:
        return columns[:, field : field + 1]

    def row(field: int) -> jax.Array:
        return rows[field : field + 1, :]

    iw = jnp.maximum(jnp.minimum(col(X2), row(X2)) - jnp.maximum(col(X1), row(X1)), 0.0)
    ih = jnp.maximum(jnp.minimum(col(Y2), row(Y2)) - jnp.maximum(col(Y1), row(Y1)), 0.0)
    inter = iw * ih
    union = col(AREA) + row(AREA) - inter
    positive = union > 0
    iou = jnp.where(positive, inter / jnp.where(positive, union, 1.0), 0.0)
    overlap = (iou > iou_threshold) & (col(CATEGORY) == row(CATEGORY))
    return overlap.astype(jnp.float32)


def _count_suppressors(flags: jax.Array, mask: jax.Array) -> jax.Array:
    """``flags [1, T_B]`` (0/1) and ``mask [T_A, T_B]`` -> ``[1, T_A]`` counts of flagged B
    boxes suppressing each A box. An NT product on the MXU, which also turns the column
    orientation of A back into a row; 0/1 operands keep it exact."""
    flags = jnp.broadcast_to(flags, (8, flags.shape[1]))  # the MXU wants >= 8 rows
    counts = lax.dot_general(
        flags, mask, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
    )
    return counts[0:1, :]


def _kernel(
    rows_ref: Any, keep_ref: Any, *, tile: int, iou_threshold: float, max_output_size: int
) -> None:
    # rows_ref [8, Np] float32 (batch dim squeezed); keep_ref [1, Np] float32 0/1 flags.
    tiles = rows_ref.shape[1] // tile
    keep_ref[...] = jnp.zeros_like(keep_ref)
    earlier = lax.broadcasted_iota(jnp.int32, (tile, tile), 1) < lax.broadcasted_iota(
        jnp.int32, (tile, tile), 0
    )

    def lanes(t: jax.Array) -> Any:
        return pl.ds(pl.multiple_of(t * tile, tile), tile)

    def decide_tile(state: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        t, kept = state
        rows_t = rows_ref[:, lanes(t)]
        columns_t = rows_t.T

        def cross(s: jax.Array, suppressors: jax.Array) -> jax.Array:
            mask = _suppression_mask(columns_t, rows_ref[:, lanes(s)], iou_threshold)
            return suppressors + _count_suppressors(keep_ref[:, lanes(s)], mask)

        suppressors = lax.fori_loop(0, t, cross, jnp.zeros((1, tile), jnp.float32))
        start = jnp.where(suppressors > 0, 0.0, rows_t[ELIGIBLE : ELIGIBLE + 1, :])
        self_mask = jnp.where(earlier, _suppression_mask(columns_t, rows_t, iou_threshold), 0.0)

        def resolve(
            state: tuple[jax.Array, jax.Array, jax.Array],
        ) -> tuple[jax.Array, jax.Array, jax.Array]:
            alive, _, passes = state
            new = jnp.where(_count_suppressors(alive, self_mask) > 0, 0.0, start)
            return new, jnp.sum(jnp.abs(new - alive)), passes + 1

        def unresolved(state: tuple[jax.Array, jax.Array, jax.Array]) -> jax.Array:
            _, changes, passes = state
            return (changes > 0) & (passes <= tile)

        alive, _, _ = lax.while_loop(unresolved, resolve, (start, jnp.float32(1.0), jnp.int32(0)))
        keep_ref[:, lanes(t)] = alive
        return t + 1, kept + jnp.sum(alive).astype(jnp.int32)

    def more(state: tuple[jax.Array, jax.Array]) -> jax.Array:
        t, kept = state
        return (t < tiles) & (kept < max_output_size)

    lax.while_loop(more, decide_tile, (jnp.int32(0), jnp.int32(0)))


def _kernel_rows(
    boxes: jax.Array, eligible: jax.Array, categories: jax.Array | None, padded: int
) -> jax.Array:
    """Sorted ``boxes [N, 4]`` etc. -> ``[8, padded]`` float32 kernel rows."""
    if categories is None:
        ranks = jnp.zeros(eligible.shape, jnp.float32)
    else:
        # Dense ranks: exact in float32 for any int32 ids (ranks < N < 2^24).
        ranks = jnp.searchsorted(jnp.sort(categories), categories, method="sort")
        ranks = ranks.astype(jnp.float32)
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    coordinates = [boxes[:, i] for i in range(4)]
    rows = jnp.stack(
        [*coordinates, area, eligible.astype(jnp.float32), ranks, jnp.zeros_like(area)]
    )
    return jnp.pad(rows, ((0, 0), (0, padded - boxes.shape[0])))


def _build(
    config: tuning.NmsConfig | None,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float,
    target: tuning.Target,
) -> Callable[..., tuple[jax.Array, jax.Array]]:
    cfg = tuning.config_for(tuning.NMS_CONFIGS, tuning.NmsConfig(), config, target.generation)

    def run(
        boxes: jax.Array, scores: jax.Array, *categories: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        batch, n = scores.shape
        tile = min(cfg.tile, pl.cdiv(n, 128) * 128)
        padded = pl.cdiv(n, tile) * tile

        def prepare(b: jax.Array, s: jax.Array, *c: jax.Array) -> tuple[jax.Array, jax.Array]:
            cand = sort_candidates(b, s, c[0] if c else None, score_threshold)
            sorted_categories = cand.categories if c else None
            return cand.order, _kernel_rows(cand.boxes, cand.eligible, sorted_categories, padded)

        order, rows = jax.vmap(prepare)(boxes, scores, *categories)
        # Double-buffered rows and flags (flags pad to 8 sublanes), plus ~4 [tile, tile]
        # temporaries.
        vmem = 2 * (ROWS * padded * 4) * 2 + 4 * tile * tile * 4
        call = pl.pallas_call(
            functools.partial(
                _kernel, tile=tile, iou_threshold=iou_threshold, max_output_size=max_output_size
            ),
            out_shape=jax.ShapeDtypeStruct((batch, 1, padded), jnp.float32),
            grid=(batch,),
            in_specs=[pl.BlockSpec((None, ROWS, padded), lambda b: (b, 0, 0))],
            out_specs=pl.BlockSpec((None, 1, padded), lambda b: (b, 0, 0)),
            compiler_params=tuning.compiler_params(("parallel",), vmem, target.generation),
            interpret=target.interpret,
            name="nms_tiled",
        )
        flags = call(rows)[:, 0, :n] > 0
        select = functools.partial(indices_from_keep, max_output_size=max_output_size)
        return jax.vmap(select)(order, flags)  # type: ignore[no-any-return]

    return run


def nms(
    boxes: jax.Array,
    scores: jax.Array,
    categories: jax.Array | None,
    *,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float,
    config: tuning.NmsConfig | None = None,
    mode: tuning.InterpretMode = None,
) -> tuple[jax.Array, jax.Array]:
    """``boxes [B, N, 4]``, ``scores [B, N]`` -> (``[B, max_output_size]`` int32 indices
    padded with -1, ``[B]`` int32 counts)."""
    tuning.check_config(config, tuning.NmsConfig)
    static = (config, float(iou_threshold), int(max_output_size), float(score_threshold))
    build = tuning.Build(_build, static)
    extra = () if categories is None else (categories,)
    return tuning.run(build, mode, boxes, scores, *extra)  # type: ignore[no-any-return]
