"""Op declarations: each public op is declared once, and everything else derives from it.

An :class:`Op` holds an op's parameters (arrays and static values, with their defaults and
PyTorch schema types), its validation (:attr:`Op.check`: shapes, dtypes and static values
only, so it runs once per signature, outside any trace), its output shapes and dtypes (the
:class:`Plan` that validation returns), its computation over backend kernels
(:attr:`Op.compute`, written once against ``xp`` = numpy or ``jax.numpy``), its float64
reference and, for differentiable ops, its vector-Jacobian product. The JAX API is the
:class:`Op` object itself; the ``torch.library`` operators (with fake implementations and
autograd), the torch_xla kernels and the SPMD wrappers are generated from it
(:mod:`asickernels.torch.ops`, :mod:`asickernels.backends.xla_spmd`).

A call runs in one of these ways:

* inside a trace (``jit``/``vmap``/``grad``): the computation is traced inline;
* eagerly, through a compiled function cached per (backend, plan, config), where the plan
  encodes the static arguments, shapes and dtypes;
* eagerly on host arrays, on the backend's host implementation (numpy in and out, no XLA
  dispatch): for numpy backends, for callers that take numpy results (the torch frontend),
  and for numpy inputs XLA would copy (:func:`_runs_on_host`);
* eagerly on numpy inputs, as the backend's ``numpy_route`` where it has one: the ``cpu``
  backend's reads the arrays in place (:mod:`asickernels.backends.cpu.in_place`).

An eager call's signature (array shapes, dtypes and kinds, static values) is validated once;
later calls of it replay its route (:meth:`Op._route`). Calls with numpy arrays by position
find theirs in the op's C base (:mod:`asickernels.kernels.eager_front`), with no Python run.

64-bit inputs (float64 boxes, int64 category ids) are kept 64-bit: their calls run with
JAX's x64 mode switched on for that call only (:func:`x64_scope`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from asickernels.kernels import _checks, policy, registry
from asickernels.kernels.eager_front import Front

try:  # the primitive under jax.device_put, without its 40 µs of Python per array
    from jax._src import core as _jax_core
    from jax._src.lib import xla_client as _xla_client
except ImportError:  # JAX's internals moved: the public path
    _jax_core = _xla_client = None  # type: ignore[assignment]

REQUIRED: Any = inspect.Parameter.empty


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
    default: Any = REQUIRED
    positional: bool = False
    core_ndim: int = 0


def array(name: str, core_ndim: int = 0, *, optional: bool = False) -> Param:
    """An array parameter; optional ones default to None and are keyword-only."""
    if optional:
        return Param(name, "array", "Tensor?", None, False, core_ndim)
    return Param(name, "array", "Tensor", REQUIRED, True, core_ndim)


def static(
    name: str, torch_type: str, default: Any = REQUIRED, *, positional: bool = False
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
      x64: some input or output is 64-bit, so the call runs in JAX's x64 mode.
    """

    kernel: str | None
    dtype: str | None
    outputs: Spec | tuple[Spec, ...]
    statics: tuple[tuple[str, Any], ...]
    trivial: bool = False
    fill: tuple[int, ...] = (0,)
    x64: bool = False

    def __post_init__(self) -> None:
        # Plans key the compiled-function cache on every eager call: hash them once. Plans of
        # symbolic shapes (torch.compile's dynamic shapes) are not hashable.
        try:
            value: int | None = hash(dataclasses.astuple(self))
        except TypeError:
            value = None
        object.__setattr__(self, "_hash", value)

    def __hash__(self) -> int:
        if self._hash is None:  # type: ignore[attr-defined]
            raise TypeError("a plan of symbolic shapes is not hashable")
        return self._hash  # type: ignore[attr-defined,no-any-return]

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
    config: Any

    @property
    def xp(self) -> Any:
        return np if self.host else jnp

    def kernel(self, name: str) -> Callable[..., Any]:
        function = registry.implementation(name, self.backend, host=self.host)
        if self.config is None:  # every kernel's config defaults to None
            return function
        return functools.partial(function, config=self.config)


Check = Callable[[Mapping[str, Spec | None], Mapping[str, Any]], Plan]
Compute = Callable[..., Any]


class Op(Front):
    """A public op, declared once. Calling it runs it (see the module docstring).

    Args:
      name: the public name (``asickernels.<name>``, ``torch.ops.asickernels.<name>``).
      params: the parameters in signature order (``backend`` and ``config`` are added).
      check: ``(array specs, static values) -> Plan``; raises TypeError/ValueError.
      compute: ``(runner, plan, **arrays) -> outputs``, written with ``runner.xp``.
      reference: the float64 definition, called with the public arguments (no backend).
      doc: the docstring.
      vjp: for differentiable ops, ``(arrays, statics, backend, cotangent) -> gradients``
        of the array parameters named in ``differentiable``, written with public ops.
      differentiable: the array parameters ``vjp`` returns gradients for.
      partition: how the SPMD wrappers split the op (``"batch"``: every array along its
        leading batch dims; other rules are named by the op and live in the SPMD modules).
      check_values: optional checks of concrete input values, run on eager calls only.
      outputs: the names of the outputs (one name: the op returns an array, not a tuple).
      prepare: optional host-side preparation of concrete inputs on eager calls, before
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
        parameters = []
        for p in self.params:
            kind = (
                inspect.Parameter.POSITIONAL_OR_KEYWORD
                if p.positional
                else inspect.Parameter.KEYWORD_ONLY
            )
            parameters.append(inspect.Parameter(p.name, kind, default=p.default))
        parameters += [
            inspect.Parameter("backend", inspect.Parameter.KEYWORD_ONLY, default=None),
            inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=None),
        ]
        self.__signature__ = inspect.Signature(parameters)
        self._positional = tuple(p.name for p in self.params if p.positional)
        self._defaults = {p.name: p.default for p in self.params} | {
            "backend": None,
            "config": None,
        }
        self._array_set = frozenset(self.array_names)
        self._plans: dict[Any, Plan] = {}
        self._compiled: dict[Any, Callable[..., Any]] = {}
        self._routes: dict[Any, Callable[..., Any]] = {}
        self._numpy_routes: dict[Any, Callable[..., Any]] = {}

    def __repr__(self) -> str:
        return f"<asickernels op {self.name}{self.__signature__}>"

    # Binding and validation ---------------------------------------------------------------

    def bind(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any], str | None, Any]:
        """``(arrays, statics, backend, config)`` from a call's arguments; arrays are made
        array-like (lists become numpy) but not moved or converted."""
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

    def prepared(self, arrays: dict[str, Any]) -> dict[str, Any]:
        """``arrays`` after :attr:`prepare`, for eager calls (traced ones are left alone); the
        same dict when preparation changes nothing (``prepare`` looks at dtypes, not values,
        so that holds for every call of the same signature)."""
        if self.prepare is None or any(isinstance(a, jax.core.Tracer) for a in arrays.values()):
            return arrays
        return self.prepare(arrays)

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

    def plan(self, arrays: Mapping[str, Any], statics: Mapping[str, Any]) -> Plan:
        """Validates shapes, dtypes and static values (cached per signature)."""
        try:
            key: Any = (
                tuple(None if a is None else (tuple(a.shape), a.dtype) for a in arrays.values()),
                tuple(arrays),
                tuple((name, type(value), value) for name, value in statics.items()),
            )
            plan = self._plans.get(key)
        except TypeError:  # unhashable static values: validate every time
            key, plan = None, None
        if plan is None:
            specs = {
                n: None if a is None else Spec(tuple(a.shape), np.dtype(a.dtype))
                for n, a in arrays.items()
            }
            plan = self.check(specs, statics)
            if key is not None:
                self._plans[key] = plan
        return plan

    def choose(self, plan: Plan, backend: str | None, arrays: Mapping[str, Any]) -> str | None:
        """The backend this call runs on (None for ops without a kernel)."""
        if plan.kernel is None:
            if backend is not None:
                raise TypeError(f"{self.name} takes no backend (it is plain JAX)")
            return None
        where = policy.where_arrays_live([a for a in arrays.values() if a is not None])
        return policy.select(plan.kernel, backend, where, plan.dtype)

    # Running ------------------------------------------------------------------------------

    def _miss(self, numpy_key: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A call whose numpy key (None if it has none) names no route yet: the
        :class:`~asickernels.kernels.eager_front.Front` looked it up first."""
        key = self._route_key(args, kwargs)
        route = self._routes.get(key) if key is not None else None
        if route is not None:  # the same signature as an earlier call: replay its path
            if None not in key and self._array_set.isdisjoint(kwargs):  # arrays by position
                return route(*args)
            return route(*(a for a in args if a is not None), *self._keyword_arrays(kwargs))
        given, statics, backend, config = self.bind(args, kwargs)
        arrays = self.prepared(given)
        plan = self.plan(arrays, statics)
        chosen = self.choose(plan, backend, arrays)
        # A route replays the call on the arrays as given: only if preparation left them be.
        if key is None or arrays is not given or not self._may_route(plan, chosen):
            return self.run(chosen, plan, config, arrays, want="jax")
        route = self._route(chosen, plan, config, arrays)
        numpy_only = all(type(a) is np.ndarray for a in args)
        if numpy_key is not None and numpy_only and self._array_set.isdisjoint(kwargs):
            self._numpy_routes[numpy_key] = route
        else:
            self._routes[key] = route
        # The first call takes the route too: what :meth:`run` would do, or the backend's
        # numpy route, whose compilation then serves every call (not a second one).
        return route(*(a for a in arrays.values() if a is not None))

    def _keyword_arrays(self, kwargs: dict[str, Any]) -> list[Any]:
        return [kwargs[n] for n in self.array_names if kwargs.get(n) is not None]

    def _route_key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A key for calls that may skip binding, validation and selection: arrays given as
        numpy or concrete JAX arrays (positional ones by position, as :func:`_array_key`
        says; None where absent), the others by name, hashable static values; None for
        anything else. It is computed on every eager call: kept to a few tuple builds."""
        key = tuple(map(_array_key, args))
        if _NO_KEY in key:
            return None
        # Static values with their types: True == 1 and 2.0 == 2 must not share a route
        # (validation refuses a bool or a float where an int is wanted).
        if kwargs and self._array_set.isdisjoint(kwargs):  # statics only: no array keys
            # In the order given: another order is another key for the same route.
            key += (*kwargs.items(), *map(type, kwargs.values()))
        elif kwargs:
            parts: list[tuple[Any, ...]] = []
            for name, value in sorted(kwargs.items()):
                if name not in self._array_set:
                    parts.append((name, type(value), value))
                    continue
                array_key = _array_key(value)
                if array_key is _NO_KEY:
                    return None
                parts.append((name, array_key))
            key += tuple(parts)
        try:
            hash(key)
        except TypeError:
            return None
        return key

    def _may_route(self, plan: Plan, chosen: str | None) -> bool:
        """Whether every call of the signature just run takes the same path (no value
        checks, no x64 switch, nothing to run), so that it can be replayed."""
        if plan.trivial or plan.x64 or not _compilable(chosen):
            return False
        return self.check_values is None  # it must see every call's values

    def _route(
        self, backend: str | None, plan: Plan, config: Any, arrays: Mapping[str, Any]
    ) -> Callable[..., Any]:
        """What runs eager calls of this signature (the first included), taking the present
        arrays by position: for numpy arrays, the backend's ``numpy_route`` where it gives
        one (the ``cpu`` backend's in-place call); else :meth:`run`'s choice between the
        host implementation and the compiled computation (see :func:`_runs_on_host`), made
        once where the signature decides it and per call where the numpy inputs' alignment
        does."""
        present = [a for a in arrays.values() if a is not None]
        numpy_only = all(type(a) is np.ndarray for a in present)
        spec = None if backend is None else registry.backend(backend)
        if spec is not None and spec.numpy_route is not None and numpy_only:
            compiled = self._compiled_for(backend, plan, config, arrays)
            route = spec.numpy_route(compiled, present)
            if route is not None:
                return route
        kernel = plan.kernel
        if (
            backend is None
            or kernel is None
            or not registry.has_host_implementation(kernel, backend)
        ):
            return self._compiled_for(backend, plan, config, arrays)
        if registry.backend(backend).array_kind == "numpy":
            return self._host_call(backend, plan, config, arrays, "jax")
        compiled = self._compiled_for(backend, plan, config, arrays)
        if numpy_only and _may_copy(present):
            host = self._host_call(backend, plan, config, arrays, "jax")
            return lambda *given: (host if _xla_copies(given) else compiled)(*given)
        return compiled  # JAX arrays: the compiled call takes them as they are

    def run(
        self,
        backend: str | None,
        plan: Plan,
        config: Any,
        arrays: Mapping[str, Any],
        want: Literal["jax", "any"],
    ) -> Any:
        """Runs a validated call on ``backend``. ``want="jax"`` returns JAX arrays; ``"any"``
        returns what the path produced (numpy from a host implementation, JAX arrays from a
        compiled one), for frontends that convert anyway (inside a trace the outputs are
        always traced JAX values)."""
        traced = any(isinstance(a, jax.core.Tracer) for a in arrays.values())
        if self.check_values is not None and not traced:
            self.check_values(**arrays)
        if plan.trivial:
            xp = np if want == "any" and not traced else jnp
            specs = plan.output_list()
            fills = plan.fill + (0,) * (len(specs) - len(plan.fill))
            with x64_scope(plan.x64):
                outs = tuple(
                    xp.full(s.shape, f, s.dtype) for s, f in zip(specs, fills, strict=True)
                )
            return _as_single(plan, outs)
        if traced:
            return self.compute(Runner(backend or "xla", False, config), plan, **arrays)
        if not _compilable(backend):  # op by op, as a compiled call would, x64 included
            with x64_scope(plan.x64):
                return self.compute(Runner(backend or "xla", False, config), plan, **arrays)
        present = [a for a in arrays.values() if a is not None]
        if backend is not None and _runs_on_host(plan.kernel, backend, arrays, want):
            with x64_scope(plan.x64):
                return self._host_call(backend, plan, config, arrays, want)(*present)
        compiled = self._compiled_for(backend, plan, config, arrays)
        if not plan.x64:
            return compiled(*present)
        with x64_scope(True):
            return compiled(*present)

    def _host_call(
        self, backend: str, plan: Plan, config: Any, arrays: Mapping[str, Any], want: str
    ) -> Callable[..., Any]:
        """The call on ``backend``'s host implementation, taking the present arrays by
        position as numpy arrays (JAX CPU arrays are viewed without a copy); its results are
        handed to JAX unless ``want="any"``."""
        runner = Runner(backend, True, config)
        names = tuple(n for n, a in arrays.items() if a is not None)
        absent = dict.fromkeys(self.array_names)
        single = isinstance(plan.outputs, Spec)

        def call(*present: Any) -> Any:
            given = absent | {n: np.asarray(a) for n, a in zip(names, present, strict=True)}
            out = self.compute(runner, plan, **given)
            if want == "any":
                return out
            if single:
                return to_jax(out, plan.x64)
            return tuple(to_jax(o, plan.x64) for o in out)

        return call

    def _compiled_for(
        self, backend: str | None, plan: Plan, config: Any, arrays: Mapping[str, Any]
    ) -> Callable[..., Any]:
        """The jitted computation for this plan, taking the present arrays by position (the
        plan fixes which are present; jit's fast path takes no keyword arguments)."""
        names = tuple(n for n, a in arrays.items() if a is not None)
        key: Any = (backend, plan, config, names)
        try:
            hash(key)
        except TypeError:
            key = None
        compiled = self._compiled.get(key) if key is not None else None
        if compiled is None:
            runner = Runner(backend or "xla", False, config)
            absent = {n: None for n in self.array_names}

            def body(*present: Any) -> Any:
                given = absent | dict(zip(names, present, strict=True))
                return self.compute(runner, plan, **given)

            compiled = jax.jit(body)
            if key is not None:
                self._compiled[key] = compiled
        return compiled


_NO_KEY = object()


def _compilable(backend: str | None) -> bool:
    """Whether eager calls on ``backend`` may be compiled (see ``Backend.traceable``)."""
    traceable = None if backend is None else registry.backend(backend).traceable
    return traceable is None or traceable()


def _array_key(value: Any) -> Any:
    """What identifies an array argument for the route cache: numpy arrays by shape and
    dtype, JAX arrays also by their sharding (where they live); anything else (tracers,
    lists, scalars) has no key."""
    kind = type(value)
    if kind is np.ndarray:
        return (value.shape, value.dtype)
    if value is None:
        return None
    if isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer):
        return (value.shape, value.dtype, value.sharding)
    return _NO_KEY


def _as_single(plan: Plan, outs: tuple[Any, ...]) -> Any:
    return outs if not isinstance(plan.outputs, Spec) else outs[0]


# Above this many bytes of numpy input that XLA would copy, an eager call goes to the host
# twin, which reads them in place; below, the compiled call is cheaper than the host path's
# Python and the hand-over of its outputs to JAX (measured on giou, nms and int8_matmul).
_HOST_COPY_BYTES = 1 << 18


def _runs_on_host(kernel: str | None, backend: str, arrays: Mapping[str, Any], want: str) -> bool:
    """Whether an eager call goes to the backend's host implementation: always for numpy
    backends; for JAX backends with a host twin, when the inputs are on the host already
    (numpy, or JAX CPU arrays, which numpy views without a copy) and either the caller takes
    host results (``want="any"``) or XLA would copy enough of them (:func:`_xla_copies`)."""
    if kernel is None or not registry.has_host_implementation(kernel, backend):
        return False
    if registry.backend(backend).array_kind == "numpy":
        return True
    present = [a for a in arrays.values() if a is not None]
    if want == "any":
        return not any(
            isinstance(a, jax.Array) and any(d.platform != "cpu" for d in a.devices())
            for a in present
        )
    return all(type(a) is np.ndarray for a in present) and _xla_copies(present)


def _may_copy(present: Sequence[np.ndarray]) -> bool:
    """Whether these numpy arrays are large enough for :func:`_xla_copies` to hold (a test
    on shapes alone, so a route decides it once)."""
    return sum(a.nbytes for a in present) >= _HOST_COPY_BYTES


def _xla_copies(present: Sequence[np.ndarray]) -> bool:
    """Whether XLA's CPU client would copy at least :data:`_HOST_COPY_BYTES` of these numpy
    arrays: those not C-contiguous and aligned to :data:`_ALIGNMENT`."""
    if not _may_copy(present):
        return False
    copied = 0
    for a in present:  # the data pointer costs microseconds to read
        aligned = a.__array_interface__["data"][0] % _ALIGNMENT == 0
        copied += 0 if aligned and a.flags.c_contiguous else a.nbytes
    return copied >= _HOST_COPY_BYTES


def x64_scope(enabled: bool) -> Any:
    """JAX's x64 mode for one call (a no-op context when not ``enabled``)."""
    if not enabled:
        return contextlib.nullcontext()
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64  # type: ignore[attr-defined]  # jax < 0.8

    return enable_x64()


_ALIGNMENT = 64  # XLA's CPU client wraps host buffers aligned to this without a copy
# Below this many bytes an output is not aligned: copying it costs less than aligning it.
_ALIGN_FROM_BYTES = 1 << 18


def to_jax(value: Any, x64: bool = False) -> jax.Array:
    """A host result as a JAX array on the default device, keeping 64-bit dtypes (``x64``);
    a C-contiguous, 64-byte aligned numpy array becomes a JAX CPU array without a copy."""
    if isinstance(value, jax.Array):
        return value
    value = np.asarray(value)
    if value.dtype.itemsize == 8 and not x64:  # JAX canonicalizes it: its public path
        return jax.device_put(value)
    if not x64:
        return _device_put(value)
    with x64_scope(True):
        return _device_put(value)


def _device_put(value: np.ndarray) -> jax.Array:
    """``jax.device_put(value)``, through the batched primitive it is built on: the public
    wrapper spends about 40 µs of Python per array, more than many of our kernels."""
    device = policy.default_device()
    if _xla_client is None:
        return jax.device_put(value, device)
    aval, sharding, devices = _placement(device, value.shape, value.dtype)
    try:
        return _xla_client.batched_device_put(aval, sharding, [value], devices, False)  # type: ignore[no-any-return]
    except TypeError:  # its signature changed: the public path
        return jax.device_put(value, device)


@functools.lru_cache(maxsize=512)
def _placement(device: Any, shape: tuple[int, ...], dtype: np.dtype) -> tuple[Any, Any, list[Any]]:
    """The abstract value, sharding and device list of a host array put on ``device``."""
    sharding = jax.sharding.SingleDeviceSharding(device)
    return _jax_core.ShapedArray(shape, dtype), sharding, [device]


def host_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised numpy array aligned for a copy-free hand-over to JAX (see
    :func:`to_jax`); host kernels allocate their outputs with it."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < _ALIGN_FROM_BYTES:
        return np.empty(shape, dtype)
    raw = np.empty(nbytes + _ALIGNMENT, np.uint8)
    offset = (-raw.ctypes.data) % _ALIGNMENT
    return raw[offset : offset + nbytes].view(dtype).reshape(shape)


def host_allocator(shape: tuple[int, ...], dtype: Any) -> Callable[[], np.ndarray]:
    """:func:`host_empty` of one shape and dtype as a function of nothing, for calls bound
    to a signature: numpy's own allocation where :func:`host_empty` would not align."""
    dtype = np.dtype(dtype)
    if math.prod(shape) * dtype.itemsize < _ALIGN_FROM_BYTES:
        return functools.partial(np.empty, shape, dtype)
    return functools.partial(host_empty, shape, dtype)


def cast(array: Any, dtype: Any) -> Any:
    """``array`` as ``dtype``, without a copy when it already is (numpy's ``astype``
    copies by default, which on a host path costs as much as the kernel)."""
    return array if array.dtype == np.dtype(dtype) else array.astype(dtype)


def float_compute_dtype(*specs: Spec | None) -> str:
    """The compute dtype of float inputs: float64 if any is float64, else float32."""
    return "float64" if any(s is not None and s.dtype == np.float64 for s in specs) else "float32"


def is_64bit(*specs: Spec | None) -> bool:
    return any(s is not None and s.dtype.itemsize == 8 for s in specs)
