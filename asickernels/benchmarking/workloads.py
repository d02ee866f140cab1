"""How ``check`` and ``bench`` run a :class:`~asickernels.kernels.cases.Workload`: every
op's workloads are declared with its cases beside its declaration
(``asickernels/kernels/<op>_cases.py``) and gathered in :data:`WORKLOADS`.

Every backend is called through the public API (``asickernels.giou(..., backend=name)``),
``jax.jit``-compiled for JAX backends with inputs already on the device (in JAX's x64
mode for float64 cases), so a row times what a user gets. A case a backend refuses by
design (float64 on a float32-only backend) raises :class:`NotApplicable` instead of
running. Results are compared in a canonical numpy form (each workload's ``compare``):

* the float ops (``giou``, ``giou_vjp``, the IoU matrices, ``roi_align``): error = the
  oracle's (:mod:`asickernels.kernels.oracle`) worst ``|got - want| / (atol + rtol |want|)``:
  1 or less passes.
* ``nms`` / ``batched_nms``: ``(indices [..., max_output_size], num_valid [...])``;
  error = number of entries that differ (0 to pass); likewise ``roi_pool``.
* ``int8_matmul``: ``[M, N]``; error = max absolute difference (exact int32 wanted),
  or max relative difference for dequantized (float) results.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Literal

import jax
import numpy as np

from asickernels.kernels import registry
from asickernels.kernels.case_tables import WORKLOADS
from asickernels.kernels.cases import Canonical, Case, Workload
from asickernels.kernels.eager import x64_scope

__all__ = [
    "WORKLOADS",
    "DefaultMode",
    "NotApplicable",
    "Prepared",
    "prepare_backend",
    "prepare_default",
]


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A ready-to-time call (inputs already converted and placed) and the conversion of its
    output to the op's canonical numpy form (kept out of the timed region)."""

    call: Callable[[], object]
    canonical: Callable[[Any], Canonical]  # takes what ``call`` returns (library-specific)


class NotApplicable(Exception):
    """A backend refuses this case by design (the message says why): ``check`` reports it
    as not applicable, not as a failure."""


def _to_numpy(out: object) -> Canonical:
    if isinstance(out, tuple):
        return tuple(np.asarray(o) for o in out)
    return np.asarray(out)


# How the default-backend rows call the public op (see prepare_default).
DefaultMode = Literal["jit", "jit-numpy", "eager"]


def prepare_backend(workload: Workload, backend: str, case: Case) -> Prepared:
    """The public op on ``backend``: jitted with device-resident inputs for JAX backends,
    called eagerly on host arrays for host backends.

    Raises :class:`NotApplicable` for a call the backend refuses by design: a float64
    case on a backend registered to compute in float32 only, or a JAX backend this JAX
    cannot trace (``Backend.traceable``)."""
    chosen = registry.backend(backend)
    if chosen.traceable is not None and not chosen.traceable():
        raise NotApplicable(
            f"{backend} cannot run under jax.jit with jax {jax.__version__} "
            "(it runs eagerly only with this JAX)"
        )
    kernel = workload.op.kernel
    assert kernel is not None
    computes, wanted = registry.support(kernel, backend).dtypes, _float_dtype(case)
    if wanted not in computes:
        raise NotApplicable(
            f"{backend} computes {kernel.name} in {'/'.join(sorted(computes))} only; "
            f"this case is {wanted}"
        )
    function: Callable[..., object] = functools.partial(workload.op, backend=backend, **case.static)
    if chosen.array_kind != "jax":
        return Prepared(lambda: function(*case.arrays), _to_numpy)
    return _jitted(function, case, on_device=True)


def prepare_default(workload: Workload, mode: DefaultMode, case: Case) -> Prepared:
    """The public op with ``backend=None``: eagerly on the case's numpy arrays (what a
    user's first call looks like, ``"eager"``), or under ``jax.jit`` with the inputs on the
    device (``"jit"``) or given as the same numpy arrays (``"jit-numpy"``: what JAX itself
    spends taking numpy arguments, which an eager call cannot avoid)."""
    function: Callable[..., object] = functools.partial(workload.op, **case.static)
    if mode == "eager":
        return Prepared(lambda: function(*case.arrays), _to_numpy)
    return _jitted(function, case, on_device=mode == "jit")


def _float_dtype(case: Case) -> str:
    """The dtype the case's float inputs are computed in: float64 if any is float64."""
    return "float64" if any(a.dtype == np.float64 for a in case.arrays) else "float32"


def _jitted(function: Callable[..., object], case: Case, *, on_device: bool) -> Prepared:
    """``function`` under ``jax.jit`` on the case's arrays (placed on the device first if
    ``on_device``); in JAX's x64 mode when an input is 64-bit, so that float64 stays
    float64 (without it ``device_put`` and ``jit`` canonicalize to float32)."""
    jitted = jax.jit(function)
    wide = any(a.dtype.itemsize == 8 for a in case.arrays)
    with x64_scope(wide):
        arrays = tuple(map(jax.device_put, case.arrays)) if on_device else case.arrays
    if not wide:
        return Prepared(lambda: jitted(*arrays), _to_numpy)

    def call() -> object:
        with x64_scope(True):
            return jitted(*arrays)

    return Prepared(call, _to_numpy)
