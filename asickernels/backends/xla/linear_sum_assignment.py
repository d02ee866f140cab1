"""Linear sum assignment in ``jax.numpy``: the shortest augmenting path algorithm
(Jonker–Volgenant, in the form of Crouse 2016 that SciPy implements), with static bounds.

One valid row is added per trip of an outer ``fori_loop`` over the K rows. Each addition is
a Dijkstra search over reduced costs ``cost[i, j] - u[i] - v[j]`` (kept >= 0 by the dual
potentials ``u``, ``v``) from the new row to a free column, one column settled per trip of
a ``while_loop`` (at most K trips), then the duals are updated and the path is flipped
(another ``while_loop``, at most K trips): O(K^3) work, O(K^2) sequential steps. The
arithmetic is SciPy's, in the input's precision (``minVal + cost - u - v``, left to right);
ties between equally short paths go to a free column, then to the lowest column index.
Runs on any XLA device, under ``jit`` and ``vmap`` (images are vmapped).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from asickernels.backends.xla import BACKEND
from asickernels.kernels import public as ops
from asickernels.kernels.registry import FLOAT32_AND_64


class _Search(NamedTuple):
    """The Dijkstra search of one augmentation."""

    row: jax.Array  # the row being scanned
    min_val: jax.Array  # the length of the last settled column's path
    scanned_rows: jax.Array  # [K] bool (SciPy's SR)
    settled: jax.Array  # [K] bool: settled columns (SciPy's SC)
    distance: jax.Array  # [K] shortest path lengths found so far
    path: jax.Array  # [K] int32: the row each column is reached from
    sink: jax.Array  # the free column reached; -1 while searching, -2 not searching
    ok: jax.Array  # False once no column is reachable (infeasible)


def _solve(
    cost: jax.Array, row_mask: jax.Array, col_mask: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One image ``cost [K, K]`` (valid rows <= valid columns) -> (col4row, row4col, feasible)."""
    k = cost.shape[0]
    dtype = cost.dtype
    inf = jnp.array(jnp.inf, dtype)
    columns = jnp.arange(k, dtype=jnp.int32)

    def add_row(current: jax.Array, state: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        u, v, col4row, row4col, feasible = state

        def scan(s: _Search) -> _Search:
            scanned_rows = s.scanned_rows.at[s.row].set(True)
            reduced = s.min_val + cost[s.row] - u[s.row] - v
            open_ = col_mask & ~s.settled
            shorter = open_ & (reduced < s.distance)
            path = jnp.where(shorter, s.row, s.path)
            distance = jnp.where(shorter, reduced, s.distance)
            key = jnp.where(open_, distance, inf)
            lowest = jnp.min(key)
            tied = open_ & (key == lowest)
            free = tied & (row4col < 0)
            column = jnp.where(jnp.any(free), jnp.argmax(free), jnp.argmax(tied)).astype(jnp.int32)
            ok = lowest < inf
            owner = row4col[column]
            return _Search(
                row=jnp.where(ok & (owner >= 0), owner, s.row),
                min_val=lowest,
                scanned_rows=scanned_rows,
                settled=s.settled.at[column].set(s.settled[column] | ok),
                distance=distance,
                path=path,
                sink=jnp.where(ok & (owner < 0), column, s.sink),
                ok=ok,
            )

        searching = row_mask[current] & feasible
        start = _Search(
            row=current,
            min_val=jnp.zeros((), dtype),
            scanned_rows=jnp.zeros((k,), bool),
            settled=jnp.zeros((k,), bool),
            distance=jnp.full((k,), inf),
            path=jnp.full((k,), -1, jnp.int32),
            sink=jnp.where(searching, -1, -2).astype(jnp.int32),
            ok=jnp.array(True),
        )
        s = lax.while_loop(lambda s: (s.sink == -1) & s.ok, scan, start)
        found = s.sink >= 0
        # The duals (SciPy's update): rows scanned before this one, and settled columns.
        matched_distance = s.distance[jnp.maximum(col4row, 0)]
        earlier = s.scanned_rows & (columns != current)
        u = jnp.where(earlier & found, u + (s.min_val - matched_distance), u)
        u = u.at[current].add(jnp.where(found, s.min_val, 0))
        v = jnp.where(s.settled & found, v - (s.min_val - s.distance), v)

        Flip = tuple[jax.Array, jax.Array, jax.Array, jax.Array]

        def flip(state: Flip) -> Flip:
            column, col4row, row4col, _ = state
            row = s.path[column]
            return (col4row[row], col4row.at[row].set(column), row4col.at[column].set(row), row)

        _, col4row, row4col, _ = lax.while_loop(
            lambda state: found & (state[3] != current),
            flip,
            (s.sink, col4row, row4col, jnp.int32(-1)),
        )
        return u, v, col4row, row4col, feasible & (s.ok | ~searching)

    zeros = jnp.zeros((k,), dtype)
    unmatched = jnp.full((k,), -1, jnp.int32)
    _, _, col4row, row4col, feasible = lax.fori_loop(
        0, k, add_row, (zeros, zeros, unmatched, unmatched, jnp.array(True))
    )
    return col4row, row4col, feasible


SquareSolver = Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array, jax.Array]]


def assign_by_rows(
    solve_square: SquareSolver, cost: jax.Array, row_mask: jax.Array, col_mask: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The kernel convention (``cost [B, N, M]``, masks -> ``(assignment [B, N],
    num_assigned [B])``, sentinel included) on a solver of square oriented problems,
    ``solve_square(cost [B, K, K], row_mask [B, K], col_mask [B, K]) -> (col4row [B, K],
    row4col [B, K], feasible [B])``, which may assume that every image has no more valid
    rows than valid columns, 0 outside them, and no NaN or ``-inf`` among them.

    Each image is padded to K = max(N, M) and transposed where it has more valid rows than
    columns (SciPy transposes the same way); images with NaN or ``-inf`` valid entries,
    or no feasible matching, get the sentinel. Shared by the JAX kernels (XLA, Pallas)."""
    _, n, m = cost.shape
    k = max(n, m)
    rows, cols = row_mask.astype(bool), col_mask.astype(bool)
    valid = rows[:, :, None] & cols[:, None, :]
    refused = jnp.any(valid & (jnp.isnan(cost) | (cost == -jnp.inf)), axis=(1, 2))
    cost = jnp.where(valid & ~refused[:, None, None], cost, jnp.zeros((), cost.dtype))
    cost = jnp.pad(cost, ((0, 0), (0, k - n), (0, k - m)))
    rows = jnp.pad(rows, ((0, 0), (0, k - n)))
    cols = jnp.pad(cols, ((0, 0), (0, k - m)))
    flip = jnp.sum(rows, axis=1) > jnp.sum(cols, axis=1)
    col4row, row4col, feasible = solve_square(
        jnp.where(flip[:, None, None], jnp.swapaxes(cost, 1, 2), cost),
        jnp.where(flip[:, None], cols, rows),
        jnp.where(flip[:, None], rows, cols),
    )
    solved = feasible & ~refused
    assignment = jnp.where(solved[:, None], jnp.where(flip[:, None], row4col, col4row)[:, :n], -1)
    count = jnp.where(solved, jnp.sum(assignment >= 0, axis=1), -1)
    return assignment.astype(jnp.int32), count.astype(jnp.int32)


@BACKEND.implements(ops.linear_sum_assignment, dtypes=FLOAT32_AND_64)
def linear_sum_assignment(
    cost: jax.Array, row_mask: jax.Array, col_mask: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """``cost [B, N, M]``, masks ``[B, N]``, ``[B, M]`` -> (``assignment [B, N]``,
    ``num_assigned [B]``) int32; see :mod:`asickernels.kernels.linear_sum_assignment`."""
    return assign_by_rows(jax.vmap(_solve), cost, row_mask, col_mask)
