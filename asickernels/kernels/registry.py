"""Where backends and their per-kernel implementations are registered and looked up.

A public op (``asickernels.giou``, ``nms``, ...) is declared once in
``asickernels/kernels/<op>.py`` (:mod:`asickernels.kernels.declaration`); it runs the
implementations of one op, its *kernel* (:attr:`~asickernels.kernels.declaration.Op.kernel`:
the op itself, or another op's, as ``batched_nms`` runs ``nms``'s). A *backend* (``"xla"``,
``"pallas_tpu"``, ...) is a package under ``asickernels/backends/`` whose ``__init__``
defines its :class:`Backend` (listed in ``asickernels/backends/__init__.py``); each of its
kernel modules declares, where the kernel is written, which op it implements and what it
supports: ``@BACKEND.implements(ops.giou, dtypes=FLOAT32_AND_64)`` (:meth:`Backend.implements`,
:meth:`Backend.host_twin`; ``ops`` is :mod:`asickernels.kernels.public`). Which backend runs
is decided in one place, :mod:`asickernels.kernels.policy`, from the op's preference. A
backend's kernel modules are imported when the backend is first asked about, so a backend
whose dependencies are missing costs nothing until then, and is reported ``missing`` (with
the import error) rather than breaking the library.

An implementation is called as its op's module documents (the op layer validates, flattens
and converts first): its arrays positionally, the op's checked static arguments as keyword
arguments of the op's own names and types (``nms(boxes, scores, categories, *,
iou_threshold: float, max_output_size: int, score_threshold: float)``). The op's computation
gets it from the call's :class:`Runner`.

An implementation whose declaration names a tuning config type
(``@BACKEND.implements(..., config=GiouConfig)``) also takes ``config=`` (None when the caller
gave none); the op refuses any other config, and any config at all for an implementation that
names none, once per call signature (:func:`check_config`), so no kernel sees one. A JAX
backend may also declare a *host twin* of a kernel (numpy in, numpy out; :meth:`Backend.host_twin`)
that eager calls on host arrays use instead of a compiled JAX call.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import jax.numpy as jnp
import numpy as np

if TYPE_CHECKING:
    from asickernels.kernels.declaration import Op

ArrayKind = Literal["numpy", "jax"]
F = TypeVar("F", bound=Callable[..., Any])
FLOAT32_ONLY = frozenset({"float32"})
FLOAT32_AND_64 = frozenset({"float32", "float64"})
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
      package: the module (or package, whose modules are all imported) that declares this
        backend's kernels; its ``__name__``.
      kernels_of: optional; another backend whose kernels this one runs, each call given
        ``kernel_kwargs`` (TPU interpret mode runs the Pallas kernels with ``mode=...``).
    """

    name: str
    array_kind: ArrayKind
    probe: Callable[[], Availability]
    platforms: tuple[str, ...] = ()
    embeddable: bool = False
    counters: Callable[[], dict[str, float]] | None = None
    # (op, kernels.cases.Case, warmup, iters) -> benchmarking.timing.Timing; typed loosely
    # so that the registry imports neither (both import it)
    device_timer: Callable[..., Any] | None = None
    traceable: Callable[[], bool] | None = None
    package: str = ""
    kernels_of: str | None = None
    kernel_kwargs: Mapping[str, object] = dataclasses.field(default_factory=dict, hash=False)

    def implements(
        self,
        kernel: Op,
        *,
        dtypes: frozenset[str] = FLOAT32_ONLY,
        generations: frozenset[str] | None = None,
        config: type | None = None,
        vjp: Op | None = None,
    ) -> Callable[[F], F]:
        """Declares the decorated function as this backend's implementation of ``kernel``.

        ``dtypes`` and ``generations`` state what it supports, ``config`` the type of the
        tuning object it takes (None: it takes none) (:class:`Support`). ``vjp``
        also declares, as that op's implementation, its backward kernel by automatic
        differentiation (:func:`asickernels.backends.autodiff.paired_vjp`; for a JAX
        paired-box kernel ``[P, 4] x2 -> [P]``), with the same support.
        """
        support = Support(dtypes, generations, config)

        def declare(function: F) -> F:
            register(kernel, self.name, function, support=support)
            if vjp is not None:
                from asickernels.backends.autodiff import paired_vjp

                register(vjp, self.name, paired_vjp(function), support=support)
            return function

        return declare

    def host_twin(self, kernel: Op) -> Callable[[F], F]:
        """Declares the decorated function as the host twin of this (JAX) backend's
        ``kernel``: the same computation, numpy in and numpy out, for eager host calls."""

        def declare(function: F) -> F:
            _HOST_TWINS[(kernel, self.name)] = function
            return function

        return declare


@dataclasses.dataclass(frozen=True)
class Support:
    """What one implementation can compute, stated where it is declared.

    Attributes:
      dtypes: the compute dtypes it decides in (``"float32"``, ``"float64"``); float
        inputs narrower than float32 are upcast before it runs. Integer kernels ignore this.
      generations: TPU generations it compiles for (None: any); elsewhere ignored.
      config: the type of the ``config=`` tuning object it takes; None: it takes none.
    """

    dtypes: frozenset[str] = FLOAT32_ONLY
    generations: frozenset[str] | None = None
    config: type | None = None


# The float64 references: each is written beside its op's declaration
# (``asickernels/kernels/<op>.py``) and registered there with ``REFERENCE.implements(op)``.
REFERENCE = Backend(
    name="reference",
    array_kind="numpy",
    probe=lambda: Availability("native", "numpy, float64"),
)


@dataclasses.dataclass(frozen=True)
class Implementation:
    function: Callable[..., Any]
    support: Support


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run on this machine (the message says why)."""


_BACKENDS: dict[str, Backend] = {}
# By (op, backend name).
_IMPLEMENTATIONS: dict[tuple[Op, str], Implementation] = {}
_HOST_TWINS: dict[tuple[Op, str], Callable[..., Any]] = {}
_LOADED: dict[tuple[Op, str, bool], Callable[..., Any]] = {}
_AVAILABILITY: dict[str, Availability] = {}
# Backends whose kernel modules were imported: None, or why they could not be.
_IMPORTED: dict[str, str | None] = {}


def register_backend(backend: Backend) -> None:
    """Declares a backend. Names are unique."""
    if backend.name in _BACKENDS and _BACKENDS[backend.name] != backend:
        raise ValueError(f"backend {backend.name!r} is already registered")
    _BACKENDS[backend.name] = backend


def register(
    kernel: Op, backend: str, function: Callable[..., Any], *, support: Support = Support()
) -> None:
    """Registers ``function`` as ``backend``'s implementation of ``kernel`` (what
    :meth:`Backend.implements` does; for backends built at run time, such as tests')."""
    _IMPLEMENTATIONS[(kernel, backend)] = Implementation(function, support)


def _import_kernels(name: str) -> str | None:
    """Imports the modules declaring ``name``'s kernels (once); why it could not, or None."""
    if name not in _IMPORTED:
        package = _BACKENDS[name].package
        modules = [package] if package else []
        try:
            if package:
                path = getattr(importlib.import_module(package), "__path__", None)
                if path is not None:
                    # Kernel modules have public names; private ones (helpers, the cpu
                    # backend's compiled library) are imported by them as they need.
                    modules = [
                        f"{package}.{m.name}"
                        for m in pkgutil.iter_modules(path)
                        if not m.name.startswith("_")
                    ]
            for module in modules:
                importlib.import_module(module)
            _IMPORTED[name] = None
        except Exception as error:  # a backend's missing dependency must not break the rest
            _IMPORTED[name] = f"its kernels cannot be imported ({module}: {error!r})"
    return _IMPORTED[name]


def _declared(name: str) -> str:
    """The backend whose declarations ``name`` runs (itself, or its ``kernels_of``), with
    its kernel modules imported."""
    source = backend(name).kernels_of or name
    _import_kernels(source)
    return source


def backend(name: str) -> Backend:
    try:
        return _BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; known backends: {sorted(_BACKENDS)}") from None


def backend_names() -> list[str]:
    return list(_BACKENDS)


def has_kernel(kernel: Op, name: str) -> bool:
    """Whether backend ``name`` (known) implements ``kernel``; imports its kernels."""
    return (kernel, _declared(name)) in _IMPLEMENTATIONS


def backends_for(kernel: Op) -> list[str]:
    """Backends that implement ``kernel``, in registration order."""
    return [name for name in _BACKENDS if has_kernel(kernel, name)]


def availability(name: str) -> Availability:
    """The (cached) result of the backend's probe; ``missing`` too when its kernel modules
    cannot be imported."""
    if name not in _AVAILABILITY:
        try:
            status = backend(name).probe()
        except Exception as error:  # a probe must never take the library down
            status = Availability("missing", f"probe failed: {error!r}")
        if status.mode != "missing":
            reason = _import_kernels(backend(name).kernels_of or name)
            if reason is not None:
                status = Availability("missing", reason)
        _AVAILABILITY[name] = status
    return _AVAILABILITY[name]


def support(kernel: Op, name: str) -> Support:
    """What ``name``'s implementation of ``kernel`` supports (it must implement it)."""
    return _IMPLEMENTATIONS[(kernel, _declared(name))].support


def check_config(kernel: Op, name: str, config: object) -> None:
    """Refuses a ``config`` that backend ``name``'s implementation of ``kernel`` does not
    take: anything but None where it declares no config type, anything but an instance of
    the type it declares.

    Raises:
      TypeError: naming ``config``, the backend and what it takes.
    """
    if config is None:
        return
    kind = support(kernel, name).config
    if kind is None:
        raise TypeError(
            f"config: backend {name!r} takes no config for {kernel.name}; pass config=None, "
            f"got {type(config).__name__}"
        )
    if not isinstance(config, kind):
        raise TypeError(
            f"config: backend {name!r} takes a {kind.__name__} for {kernel.name}, "
            f"got {type(config).__name__}"
        )


def has_host_implementation(kernel: Op, name: str) -> bool:
    source = _declared(name)
    return (kernel, source) in _IMPLEMENTATIONS and (
        backend(name).array_kind == "numpy" or (kernel, source) in _HOST_TWINS
    )


def check_runs_here(kernel: Op, name: str) -> None:
    """Raises unless ``name`` is a known backend implementing ``kernel`` that can run here.

    Raises:
      ValueError: unknown backend, or the backend does not implement ``kernel``.
      BackendUnavailableError: the backend cannot run here.
    """
    source = backend(name).kernels_of or name
    if not has_kernel(kernel, name) and _IMPORTED[source] is None:
        raise ValueError(
            f"backend {name!r} does not implement {kernel.name!r}; backends that do: "
            f"{backends_for(kernel)}"
        )
    status = availability(name)
    if status.mode == "missing":
        hint = f" ({status.install_hint})" if status.install_hint else ""
        raise BackendUnavailableError(f"backend {name!r} cannot run here: {status.detail}{hint}")


def implementation(kernel: Op, name: str, *, host: bool = False) -> Callable[..., Any]:
    """The callable for (``kernel``, backend), its kernels imported on first use: its host
    (numpy) twin with ``host=True`` (the implementation itself for a numpy backend)."""
    key = (kernel, name, host)
    loaded = _LOADED.get(key)
    if loaded is not None:  # eager calls ask on every call; it was checked when loaded
        return loaded
    check_runs_here(kernel, name)
    chosen = backend(name)
    source = _declared(name)
    if host and chosen.array_kind == "jax":
        function = _HOST_TWINS.get((kernel, source))
        if function is None:
            raise ValueError(f"backend {name!r} has no host implementation of {kernel.name!r}")
    else:
        function = _IMPLEMENTATIONS[(kernel, source)].function
    bound = chosen.kernel_kwargs
    _LOADED[key] = functools.partial(function, **bound) if bound else function
    return _LOADED[key]


@dataclasses.dataclass(frozen=True)
class Runner:
    """What :attr:`Op.compute <asickernels.kernels.declaration.Op.compute>` calls kernels
    through: the op being run, the chosen backend, whether its arrays are host numpy arrays
    (``xp`` is numpy) or JAX arrays, and the tuning config."""

    op: Op
    backend: str
    host: bool
    config: object

    @property
    def xp(self) -> Any:  # numpy or jax.numpy: one array API, which no static type names
        return np if self.host else jnp

    def kernel(self, op: Op) -> Callable[..., Any]:
        """The chosen backend's implementation of ``op`` (the running op's kernel, or
        another op's, as a gradient's)."""
        function = implementation(op, self.backend, host=self.host)
        if self.config is None:  # every kernel's config defaults to None
            return function
        return functools.partial(function, config=self.config)
