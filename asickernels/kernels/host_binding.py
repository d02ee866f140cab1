"""Eager routes that skip an op's Python: a small numpy call bound to its host kernel.

A repeated eager call with small numpy inputs spends more time around the kernel than in
it. Compiled, JAX takes each numpy input in (a device put in C++, about 2.5 µs, plus a copy
of inputs that are not 64-byte aligned, which numpy's are not as a rule). On the host twin
the inputs are read in place, but the output is handed to JAX from Python (about 3 µs plus
the same copy), after the op's ``compute`` (reshapes, casts, the kernel lookup) and the
twin's conversions: about 10 µs of Python around a 6 µs GIOU kernel on 64x64 boxes.

:func:`bound_route` runs ``compute`` once on the call's arrays with a runner that records
its kernel calls. When ``compute`` turned out to be one call of a host twin that can bind
(see :class:`asickernels.backends.cpu._library.HostTwin`), on the call's own inputs or
views of them, and returned a view of the kernel's one output, then every later call of
the signature is that kernel call bound to it: the inputs go straight to the kernel and
its output straight to JAX. Anything else (several kernels, converted inputs, a computed
output) gets no bound route. This relies on ``compute`` depending on the plan (shapes,
dtypes, static values) alone, never on array values, as the compiled-function cache does.

:func:`worth_binding` says where to try: one output handed over in place of two or more
numpy inputs taken in, and no larger than they are. Measured on this project's bench
(BENCHMARKS.md), that is where the bound call wins (GIOU, DIoU and CIoU of small boxes: 1
output of 16 KiB for 2 inputs of 64 KiB); with two outputs (NMS, the GIOU gradient) or an
output larger than the inputs (IoU matrices) the compiled call is as fast or faster, and
its outputs come from XLA's pool rather than the process's allocator.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from asickernels.kernels.declaration import Compute, Plan, Runner, Spec, handover

Route = Callable[..., Any]


def worth_binding(plan: Plan, present: Sequence[np.ndarray]) -> bool:
    """Whether a bound host route is expected to beat the compiled call on these numpy
    inputs (see the module's docstring): one output, at least two inputs, the output no
    larger than the inputs together."""
    output = plan.outputs
    return (
        isinstance(output, Spec)
        and len(present) >= 2
        and math.prod(output.shape) * output.dtype.itemsize <= sum(a.nbytes for a in present)
    )


class _Recorder(Runner):
    """A host :class:`Runner` that keeps every kernel call: (kernel, args, kwargs, result)."""

    def __init__(self, backend: str, calls: list[tuple[Any, ...]]) -> None:
        super().__init__(backend, True, None)
        object.__setattr__(self, "calls", calls)

    def kernel(self, name: str) -> Callable[..., Any]:
        function = super().kernel(name)

        def recorded(*args: Any, **kwargs: Any) -> Any:
            result = function(*args, **kwargs)
            self.calls.append((function, args, kwargs, result))  # type: ignore[attr-defined]
            return result

        return recorded


def bound_route(
    compute: Compute, backend: str, plan: Plan, arrays: Mapping[str, Any]
) -> Route | None:
    """The bound route of a call with one output on ``backend``'s host twin, with numpy
    ``arrays`` (by name, None where absent), taking the present arrays by position; None
    when the call does not reduce to one bindable kernel call (running ``compute`` once to
    find out)."""
    if not isinstance(plan.outputs, Spec):
        return None
    calls: list[tuple[Any, ...]] = []
    output = compute(_Recorder(backend, calls), plan, **arrays)
    if len(calls) != 1:
        return None
    function, args, kwargs, result = calls[0]
    present = [a for a in arrays.values() if a is not None]
    sources = [None if a is None else _source(a, present) for a in args]
    bind = _binder(function)
    if (
        bind is None
        or _NOT_FOUND in sources
        or isinstance(result, tuple)
        or _source(output, [result]) == _NOT_FOUND
        or any(isinstance(v, np.ndarray) for v in kwargs.values())
    ):
        return None
    bound = bind(*args, **kwargs)
    hand = handover(plan.outputs)
    if bound is None or hand is None:
        return None
    if [i for i in sources if i is not None] != list(range(len(present))):
        return None  # the kernel takes the arrays in another order, or not all of them
    shape = plan.outputs.shape

    def route(*given: np.ndarray) -> Any:
        return hand(bound(*given).reshape(shape))

    return route


_NOT_FOUND = -1


def _binder(function: Callable[..., Any]) -> Callable[..., Any] | None:
    """The ``bind`` of a host twin (through a registry's ``functools.partial``), or None."""
    if isinstance(function, functools.partial):
        bind = getattr(function.func, "bind", None)
        if bind is None:
            return None
        return functools.partial(bind, *function.args, **function.keywords)
    return getattr(function, "bind", None)


def _source(array: Any, candidates: Sequence[Any]) -> int:
    """The index of the one candidate whose memory ``array`` is exactly (a C-contiguous
    view of the same bytes and dtype), else :data:`_NOT_FOUND`: an input two arguments
    share, or a copy, cannot be told apart from a later call's arrays."""
    if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
        return _NOT_FOUND
    found = [
        i
        for i, c in enumerate(candidates)
        if isinstance(c, np.ndarray)
        and c.flags.c_contiguous
        and c.dtype == array.dtype
        and c.nbytes == array.nbytes
        and _address(c) == _address(array)
    ]
    return found[0] if len(found) == 1 else _NOT_FOUND


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])
