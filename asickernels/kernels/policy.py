"""Which backend runs a kernel: the one selection policy of the library.

Every op that has kernels declares one ordered preference of backends
(:attr:`~asickernels.kernels.declaration.Op.preference`). For ``backend=None`` the first
backend in that order is chosen that implements the kernel, runs *natively* on the
platform the inputs live on (its :attr:`~asickernels.kernels.registry.Backend.platforms`),
and supports the call (the compute dtype, the TPU generation; see
:class:`~asickernels.kernels.registry.Support`, declared beside each kernel), and, inside a
trace, takes JAX arrays. A native backend passed over for the dtype or generation is a
*fallback*: it warns once, and ``asickernels info`` lists it. A backend named by the caller
is used as named, or refused with the reason; nothing falls back silently, and no backend
falls back inside itself. The reference and TPU interpret mode are never picked: they are
asked for by name.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from asickernels.kernels import registry

if TYPE_CHECKING:
    import jax

    from asickernels.kernels.declaration import Op


@dataclasses.dataclass(frozen=True)
class Where:
    """Where a call runs: the inputs' platform (a JAX platform name, or ``"neuron"``), the
    TPU generation when it is a TPU, whether the call is being traced, and whether a
    simulated backend may stand in for a native one (torch_xla on a CPU PJRT device runs
    the TPU kernels in interpret mode, so that a CPU run checks the kernels a TPU runs), and
    whether the computation is spliced into another XLA program (torch_xla's ``call_jax``),
    where a JAX backend must lower to plain HLO (no custom calls registered in this
    process, such as the native CPU backend's)."""

    platform: str
    generation: str | None = None
    traced: bool = False
    simulated_ok: bool = False
    embedded: bool = False


def default_device() -> jax.Device:
    """Where host arrays would go: JAX's default device (``jax.devices()`` costs
    microseconds on every eager call, so the answer is kept unless the setting changes)."""
    import jax

    setting = jax.config.jax_default_device  # type: ignore[attr-defined]
    if setting is not None:
        return setting if not isinstance(setting, str) else jax.devices(setting)[0]
    if _DEFAULT_DEVICE:
        return _DEFAULT_DEVICE[0]
    _DEFAULT_DEVICE.append(jax.devices()[0])
    return _DEFAULT_DEVICE[0]


_DEFAULT_DEVICE: list[jax.Device] = []


def where_arrays_live(arrays: Sequence[object]) -> Where:
    """The :class:`Where` of a call on ``arrays`` (JAX arrays, tracers or host arrays)."""
    import jax

    traced = any(isinstance(a, jax.core.Tracer) for a in arrays)
    device = None
    for array in arrays:
        if isinstance(array, jax.Array) and not isinstance(array, jax.core.Tracer):
            device = next(iter(array.devices()))
            break
    if device is None:
        device = default_device()
    generation = None
    if device.platform == "tpu":
        from asickernels import tpu_generations

        generation = tpu_generations.generation_of(device)
    return Where(device.platform, generation, traced)


def _native_on(name: str, platform: str) -> bool:
    platforms = registry.backend(name).platforms
    return "*" in platforms or platform in platforms


def _why_not(kernel: Op, name: str, where: Where, dtype: str | None) -> str | None:
    """Why ``name`` cannot run this call (None: it can), beyond being registered."""
    chosen = registry.backend(name)
    if where.traced and chosen.array_kind != "jax":
        return (
            f"backend {name!r} runs on host numpy arrays and cannot be traced by "
            "jit/vmap/grad; call it outside jit, or use a JAX backend"
        )
    support = registry.support(kernel, name)
    if dtype is not None and dtype not in support.dtypes:
        return (
            f"backend {name!r} computes {kernel.name} in {'/'.join(sorted(support.dtypes))}, not "
            f"{dtype}; pass {sorted(support.dtypes)[0]} inputs or a backend that has {dtype} "
            f"({', '.join(b for b in registry.backends_for(kernel) if dtype in registry.support(kernel, b).dtypes)})"
        )
    if (
        where.platform == "tpu"
        and where.generation is not None
        and support.generations is not None
        and where.generation not in support.generations
    ):
        return f"backend {name!r} has no {kernel.name} kernel for TPU {where.generation}"
    return None


_WARNED: set[tuple[Op, str, str]] = set()
_SELECTED: dict[tuple[Op, str | None, Where, str | None], str] = {}


def select(kernel: Op, requested: str | None, where: Where, dtype: str | None) -> str:
    """:func:`choose`, remembered: registrations and availability do not change while a
    process runs, so the same call always gets the same answer."""
    key = (kernel, requested, where, dtype)
    chosen = _SELECTED.get(key)
    if chosen is None:
        chosen = _SELECTED[key] = choose(kernel, requested, where, dtype)
    return chosen


def choose(kernel: Op, requested: str | None, where: Where, dtype: str | None) -> str:
    """The backend that runs ``kernel`` for a call (``dtype``: the compute dtype, or None
    for integer kernels).

    Raises:
      ValueError / BackendUnavailableError: ``requested`` is unknown, lacks the kernel or
        cannot run here.
      TypeError: ``requested`` cannot run this call (dtype, tracing), or no backend can.
    """
    if requested is not None:
        registry.check_runs_here(kernel, requested)
        reason = _why_not(kernel, requested, where, dtype)
        if reason is not None:
            raise TypeError(reason)
        return requested
    for name in candidates(kernel, where):
        reason = _why_not(kernel, name, where, dtype)
        if reason is None:
            return name
        key = (kernel, name, reason)
        if key not in _WARNED:
            _WARNED.add(key)
            warnings.warn(f"{reason}: falling back to the next backend", stacklevel=4)
    raise TypeError(
        f"no backend can run {kernel.name} here ({where.platform}"
        + (", traced" if where.traced else "")
        + (f", {dtype}" if dtype else "")
        + ")"
    )


def candidates(kernel: Op, where: Where, *, assume_native: bool = False) -> list[str]:
    """Backends in ``kernel``'s preference order that implement it and run here, natively on
    ``where.platform`` (or simulated, where ``where.simulated_ok``). ``assume_native``
    answers for a machine of that platform rather than this one (for ``describe``)."""
    names = []
    for name in kernel.preference:
        if name not in registry.backend_names():
            continue
        backend = registry.backend(name)
        simulated = where.simulated_ok and backend.embeddable
        if (not _native_on(name, where.platform) and not simulated) or (
            where.embedded and backend.array_kind == "jax" and not backend.embeddable
        ):
            continue  # decided before the probe: a backend not tried here is not imported
        mode = "native" if assume_native else registry.availability(name).mode
        runs = mode == "native" or (mode == "simulated" and simulated)
        if runs and registry.has_kernel(kernel, name):
            names.append(name)
    return names


def describe(
    ops: Iterable[Op], platform: str, generation: str | None = None, *, assume_native: bool = False
) -> dict[str, dict[str, str]]:
    """For ``asickernels info``: per kernel (each of ``ops`` that declares a preference) and
    compute dtype, the backend ``backend=None`` picks on ``platform`` (and TPU
    ``generation``), with each fallback it takes; ``assume_native`` describes a machine of
    that platform instead of this one."""
    table: dict[str, dict[str, str]] = {}
    where = Where(platform, generation)
    for kernel in (op for op in ops if op.preference):
        row: dict[str, str] = {}
        for dtype in kernel.compute_dtypes:
            skipped = []
            chosen = "none"
            for name in candidates(kernel, where, assume_native=assume_native):
                reason = _why_not(kernel, name, where, dtype)
                if reason is None:
                    chosen = name
                    break
                skipped.append(name)
            label = dtype or "int8"
            row[label] = chosen + (f" (falls back from {', '.join(skipped)})" if skipped else "")
        table[kernel.name] = row
    return table
