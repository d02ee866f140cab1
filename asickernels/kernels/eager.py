"""The eager dispatcher: how a call of an op runs (:class:`Eager`, one per op).

* Inside a trace (``jit``/``vmap``/``grad``), the op's computation is traced inline.
* Eagerly, the call's signature (each array's shape, dtype and placement; each other
  argument's type and value) is bound, validated and given a backend once; every call of
  that signature then runs the same ``jax.jit``-compiled computation, or the backend's host
  implementation (numpy in, numpy out) on a numpy backend (``array_kind="numpy"``) and,
  on a JAX backend that has one, for numpy inputs of which XLA would copy 256 KiB or more
  (those not 64-byte aligned).
* With 64-bit inputs (float64 boxes, int64 scales), JAX's x64 mode is on for that call only
  (:func:`x64_scope`).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

from asickernels.jax_compat import single_device_sharding
from asickernels.kernels import policy, registry

if TYPE_CHECKING:
    from asickernels.kernels.declaration import Array, Op, Plan

Call = Callable[..., Any]


class Eager:
    """Runs the calls of ``op``: remembers, per call signature, what runs it."""

    def __init__(self, op: Op) -> None:
        self.op = op
        # Eager calls by signature (:func:`_argument_key`): what runs them.
        self._calls: dict[Hashable, Call] = {}
        # The functions that run validated eager calls (:meth:`executor`).
        self._executors: dict[Hashable, Call] = {}

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Runs ``op(*args, **kwargs)`` eagerly or inline in a trace (see the module docstring)."""
        op = self.op
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
        given, statics, backend, config = op.bind(args, kwargs)
        arrays = op.prepared(given)
        plan = op.plan(arrays, **statics)
        chosen = op.choose(plan, backend, arrays, config)
        if key is not None and len(self._calls) < _MAX_SIGNATURES:
            self._calls[key] = self._replay(chosen, plan, config, given, arrays, args, kwargs)
        return self.run(chosen, plan, config, arrays)

    def run(
        self, backend: str | None, plan: Plan, config: object, arrays: Mapping[str, Array | None]
    ) -> Any:
        """Runs a validated call on ``backend`` and returns JAX arrays (traced values inside
        a trace)."""
        if any(isinstance(a, jax.core.Tracer) for a in arrays.values()):
            if plan.trivial:
                with x64_scope(plan.x64):
                    return plan.trivial_outputs(jnp)
            runner = registry.Runner(self.op, backend or "xla", False, config)
            return self.op.compute(runner, plan, **arrays, **plan.statics)
        if self.op.check_values is not None:
            self.op.check_values(**arrays)
        names = tuple(n for n, a in arrays.items() if a is not None)
        present = [a for a in arrays.values() if a is not None]  # in the order of names
        return self.executor(backend, plan, config, names, _host_use(plan, present))(*present)

    def _on_host(self, backend: str | None, plan: Plan, config: object) -> Call | None:
        """The op's computation of ``plan`` on ``backend``'s host implementation, a function
        of the arrays by name (numpy in, numpy out); None where there is none, or for a
        trivial plan (nothing to compute)."""
        key: Hashable | None = (backend, plan, config, "host")
        try:
            on_host = self._executors.get(key)
        except TypeError:  # an unhashable config
            key, on_host = None, None
        if on_host is not None or plan.trivial or backend is None or self.op.kernel is None:
            return on_host
        if not registry.has_host_implementation(self.op.kernel, backend):
            return None
        runner = registry.Runner(self.op, backend, True, config)
        on_host = functools.partial(self.op.compute, runner, plan, **plan.statics)
        if key is not None and len(self._executors) < _MAX_SIGNATURES:
            self._executors[key] = on_host
        return on_host

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
            self.op.check_values is None
            and arrays is given
            and all(
                type(a) is np.ndarray or isinstance(a, jax.Array)
                for a in given.values()
                if a is not None
            )
        )
        present = [a for a in arrays.values() if a is not None]  # in the order of names
        execute = self.executor(backend, plan, config, names, _host_use(plan, present))
        if not direct:

            def rebind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
                arrays = self.op.prepared(self.op.bind(args, kwargs)[0])
                if self.op.check_values is not None:
                    self.op.check_values(**arrays)
                return execute(*[arrays[n] for n in names])

            return rebind
        slots = tuple(n if n in kwargs else self.op.positional.index(n) for n in names)
        if slots == tuple(range(len(args))):  # the arrays are exactly the positional args
            return lambda args, kwargs: execute(*args)
        return lambda args, kwargs: execute(
            *[kwargs[s] if isinstance(s, str) else args[s] for s in slots]
        )

    def executor(
        self, backend: str | None, plan: Plan, config: object, names: tuple[str, ...], host: Host
    ) -> Call:
        """The function that runs validated eager calls of ``plan`` on ``backend``, taking
        the arrays named ``names`` by position: the filled outputs of a trivial plan; the
        host implementation on a numpy backend, or with ``host`` where there is one (its
        outputs stay numpy only with ``host="always"``, for frontends that convert anyway,
        as the torch operators' CPU kernel); else the jitted computation (op by op where the
        backend cannot be jitted here); in x64 mode for 64-bit plans (but numpy in and out)."""
        key: Hashable | None = (backend, plan, config, names, host)
        try:
            executor = self._executors.get(key)
        except TypeError:  # an unhashable config
            key, executor = None, None
        if executor is not None:
            return executor
        op = self.op
        compute_on_host = self._on_host(backend, plan, config)
        has_host = compute_on_host is not None
        absent = dict.fromkeys(self.op.array_names)
        host_only = has_host and registry.backend(backend).array_kind == "numpy"  # type: ignore[arg-type]

        def on_host(*present: Array) -> Any:
            assert compute_on_host is not None
            given = absent | {n: np.asarray(a) for n, a in zip(names, present, strict=True)}
            out = compute_on_host(**given)
            return out if host == "always" else _to_jax(out)

        def computation(*present: Array) -> Any:
            return op.compute(
                registry.Runner(op, backend or "xla", False, config),
                plan,
                **(absent | dict(zip(names, present, strict=True))),
                **plan.statics,
            )

        if plan.trivial:
            xp = np if host == "always" else jnp
            executor = lambda *present: plan.trivial_outputs(xp)  # noqa: E731
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
        if plan.x64 and not (executor is on_host and host == "always"):
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
    sharding = single_device_sharding(policy.default_device())

    def place(array: np.ndarray) -> jax.Array:
        array = np.asarray(array)
        return jax.make_array_from_callback(array.shape, sharding, lambda _: array)

    return jax.tree.map(place, out)


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
