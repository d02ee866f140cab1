"""A strict CPU simulator of the current NKI API (Neuron SDK 2.27+, ``import nki``).

Mirrors the ``nki`` package (``nki.jit``, ``nki.simulate``, ``nki.language``, ``nki.isa``,
``nki.typing``) of the NKI 0.8 API reference (every name: ``reference.json``) so the same
kernel source runs here and on a Neuron device::

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
partitions <= 128, PSUM tiles within a bank (before trn3), tiles no larger than the target's
SBUF or PSUM (live tiles beyond it spill, with a SpillWarning, as the compiler's default
allocation does), matmul tile sizes and dtypes, memory spaces of every operand,
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
import os
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from asickernels.simulate.nki import benchmarking as _benchmark
from asickernels.simulate.nki import (
    collectives,
    compile_config,
    compiler,
    dtype,
    errors,
    isa,
    language,
    lnc,
    runtime,
    typing,
)
from asickernels.simulate.nki import reference as _reference
from asickernels.simulate.nki.runtime import last_counters
from asickernels.simulate.nki.tensor import MemoryRegion, NkiTensor, wrap_argument
from asickernels.simulate.nki.world import Core, PeerFailed, World

__all__ = [
    "Kernel",
    "benchmark",
    "collectives",
    "compiler",
    "cpu_simulate",
    "dtype",
    "errors",
    "execute",
    "isa",
    "jit",
    "language",
    "last_counters",
    "lnc",
    "multi_rank_execute",
    "multi_rank_simulate",
    "profile",
    "simulate",
    "typing",
]


class Kernel:
    """A kernel function made callable on numpy arrays (see :func:`jit`); ``kernel[2]``
    launches it on the two physical cores of a Logical NeuronCore (LNC=2)."""

    def __init__(
        self,
        function: Callable[..., Any],
        lnc: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        self.function = function
        self.lnc = lnc  # None: NEURON_LOGICAL_NC_CONFIG, else 1
        self.options = options or {}  # nki.jit's keyword options
        compile_config.check_jit_options(self.options)
        functools.update_wrapper(self, function)

    def __getitem__(self, lnc: int) -> Kernel:
        """``kernel[lnc]`` with lnc 1 or 2: the only launch grids of the current API
        (nki/api/nki/__init__.py, ``jit``)."""
        if isinstance(lnc, bool) or not isinstance(lnc, int) or lnc not in (1, 2):
            raise ValueError(f"kernel[{lnc!r}]: the launch grid is the LNC degree, 1 or 2")
        return Kernel(self.function, lnc, self.options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        config = self.options.get("compile_config")
        if runtime.in_kernel():  # a kernel calling a kernel: inline it in the same run
            run = runtime.active_run("nki.jit")
            compile_config.check_nested(
                self.function.__name__, config, run.compile_config, run.specialization_config
            )
            return self.function(*args, **kwargs)
        function = self.function
        if self.options:
            function = _configured(function, config, self.options.get("specialization_config"))
        return _launch(function, _lnc(self), [(args, kwargs)])[0]


def _configured(function: Callable[..., Any], config: Any, specialization: Any) -> Any:
    """``function`` run with the kernel's ``nki.jit`` configs recorded on each core's run,
    where kernels it calls are checked against them."""

    @functools.wraps(function)
    def configured(*args: Any, **kwargs: Any) -> Any:
        run = runtime.active_run("nki.jit")
        run.compile_config, run.specialization_config = config, specialization
        return function(*args, **kwargs)

    return configured


def jit(fn: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
    """Decorates an NKI kernel. Without a Neuron device, calling it simulates it (as the SDK
    does under ``NKI_SIMULATOR=1``). Keyword options of the SDK's ``jit`` are accepted;
    ``compile_config``/``specialization_config`` (NKI 0.8, :mod:`.compile_config`) are checked
    as the SDK checks them and change no result."""
    if fn is None:
        return lambda function: Kernel(function, options=kwargs)
    return Kernel(fn, options=kwargs)


benchmark, profile = _benchmark.decorators(jit)


def simulate(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """``nki.simulate(kernel)(*arrays)``: runs ``kernel`` (a :func:`jit` kernel, possibly
    ``kernel[2]``, or a plain function) on numpy arrays and returns numpy arrays."""
    function = kernel.function if isinstance(kernel, Kernel) else kernel
    lnc = _lnc(kernel)
    return lambda *args, **kwargs: _launch(function, lnc, [(args, kwargs)])[0]


RankInputs = tuple[Sequence[Any], Mapping[str, Any]]


def multi_rank_simulate(
    kernel: Callable[..., Any],
    *,
    world_size: int,
    per_rank_inputs: Mapping[int, RankInputs] | Sequence[RankInputs],
) -> list[Any]:
    """Runs ``kernel`` on ``world_size`` ranks in this process, as the NKI 0.8 reference's
    ``nki.multi_rank_simulate`` (nki/api/generated/nki.multi_rank_simulate.html): rank ``r``
    runs ``kernel(*args, **kwargs)`` with ``per_rank_inputs[r] = (args, kwargs)`` (a sequence
    in rank order or a mapping with one key per rank), and ``nki.collectives.rank_id()`` is
    ``r``. Returns each rank's result, in rank order.

    A ``kernel[2]`` runs every rank on two cores (``world_size * 2`` threads). Every rank
    passes the same parameters; numpy arrays may differ in values but not in shape or dtype;
    all other arguments must be equal on every rank (``ValueError`` otherwise). Each rank
    has its own HBM: an array given to several ranks is copied for each and not written
    back. Collectives that disagree or cannot complete raise
    :class:`~asickernels.simulate.nki.errors.CollectiveMismatch` /
    :class:`~asickernels.simulate.nki.errors.CollectiveDeadlock`."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    inputs = _rank_inputs(world_size, per_rank_inputs)
    function = kernel.function if isinstance(kernel, Kernel) else kernel
    return _launch(function, _lnc(kernel), inputs)


def execute(kernel: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """NKI 0.8's ``nki.execute`` specializes the kernel into a NEFF and runs it on a Neuron
    device; there is none here (refused as reference.json says): calling the ``nki.jit``
    kernel runs it on the CPU."""
    _reference.refuse("nki.execute")


def multi_rank_execute(
    kernel: Callable[..., Any],
    *,
    world_size: int,
    per_rank_inputs: Mapping[int, RankInputs] | Sequence[RankInputs],
) -> list[Any]:
    """NKI 0.8's ``nki.multi_rank_execute`` compiles the kernel to a NEFF and runs it on
    Neuron devices; there are none here (refused as reference.json says):
    :func:`multi_rank_simulate` runs it on the CPU."""
    _reference.refuse("nki.multi_rank_execute")


def _rank_inputs(
    world_size: int, per_rank_inputs: Mapping[int, RankInputs] | Sequence[RankInputs]
) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """``per_rank_inputs`` as a list in rank order, checked: one ``(args, kwargs)`` per rank,
    the same parameters everywhere, arrays of one shape and dtype, other values equal."""
    if isinstance(per_rank_inputs, Mapping):
        if sorted(per_rank_inputs) != list(range(world_size)):
            raise ValueError(
                f"per_rank_inputs has keys {sorted(per_rank_inputs)}; it needs one per rank "
                f"0..{world_size - 1}"
            )
        listed = [per_rank_inputs[rank] for rank in range(world_size)]
    else:
        listed = list(per_rank_inputs)
        if len(listed) != world_size:
            raise ValueError(
                f"per_rank_inputs has {len(listed)} entries for world_size={world_size}"
            )
    inputs = []
    for rank, pair in enumerate(listed):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ValueError(f"per_rank_inputs[{rank}] must be an (args, kwargs) pair")
        args, kwargs = pair
        inputs.append((tuple(args), dict(kwargs)))
    first_args, first_kwargs = inputs[0]
    for rank, (args, kwargs) in enumerate(inputs[1:], start=1):
        if len(args) != len(first_args) or kwargs.keys() != first_kwargs.keys():
            raise ValueError(
                f"rank {rank} passes {len(args)} positional and {sorted(kwargs)} keyword "
                f"arguments, rank 0 {len(first_args)} and {sorted(first_kwargs)}: every rank "
                "runs one kernel specialization"
            )
        named = [(f"#{i}", a, b) for i, (a, b) in enumerate(zip(args, first_args, strict=True))]
        named += [(key, kwargs[key], first_kwargs[key]) for key in kwargs]
        for position, value, reference in named:
            _check_static(rank, position, value, reference)
    return inputs


def _check_static(rank: int, position: str, value: Any, reference: Any) -> None:
    """Rank ``rank``'s argument ``position`` against rank 0's: arrays of one shape and dtype
    (dynamic), anything else equal (static: specialized once for every rank)."""
    if isinstance(value, np.ndarray) or isinstance(reference, np.ndarray):
        same = (
            isinstance(value, np.ndarray)
            and isinstance(reference, np.ndarray)
            and value.shape == reference.shape
            and value.dtype == reference.dtype
        )
        if not same:
            raise ValueError(
                f"argument {position}: rank {rank} passes {_describe(value)}, rank 0 "
                f"{_describe(reference)}; tensors must have one shape and dtype on every rank"
            )
        return
    try:
        same = bool(value == reference)
    except Exception:  # a value without a truthful ==: only the same object is equal
        same = value is reference
    if not same:
        raise ValueError(
            f"argument {position}: rank {rank} passes {value!r}, rank 0 {reference!r}; "
            "non-tensor arguments are static and must be equal on every rank"
        )


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"an array {list(value.shape)} {value.dtype}"
    return repr(value)


def _lnc(kernel: Any) -> int:
    """The LNC degree a launch of ``kernel`` runs at: its ``kernel[lnc]``, else
    ``NEURON_LOGICAL_NC_CONFIG``, else 1 (nki/get-started/about/lnc.rst of Neuron 2.33,
    "Configuring the LNC degree of kernels")."""
    if isinstance(kernel, Kernel) and kernel.lnc is not None:
        return kernel.lnc
    return runtime.lnc_from_env()


# nki_cpu_simulator (AWS's CPU simulator package) reads the NeuronCore generation to simulate
# from this variable (gen2/gen3/gen4): nki-library's test/utils/simulation_setup.py@d2ad3a5
# sets it from the suite's --platform-target before each nki.cpu_simulate launch.
NC_VERSION_ENV = "NKI_NC_VERSION"


class _CpuSimulation:
    """``nki.cpu_simulate(kernel)``: call it, or index it with the LNC degree first."""

    def __init__(self, kernel: Callable[..., Any], lnc: int | None = None) -> None:
        self.kernel = kernel if isinstance(kernel, Kernel) else Kernel(kernel)
        if lnc is not None:
            self.kernel = self.kernel[lnc]

    def __getitem__(self, lnc: int) -> _CpuSimulation:
        return _CpuSimulation(self.kernel, lnc)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        generation = os.environ.get(NC_VERSION_ENV, "").strip()
        if not generation:
            return simulate(self.kernel)(*args, **kwargs)
        runtime.target_named(generation, NC_VERSION_ENV)  # a clear error for a bad name
        with runtime.targeting(generation):
            return simulate(self.kernel)(*args, **kwargs)


def cpu_simulate(kernel: Callable[..., Any]) -> _CpuSimulation:
    """``nki.cpu_simulate(kernel)[lnc](*arrays)``: ``nki_cpu_simulator``'s name for
    :func:`simulate` (``[lnc]``: 1 or 2 logical cores, 1 when left out), which nki-library's
    test suite calls in its simulation mode. ``NKI_NC_VERSION`` (``gen2``/``gen3``/``gen4``),
    when set, names the target, as in that package; otherwise
    ``NEURON_PLATFORM_TARGET_OVERRIDE`` does."""
    return _CpuSimulation(kernel)


def _launch(
    function: Callable[..., Any], lnc: int, inputs: list[tuple[tuple[Any, ...], dict[str, Any]]]
) -> list[Any]:
    """Runs one launch of ``len(inputs)`` ranks, rank ``r`` calling
    ``function(*args, **kwargs)`` with ``inputs[r]``; returns each rank's result. Numpy
    arguments become the rank's HBM tensors (written in place if the kernel writes them);
    returned HBM tensors come back as new numpy arrays. Each rank runs on ``lnc`` threads,
    one per physical core, each with its own ``program_id``, SBUF and PSUM, sharing the
    rank's HBM arguments (nki/guides/nki_simulator.rst, "Execution"); a rank's result is its
    core 0's."""
    target = runtime.target_from_env()
    if lnc > 1 and target.version < 3:
        # NCC_EARG001 (compiler/error-codes/EARG001.rst): "On trn1, only lnc=1 is supported."
        raise errors.UnsupportedOperator(
            f"LNC={lnc} on NeuronCore-v{target.version} ({target.platforms}): only LNC=1 is "
            "supported there (Neuron compiler error NCC_EARG001)"
        )
    buffer = MemoryRegion.shared_hbm if lnc > 1 else MemoryRegion.private_hbm
    copies: list[tuple[np.ndarray, np.ndarray]] = []  # (caller's array, contiguous copy)
    shared = _shared_between_ranks(inputs)
    wrapped = [
        (
            [_wrap(v, f"#{i}", buffer, copies, id(v) in shared) for i, v in enumerate(args)],
            {k: _wrap(v, k, buffer, copies, id(v) in shared) for k, v in kwargs.items()},
        )
        for args, kwargs in inputs
    ]
    world = World(len(inputs), lnc)
    cores = [(rank, program) for rank in range(len(inputs)) for program in range(lnc)]
    results: dict[Core, Any] = {}
    failures: dict[Core, BaseException] = {}
    runs: dict[Core, runtime.Run] = {}

    def run_core(core: Core) -> None:
        rank, program = core
        run = runtime.start_run(program, world.launches[rank], target)
        # Live tiles beyond SBUF/PSUM spill (a SpillWarning), as the compiler's default
        # allocation does: AWS profiles the kernel-optimization tutorial's v4 on trn2
        # (aws-neuron-sdk@81ce03a nki/guides/tutorials/kernel-optimization.rst), whose fp32
        # tiles need 320 KiB a partition of the 224.
        run.spills_when_full = True
        runs[core] = run
        args, kwargs = wrapped[rank]
        try:
            with np.errstate(all="ignore"):  # IEEE results (inf, NaN) as the engines give them
                results[core] = function(*args, **kwargs)
            collectives.check_no_prepared(run)
            world.finish(core)
        except BaseException as error:  # reported by the launching thread below
            failures[core] = error
            world.fail(core, error)
        finally:
            runtime.finish_run()

    if len(cores) == 1:
        run_core(cores[0])
    else:
        # daemons: an interrupted launch (Ctrl-C) must not leave the process waiting on them
        threads = [threading.Thread(target=run_core, args=(core,), daemon=True) for core in cores]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    runtime.publish_counters([runs[core] for core in cores if core in runs])
    for original, contiguous in copies:
        original[...] = contiguous
    # the root cause, not a peer's broken wait for the failed core
    failure = next(
        (failures[c] for c in cores if c in failures and not isinstance(failures[c], PeerFailed)),
        next((failures[c] for c in cores if c in failures), None),
    )
    if failure is not None:
        raise failure
    # after every core finished writing the shared outputs
    return [_unwrap(results[(rank, 0)]) for rank in range(len(inputs))]


def _shared_between_ranks(inputs: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> set[int]:
    """``id()`` of the arrays whose memory another rank's arguments may share (each rank's
    HBM is its own: such arrays are copied per rank)."""
    arrays = [
        (rank, value)
        for rank, (args, kwargs) in enumerate(inputs)
        for value in (*args, *kwargs.values())
        if isinstance(value, np.ndarray)
    ]
    return {
        id(a)
        for rank_a, a in arrays
        for rank_b, b in arrays
        if rank_a != rank_b and np.may_share_memory(a, b)
    }


def _wrap(
    value: Any,
    position: str,
    buffer: MemoryRegion,
    copies: list[tuple[np.ndarray, np.ndarray]],
    private_copy: bool = False,
) -> Any:
    """A numpy argument as an HBM tensor. Access patterns address storage row-major, so a
    non-contiguous array runs on a contiguous copy that is written back afterwards; with
    ``private_copy`` (an array given to several ranks) on a copy that is not."""
    if not isinstance(value, np.ndarray):
        return value
    if private_copy:
        value = np.array(value, order="C")
    elif not value.flags.c_contiguous:
        contiguous = np.ascontiguousarray(value)
        if value.flags.writeable:
            copies.append((value, contiguous))
        else:  # as read-only as the caller's array: a kernel writing it fails the same way
            contiguous.flags.writeable = False
        value = contiguous
    return wrap_argument(value, position, buffer)


def _unwrap(value: Any) -> Any:
    """A returned value as the caller gets it: HBM tensors as new numpy arrays. An output in
    private HBM (``nl.hbm``) is returned with a :class:`~errors.DeviceRanItWarning`: the NKI
    0.3 migration guide (aws-neuron-sdk@81ce03a nki/migration/index.rst, "Output tensors must
    use nl.shared_hbm") says it fails to compile, yet AWS's own documentation returns such
    outputs (nki/guides/tutorials/kernel-optimization.rst's matmul kernels, run and profiled
    on a trn2 device; nki/test/test_nki_isa_dma_transpose.py in the SDK's simulator)."""
    if isinstance(value, (tuple, list)):
        return type(value)(_unwrap(v) for v in value)
    if isinstance(value, NkiTensor):
        if not value.is_argument and value.buffer is MemoryRegion.private_hbm:
            warnings.warn(
                f"a kernel returns {value!r} from private HBM (nl.hbm); the NKI 0.3 migration "
                "guide requires outputs in nl.shared_hbm, but AWS's tutorials return nl.hbm "
                "outputs: returned as they are",
                errors.DeviceRanItWarning,
                stacklevel=4,
            )
        elif not value.is_argument and value.buffer is not MemoryRegion.shared_hbm:
            raise errors.UnsupportedMemory(
                f"a kernel returns {value!r}; outputs must be created in HBM "
                "(buffer=nl.shared_hbm) or be kernel arguments"
            )
        return np.array(value.values)
    return value
