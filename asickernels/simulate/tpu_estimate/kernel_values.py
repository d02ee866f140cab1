"""A Pallas kernel body run with its values, one grid step at a time, counting every loop
and branch whose outcome depends on data.

:mod:`.observed` computes only the control part of a body (grid indices, scalar-prefetch
loads), so a branch or loop whose predicate depends on a tensor block (``while
cost[row] < best``) is left uncounted there. Here the body's jaxpr is evaluated whole:
an interpreter turns it into a pure function of the step's blocks (refs become arrays
threaded through every loop and branch, as Pallas's interpret mode does), with a counter
per control point carried along, and ``jax.jit`` compiles that once per kernel. Each grid
step then runs compiled on CPU on the blocks its index maps select, writing its output
blocks back, so a later step sees what an earlier one wrote.

Not covered (:class:`Unsupported`, and the caller keeps the control-only counts): DMAs,
semaphores and other TPU-only primitives, gathers through array indices on refs, block
shapes other than blocked/squeezed/element. A run that exceeds :data:`MAX_SECONDS` stops
and is not used.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

# A full run of one kernel call that takes longer than this is abandoned (the control-only
# counts stand, and the estimate says the loops were assumed).
MAX_SECONDS = 120.0
# Primitives that call a sub-jaxpr (:func:`call_jaxpr`), evaluated inline.
CALLS = (
    "pjit",
    "jit",
    "closed_call",
    "core_call",
    "remat",
    "checkpoint",
    "custom_jvp_call",
    "custom_vjp_call",
)


class Unsupported(Exception):
    """The body uses something this interpreter cannot run; the message says what."""


@dataclasses.dataclass(frozen=True)
class _Ref:
    slot: int  # index into the state's ref arrays


def scan_counts(params: Any) -> tuple[int, int]:
    """(constants, carries) of a ``scan`` equation: ``num_consts``/``num_carry`` up to jax
    0.11, the leaf counts of ``ft_in``'s parts from jax 0.12."""
    if "num_consts" in params:
        return int(params["num_consts"]), int(params["num_carry"])
    consts, carry, _ = params["ft_in"].unpack()
    return len(list(consts.vals)), len(list(carry.vals))


def while_operands(
    params: Any, values: list[Any]
) -> tuple[Any, list[Any], Any, list[Any], list[Any]]:
    """A ``while`` equation's ``(cond, cond constants, body, body constants, carry)``: its
    closed jaxprs from ``params``, the rest split from its operand ``values``."""
    n_cond, n_body = params["cond_nconsts"], params["body_nconsts"]
    cond_consts, body_consts = values[:n_cond], values[n_cond : n_cond + n_body]
    return (
        params["cond_jaxpr"],
        cond_consts,
        params["body_jaxpr"],
        body_consts,
        values[n_cond + n_body :],
    )


def evaluate(
    jaxpr: Any,
    consts: Sequence[Any],
    args: Sequence[Any],
    equation: Callable[[Any, list[Any], Any], tuple[list[Any], Any]],
    state: Any = None,
) -> tuple[list[Any], Any]:
    """Runs ``jaxpr`` one equation at a time through ``equation(eqn, input values, state) ->
    (output values, state)``: the interpreters' shared loop. Returns (outputs, final state)."""
    import jax.extend as jex

    env: dict[Any, Any] = {}

    def read(var: Any) -> Any:
        return var.val if isinstance(var, jex.core.Literal) else env[var]

    env.update(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for eqn in jaxpr.eqns:
        outputs, state = equation(eqn, [read(var) for var in eqn.invars], state)
        env.update(zip(eqn.outvars, outputs, strict=True))
    return [read(var) for var in jaxpr.outvars], state


class _Body:
    """Evaluates a kernel body's jaxpr on traced values: ``state`` is (ref arrays,
    counters [points, 3]: entries, trips or regions run, entries with zero trips)."""

    def __init__(self, order: dict[int, int], step: Sequence[Any], grid: Sequence[int]) -> None:
        self.order, self.step, self.grid = order, step, grid

    def jaxpr(
        self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], state: Any
    ) -> tuple[list[Any], Any]:
        return evaluate(jaxpr, consts, args, self.equation, state)

    def count(self, eqn: Any, state: Any, taken: Any, empty: Any = 0) -> Any:
        import jax.numpy as jnp

        point = self.order.get(id(eqn))
        if point is None:
            return state
        refs, counters = state
        row = jnp.stack(
            [jnp.float32(1), jnp.asarray(taken, jnp.float32), jnp.asarray(empty, jnp.float32)]
        )
        return refs, counters.at[point].add(row)

    def equation(self, eqn: Any, values: list[Any], state: Any) -> tuple[list[Any], Any]:
        import jax.numpy as jnp
        from jax import lax

        name, params = eqn.primitive.name, eqn.params
        if name == "program_id":
            return [self.step[params["axis"]]], state
        if name == "num_programs":
            return [jnp.int32(self.grid[params["axis"]])], state
        if name == "multiple_of":
            return [values[0]], state
        if name in ("get", "swap", "addupdate"):
            return _ref_op(name, params, values, state)
        if name == "run_scoped":
            return self._run_scoped(params, values, state)
        if name == "while":
            return self._while(eqn, values, state)
        if name == "scan":
            return self._scan(eqn, values, state)
        if name == "cond":
            index, operands = values[0], values[1:]
            branches = [self._branch(branch, operands) for branch in params["branches"]]
            index = jnp.clip(jnp.asarray(index, jnp.int32), 0, len(branches) - 1)
            outputs, state = lax.switch(index, branches, state)
            return list(outputs), self.count(eqn, state, index != 0)
        if name in CALLS:
            inner = call_jaxpr(params)
            if inner is not None:
                return self.jaxpr(inner.jaxpr, inner.consts, values, state)
        if any(isinstance(value, _Ref) for value in values):
            raise Unsupported(f"primitive {name!r} on a ref")
        try:
            result = eqn.primitive.bind(*values, **params)
        except Exception as error:
            raise Unsupported(f"primitive {name!r}: {type(error).__name__}") from None
        return (list(result) if eqn.primitive.multiple_results else [result]), state

    def _branch(self, branch: Any, operands: list[Any]) -> Callable[[Any], Any]:
        def run(state: Any) -> Any:
            outputs, state = self.jaxpr(branch.jaxpr, branch.consts, operands, state)
            return outputs, state

        return run

    def _while(self, eqn: Any, values: list[Any], state: Any) -> tuple[list[Any], Any]:
        import jax.numpy as jnp
        from jax import lax

        cond, cond_consts, body, body_consts, carry = while_operands(eqn.params, values)
        if any(isinstance(value, _Ref) for value in carry):
            raise Unsupported("a ref carried through a while loop")

        def test(loop: Any) -> Any:
            carry, state, _ = loop
            (go,), _ = self.jaxpr(cond.jaxpr, cond.consts, [*cond_consts, *carry], state)
            return go

        def step(loop: Any) -> Any:
            carry, state, trips = loop
            carry, state = self.jaxpr(body.jaxpr, body.consts, [*body_consts, *carry], state)
            return carry, state, trips + 1

        typed = [
            jnp.asarray(value, var.aval.dtype)
            for value, var in zip(carry, eqn.invars[len(values) - len(carry) :], strict=True)
        ]
        carry, state, trips = lax.while_loop(test, step, (typed, state, jnp.int32(0)))
        return list(carry), self.count(eqn, state, trips, trips == 0)

    def _scan(self, eqn: Any, values: list[Any], state: Any) -> tuple[list[Any], Any]:
        import jax.numpy as jnp
        from jax import lax

        params = eqn.params
        n_consts, n_carry = scan_counts(params)
        consts, carry = values[:n_consts], values[n_consts : n_consts + n_carry]
        xs = values[n_consts + n_carry :]
        body, length = params["jaxpr"], params["length"]
        if any(isinstance(value, _Ref) for value in [*carry, *xs]):
            raise Unsupported("a ref carried through a scan")

        def step(i: Any, loop: Any) -> Any:
            carry, ys, state = loop
            at = length - 1 - i if params["reverse"] else i
            x = [lax.dynamic_index_in_dim(v, at, keepdims=False) for v in xs]
            out, state = self.jaxpr(body.jaxpr, body.consts, [*consts, *carry, *x], state)
            new_ys = [
                lax.dynamic_update_index_in_dim(column, y, at, 0)
                for column, y in zip(ys, out[n_carry:], strict=True)
            ]
            return out[:n_carry], new_ys, state

        ys = [
            jnp.zeros((length, *var.aval.shape[1:]), var.aval.dtype)
            for var in eqn.outvars[n_carry:]
        ]
        typed = [
            jnp.asarray(value, var.aval.dtype)
            for value, var in zip(carry, eqn.invars[n_consts : n_consts + n_carry], strict=True)
        ]
        start = (typed, ys, state)
        carry, ys, state = lax.fori_loop(0, length, step, start)
        return [*carry, *ys], state

    def _run_scoped(self, params: Any, values: list[Any], state: Any) -> tuple[list[Any], Any]:
        body = params["jaxpr"]
        refs, counters = state
        scoped = [_zeros(var.aval) for var in body.invars[len(values) :]]
        slots = [_Ref(len(refs) + n) for n in range(len(scoped))]
        outputs, (refs, counters) = self.jaxpr(
            body, (), [*values, *slots], ([*refs, *scoped], counters)
        )
        return outputs, (refs[: len(refs) - len(scoped)], counters)


def call_jaxpr(params: Any) -> Any:
    """The closed jaxpr a call primitive's ``params`` hold (None: none)."""
    inner = params.get("jaxpr") or params.get("call_jaxpr") or params.get("fun_jaxpr")
    if inner is None:
        return None
    if not hasattr(inner, "consts"):
        import jax.extend as jex

        inner = jex.core.ClosedJaxpr(inner, [])
    return inner


def _zeros(aval: Any) -> Any:
    import jax.numpy as jnp

    inner = getattr(aval, "inner_aval", aval)
    try:
        return jnp.zeros(inner.shape, inner.dtype)
    except TypeError:
        raise Unsupported(f"scratch of type {inner}") from None


def _ref_op(name: str, params: Any, values: list[Any], state: Any) -> tuple[list[Any], Any]:
    """``get``/``swap``/``addupdate`` on a ref held in ``state`` (static slices, dynamic
    starts and scalar indices)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    ref, rest = values[0], values[1:]
    if not isinstance(ref, _Ref):
        raise Unsupported(f"{name} on a value that is not a kernel ref")
    refs, counters = state
    array = refs[ref.slot]
    new = None
    if name in ("swap", "addupdate"):
        new, rest = rest[0], rest[1:]
    transforms = jax.tree_util.tree_unflatten(params["tree"], rest)
    transforms = tuple(transforms) if isinstance(transforms, (tuple, list)) else (transforms,)
    if len(transforms) > 1 or (transforms and not hasattr(transforms[0], "indices")):
        raise Unsupported(f"{name} through {type(transforms[-1]).__name__}")
    starts, sizes, squeeze = [], [], []
    for axis, index in enumerate(transforms[0].indices if transforms else ()):
        if hasattr(index, "start") and hasattr(index, "size"):
            if int(getattr(index, "stride", 1) or 1) != 1:
                raise Unsupported(f"{name} with a strided slice")
            starts.append(jnp.asarray(index.start, jnp.int32))
            sizes.append(int(index.size))
        elif jnp.ndim(index) == 0:
            starts.append(jnp.asarray(index, jnp.int32))
            sizes.append(1)
            squeeze.append(axis)
        else:
            raise Unsupported(f"{name} with an array index")
    for axis in range(len(starts), array.ndim):
        starts.append(jnp.int32(0))
        sizes.append(array.shape[axis])
    old = lax.dynamic_slice(array, starts, sizes)
    result = jnp.squeeze(old, tuple(squeeze)) if squeeze else old
    if new is not None:
        written = new if name == "swap" else result + new
        written = jnp.reshape(jnp.asarray(written, array.dtype), sizes)
        refs = [*refs]
        refs[ref.slot] = lax.dynamic_update_slice(array, written, starts)
    return ([] if name == "addupdate" else [result]), (refs, counters)


# --------------------------------------------------------------------------------------
# The grid
# --------------------------------------------------------------------------------------


def _block_layout(mapping: Any) -> list[tuple[int, bool, bool]]:
    """Per dimension of a block mapping: (block size, squeezed, element-indexed)."""
    layout = []
    for entry in mapping.block_shape:
        kind = type(entry).__name__
        if entry is None or kind == "Squeezed":
            layout.append((1, True, False))
        elif kind == "Blocked" or isinstance(entry, int):
            layout.append((int(getattr(entry, "block_size", entry)), False, False))
        elif kind == "Element" and not any(getattr(entry, "padding", (0, 0)) or (0, 0)):
            layout.append((int(entry.block_size), False, True))
        else:
            raise Unsupported(f"block dimension {entry!r}")
    return layout


class _Blocks:
    """One operand's blocks: slices of its array (padded to whole blocks) at a step's
    block index, squeezed dimensions dropped as the kernel sees them."""

    def __init__(self, mapping: Any, array: Any) -> None:
        import numpy as np

        self.layout = _block_layout(mapping)
        array = np.asarray(array)
        padded = [
            dim + size if element else -(-dim // size) * size
            for dim, (size, _, element) in zip(array.shape, self.layout, strict=True)
        ]
        self.array = np.zeros(padded, array.dtype)
        self.array[tuple(slice(0, dim) for dim in array.shape)] = array
        self.kept = [size for size, squeezed, _ in self.layout if not squeezed]

    def _where(self, index: Sequence[int]) -> tuple[slice, ...]:
        starts = [
            i if element else i * size
            for i, (size, _, element) in zip(index, self.layout, strict=True)
        ]
        return tuple(
            slice(start, start + size)
            for start, (size, _, _) in zip(starts, self.layout, strict=True)
        )

    def read(self, index: Sequence[int]) -> Any:
        return self.array[self._where(index)].reshape(self.kept)

    def write(self, index: Sequence[int], block: Any) -> None:
        import numpy as np

        where = self._where(index)
        self.array[where] = np.asarray(block).reshape(self.array[where].shape)


def run_grid(
    eqn: Any,
    values: Sequence[Any],
    order: dict[int, int],
    grid: tuple[int, ...],
    block_indices: Sequence[Sequence[tuple[int, ...]]],
    deadline: float | None = None,
) -> list[Any]:
    """Runs a ``pallas_call`` equation's body over its grid on CPU with ``values`` (its
    operands: dynamic grid bounds, scalar-prefetch arrays, inputs); ``block_indices``: per
    step, each block mapping's (inputs', then outputs') block index. Returns per step (in
    grid order) the counters of the points ``order`` numbers: an array [points, 3] of
    entries, trips taken or regions run, and entries with no trip. Raises
    :class:`Unsupported` when it cannot, TimeoutError past ``deadline``
    (``time.monotonic()``)."""
    import itertools

    import jax
    import jax.numpy as jnp
    import numpy as np

    params = eqn.params
    mapping = params["grid_mapping"]
    dynamic = int(getattr(mapping, "num_dynamic_grid_bounds", 0) or 0)
    n_prefetch = int(getattr(mapping, "num_index_operands", 0) or 0)
    n_in = int(mapping.num_inputs)
    n_out = int(mapping.num_outputs)
    body = params["jaxpr"]
    body_consts = list(getattr(body, "consts", []))
    body = getattr(body, "jaxpr", body)
    if any(value is None or not hasattr(value, "dtype") for value in values):
        raise Unsupported("an operand without a value")
    if any(type(value).__name__ == "ShapeDtypeStruct" for value in values):
        raise Unsupported("an operand given as a shape only")
    prefetch = [np.asarray(v) for v in values[dynamic : dynamic + n_prefetch]]
    inputs = values[dynamic + n_prefetch :]
    blocks = list(mapping.block_mappings)
    ins = [_Blocks(blocks[n], inputs[n]) for n in range(n_in)]
    aliases = dict(params.get("input_output_aliases") or ())
    outs = []
    for n, aval in enumerate(params.get("out_avals", ())):
        source = next((i for i, o in aliases.items() if o == n), None)
        start = (
            np.asarray(inputs[source - n_prefetch])
            if source is not None
            else np.zeros(aval.shape, aval.dtype)
        )
        outs.append(_Blocks(blocks[n_in + n], start))
    if len(outs) != n_out:
        raise Unsupported("outputs not described by out_avals")
    scratch_avals = [var.aval for var in body.invars[n_prefetch + n_in + n_out :]]

    def step_fn(ids: Any, refs: list[Any]) -> Any:
        interpreter = _Body(order, [ids[axis] for axis in range(len(grid))], grid)
        counters = jnp.zeros((max(len(order), 1), 3), jnp.float32)
        slots = [_Ref(n) for n in range(len(refs))]
        _, (refs, counters) = interpreter.jaxpr(body, body_consts, slots, (refs, counters))
        return refs, counters

    compiled = jax.jit(step_fn)
    scratch = [_zeros(aval) for aval in scratch_avals]
    counts = []
    for number, index in enumerate(itertools.product(*map(range, grid))):
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"stopped after {number} of {len(block_indices)} grid steps")
        keys = block_indices[number]
        refs = [
            *prefetch,
            *(blocks.read(key) for blocks, key in zip(ins, keys[:n_in], strict=True)),
            *(blocks.read(key) for blocks, key in zip(outs, keys[n_in:], strict=True)),
            *scratch,
        ]
        refs, counters = compiled(np.asarray(index, np.int32), refs)
        done = n_prefetch + n_in
        for out, key, block in zip(outs, keys[n_in:], refs[done : done + n_out], strict=True):
            out.write(key, block)
        scratch = list(refs[done + n_out :])
        counts.append(np.asarray(counters))
    return counts
