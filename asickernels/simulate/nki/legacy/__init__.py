"""The legacy ``neuronxcc.nki`` API (Neuron SDK 2.20-2.27) on the strict CPU simulator.

Kernels written for that generation run unchanged: ``nki.jit``/``nki.trace``/
``nki.baremetal`` decorators, ``nki.simulate_kernel(kernel, *arrays)``, SPMD launch grids
``kernel[gx, gy]`` with ``nl.program_id``, index grids from ``nl.arange``/``nl.mgrid``,
``mask=``, ``nl.par_dim`` block dimensions, and high-level ``nl`` ops that return tiles::

    import asickernels.simulate.nki.legacy as nki
    from asickernels.simulate.nki.legacy import language as nl

    @nki.jit
    def double(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        tile = nl.load(x)
        nl.store(out, tile + tile)
        return out

(or ``python -m asickernels.simulate.nki script.py`` to run a script that imports
``neuronxcc.nki`` unchanged). Both output conventions work: returning ``shared_hbm`` tensors
(since the December 2024 beta) and writing output arguments in place (Neuron 2.20,
``nki.trace``; a ``nki.jit`` kernel writing a parameter not annotated ``nt.mutable_tensor``
warns, as the docs refuse it but devices ran it: :class:`errors.DeviceRanItWarning`).

Memory accounting, capacity checks, error classes and counters are the core simulator's
(:mod:`asickernels.simulate.nki`): ``nki.last_counters()`` after a run; the target is
trn1/inf2 unless ``NEURON_PLATFORM_TARGET_OVERRIDE`` says trn2 (:func:`legacy_target`).
Bfloat16 values are stored as bfloat16 (the SDK's simulator computes them at fp32
precision, general/nki/nki_known_issues.rst).
"""

from __future__ import annotations

import functools
import inspect
import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from asickernels.simulate.nki import benchmarking as _benchmark
from asickernels.simulate.nki import errors, runtime
from asickernels.simulate.nki.errors import (
    ErrMutableParameterNotReturned,
    ErrNestedKernelWithSpmdGrid,
)
from asickernels.simulate.nki.legacy import compiler, isa, language, spmd, typing
from asickernels.simulate.nki.legacy.tile import Tensor, argument
from asickernels.simulate.nki.legacy.tile import Tensor as tensor  # the SDK's nki.tensor
from asickernels.simulate.nki.runtime import last_counters

__all__ = [
    "Kernel",
    "baremetal",
    "benchmark",
    "compiler",
    "errors",
    "isa",
    "jit",
    "language",
    "last_counters",
    "profile",
    "simulate_kernel",
    "tensor",
    "trace",
    "typing",
]


class Kernel:
    """A legacy kernel: callable on NumPy arrays, ``kernel[g0, g1, ...]`` for a launch grid."""

    def __init__(
        self,
        function: Callable[..., Any],
        grid: tuple[int, ...] = (),
        parameters_writable: bool = False,
        platform_target: str | None = None,
    ) -> None:
        self.function = function
        self.grid = grid
        # nki.jit(platform_target='trn2'), as AWS's tests pass it (nki/test/*.py@81ce03a);
        # None: NEURON_PLATFORM_TARGET_OVERRIDE or trn1/inf2 (legacy_target).
        self.platform_target = platform_target
        # Neuron 2.20 (nki.trace) passed outputs as arguments; since then the docs make
        # parameters immutable unless annotated nt.mutable_tensor (nki.errors.rst,
        # err_cannot_update_immutable_parameter): writing one warns (tile.Storage).
        self.parameters_writable = parameters_writable
        functools.update_wrapper(self, function)

    def __getitem__(self, grid: Any) -> Kernel:
        """``kernel[g0, g1, ...]``: an SPMD launch grid of any rank and sizes."""
        sizes = grid if isinstance(grid, tuple) else (grid,)
        if not all(isinstance(s, (int, np.integer)) and s >= 1 for s in sizes):
            raise ValueError(f"SPMD launch grid sizes must be positive integers, got {grid!r}")
        return Kernel(
            self.function,
            tuple(int(s) for s in sizes),
            self.parameters_writable,
            self.platform_target,
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if runtime.in_kernel():  # a sub-kernel: inline it in the same program
            if self.grid:
                raise ErrNestedKernelWithSpmdGrid(
                    f"{self.function.__name__} is launched with grid {self.grid} inside a kernel"
                )
            return self.function(*args, **kwargs)
        return _run(self, args, kwargs)

    def mutable_parameters(self) -> set[str]:
        """The parameters annotated ``nt.mutable_tensor``."""
        try:
            annotations = inspect.get_annotations(self.function, eval_str=True)
        except Exception:  # unresolvable string annotations: read them as text
            annotations = dict(getattr(self.function, "__annotations__", {}))
        return {name for name, note in annotations.items() if _is_mutable(note)}


def _is_mutable(annotation: Any) -> bool:
    if isinstance(annotation, str):
        return "mutable_tensor" in annotation
    return annotation is typing.mutable_tensor or (
        isinstance(annotation, typing.TensorType) and annotation.mutable
    )


def jit(func: Callable[..., Any] | None = None, mode: str = "auto", **kwargs: Any) -> Any:
    """Decorates a kernel. Without a Neuron device every mode (``auto``, ``simulation``,
    ``baremetal``, ...) simulates it on NumPy arrays; ``platform_target`` (``trn1``,
    ``inf2``, ``trn2``) picks the simulated target; other options have no effect here."""
    target = kwargs.get("platform_target")
    if target is not None:
        legacy_target(target)  # a bad name fails at decoration, as the SDK's does
    if func is None:
        return lambda function: Kernel(function, platform_target=target)
    return Kernel(func, platform_target=target)


def trace(func: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
    """The Neuron 2.20 decorator used with :func:`simulate_kernel`: as :func:`jit`, but the
    kernel may write its parameters (2.20 passed outputs as arguments)."""
    if func is None:
        return lambda function: Kernel(function, parameters_writable=True)
    return Kernel(func, parameters_writable=True)


# Neuron 2.20 benchmarked undecorated functions that write their output arguments
# (general/nki/examples/matrix_multiplication/matrix_multiplication_nki_kernels.py@72825d5).
benchmark, profile = _benchmark.decorators(trace)


def baremetal(kernel: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
    """``nki.baremetal``: NumPy in, NumPy out; runs on the simulator here (``save_neff_name``
    and the other artifact options have no effect)."""
    return jit(kernel, **kwargs)


def simulate_kernel(kernel: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Runs ``kernel`` (decorated or not, possibly ``kernel[grid]``) on NumPy arrays and
    returns its return value as NumPy arrays. Output arguments are written in place (an
    undecorated function, as in 2.20, may write its parameters)."""
    launched = kernel if isinstance(kernel, Kernel) else Kernel(kernel, parameters_writable=True)
    return _run(launched, args, kwargs)


def legacy_target(platform_target: str | None = None) -> runtime.Target:
    """``platform_target`` if given, else ``NEURON_PLATFORM_TARGET_OVERRIDE`` if set, else
    NeuronCore-v2 (trn1/inf2). The neuronxcc.nki generation targets Inf2, Trn1 and Trn2
    ("This document is relevant for: Inf2, Trn1, Trn2" in its API reference); v2 has the
    smallest SBUF of those, so a kernel that fits here fits each of them (and v2 is the
    seed's inf2 hardware)."""
    if platform_target is not None:
        target = runtime.target_named(platform_target)
    elif not os.environ.get(runtime.TARGET_ENV, "").strip():
        return runtime.TARGETS[2]
    else:
        target = runtime.target_from_env()
    if target.version not in (2, 3):
        raise ValueError(
            f"neuronxcc.nki targets trn1/inf2 and trn2, not "
            f"NeuronCore-v{target.version} ({target.platforms}); use the current nki API"
        )
    return target


def _run(kernel: Kernel, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    run = runtime.start_run(target=legacy_target(kernel.platform_target))
    run.spills_when_full = True  # this generation's compiler spills (errors.SpillWarning)
    written_back: list[tuple[np.ndarray, np.ndarray]] = []

    mutable = kernel.mutable_parameters()
    names = _parameter_names(kernel.function, args, kwargs)

    def wrap(value: Any, position: str) -> Any:
        if not isinstance(value, np.ndarray):
            return value
        writable = kernel.parameters_writable or names.get(position) in mutable
        if value.flags.c_contiguous and value.flags.writeable:
            return argument(value, position, writable)
        contiguous = np.array(value, order="C")  # writable; copied back after the run
        if value.flags.writeable:
            written_back.append((value, contiguous))
        return argument(contiguous, position, writable)

    try:
        wrapped_args = [wrap(value, f"#{i}") for i, value in enumerate(args)]
        wrapped_kwargs = {key: wrap(value, key) for key, value in kwargs.items()}
        result = None
        with np.errstate(all="ignore"):  # IEEE results (inf, NaN) as the engines give them
            code = getattr(kernel.function, "__code__", None)  # None: a callable object
            for _ in spmd.programs(code, kernel.grid):
                result = kernel.function(*wrapped_args, **wrapped_kwargs)
        _check_mutable_returned(mutable, names, wrapped_args, wrapped_kwargs, result)
        for original, contiguous in written_back:
            original[...] = contiguous
        return _unwrap(result)
    finally:
        runtime.finish_run()
        runtime.publish_counters([run])


def _parameter_names(
    function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, str]:
    """Argument position (``#i`` or keyword) -> parameter name."""
    try:
        parameters = list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        parameters = []
    names = {f"#{i}": name for i, name in zip(range(len(args)), parameters, strict=False)}
    return names | {key: key for key in kwargs}


def _check_mutable_returned(
    mutable: set[str],
    names: dict[str, str],
    args: list[Any],
    kwargs: dict[str, Any],
    result: Any,
) -> None:
    """nki.errors.rst err_mutable_parameter_not_returned."""
    returned = result if isinstance(result, (tuple, list)) else (result,)
    storages = {id(v.storage) for v in returned if isinstance(v, Tensor)}
    passed = {f"#{i}": v for i, v in enumerate(args)} | kwargs
    for position, value in passed.items():
        is_mutable = isinstance(value, Tensor) and names.get(position) in mutable
        if is_mutable and id(value.storage) not in storages:
            raise ErrMutableParameterNotReturned(
                f"mutable parameter '{names[position]}' is not returned by the kernel"
            )


def _unwrap(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return type(value)(_unwrap(v) for v in value)
    if isinstance(value, Tensor):
        if value.on_chip:
            # Legacy kernels may return any HBM tensor (nki.simulate_kernel's own example
            # returns an nl.hbm one); the SDK's simulator also returns an on-chip tile's
            # values (nki/test/test_nki_isa_range_select.py@81ce03a), which a device would not.
            warnings.warn(
                f"a kernel returns {value!r}: on a Neuron device outputs must be HBM tensors "
                "(nl.shared_hbm); the simulator returns the tile's values",
                errors.OnChipOutputWarning,
                stacklevel=3,
            )
        return value.read()  # a new array (a copy of the view's values)
    return value
