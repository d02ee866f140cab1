"""Op declarations: each public op is declared once, and everything else derives from it.

An :class:`Op` holds an op's parameters (arrays and static values, with their defaults and
PyTorch schema types), its validation (:attr:`Op.check`: from shapes, dtypes and static
values to a :class:`Plan`, raising TypeError/ValueError that names the bad argument), its
computation over backend kernels (:attr:`Op.compute`, written once against ``xp`` = numpy
or ``jax.numpy``), its float64 reference and, for differentiable ops, its vector-Jacobian
product. The JAX API is the :class:`Op` object itself (a call runs through its
:class:`~asickernels.kernels.eager.Eager` dispatcher); the ``torch.library`` operators and
the torch_xla kernels are generated from it at import; the torch functions and the SPMD
wrappers are generated from it into checked-in modules (:mod:`asickernels.frontends.generate`)
and delegate to it.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Literal, NamedTuple, TypeAlias

import jax
import numpy as np
import numpy.typing as npt

from asickernels.kernels import _checks, policy, registry
from asickernels.kernels.eager import Eager

REQUIRED: Any = inspect.Parameter.empty  # typed Any: it stands in for any default
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
      name: its name in every frontend, and in every kernel that takes it.
      kind: ``"array"`` (traced; a tensor in PyTorch) or ``"static"`` (a Python value).
      torch_type: its type in the ``torch.library`` schema (``"Tensor"``, ``"Tensor?"``,
        ``"float"``, ``"float?"``, ``"int"``, ``"int?"``, ``"int[]"``, ``"bool"``, ``"str"``,
        ``"ScalarType?"``).
      default: REQUIRED, or the default value.
      positional: may be passed by position (else keyword-only).
      core_ndim: for arrays, how many trailing dims are not batch dims (SPMD wrappers
        partition the leading ones).
      bad: for statics, values the op's check refuses with an error naming the parameter
        (the validation tests give each, on valid arguments otherwise).
    """

    name: str
    kind: Literal["array", "static"]
    torch_type: str
    default: object = REQUIRED
    positional: bool = False
    core_ndim: int = 0
    bad: tuple[object, ...] = dataclasses.field(default=(), compare=False)


def array(name: str, core_ndim: int = 0, *, optional: bool = False) -> Param:
    """An array parameter; optional ones default to None and are keyword-only."""
    if optional:
        return Param(name, "array", "Tensor?", None, False, core_ndim)
    return Param(name, "array", "Tensor", REQUIRED, True, core_ndim)


def static(
    name: str,
    torch_type: str,
    default: object = REQUIRED,
    *,
    positional: bool = False,
    bad: tuple[object, ...],
) -> Param:
    """A static parameter (a Python value, part of a call's signature); ``bad`` values its
    check refuses (see :class:`Param`)."""
    return Param(name, "static", torch_type, default, positional, bad=bad)


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """``|got - want| <= atol + rtol * |want|`` elementwise; ``(0, 0)`` means exact."""

    rtol: float
    atol: float


EXACT = Tolerance(0.0, 0.0)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What validation decided, from shapes, dtypes and static values alone.

    Attributes:
      dtype: the compute dtype the backend must support (``"float32"``, ``"float64"``), or
        None for integer kernels.
      outputs: the output shapes and dtypes (one :class:`Spec`, or a tuple for tuple outputs).
      statics: the static arguments after validation (normalized, hashable), by name: what
        :attr:`Op.compute` is called with as keyword arguments.
      trivial: the outputs are known without running anything (empty inputs): each is
        filled with its entry of ``fill`` (:meth:`trivial_outputs`).
      fill: per output, the value of a trivial output (e.g. -1 for NMS index padding).
      x64: some input or output is 64-bit, so the call runs in JAX's x64 mode (set by
        :meth:`Op.plan` from the specs: a check leaves it False).
      copy_bound: the kernel reads each input element about once, so that XLA's copy of
        numpy inputs that are not 64-byte aligned costs as much as the kernel: eager calls
        with 256 KiB or more of such inputs run on the backend's host twin where it has one.
    """

    dtype: str | None
    outputs: Spec | tuple[Spec, ...]
    statics: Mapping[str, Hashable] = dataclasses.field(default_factory=dict)
    trivial: bool = False
    fill: tuple[int, ...] = (0,)
    x64: bool = False
    copy_bound: bool = False

    def __hash__(self) -> int:  # plans key the compiled calls
        statics = tuple(self.statics.items())
        return hash((self.dtype, self.outputs, statics, self.trivial, self.fill, self.x64))

    def output_list(self) -> tuple[Spec, ...]:
        return (self.outputs,) if isinstance(self.outputs, Spec) else self.outputs

    def trivial_outputs(self, xp: Any) -> Any:
        """The outputs of a trivial plan, each filled with its entry of :attr:`fill`, as
        ``xp`` (numpy or jax.numpy) arrays."""
        specs = self.output_list()
        fills = self.fill + (0,) * (len(specs) - len(self.fill))
        outs = tuple(xp.full(s.shape, f, s.dtype) for s, f in zip(specs, fills, strict=True))
        return outs[0] if isinstance(self.outputs, Spec) else outs


# Validation: ``check(**array specs, **static values) -> Plan`` (the op's parameters by
# name, each array as its Spec or None).
Check = Callable[..., Plan]
# ``compute(runner, plan, **arrays, **plan.statics) -> outputs`` (a :class:`registry.Runner`).
Compute = Callable[..., Any]


class Op:
    """A public op, declared once. Calling it runs it (see the module docstring).

    Args:
      name: the public name (``asickernels.<name>``, ``torch.ops.asickernels.<name>``).
      params: the parameters in signature order (``backend`` and ``config`` are added).
      check: the validation, called with the op's parameters by name (arrays as their
        :class:`Spec`, or None) and returning the :class:`Plan`; raises
        TypeError/ValueError naming the argument (a required array given as None
        included).
      compute: ``(runner, plan, **arrays, **plan.statics) -> outputs``, written with
        ``runner.xp``; it calls the kernels through ``runner.kernel(op)``.
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
      preference: the backends that implement this op, in the order ``backend=None``
        tries them (:mod:`asickernels.kernels.policy`); empty for an op that runs another
        op's kernel, or none.
      kernel: the op whose implementations this one's computation calls, when it is
        another's (``batched_nms`` runs ``nms``'s); None, and no preference: plain JAX.
      tolerance: ``(computed in float32 or narrower, computed in float64)``: how far a
        float result may be from the reference (:mod:`asickernels.kernels.oracle`); None:
        the reference rounded once to the output dtype, or exact for integers.
      compute_dtypes: the compute dtypes its plans name (``(None,)`` for an integer op),
        for ``asickernels info``.
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
        preference: tuple[str, ...] = (),
        kernel: Op | None = None,
        tolerance: tuple[Tolerance, Tolerance] | None = None,
        compute_dtypes: tuple[str | None, ...] = ("float32", "float64"),
    ) -> None:
        self.name = name
        # The module that declares it (the first caller outside the constructors of Op and
        # its subclasses), for the list of ops (:mod:`asickernels.frontends.generate`).
        frame = sys._getframe(1)
        while frame.f_locals.get("self") is self and frame.f_back is not None:
            frame = frame.f_back
        self.module: str = frame.f_globals["__name__"]
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
        self.preference = preference
        self.kernel: Op | None = kernel if kernel is not None else self if preference else None
        self.tolerance = tolerance
        self.compute_dtypes = compute_dtypes
        self.__name__ = self.__qualname__ = name
        self.__doc__ = doc
        self.__module__ = "asickernels"
        self.array_names = tuple(p.name for p in self.params if p.kind == "array")
        self.static_names = tuple(p.name for p in self.params if p.kind == "static")
        # The statics that may be left out, with their values then.
        self.static_defaults = {
            p.name: p.default
            for p in self.params
            if p.kind == "static" and p.default is not REQUIRED
        }
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
        self.positional = tuple(p.name for p in self.params if p.positional)
        self._defaults = {p.name: p.default for p in self.params} | {
            "backend": None,
            "config": None,
        }
        self.eager = Eager(self)  # it runs calls of declared ops

    def __repr__(self) -> str:
        return f"<asickernels op {self.name}{self.__signature__}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.eager(args, kwargs)

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
        if len(args) > len(self.positional):
            return None
        values = dict(self._defaults)
        values.update(zip(self.positional, args, strict=False))
        for name, value in kwargs.items():
            if name not in values or name in self.positional[: len(args)]:
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

    def plan(self, arrays: Mapping[str, Array | Spec | None], /, **statics: Any) -> Plan:
        """Validates shapes, dtypes and the static values, given by name (see :attr:`check`);
        the plan runs in x64 mode when an input or an output is 64-bit."""
        specs = {
            n: None if a is None else Spec(tuple(a.shape), np.dtype(a.dtype))
            for n, a in arrays.items()
        }
        plan: Plan = self.check(**specs, **statics)
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
        if self.kernel is None:
            for name, value in (("backend", backend), ("config", config)):
                if value is not None:
                    raise TypeError(f"{self.name} takes no {name} (it is plain JAX)")
            return None
        where = policy.where_arrays_live([a for a in arrays.values() if a is not None])
        chosen = policy.select(self.kernel, backend, where, plan.dtype)
        registry.check_config(self.kernel, chosen, config)
        return chosen


def cast(array: Any, dtype: npt.DTypeLike) -> Any:
    """``array`` as ``dtype``, without a copy when it already is."""
    return array if array.dtype == np.dtype(dtype) else array.astype(dtype)
