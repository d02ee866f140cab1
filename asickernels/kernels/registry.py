"""Where backends and their per-op implementations are registered and looked up.

An *op* (``"giou"``, ``"nms"``, ...) is defined once in ``asickernels/kernels/<op>.py``: its
signature, validation and dispatch. A *backend* (``"xla"``, ``"pallas_tpu"``, ...) declares
itself with :func:`register_backend` and adds one implementation module per op, registered
with one :func:`register` line in ``asickernels/backends/__init__.py``. Implementations are
imported lazily, so a backend whose dependencies are missing costs nothing until it is used.

Implementation calling conventions (the op layer validates, flattens and converts first):

* ``giou(boxes1 [P, 4], boxes2 [P, 4]) -> [P] float``; P >= 1, float32/bfloat16/float64 in.
* ``giou_vjp(boxes1 [P, 4], boxes2 [P, 4], cotangent [P]) -> (d_boxes1, d_boxes2)``.
* ``nms(boxes [B, N, 4], scores [B, N], categories [B, N] int32 | None, *, iou_threshold,
  max_output_size, score_threshold) -> (indices [B, max_output_size] int32, num_valid [B] int32)``;
  B, N, max_output_size >= 1, ``score_threshold`` a float (``-inf`` when the caller gave none).
* ``int8_matmul(x [M, K] int8, y [K, N] int8, *, x_scale [M] | None, y_scale [N] | None,
  out_dtype) -> [M, N]``; scales are both given or both None; K <= INT8_MATMUL_MAX_K.

Every implementation also takes ``config=None``: a backend-specific tuning object.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

ArrayKind = Literal["numpy", "jax"]
Mode = Literal["native", "simulated", "missing"]


@dataclasses.dataclass(frozen=True)
class Availability:
    """How a backend runs on this machine.

    ``mode`` is ``"native"`` (on the hardware it targets), ``"simulated"`` (a faithful CPU
    stand-in: Pallas interpret mode, the NKI simulator, ...) or ``"missing"`` (cannot run;
    ``detail`` says why and ``install_hint`` how to fix it).
    """

    mode: Mode
    detail: str
    install_hint: str | None = None


@dataclasses.dataclass(frozen=True)
class Backend:
    """A kernel target.

    Attributes:
      name: the value users pass as ``backend=``.
      array_kind: what its implementations take and return: host ``numpy`` arrays or ``jax``
        arrays (which makes it usable under ``jit``/``vmap``/``grad``).
      probe: returns this backend's :class:`Availability` here; called lazily.
      description: one line for ``asickernels info`` and the README table.
      default_on: platforms (``jax`` device platforms, e.g. ``"tpu"``, ``"cpu"``) on which
        ``backend=None`` picks this backend, in order of preference across backends.
      counters: optional; returns counters of the backend's most recent kernel run (e.g.
        simulated instructions per engine, bytes moved), reported beside timings by ``bench``.
      device_timer: optional; ``(op, case, warmup, iters) -> Timing`` timing ``op`` on the
        device with the vendor's profiler, used by ``bench`` instead of wall clock when the
        backend runs natively (see :mod:`asickernels.benchmarking.device`).
    """

    name: str
    array_kind: ArrayKind
    probe: Callable[[], Availability]
    description: str
    default_on: tuple[str, ...] = ()
    counters: Callable[[], dict[str, float]] | None = None
    device_timer: Callable[[str, Any, int, int], Any] | None = None


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run on this machine (the message says why)."""


_BACKENDS: dict[str, Backend] = {}
_IMPLEMENTATIONS: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
_LOADED: dict[tuple[str, str], Callable[..., Any]] = {}
_AVAILABILITY: dict[str, Availability] = {}


def register_backend(backend: Backend) -> None:
    """Declares a backend. Names are unique."""
    if backend.name in _BACKENDS and _BACKENDS[backend.name] != backend:
        raise ValueError(f"backend {backend.name!r} is already registered")
    _BACKENDS[backend.name] = backend


def register(op: str, backend: str, target: str, **bound: Any) -> None:
    """Registers ``target`` (``"package.module:function"``) as ``backend``'s ``op``.

    ``bound`` keyword arguments are passed on every call (e.g. an interpret mode), so one
    implementation module can serve two backend names.
    """
    if backend not in _BACKENDS:
        raise ValueError(f"register the backend {backend!r} before its implementations")
    _IMPLEMENTATIONS[(op, backend)] = (target, bound)


def backend(name: str) -> Backend:
    try:
        return _BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; known backends: {sorted(_BACKENDS)}") from None


def backend_names() -> list[str]:
    return list(_BACKENDS)


def backends_for(op: str) -> list[str]:
    """Backends that implement ``op``, in registration order."""
    return [name for name in _BACKENDS if (op, name) in _IMPLEMENTATIONS]


def availability(name: str) -> Availability:
    """The (cached) result of the backend's probe."""
    if name not in _AVAILABILITY:
        try:
            _AVAILABILITY[name] = backend(name).probe()
        except Exception as error:  # a probe must never take the library down
            _AVAILABILITY[name] = Availability("missing", f"probe failed: {error!r}")
    return _AVAILABILITY[name]


def implementation(op: str, name: str) -> Callable[..., Any]:
    """The callable for (op, backend), imported on first use.

    Raises:
      ValueError: unknown backend, or the backend does not implement ``op``.
      BackendUnavailableError: the backend cannot run here.
    """
    backend(name)
    if (op, name) not in _IMPLEMENTATIONS:
        raise ValueError(
            f"backend {name!r} does not implement {op!r}; backends that do: {backends_for(op)}"
        )
    status = availability(name)
    if status.mode == "missing":
        hint = f" ({status.install_hint})" if status.install_hint else ""
        raise BackendUnavailableError(f"backend {name!r} cannot run here: {status.detail}{hint}")
    if (op, name) not in _LOADED:
        target, bound = _IMPLEMENTATIONS[(op, name)]
        module_name, _, function_name = target.partition(":")
        function = getattr(importlib.import_module(module_name), function_name)
        if bound:
            original = function

            def function(*args: Any, **kwargs: Any) -> Any:
                return original(*args, **bound, **kwargs)

        _LOADED[(op, name)] = function
    return _LOADED[(op, name)]


def _platform_of(arrays: Sequence[Any]) -> str:
    import jax

    for array in arrays:
        if isinstance(array, jax.Array) and not isinstance(array, jax.core.Tracer):
            return next(iter(array.devices())).platform
    return jax.default_backend()


def resolve(op: str, name: str | None, arrays: Sequence[Any]) -> Backend:
    """The backend to run ``op`` on: ``name``, or for ``None`` the preferred backend for the
    platform the inputs live on (falling back to ``"xla"``)."""
    if name is not None:
        chosen = backend(name)
        implementation(op, name)  # fail early with the reason
        return chosen
    platform = _platform_of(arrays)
    for candidate in _BACKENDS.values():
        if (
            platform in candidate.default_on
            and (op, candidate.name) in _IMPLEMENTATIONS
            and availability(candidate.name).mode == "native"
        ):
            return candidate
    return backend("xla")


def to_backend_arrays(chosen: Backend, arrays: Sequence[Any]) -> list[Any]:
    """Converts inputs to the array kind ``chosen`` takes (``None`` passes through)."""
    if chosen.array_kind == "jax":
        import jax.numpy as jnp

        return [None if a is None else jnp.asarray(a) for a in arrays]
    import jax

    converted = []
    for array in arrays:
        if isinstance(array, jax.core.Tracer):
            raise TypeError(
                f"backend {chosen.name!r} runs on host numpy arrays and cannot be traced by "
                "jit/vmap/grad; call it outside jit, or use a JAX backend ('xla', 'pallas_tpu')"
            )
        converted.append(None if array is None else np.asarray(array))
    return converted


def to_jax(value: Any, dtype: Any, shape: tuple[int, ...] | None = None) -> Any:
    """A backend output (numpy or jax) as a JAX array of ``dtype`` (and ``shape``).

    The cast and reshape happen before the transfer, in the output's own array library, so a
    host backend's result costs one transfer instead of a device op per step."""
    import jax
    import jax.numpy as jnp

    if not isinstance(value, jax.Array):
        value = np.asarray(value)
    value = value.astype(dtype)
    if shape is not None:
        value = value.reshape(shape)
    return jnp.asarray(value)
