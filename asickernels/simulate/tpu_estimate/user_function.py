"""TPU time estimates of the user's own function: any jitted function or Pallas kernel,
given example arguments (``asickernels estimate --function module:name --arg ...``).

libtpu reads its dump flags once per process, so the function is compiled in a fresh
process, which imports it by reference: define it at module level (a script run as
``__main__`` works too: the child loads the file without running its ``__main__`` block;
so does a module on a path only the caller has, loaded from its file).

Example::

    from asickernels.simulate.tpu_estimate import estimate_function
    for estimate in estimate_function(my_matmul, x, y, generations=("v5e", "v5p")):
        print(estimate.report())
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from asickernels.simulate.tpu_compile import Built
from asickernels.simulate.tpu_estimate import estimate as cost
from asickernels.simulate.tpu_estimate import observed

_MAIN_MODULE = "asickernels_estimated_main"
# Array arguments a function needs as values while it is traced are bound (and sent to the
# compile child) only up to this many elements each: metadata, not tensors.
MAX_BOUND_ELEMENTS = 1 << 16
_SPEC = re.compile(r"^\s*([A-Za-z0-9_]+)\s*\[\s*([0-9,\s]*)\]\s*$")


def parse_arg_spec(text: str) -> tuple[tuple[int, ...], str]:
    """``"bfloat16[1024,512]"`` -> ``((1024, 512), "bfloat16")``; ``"int32[]"`` is a
    scalar. ValueError naming the text otherwise."""
    import jax.numpy as jnp

    match = _SPEC.match(text)
    if not match:
        raise ValueError(f"--arg {text!r}: expected DTYPE[D0,D1,...], e.g. bfloat16[1024,1024]")
    dtype, dims = match.group(1), match.group(2)
    try:
        jnp.dtype(dtype)
    except TypeError:
        raise ValueError(f"--arg {text!r}: unknown dtype {dtype!r}") from None
    shape = tuple(int(d) for d in dims.split(",") if d.strip())
    return shape, dtype


def function_reference(function: Callable[..., Any] | str) -> tuple[str, str | None]:
    """(``"module:qualified.name"``, the script's path when the module is ``__main__``)
    for a function defined at module level; ValueError saying why otherwise."""
    if isinstance(function, str):
        if ":" not in function:
            raise ValueError(f"function {function!r}: expected 'module:name'")
        return function, None
    module = getattr(function, "__module__", None)
    qualname = getattr(function, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        raise ValueError(
            f"function {function!r}: the estimate compiles in a fresh process and imports the "
            "function there, so it must be defined at module level (not a lambda, closure or "
            "method); pass functools.partial(module_level_function, **static_kwargs) for "
            "arguments fixed at trace time"
        )
    path = getattr(sys.modules.get(module), "__file__", None)
    if module == "__main__" and path is None:
        raise ValueError(
            f"function {qualname!r} lives in an interactive session: define it in a module "
            "or script file"
        )
    return f"{module}:{qualname}", path


def build(
    reference: str,
    arg_specs: Sequence[Sequence[Any]],
    path: str | None = None,
    static_kwargs: Mapping[str, Any] | None = None,
    fixed: Mapping[str, tuple[str, Any]] | None = None,
) -> Built:
    """The compile child's side: imports ``reference`` (by name, else from the file at
    ``path``: a script, or a module on a path only the caller had) and returns it with its
    argument specs. ``fixed``: argument position -> (dtype, nested list), arguments the
    function needs as values at trace time: bound to them (constants of the program) and
    left out of the specs."""
    module_name, _, qualname = reference.partition(":")
    module: Any = None
    if module_name != "__main__":
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            if path is None:
                raise
    if module is None:
        if path is None:
            raise ValueError(f"{reference}: no file to load __main__ from")
        spec = importlib.util.spec_from_file_location(_MAIN_MODULE, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[_MAIN_MODULE] = module
        spec.loader.exec_module(module)
    function: Any = module
    for part in qualname.split("."):
        function = getattr(function, part)
    if static_kwargs:  # JSON made their tuples lists: jit needs them hashable again
        function = functools.partial(
            function, **{key: _tuples(value) for key, value in static_kwargs.items()}
        )
    specs = [(tuple(shape), str(dtype)) for shape, dtype in arg_specs]
    if fixed:
        import jax.numpy as jnp

        values = {int(key): jnp.asarray(data, dtype) for key, (dtype, data) in fixed.items()}
        function = with_values(function, values, len(specs))
        specs = [spec for position, spec in enumerate(specs) if position not in values]
    return function, specs


def with_values(
    function: Callable[..., Any], values: Mapping[int, Any], count: int
) -> Callable[..., Any]:
    """``function`` of ``count`` arguments with those at the positions of ``values`` bound
    to them: it takes the others, in order."""

    def bound(*others: Any) -> Any:
        rest = iter(others)
        return function(*(values[n] if n in values else next(rest) for n in range(count)))

    return bound


def _tuples(value: Any) -> Any:
    return tuple(_tuples(item) for item in value) if isinstance(value, list) else value


def _spec_of(argument: Any) -> tuple[tuple[int, ...], str]:
    shape, dtype = getattr(argument, "shape", None), getattr(argument, "dtype", None)
    if shape is None or dtype is None:
        raise ValueError(
            f"example argument {argument!r}: expected an array or jax.ShapeDtypeStruct "
            "(anything with .shape and .dtype)"
        )
    import jax.numpy as jnp

    return tuple(int(d) for d in shape), str(jnp.dtype(dtype))


def estimate_function(
    function: Callable[..., Any] | str,
    *example_args: Any,
    generations: Sequence[str] = cost.DEFAULT_GENERATIONS,
    name: str | None = None,
    loop_trips: Mapping[str, Mapping[int, Any]] | None = None,
) -> list[cost.Estimate]:
    """Compiles ``function(*example_args)`` for each of ``generations`` with libtpu and
    estimates its time from the schedule (:class:`~.estimate.Estimate`; ``.report()``
    prints device time, floor, bound, per-call time and every assumption).

    ``function``: defined at module level (or ``"module:name"``), or a
    ``functools.partial`` of one with JSON-able keyword arguments (trace-time constants
    such as block sizes). ``example_args``: arrays, or ``jax.ShapeDtypeStruct`` for shapes
    only, in any mix: arrays for what decides control flow (group sizes, a block mask),
    shapes for the big tensors. The function runs on CPU (Pallas kernels in interpret
    mode, :mod:`.observed`) as far as the arrays (and its own constants) decide: it counts
    the trips of its ``while`` loops and, inside each Pallas kernel, the grid steps and the
    scalar operands (grid bounds, scalar-prefetch arrays) that the schedule walk then
    follows step by step, and how often each branch or loop that depends on tensor data
    ran. What follows from shape-only arguments is not computed: such loops are assumed
    to run once and such branches to run their region, and the estimate says so. A
    function that needs its array arguments as values while it is traced (a wrapper that
    validates them, or sizes a grid from them on the host) gets them as values: bound as
    constants of the compiled program, and the estimate says so. ``loop_trips``: trips for
    loops whose exit depends on data, as :class:`~.estimate.EstimateTarget` takes them
    (they win over counted ones). Raises ValueError for a function or argument it cannot
    use, :class:`~.estimate.EstimateError` when libtpu refuses the program.
    """
    import jax

    static: dict[str, Any] = {}
    if isinstance(function, functools.partial):
        if function.args:
            raise ValueError("functools.partial: give fixed arguments by keyword")
        static = dict(function.keywords)
        function = function.func
    reference, path = function_reference(function)
    unknown = [g for g in generations if g not in cost.GENERATIONS]
    if unknown:
        raise ValueError(f"generations {unknown}: known {sorted(cost.GENERATIONS)}")
    specs = [_spec_of(argument) for argument in example_args]
    if isinstance(function, str):
        runnable = build(reference, specs, path, static)[0]
    else:
        runnable = functools.partial(function, **static) if static else function
    args, fixed, fixed_note = _trace_time_values(runnable, example_args)
    if fixed:
        runnable = with_values(runnable, fixed, len(example_args))
    seen, run_note = _observe(runnable, args)
    kwargs: dict[str, Any] = {"reference": reference, "arg_specs": specs}
    if path is not None:
        kwargs["path"] = path
    if static:
        kwargs["static_kwargs"] = static
    if fixed:
        kwargs["fixed"] = {
            str(n): (str(value.dtype), jax.numpy.asarray(value).tolist())
            for n, value in fixed.items()
        }
    target = cost.EstimateTarget(
        name or reference.partition(":")[2],
        f"{__name__}:build",
        tuple(kwargs.items()),
        tuple((program, tuple(entries.items())) for program, entries in (loop_trips or {}).items()),
        observed_trips=seen.while_trips,
        kernel_runs=seen.kernels,
        # What the compiled program takes as parameters (values bound at trace time are its
        # constants): the walk computes with the small ones' values.
        arguments=tuple(
            cost.argument(value) for n, value in enumerate(example_args) if n not in fixed
        ),
    )
    estimates = [cost.estimate_case(target, generation) for generation in generations]
    for estimate in estimates:
        estimate.assumptions += tuple(note for note in (fixed_note, run_note) if note)
    return estimates


def _trace_time_values(
    function: Callable[..., Any], example_args: Sequence[Any]
) -> tuple[list[Any], dict[int, Any], str]:
    """The arguments to trace ``function`` with, and the array arguments it needs as values
    while it is traced (position -> array; none if it traces with them abstract), with a
    sentence saying so. ValueError when it traces neither way."""
    import jax

    try:
        jax.eval_shape(function, *example_args)
        return list(example_args), {}, ""
    except Exception as error:  # the function's own code refused abstract arguments
        first = f"{type(error).__name__}: {_first_line(error)}"
        arrays = {
            n: jax.numpy.asarray(a)
            for n, a in enumerate(example_args)
            if not isinstance(a, jax.ShapeDtypeStruct) and math.prod(a.shape) <= MAX_BOUND_ELEMENTS
        }
        if not arrays:
            raise ValueError(
                f"the function cannot be traced with these example arguments ({first}); if "
                "it needs some of them as values while it is traced, pass those as arrays "
                f"(of at most {MAX_BOUND_ELEMENTS} elements; big tensors as shapes)"
            ) from error
    shapes = [
        jax.ShapeDtypeStruct(*_spec_of(a)) for n, a in enumerate(example_args) if n not in arrays
    ]
    try:
        jax.eval_shape(with_values(function, arrays, len(example_args)), *shapes)
    except Exception as again:
        raise ValueError(
            f"the function cannot be traced with these example arguments ({first}), nor "
            f"with its array arguments as values ({type(again).__name__}: "
            f"{_first_line(again)})"
        ) from again
    named = ", ".join(f"#{n} {_spec_of(a)[1]}{list(_spec_of(a)[0])}" for n, a in arrays.items())
    return (
        shapes,
        arrays,
        f"the function needs its array arguments as values while it is traced ({first}): "
        f"argument(s) {named} are bound to their example values, constants of the compiled "
        "program (XLA may fold what it computes from them)",
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:160] if text else ""


def _observe(
    function: Callable[..., Any], example_args: Sequence[Any]
) -> tuple[observed.Observed, str]:
    """What a run of the function on the example inputs (on CPU, Pallas kernels in
    interpret mode) saw of its data-dependent loops and branches, and a sentence saying
    how it was obtained."""
    import jax

    from asickernels.pallas_home import pltpu

    try:
        with jax.default_device(jax.devices("cpu")[0]), pltpu.force_tpu_interpret_mode():
            seen = observed.observe(function, list(example_args))
    except Exception as error:  # the user's function failed on CPU: say so, estimate anyway
        return observed.Observed(), (
            f"running the example inputs on CPU failed ({type(error).__name__}: "
            f"{_first_line(error)}): nothing counted"
        )
    trips = seen.while_trips
    shown = ", ".join("?" if t is None else str(t) for t in trips[:8])
    notes = [
        f"ran the example inputs on CPU: {len(trips)} while-loop entr"
        f"{'y' if len(trips) == 1 else 'ies'} outside Pallas kernels"
        + (f" ({shown}{', ...' if len(trips) > 8 else ''} trips; ?: not counted)" if trips else "")
    ]
    counted = [kernel for kernel in seen.kernels if not kernel.uncounted]
    notes.append(
        f"{len(counted)} of {len(seen.kernels)} Pallas kernel(s) counted"
        if seen.kernels
        else "the run met no Pallas kernel"
    )
    notes += [kernel.describe() for kernel in seen.kernels]
    notes += list(seen.notes)
    return seen, "; ".join(notes)
