"""A strict CPU simulator of the current NKI API (Neuron SDK 2.27+, ``import nki``).

Mirrors the ``nki`` package (``nki.jit``, ``nki.simulate``, ``nki.language``, ``nki.isa``,
``nki.typing``) of the 2.32 API reference so the same kernel source runs here and on a
Neuron device::

    from asickernels.simulate import nki
    from asickernels.simulate.nki import isa as nisa, language as nl

    @nki.jit
    def double(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        tile = nl.load(x)
        nl.store(out, nl.add(tile, tile))
        return out

    double(np.ones((128, 4), np.float32))       # runs on the CPU
    double[2](np.ones((128, 4), np.float32))    # two logical cores (LNC=2), two threads
    nki.last_counters()                         # instructions per engine, DMA bytes

Kernels run eagerly on numpy (bfloat16, fp8 and fp4 via ml_dtypes). Unlike the SDK's
simulator, this one enforces the hardware's limits and raises the errors in :mod:`.errors`:
partitions <= 128, PSUM banks (2 KiB per partition, 8 live), SBUF capacity of the target
across live allocations, matmul tile sizes and dtypes, memory spaces of every operand,
reductions over free axes only, out-of-bound indexing and access patterns. New memory reads
as NaN (integers: 4), as in the SDK's simulator.

The target is ``NEURON_PLATFORM_TARGET_OVERRIDE`` (trn1/inf2/gen2: 192 KiB of SBUF per
partition, trn2/gen3: 224 KiB, trn3/gen4: 256 KiB). Unset, it is trn3, as in the SDK's own
simulator off a Neuron machine (nki/guides/nki_simulator.rst, "Target Platform"): a kernel
that runs in the SDK's simulator runs here, and trn3-only instructions (``nc_matmul_mx``,
``quantize_mx``) work without configuration. Set ``trn1`` to check a kernel against the
smallest SBUF.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from asickernels.simulate.nki import benchmarking as _benchmark
from asickernels.simulate.nki import dtype, errors, isa, language, runtime, typing
from asickernels.simulate.nki.runtime import last_counters
from asickernels.simulate.nki.tensor import MemoryRegion, NkiTensor, wrap_argument

__all__ = [
    "Kernel",
    "benchmark",
    "dtype",
    "errors",
    "isa",
    "jit",
    "language",
    "last_counters",
    "profile",
    "simulate",
    "typing",
]


class Kernel:
    """A kernel function made callable on numpy arrays (see :func:`jit`); ``kernel[2]``
    launches it on two logical NeuronCores (LNC=2)."""

    def __init__(self, function: Callable[..., Any], lnc: int = 1) -> None:
        self.function = function
        self.lnc = lnc
        functools.update_wrapper(self, function)

    def __getitem__(self, lnc: int) -> Kernel:
        """``kernel[lnc]`` with lnc 1 or 2: the only launch grids of the current API
        (nki/api/nki/__init__.py, ``jit``)."""
        if isinstance(lnc, bool) or not isinstance(lnc, int) or lnc not in (1, 2):
            raise ValueError(f"kernel[{lnc!r}]: the launch grid is the LNC degree, 1 or 2")
        return Kernel(self.function, lnc)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if runtime.in_kernel():  # a kernel calling a kernel: inline it in the same run
            return self.function(*args, **kwargs)
        return _launch(self.function, self.lnc, args, kwargs)


def jit(fn: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
    """Decorates an NKI kernel. Without a Neuron device, calling it simulates it (as the SDK
    does under ``NKI_SIMULATOR=1``). Keyword options of the SDK's ``jit`` are accepted and
    have no effect here."""
    if fn is None:
        return lambda function: Kernel(function)
    return Kernel(fn)


benchmark, profile = _benchmark.decorators(jit)


def simulate(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """``nki.simulate(kernel)(*arrays)``: runs ``kernel`` (a :func:`jit` kernel, possibly
    ``kernel[2]``, or a plain function) on numpy arrays and returns numpy arrays."""
    function = kernel.function if isinstance(kernel, Kernel) else kernel
    lnc = kernel.lnc if isinstance(kernel, Kernel) else 1
    return lambda *args, **kwargs: _launch(function, lnc, args, kwargs)


def _launch(
    function: Callable[..., Any], lnc: int, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Runs one kernel launch: numpy arguments become HBM tensors (written in place if the
    kernel writes them); returned HBM tensors come back as new numpy arrays. With ``lnc=2``
    two threads run the kernel, one per logical core, each with its own ``program_id``, SBUF
    and PSUM, sharing the HBM arguments (nki/guides/nki_simulator.rst, "Execution"); the
    launch returns logical core 0's result."""
    buffer = MemoryRegion.shared_hbm if lnc > 1 else MemoryRegion.private_hbm
    copies: list[tuple[np.ndarray, np.ndarray]] = []  # (caller's array, contiguous copy)
    wrapped_args = [_wrap(value, f"#{i}", buffer, copies) for i, value in enumerate(args)]
    wrapped_kwargs = {key: _wrap(value, key, buffer, copies) for key, value in kwargs.items()}
    launch = runtime.Launch(lnc)
    results: list[Any] = [None] * lnc
    failures: list[BaseException | None] = [None] * lnc
    runs: list[runtime.Run | None] = [None] * lnc

    def core(program_id: int) -> None:
        run = runtime.start_run(program_id, launch)
        runs[program_id] = run
        try:
            with np.errstate(all="ignore"):  # IEEE results (inf, NaN) as the engines give them
                results[program_id] = function(*wrapped_args, **wrapped_kwargs)
        except BaseException as error:  # reported by the launching thread below
            failures[program_id] = error
            launch.failed = True  # a core waiting for this one (core_barrier, sendrecv) stops
            launch.barrier.abort()
        finally:
            runtime.finish_run()

    if lnc == 1:
        core(0)
    else:
        threads = [threading.Thread(target=core, args=(i,)) for i in range(lnc)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    runtime.publish_counters([run for run in runs if run is not None])
    for original, contiguous in copies:
        original[...] = contiguous
    # the root cause, not a peer's broken wait for the failed core
    failure = next(
        (f for f in failures if f is not None and not isinstance(f, threading.BrokenBarrierError)),
        next((f for f in failures if f is not None), None),
    )
    if failure is not None:
        raise failure
    return _unwrap(results[0])  # after every core finished writing the shared outputs


def _wrap(
    value: Any,
    position: str,
    buffer: MemoryRegion,
    copies: list[tuple[np.ndarray, np.ndarray]],
) -> Any:
    """A numpy argument as an HBM tensor. Access patterns address storage row-major, so a
    non-contiguous array runs on a contiguous copy that is written back afterwards."""
    if not isinstance(value, np.ndarray):
        return value
    if not value.flags.c_contiguous:
        contiguous = np.ascontiguousarray(value)
        if value.flags.writeable:
            copies.append((value, contiguous))
        else:  # as read-only as the caller's array: a kernel writing it fails the same way
            contiguous.flags.writeable = False
        value = contiguous
    return wrap_argument(value, position, buffer)


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
