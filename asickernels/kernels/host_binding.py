"""Eager routes that skip an op's Python: a small numpy call bound to its host kernel.

A repeated eager call with small numpy inputs spends more time around the kernel than in
it. Compiled, JAX takes each numpy input in (a device put in C++, plus a copy of inputs
that are not 64-byte aligned, which numpy's are not as a rule). On the host twin the
inputs are read in place, but each output is handed to JAX from Python, after the op's
``compute`` (reshapes, casts, the kernel lookup) and the twin's conversions: about 10 µs
of Python around a 6 µs GIOU kernel on 64x64 boxes, measured.

:func:`bound_route` runs ``compute`` once on the call's arrays with a runner that records
its kernel calls. When ``compute`` turned out to be one call of a host twin that can bind
(see :class:`asickernels.backends.cpu._library.HostTwin`), on the call's own inputs or
views of them, and returned views of the kernel's outputs, then every later call of the
signature can be that kernel call bound to it: the inputs go straight to the kernel and
its outputs straight to JAX. Anything else (several kernels, converted inputs, computed
outputs) gets no bound route. This relies on ``compute`` depending on the plan (shapes,
dtypes, static values) alone, never on array values, as the compiled-function cache does.

Which of the bound and the compiled call is faster depends on how many arrays cross and
how large they are, and on the machine: :func:`faster` times both on the first call's
arrays and keeps the faster. They run the same native kernel, so the results are the same.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from asickernels.kernels.declaration import Compute, Plan, Runner, Spec, handover

Route = Callable[..., Any]

# faster(): rounds of timed calls, alternating the candidates, and calls per round.
TIMING_ROUNDS = 5
TIMING_CALLS = 2


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
    """The bound route of a call on ``backend``'s host twin with numpy ``arrays`` (by name,
    None where absent), taking the present arrays by position; None when the call does
    not reduce to one bindable kernel call (running ``compute`` once to find out)."""
    calls: list[tuple[Any, ...]] = []
    outputs = compute(_Recorder(backend, calls), plan, **arrays)
    if len(calls) != 1:
        return None
    function, args, kwargs, result = calls[0]
    present = [a for a in arrays.values() if a is not None]
    sources = [None if a is None else _source(a, present) for a in args]
    results = result if isinstance(result, tuple) else (result,)
    outs = outputs if isinstance(outputs, tuple) else (outputs,)
    picks = [_source(o, results) for o in outs]
    bind = _binder(function)
    if (
        bind is None
        or _NOT_FOUND in sources
        or _NOT_FOUND in picks
        or len(set(picks)) != len(picks)
        or any(isinstance(v, np.ndarray) for v in kwargs.values())
    ):
        return None
    bound = bind(*args, **kwargs)
    hand = handover(plan.outputs)
    if bound is None or hand is None:
        return None
    shapes = [s.shape for s in plan.output_list()]
    taken = [i for i in sources if i is not None]  # the arrays the bound kernel takes
    if (
        taken == list(range(len(present)))
        and isinstance(plan.outputs, Spec)
        and not isinstance(result, tuple)
    ):
        shape = shapes[0]  # the arrays as given, one output: no loops

        def route(*given: np.ndarray) -> Any:
            return hand(bound(*given).reshape(shape))

        return route

    several = isinstance(result, tuple)

    def general_route(*given: np.ndarray) -> Any:
        ran = bound(*[given[i] for i in taken])
        ran = ran if several else (ran,)
        return hand(*[ran[p].reshape(shape) for p, shape in zip(picks, shapes, strict=True)])

    return general_route


def faster(bound: Route, compiled: Route, present: Sequence[np.ndarray]) -> Route:
    """Whichever of ``bound`` and ``compiled`` is faster on ``present``: the best of
    :data:`TIMING_ROUNDS` rounds of :data:`TIMING_CALLS` calls each, the two taking turns
    so that both see the same machine."""
    candidates = (bound, compiled)
    best = [float("inf")] * len(candidates)
    for _ in range(TIMING_ROUNDS):
        for i, candidate in enumerate(candidates):
            jax.block_until_ready(candidate(*present))  # warms what the other evicted
            start = time.perf_counter()
            for _ in range(TIMING_CALLS):
                jax.block_until_ready(candidate(*present))
            best[i] = min(best[i], time.perf_counter() - start)
    return bound if best[0] <= best[1] else compiled


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
