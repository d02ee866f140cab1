"""Tiled greedy NMS Pallas kernel (the design of TF's padded NMS, in VMEM-sized tiles).

Mosaic has no sort, so XLA sorts the scores (descending, ties by index) into ``order``;
everything else happens in the kernel, ``tile`` sorted positions at a time:

1. gather: the tile's boxes are fetched from the unsorted input by an MXU product with a
   one-hot ``[N, tile]`` matrix (``order[p] == i``). Each float32 field is split into
   three bfloat16-exact parts (bit truncation), so the product is exact;
2. cross suppression: a box of the tile dies if a box *kept* in an earlier tile overlaps
   it (IoU > threshold, same category). Per earlier tile that is one ``[tile, tile]`` IoU
   mask and one MXU product with the earlier tile's keep flags;
3. self suppression: within the tile, greedy order is resolved by iterating
   ``alive = start & not(any earlier alive box in the tile suppresses it)`` to its fixed
   point, which is exactly the greedy result (box b depends only on boxes before it, so
   each pass fixes at least one more position) and usually takes a few passes;
4. compaction: kept boxes get output slots ``kept so far + prefix count`` (an MXU product
   with a triangular matrix) and their original indices are written to those slots by
   another exact one-hot product.

The loop over tiles stops once ``max_output_size`` boxes are kept. Memory is O(N) for the
boxes plus O(tile^2) for one mask, so N = 16384 fits. :func:`loop_trips` predicts the
kernel's data-dependent trip counts (for the schedule estimate); the kernel counts them
itself when built with ``count_trips`` (how the tests check the prediction).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from asickernels import tpu_generations as generations
from asickernels.backends.pallas_tpu import BACKEND, lowering
from asickernels.kernels import public as ops
from asickernels.kernels.nms import dense_ranks
from asickernels.pallas_home import pl, pltpu

# Fields of a box (rows of the kernel's input): coordinates, area (computed in the kernel),
# eligibility, dense category rank, original index.
X1, Y1, X2, Y2, AREA, ELIGIBLE, CATEGORY, INDEX = range(8)
ROWS = 8  # padded to a full sublane tile


@dataclasses.dataclass(frozen=True)
class NmsConfig:
    """Tiled NMS: boxes are decided ``tile`` at a time (a multiple of 128). Up to
    ``rank_in_kernel_max`` (padded) boxes the kernel ranks the scores itself (N^2 compares);
    above, XLA sorts them first."""

    tile: int = 256
    rank_in_kernel_max: int = 2048

    def __post_init__(self) -> None:
        if self.tile <= 0 or self.tile % 128:
            raise ValueError(f"tile must be a positive multiple of 128, got {self.tile}")
        if self.rank_in_kernel_max < 0:
            raise ValueError(f"rank_in_kernel_max must be >= 0, got {self.rank_in_kernel_max}")


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


def _split3(values: jax.Array) -> list[jax.Array]:
    """float32 ``values`` -> three float32 arrays, each exactly a bfloat16, summing exactly
    to ``values`` (truncation to the top 8 significand bits, three times; finite inputs)."""
    parts = []
    rest = values
    for _ in range(2):
        bits = lax.bitcast_convert_type(rest, jnp.int32) & jnp.int32(-65536)
        part = lax.bitcast_convert_type(bits, jnp.float32)
        parts.append(part)
        rest = rest - part
    return [*parts, rest]


def _exact_dot(values: jax.Array, onehot: jax.Array, onehot_contracts: int) -> jax.Array:
    """``values [R, K]`` float32 (R <= 8, finite) x a 0/1 bfloat16 ``onehot`` (``[K, C]``
    when ``onehot_contracts`` is 0, ``[C, K]`` when 1) -> ``[R, C]`` float32, exact: one
    bfloat16 MXU product of the 3-way split (each output picks at most one value)."""
    rows = values.shape[0]
    # 32 rows: whole bfloat16 sublane tiles (16 rows each).
    parts = jnp.concatenate([*_split3(values), jnp.zeros((32 - 3 * rows, values.shape[1]))], 0)
    product = lax.dot_general(
        parts.astype(jnp.bfloat16),
        onehot,
        (((1,), (onehot_contracts,)), ((), ())),
        preferred_element_type=jnp.float32,
    )
    return product[0:rows] + product[rows : 2 * rows] + product[2 * rows : 3 * rows]


def _ranks(keys: jax.Array, block: int) -> jax.Array:
    """``keys [1, Np]`` float32 -> ``[1, Np]`` float32 sorted positions: how many keys are
    smaller, or equal with a smaller index (a stable ascending sort's rank). One
    ``[block, Np]`` comparison per block of ``block`` keys (unrolled: used for small N)."""
    padded = keys.shape[1]
    key_column = jnp.broadcast_to(keys, (8, padded)).T  # [Np, 8]
    index = lax.broadcasted_iota(jnp.int32, (block, padded), 1)
    ranks = jnp.zeros((1, padded), jnp.float32)
    for first in range(0, padded, block):
        other = key_column[first : first + block, 0:1]
        other_index = lax.broadcasted_iota(jnp.int32, (block, padded), 0) + first
        before = (other < keys) | ((other == keys) & (other_index < index))
        ranks += jnp.sum(before.astype(jnp.float32), axis=0, keepdims=True)
    return ranks


def _kernel(
    sort_ref: Any,
    fields_ref: Any,
    out_ref: Any,
    *refs: Any,
    tile: int,
    chunk: int,
    iou_threshold: float,
    max_output_size: int,
    count_trips: bool,
    rank_in_kernel: bool,
) -> None:
    # sort_ref [1, Np]: int32 original index at each sorted position (XLA sorted), or with
    # rank_in_kernel float32 sort keys in original order (the kernel ranks them); fields_ref
    # [8, Np] float32 in original order (rows X1..INDEX, AREA unset); out_ref [1, Mp]
    # float32: original index + 1 of the kept boxes in selection order, 0 past the last.
    # With count_trips, trips_ref [8, Tp]: [0, 0] tiles decided, [1, t] fixed-point passes
    # and [2, t] cross-suppression steps of tile t. Scratch: sorted_ref [8, Np] the fields
    # in sorted order (filled tile by tile), keep_ref [1, Np] 0/1 keep flags (sorted),
    # rank_ref [1, Np] (with rank_in_kernel) the sorted position of each original box.
    trips_ref = refs[0] if count_trips else None
    sorted_ref, keep_ref, rank_ref = refs[-3:]
    padded = fields_ref.shape[1]
    tiles = padded // tile
    slots = out_ref.shape[1]
    out_ref[...] = jnp.zeros_like(out_ref)
    keep_ref[...] = jnp.zeros_like(keep_ref)
    if trips_ref is not None:
        trips_ref[...] = jnp.zeros_like(trips_ref)
    earlier = lax.broadcasted_iota(jnp.int32, (tile, tile), 1) < lax.broadcasted_iota(
        jnp.int32, (tile, tile), 0
    )
    # Inclusive prefix sums as an NT product: at_or_before[p, q] = q <= p.
    at_or_before = (
        lax.broadcasted_iota(jnp.int32, (tile, tile), 1)
        <= lax.broadcasted_iota(jnp.int32, (tile, tile), 0)
    ).astype(jnp.float32)

    def lanes(t: jax.Array) -> Any:
        return pl.ds(pl.multiple_of(t * tile, tile), tile)

    if rank_in_kernel:
        rank_ref[...] = _ranks(sort_ref[...], tile)

    def gather(t: jax.Array) -> jax.Array:
        def add_chunk(c: jax.Array, acc: jax.Array) -> jax.Array:
            first = pl.multiple_of(c * chunk, chunk)
            fields = fields_ref[:, pl.ds(first, chunk)]
            if rank_in_kernel:  # onehot[p, i] = rank[i] == t * T + p
                positions = lax.broadcasted_iota(jnp.int32, (tile, chunk), 0) + t * tile
                onehot = positions.astype(jnp.float32) == rank_ref[:, pl.ds(first, chunk)]
                return acc + _exact_dot(fields, onehot.astype(jnp.bfloat16), 1)
            ids = lax.broadcasted_iota(jnp.int32, (chunk, tile), 0) + first
            onehot = ids == sort_ref[:, lanes(t)]  # onehot[i, p] = order[t * T + p] == i
            return acc + _exact_dot(fields, onehot.astype(jnp.bfloat16), 0)

        rows = lax.fori_loop(0, padded // chunk, add_chunk, jnp.zeros((ROWS, tile), jnp.float32))
        area = (rows[X2 : X2 + 1] - rows[X1 : X1 + 1]) * (rows[Y2 : Y2 + 1] - rows[Y1 : Y1 + 1])
        is_area = lax.broadcasted_iota(jnp.int32, rows.shape, 0) == AREA
        return jnp.where(is_area, area, rows)

    def decide_tile(state: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        t, kept = state
        rows_t = gather(t)
        sorted_ref[:, lanes(t)] = rows_t
        columns_t = rows_t.T

        def cross(s: jax.Array, suppressors: jax.Array) -> jax.Array:
            mask = _suppression_mask(columns_t, sorted_ref[:, lanes(s)], iou_threshold)
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

        alive, _, passes = lax.while_loop(
            unresolved, resolve, (start, jnp.float32(1.0), jnp.int32(0))
        )
        keep_ref[:, lanes(t)] = alive
        # Output slots of this tile's kept boxes, then their indices into those slots.
        slot = kept.astype(jnp.float32) + _count_suppressors(alive, at_or_before) - 1.0
        placed = lax.broadcasted_iota(jnp.int32, (slots, tile), 0).astype(jnp.float32) == slot
        placed = (placed & (alive > 0)).astype(jnp.bfloat16)  # [Mp, T]
        out_ref[...] += _exact_dot(rows_t[INDEX : INDEX + 1] + 1.0, placed, 1)
        if trips_ref is not None:
            row = lax.broadcasted_iota(jnp.int32, trips_ref.shape, 0)
            lane = lax.broadcasted_iota(jnp.int32, trips_ref.shape, 1)
            trips_ref[...] += jnp.where(
                (row == 0) & (lane == 0),
                1.0,
                jnp.where(
                    lane == t,
                    jnp.where(row == 1, passes.astype(jnp.float32), 0.0)
                    + jnp.where(row == 2, t.astype(jnp.float32), 0.0),
                    0.0,
                ),
            )
        return t + 1, kept + jnp.sum(alive).astype(jnp.int32)

    def more(state: tuple[jax.Array, jax.Array]) -> jax.Array:
        t, kept = state
        return (t < tiles) & (kept < max_output_size)

    lax.while_loop(more, decide_tile, (jnp.int32(0), jnp.int32(0)))


def _fields(boxes: jax.Array, eligible: jax.Array, ranks: jax.Array, padded: int) -> jax.Array:
    """One image's ``boxes [N, 4]`` (finite), ``eligible [N]``, category ``ranks [N]`` ->
    ``[8, padded]`` float32 kernel fields in the input's order; padding is ineligible."""
    n = boxes.shape[0]
    fields = jnp.stack(
        [
            *(boxes[:, i] for i in range(4)),
            jnp.zeros((n,), jnp.float32),
            eligible.astype(jnp.float32),
            ranks.astype(jnp.float32),
            jnp.arange(n, dtype=jnp.float32),
        ]
    )
    return jnp.pad(fields, ((0, 0), (0, padded - n)))


def _sort_keys(scores: jax.Array, eligible: jax.Array, padded: int) -> jax.Array:
    """Ascending keys ``[padded]`` float32: -score, ineligible boxes and padding last."""
    # + 0.0 folds -0.0 into 0.0: XLA's sort orders -0.0 before 0.0, the reference does not.
    key = jnp.where(eligible, -(scores + 0.0), jnp.inf)
    return jnp.pad(key, (0, padded - scores.shape[0]), constant_values=jnp.inf)


def _sort_order(keys: jax.Array) -> jax.Array:
    """Sorted position -> original index (ties by index), int32."""
    iota = jnp.arange(keys.shape[0], dtype=jnp.int32)
    _, order = lax.sort((keys, iota), num_keys=1, is_stable=True)
    return order


def gather_chunk(padded: int, tile: int) -> int:
    """Columns of the one-hot gather per MXU product: whole tiles, at most 2048."""
    per = max(1, min(padded // tile, 2048 // tile))
    while (padded // tile) % per:
        per -= 1
    return per * tile


def _build(
    config: NmsConfig | None,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float,
    count_trips: bool,
    target: lowering.Target,
) -> Callable[..., Any]:
    cfg = config or NmsConfig()

    def run(boxes: jax.Array, scores: jax.Array, *categories: jax.Array) -> Any:
        batch, n = scores.shape
        tile = min(cfg.tile, pl.cdiv(n, 128) * 128)
        padded = pl.cdiv(n, tile) * tile
        slots = pl.cdiv(min(max_output_size, padded), 128) * 128
        chunk = gather_chunk(padded, tile)
        scores = scores.astype(jnp.float32)
        boxes = boxes.astype(jnp.float32)
        eligible = ~jnp.isnan(scores) & (scores >= score_threshold)
        boxes = jnp.where(jnp.all(jnp.isfinite(boxes), axis=-1, keepdims=True), boxes, 0.0)
        keys = jax.vmap(functools.partial(_sort_keys, padded=padded))(scores, eligible)
        # Small N: the kernel ranks the keys itself (N^2 compares beat XLA's sort there).
        rank_in_kernel = padded <= cfg.rank_in_kernel_max
        sort_input = keys if rank_in_kernel else jax.vmap(_sort_order)(keys)
        ranks = categories[0] if categories else jnp.zeros((batch, n), jnp.int32)
        fields = jax.vmap(functools.partial(_fields, padded=padded))(boxes, eligible, ranks)
        out_shapes = [jax.ShapeDtypeStruct((batch, 1, slots), jnp.float32)]
        out_specs = [pl.BlockSpec((None, 1, slots), lambda b: (b, 0, 0))]
        trips_lanes = pl.cdiv(padded // tile, 128) * 128
        if count_trips:
            out_shapes.append(jax.ShapeDtypeStruct((batch, 8, trips_lanes), jnp.float32))
            out_specs.append(pl.BlockSpec((None, 8, trips_lanes), lambda b: (b, 0, 0)))
        # Double-buffered order, fields and output (1-row blocks pad to 8 sublanes); sorted
        # fields and keep flags; the one-hot gather, the [T, T] masks and the placement.
        vmem = 2 * 4 * (8 * padded * 2 + 8 * slots) + 4 * 8 * padded * 2
        vmem += 6 * tile * chunk + 4 * 4 * tile * tile + 6 * slots * tile + 4 * 8 * padded
        vmem += 3 * 4 * tile * padded if rank_in_kernel else 0
        call = pl.pallas_call(
            functools.partial(
                _kernel,
                tile=tile,
                chunk=chunk,
                iou_threshold=iou_threshold,
                max_output_size=max_output_size,
                count_trips=count_trips,
                rank_in_kernel=rank_in_kernel,
            ),
            out_shape=tuple(out_shapes),
            grid=(batch,),
            in_specs=[
                pl.BlockSpec((None, 1, padded), lambda b: (b, 0, 0)),
                pl.BlockSpec((None, ROWS, padded), lambda b: (b, 0, 0)),
            ],
            out_specs=tuple(out_specs),
            scratch_shapes=[
                pltpu.VMEM((ROWS, padded), jnp.float32),
                pltpu.VMEM((1, padded), jnp.float32),
                pltpu.VMEM((1, padded), jnp.float32),
            ],
            compiler_params=lowering.compiler_params(("parallel",), vmem, target.generation),
            interpret=target.interpret,
            name="nms_tiled",
        )
        outs = call(sort_input[:, None, :], fields)
        found = outs[0][:, 0, :max_output_size].astype(jnp.int32) - 1
        indices = jnp.pad(
            found, ((0, 0), (0, max_output_size - found.shape[1])), constant_values=-1
        )
        counts = jnp.sum(indices >= 0, axis=1, dtype=jnp.int32)
        if count_trips:
            return indices, counts, outs[1]
        return indices, counts

    return run


@dataclasses.dataclass(frozen=True)
class LoopTrips:
    """Trip counts of the kernel's data-dependent loops on one image: ``tiles`` decided
    (the outer loop), and per decided tile its cross-suppression steps (``cross[t] = t``:
    one per earlier tile) and fixed-point passes."""

    tiles: int
    cross: tuple[int, ...]
    passes: tuple[int, ...]


def loop_trips(
    boxes: np.ndarray,
    scores: np.ndarray,
    *,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float = -math.inf,
    tile: int,
) -> LoopTrips:
    """What :func:`_kernel` will iterate on one image (``boxes [N, 4]``, ``scores [N]``, no
    categories) with this ``tile`` (as :func:`_build` clamps it), predicted from the float64
    greedy result: the same sort, the same tile walk and stopping rule, the same fixed-point
    rule (``alive = start & no earlier alive box in the tile suppresses it``, until
    unchanged, at most ``tile + 1`` passes)."""
    from asickernels.kernels import nms as nms_op

    n = scores.shape[0]
    tile = min(tile, -(-n // 128) * 128)
    scores = np.asarray(scores, np.float32).astype(np.float64)
    eligible = ~np.isnan(scores) & (scores >= score_threshold)
    order = np.lexsort((np.arange(n), np.where(eligible, -scores, np.inf)))
    indices, count = nms_op.greedy_nms(
        boxes[None], scores[None], None, iou_threshold=iou_threshold,
        max_output_size=n, score_threshold=score_threshold,
    )  # fmt: skip
    kept = np.isin(order, np.asarray(indices)[0, : int(np.asarray(count)[0])])
    sorted_boxes = np.asarray(boxes, np.float64)[order]
    overlaps = np.stack(
        [nms_op.iou_one_to_many(box, sorted_boxes) > iou_threshold for box in sorted_boxes]
    )
    passes: list[int] = []
    kept_so_far = 0
    for start in range(0, n, tile):
        rows = slice(start, min(start + tile, n))
        alive_start = eligible[order][rows] & ~(overlaps[rows, :start] & kept[:start]).any(axis=1)
        earlier = np.tril(overlaps[rows, rows], k=-1)
        alive, changed, count_passes = alive_start, True, 0
        while changed and count_passes <= tile:
            new = alive_start & ~(earlier & alive[None, :]).any(axis=1)
            changed, alive, count_passes = bool((new != alive).any()), new, count_passes + 1
        passes.append(count_passes)
        kept_so_far += int(alive.sum())
        if kept_so_far >= max_output_size:
            break
    return LoopTrips(len(passes), tuple(range(len(passes))), tuple(passes))


def counted_loop_trips(
    boxes: jax.Array,
    scores: jax.Array,
    *,
    iou_threshold: float,
    max_output_size: int,
    config: NmsConfig | None = None,
) -> LoopTrips:
    """The kernel's own count of its loop trips on one image, in Pallas interpret mode (the
    kernel built with ``count_trips``): what :func:`loop_trips` must predict."""
    build = _build(
        config,
        iou_threshold,
        max_output_size,
        -math.inf,
        True,
        lowering.Target(generations.DEFAULT, True),
    )
    _, _, trips = jax.jit(build)(jnp.asarray(boxes)[None], jnp.asarray(scores)[None])
    counts = np.asarray(trips)[0]
    tiles = int(counts[0, 0])
    return LoopTrips(
        tiles,
        tuple(int(c) for c in counts[2, :tiles]),
        tuple(int(c) for c in counts[1, :tiles]),
    )


@BACKEND.implements(ops.nms, config=NmsConfig)
def nms(
    boxes: jax.Array,
    scores: jax.Array,
    categories: jax.Array | None,
    *,
    config: NmsConfig | None = None,
    mode: lowering.InterpretMode = None,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float,
) -> tuple[jax.Array, jax.Array]:
    """``boxes [B, N, 4]``, ``scores [B, N]``, ``categories [B, N]`` int32 or None ->
    (``[B, max_output_size]`` int32 indices padded with -1, ``[B]`` int32 counts)."""
    static = (config, float(iou_threshold), int(max_output_size), float(score_threshold), False)
    # The kernel carries categories as float32 fields: dense ranks (< B * N) stay exact.
    extra = () if categories is None else (dense_ranks(jnp, categories),)
    return lowering.run(lowering.Build(_build, static), mode, boxes, scores, *extra)  # type: ignore[no-any-return]
