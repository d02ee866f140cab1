"""The oracle: what "agrees with the reference" means, once, for every consumer (pytest's
conformance, torch and SPMD tests, ``asickernels check`` and ``bench``).

:func:`expected` runs an op's float64 reference (its declaration's ``reference``) on the
public arguments; :func:`compare` measures a result against it with the op's tolerance
(:attr:`~asickernels.kernels.declaration.Op.tolerance`), which depends on the dtype the
result was computed in; :func:`assert_agrees` raises an ``AssertionError`` naming the
worst element.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from asickernels.kernels.declaration import EXACT, Op, Tolerance

# One output of an op, or the tuple of its outputs (numpy, JAX or torch arrays alike).
Outputs: TypeAlias = npt.ArrayLike | tuple[npt.ArrayLike, ...]

# A float result of an op that declares no tolerance (int8 matmul's dequantized one): the
# reference rounded once to the output dtype. Integer results are exact.
_ROUNDED_ONCE = {4: Tolerance(1e-6, 1e-6), 8: Tolerance(1e-6, 1e-6), 2: Tolerance(1e-2, 1e-6)}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """``error``: the worst ``|got - want| / (atol + rtol |want|)`` (for exact ops, the
    number of differing elements); it passes at ``<= 1`` (exact: ``== 0``)."""

    error: float
    passed: bool
    tolerance: Tolerance
    detail: str = ""


def expected(
    op: Op, arrays: Mapping[str, npt.ArrayLike | None], statics: Mapping[str, object]
) -> Outputs:
    """The float64 reference outputs of ``op`` for public arguments (numpy)."""
    present = {n: np.asarray(a) for n, a in arrays.items() if a is not None}
    return op.reference(**present, **statics)  # type: ignore[no-any-return]


def tolerance(op: Op, out_dtype: np.dtype) -> Tolerance:
    """The tolerance for an output of ``op`` computed in ``out_dtype``."""
    if op.tolerance is not None:
        narrow, wide = op.tolerance
        return wide if np.dtype(out_dtype) == np.float64 else narrow
    if np.issubdtype(out_dtype, np.floating) or out_dtype.kind == "V":
        return _ROUNDED_ONCE[np.dtype(out_dtype).itemsize]
    return EXACT


def compare(op: Op, got: Outputs, want: Outputs) -> Verdict:
    """How far ``got`` (an output or a tuple of outputs) is from the reference ``want``."""
    gots = got if isinstance(got, tuple) else (got,)
    wants = want if isinstance(want, tuple) else (want,)
    worst = Verdict(0.0, True, EXACT)
    for g, w in zip(gots, wants, strict=True):
        g_arr, w_arr = np.asarray(g), np.asarray(w)
        tol = tolerance(op, g_arr.dtype)
        if g_arr.shape != w_arr.shape:
            return Verdict(np.inf, False, tol, f"shape {g_arr.shape} != {w_arr.shape}")
        g64, w64 = g_arr.astype(np.float64), w_arr.astype(np.float64)
        if tol == EXACT:
            bad = int(np.sum(g64 != w64))
            verdict = Verdict(float(bad), bad == 0, tol, f"{bad} of {g64.size} differ")
        else:
            with np.errstate(invalid="ignore"):  # inf - inf: equal infinities are zeroed below
                diff = np.abs(g64 - w64)
                ratio = diff / (tol.atol + tol.rtol * np.abs(w64))
            ratio = np.where((np.isnan(g64) & np.isnan(w64)) | (g64 == w64), 0.0, ratio)
            error = float(np.nanmax(np.where(np.isnan(ratio), np.inf, ratio), initial=0.0))
            at = np.unravel_index(int(np.argmax(ratio)), ratio.shape) if ratio.size else ()
            detail = f"worst at {at}: got {g64[at] if ratio.size else '-'}, want {w64[at] if ratio.size else '-'}"
            verdict = Verdict(error, error <= 1.0, tol, detail)
        if not verdict.passed or verdict.error > worst.error:
            worst = verdict
        if not verdict.passed:
            return verdict
    return worst


def assert_agrees(op: Op, got: Outputs, want: Outputs) -> None:
    """Raises an AssertionError naming the worst element unless :func:`compare` passes."""
    verdict = compare(op, got, want)
    if not verdict.passed:
        raise AssertionError(
            f"{op.name} disagrees with the float64 reference: error {verdict.error:.3g} "
            f"(tolerance rtol={verdict.tolerance.rtol}, atol={verdict.tolerance.atol}); "
            f"{verdict.detail}"
        )
