"""What a run of a function on example inputs says about the loops and branches whose
outcome depends on data, which no compiled schedule can decide:

* the trips of each ``while`` loop outside Pallas kernels (XLA's loops), in entry order;
* per Pallas kernel (``pallas_call``): the grid steps it ran (its grid may be sized at run
  time), its scalar operands (grid bounds, scalar-prefetch arrays: the schedule walk reads
  them), each step's own work (its products, the bytes its pipeline moves) and, for each
  ``pl.when``/``lax.cond`` and ``while``/``fori_loop`` inside its body whose outcome
  depends on memory (a value loaded from a ref, e.g. a scalar-prefetch block mask or
  group offsets), how often its region ran or how many trips it took.

The function's jaxpr (``jax.make_jaxpr``) is run one equation at a time on the default
(CPU) backend, as far as its arrays decide: arguments given as ``jax.ShapeDtypeStruct``
are shapes only, and an equation that takes one gives shapes only (not computed). A
``platform_dependent`` choice takes its TPU branch; conds, calls and one-device
``shard_map`` calls that hold a kernel or a loop are looked into. Inside a kernel, the
body's *control part* is evaluated once per grid step by the evaluator here:
``program_id``/``num_programs`` from the step, loads from the scalar-prefetch refs from
the example values, and everything else as "unknown", so counting a 16384^3 masked
matmul takes seconds. Where that leaves a point uncounted (its
predicate depends on a block of a tensor operand), the body is run whole with its values
(:mod:`.kernel_values`), which counts every point; if it cannot (a primitive it does not
run, or longer than :data:`.kernel_values.MAX_SECONDS`), such a point stays *not counted*
and the estimate says it assumed its region ran (or its loop one trip) and why. A kernel
also runs in interpret mode when a later equation needs its output.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

from asickernels.simulate.tpu_estimate import kernel_values
from asickernels.simulate.tpu_estimate.kernel_values import CALLS, call_jaxpr, scan_counts
from asickernels.simulate.tpu_estimate.program_facts import dot_ops, jaxprs_in_params

# At most this many grid steps of one kernel are evaluated; larger grids are sampled at an
# even stride and the counts scaled.
MAX_EVALUATED_STEPS = 1 << 16
# A kernel's scalar operands are recorded for this many of its calls (later calls of the
# walk reuse them in turn).
MAX_RECORDED_CALLS = 64
# A body whose matrix products depend on its branches has them counted on at most this many
# grid steps (evenly strided) when nothing else needs every step evaluated.
MAX_WORK_STEPS = 4096


@dataclasses.dataclass(frozen=True)
class ControlCount:
    """One data-dependent ``cond`` (``kind="branch"``) or ``while`` (``"loop"``) of a
    kernel body, in the body's preorder. ``entries``: times it was reached with a
    computable predicate; ``taken``: of those, times a branch ran its region (branch index
    != 0, the ``pl.when`` body), or the trips a loop took in all; ``unknown``: times it was
    reached with a predicate that depends on tensor data (not counted); ``empty``: of a
    loop's counted entries, those that took no trip (its guard skipped it); ``scalar``: its
    predicate follows from the grid indices and scalar operands alone (the control part
    computed it every time), so a walk given those operands decides it itself."""

    kind: str
    entries: float = 0.0
    taken: float = 0.0
    unknown: float = 0.0
    empty: float = 0.0
    scalar: bool = False

    @property
    def rate(self) -> float | None:
        """Fraction of entries that ran the region (branch) or trips per entry (loop);
        None when never counted."""
        return self.taken / self.entries if self.entries else None


@dataclasses.dataclass(frozen=True)
class KernelRun:
    """What the run saw inside one ``pallas_call`` (summed over its calls)."""

    name: str
    calls: int
    steps: float  # grid steps in all calls
    dynamic_grid: bool  # a grid dimension was sized at run time
    points: tuple[ControlCount, ...] = ()
    # Per blocked input: (bytes of one block, steps on which its block index changed, so
    # the pipeline fetched it), summed over calls.
    fetches: tuple[tuple[float, float], ...] = ()
    # How often each step pattern occurred: (per data-dependent branch, 1 if it ran its
    # region on the step, 0 if not, None if not reached; per input, 1 if the step fetched
    # its next block), weight. Decisions taken on the same step stay together in the walk
    # (a step that skips its compute also skips its fetches). Empty for sampled grids.
    patterns: tuple[tuple[tuple[int | None, ...], tuple[int, ...], float], ...] = ()
    # How the points were counted: "" (no point needing values), "values" (the body run
    # whole on the example values: :mod:`.kernel_values`), else why that run was not used.
    valued: str = ""
    # Per call (the first MAX_RECORDED_CALLS), its scalar operands (dynamic grid bounds,
    # then scalar-prefetch arrays) as (HLO type, e.g. "s32[9]", its elements' bytes in C
    # order): what the kernel's schedule reads from its operands and SMEM.
    scalars: tuple[tuple[tuple[str, bytes], ...], ...] = ()
    # Why nothing was counted (its grid bounds or scalar-prefetch arrays follow from an
    # argument given as a shape only); "" when counted.
    uncounted: str = ""
    # Each grid step's own work, as a histogram over all calls: (integer and other matrix
    # product operations the step runs, bytes the pipeline moves during it: the next
    # step's new input blocks and the previous step's finished output blocks, steps);
    # and the bytes before and after the grid (the first blocks in, the last out).
    step_work: tuple[tuple[float, float, float, float], ...] = ()
    edge_bytes: float = 0.0
    # The first call's steps in grid order, each the number of its entry of step_work
    # (little-endian uint32s; empty when not every step's work was counted).
    step_order: bytes = b""

    def step_floors(self, int8_ops: float, other_ops: float, nbytes: float) -> list[float]:
        """The floor of each entry of :attr:`step_work` at these rates (one step)."""
        return [
            max(ints / int8_ops + others / other_ops, moved / nbytes)
            for ints, others, moved, _ in self.step_work
        ]

    def ordered_steps(self) -> list[int]:
        """:attr:`step_order` as a list of entry numbers."""
        import numpy as np

        return np.frombuffer(self.step_order, "<u4").tolist()

    def step_floor(self, int8_ops: float, other_ops: float, nbytes: float) -> float:
        """The least time its grid can take at these rates (per unit of time: integer and
        other matrix-product operations, bytes): each step at least its own products and
        the transfers the pipeline overlaps with it, plus the first fetch and the last
        write-back; summed over all calls."""
        floors = self.step_floors(int8_ops, other_ops, nbytes)
        per_step = sum(floor * work[3] for floor, work in zip(floors, self.step_work, strict=True))
        return per_step + self.edge_bytes / nbytes

    def fetch_rate(self, nbytes: float) -> float | None:
        """Fraction of steps on which an input block of ``nbytes`` was fetched (the mean
        over inputs of that block size, else over all inputs); None when nothing counted."""
        if not self.fetches or not self.steps:
            return None
        same = [count for size, count in self.fetches if size == nbytes]
        counts = same or [count for _, count in self.fetches]
        return min(1.0, sum(counts) / len(counts) / self.steps)

    def describe(self) -> str:
        if self.uncounted:
            kinds = [point.kind for point in self.points]
            return (
                f"{self.name}: not counted ({self.uncounted}); its "
                f"{kinds.count('branch')} data-dependent branch(es) and {kinds.count('loop')} "
                "loop(s) are assumed"
            )
        parts = [
            f"{self.name}: {self.steps:.0f} grid step(s) in {self.calls} call(s) on the example "
            f"inputs{' (grid sized at run time)' if self.dynamic_grid else ''}"
        ]
        if self.valued == "values":
            parts.append("the body run with its values (tensor-dependent points counted)")
        elif self.valued:
            parts.append(f"the body could not run with its values ({self.valued})")
        for number, point in enumerate(self.points):
            rate = point.rate
            if rate is None:
                parts.append(f"{point.kind} #{number} not counted (depends on tensor data)")
            elif point.kind == "branch":
                parts.append(
                    f"branch #{number} ran its region {point.taken:.0f} of "
                    f"{point.entries:.0f} times"
                )
            else:
                parts.append(
                    f"loop #{number} took {rate:.2f} trips per entry"
                    + (
                        f" ({point.empty:.0f} of {point.entries:.0f} entries none)"
                        if point.empty
                        else ""
                    )
                )
        if self.fetches and self.steps:
            shares = ", ".join(f"{count / self.steps:.0%}" for _, count in self.fetches)
            parts.append(f"input blocks fetched on {shares} of steps")
        return "; ".join(parts)


@dataclasses.dataclass(frozen=True)
class Observed:
    # XLA while loops outside kernels, in entry order (None: its exit depends on an
    # argument given as a shape only)
    while_trips: tuple[int | None, ...] = ()
    kernels: tuple[KernelRun, ...] = ()  # in the order the kernels were first called
    notes: tuple[str, ...] = ()  # what the run could not look into


def observe(function: Callable[..., Any], args: Sequence[Any]) -> Observed:
    """Runs ``function(*args)`` on the default backend one jaxpr equation at a time (call it
    under ``jax.default_device(cpu)`` and Pallas interpret mode) and returns what it saw
    (see the module docstring). Arguments given as ``jax.ShapeDtypeStruct`` are shapes
    only: what follows from them is not computed, and what depends on it is not counted."""
    import jax

    closed = jax.make_jaxpr(function)(*args)
    run = _Run()
    if _needs_run(closed.jaxpr):  # else nothing to count: skip the (maybe long) CPU run
        run.jaxpr(closed.jaxpr, closed.consts, list(args), [False] * len(closed.jaxpr.outvars))
    kernels = tuple(counter.freeze() for counter in run.kernels.values())
    return Observed(tuple(run.trips), kernels, tuple(dict.fromkeys(run.notes)))


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()


def _needs_run(jaxpr: Any) -> bool:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("while", "pallas_call", _BY_PLATFORM):
            return True
        if any(_needs_run(sub) for sub in jaxprs_in_params(eqn.params)):
            return True
    return False


def _live_equations(jaxpr: Any, needed_outputs: Sequence[bool]) -> list[bool]:
    """Which equations must run: those that hold something to count and those whose outputs
    a running equation (or a needed output) reads."""
    import jax.extend as jex

    live = {
        var
        for var, needed in zip(jaxpr.outvars, needed_outputs, strict=True)
        if needed and not isinstance(var, jex.core.Literal)
    }
    keep = [False] * len(jaxpr.eqns)
    for index in range(len(jaxpr.eqns) - 1, -1, -1):
        eqn = jaxpr.eqns[index]
        counted = eqn.primitive.name in ("while", "pallas_call", _BY_PLATFORM) or any(
            _needs_run(sub) for sub in jaxprs_in_params(eqn.params)
        )
        if counted or any(var in live for var in eqn.outvars):
            keep[index] = True
            live.update(var for var in eqn.invars if not isinstance(var, jex.core.Literal))
    return keep


def _shape_only(value: Any) -> bool:
    """A value given (or following from arguments given) as a shape only."""
    import jax

    return isinstance(value, jax.ShapeDtypeStruct)


def _shapes_of(variables: Sequence[Any]) -> list[Any]:
    """Shape-only values of ``variables`` (their avals)."""
    import jax

    return [
        jax.ShapeDtypeStruct(var.aval.shape, var.aval.dtype)
        if hasattr(var.aval, "shape") and hasattr(var.aval, "dtype")
        else UNKNOWN
        for var in variables
    ]


def _tpu_branch(platforms: Sequence[Any]) -> int | None:
    """The branch a ``platform_dependent`` choice takes on TPU (None: none does)."""
    for index, names in enumerate(platforms):
        if names is None or "tpu" in names:
            return index
    return None


class _Run:
    """The outer run: XLA-level equations, executed where their inputs are known; those
    whose inputs follow from shape-only arguments give shape-only outputs."""

    def __init__(self) -> None:
        self.trips: list[int | None] = []
        self.kernels: dict[int, _KernelCounter] = {}
        self.notes: list[str] = []
        self._compiled: dict[int, tuple[Any, Any]] = {}  # id -> (closed jaxpr, jitted)

    def jaxpr(
        self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], needed: Sequence[bool]
    ) -> list[Any]:
        import jax.extend as jex

        env: dict[Any, Any] = {}

        def read(var: Any) -> Any:  # an output nothing needed is not computed: its shape
            if isinstance(var, jex.core.Literal):
                return var.val
            return env[var] if var in env else _shapes_of([var])[0]

        env.update(zip(jaxpr.constvars, consts, strict=True))
        env.update(zip(jaxpr.invars, args, strict=True))
        for eqn, keep in zip(jaxpr.eqns, _live_equations(jaxpr, needed), strict=True):
            if not keep:
                continue
            values = [read(var) for var in eqn.invars]
            outputs = self.equation(eqn, values, jaxpr, _Uses(jaxpr, needed))
            env.update(zip(eqn.outvars, outputs, strict=True))
        return [read(var) for var in jaxpr.outvars]

    def closed(self, closed: Any, args: Sequence[Any], needed: Sequence[bool]) -> list[Any]:
        """A loop's cond or body: run one equation at a time when it holds something to
        count or takes a shape-only value, else compiled once (a loop runs its body many
        times)."""
        if _needs_run(closed.jaxpr) or any(_shape_only(arg) for arg in args):
            return self.jaxpr(closed.jaxpr, closed.consts, args, needed)
        import jax
        import jax.extend as jex

        key = id(closed)
        if key not in self._compiled:
            self._compiled[key] = (closed, jax.jit(jex.core.jaxpr_as_fun(closed)))
        return list(self._compiled[key][1](*args))

    def equation(self, eqn: Any, values: list[Any], jaxpr: Any, uses: _Uses) -> list[Any]:
        params, name = eqn.params, eqn.primitive.name
        if name == "while":
            return self._while(eqn, values)
        if name == "scan" and params["length"] and _needs_run(params["jaxpr"].jaxpr):
            return self._scan(eqn, values)
        if name == "cond":
            return self._cond(eqn, values, uses)
        if name == "platform_index":  # a choice by platform: the estimate is for TPU
            import numpy as np

            index = _tpu_branch(params["platforms"])
            return [np.int32(len(params["platforms"]) if index is None else index)]
        if name in CALLS and call_jaxpr(params) is not None:
            inner = call_jaxpr(params)
            return self.jaxpr(inner.jaxpr, inner.consts, values, uses.of(eqn))
        if name == "shard_map" and _one_device(params):  # as many shards as devices: one
            return self.jaxpr(params["jaxpr"], (), values, uses.of(eqn))
        if name == _BY_PLATFORM:  # asickernels' own Pallas kernels: see the pallas_call
            inner = _by_platform_jaxpr(params, values)
            return self.jaxpr(inner.jaxpr, inner.consts, values, uses.of(eqn))
        if name == "pallas_call":
            counter = self.kernels.setdefault(id(eqn), _KernelCounter(eqn, len(self.kernels)))
            counter.count(values)
            if not any(uses.of(eqn)):  # nothing reads its outputs: count, don't execute
                return _shapes_of(eqn.outvars)
        elif any(_needs_run(sub) for sub in jaxprs_in_params(params)):
            self.notes.append(
                f"a Pallas kernel or while loop inside {name!r} is not counted (the run does "
                "not look inside it)"
            )
        if any(_shape_only(value) or value is UNKNOWN for value in values):
            return _shapes_of(eqn.outvars)
        result = eqn.primitive.bind(*values, **params)
        return list(result) if eqn.primitive.multiple_results else [result]

    def _cond(self, eqn: Any, values: list[Any], uses: _Uses) -> list[Any]:
        """A ``cond``: the branch its index (on TPU, for a choice by platform) picks, run
        equation by equation when it holds something to count or takes a shape-only
        value."""
        import numpy as np

        params, branches = eqn.params, eqn.params["branches"]
        platforms = params.get("branches_platforms")
        index, operands = values[0], values[1:]
        if platforms is not None:
            chosen = _tpu_branch(platforms)
        elif _shape_only(index) or index is UNKNOWN:
            chosen = None
        else:
            chosen = int(np.clip(int(np.asarray(index)), 0, len(branches) - 1))
        if chosen is None:
            if any(_needs_run(branch.jaxpr) for branch in branches):
                self.notes.append(
                    "a cond holding a Pallas kernel or while loop chooses its branch from an "
                    "argument given as a shape only: not counted"
                )
            return _shapes_of(eqn.outvars)
        branch = branches[chosen]
        if _needs_run(branch.jaxpr) or any(_shape_only(value) for value in operands):
            return self.jaxpr(branch.jaxpr, branch.consts, operands, uses.of(eqn))
        return list(eqn.primitive.bind(np.int32(chosen), *operands, **params))

    def _while(self, eqn: Any, values: list[Any]) -> list[Any]:
        """A ``while`` loop, its trips recorded (None when its exit depends on a
        shape-only argument)."""
        import jax.numpy as jnp

        params = eqn.params
        cond, body = params["cond_jaxpr"], params["body_jaxpr"]
        n_cond, n_body = params["cond_nconsts"], params["body_nconsts"]
        cond_consts, body_consts = values[:n_cond], values[n_cond : n_cond + n_body]
        carry = values[n_cond + n_body :]
        slot, count = len(self.trips), 0
        self.trips.append(0)
        every = [True] * len(body.jaxpr.outvars)
        while True:
            pred = self.closed(cond, [*cond_consts, *carry], [True])[0]
            if _shape_only(pred) or pred is UNKNOWN:
                self.trips[slot] = None
                return _shapes_of(eqn.outvars)
            pred = jnp.asarray(pred)
            if not bool(jnp.any(pred)):
                break
            step = self.closed(body, [*body_consts, *carry], every)
            # A vmapped loop's predicate is per image (leading dimensions): as XLA's
            # lowering, the loop runs while any holds and only those images advance.
            carry = (
                [
                    new
                    if _shape_only(new) or _shape_only(old)
                    else jnp.where(
                        pred.reshape(pred.shape + (1,) * (jnp.ndim(new) - pred.ndim)), new, old
                    )
                    for new, old in zip(step, carry, strict=True)
                ]
                if pred.ndim
                else step
            )
            count += 1
        self.trips[slot] = count
        return carry

    def _scan(self, eqn: Any, values: list[Any]) -> list[Any]:
        """A ``scan`` whose body holds something to count, one iteration at a time. Its
        trips are not recorded: XLA lowers it to a loop on a counter that the walk follows
        in the schedule, so a recorded count would land on the next data-dependent loop."""
        import jax.numpy as jnp

        params = eqn.params
        body, length = params["jaxpr"], params["length"]
        n_consts, n_carry = scan_counts(params)
        consts, carry = values[:n_consts], values[n_consts : n_consts + n_carry]
        xs = values[n_consts + n_carry :]
        every = [True] * len(body.jaxpr.outvars)
        ys: list[list[Any]] = []
        steps = range(length - 1, -1, -1) if params["reverse"] else range(length)
        for step in steps:
            sliced = [
                _shapes_of([var])[0] if _shape_only(x) else x[step]
                for x, var in zip(xs, body.jaxpr.invars[n_consts + n_carry :], strict=True)
            ]
            out = self.closed(body, [*consts, *carry, *sliced], every)
            carry, y = out[:n_carry], out[n_carry:]
            ys.append(y)
        if params["reverse"]:
            ys.reverse()
        stacked = [
            shape if any(_shape_only(y) for y in column) else jnp.stack(column)
            for column, shape in zip(
                zip(*ys, strict=True), _shapes_of(eqn.outvars[n_carry:]), strict=True
            )
        ]
        return [*carry, *stacked]


def _one_device(params: Any) -> bool:
    """Whether a ``shard_map``'s mesh has one device (its body then sees whole arrays)."""
    mesh = params.get("mesh")
    sizes = getattr(mesh, "shape", None)
    return sizes is not None and math.prod(dict(sizes).values()) == 1


# The primitive of asickernels' Pallas backend (its ``lowering.run``): a Pallas kernel whose
# Mosaic-or-interpret choice is made at lowering, its pallas_call visible only there. Its
# ``build`` parameter's ``interpreted()`` is the function built for interpret mode.
_BY_PLATFORM = "asickernels_pallas_by_platform"


def _by_platform_jaxpr(params: Any, values: Sequence[Any]) -> Any:
    import jax

    return jax.make_jaxpr(params["build"].interpreted())(*values)


class _Uses:
    """Whether each output of an equation is read later in its jaxpr (or is a needed
    output of the jaxpr)."""

    def __init__(self, jaxpr: Any, needed: Sequence[bool]) -> None:
        self.read: set[Any] = {
            var for var, need in zip(jaxpr.outvars, needed, strict=True) if need and _is_var(var)
        }
        for eqn in jaxpr.eqns:
            self.read.update(var for var in eqn.invars if _is_var(var))

    def of(self, eqn: Any) -> list[bool]:
        return [var in self.read for var in eqn.outvars]


def _is_var(var: Any) -> bool:
    import jax.extend as jex

    return not isinstance(var, jex.core.Literal)


# --------------------------------------------------------------------------------------
# Inside a kernel: the control part of the body, once per grid step
# --------------------------------------------------------------------------------------


def _data_points(jaxpr: Any, tainted: set[Any], points: list[Any], loads: bool = True) -> set[Any]:
    """Marks the variables of ``jaxpr`` that depend on memory (``tainted`` holds the
    tainted inputs; loads from refs taint their results) and appends, in preorder, the
    ``cond`` and ``while`` equations whose predicate is tainted. Returns the tainted
    outputs' variables. ``loads`` False: a load is tainted only by its ref (which refs hold
    tensor data is then said by ``tainted``)."""
    import jax.extend as jex

    def is_tainted(var: Any) -> bool:
        return not isinstance(var, jex.core.Literal) and var in tainted

    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        ins = [is_tainted(var) for var in eqn.invars]
        outs: list[bool]
        if name == "cond":
            if ins[0]:
                points.append(eqn)
            outs = [ins[0]] * len(eqn.outvars)
            for branch in eqn.params["branches"]:
                sub = branch.jaxpr
                marked = {v for v, t in zip(sub.invars, ins[1:], strict=True) if t}
                result = _data_points(sub, marked, points, loads)
                outs = [
                    o or (_is_var(v) and v in result)
                    for o, v in zip(outs, sub.outvars, strict=True)
                ]
        elif name == "while":
            outs = _while_taint(eqn, ins, points, loads)
        elif name == "scan":
            outs = _scan_taint(eqn, ins, points, loads)
        elif name in CALLS and call_jaxpr(eqn.params) is not None:
            sub = call_jaxpr(eqn.params).jaxpr
            marked = {v for v, t in zip(sub.invars, ins, strict=True) if t}
            result = _data_points(sub, marked, points, loads)
            outs = [_is_var(v) and v in result for v in sub.outvars]
        else:
            reads = loads and name in ("get", "swap", "load", "masked_load")
            outs = [reads or any(ins)] * len(eqn.outvars)
        tainted.update(var for var, t in zip(eqn.outvars, outs, strict=True) if t)
    return {var for var in jaxpr.outvars if is_tainted(var)}


def _while_taint(eqn: Any, ins: list[bool], points: list[Any], loads: bool) -> list[bool]:
    params = eqn.params
    n_cond, n_body = params["cond_nconsts"], params["body_nconsts"]
    cond, body = params["cond_jaxpr"].jaxpr, params["body_jaxpr"].jaxpr
    carry = ins[n_cond + n_body :]
    while True:  # the carry's taint, to a fixed point
        marked = {
            v for v, t in zip(body.invars, ins[n_cond : n_cond + n_body] + carry, strict=True) if t
        }
        result = _data_points(body, marked, [], loads)
        grown = [
            c or (_is_var(v) and v in result) for c, v in zip(carry, body.outvars, strict=True)
        ]
        if grown == carry:
            break
        carry = grown
    cond_marked = {v for v, t in zip(cond.invars, ins[:n_cond] + carry, strict=True) if t}
    if _data_points(cond, cond_marked, [], loads):
        points.append(eqn)
    body_marked = {
        v for v, t in zip(body.invars, ins[n_cond : n_cond + n_body] + carry, strict=True) if t
    }
    _data_points(body, body_marked, points, loads)
    return carry


def _scan_taint(eqn: Any, ins: list[bool], points: list[Any], loads: bool) -> list[bool]:
    n_consts, n_carry = scan_counts(eqn.params)
    body = eqn.params["jaxpr"].jaxpr
    carry = ins[n_consts : n_consts + n_carry]
    while True:  # the carry's taint, to a fixed point
        marked = {
            v
            for v, t in zip(
                body.invars, ins[:n_consts] + carry + ins[n_consts + n_carry :], strict=True
            )
            if t
        }
        found: list[Any] = []
        result = _data_points(body, marked, found, loads)
        outs = [_is_var(v) and v in result for v in body.outvars]
        grown = [c or o for c, o in zip(carry, outs[:n_carry], strict=True)]
        if grown == carry:
            break
        carry = grown
    points.extend(found)
    return grown + outs[n_carry:]


class _KernelCounter:
    """Counts one ``pallas_call``'s grid steps and data-dependent control points."""

    def __init__(self, eqn: Any, number: int) -> None:
        params = eqn.params
        mapping = params["grid_mapping"]
        self.name = _kernel_name(params, number)
        self.grid = tuple(mapping.grid)
        self.dynamic = int(getattr(mapping, "num_dynamic_grid_bounds", 0) or 0)
        self.prefetch = int(getattr(mapping, "num_index_operands", 0) or 0)
        body = params["jaxpr"]
        self.body = body.jaxpr if hasattr(body, "consts") else body
        self.body_consts = list(getattr(body, "consts", []))
        found: list[Any] = []
        _data_points(self.body, set(self.body.invars), found)
        self.order = {id(point): index for index, point in enumerate(found)}
        self.kinds = ["branch" if point.primitive.name == "cond" else "loop" for point in found]
        on_tensors: list[Any] = []  # the points whose predicate reads tensor data
        _data_points(self.body, set(self.body.invars[self.prefetch :]), on_tensors, False)
        self.scalar = [all(point is not other for other in on_tensors) for point in found]
        self.entries = [0.0] * len(found)
        self.taken = [0.0] * len(found)
        self.unknown = [0.0] * len(found)
        self.empty = [0.0] * len(found)
        self.eqn = eqn
        self.scalars: list[tuple[tuple[str, bytes], ...]] = []
        self.uncounted = ""
        self.step_work: dict[tuple[float, float, float], float] = {}
        self.step_order: list[tuple[float, float, float]] = []  # the first call's steps
        self.edge_bytes = 0.0
        self.outputs_bytes = [_ref_bytes(ref.aval) for ref in self._output_refs()]
        self.fixed_work, self.branch_work = _product_ops(self.body)
        self.valued = ""
        self.calls = 0
        self.steps = 0.0
        inputs = list(mapping.block_mappings)[: int(getattr(mapping, "num_inputs", 0) or 0)]
        # Inputs' index maps, then outputs' (the full run writes output blocks back).
        self.index_maps = [block.index_map_jaxpr for block in mapping.block_mappings]
        refs = self.body.invars[self.prefetch : self.prefetch + len(inputs)]
        self.block_bytes = [_ref_bytes(ref.aval) for ref in refs]
        self.fetches = [0.0] * len(inputs)
        self.patterns: dict[tuple[tuple[int | None, ...], tuple[int, ...]], float] = {}

    def freeze(self) -> KernelRun:
        points = tuple(
            ControlCount(kind, entries, taken, unknown, empty, scalar)
            for kind, entries, taken, unknown, empty, scalar in zip(
                self.kinds,
                self.entries,
                self.taken,
                self.unknown,
                self.empty,
                self.scalar,
                strict=True,
            )
        )
        fetches = tuple(zip(self.block_bytes, self.fetches, strict=True))
        patterns = tuple((b, f, w) for (b, f), w in sorted(self.patterns.items(), key=str))
        return KernelRun(
            self.name,
            self.calls,
            self.steps,
            self.dynamic > 0,
            points,
            fetches,
            patterns,
            self.valued,
            tuple(self.scalars),
            self.uncounted if not self.calls else "",
            tuple((*key, weight) for key, weight in sorted(self.step_work.items())),
            self.edge_bytes,
            self._frozen_order(),
        )

    def _frozen_order(self) -> bytes:
        import numpy as np

        number = {key: n for n, key in enumerate(sorted(self.step_work))}
        return np.asarray([number[key] for key in self.step_order], "<u4").tobytes()

    def _output_refs(self) -> list[Any]:
        mapping = self.eqn.params["grid_mapping"]
        first = self.prefetch + int(getattr(mapping, "num_inputs", 0) or 0)
        return self.body.invars[first : first + int(getattr(mapping, "num_outputs", 0) or 0)]

    def count(self, values: Sequence[Any]) -> None:
        import numpy as np

        if any(_shape_only(value) for value in values[: self.dynamic + self.prefetch]):
            self.uncounted = (
                "its grid bounds or scalar-prefetch arrays follow from an argument given as a "
                "shape only: pass that argument as an array"
            )
            return
        bounds = iter(values[: self.dynamic])
        grid = tuple(
            int(np.asarray(next(bounds))) if not isinstance(size, int) else size
            for size in self.grid
        )
        prefetch = [np.asarray(v) for v in values[self.dynamic : self.dynamic + self.prefetch]]
        steps = math.prod(grid)
        if len(self.scalars) < MAX_RECORDED_CALLS:
            self.scalars.append(
                tuple(scalar_operand(v) for v in values[: self.dynamic + self.prefetch])
            )
        self.calls += 1
        self.steps += steps
        if not steps:
            return
        stride = max(1, math.ceil(steps / MAX_EVALUATED_STEPS))
        weight = steps / len(range(0, steps, stride))
        # Steps whose products are counted: every evaluated one, or a sample when only the
        # products need the body (they depend on its branches).
        work_stride = stride if self.order else max(1, math.ceil(steps / MAX_WORK_STEPS))
        step_ops: dict[int, tuple[float, float]] = {}
        rest = [UNKNOWN] * (len(self.body.invars) - len(prefetch))
        keys: list[list[Any]] = []  # per step, each block's index (inputs, then outputs)
        branches: list[tuple[int | None, ...]] = []
        before = [list(self.entries), list(self.taken), list(self.unknown), list(self.empty)]
        for number, index in enumerate(itertools.product(*map(range, grid))):
            step = _KernelStep(self, grid, index, weight)
            ids = [np.int32(i) for i in index]
            keys.append(
                [
                    tuple(
                        None if b is UNKNOWN else int(np.asarray(b))
                        for b in step.jaxpr(index_map.jaxpr, index_map.consts, [*ids, *prefetch])
                    )
                    for index_map in self.index_maps
                ]
            )
            if (self.order and number % stride == 0) or (
                self.branch_work and number % work_stride == 0
            ):
                step.jaxpr(self.body, self.body_consts, [*prefetch, *rest])
                step_ops[number] = step.ops
                if self.order and number % stride == 0:
                    branches.append(
                        tuple(step.ran.get(n) for n in range(self.kinds.count("branch")))
                    )
        if stride == 1 and any(
            self.unknown[p] > before[2][p] or self.entries[p] == before[0][p]
            for p in range(len(self.kinds))
        ):  # a point the control part left uncounted: run the body with its values
            branches = self._run_with_values(values, grid, keys, before) or branches
        # A block is fetched when its index changes (the first step's, before the grid).
        for slot in range(len(self.fetches)):
            self.fetches[slot] += sum(
                1
                for number, key in enumerate(keys)
                if not number or key[slot] != keys[number - 1][slot] or None in key[slot]
            )
        self._count_work(keys, step_ops, work_stride if self.branch_work else 1)
        if stride > 1:
            return
        for number, key in enumerate(keys):  # the fetches issued on a step: the next step's
            after = keys[number + 1] if number + 1 < len(keys) else key
            fetched = tuple(
                int(a != b) for a, b in zip(after[: len(self.fetches)], key, strict=False)
            )
            pattern = (branches[number] if branches else (), fetched)
            self.patterns[pattern] = self.patterns.get(pattern, 0.0) + 1.0

    def _count_work(
        self, keys: list[list[Any]], step_ops: dict[int, tuple[float, float]], stride: int
    ) -> None:
        """Adds this call's steps to :attr:`KernelRun.step_work`: a step's products (those
        its evaluation ran, else those it surely runs) and the transfers the pipeline runs
        during it (the next step's changed input blocks, the previous step's output blocks
        whose index then changed)."""
        inputs = len(self.fetches)
        last = len(keys) - 1

        def fetched(number: int) -> float:  # bytes of the blocks step `number` needs anew
            if number > last:
                return 0.0
            return sum(
                size
                for slot, size in enumerate(self.block_bytes)
                if not number or keys[number][slot] != keys[number - 1][slot]
            )

        def written(number: int) -> float:  # bytes of outputs finished after step `number`
            if number < 0:
                return 0.0
            return sum(
                size
                for slot, size in enumerate(self.outputs_bytes)
                if number == last or keys[number][inputs + slot] != keys[number + 1][inputs + slot]
            )

        self.edge_bytes += fetched(0) + written(last)
        first_call = self.calls == 1 and stride == 1
        for number in range(0, len(keys), stride):
            ints, others = step_ops.get(number, self.fixed_work)
            key = (ints, others, fetched(number + 1) + written(number - 1))
            self.step_work[key] = self.step_work.get(key, 0.0) + len(
                range(number, min(number + stride, len(keys)))
            )
            if first_call:
                self.step_order.append(key)

    def _run_with_values(
        self,
        values: Sequence[Any],
        grid: tuple[int, ...],
        keys: list[list[Any]],
        before: list[list[float]],
    ) -> list[tuple[int | None, ...]] | None:
        """Replaces this call's control-only counts by those of the body run whole on the
        example values (:func:`.kernel_values.run_grid`); returns each step's branch
        outcomes, or None (counts left as they were, ``valued`` saying why) when it
        cannot run."""
        import time

        if self.valued not in ("", "values"):
            return None  # an earlier call could not: don't try again
        try:
            counts = kernel_values.run_grid(
                self.eqn,
                values,
                self.order,
                grid,
                keys,
                time.monotonic() + kernel_values.MAX_SECONDS,
            )
        except TimeoutError as error:
            self.valued = f"over {kernel_values.MAX_SECONDS:.0f} s: {error}"
            return None
        except Exception as error:  # anything it cannot run: say what
            first = (str(error).strip().splitlines() or [""])[0][:120]
            self.valued = f"{type(error).__name__}: {first}"
            return None
        self.valued = "values"
        self.entries, self.taken, self.unknown, self.empty = (list(b) for b in before)
        branch_points = [p for p, kind in enumerate(self.kinds) if kind == "branch"]
        branches = []
        for step in counts:
            for p in range(len(self.kinds)):
                self.entries[p] += float(step[p, 0])
                self.taken[p] += float(step[p, 1])
                self.empty[p] += float(step[p, 2])
            branches.append(
                tuple(int(step[p, 1] > 0) if step[p, 0] else None for p in branch_points)
            )
        return branches


class _KernelStep:
    """Evaluates a kernel body for one grid step, computing only what it can."""

    def __init__(
        self, counter: _KernelCounter, grid: tuple[int, ...], index: tuple[int, ...], weight: float
    ) -> None:
        self.counter, self.grid, self.index, self.weight = counter, grid, index, weight
        self.ran: dict[int, int] = {}  # branch point -> 1 if it ran its region this step
        self.ops = (0.0, 0.0)  # the step's (integer, other) matrix-product operations

    def _add(self, ops: tuple[float, float], times: float = 1.0) -> None:
        self.ops = (self.ops[0] + times * ops[0], self.ops[1] + times * ops[1])

    def jaxpr(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        outputs, _ = kernel_values.evaluate(
            jaxpr, consts, args, lambda eqn, values, _: (self.equation(eqn, values), None)
        )
        return outputs

    def equation(self, eqn: Any, values: list[Any]) -> list[Any]:
        import numpy as np

        name, params = eqn.primitive.name, eqn.params
        unknown = [UNKNOWN] * len(eqn.outvars)
        point = self.counter.order.get(id(eqn))
        if name == "program_id":
            return [np.int32(self.index[params["axis"]])]
        if name == "num_programs":
            return [np.int32(self.grid[params["axis"]])]
        if name == "dot_general":
            ops, integer = dot_ops(eqn)
            self._add((ops, 0.0) if integer else (0.0, ops))
        if name == "scan":  # its body's products, as often as it runs (at least)
            self._add(_product_ops(params["jaxpr"].jaxpr)[0], params["length"])
        if name == "run_scoped":  # scratch refs for a region: unknown contents
            body = params["jaxpr"]
            extra = [UNKNOWN] * (len(body.invars) - len(values))
            return self.jaxpr(body, (), [*values, *extra])
        if name == "cond":
            index = values[0]
            if index is UNKNOWN:
                self._count(point, unknown=True)
                self._add(_least_ops(params["branches"]))
                return unknown
            chosen = int(np.clip(int(np.asarray(index)), 0, len(params["branches"]) - 1))
            self._count(point, taken=float(chosen != 0))
            if point is not None:
                ordinal = self.counter.kinds[: point + 1].count("branch") - 1
                self.ran[ordinal] = max(self.ran.get(ordinal, 0), int(chosen != 0))
            branch = params["branches"][chosen]
            return self.jaxpr(branch.jaxpr, branch.consts, values[1:])
        if name == "while":
            return self._while(eqn, values, point)
        if name in CALLS and call_jaxpr(params) is not None:
            inner = call_jaxpr(params)
            return self.jaxpr(inner.jaxpr, inner.consts, values)
        if name == "get":
            return [_load(params, values)]
        if any(value is UNKNOWN for value in values) or name in ("swap", "addupdate"):
            return unknown
        fast = _NUMPY.get(name)
        if fast is not None and all(np.ndim(value) == 0 for value in values):
            # Scalar index arithmetic: numpy, far cheaper than dispatching to jax.
            return [np.asarray(fast(*values)).astype(eqn.outvars[0].aval.dtype)[()]]
        try:
            result = eqn.primitive.bind(*values, **params)
        except Exception:  # a Pallas-only primitive outside its kernel: not computable here
            return unknown
        return list(result) if eqn.primitive.multiple_results else [result]

    def _while(self, eqn: Any, values: list[Any], point: int | None) -> list[Any]:
        cond, cond_consts, body, body_consts, carry = kernel_values.while_operands(
            eqn.params, values
        )
        trips = 0
        while True:
            go = self.jaxpr(cond.jaxpr, cond.consts, [*cond_consts, *carry])[0]
            if go is UNKNOWN:
                self._count(point, unknown=True)
                return [UNKNOWN] * len(eqn.outvars)
            if not bool(go):
                break
            carry = self.jaxpr(body.jaxpr, body.consts, [*body_consts, *carry])
            trips += 1
        self._count(point, taken=float(trips))
        if point is not None and not trips:
            self.counter.empty[point] += self.weight
        return carry

    def _count(self, point: int | None, taken: float = 0.0, unknown: bool = False) -> None:
        if point is None:
            return
        counter = self.counter
        if unknown:
            counter.unknown[point] += self.weight
        else:
            counter.entries[point] += self.weight
            counter.taken[point] += taken * self.weight


def _product_ops(jaxpr: Any) -> tuple[tuple[float, float], bool]:
    """((integer, other) matrix-product operations ``jaxpr`` surely runs: a branch's least,
    a ``while``'s none, a ``scan``'s body per trip), and whether any of its products sits
    under a branch or a ``while`` (its work then depends on the step)."""
    ints = others = 0.0
    conditional = False
    for eqn in jaxpr.eqns:
        name, params = eqn.primitive.name, eqn.params
        if name == "dot_general":
            ops, integer = dot_ops(eqn)
            ints, others = (ints + ops, others) if integer else (ints, others + ops)
        elif name == "cond":
            least = _least_ops(params["branches"])
            ints, others = ints + least[0], others + least[1]
            conditional = conditional or any(
                sum(_product_ops(branch.jaxpr)[0]) for branch in params["branches"]
            )
        elif name == "while":
            conditional = conditional or any(
                sum(_product_ops(sub)[0]) for sub in jaxprs_in_params(params)
            )
        else:
            times = params["length"] if name == "scan" else 1
            for sub in jaxprs_in_params(params):
                (sub_ints, sub_others), sub_conditional = _product_ops(sub)
                ints, others = ints + times * sub_ints, others + times * sub_others
                conditional = conditional or sub_conditional
    return (ints, others), conditional


def _least_ops(branches: Sequence[Any]) -> tuple[float, float]:
    """The products of the branch of a ``cond`` that runs fewest (its lower bound)."""
    return min((_product_ops(branch.jaxpr)[0] for branch in branches), key=sum)


def _numpy_ops() -> dict[str, Callable[..., Any]]:
    import numpy as np

    return {
        "add": np.add,
        "sub": np.subtract,
        "mul": np.multiply,
        "max": np.maximum,
        "min": np.minimum,
        "eq": np.equal,
        "ne": np.not_equal,
        "lt": np.less,
        "le": np.less_equal,
        "gt": np.greater,
        "ge": np.greater_equal,
        "and": np.bitwise_and,
        "or": np.bitwise_or,
        "not": np.invert,
        "convert_element_type": lambda value: value,  # the cast below does it
    }


_NUMPY = _numpy_ops()


def _load(params: Any, values: list[Any]) -> Any:
    """``ref[indices]`` for a ref known here (a scalar-prefetch array), else UNKNOWN."""
    import jax
    import numpy as np

    ref, flat = values[0], values[1:]
    if ref is UNKNOWN or any(value is UNKNOWN for value in flat):
        return UNKNOWN
    try:
        indexers = jax.tree_util.tree_unflatten(params["tree"], flat)
    except (KeyError, ValueError, TypeError):
        return UNKNOWN
    indexers = tuple(indexers) if isinstance(indexers, (tuple, list)) else (indexers,)
    if len(indexers) != 1 or not hasattr(indexers[0], "indices"):
        return UNKNOWN
    where: list[Any] = []
    for index in indexers[0].indices:
        if hasattr(index, "start") and hasattr(index, "size"):
            start, stride = int(np.asarray(index.start)), int(getattr(index, "stride", 1) or 1)
            where.append(slice(start, start + int(index.size) * stride, stride))
        else:
            value = np.asarray(index)
            if value.ndim:
                return UNKNOWN
            where.append(int(value))
    return np.asarray(ref)[tuple(where)]


def scalar_operand(value: Any) -> tuple[str, bytes]:
    """A kernel's scalar operand: (its HLO type, e.g. ``"s32[9]"``, its elements'
    little-endian bytes in C order)."""
    import numpy as np

    array = np.asarray(value)
    kind = {"i": "s", "u": "u", "f": "f", "b": "pred"}.get(array.dtype.kind, "?")
    bits = "" if kind == "pred" else str(array.dtype.itemsize * 8)
    data = np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()
    return f"{kind}{bits}[{','.join(map(str, array.shape))}]", data


def _ref_bytes(aval: Any) -> float:
    import numpy as np

    inner = getattr(aval, "inner_aval", aval)
    return float(math.prod(inner.shape) * np.dtype(inner.dtype).itemsize)


def _kernel_name(params: Any, number: int) -> str:
    info = params.get("name_and_src_info")
    name = getattr(info, "name", None) or params.get("name")
    return str(name) if name else f"pallas_call #{number}"
