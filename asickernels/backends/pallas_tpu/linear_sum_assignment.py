"""Linear sum assignment as a Pallas TPU kernel: the XLA backend's shortest augmenting path
algorithm (:mod:`asickernels.backends.xla.linear_sum_assignment`, SciPy's arithmetic) with
one image per grid step, its cost matrix in VMEM.

Mosaic has no dynamic lane gather, so the per-row and per-column state (duals, path,
matching) lives in ``[1, Kp]`` float32 lane vectors (indices exact below 2**24) and every
gather is a masked sum over lanes: a scalar picked by a one-hot compare. The scanned row of
the cost is read as the aligned 8-row tile that holds it (a dynamic sublane slice), then
picked by a masked sum over sublanes. The dual update's ``distance[col4row[i]]`` gathers
through one ``[Kp, Kp]`` compare per augmentation. Loops: a ``fori_loop`` over the rows, a
``while_loop`` per Dijkstra search and per path flip, each at most Kp trips. float32 only
(TPUs have no float64): exact where the costs and their sums are exact in float32.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from asickernels.backends.pallas_tpu import BACKEND, lowering
from asickernels.backends.xla.linear_sum_assignment import assign_by_rows
from asickernels.kernels import public as ops
from asickernels.pallas_home import pl

_LANES = 128


def _pick(values: jax.Array, where: jax.Array) -> jax.Array:
    """The entry of lane vector ``values [1, Kp]`` where the one-hot ``where`` holds (0-d)."""
    return jnp.sum(jnp.where(where, values, 0.0))


def _kernel(
    cost_ref: Any,
    rows_ref: Any,
    cols_ref: Any,
    col4row_ref: Any,
    row4col_ref: Any,
    feasible_ref: Any,
    *,
    k: int,
) -> None:
    # cost_ref [Kp, Kp] float32 (0 outside the valid rows and columns); rows_ref, cols_ref
    # [1, Kp] float32 0/1 masks (valid rows <= valid columns); outputs [1, Kp] int32
    # col4row and row4col (-1: unmatched), feasible_ref [1, 128] int32 0/1.
    kp = cost_ref.shape[1]
    lane = lax.broadcasted_iota(jnp.int32, (1, kp), 1).astype(jnp.float32)
    sublane8 = lax.broadcasted_iota(jnp.int32, (8, kp), 0)
    sublane = lax.broadcasted_iota(jnp.int32, (kp, kp), 0).astype(jnp.float32)
    inf = jnp.float32(jnp.inf)
    col_ok = cols_ref[...] > 0
    row_ok = rows_ref[...] > 0

    def add_row(current: jax.Array, state: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        u, v, col4row, row4col, feasible = state
        current_f = current.astype(jnp.float32)
        searching = (_pick(row_ok.astype(jnp.float32), lane == current_f) > 0) & (feasible > 0)

        def scan(s: Any) -> Any:  # the search state below
            row, min_val, scanned, settled, distance, path, sink, _ = s
            base = pl.multiple_of((row // 8) * 8, 8)
            tile = cost_ref[pl.ds(base, 8), :]
            cost_row = jnp.sum(jnp.where(sublane8 == row - base, tile, 0.0), axis=0, keepdims=True)
            row_f = row.astype(jnp.float32)
            at_row = lane == row_f
            scanned = jnp.where(at_row, 1.0, scanned)
            reduced = min_val + cost_row - _pick(u, at_row) - v
            open_ = col_ok & (settled == 0)
            shorter = open_ & (reduced < distance)
            path = jnp.where(shorter, row_f, path)
            distance = jnp.where(shorter, reduced, distance)
            key = jnp.where(open_, distance, inf)
            lowest = jnp.min(key)
            tied = open_ & (key == lowest)
            free = tied & (row4col < 0)
            first_free = jnp.min(jnp.where(free, lane, jnp.float32(kp)))
            first_tied = jnp.min(jnp.where(tied, lane, jnp.float32(kp)))
            column = jnp.where(first_free < kp, first_free, first_tied)
            ok = lowest < inf
            at_column = lane == column
            owner = _pick(row4col, at_column)
            settled = jnp.where(at_column & ok, 1.0, settled)
            new_row = jnp.where(ok & (owner >= 0), owner.astype(jnp.int32), row)
            sink = jnp.where(ok & (owner < 0), column, sink)
            return (new_row, lowest, scanned, settled, distance, path, sink, ok.astype(jnp.int32))

        zeros = jnp.zeros((1, kp), jnp.float32)
        start = (
            current,
            jnp.float32(0.0),
            zeros,
            zeros,
            jnp.full((1, kp), inf),
            jnp.full((1, kp), -1.0),
            jnp.where(searching, -1.0, -2.0),
            jnp.int32(1),
        )
        _, min_val, scanned, settled, distance, path, sink, ok = lax.while_loop(
            lambda s: (s[6] == -1.0) & (s[7] > 0), scan, start
        )
        found = sink >= 0
        # distance[col4row[i]] for every row i: one [Kp, Kp] compare.
        distance_column = jnp.broadcast_to(distance, (8, kp)).T[:, 0:1]  # [Kp, 1]
        matched = jnp.sum(
            jnp.where(sublane == col4row, distance_column, 0.0), axis=0, keepdims=True
        )
        earlier = (scanned > 0) & (lane != current_f) & found
        u = jnp.where(earlier, u + (min_val - matched), u)
        u = jnp.where((lane == current_f) & found, u + min_val, u)
        v = jnp.where((settled > 0) & found, v - (min_val - distance), v)

        def flip(f: Any) -> Any:  # (column, col4row, row4col, last row)
            column, col4row, row4col, _ = f
            at_column = lane == column
            row = _pick(path, at_column)
            at_row = lane == row
            following = _pick(col4row, at_row)
            return (
                following,
                jnp.where(at_row, column, col4row),
                jnp.where(at_column, row, row4col),
                row,
            )

        _, col4row, row4col, _ = lax.while_loop(
            lambda f: found & (f[3] != current_f),
            flip,
            (sink, col4row, row4col, jnp.float32(-1.0)),
        )
        still = jnp.where(searching & (ok == 0), 0, feasible)
        return u, v, col4row, row4col, still

    zeros = jnp.zeros((1, kp), jnp.float32)
    unmatched = jnp.full((1, kp), -1.0)
    _, _, col4row, row4col, feasible = lax.fori_loop(
        0, k, add_row, (zeros, zeros, unmatched, unmatched, jnp.int32(1))
    )
    col4row_ref[...] = col4row.astype(jnp.int32)
    row4col_ref[...] = row4col.astype(jnp.int32)
    feasible_ref[...] = jnp.full((1, _LANES), feasible, jnp.int32)


def _build(target: lowering.Target) -> Callable[..., Any]:
    def run(cost: jax.Array, row_mask: jax.Array, col_mask: jax.Array) -> Any:
        batch, k = row_mask.shape
        kp = pl.cdiv(k, _LANES) * _LANES
        cost = jnp.pad(cost.astype(jnp.float32), ((0, 0), (0, kp - k), (0, kp - k)))
        masks = [jnp.pad(m.astype(jnp.float32), ((0, 0), (0, kp - k)))[:, None, :] for m in (row_mask, col_mask)]  # fmt: skip
        vector = pl.BlockSpec((None, 1, kp), lambda b: (b, 0, 0))
        # Double-buffered cost and vectors (1-row blocks pad to 8 sublanes), the [Kp, Kp]
        # compare of the dual update and its operands.
        vmem = 2 * 4 * (kp * kp + 5 * 8 * kp + 8 * _LANES) + 3 * 4 * kp * kp
        col4row, row4col, feasible = pl.pallas_call(
            functools.partial(_kernel, k=k),
            out_shape=(
                jax.ShapeDtypeStruct((batch, 1, kp), jnp.int32),
                jax.ShapeDtypeStruct((batch, 1, kp), jnp.int32),
                jax.ShapeDtypeStruct((batch, 1, _LANES), jnp.int32),
            ),
            grid=(batch,),
            in_specs=[pl.BlockSpec((None, kp, kp), lambda b: (b, 0, 0)), vector, vector],
            out_specs=(vector, vector, pl.BlockSpec((None, 1, _LANES), lambda b: (b, 0, 0))),
            compiler_params=lowering.compiler_params(("parallel",), vmem, target.generation),
            interpret=target.interpret,
            name="linear_sum_assignment",
        )(cost, *masks)
        return col4row[:, 0, :k], row4col[:, 0, :k], feasible[:, 0, 0] > 0

    return run


@BACKEND.implements(ops.linear_sum_assignment)
def linear_sum_assignment(
    cost: jax.Array,
    row_mask: jax.Array,
    col_mask: jax.Array,
    *,
    mode: lowering.InterpretMode = None,
) -> tuple[jax.Array, jax.Array]:
    """``cost [B, N, M]`` float32, masks ``[B, N]``, ``[B, M]`` -> (``assignment [B, N]``,
    ``num_assigned [B]``) int32; see :mod:`asickernels.kernels.linear_sum_assignment`."""

    def solve_square(*square: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        return lowering.run(lowering.Build(_build), mode, *square)  # type: ignore[no-any-return]

    return assign_by_rows(solve_square, cost, row_mask, col_mask)
