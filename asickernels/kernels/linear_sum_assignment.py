"""Linear sum assignment (the Hungarian matching of DETR's matcher): the declaration, its
reference (SciPy's ``scipy.optimize.linear_sum_assignment``) and what "agrees" means for it.

The op is batched with static shapes: ``cost [..., N, M]`` with optional validity masks
``row_mask [..., N]`` and ``col_mask [..., M]`` (padded queries and targets); each image
independently gets a minimum-cost matching of size ``min(valid rows, valid columns)``
between its valid rows and valid columns, as SciPy computes on the valid sub-matrix.

Kernel calling convention (beside those in :mod:`asickernels.kernels.registry`):

* ``linear_sum_assignment(cost [B, N, M], row_mask [B, N] bool, col_mask [B, M] bool) ->
  (assignment [B, N] int32, num_assigned [B] int32)``: the op's outputs for each image, the
  sentinel included; B, N, M >= 1; cost float32 or float64.

Where it is written: this file (declaration, checks, the orientation and masking every
backend shares, the reference); each backend's kernel (``backends/xla/linear_sum_assignment.py``,
``backends/cpu/linear_sum_assignment.py`` with ``linear_sum_assignment.cpp`` beside it,
``backends/pallas_tpu/linear_sum_assignment.py``); the cases in
:mod:`asickernels.kernels.linear_sum_assignment_cases`; DETR's matcher in
:mod:`asickernels.matcher`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import numpy.typing as npt

from asickernels.kernels import _checks
from asickernels.kernels.declaration import Array, Op, Plan, Spec, array, cast
from asickernels.kernels.registry import FLOAT32_AND_64, REFERENCE, Runner

_MAX_INT32 = 2**31 - 1


def _check_mask(mask: Spec | None, name: str, shape: tuple[int, ...]) -> None:
    if mask is None:
        return
    if mask.dtype != np.bool_:
        raise TypeError(f"{name} must be a bool array, got dtype {mask.dtype}")
    if tuple(mask.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(mask.shape)}")


def _check(cost: Spec | None, row_mask: Spec | None, col_mask: Spec | None) -> Plan:
    cost = _checks.required(cost, "cost")
    _checks.check_float(cost, "cost")
    if len(cost.shape) < 2:
        raise ValueError(f"cost must have shape [..., N, M], got {tuple(cost.shape)}")
    batch, n, m = tuple(cost.shape[:-2]), cost.shape[-2], cost.shape[-1]
    if max(n, m) > _MAX_INT32:
        raise ValueError(f"cost has {max(n, m)} rows or columns, beyond the int32 index range")
    _check_mask(row_mask, "row_mask", batch + (n,))
    _check_mask(col_mask, "col_mask", batch + (m,))
    int32 = np.dtype(np.int32)
    return Plan(
        _checks.float_compute_dtype(cost),
        (Spec(batch + (n,), int32), Spec(batch, int32)),
        trivial=_checks.size(batch) == 0 or n == 0 or m == 0,
        fill=(-1, 0),
    )


def _valid_entries(
    cost: np.ndarray, row_mask: npt.ArrayLike | None, col_mask: npt.ArrayLike | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``cost`` as ``[B, N, M]`` float64 with its row and column masks ``[B, N]``, ``[B, M]``
    (all True where not given)."""
    n, m = cost.shape[-2:]
    flat = np.asarray(cost).reshape(_checks.size(cost.shape[:-2]), n, m).astype(np.float64)
    rows = np.ones(flat.shape[:2], bool) if row_mask is None else np.asarray(row_mask)
    cols = np.ones((flat.shape[0], m), bool) if col_mask is None else np.asarray(col_mask)
    return flat, rows.reshape(flat.shape[0], n), cols.reshape(flat.shape[0], m)


def check_values(cost: Array, row_mask: Array | None = None, col_mask: Array | None = None) -> None:
    """On eager calls, SciPy's refusals: no NaN or ``-inf`` among the valid entries, and a
    matching of every valid row (or column) that avoids the forbidden (``+inf``) pairs.
    One pass over ``cost`` when it is all finite.

    Raises:
      ValueError: naming ``cost``, the image and what is wrong.
    """
    values = np.asarray(cost)
    if values.size == 0 or np.isfinite(values).all():
        return
    flat, rows, cols = _valid_entries(values, row_mask, col_mask)
    valid = rows[:, :, None] & cols[:, None, :]
    for wrong, bad in (("NaN", np.isnan(flat)), ("-inf", np.isneginf(flat))):
        images = np.flatnonzero((bad & valid).any(axis=(1, 2)))
        if len(images):
            where = f" (image {images[0]})" if flat.shape[0] > 1 else ""
            raise ValueError(
                f"cost contains {wrong} among its valid entries{where}: a cost must be a "
                "number, or +inf for a forbidden pair"
            )
    for b in np.flatnonzero((np.isposinf(flat) & valid).any(axis=(1, 2))):
        if not _feasible(np.isfinite(flat[b][np.ix_(rows[b], cols[b])])):
            where = f" (image {b})" if flat.shape[0] > 1 else ""
            raise ValueError(
                f"cost is infeasible{where}: the forbidden (+inf) pairs leave no "
                "assignment of every valid row or column"
            )


def _feasible(allowed: np.ndarray) -> bool:
    """Whether the bipartite graph of ``allowed [R, C]`` pairs matches min(R, C) vertices."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_bipartite_matching

    if 0 in allowed.shape:
        return True
    side = allowed if allowed.shape[0] <= allowed.shape[1] else allowed.T
    matched = maximum_bipartite_matching(csr_matrix(side.astype(np.int8)), perm_type="column")
    return bool(np.all(matched >= 0))


def _compute(
    runner: Runner,
    plan: Plan,
    cost: Array,
    row_mask: Array | None = None,
    col_mask: Array | None = None,
) -> tuple[Array, Array]:
    xp = runner.xp
    batch_shape, n, m = cost.shape[:-2], cost.shape[-2], cost.shape[-1]
    batch = _checks.size(batch_shape)
    rows = xp.ones((batch, n), bool) if row_mask is None else row_mask.reshape(batch, n)
    cols = xp.ones((batch, m), bool) if col_mask is None else col_mask.reshape(batch, m)
    assignment, count = runner.kernel(linear_sum_assignment)(
        cast(cost, plan.dtype or "float32").reshape(batch, n, m), rows, cols
    )
    return (
        cast(assignment, np.int32).reshape(batch_shape + (n,)),
        cast(count, np.int32).reshape(batch_shape),
    )


# -- the reference ----------------------------------------------------------------------------


def scipy_per_image(
    cost: npt.ArrayLike, row_mask: npt.ArrayLike, col_mask: npt.ArrayLike
) -> tuple[np.ndarray, np.ndarray]:
    """SciPy on each image's valid sub-matrix: ``cost [B, N, M]``, masks ``[B, N]``, ``[B,
    M]`` -> ``(assignment [B, N], num_assigned [B])``; the sentinel (-1 everywhere, count
    -1) where SciPy raises."""
    from scipy.optimize import linear_sum_assignment as scipy_lsa

    flat = np.asarray(cost, np.float64)
    rows, cols = np.asarray(row_mask, bool), np.asarray(col_mask, bool)
    assignment = np.full(rows.shape, -1, np.int32)
    count = np.zeros((flat.shape[0],), np.int32)
    for b in range(flat.shape[0]):
        r, c = np.flatnonzero(rows[b]), np.flatnonzero(cols[b])
        if len(r) == 0 or len(c) == 0:
            continue
        try:
            i, j = scipy_lsa(flat[b][np.ix_(r, c)])
        except ValueError:  # NaN, -inf, or infeasible
            count[b] = -1
            continue
        assignment[b, r[i]] = c[j]
        count[b] = len(i)
    return assignment, count


def _reference(
    cost: npt.ArrayLike,
    row_mask: npt.ArrayLike | None = None,
    col_mask: npt.ArrayLike | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`scipy_per_image` over the public signature (any batch shape)."""
    cost = np.asarray(cost)
    batch_shape, n = cost.shape[:-2], cost.shape[-2]
    assignment, count = scipy_per_image(*_valid_entries(cost, row_mask, col_mask))
    return assignment.reshape(batch_shape + (n,)), count.reshape(batch_shape)


@dataclasses.dataclass(frozen=True)
class AssignmentVerdict:
    """How a result compares with SciPy's: ``error`` is empty when it agrees."""

    error: str
    total: float
    want_total: float


def total_cost(cost: np.ndarray, assignment: np.ndarray) -> np.ndarray:
    """The float64 total cost of each image's assignment ``[B, N]`` over ``cost [B, N, M]``."""
    rows = assignment >= 0
    if cost.shape[-1] == 0:
        return np.zeros(assignment.shape[:-1])
    picked = np.take_along_axis(cost, np.where(rows, assignment, 0)[..., None], axis=-1)[..., 0]
    return np.where(rows, picked, 0.0).sum(axis=-1)


def compare(
    cost: npt.ArrayLike,
    got: tuple[npt.ArrayLike, npt.ArrayLike],
    *,
    row_mask: npt.ArrayLike | None = None,
    col_mask: npt.ArrayLike | None = None,
    dtype: npt.DTypeLike = np.float64,
    unique: bool = False,
) -> AssignmentVerdict:
    """Whether ``got = (assignment, count)`` is an optimal assignment as SciPy defines it:
    a matching of valid rows to distinct valid columns of SciPy's size, whose float64
    total cost equals SciPy's within the rounding of ``dtype`` (exactly, up to float64
    summation, for float64), and equal to SciPy's assignment when ``unique`` (the optimum
    is known to be unique). Sentinel images must be sentinels in both."""
    cost = np.asarray(cost)
    want_assignment, want_count = _reference(cost, row_mask, col_mask)
    assignment, count = (np.asarray(a) for a in got)
    if assignment.shape != want_assignment.shape or count.shape != want_count.shape:
        return AssignmentVerdict(
            f"shapes {assignment.shape}, {count.shape} != {want_assignment.shape}, "
            f"{want_count.shape}", math.nan, math.nan,
        )  # fmt: skip
    flat, rows, cols = _valid_entries(cost, row_mask, col_mask)
    n, m = flat.shape[1:]
    batch = flat.shape[0]
    got_a, want_a = assignment.reshape(batch, n), want_assignment.reshape(batch, n)
    got_c, want_c = count.reshape(batch), want_count.reshape(batch)
    eps = float(np.finfo(np.dtype(dtype)).eps)
    for b in range(flat.shape[0]):
        where = f"image {b}: "
        if want_c[b] < 0 or got_c[b] < 0:
            if not (want_c[b] < 0 and got_c[b] < 0 and np.all(got_a[b] == -1)):
                return AssignmentVerdict(
                    f"{where}sentinel mismatch (count {got_c[b]}, SciPy {want_c[b]})", 0, 0
                )
            continue
        matched = got_a[b] >= 0
        cols_used = got_a[b][matched]
        if got_c[b] != want_c[b] or matched.sum() != want_c[b]:
            return AssignmentVerdict(
                f"{where}{matched.sum()} rows matched (count {got_c[b]}), SciPy {want_c[b]}", 0, 0
            )
        if np.any(~rows[b][matched]) or np.any(cols_used >= m) or np.any(~cols[b][cols_used]):
            return AssignmentVerdict(f"{where}a masked row or column is matched", 0, 0)
        if len(np.unique(cols_used)) != len(cols_used):
            return AssignmentVerdict(f"{where}a column is matched twice", 0, 0)
        total = float(total_cost(flat[b], got_a[b]))
        want = float(total_cost(flat[b], want_a[b]))
        valid = flat[b][np.ix_(rows[b], cols[b])]
        finite = np.abs(valid[np.isfinite(valid)])
        scale = float(finite.max(initial=0.0)) * max(1, int(want_c[b]))
        # float64: summation order only; narrower: decisions made on reduced costs carry
        # about one rounding of the scale per augmentation (K of them).
        size = 1 if np.dtype(dtype) == np.float64 else max(n, m)
        tolerance = 8 * eps * scale * size
        if not (abs(total - want) <= tolerance):
            return AssignmentVerdict(
                f"{where}total cost {total!r} != SciPy's {want!r} (tolerance {tolerance:.3g})",
                total,
                want,
            )
        if unique and not np.array_equal(got_a[b], want_a[b]):
            return AssignmentVerdict(f"{where}assignment differs from SciPy's", total, want)
    return AssignmentVerdict("", math.nan, math.nan)


def assert_agrees(cost: npt.ArrayLike, got: Any, **kwargs: Any) -> None:
    """Raises an AssertionError saying what differs unless :func:`compare` agrees."""
    verdict = compare(cost, got, **kwargs)
    if verdict.error:
        raise AssertionError(f"linear_sum_assignment disagrees with SciPy: {verdict.error}")


_DOC = """Minimum-cost assignment of rows to columns per image (SciPy's
    ``scipy.optimize.linear_sum_assignment``), batched with static shapes.

    Each image matches ``min(valid rows, valid columns)`` valid rows to distinct valid
    columns with the least total cost (negate the costs to maximize). Where the optimum is
    unique the assignment is SciPy's; where several assignments tie, any one of them (the
    same total cost). Entries outside the valid rows and columns are ignored (they may
    hold anything, NaN included). A valid ``+inf`` entry is a forbidden pair, as in SciPy.

    Exactness: float64 costs are decided in float64, as SciPy decides them. float32 (and
    narrower) costs are decided in float32 on the XLA and Pallas backends: the result is
    then optimal whenever the costs and their partial sums are exact in float32 (e.g.
    integers below 2**24 in total), and otherwise within about ``K * eps * K * max|cost|``
    of the optimum (K = max(N, M)); the native CPU backend decides every dtype in float64.

    Args:
      cost: ``[..., N, M]`` float costs (float16/bfloat16 upcast to float32).
      row_mask: optional ``[..., N]`` bool, False for padded rows (e.g. queries).
      col_mask: optional ``[..., M]`` bool, False for padded columns (e.g. targets).
      backend, config: see :func:`asickernels.giou`.

    Returns:
      ``(assignment, num_assigned)``: ``assignment [..., N]`` int32, the column assigned to
      each row or -1; ``num_assigned [...]`` int32, the number of assigned rows. The rows
      of SciPy's ``(row_ind, col_ind)`` are ``nonzero(assignment >= 0)``, in that order.

    Raises:
      TypeError/ValueError: bad shapes or dtypes, naming the argument.
      ValueError: on eager calls, as SciPy: a valid entry is NaN or ``-inf``, or the
        forbidden pairs leave no full assignment (naming ``cost``).
        Traced calls (under ``jit``) cannot raise on values: such an image gets
        ``assignment`` -1 everywhere and ``num_assigned`` -1.
    """


linear_sum_assignment = Op(
    "linear_sum_assignment",
    [
        array("cost", 2),
        array("row_mask", 1, optional=True),
        array("col_mask", 1, optional=True),
    ],
    check=_check,
    check_values=check_values,
    compute=_compute,
    reference=_reference,
    outputs=("assignment", "num_assigned"),
    partition="batch",  # one independent assignment per image
    # The native CPU backend is SciPy's algorithm in C++; on TPUs the Pallas kernel keeps
    # the O(K^2) sequential search steps inside one kernel, where XLA's version runs each as
    # a trip of a device-level while loop.
    preference=("cpu", "pallas_tpu", "xla"),
    doc=_DOC,
)

REFERENCE.implements(linear_sum_assignment, dtypes=FLOAT32_AND_64)(scipy_per_image)
