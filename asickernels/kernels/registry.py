"""Where backends and their per-kernel implementations are registered and looked up.

A public op (``asickernels.giou``, ``nms``, ...) is declared once in
``asickernels/kernels/<op>.py`` (:mod:`asickernels.kernels.declaration`); it runs one or more
*kernels* (``"giou"``, ``"giou_vjp"``, ``"nms"``, ``"int8_matmul"``). A *backend* (``"xla"``,
``"pallas_tpu"``, ...) declares itself with :func:`register_backend` and adds one
implementation module per kernel, registered with one :func:`register` line in
``asickernels/backends/__init__.py`` that also states what the implementation supports
(:class:`Support`). Which backend runs is decided in one place,
:mod:`asickernels.kernels.policy`. Implementations are imported lazily, so a backend whose
dependencies are missing costs nothing until it is used.

Implementation calling conventions (the op layer validates, flattens and converts first):

* ``giou(boxes1 [P, 4], boxes2 [P, 4]) -> [P] float``; P >= 1; float32 (or float64 where the
  implementation's :class:`Support` lists it: then the result is float64). bfloat16/float16
  inputs arrive upcast to float32.
* ``giou_vjp(boxes1 [P, 4], boxes2 [P, 4], cotangent [P]) -> (d_boxes1, d_boxes2)``.
* ``nms(boxes [B, N, 4], scores [B, N], categories [B, N] int32 | None, *, iou_threshold,
  max_output_size, score_threshold) -> (indices [B, max_output_size] int32, num_valid [B] int32)``;
  B, N, max_output_size >= 1, ``score_threshold`` a float (``-inf`` when the caller gave none);
  boxes and scores float32 or float64 as for ``giou``; categories are int32 ids, equal
  exactly when the caller's ids are (any int32 values: a kernel that needs small ones ranks
  them with :func:`asickernels.kernels.nms.dense_ranks`).
* ``int8_matmul(x [M, K] int8, y [K, N] int8, *, x_scale [M] | None, y_scale [N] | None,
  out_dtype) -> [M, N]``; scales are both given or both None; K <= INT8_MATMUL_MAX_K.

Every implementation also takes ``config=None``: a backend-specific tuning object. A JAX
backend may also register a *host* implementation of the same kernel (numpy in, numpy out)
that eager calls on host arrays use instead of a compiled JAX call.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable
from typing import Any, Literal

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
      platforms: the device platforms it runs natively on (``"cpu"``, ``"tpu"``,
        ``"neuron"``, ...; ``"*"`` for any JAX device). :mod:`~asickernels.kernels.policy`
        picks a backend for ``backend=None`` only where it is native.
      embeddable: its JAX implementations lower to plain HLO (no host callbacks or custom
        calls registered in this process), so they can be spliced into another XLA
        program (torch_xla's ``call_jax``).
      counters: optional; returns counters of the backend's most recent kernel run (e.g.
        simulated instructions per engine, bytes moved), reported beside timings by ``bench``.
      device_timer: optional; ``(op, case, warmup, iters) -> Timing`` timing ``op`` on the
        device with the vendor's profiler, used by ``bench`` instead of wall clock when the
        backend runs natively (see :mod:`asickernels.benchmarking.device`).
      traceable: optional; False when this JAX cannot run the JAX backend's kernels under
        ``jit`` (eager calls then run them op by op instead of compiled).
    """

    name: str
    array_kind: ArrayKind
    probe: Callable[[], Availability]
    description: str
    platforms: tuple[str, ...] = ()
    embeddable: bool = False
    counters: Callable[[], dict[str, float]] | None = None
    device_timer: Callable[[str, Any, int, int], Any] | None = None
    traceable: Callable[[], bool] | None = None


FLOAT32_ONLY = frozenset({"float32"})
FLOAT32_AND_64 = frozenset({"float32", "float64"})


@dataclasses.dataclass(frozen=True)
class Support:
    """What one implementation can compute, stated on its registration line.

    Attributes:
      dtypes: the compute dtypes it decides in (``"float32"``, ``"float64"``); float
        inputs narrower than float32 are upcast before it runs. Integer kernels ignore this.
      generations: TPU generations it compiles for (None: any); elsewhere ignored.
    """

    dtypes: frozenset[str] = FLOAT32_ONLY
    generations: frozenset[str] | None = None


@dataclasses.dataclass(frozen=True)
class Implementation:
    target: str
    bound: dict[str, Any]
    support: Support
    host_target: str | None


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run on this machine (the message says why)."""


_BACKENDS: dict[str, Backend] = {}
_IMPLEMENTATIONS: dict[tuple[str, str], Implementation] = {}
_LOADED: dict[tuple[str, str, bool], Callable[..., Any]] = {}
_AVAILABILITY: dict[str, Availability] = {}


def register_backend(backend: Backend) -> None:
    """Declares a backend. Names are unique."""
    if backend.name in _BACKENDS and _BACKENDS[backend.name] != backend:
        raise ValueError(f"backend {backend.name!r} is already registered")
    _BACKENDS[backend.name] = backend


def register(
    op: str,
    backend: str,
    target: str,
    *,
    support: Support = Support(),
    host: str | None = None,
    **bound: Any,
) -> None:
    """Registers ``target`` (``"package.module:function"``) as ``backend``'s kernel ``op``.

    ``support`` states what the implementation computes (dtypes, TPU generations); ``host``
    optionally names a numpy-in, numpy-out twin of a JAX implementation, used for eager calls
    on host arrays. ``bound`` keyword arguments are passed on every call (e.g. an interpret
    mode), so one implementation module can serve two backend names.
    """
    if backend not in _BACKENDS:
        raise ValueError(f"register the backend {backend!r} before its implementations")
    _IMPLEMENTATIONS[(op, backend)] = Implementation(target, bound, support, host)


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


def support(op: str, name: str) -> Support:
    """What ``name``'s implementation of kernel ``op`` supports (it must be registered)."""
    return _IMPLEMENTATIONS[(op, name)].support


def has_host_implementation(op: str, name: str) -> bool:
    entry = _IMPLEMENTATIONS.get((op, name))
    return entry is not None and (
        backend(name).array_kind == "numpy" or entry.host_target is not None
    )


def check_runs_here(op: str, name: str) -> None:
    """Raises unless ``name`` is a known backend implementing ``op`` that can run here.

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


def implementation(op: str, name: str, *, host: bool = False) -> Callable[..., Any]:
    """The callable for (kernel ``op``, backend), imported on first use: its host (numpy)
    twin with ``host=True`` (the implementation itself for a numpy backend)."""
    key = (op, name, host)
    loaded = _LOADED.get(key)
    if loaded is not None:  # eager calls ask on every call; it was checked when loaded
        return loaded
    check_runs_here(op, name)
    entry = _IMPLEMENTATIONS[(op, name)]
    target = entry.host_target if host and backend(name).array_kind == "jax" else entry.target
    if target is None:
        raise ValueError(f"backend {name!r} has no host implementation of {op!r}")
    module_name, _, function_name = target.partition(":")
    function = getattr(importlib.import_module(module_name), function_name)
    _LOADED[key] = functools.partial(function, **entry.bound) if entry.bound else function
    return _LOADED[key]
