"""A strict CPU simulator of the NKI subset asickernels' kernels use.

Mirrors the current ``nki`` package (``nki.jit``, ``nki.simulate``, ``nki.language``,
``nki.isa``) so the same kernel source runs here and on a Neuron device::

    from asickernels.simulate import nki
    from asickernels.simulate.nki import isa as nisa, language as nl

    @nki.jit
    def double(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        tile = nl.load(x)
        nl.store(out, nl.add(tile, tile))
        return out

    double(np.ones((128, 4), np.float32))       # runs on the CPU
    nki.last_counters()                         # instructions per engine, DMA bytes

Kernels run eagerly on numpy (bfloat16 via ml_dtypes). Unlike the SDK's simulator, this
one enforces the hardware's limits and raises the errors in :mod:`.errors`: partitions
<= 128, PSUM banks (2 KiB per partition, 8 live), SBUF capacity of the target across live
allocations (``NEURON_PLATFORM_TARGET_OVERRIDE``: trn1/inf2 192 KiB, trn2 224 KiB, trn3
256 KiB per partition; default trn1/inf2), matmul tile sizes and dtypes, memory spaces of
every operand, reductions over free axes only, out-of-bound indexing. New memory reads as
NaN (integers: 4), as in the SDK's simulator.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from asickernels.simulate.nki import errors, isa, language, runtime
from asickernels.simulate.nki.runtime import last_counters
from asickernels.simulate.nki.tensor import MemoryRegion, NkiTensor, wrap_argument

__all__ = ["Kernel", "errors", "isa", "jit", "language", "last_counters", "simulate"]


class Kernel:
    """A kernel function made callable on numpy arrays (see :func:`jit`)."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function
        functools.update_wrapper(self, function)

    def __getitem__(self, lnc: int) -> Kernel:
        """``kernel[lnc]``: only LNC=1 (one NeuronCore) is simulated."""
        if lnc != 1:
            raise NotImplementedError(
                f"the simulator runs kernels on one NeuronCore, not lnc={lnc}"
            )
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if runtime.in_kernel():  # a kernel calling a kernel: inline it in the same run
            return self.function(*args, **kwargs)
        return _run(self.function, args, kwargs)


def jit(fn: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
    """Decorates an NKI kernel. Without a Neuron device, calling it simulates it (as the SDK
    does under ``NKI_SIMULATOR=1``). Keyword options of the SDK's ``jit`` are accepted and
    have no effect here."""
    if fn is None:
        return lambda function: Kernel(function)
    return Kernel(fn)


def simulate(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """``nki.simulate(kernel)(*arrays)``: runs ``kernel`` (a :func:`jit` kernel or a plain
    function) on numpy arrays and returns numpy arrays."""
    function = kernel.function if isinstance(kernel, Kernel) else kernel
    return lambda *args, **kwargs: _run(function, args, kwargs)


def _run(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Runs one kernel: numpy arguments become HBM tensors (written in place if the kernel
    writes them); returned HBM tensors come back as new numpy arrays."""
    run = runtime.start_run()
    try:
        wrapped_args = [_wrap(value, f"#{i}") for i, value in enumerate(args)]
        wrapped_kwargs = {key: _wrap(value, key) for key, value in kwargs.items()}
        with np.errstate(all="ignore"):  # IEEE results (inf, NaN) as the engines give them
            result = function(*wrapped_args, **wrapped_kwargs)
        return _unwrap(result)
    finally:
        runtime.finish_run(run)


def _wrap(value: Any, position: str) -> Any:
    return wrap_argument(value, position) if isinstance(value, np.ndarray) else value


def _unwrap(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return type(value)(_unwrap(v) for v in value)
    if isinstance(value, NkiTensor):
        if value.buffer is not MemoryRegion.shared_hbm and not value.is_argument:
            raise errors.UnsupportedMemory(
                f"a kernel returns {value!r}; outputs must be created with "
                "buffer=nl.shared_hbm (or be kernel arguments)"
            )
        return np.array(value.data)
    return value
