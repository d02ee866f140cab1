"""Op declarations: each public op is declared once, and everything else derives from it.

An :class:`Op` holds an op's parameters (arrays and static values, with their defaults and
PyTorch schema types), its validation (:attr:`Op.check`: from shapes, dtypes and static
values to a :class:`Plan`, raising TypeError/ValueError that names the bad argument), its
computation over backend kernels (:attr:`Op.compute`, written once against ``xp`` = numpy
or ``jax.numpy``), its float64 reference and, for differentiable ops, its vector-Jacobian
product. The JAX API is the :class:`Op` object itself; the ``torch.library`` operators and
the torch_xla kernels are generated from it at import; the torch functions and the SPMD
wrappers are generated from it into checked-in modules (:mod:`asickernels.frontends.generate`)
and delegate to it.

Calling an op:

* inside a trace (``jit``/``vmap``/``grad``), the computation is traced inline;
* eagerly, the call's signature (each array's shape, dtype and placement; each other
  argument's type and value) is bound, validated and given a backend once; every call of
  that signature then runs the same ``jax.jit``-compiled computation, or the backend's host
  implementation (numpy in, numpy out) on a numpy backend (``array_kind="numpy"``) and,
  on a JAX backend that has one, for numpy inputs of which XLA would copy 256 KiB or more
  (those not 64-byte aligned);
* with 64-bit inputs (float64 boxes, int64 scales), JAX's x64 mode is on for that call only
  (:func:`x64_scope`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Literal, NamedTuple, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

from asickernels.kernels import _checks, policy, registry

REQUIRED: Any = inspect.Parameter.empty  # typed Any: it stands in for any default
Want = Literal["jax", "any"]
# An array argument as the op sees it: numpy, or JAX (concrete or traced).
Array: TypeAlias = np.ndarray | jax.Array


class Spec(NamedTuple):
    """The shape and dtype of an array argument: all validation looks at."""

    shape: tuple[int, ...]
    dtype: np.dtype


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of an op.

    Attributes:
      name: its name in every frontend.
      kind: ``"array"`` (traced; a tensor in PyTorch) or ``"static"`` (a Python value).
      torch_type: its type in the ``torch.library`` schema (``"Tensor"``, ``"Tensor?"``,
        ``"float"``, ``"float?"``, ``"int"``, ``"int?"``, ``"str"``, ``"ScalarType?"``).
      default: REQUIRED, or the default value.
      positional: may be passed by position (else keyword-only).
      core_ndim: for arrays, how many trailing dims are not batch dims (SPMD wrappers
        partition the leading ones).
    """

    name: str
    kind: Literal["array", "static"]
    torch_type: str
    default: object = REQUIRED
    positional: bool = False
    core_ndim: int = 0


def array(name: str, core_ndim: int = 0, *, optional: bool = False) -> Param:
    """An array parameter; optional ones default to None and are keyword-only."""
    if optional:
        return Param(name, "array", "Tensor?", None, False, core_ndim)
    return Param(name, "array", "Tensor", REQUIRED, True, core_ndim)


def static(
    name: str, torch_type: str, default: object = REQUIRED, *, positional: bool = False
) -> Param:
    return Param(name, "static", torch_type, default, positional)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What validation decided, from shapes, dtypes and static values alone.

    Attributes:
      kernel: the registry kernel whose backends run the op (None: plain JAX, no backend).
      dtype: the compute dtype the backend must support (``"float32"``, ``"float64"``), or
        None for integer kernels.
      outputs: the output shapes and dtypes (one :class:`Spec`, or a tuple for tuple outputs).
      statics: the static arguments after validation (normalized, hashable).
      trivial: the outputs are known without running anything (empty inputs): each is
        filled with its entry of ``fill``.
      fill: per output, the value of a trivial output (e.g. -1 for NMS index padding).
      x64: some input or output is 64-bit, so the call runs in JAX's x64 mode (set by
        :meth:`Op.plan` from the specs: a check leaves it False).
      copy_bound: the kernel reads each input element about once, so that XLA's copy of
        numpy inputs that are not 64-byte aligned costs as much as the kernel: eager calls
        with 256 KiB or more of such inputs run on the backend's host twin where it has one.
    """

    kernel: str | None
    dtype: str | None
    outputs: Spec | tuple[Spec, ...]
    statics: tuple[tuple[str, Any], ...]
    trivial: bool = False
    fill: tuple[int, ...] = (0,)
    x64: bool = False
    copy_bound: bool = False

    def static(self, name: str) -> Any:
        return dict(self.statics)[name]

    def output_list(self) -> tuple[Spec, ...]:
        return (self.outputs,) if isinstance(self.outputs, Spec) else self.outputs


@dataclasses.dataclass(frozen=True)
class Runner:
    """What :attr:`Op.compute` calls kernels through: the chosen backend, whether its
    arrays are host numpy arrays (``xp`` is numpy) or JAX arrays, and the tuning config."""

    backend: str
    host: bool
    config: object

    @property
    def xp(self) -> Any:  # numpy or jax.numpy: one array API, which no static type names
        return np if self.host else jnp

    def kernel(self, name: str) -> Callable[..., Any]:
        function = registry.implementation(name, self.backend, host=self.host)
        if self.config is None:  # every kernel's config defaults to None
            return function
        return functools.partial(function, config=self.config)


Check = Callable[[Mapping[str, Spec | None], Mapping[str, Any]], Plan]
Compute = Callable[..., Any]
Call = Callable[..., Any]


class Op:
    """A public op, declared once. Calling it runs it (see the module docstring).

    Args:
      name: the public name (``asickernels.<name>``, ``torch.ops.asickernels.<name>``).
      params: the parameters in signature order (``backend`` and ``config`` are added).
      check: ``(array specs, static values) -> Plan``; raises TypeError/ValueError naming
        the argument (a required array given as None included).
      compute: ``(runner, plan, **arrays) -> outputs``, written with ``runner.xp``.
      reference: the float64 definition, called with the public arguments (no backend).
      doc: the docstring.
      vjp: for differentiable ops, ``(arrays, statics, backend, cotangent) -> gradients``
        of the array parameters named in ``differentiable``, written with public ops.
      differentiable: the array parameters ``vjp`` returns gradients for.
      partition: how the SPMD wrappers split the op (``"batch"``: every array along its
        leading batch dims; ``"none"``: the op has no SPMD wrapper; other rules are named by
        the op and live in the SPMD modules, :mod:`asickernels.frontends`).
      check_values: optional checks of concrete input values, run on every eager call.
      outputs: the names of the outputs (one name: the op returns an array, not a tuple).
      prepare: optional host-side conversion of concrete inputs on eager calls, before
        validation (e.g. 64-bit category ids to int32 ranks, so that no x64 is needed); it
        returns its argument itself when it has nothing to do, deciding on dtypes only.
    """

    def __init__(
        self,
        name: str,
        params: Sequence[Param],
        *,
        check: Check,
        compute: Compute,
        reference: Callable[..., Any],
        doc: str,
        vjp: Callable[..., tuple[Any, ...]] | None = None,
        differentiable: tuple[str, ...] = (),
        partition: str = "batch",
        check_values: Callable[..., None] | None = None,
        outputs: tuple[str, ...] = ("out",),
        prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        self.name = name
        self.params = tuple(params)
        self.check = check
        self.compute = compute
        self.reference = reference
        self.vjp = vjp
        self.differentiable = differentiable
        self.partition = partition
        self.check_values = check_values
        self.outputs = outputs
        self.prepare = prepare
        self.__name__ = self.__qualname__ = name
        self.__doc__ = doc
        self.__module__ = "asickernels"
        self.array_names = tuple(p.name for p in self.params if p.kind == "array")
        self.static_names = tuple(p.name for p in self.params if p.kind == "static")
        keyword = inspect.Parameter.KEYWORD_ONLY
        self.__signature__ = inspect.Signature(
            [
                inspect.Parameter(
                    p.name,
                    inspect.Parameter.POSITIONAL_OR_KEYWORD if p.positional else keyword,
                    default=p.default,
                )
                for p in self.params
            ]
            + [inspect.Parameter(n, keyword, default=None) for n in ("backend", "config")]
        )
        self._positional = tuple(p.name for p in self.params if p.positional)
        self._defaults = {p.name: p.default for p in self.params} | {
            "backend": None,
            "config": None,
        }
        # Eager calls by signature (:func:`_argument_key`): what runs them.
        self._calls: dict[Hashable, Call] = {}
        # The functions that run validated eager calls (:meth:`_executor`).
        self._executors: dict[Hashable, Call] = {}

    def __repr__(self) -> str:
        return f"<asickernels op {self.name}{self.__signature__}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:  # the call's signature (see _argument_key); keywords by name, as given
            key: Hashable = (
                *map(_argument_key, args),
                *kwargs,
                *map(_argument_key, kwargs.values()),
            )
            call = self._calls.get(key)
        except (TypeError, _NoKey):  # unhashable or traced
            key = call = None
        if call is not None:
            return call(args, kwargs)
        given, statics, backend, config = self.bind(args, kwargs)
        arrays = self.prepared(given)
        plan = self.plan(arrays, statics)
        chosen = self.choose(plan, backend, arrays, config)
        if key is not None and len(self._calls) < _MAX_SIGNATURES:
            self._calls[key] = self._replay(chosen, plan, config, given, arrays, args, kwargs)
        return self.run(chosen, plan, config, arrays, want="jax")

    # Binding and validation ---------------------------------------------------------------

    def bind(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[dict[str, Array | None], dict[str, Any], str | None, object]:
        """``(arrays, statics, backend, config)`` from a call's arguments; arrays are made
        array-like (lists become numpy) but not moved or converted.

        Raises:
          TypeError: an argument is missing, unknown or given twice, or an array argument
            is not array-like (None stays None: :attr:`check` refuses it where required).
        """
        values = self._fast_bind(args, kwargs)
        if values is None:  # something unusual: let inspect say what is wrong
            try:
                bound = self.__signature__.bind(*args, **kwargs)
            except TypeError as error:
                raise TypeError(f"{self.name}(): {error}") from None
            bound.apply_defaults()
            values = bound.arguments
        arrays = {
            n: None if values[n] is None else _checks.as_array(values[n], n)
            for n in self.array_names
        }
        statics = {n: values[n] for n in self.static_names}
        return arrays, statics, values["backend"], values["config"]

    def _fast_bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """The arguments by name with defaults, for the well-formed call (a dict lookup
        per parameter rather than ``inspect.Signature.bind``); None for anything else."""
        if len(args) > len(self._positional):
            return None
        values = dict(self._defaults)
        values.update(zip(self._positional, args, strict=False))
        for name, value in kwargs.items():
            if name not in values or name in self._positional[: len(args)]:
                return None
            values[name] = value
        if any(v is REQUIRED for v in values.values()):
            return None
        return values

    def prepared(self, arrays: dict[str, Array | None]) -> dict[str, Array | None]:
        """``arrays`` after :attr:`prepare`, for eager calls (traced ones are left alone); the
        same dict when preparation changes nothing."""
        if self.prepare is None or any(isinstance(a, jax.core.Tracer) for a in arrays.values()):
            return arrays
        return self.prepare(arrays)

    def plan(self, arrays: Mapping[str, Array | Spec | None], statics: Mapping[str, Any]) -> Plan:
        """Validates shapes, dtypes and static values (see :attr:`check`); the plan runs in
        x64 mode when an input or an output is 64-bit."""
        specs = {
            n: None if a is None else Spec(tuple(a.shape), np.dtype(a.dtype))
            for n, a in arrays.items()
        }
        plan = self.check(specs, statics)
        given = [s for s in specs.values() if s is not None]
        if any(s.dtype.itemsize == 8 for s in (*given, *plan.output_list())):
            return dataclasses.replace(plan, x64=True)
        return plan

    def choose(
        self,
        plan: Plan,
        backend: str | None,
        arrays: Mapping[str, Array | None],
        config: object = None,
    ) -> str | None:
        """The backend this call runs on (None for ops without a kernel).

        Raises:
          TypeError: a backend or config is given to an op without a kernel, the backend
            cannot run this call, or it does not take this config
            (:func:`registry.check_config`).
          ValueError, BackendUnavailableError: see :func:`policy.choose`.
        """
        if plan.kernel is None:
            for name, value in (("backend", backend), ("config", config)):
                if value is not None:
                    raise TypeError(f"{self.name} takes no {name} (it is plain JAX)")
            return None
        where = policy.where_arrays_live([a for a in arrays.values() if a is not None])
        chosen = policy.select(plan.kernel, backend, where, plan.dtype)
        registry.check_config(plan.kernel, chosen, config)
        return chosen

    # Running ------------------------------------------------------------------------------

    def run(
        self,
        backend: str | None,
        plan: Plan,
        config: object,
        arrays: Mapping[str, Array | None],
        want: Want,
    ) -> Any:
        """Runs a validated call on ``backend``. ``want="jax"`` returns JAX arrays; ``"any"``
        may return numpy arrays instead (a host implementation's, for inputs on the host),
        for frontends that convert anyway. Inside a trace the outputs are traced values."""
        if any(isinstance(a, jax.core.Tracer) for a in arrays.values()):
            if plan.trivial:
                with x64_scope(plan.x64):
                    return _filled(plan, jnp)
            return self.compute(Runner(backend or "xla", False, config), plan, **arrays)
        if self.check_values is not None:
            self.check_values(**arrays)
        names = tuple(n for n, a in arrays.items() if a is not None)
        present = [a for a in arrays.values() if a is not None]  # in the order of names
        if want == "any" and not any(_on_accelerator(a) for a in present):
            return self._executor(backend, plan, config, names, "always")(*present)
        return self._executor(backend, plan, config, names, _host_use(plan, present))(*present)

    def _replay(
        self,
        backend: str | None,
        plan: Plan,
        config: object,
        given: dict[str, Array | None],
        arrays: dict[str, Array | None],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Call:
        """What runs later eager calls of this call's signature, as ``call(args, kwargs)``:
        the executor on the arrays where this call has them (for numpy or JAX arrays that
        need no value checks or preparation), else after binding, preparing and checking
        the values."""
        names = tuple(n for n, a in arrays.items() if a is not None)
        direct = (
            self.check_values is None
            and arrays is given
            and all(
                type(a) is np.ndarray or isinstance(a, jax.Array)
                for a in given.values()
                if a is not None
            )
        )
        present = [a for a in arrays.values() if a is not None]  # in the order of names
        execute = self._executor(backend, plan, config, names, _host_use(plan, present))
        if not direct:

            def rebind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
                arrays = self.prepared(self.bind(args, kwargs)[0])
                if self.check_values is not None:
                    self.check_values(**arrays)
                return execute(*[arrays[n] for n in names])

            return rebind
        slots = tuple(n if n in kwargs else self._positional.index(n) for n in names)
        if slots == tuple(range(len(args))):  # the arrays are exactly the positional args
            return lambda args, kwargs: execute(*args)
        return lambda args, kwargs: execute(
            *[kwargs[s] if isinstance(s, str) else args[s] for s in slots]
        )

    def _executor(
        self, backend: str | None, plan: Plan, config: object, names: tuple[str, ...], host: Host
    ) -> Call:
        """The function that runs validated eager calls of ``plan`` on ``backend``, taking
        the arrays named ``names`` by position: the filled outputs of a trivial plan; the
        host implementation on a numpy backend, or with ``host`` where there is one (its
        outputs stay numpy only with ``host``); else the jitted computation (op by op where
        the backend cannot be jitted here); in x64 mode for 64-bit plans."""
        key: Hashable | None = (backend, plan, config, names, host)
        try:
            executor = self._executors.get(key)
        except TypeError:  # an unhashable config
            key, executor = None, None
        if executor is not None:
            return executor
        kernel = plan.kernel
        has_host = (
            backend is not None
            and kernel is not None
            and registry.has_host_implementation(kernel, backend)
        )
        absent = dict.fromkeys(self.array_names)
        host_only = has_host and registry.backend(backend).array_kind == "numpy"  # type: ignore[arg-type]

        def on_host(*present: Array) -> Any:
            given = absent | {n: np.asarray(a) for n, a in zip(names, present, strict=True)}
            out = self.compute(Runner(backend, True, config), plan, **given)  # type: ignore[arg-type]
            return out if host == "always" else _to_jax(out)

        def computation(*present: Array) -> Any:
            return self.compute(
                Runner(backend or "xla", False, config),
                plan,
                **(absent | dict(zip(names, present, strict=True))),
            )

        if plan.trivial:
            xp = np if host == "always" else jnp
            executor = lambda *present: _filled(plan, xp)  # noqa: E731
        elif host_only or (has_host and host == "always"):
            executor = on_host
        elif not _compilable(backend):
            executor = computation
        elif has_host and host == "if_copied":
            compiled = jax.jit(computation)

            def executor(*present: np.ndarray) -> Any:  # "if_copied": numpy inputs
                return (on_host if _xla_copies(present) else compiled)(*present)

        else:
            executor = jax.jit(computation)
        if plan.x64:
            executor = _in_x64(executor)
        if key is not None and len(self._executors) < _MAX_SIGNATURES:
            self._executors[key] = executor
        return executor


# Signatures kept per op: past this many (e.g. scalar arguments of ever new values), calls
# are validated each time rather than remembered without bound.
_MAX_SIGNATURES = 4096

# Where an eager call on a JAX backend with a host twin runs: on the host twin ("always",
# returning its numpy outputs), on it when XLA would copy enough of its numpy inputs
# ("if_copied", see _xla_copies), or compiled ("never").
Host = Literal["always", "if_copied", "never"]
_HOST_COPY_BYTES = 1 << 18
_XLA_ALIGNMENT = 64  # XLA's CPU client takes host buffers aligned to this without a copy


def _host_use(plan: Plan, present: Sequence[Array]) -> Host:
    """ "if_copied" for a copy-bound plan's numpy inputs large enough that XLA's copy of
    them may cost as much as the kernel, else "never"."""
    numpy = plan.copy_bound and all(type(a) is np.ndarray for a in present)
    return "if_copied" if numpy and sum(a.nbytes for a in present) >= _HOST_COPY_BYTES else "never"


def _xla_copies(present: Sequence[np.ndarray]) -> bool:
    """Whether XLA's CPU client would copy at least :data:`_HOST_COPY_BYTES` of these numpy
    arrays: those not C-contiguous and aligned to :data:`_XLA_ALIGNMENT`."""
    copied = 0
    for a in present:
        aligned = a.__array_interface__["data"][0] % _XLA_ALIGNMENT == 0
        copied += 0 if aligned and a.flags.c_contiguous else a.nbytes
    return copied >= _HOST_COPY_BYTES


class _NoKey(Exception):
    """An argument that gives its call no signature: a traced value."""


def _argument_key(value: object) -> Hashable:
    """What identifies an argument in an eager call's signature, for :attr:`Op._calls`: a
    numpy array's shape and dtype, a JAX array's also its sharding (where it lives decides
    the backend), anything else's type and value (True, 1 and 1.0 are different static
    values); :class:`_NoKey` for a traced value."""
    if type(value) is np.ndarray:
        return (value.shape, value.dtype)
    kind = type(value)
    if kind in _STATIC_TYPES:
        return (kind, value)
    if isinstance(value, jax.core.Tracer):
        raise _NoKey
    if isinstance(value, jax.Array):
        return (value.shape, value.dtype, value.sharding)
    return (kind, value)


_STATIC_TYPES = frozenset({int, float, str, bool, type(None)})


def _compilable(backend: str | None) -> bool:
    """Whether eager calls on ``backend`` may be jitted (see ``Backend.traceable``)."""
    traceable = None if backend is None else registry.backend(backend).traceable
    return traceable is None or traceable()


def _to_jax(out: Any) -> Any:
    """A host implementation's numpy outputs as JAX arrays on JAX's default device, where
    ``jax.device_put`` would put them: on the CPU device an aligned array (``host_empty``)
    is taken without a copy. ``jax.make_array_from_callback`` rather than ``device_put``,
    which binds a primitive first: the hand-over takes about half as long after a kernel
    has swept the caches (benchmarks/results/eager_overhead/s2_handoff_1.json)."""
    sharding = jax.sharding.SingleDeviceSharding(policy.default_device())

    def place(array: np.ndarray) -> jax.Array:
        array = np.asarray(array)
        return jax.make_array_from_callback(array.shape, sharding, lambda _: array)

    return jax.tree.map(place, out)


def _on_accelerator(value: object) -> bool:
    """Whether ``value`` is a JAX array on a device other than the host CPU."""
    return isinstance(value, jax.Array) and any(d.platform != "cpu" for d in value.devices())


def _filled(plan: Plan, xp: Any) -> Any:
    """The outputs of a trivial plan, each filled with its entry of ``plan.fill``."""
    specs = plan.output_list()
    fills = plan.fill + (0,) * (len(specs) - len(plan.fill))
    outs = tuple(xp.full(s.shape, f, s.dtype) for s, f in zip(specs, fills, strict=True))
    return outs[0] if isinstance(plan.outputs, Spec) else outs


def _in_x64(function: Call) -> Call:
    def call(*args: Array) -> Any:
        with x64_scope(True):
            return function(*args)

    return call


def x64_scope(enabled: bool) -> contextlib.AbstractContextManager[object]:
    """JAX's x64 mode for one call (a no-op context when not ``enabled``)."""
    if not enabled:
        return contextlib.nullcontext()
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64  # type: ignore[attr-defined]  # jax < 0.8

    return enable_x64()


def host_empty(shape: tuple[int, ...], dtype: npt.DTypeLike) -> np.ndarray:
    """An uninitialised numpy array for a host kernel's output: from 256 KiB on, aligned
    to :data:`_XLA_ALIGNMENT`, so that JAX takes it without a copy (:func:`_to_jax`)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < _HOST_COPY_BYTES:
        return np.empty(shape, dtype)
    raw = np.empty(nbytes + _XLA_ALIGNMENT, np.uint8)
    offset = (-raw.ctypes.data) % _XLA_ALIGNMENT
    return raw[offset : offset + nbytes].view(dtype).reshape(shape)


def cast(array: Any, dtype: npt.DTypeLike) -> Any:
    """``array`` as ``dtype``, without a copy when it already is."""
    return array if array.dtype == np.dtype(dtype) else array.astype(dtype)
