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
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from asickernels.simulate.tpu_compile import Built
from asickernels.simulate.tpu_estimate import estimate as cost
from asickernels.simulate.tpu_estimate import observed

_MAIN_MODULE = "asickernels_estimated_main"
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
) -> Built:
    """The compile child's side: imports ``reference`` (by name, else from the file at
    ``path``: a script, or a module on a path only the caller had) and returns it with its
    argument specs."""
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
    if static_kwargs:
        function = functools.partial(function, **static_kwargs)
    return function, [(tuple(shape), str(dtype)) for shape, dtype in arg_specs]


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
    such as block sizes). ``example_args``: arrays (the function then runs on them on
    CPU, Pallas kernels in interpret mode, to count the trips of its ``while`` loops and,
    inside Pallas kernels, the grid steps and how often each branch or loop that depends
    on loaded values ran: :mod:`.observed`), or ``jax.ShapeDtypeStruct`` (shapes only:
    such loops are assumed to run once and such branches to run their region, and the
    estimate says so). A mix works too where the shapes-only arguments feed only Pallas
    kernels whose outputs nothing later reads (the run counts such a kernel's control
    flow without executing it): arrays for what decides control flow (a block mask, group
    sizes), shapes for the big tensors. ``loop_trips``: trips for loops whose exit depends on
    data, as :class:`~.estimate.EstimateTarget` takes them (unlisted ones are assumed to
    run once, and the estimate says so). Raises ValueError for a function or argument it
    cannot use, :class:`~.estimate.EstimateError` when libtpu refuses the program.
    """
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
    observed, run_note = _observe(runnable, example_args)
    kwargs: dict[str, Any] = {"reference": reference, "arg_specs": specs}
    if path is not None:
        kwargs["path"] = path
    if static:
        kwargs["static_kwargs"] = static
    target = cost.EstimateTarget(
        name or reference.partition(":")[2],
        f"{__name__}:build",
        tuple(kwargs.items()),
        tuple((program, tuple(entries.items())) for program, entries in (loop_trips or {}).items()),
        observed_trips=observed.while_trips,
        kernel_runs=observed.kernels,
    )
    estimates = [cost.estimate_case(target, generation) for generation in generations]
    for estimate in estimates:
        estimate.assumptions += (run_note,)
    return estimates


def _observe(
    function: Callable[..., Any], example_args: Sequence[Any]
) -> tuple[observed.Observed, str]:
    """What a run of the function on the example inputs (on CPU, Pallas kernels in
    interpret mode) saw of its data-dependent loops and branches, and a sentence saying
    how it was obtained."""
    import jax
    from jax.experimental.pallas import tpu as pltpu

    if all(isinstance(a, jax.ShapeDtypeStruct) for a in example_args) and example_args:
        kernels = "; ".join(observed.kernel_points(function, example_args))
        return observed.Observed(), (
            "example arguments are shapes only: while loops, and branches and loops inside "
            "Pallas kernels, whose outcome depends on data are not counted (pass arrays to "
            "count them from a run on CPU)" + (f"; {kernels}" if kernels else "")
        )
    try:
        with jax.default_device(jax.devices("cpu")[0]), pltpu.force_tpu_interpret_mode():
            seen = observed.observe(function, list(example_args))
    except Exception as error:  # the user's function failed on CPU: say so, estimate anyway
        first = str(error).strip().splitlines()[0][:160] if str(error).strip() else ""
        return observed.Observed(), (
            f"running the example inputs on CPU failed ({type(error).__name__}: {first})"
        )
    trips = seen.while_trips
    notes = [
        f"ran the example inputs on CPU: {len(trips)} while-loop entr"
        f"{'y' if len(trips) == 1 else 'ies'} outside Pallas kernels counted"
        + (
            f" ({', '.join(map(str, trips[:8]))}{', ...' if len(trips) > 8 else ''} trips)"
            if trips
            else ""
        )
    ]
    notes += [kernel.describe() for kernel in seen.kernels]
    return seen, "; ".join(notes)
