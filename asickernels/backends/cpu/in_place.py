"""Eager routes that read the caller's numpy arrays where they are: the ``cpu`` backend's
``numpy_route``.

A compiled call takes a numpy argument through XLA's CPU client, which copies it into a
buffer of its own unless it is 64-byte aligned, which numpy's arrays are not as a rule: on
the GIOU gradient of 64x64 boxes (three inputs, 144 KiB) that copy makes the eager call
about 1.5x the same call on arrays already on the device. Where a signature's computation
reaches the native kernels through one FFI call on its inputs (as given, or reshaped: the
same bytes), :func:`numpy_route` compiles the computation again with that call replaced by
the in-place call (``csrc/in_place.cpp``): its one argument is a table of the inputs'
addresses, and it runs the same handler on the arrays at those addresses. XLA still
allocates the outputs, so nothing is handed over afterwards.

The route (:data:`asickernels.kernels.eager_front.InPlaceCall`, in C: a route in Python
would cost what it saves) waits for the results before it returns: until then the kernel
reads the caller's arrays, which the route holds. A later call whose arrays are not
C-contiguous and aligned for their dtype takes the compiled call instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend.core
import numpy as np

from asickernels.backends.cpu import _library
from asickernels.kernels import eager_front

Route = Callable[..., Any]

# What XLA's FFI calls these dtypes (XLA_FFI_DataType, which is XLA's PrimitiveType): the
# dtypes the native kernels take.
_FFI_DTYPES = {
    np.dtype(np.int8): 2,
    np.dtype(np.int32): 4,
    np.dtype(np.float32): 11,
    np.dtype(np.float64): 12,
}
# Equations that only wrap a jaxpr that an eager call runs as it is.
_WRAPPERS = frozenset({"pjit", "jit", "closed_call", "custom_vjp_call", "custom_jvp_call"})


class _NotInPlace(Exception):
    """The computation does something with an input other than reshape it and pass it to
    one of the library's FFI handlers."""


class _Input:
    """An input of the route, as the kernel will read it: its slot in the address table
    and its shape (a reshape changes the shape, not the bytes)."""

    def __init__(self, slot: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.slot, self.shape, self.dtype = slot, shape, dtype


def numpy_route(compiled: Route, present: Sequence[np.ndarray]) -> Route | None:
    """The in-place route of ``compiled`` (a jitted computation taking ``present``, the
    numpy inputs of one call, by position) for calls with arrays of the same shapes
    and dtypes; None where the computation does not make exactly one FFI call of the
    library on its inputs (see the module's docstring)."""
    if eager_front.InPlaceCall is None:
        return None
    closed, shapes = jax.make_jaxpr(compiled, return_shape=True)(*present)
    if any(
        np.dtype(v.aval.dtype) != a.dtype for v, a in zip(closed.jaxpr.invars, present, strict=True)
    ):
        return None  # JAX converts these inputs (int64 without x64): not the caller's bytes
    treedef = jax.tree.structure(shapes)
    targets = {_library.ffi_name(n): i for i, n in enumerate(_library.ffi_target_names())}
    inputs = [_Input(i, a.shape, a.dtype) for i, a in enumerate(present)]
    calls: list[str] = []

    def in_place(table: jax.Array) -> Any:
        calls.clear()
        outs = _evaluate(closed.jaxpr, closed.consts, inputs, table, targets, calls)
        return jax.tree.unflatten(treedef, outs)

    table_shape = jax.ShapeDtypeStruct((2 * len(present),), np.uint32)
    try:
        jax.make_jaxpr(in_place)(table_shape)
    except _NotInPlace:
        return None
    if len(calls) != 1:
        return None
    return eager_front.InPlaceCall(jax.jit(in_place), compiled)


def _evaluate(
    jaxpr: Any,
    consts: Sequence[Any],
    args: Sequence[Any],
    table: jax.Array,
    targets: dict[str, int],
    calls: list[str],
) -> list[Any]:
    """Runs ``jaxpr`` on ``args`` (values, or :class:`_Input` for the route's inputs),
    rebinding every equation that takes no input and turning the one FFI call on inputs
    into the in-place call on ``table``; :class:`_NotInPlace` for anything else done with
    an input."""
    env: dict[Any, Any] = dict(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))

    def read(var: Any) -> Any:
        return var.val if isinstance(var, jax.extend.core.Literal) else env[var]

    for eqn in jaxpr.eqns:
        values = [read(v) for v in eqn.invars]
        if any(isinstance(v, _Input) for v in values):
            outs = _on_inputs(eqn, values, table, targets, calls)
        else:
            params = eqn.primitive.get_bind_params(eqn.params)
            # Older JAX (0.7) returns (subfunctions, params), newer JAX the params alone.
            subfuns, params = params if isinstance(params, tuple) else ((), params)
            outs = eqn.primitive.bind(*subfuns, *values, **params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        env.update(zip(eqn.outvars, outs, strict=True))
    results = [read(v) for v in jaxpr.outvars]
    if any(isinstance(r, _Input) for r in results):
        raise _NotInPlace("an input is returned")
    return results


def _on_inputs(
    eqn: Any, values: list[Any], table: jax.Array, targets: dict[str, int], calls: list[str]
) -> list[Any]:
    """The outputs of one equation that takes some of the route's inputs."""
    name = eqn.primitive.name
    if name == "reshape" and eqn.params.get("dimensions") is None:
        (source,) = values
        return [_Input(source.slot, tuple(eqn.outvars[0].aval.shape), source.dtype)]
    if name in _WRAPPERS:
        inner = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
        if inner is None:
            raise _NotInPlace(f"{name} without a jaxpr")
        jaxpr, consts = (
            (inner.jaxpr, inner.consts)
            if isinstance(inner, jax.extend.core.ClosedJaxpr)
            else (inner, [])
        )
        return _evaluate(jaxpr, consts, values, table, targets, calls)
    if name == "ffi_call" and eqn.params["target_name"] in targets:
        calls.append(eqn.params["target_name"])
        return _in_place_call(eqn.params, values, table, targets)
    raise _NotInPlace(name)


def _in_place_call(
    params: dict[str, Any], values: list[Any], table: jax.Array, targets: dict[str, int]
) -> list[Any]:
    """The in-place call of one of the library's FFI calls whose arguments are all inputs."""
    if not all(isinstance(v, _Input) for v in values) or params["input_output_aliases"]:
        raise _NotInPlace("an FFI call on inputs and computed values, or with aliases")
    results = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in params["result_avals"]]
    if not all(map(_row_major, results, params["output_layouts"])):
        raise _NotInPlace("an FFI result that is not row-major")
    layout: list[int] = []
    for value, given_layout in zip(values, params["input_layouts"], strict=True):
        if value.dtype not in _FFI_DTYPES or not _row_major(value, given_layout):
            raise _NotInPlace("an FFI argument that is not a row-major array of a kernel dtype")
        layout += [value.slot, _FFI_DTYPES[value.dtype], len(value.shape), *value.shape]
    call = jax.ffi.ffi_call(
        _library.ffi_name(_library.IN_PLACE_TARGET),
        results,
        has_side_effect=params["has_side_effect"],
    )
    outs = call(
        table,
        **dict(params["attributes"]),
        in_place_target=np.int64(targets[params["target_name"]]),
        in_place_layout=np.array(layout, np.int64),
    )
    return list(outs)


def _row_major(array: Any, layout: Sequence[int] | None) -> bool:
    """Whether an ``ffi_call`` equation's layout of ``array`` (minor-to-major, as the
    equation keeps it; None for the default) is row-major, the order numpy's C-contiguous
    arrays and the in-place call's results have."""
    return layout is None or tuple(layout) == tuple(range(len(array.shape) - 1, -1, -1))
