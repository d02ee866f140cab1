"""``nki.isa`` (``nisa``): instructions of the NKI 0.8 API reference
(nki/api/nki/isa/__init__.py) with its names and signatures (the destination first). Each
call is one instruction on one engine, counted per run; DMAs are counted with the bytes
they move."""

from __future__ import annotations

import enum
import functools
import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from asickernels.simulate.nki import alu, errors, language, neuron_dtypes, prng, reference, runtime
from asickernels.simulate.nki.errors import NkiValidationError
from asickernels.simulate.nki.scalar import NkiScalar, scalar_alu, scalar_load, scalar_store
from asickernels.simulate.nki.tensor import (
    PACKED_X4,
    MemoryRegion,
    NKIObject,
    NkiTensor,
    dtype_name,
)

__all__ = [
    "NkiInstruction",
    "NkiScalar",
    "NkiValidationError",
    "VirtualRegister",
    "activate2",
    "activation",
    "activation_reduce",
    "affine_select",
    "bn_aggr",
    "bn_stats",
    "core_barrier",
    "dependency",
    "dge_mode",
    "dma_compute",
    "dma_copy",
    "dma_engine",
    "dma_transpose",
    "dropout",
    "engine",
    "exponential",
    "get_nc_sub_version",
    "get_nc_version",
    "iota",
    "local_gather",
    "matmul_perf_mode",
    "max8",
    "memset",
    "nc_find_index8",
    "nc_match_replace8",
    "nc_matmul",
    "nc_matmul_mx",
    "nc_n_gather",
    "nc_stream_shuffle",
    "nc_transpose",
    "nc_version",
    "nonzero_with_count",
    "oob_mode",
    "quantize_mx",
    "rand2",
    "rand_get_state",
    "rand_set_state",
    "range_select",
    "reciprocal",
    "reduce_cmd",
    "register_alloc",
    "register_load",
    "register_move",
    "register_store",
    "rng",
    "scalar_alu",
    "scalar_load",
    "scalar_store",
    "scalar_tensor_tensor",
    "select_reduce",
    "sendrecv",
    "sendrecv_compute",
    "sequence_bounds",
    "set_rng_seed",
    "tensor_copy",
    "tensor_copy_dynamic_dst",
    "tensor_copy_dynamic_src",
    "tensor_copy_predicated",
    "tensor_partition_reduce",
    "tensor_reduce",
    "tensor_scalar",
    "tensor_scalar_cumulative",
    "tensor_scalar_reduce",
    "tensor_tensor",
    "tensor_tensor_scan",
    "topk",
]


# The enums keep the SDK's (lowercase) names and values.
class engine(enum.Enum):
    """The NeuronCore engines an instruction can be placed on."""

    tensor = 1
    vector = 5
    scalar = 2
    gpsimd = 3
    dma = 4
    sync = 6
    unknown = 0


class oob_mode(enum.Enum):
    """Out-of-bounds handling of indirect DMAs (the simulator raises on any)."""

    error = 0
    skip = 1


class dge_mode(enum.Enum):
    """DMA descriptor generation (no effect in the simulator)."""

    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class matmul_perf_mode(enum.Enum):
    """Tensor Engine performance modes (``double_row_gen3``: the name AWS's test passes as a
    string, nki/test/test_nki_isa_nc_matmul.py@81ce03a; the same mode)."""

    none = "none"
    double_row = "double_row"
    double_row_gen3 = "double_row_gen3"


class dependency(enum.Enum):
    """How ``consumer.depends_on(producer, kind=...)`` orders two instructions (NKI 0.7,
    https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.isa.dependency.html):
    ``runtime`` waits on a hardware semaphore, ``schedule`` only orders their issue. The
    simulator runs in program order, which satisfies both."""

    runtime = "runtime"
    schedule = "schedule"


class reduce_cmd(enum.Enum):
    """What an instruction does with its engine's reduction registers."""

    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dma_engine(enum.Enum):
    """The engine a ``sendrecv`` transfer uses."""

    dma = 1
    gpsimd_dma = 2


class nc_version(enum.Enum):
    """NeuronCore generations: gen2 = trn1/inf2, gen3 = trn2, gen4 = trn3. Generations are
    ordered, among themselves and against their numbers: the reference is silent, and AWS's
    kernels branch on ``nisa.get_nc_version() >= nisa.nc_version.gen4`` and
    ``get_nc_version() >= 3`` (nki-library@d2ad3a5 core/attention/attention_tkg.py,
    experimental/collectives/fgcc.py)."""

    gen2 = 2
    gen3 = 3
    gen4 = 4

    def _other(self, other: Any) -> int | None:
        if isinstance(other, nc_version):
            return int(other.value)
        if isinstance(other, int) and not isinstance(other, bool):
            return other
        return None

    def __lt__(self, other: Any) -> bool:
        value = self._other(other)
        return NotImplemented if value is None else self.value < value

    def __le__(self, other: Any) -> bool:
        value = self._other(other)
        return NotImplemented if value is None else self.value <= value

    def __gt__(self, other: Any) -> bool:
        value = self._other(other)
        return NotImplemented if value is None else self.value > value

    def __ge__(self, other: Any) -> bool:
        value = self._other(other)
        return NotImplemented if value is None else self.value >= value


_UNKNOWN = engine.unknown
_OOB_SKIP = oob_mode.skip
# Module constants the reference lists as deprecated (use ``engine.<name>``): served by
# ``__getattr__`` so that a kernel using one is warned.
_ENGINE_CONSTANTS = {
    "tensor_engine": engine.tensor,
    "vector_engine": engine.vector,
    "scalar_engine": engine.scalar,
    "gpsimd_engine": engine.gpsimd,
    "unknown_engine": engine.unknown,
}


def __getattr__(name: str) -> Any:
    if name in _ENGINE_CONSTANTS:
        reference.warn_changed(f"nki.isa.{name}")
        return _ENGINE_CONSTANTS[name]
    raise AttributeError(f"module 'nki.isa' has no attribute '{name}'")


def get_nc_sub_version() -> int:
    """The silicon revision within the target's ``nc_version``: 0, the first revision (the
    default the reference gives; the simulator models no later one)."""
    return 0


def get_nc_version() -> nc_version:
    """The simulated target (``NEURON_PLATFORM_TARGET_OVERRIDE``)."""
    return nc_version(runtime.current_target().version)


_INTEGER_32 = (np.dtype(np.int32), np.dtype(np.uint32))
# nki.isa.nc_matmul, "Data types"; float8_e4m3fn from NeuronCore-v4.
_MATMUL_INPUT_DTYPES = ("float8_e4m3", "float8_e5m2", "bfloat16", "float16", "tfloat32", "float32")
_FP32_LIKE = ("float32", "tfloat32")
_FP8 = ("float8_e4m3", "float8_e5m2", "float8_e4m3fn")
# tensor_partition_reduce's docstring: add, average, max, bitwise_or, bitwise_and (NKI 0.6);
# NKI 0.7 names the mean nl.mean and adds bitwise_xor (the v2.33.0 page).
_PARTITION_REDUCE_OPS = (
    language.add,
    language.average,
    language.mean,
    language.maximum,
    language.bitwise_or,
    language.bitwise_and,
    language.bitwise_xor,
)


def _engine(api: str, requested: engine, default: str, allowed: tuple[str, ...]) -> str:
    if requested is engine.unknown:
        return default
    if requested.name not in allowed:
        raise errors.UnsupportedEngine(f"'{api}' runs on {'/'.join(allowed)}, not {requested.name}")
    return requested.name


def _alu(api: str, op: Any, allowed: tuple[Any, ...] | None = None) -> Any:
    if op not in language.ALU_OPS or (allowed is not None and op not in allowed):
        names = ", ".join(f"nl.{o.__name__}" for o in (allowed or language.ALU_OPS))
        raise errors.UnsupportedOperator(f"'{api}' does not take op={op!r}; it takes {names}")
    return language.ALU_OPS[op]


def _exact_integers(tile: NkiTensor) -> Any:
    """GpSimd reads 32-bit integers exactly, everything else as float32."""
    return tile.values.astype(np.int64) if tile.dtype in _INTEGER_32 else alu.as_f32(tile)


# -- data movement ------------------------------------------------------------------------
def dma_copy(
    dst: NkiTensor,
    src: NkiTensor,
    priority: Any = None,
    oob_mode: oob_mode = oob_mode.error,
    dge_mode: dge_mode = dge_mode.unknown,
    engine: engine = engine.unknown,
    name: Any = None,
    *,
    dst_rmw_op: Any = None,
    unique_indices: Any = None,
) -> None:
    """``dst = src`` by DMA between HBM and SBUF (any views with equally many elements;
    different dtypes are cast through float32). Rows of an indirect view whose offset is
    outside its tensor raise, or with ``oob_mode=oob_mode.skip`` are left alone (a
    destination row, or the destination row of a source row). ``dst_rmw_op=nl.add``
    (``dst += src``) and ``unique_indices`` are NKI 0.2's, removed in 0.3 for
    ``nisa.dma_compute``: they still run, with a warning."""
    for parameter, value in (("dst_rmw_op", dst_rmw_op), ("unique_indices", unique_indices)):
        if value is not None:
            reference.warn_changed(f"nki.isa.dma_copy.{parameter}")
    if dst_rmw_op not in (None, language.add):
        raise errors.UnsupportedOperator(f"'dma_copy' dst_rmw_op is nl.add, got {dst_rmw_op!r}")
    trigger = "" if engine is None or engine.name == "unknown" else engine.name
    _dma_copy(dst, src, accumulate=dst_rmw_op is not None, oob=oob_mode, trigger=trigger)


def _dma_copy(
    dst: NkiTensor,
    src: NkiTensor,
    accumulate: bool,
    oob: oob_mode = oob_mode.error,
    trigger: str = "",
) -> None:
    """:func:`dma_copy`; ``accumulate``: ``dst += src`` in float32, the legacy generation's
    ``dst_rmw_op=np.add`` (general/nki/api/nki/isa/__init__.py@0521004c, dma_copy);
    ``trigger``: the engine whose DMA queue the kernel chose ("" when it did not)."""
    api = "dma_copy"
    run = runtime.active_run(api)
    skipping = oob is oob_mode.skip
    alu.require(api, "dst", dst, (*alu.HBM, *alu.SBUF), skipping)
    alu.require(api, "src", src, (*alu.HBM, *alu.SBUF), skipping)
    if dst.size != src.size:
        raise errors.ShapeMismatch(f"'{api}' from {src!r} to {dst!r}: element counts differ")
    values = alu.dma_values(src, dst.dtype)
    if accumulate:
        values = alu.as_f32(dst) + alu.as_f32(src).reshape(dst.shape)
    alu.write(dst, values, api, alu.skipped_rows(api, src, dst))
    run.count_dma(
        not src.on_chip,
        not dst.on_chip,
        src.size * src.dtype.itemsize,
        "dma_copy",
        (src,),
        (dst,),
        trigger,
    )


def tensor_copy(
    dst: NkiTensor,
    src: NkiTensor,
    engine: engine = engine.unknown,
    name: Any = None,
    dtype: Any = None,
) -> None:
    """``dst = src`` on chip (bit copy for equal dtypes, else through float32). ``dtype``
    is the older beta's output type (nki-samples@6905a68 tutorials): the copy rounds to it,
    then ``dst`` stores the result in its own dtype."""
    api = "tensor_copy"
    run = runtime.active_run(api)
    tiles = [alu.require(api, "dst", dst, alu.ON_CHIP), alu.require(api, "src", src, alu.ON_CHIP)]
    alu.check_elements(api, {"dst": dst, "src": src})
    chosen = _engine(api, engine, "vector", ("vector", "scalar", "gpsimd"))
    if chosen == "gpsimd":
        alu.check_no_psum_on_gpsimd(api, tiles)
    if chosen == "scalar" and runtime.current_target().version == 2:
        raise errors.UnsupportedEngine(
            f"'{api}' cannot run on the Scalar engine of NeuronCore-v2; use nisa.activation"
        )
    same = src.dtype == dst.dtype and dtype_name(src.dtype) == dtype_name(dst.dtype)
    values = src.values if same else alu.as_f32(src)
    if dtype is not None and language.nki_dtype(dtype) != dst.dtype:
        values = alu.cast(np.asarray(alu.as_f32(src)), language.nki_dtype(dtype))
    alu.write(dst, values, api)
    run.count(chosen, "tensor_copy", (src,), (dst,), pinned=engine is not _UNKNOWN)


def memset(dst: NkiTensor, value: float, engine: engine = engine.unknown, name: Any = None) -> None:
    """Fills the on-chip ``dst`` with the constant ``value``. A tile of a packed MX type
    takes only 0 (every bit clear: +0 in each packed value), as nki-library@d2ad3a5 clears
    the padding of its MX weight tiles (core/mlp/mlp_tkg/down_projection_mx_shard_H.py:93)."""
    api = "memset"
    run = runtime.active_run(api)
    tiles = [alu.require(api, "dst", dst, alu.ON_CHIP)]
    chosen = _engine(api, engine, "vector", ("vector", "gpsimd"))
    if chosen == "gpsimd":
        alu.check_no_psum_on_gpsimd(api, tiles)
    if dtype_name(dst.dtype) in PACKED_X4:
        if value != 0:
            raise errors.UnsupportedDtype(
                f"'{api}' of {dst!r}: a packed MX tile can only be cleared (value 0), got {value!r}"
            )
        alu.write(dst, np.zeros(dst.shape, dst.dtype), api)  # all bytes zero
    else:
        alu.write(dst, np.full(dst.shape, value), api)
    run.count(chosen, "memset", (value,), (dst,), pinned=engine is not _UNKNOWN)


def tensor_copy_predicated(
    dst: NkiTensor,
    src: float | NkiTensor,
    predicate: NkiTensor,
    reverse_pred: bool = False,
    name: Any = None,
) -> None:
    """Copies ``src`` into ``dst`` where ``predicate`` (uint8/16/32) is nonzero (zero, with
    ``reverse_pred``); elsewhere ``dst`` keeps its values. Vector engine."""
    api = "tensor_copy_predicated"
    run = runtime.active_run(api)
    alu.require(api, "dst", dst, alu.ON_CHIP)
    alu.require(api, "predicate", predicate, alu.ON_CHIP)
    operands = {"dst": dst, "src": src, "predicate": predicate}
    alu.check_on_chip(api, operands)  # src may be a scalar
    alu.check_not_both_psum(api, src, predicate)
    alu.check_elements(api, operands)
    # bool_ is stored as uint8 (nki.api.shared.rst, "Supported Data Types").
    if predicate.dtype not in (language.bool_, language.uint8, language.uint16, language.uint32):
        raise errors.UnsupportedDtype(
            f"'{api}' predicate must be bool/uint8/16/32, got {predicate.dtype}"
        )
    if isinstance(src, NkiTensor) and src.dtype != dst.dtype:
        raise errors.UnsupportedDtype(
            f"'{api}' needs src and dst of one dtype, got {src.dtype}, {dst.dtype}"
        )
    chosen = predicate.values.reshape(dst.shape) != 0
    if reverse_pred:
        chosen = ~chosen
    values = src.values.reshape(dst.shape) if isinstance(src, NkiTensor) else alu.as_f32(src)
    alu.write(dst, np.where(chosen, alu.cast(np.asarray(values), dst.dtype), dst.values), api)
    run.count("vector", "tensor_copy_predicated", (src, predicate), (dst,))


def _require_version(api: str, minimum: int) -> None:
    """Refuses ``api`` on a NeuronCore generation older than v``minimum``."""
    version = runtime.current_target().version
    if version < minimum:
        platform = runtime.TARGETS[minimum].platforms
        raise errors.UnsupportedOperator(
            f"'{api}' needs NeuronCore-v{minimum} ({platform}); the target is "
            f"NeuronCore-v{version} (set {runtime.TARGET_ENV}={platform})"
        )


# -- Tensor engine --------------------------------------------------------------------------
def nc_matmul(
    dst: NkiTensor,
    stationary: NkiTensor,
    moving: NkiTensor,
    is_stationary_onezero: bool = False,
    is_moving_onezero: bool = False,
    is_transpose: bool = False,
    accumulate: bool | None = None,
    tile_position: tuple[int, ...] = (),
    tile_size: tuple[int, ...] = (),
    perf_mode: matmul_perf_mode = matmul_perf_mode.none,
    name: Any = None,
) -> None:
    """``dst = stationary.T @ moving`` on the Tensor engine: ``stationary [K, M]`` and
    ``moving [K, N]`` in SBUF (K <= 128 partitions, M <= 128, N <= 512; on NeuronCore-v4 N
    up to 8 PSUM banks), ``dst [M, N]`` float32 (or bfloat16 on v4) in PSUM; fp8, bf16,
    fp16, tf32 or fp32 inputs; ``is_transpose=True`` from NeuronCore-v3 may also write a
    bf16 or fp16 ``stationary``'s own dtype. ``tile_position``/``tile_size`` restrict the
    systolic array used; ``perf_mode=double_row`` takes fp8 ``[K, 2, free]`` tiles
    contracting over K and the 2. ``accumulate``: False overwrites, True adds, None adds where an earlier matmul
    wrote (accumulation is float32, as in PSUM)."""
    _nc_matmul(
        dst, stationary, moving, accumulate, tile_position, tile_size, perf_mode, True, is_transpose
    )


def _nc_matmul(
    dst: NkiTensor,
    stationary: NkiTensor,
    moving: NkiTensor,
    accumulate: bool | None,
    tile_position: tuple[int, ...],
    tile_size: tuple[int, ...],
    perf_mode: matmul_perf_mode,
    fp32_pairs: bool,
    is_transpose: bool = False,
) -> None:
    """:func:`nc_matmul`; ``fp32_pairs``: the rule "if one of the input tiles is
    tfloat32/float32, the other tile must also be" (nki.isa.nc_matmul), which the legacy
    generation's reference (general/nki/api/nki/isa/__init__.py@0521004c) does not state."""
    api = "nc_matmul"
    run = runtime.active_run(api)
    version = runtime.current_target().version
    operands = {
        "dst": alu.require(api, "dst", dst, alu.PSUM),
        "stationary": alu.require(api, "stationary", stationary, alu.SBUF),
        "moving": alu.require(api, "moving", moving, alu.SBUF),
    }
    double_row = matmul_perf_mode(perf_mode) in (
        matmul_perf_mode.double_row,
        matmul_perf_mode.double_row_gen3,
    )
    rows, columns = _tiling(api, tile_position, tile_size, version)
    if double_row:
        # nki.isa.nc_matmul, "Performance mode" and "Layout": NeuronCore-v3+, fp8 inputs,
        # contraction over the partition and a first free axis of 2, no column tiling.
        if version < 3 or columns < 128:
            raise errors.UnsupportedOperator(
                f"'{api}' perf_mode=double_row needs NeuronCore-v3+ and no column tiling"
            )
        for operand, tile in (("stationary", stationary), ("moving", moving)):
            if tile.ndim != 3 or tile.shape[1] != 2:
                raise errors.ShapeMismatch(
                    f"'{api}' double_row needs {operand} [K, 2, free], got {tile!r}"
                )
            if dtype_name(tile.dtype) not in _FP8 or (
                dtype_name(tile.dtype) == "float8_e4m3fn" and version < 4
            ):
                raise errors.UnsupportedDtype(
                    f"'{api}' double_row takes fp8 {operand}, got {tile!r}"
                )
        contraction = (stationary.shape[0] * 2, moving.shape[0] * 2)
        stationary_2d = stationary.values.transpose(1, 0, 2).reshape(contraction[0], -1)
        moving_2d = moving.values.transpose(1, 0, 2).reshape(contraction[1], -1)
    else:
        for operand, tile in operands.items():
            if tile.ndim != 2:
                raise errors.ExceedMaxSupportedDimension(
                    f"parameter '{operand}' {tile!r} of '{api}' exceeds max supported number of "
                    "dimensions of 2"
                )
        stationary_2d, moving_2d = stationary.values, moving.values
    alu.check_partitions(api, {"stationary": stationary, "moving": moving})
    m, n = stationary_2d.shape[1], moving_2d.shape[1]
    # v4 streams a moving tile across all 8 PSUM banks: 4096 fp32 or 8192 bf16 (nc_matmul,
    # "Tile size").
    moving_limit = language.tile_size.gemm_moving_fmax
    if version >= 4:
        moving_limit = 8 * runtime.PSUM_BANK_BYTES // dst.dtype.itemsize
    for operand, size, limit in (
        ("stationary partitions", stationary.shape[0], rows),
        ("stationary", m, columns),
        ("moving", n, moving_limit),
    ):
        if size > limit:
            raise errors.SizeOfDimensionExceedArchLimit(
                f"free size {size} of '{operand}' of '{api}' exceeds architecture limitation of {limit}"
            )
    if dst.shape != (m, n):
        raise errors.ShapeMismatch(
            f"'{api}' of {stationary!r}.T @ {moving!r} needs dst [{m}, {n}], got {dst!r}"
        )
    names = {}
    for operand, tile in (("stationary", stationary), ("moving", moving)):
        names[operand] = dtype_name(tile.dtype)
        if names[operand] not in _MATMUL_INPUT_DTYPES + (
            ("float8_e4m3fn",) if version >= 4 else ()
        ):
            raise errors.UnsupportedDtype(
                f"'{operand}' of '{api}' is {names[operand]}; the Tensor Engine takes fp8, "
                "bfloat16, float16, tfloat32 or float32, not integers: cast int8 to bfloat16 (exact)"
            )
    if fp32_pairs and (names["stationary"] in _FP32_LIKE) != (names["moving"] in _FP32_LIKE):
        raise errors.UnsupportedDtype(
            f"'{api}' mixes {names['stationary']} and {names['moving']}: if one input is "
            "float32/tfloat32 the other must be too"
        )
    if {"float8_e4m3", "float8_e4m3fn"} <= set(names.values()):
        raise errors.UnsupportedDtype(f"'{api}' cannot mix float8_e4m3 and float8_e4m3fn")
    # Transpose mode from NeuronCore-v3 writes "FP16/BF16 PSUM output for FP16/BF16 transpose"
    # (trainium2_arch.rst@81ce03a, "Built-in Transpose Support"; nki-library@d2ad3a5
    # bwmm_shard_on_I.py:767-782 transposes bf16 into bf16 PSUM on gen3); else float32
    # (bf16 from v4: nki.isa.nc_matmul, "Data types").
    transposed_16 = (
        is_transpose
        and version >= 3
        and dst.dtype == stationary.dtype
        and names["stationary"] in ("bfloat16", "float16")
    )
    if dst.dtype != language.float32 and not (
        transposed_16 or (dst.dtype == language.bfloat16 and version >= 4)
    ):
        raise errors.UnsupportedDtype(
            f"'{api}' writes a float32 PSUM tile (a bfloat16/float16 one for a transpose of "
            f"that dtype from NeuronCore-v3, bfloat16 from v4), got dst {dst.dtype}"
        )
    # Trace-only runs get a zero product without the arithmetic (alu.matmul_f32).
    _accumulate(dst, alu.matmul_f32(stationary_2d, moving_2d), accumulate, api)
    run.count("tensor", "nc_matmul", (stationary, moving), (dst,))


def _tiling(api: str, tile_position: Any, tile_size: Any, version: int) -> tuple[int, int]:
    """The (rows, columns) of the systolic array an ``nc_matmul`` may use: all 128x128
    unless ``tile_position``/``tile_size`` pick a tile (nki.isa.nc_matmul, "Tiling mode":
    both or neither; sizes 64, or 32 from NeuronCore-v3; starts on multiples of the size)."""
    if not tile_position and not tile_size:
        return 128, 128
    if not tile_position or not tile_size or len(tile_position) != 2 or len(tile_size) != 2:
        raise TypeError(f"'{api}' tiling needs both tile_position and tile_size as 2-tuples")
    allowed = (32, 64, 128) if version >= 3 else (64, 128)
    for start, size in zip(tile_position, tile_size, strict=True):
        if int(size) not in allowed or int(start) % int(size) or not 0 <= int(start) < 128:
            raise errors.UnsupportedOperator(
                f"'{api}' tile_position={tuple(tile_position)} tile_size={tuple(tile_size)}: "
                f"sizes in {allowed} on NeuronCore-v{version}, positions multiples of the size"
            )
    return int(tile_size[0]), int(tile_size[1])


def _accumulate(dst: NkiTensor, product: np.ndarray, accumulate: bool | None, api: str) -> None:
    """Writes a matmul ``product`` into PSUM: False overwrites, True adds, None adds where an
    earlier matmul wrote (accumulation is float32, as in PSUM). Trace-only runs write
    nothing (every value reads as zero)."""
    if runtime.values_skipped():
        return
    written = _matmul_written(dst)
    if accumulate is None:
        product = np.where(written, alu.as_f32(dst) + product, product)
    elif accumulate:
        product = alu.as_f32(dst) + product
    written[...] = True
    alu.write(dst, product, api)


def _matmul_written(dst: NkiTensor) -> np.ndarray:
    """A writable boolean view, shaped like ``dst``, of which PSUM elements of its storage a
    matmul has written."""
    root = dst.values if dst.values.base is None else dst.values.base
    allocation = dst.allocation
    assert allocation is not None and isinstance(root, np.ndarray)
    if allocation.matmul_written is None:
        allocation.matmul_written = np.zeros(root.size, np.bool_)
    itemsize = dst.dtype.itemsize
    offset = (dst.values.ctypes.data - root.ctypes.data) // itemsize
    return np.lib.stride_tricks.as_strided(
        allocation.matmul_written[offset:],
        shape=dst.shape,
        strides=tuple(stride // itemsize for stride in dst.values.strides),
    )


# -- Vector / Scalar / GpSimd engines -------------------------------------------------------
def tensor_tensor(
    dst: NkiTensor,
    data1: NkiTensor,
    data2: NkiTensor,
    op: Any,
    engine: engine = engine.unknown,
    name: Any = None,
) -> None:
    """``dst = op(data1, data2)`` element-wise; equal partitions and elements per partition;
    not both inputs in PSUM. All-int32 operands default to GpSimd (exact integer math),
    everything else to Vector (float32 math)."""
    api = "tensor_tensor"
    run = runtime.active_run(api)
    operands = alu.require_all(api, alu.ON_CHIP, dst=dst, data1=data1, data2=data2)
    tiles = list(operands.values())
    alu.check_not_both_psum(api, data1, data2)
    alu.check_elements(api, operands)
    function = _alu(api, op)
    integers = all(t.dtype in _INTEGER_32 for t in tiles)
    in_psum = any(t.buffer is MemoryRegion.psum for t in tiles)
    chosen = _engine(
        api, engine, "gpsimd" if integers and not in_psum else "vector", ("vector", "gpsimd")
    )
    if chosen == "gpsimd":
        alu.check_no_psum_on_gpsimd(api, tiles)
    read = _exact_integers if chosen == "gpsimd" and integers else alu.as_f32
    if op in language.BITVEC_OPS:
        read = language.read_bits
    alu.write(dst, np.asarray(function(read(data1), read(data2).reshape(data1.shape))), api)
    run.count(chosen, "tensor_tensor", (data1, data2), (dst,), (op,), engine is not _UNKNOWN)


def tensor_scalar(
    dst: NkiTensor,
    data: NkiTensor,
    op0: Any,
    operand0: float | NkiTensor,
    reverse0: bool = False,
    op1: Any = None,
    operand1: float | NkiTensor | None = None,
    reverse1: bool = False,
    engine: engine = engine.unknown,
    name: Any = None,
) -> None:
    """``dst = (data op0 operand0) op1 operand1`` in float32; each operand a scalar or a
    float32 ``[partitions, 1]`` tile broadcast along the free axes; ``reverse`` swaps the
    sides of its operator. Bitvec operators read integer bit patterns (Vector engine only)."""
    run = runtime.active_run("tensor_scalar")
    chosen = _tensor_scalar(
        "tensor_scalar", dst, data, op0, operand0, reverse0, op1, operand1, reverse1, engine
    )
    # every non-tile argument (tiles are in the reads): the cost model reads the operators
    scalars = [o if not isinstance(o, NkiTensor) else "tile" for o in (operand0, operand1)]
    params = (op0, scalars[0], reverse0, op1, scalars[1], reverse1)
    pinned = engine is not _UNKNOWN
    run.count(chosen, "tensor_scalar", (data, operand0, operand1), (dst,), params, pinned)


def _tensor_scalar(
    api: str,
    dst: NkiTensor,
    data: NkiTensor,
    op0: Any,
    operand0: float | NkiTensor,
    reverse0: bool,
    op1: Any,
    operand1: float | NkiTensor | None,
    reverse1: bool,
    engine: engine,
) -> str:
    """Computes :func:`tensor_scalar` into ``dst``; returns the engine that ran it."""
    if op1 is None and operand1 is not None:
        raise TypeError(f"'{api}': operand1 without op1")
    operands = alu.require_all(api, alu.ON_CHIP, dst=dst, data=data)
    tiles = alu.check_on_chip(api, {**operands, "operand0": operand0, "operand1": operand1})
    alu.check_elements(api, operands)
    chosen = _engine(api, engine, "vector", ("vector", "scalar", "gpsimd"))
    if chosen == "gpsimd":
        # nki.isa.tensor_scalar, ``engine``: "gpsimd (only allowed for rsqrt)".
        if op0 is not language.rsqrt or op1 not in (None, language.rsqrt):
            raise errors.UnsupportedEngine(
                f"'{api}' runs on the GpSimd engine only for op0=nl.rsqrt, not {op0!r}/{op1!r}"
            )
        alu.check_no_psum_on_gpsimd(api, tiles)
    bitvec = op0 in language.BITVEC_OPS
    if op1 is not None and (op1 in language.BITVEC_OPS) != bitvec:
        raise errors.UnsupportedOperator(f"'{api}' op0 and op1 must both be bitvec or arithmetic")
    if bitvec and chosen != "vector":
        raise errors.UnsupportedEngine(f"'{api}' with bitvec operators runs on the Vector engine")
    read = language.read_bits if bitvec else alu.as_f32
    values = read(data)
    steps: list[tuple[Any, Any, bool, str]] = [(op0, operand0, reverse0, "operand0")]
    if op1 is not None:
        steps.append((op1, operand1, reverse1, "operand1"))
    for op, operand, reverse, operand_name in steps:
        function = _alu(api, op)
        if isinstance(operand, NkiTensor):
            if operand.shape[0] != data.shape[0] or alu.per_partition(operand) != 1:
                alu.check_partitions(api, {"data": data, operand_name: operand})
                raise errors.ShapeMismatch(
                    f"'{api}' {operand_name} must be [partitions, 1], got {operand!r}"
                )
            if operand.dtype != language.float32 and not bitvec:
                raise errors.UnsupportedDtype(
                    f"'{api}' {operand_name} must be float32, got {operand.dtype}"
                )
            scalar = read(operand).reshape((data.shape[0],) + (1,) * (data.ndim - 1))
        else:
            scalar = read(0 if operand is None else operand)
        result = function(scalar, values) if reverse else function(values, scalar)
        values = np.asarray(result, np.int64 if bitvec else np.float32)
    alu.write(dst, values, api)
    return chosen


def tensor_reduce(
    dst: NkiTensor,
    op: Any,
    data: NkiTensor,
    axis: Any,
    negate: bool = False,
    keepdims: bool = False,
    name: Any = None,
) -> None:
    """``dst = op``-reduction of ``data`` over its trailing free ``axis`` (Vector engine)."""
    _tensor_reduce(dst, op, data, axis, negate, keepdims, None)


def _tensor_reduce(
    dst: NkiTensor,
    op: Any,
    data: NkiTensor,
    axis: Any,
    negate: bool,
    keepdims: bool,
    included: np.ndarray | None,
) -> None:
    """:func:`tensor_reduce` (``language.reduce_into``); ``included``: the elements that
    take part (a legacy ``mask``), all of them by default."""
    api = "tensor_reduce"
    runtime.active_run(api)
    operands = alu.require_all(api, alu.ON_CHIP, dst=dst, data=data)
    alu.check_partitions(api, operands)
    axes = language.reduce_axes(api, data, axis)
    function = _alu(api, op, tuple(language.REDUCE_OPS))
    bitvec = op in language.BITVEC_OPS
    if bitvec and negate:
        raise errors.UnsupportedOperator(f"'{api}' negate applies to arithmetic operators only")
    reduced = language.reduced_shape(data.shape, axes, keepdims)
    if alu.per_partition(dst) != math.prod(reduced[1:]):
        raise errors.ShapeMismatch(f"'{api}' of {data!r} over {axes} does not fit {dst!r}")
    read = language.read_bits if bitvec else alu.as_f32
    language.reduce_into(dst, api, function, data, axes, keepdims, included, read, negate)


def tensor_partition_reduce(dst: NkiTensor, op: Any, data: NkiTensor, name: Any = None) -> None:
    """``dst [1, ...] = op``-reduction of ``data`` across its partitions (GpSimd engine)."""
    api = "tensor_partition_reduce"
    run = runtime.active_run(api)
    tiles = [alu.require(api, "dst", dst, alu.ON_CHIP), alu.require(api, "data", data, alu.ON_CHIP)]
    alu.check_no_psum_on_gpsimd(api, tiles)
    if op not in _PARTITION_REDUCE_OPS:
        names = ", ".join(
            repr(o) if o is language.average else f"nl.{o.__name__}" for o in _PARTITION_REDUCE_OPS
        )
        raise errors.UnsupportedOperator(f"'{api}' does not take op={op!r}; it takes {names}")
    if dst.shape[0] != 1 or alu.per_partition(dst) != alu.per_partition(data):
        raise errors.ShapeMismatch(
            f"'{api}' of {data!r} needs dst [1, {data.shape[1:]}], got {dst!r}"
        )
    if op in (language.average, language.mean):
        values = alu.as_f32(data).mean(axis=0, keepdims=True)
    elif op in language.BITVEC_OPS:
        values = language.ALU_OPS[op].reduce(language.read_bits(data), axis=0, keepdims=True)
    else:
        values = language.ALU_OPS[op].reduce(_exact_integers(data), axis=0, keepdims=True)
    alu.write(dst, np.asarray(values), api)
    run.count("gpsimd", "tensor_partition_reduce", (data,), (dst,))


def _affine_values(
    api: str, dst: Any, pattern: Any, offset: int, channel_multiplier: int
) -> np.ndarray:
    """``offset + p * channel_multiplier + sum(i_k * step_k)`` (int64) for every element of
    ``dst`` (a tensor or its shape), for ``pattern = [[step, count], ...]`` covering its free
    elements."""
    shape = tuple(getattr(dst, "shape", dst))
    counts = [int(count) for _, count in pattern]
    if math.prod(counts) != math.prod(shape[1:]):
        raise errors.ShapeMismatch(f"'{api}' pattern {pattern} does not cover {dst!r}")
    values = np.full([shape[0], *counts], int(offset), np.int64)
    values += (np.arange(shape[0]) * int(channel_multiplier)).reshape([-1] + [1] * len(counts))
    for axis, (step, count) in enumerate(pattern):
        along = [1] * (len(counts) + 1)
        along[axis + 1] = int(count)
        values += (np.arange(int(count)) * int(step)).reshape(along)
    return values


def iota(
    dst: NkiTensor,
    pattern: list[list[int]],
    offset: int = 0,
    channel_multiplier: int = 0,
    name: Any = None,
) -> None:
    """``dst[p, i...] = offset + p * channel_multiplier + sum(i_k * step_k)`` in int32 math,
    for ``pattern = [[step, count], ...]`` covering ``dst``'s free elements (GpSimd)."""
    api = "iota"
    run = runtime.active_run(api)
    alu.require(api, "dst", dst, alu.SBUF)
    values = _affine_values(api, dst, pattern, offset, channel_multiplier)
    alu.write(dst, values.astype(np.int32), api)
    run.count("gpsimd", "iota", (), (dst,))


# -- Scalar engine: activations ----------------------------------------------------------
def _per_partition_operand(api: str, name: str, value: Any, data: NkiTensor) -> Any:
    """A scalar, or a ``[partitions, 1]`` tile broadcast along ``data``'s free axes."""
    if not isinstance(value, NkiTensor):
        return alu.as_f32(value)
    alu.require(api, name, value, alu.ON_CHIP)
    if value.shape[0] != data.shape[0] or alu.per_partition(value) != 1:
        raise errors.ShapeMismatch(f"'{api}' {name} must be [{data.shape[0]}, 1], got {value!r}")
    return alu.as_f32(value).reshape((data.shape[0],) + (1,) * (data.ndim - 1))


def _reduce_registers(run: runtime.Run) -> np.ndarray:
    """The Scalar engine's 128 per-lane reduction registers (they persist across calls)."""
    if run.scalar_reduce_registers is None:
        run.scalar_reduce_registers = np.zeros(runtime.PMAX, np.float32)
    return np.asarray(run.scalar_reduce_registers)


def activation(
    dst: NkiTensor,
    op: Any,
    data: NkiTensor,
    bias: float | NkiTensor | None = None,
    scale: float | NkiTensor = 1.0,
    reduce_op: Any = None,
    reduce_res: NkiTensor | None = None,
    reduce_cmd: reduce_cmd = reduce_cmd.idle,
    engine: engine = engine.scalar,
    name: Any = None,
) -> None:
    """``dst = op(data * scale + bias)`` on the Scalar engine (float32 math), or the GpSimd
    engine from NeuronCore-v4 (``engine``, NKI 0.7), optionally adding the result along the
    free axes into the Scalar engine's reduction registers (``reduce_op=nl.add``,
    ``reduce_cmd``) and reading them into ``reduce_res [P, 1]``."""
    _activation(
        dst, op, data, bias, scale, reduce_op, reduce_res, reduce_cmd, (language.add,), engine
    )


def _activation(
    dst: NkiTensor,
    op: Any,
    data: NkiTensor,
    bias: float | NkiTensor | None,
    scale: float | NkiTensor,
    reduce_op: Any,
    reduce_res: NkiTensor | None,
    reduce_cmd: reduce_cmd,
    reduce_ops: tuple[Any, ...],
    requested: engine = engine.scalar,
) -> None:
    """:func:`activation` with the reduce operators a generation allows: ``nl.add`` here
    ("reduce_op must be nl.add", nki.isa.activation); any ALU operator in the legacy
    generation (general/nki/api/nki/isa/__init__.py@0521004c: ``accu_registers =
    reduce_op(accu_registers, reduce_op(output, axis=<FreeAxis>))``)."""
    api = "activation"
    run = runtime.active_run(api)
    operands = alu.require_all(api, alu.ON_CHIP, dst=dst, data=data)
    alu.check_elements(api, operands)
    chosen = _activation_engine(api, requested, operands, reduce_op, reduce_res, reduce_cmd)
    if op not in language.ACTIVATIONS:
        raise errors.UnsupportedOperator(f"'{api}' does not take op={op!r}")
    if isinstance(scale, NkiTensor) and scale.dtype != language.float32:
        raise errors.UnsupportedDtype(f"'{api}' scale must be float32, got {scale!r}")
    if (
        bias is not None
        and not isinstance(bias, NkiTensor)
        and runtime.current_target().version < 3
    ):
        # nki.isa.activation, "Layout": a scalar bias needs NeuronCore-v3.
        raise errors.UnsupportedOperator(f"'{api}' bias must be a [P, 1] tile on NeuronCore-v2")
    values = alu.as_f32(data) * _per_partition_operand(api, "scale", scale, data)
    if bias is not None:
        values = values + _per_partition_operand(api, "bias", bias, data)
    result = np.asarray(language.ACTIVATIONS[op](values), np.float32)
    alu.write(dst, result, api)
    _scalar_reduce(api, run, result, reduce_op, reduce_res, reduce_cmd, reduce_ops)
    run.count(chosen, "activation", (data, bias, scale), (dst, reduce_res))


def _activation_engine(
    api: str,
    requested: engine,
    operands: dict[str, NkiTensor],
    reduce_op: Any,
    reduce_res: Any,
    command: reduce_cmd,
) -> str:
    """The engine of an activation: the Scalar engine, or from NeuronCore-v4 the GpSimd
    engine, which has no accumulator and no PSUM access (nki.isa.activation and
    nki.isa.activate2, NKI 0.7: "Accumulator is only available on the Scalar engine")."""
    allowed = ("scalar", "gpsimd") if runtime.current_target().version >= 4 else ("scalar",)
    chosen = _engine(api, requested, "scalar", allowed)
    if chosen == "gpsimd":
        alu.check_no_psum_on_gpsimd(api, list(operands.values()))
        if reduce_op is not None or reduce_res is not None or command is not reduce_cmd.idle:
            raise errors.UnsupportedEngine(
                f"'{api}' reduces only on the Scalar engine; the GpSimd engine has no accumulator"
            )
    return chosen


def _scalar_reduce(
    api: str,
    run: runtime.Run,
    result: np.ndarray,
    reduce_op: Any,
    reduce_res: NkiTensor | None,
    command: reduce_cmd,
    reduce_ops: tuple[Any, ...],
) -> None:
    """The optional reduction stage of the Scalar engine (pseudo code in nki.isa.activation)."""
    if reduce_op is None and reduce_res is None and command is reduce_cmd.idle:
        return
    if reduce_op is not None and reduce_op not in reduce_ops:
        names = ", ".join(f"nl.{o.__name__}" for o in reduce_ops)
        raise errors.UnsupportedOperator(f"'{api}' reduce_op must be one of {names}")
    function = np.add if reduce_op is None else _alu(api, reduce_op)
    registers = _reduce_registers(run)
    lanes = result.shape[0]
    if command in (reduce_cmd.reset, reduce_cmd.reset_reduce):
        registers[:lanes] = 0.0
    if command in (reduce_cmd.reduce, reduce_cmd.reset_reduce):
        reduced = function.reduce(result.reshape(lanes, -1), axis=1)
        registers[:lanes] = function(registers[:lanes], reduced)
    if reduce_res is not None:
        alu.require(api, "reduce_res", reduce_res, alu.ON_CHIP)
        if reduce_res.shape[0] != lanes or alu.per_partition(reduce_res) != 1:
            raise errors.ShapeMismatch(
                f"'{api}' reduce_res must be [{lanes}, 1], got {reduce_res!r}"
            )
        alu.write(reduce_res, registers[:lanes], api)


def activation_reduce(
    dst: NkiTensor,
    op: Any,
    data: NkiTensor,
    reduce_op: Any,
    reduce_res: NkiTensor,
    bias: float | NkiTensor | None = None,
    scale: float | NkiTensor = 1.0,
    name: Any = None,
) -> None:
    """:func:`activation` that also writes the free-axis ``reduce_op`` (nl.add) of its result
    into ``reduce_res [P, 1]``."""
    activation(
        dst, op, data, bias, scale, reduce_op, reduce_res, reduce_cmd.reset_reduce, name=name
    )


# -- Vector engine: scans, statistics, transposes -----------------------------------------
def tensor_tensor_scan(
    dst: NkiTensor,
    data0: NkiTensor,
    data1: NkiTensor,
    initial: float | NkiTensor,
    op0: Any,
    op1: Any,
    reverse0: bool = False,
    reverse1: bool = False,
    name: Any = None,
) -> None:
    """Per partition, ``dst[:, i] = op1(op0(data0[:, i], dst[:, i-1]), data1[:, i])`` along
    the flattened free axes, starting from ``initial`` (a scalar or a [P, 1] tile); float32
    math; ``data0`` and ``data1`` not both in PSUM."""
    api = "tensor_tensor_scan"
    run = runtime.active_run(api)
    operands = alu.require_all(api, alu.ON_CHIP, dst=dst, data0=data0, data1=data1)
    alu.check_not_both_psum(api, data0, data1)
    alu.check_elements(api, operands)
    first, second = _alu(api, op0), _alu(api, op1)
    lanes = data0.shape[0]
    a = alu.as_f32(data0).reshape(lanes, -1)
    b = alu.as_f32(data1).reshape(lanes, -1)
    state = np.broadcast_to(_per_partition_operand(api, "initial", initial, a), (lanes, 1))[:, 0]
    result = np.zeros_like(a)
    for i in range(0 if runtime.values_skipped() else a.shape[1]):  # trace-only: zeros
        partial = first(state, a[:, i]) if reverse0 else first(a[:, i], state)
        state = np.asarray(
            second(b[:, i], partial) if reverse1 else second(partial, b[:, i]), np.float32
        )
        result[:, i] = state
    alu.write(dst, result, api)
    run.count("vector", "tensor_tensor_scan", (data0, data1, initial), (dst,))


def reciprocal(dst: NkiTensor, data: NkiTensor, name: Any = None) -> None:
    """``dst = 1 / data`` on the Vector engine (float32 math)."""
    api = "reciprocal"
    run = runtime.active_run(api)
    operands = alu.require_all(api, alu.ON_CHIP, dst=dst, data=data)
    alu.check_elements(api, operands)
    alu.write(dst, 1.0 / alu.as_f32(data), api)
    run.count("vector", "reciprocal", (data,), (dst,))


def nc_transpose(
    dst: NkiTensor, data: NkiTensor, engine: engine = engine.unknown, name: Any = None
) -> None:
    """``dst = data.T`` of a 2-D tile: on the Tensor engine (SBUF [<=128, <=128] -> PSUM) or
    the Vector engine (<= 32x32, SBUF or PSUM); default Tensor unless it fits 32x32."""
    _nc_transpose(dst, data, engine, alu.PSUM)


def _nc_transpose(
    dst: NkiTensor,
    data: NkiTensor,
    engine: engine,
    tensor_dst: tuple[MemoryRegion, ...],
    api: str = "nc_transpose",
) -> None:
    """:func:`nc_transpose`, also ``nl.transpose`` of both generations (``api``);
    ``tensor_dst``: where a Tensor-engine transpose writes. PSUM for the instruction
    (nki.isa.nc_transpose; general/nki/api/nki/isa/__init__.py@0521004c) and the current
    ``nl.transpose``; the legacy ``nl.transpose`` returns a tile the compiler places, here
    in SBUF (legacy/language.py)."""
    run = runtime.active_run(api)
    alu.require(api, "dst", dst, alu.ON_CHIP)
    alu.require(api, "data", data, alu.ON_CHIP)
    # The transpose swaps the partition axis and the free axis; either side's free axis may
    # have several dimensions (nki-library@d2ad3a5 mlp_cte_transpose.py:255-270 writes a
    # [hidden, 1, bxs] access pattern in PSUM from a [bxs, hidden] tile).
    rows = alu.per_partition(data)
    transposed = (rows, data.shape[0])  # dst's partitions, elements in each
    if data.ndim < 2 or dst.ndim < 2 or (dst.shape[0], alu.per_partition(dst)) != transposed:
        raise errors.ShapeMismatch(
            f"'{api}' of {data!r} needs a dst of {rows} partitions with {data.shape[0]} "
            f"elements each, got {dst!r}"
        )
    chosen = _transpose_engine(api, data, engine)
    if chosen == "tensor":
        alu.require(api, "dst", dst, tensor_dst)
        alu.require(api, "data", data, alu.SBUF)
    values = data.values if dst.dtype == data.dtype else alu.as_f32(data)
    alu.write(dst, values.reshape(data.shape[0], rows).T.reshape(dst.shape), api)
    run.count(chosen, api, (data,), (dst,))


# The docs limit a Vector-engine transpose to 32x32 (nki.isa.nc_transpose, "Vector Engine
# can handle shape (32, 32) or smaller"; general/nki/api/nki/isa/__init__.py@0521004c), but
# public kernels transposing larger tiles on it (128x64) compiled, passed their correctness
# checks and were timed on trn1 (issue 31): a warning, not an error, up to the Tensor engine's
# 128x128.
VECTOR_TRANSPOSE_DOCUMENTED = 32


def _transpose_engine(api: str, data: Any, engine: engine) -> str:
    """The engine :func:`nc_transpose` runs ``data`` (its partitions by its flattened free
    axes) on: the requested one, else the Vector engine when it fits 32x32; either takes up
    to 128x128 (a Vector-engine tile over 32x32 warns: :data:`VECTOR_TRANSPOSE_DOCUMENTED`)."""
    shape = (data.shape[0], math.prod(data.shape[1:]))
    fits_vector = max(shape) <= VECTOR_TRANSPOSE_DOCUMENTED
    chosen = _engine(api, engine, "vector" if fits_vector else "tensor", ("tensor", "vector"))
    if max(shape) > runtime.PMAX:
        raise errors.SizeOfDimensionExceedArchLimit(
            f"'{api}' on the {chosen} engine takes tiles up to {runtime.PMAX}x{runtime.PMAX}, "
            f"got {data!r}"
        )
    if chosen == "vector" and not fits_vector:
        warnings.warn(
            f"'{api}' of {data!r} on the vector engine: the docs allow up to 32x32 "
            "(nki.isa.nc_transpose), but published kernels transposing 128x64 tiles there "
            "ran on trn1 and passed their checks; simulated as a full transpose",
            errors.DeviceRanItWarning,
            stacklevel=4,
        )
    return chosen


def bn_stats(dst: NkiTensor, data: NkiTensor, name: Any = None) -> None:
    """Per partition, ``dst [P, 6] = (count, mean, variance*count)`` of the even and then the
    odd elements of ``data``'s (<= 512) free elements (Vector engine, float32 math)."""
    _bn_stats(dst, data, None)


def _bn_stats(dst: NkiTensor, data: NkiTensor, included: np.ndarray | None) -> None:
    """:func:`bn_stats`; ``included``: the elements that take part (a legacy ``mask``, which
    leaves elements out of the counts: general/nki/api/nki/isa/__init__.py@0521004c takes
    ``mask=``), all of them by default."""
    api = "bn_stats"
    run = runtime.active_run(api)
    alu.require(api, "dst", dst, alu.ON_CHIP)
    alu.require(api, "data", data, alu.ON_CHIP)
    alu.check_partitions(api, {"dst": dst, "data": data})
    if alu.per_partition(data) > language.tile_size.bn_stats_fmax:
        raise errors.SizeOfDimensionExceedArchLimit(
            f"'{api}' takes up to {language.tile_size.bn_stats_fmax} elements per partition, got {data!r}"
        )
    if alu.per_partition(dst) != 6:
        raise errors.ShapeMismatch(f"'{api}' writes 6 elements per partition, dst is {dst!r}")
    rows = alu.as_f32(data).reshape(data.shape[0], -1)
    kept = None if included is None else np.broadcast_to(included, data.shape).reshape(rows.shape)
    alu.write(dst, alu.batch_norm_stats(rows, kept), api)
    run.count("vector", "bn_stats", (data,), (dst,))


def bn_aggr(dst: NkiTensor, data: NkiTensor, name: Any = None) -> None:
    """Per partition, ``dst [P, 2] = (mean, variance)`` of the ``(count, mean,
    variance*count)`` triples in ``data`` (outputs of :func:`bn_stats`)."""
    api = "bn_aggr"
    run = runtime.active_run(api)
    alu.require(api, "dst", dst, alu.ON_CHIP)
    alu.require(api, "data", data, alu.ON_CHIP)
    alu.check_partitions(api, {"dst": dst, "data": data})
    if alu.per_partition(data) % 3 or alu.per_partition(dst) != 2:
        raise errors.ShapeMismatch(
            f"'{api}' reads (count, mean, variance*count) triples into [P, 2]: {data!r} -> {dst!r}"
        )
    triples = alu.as_f32(data).reshape(data.shape[0], -1, 3)
    alu.write(dst, alu.batch_norm_aggregate(triples), api)
    run.count("vector", "bn_aggr", (data,), (dst,))


@reference.deprecated("nki.isa.core_barrier")
def core_barrier(
    data: NkiTensor, cores: Any, engine: engine = engine.gpsimd, name: Any = None
) -> None:
    """Deprecated in NKI 0.8 for :func:`nki.lnc.core_barrier`, which it runs."""
    from asickernels.simulate.nki import lnc  # lnc builds on this module

    lnc.core_barrier(data, cores, engine, name)


# -- MX (microscaling) on NeuronCore-v4 --------------------------------------------------


def _scale_rows(api: str, scale: NkiTensor, partitions: int) -> np.ndarray:
    """The per-group scale rows of an MX tile with ``partitions`` partitions: one row per 8
    partitions; beyond one 32-partition quadrant, group g's row sits at partition
    ``32 * (g // 4) + g % 4`` of ``scale`` (nki.isa.quantize_mx, "Layout")."""
    groups = partitions // 8
    rows = (
        [32 * (g // 4) + g % 4 for g in range(groups)] if partitions > 32 else list(range(groups))
    )
    if rows[-1] >= scale.shape[0]:
        raise errors.ShapeMismatch(
            f"'{api}' scales for {partitions} partitions need {rows[-1] + 1} partitions, got {scale!r}"
        )
    if dtype_name(scale.dtype) not in ("uint8", "float8_e8m0fnu"):
        raise errors.UnsupportedDtype(f"'{api}' scales are float8_e8m0fnu or uint8, got {scale!r}")
    return np.asarray(rows)


def _scale_exponents(scale: NkiTensor) -> np.ndarray:
    return scale.values.reshape(scale.shape[0], -1).view(np.uint8).astype(np.int32)


def _unpack_mx(tile: NkiTensor) -> np.ndarray:
    """``tile [P, ...]`` of a packed type as float32 values ``[P, F, 4]`` (F: its free
    elements, flattened; element 0 in the low bits, as little-endian packing gives)."""
    return neuron_dtypes.unpack_x4(tile.values).reshape(tile.shape[0], -1, 4)


def nc_matmul_mx(
    dst: NkiTensor,
    stationary: NkiTensor,
    moving: NkiTensor,
    stationary_scale: NkiTensor,
    moving_scale: NkiTensor,
    tile_position: Any = None,
    tile_size: Any = None,
    accumulate: bool | None = None,
    name: Any = None,
) -> None:
    """MX matmul on the Tensor engine (NeuronCore-v4): ``stationary [K, M]`` and ``moving
    [K, N]`` of packed x4 types contract over K partitions and the 4 packed values; every 8
    partitions x 4 values share one power-of-two scale ``2**(e - 127)``. ``dst [M, N]`` is a
    float32 or bfloat16 PSUM tile. M and N count free elements: any operand's free axis may
    have several dimensions (nki-library@d2ad3a5 core/mlp/mlp_tkg/down_projection_mx_shard_H.py
    passes a [128, 1, 96] stationary)."""
    api = "nc_matmul_mx"
    run = runtime.active_run(api)
    _require_version(api, 4)
    for operand, tile in (
        ("stationary", stationary),
        ("moving", moving),
        ("stationary_scale", stationary_scale),
        ("moving_scale", moving_scale),
    ):
        alu.require(api, operand, tile, alu.SBUF)
    alu.require(api, "dst", dst, alu.PSUM)
    rows, _ = _tiling(api, tile_position or (), tile_size or (), 4)
    for operand, tile in (("stationary", stationary), ("moving", moving)):
        if dtype_name(tile.dtype) not in PACKED_X4 or tile.ndim < 2:
            raise errors.UnsupportedDtype(
                f"'{api}' {operand} must be a packed x4 tile, got {tile!r}"
            )
    alu.check_partitions(api, {"stationary": stationary, "moving": moving})
    partitions, m = stationary.shape[0], alu.per_partition(stationary)
    n = alu.per_partition(moving)
    moving_limit = 8 * runtime.PSUM_BANK_BYTES // dst.dtype.itemsize
    if partitions % 32 or partitions > rows or m % 2 or m > 128 or n > moving_limit:
        raise errors.SizeOfDimensionExceedArchLimit(
            f"'{api}': partitions a multiple of 32 up to {rows}, stationary free even and "
            f"<= 128, moving free <= {moving_limit}; got {stationary!r}, {moving!r}"
        )
    if (dst.shape[0], alu.per_partition(dst)) != (m, n) or dst.dtype not in (
        language.float32,
        language.bfloat16,
    ):
        raise errors.ShapeMismatch(f"'{api}' needs a float32/bfloat16 dst [{m}, {n}], got {dst!r}")

    def dequantized(tile: NkiTensor, scale: NkiTensor) -> np.ndarray:
        columns = alu.per_partition(tile)
        exponents = _scale_exponents(scale)[_scale_rows(api, scale, partitions), :columns]
        factors = np.repeat(np.exp2(exponents.astype(np.float64) - 127.0), 8, axis=0)
        return _unpack_mx(tile) * factors[:, :, None]

    product = np.einsum(
        "kiq,kjq->ij", dequantized(stationary, stationary_scale), dequantized(moving, moving_scale)
    )
    _accumulate(dst, product.astype(np.float32).reshape(dst.shape), accumulate, api)
    run.count(
        "tensor", "nc_matmul_mx", (stationary, moving, stationary_scale, moving_scale), (dst,)
    )


# Largest unbiased exponent of each MX element type (nki.isa.quantize_mx, "Scale calculation").
_MX_MAX_EXPONENT = {"float8_e4m3fn_x4": 8, "float8_e5m2_x4": 15}


def quantize_mx(dst: NkiTensor, src: NkiTensor, dst_scale: NkiTensor, name: Any = None) -> None:
    """Quantizes ``src [P, 4F]`` (float16/bfloat16, SBUF) to MXFP8 ``dst [P, F]``
    (float8_e5m2_x4 / float8_e4m3fn_x4) and one scale per 8 partitions x 4 values in
    ``dst_scale`` (Vector engine, NeuronCore-v4). The block scale is
    ``2**(floor(log2(amax)) - (Emax - 1))``, ``2**-127`` for an all-zero group. 4F and F
    count free elements: each operand's free axis may have several dimensions, 4 consecutive
    values of ``src`` making one of ``dst`` (nki-library@d2ad3a5 passes ``src [128, 1, 64,
    4]`` to ``dst [128, 1, 64]``, core/subkernels/rmsnorm_mx_quantize_tkg.py:254)."""
    api = "quantize_mx"
    run = runtime.active_run(api)
    _require_version(api, 4)
    for operand, tile in (("dst", dst), ("src", src), ("dst_scale", dst_scale)):
        alu.require(api, operand, tile, alu.SBUF)
    kind = dtype_name(dst.dtype)
    if kind not in _MX_MAX_EXPONENT or src.dtype not in (language.float16, language.bfloat16):
        raise errors.UnsupportedDtype(
            f"'{api}' quantizes float16/bfloat16 into float8_e5m2_x4/float8_e4m3fn_x4, got "
            f"{src!r} -> {dst!r}"
        )
    partitions, columns = src.shape[0], alu.per_partition(dst)
    if (
        partitions % 32
        or src.ndim < 2
        or dst.shape[0] != partitions
        or alu.per_partition(src) != 4 * columns
    ):
        raise errors.ShapeMismatch(
            f"'{api}' needs src [32k, 4F] and dst [32k, F], got {src!r}, {dst!r}"
        )
    groups = alu.as_f32(src).astype(np.float64).reshape(partitions // 8, 8, columns, 4)
    amax = np.abs(groups).max(axis=(1, 3))
    with np.errstate(divide="ignore"):
        exponent = np.where(amax > 0, np.floor(np.log2(amax)) - (_MX_MAX_EXPONENT[kind] - 1), -127)
    exponent = np.clip(exponent, -127, 127)
    scaled = groups / np.exp2(exponent)[:, None, :, None]
    element, _ = PACKED_X4[kind]
    values = scaled.reshape(partitions, columns * 4).astype(element)
    alu.write(
        dst,
        values.view(np.uint8)
        .reshape(partitions, columns, 4)
        .copy()
        .view(dst.dtype)
        .reshape(dst.shape),
        api,
    )
    rows = _scale_rows(api, dst_scale, partitions)
    if alu.per_partition(dst_scale) < columns:
        raise errors.ShapeMismatch(
            f"'{api}' dst_scale needs {columns} elements per partition, got {dst_scale!r}"
        )
    scales = dst_scale.values.view(np.uint8).reshape(dst_scale.shape[0], -1).copy()
    scales[rows, :columns] = (exponent + 127).astype(np.uint8)
    alu.write(dst_scale, scales.view(dst_scale.dtype).reshape(dst_scale.shape), api)
    run.count("vector", "quantize_mx", (src,), (dst, dst_scale))


def affine_select(
    dst: NkiTensor,
    pattern: Any,
    channel_multiplier: int,
    on_true_tile: NkiTensor,
    on_false_value: float,
    cmp_op: Any = language.equal,
    offset: int = 0,
    name: Any = None,
) -> None:
    """``dst = on_true_tile`` where ``cmp_op(affine value, 0)`` holds, else
    ``on_false_value``; the affine value is :func:`iota`'s (GpSimd engine, SBUF only)."""
    api = "affine_select"
    run = runtime.active_run(api)
    operands = alu.require_all(api, alu.SBUF, dst=dst, on_true_tile=on_true_tile)
    alu.check_elements(api, operands)
    predicate = _alu(api, cmp_op)(_affine_values(api, dst, pattern, offset, channel_multiplier), 0)
    values = alu.as_f32(on_true_tile).reshape(predicate.shape)
    alu.write(dst, np.where(predicate, values, np.float32(on_false_value)), api)
    run.count("gpsimd", "affine_select", (on_true_tile,), (dst,))


def scalar_tensor_tensor(
    dst: NkiTensor,
    data: NkiTensor,
    op0: Any,
    operand0: float | NkiTensor,
    op1: Any,
    operand1: NkiTensor,
    reverse0: bool = False,
    reverse1: bool = False,
    reduce_cmd: reduce_cmd = reduce_cmd.reset_reduce,
    reduce_op: Any = ...,
    reduce_res: NkiTensor | None = None,
    name: Any = None,
) -> None:
    """``dst = (data op0 operand0) op1 operand1``: ``operand0`` a scalar or [P, 1] tile,
    ``operand1`` a tile shaped like ``data`` (Vector engine, arithmetic operators only).
    With ``reduce_op`` (NKI 0.7's signature, https://awsdocs-neuron.readthedocs-hosted.com/
    en/v2.33.0/nki/api/generated/nki.isa.scalar_tensor_tensor.html), the result's free-axis
    ``reduce_op`` accumulates per partition into the Vector accumulators after
    ``reduce_cmd``, read into ``reduce_res [P, 1]``, as ``tensor_scalar_reduce`` does."""
    api = "scalar_tensor_tensor"
    run = runtime.active_run(api)
    operands = alu.require_all(api, alu.ON_CHIP, dst=dst, data=data, operand1=operand1)
    alu.check_not_both_psum(api, data, operand1)
    alu.check_elements(api, operands)
    if op0 in language.BITVEC_OPS or op1 in language.BITVEC_OPS:
        raise errors.UnsupportedOperator(f"'{api}' takes arithmetic operators only")
    first, second = _alu(api, op0), _alu(api, op1)
    values = alu.as_f32(data)
    scalar = _per_partition_operand(api, "operand0", operand0, data)
    values = first(scalar, values) if reverse0 else first(values, scalar)
    other = alu.as_f32(operand1).reshape(data.shape)
    alu.write(dst, np.asarray(second(other, values) if reverse1 else second(values, other)), api)
    if reduce_op is ... or reduce_op is None:
        if reduce_res is not None:
            raise TypeError(f"'{api}' reduce_res needs a reduce_op")
    else:
        accumulated = _accumulate_free_axis(api, run, reduce_op, reduce_cmd, None, data, dst)
        _write_reduce_result(api, reduce_res, accumulated)
    run.count("vector", "scalar_tensor_tensor", (data, operand0, operand1), (dst, reduce_res))


# -- Vector engine accumulators ----------------------------------------------------------
# The reductions the accumulating Vector instructions take, with their identities
# (nki.isa.tensor_scalar_reduce, "Accumulator behavior"); nl.max / nl.min name the same.
_ACCUMULATE: dict[Any, tuple[Any, float]] = {
    language.add: (np.add, 0.0),
    language.subtract: (np.subtract, 0.0),
    language.multiply: (np.multiply, 1.0),
    language.maximum: (np.maximum, -np.inf),
    language.max: (np.maximum, -np.inf),
    language.minimum: (np.minimum, np.inf),
    language.min: (np.minimum, np.inf),
}


def _vector_registers(run: runtime.Run) -> np.ndarray:
    """The Vector engine's 128 per-lane accumulators, shared by its accumulating
    instructions (exponential, range_select, select_reduce, tensor_scalar_reduce,
    tensor_scalar_cumulative)."""
    if run.vector_reduce_registers is None:
        run.vector_reduce_registers = np.zeros(runtime.PMAX, np.float32)
    return np.asarray(run.vector_reduce_registers)


def _accumulator_start(
    api: str,
    run: runtime.Run,
    lanes: int,
    op: Any,
    command: reduce_cmd,
    initial: Any,
    data: NkiTensor,
) -> tuple[np.ndarray, Any]:
    """The accumulator lanes after ``command`` (reset to ``op``'s identity, loaded from
    ``initial``, or kept) and ``op``'s numpy function."""
    if op not in _ACCUMULATE:
        raise errors.UnsupportedOperator(f"'{api}' does not reduce with {op!r}")
    function, identity = _ACCUMULATE[op]
    registers = _vector_registers(run)
    if command in (reduce_cmd.reset, reduce_cmd.reset_reduce):
        registers[:lanes] = identity
    elif command is reduce_cmd.load_reduce:
        if initial is None:
            raise TypeError(f"'{api}' reduce_cmd.load_reduce needs an initial value")
        registers[:lanes] = np.broadcast_to(
            _per_partition_operand(api, "init", initial, data), (lanes, 1)
        )[:, 0]
    return registers, function


def _accumulate_free_axis(
    api: str,
    run: runtime.Run,
    op: Any,
    command: reduce_cmd,
    initial: Any,
    data: NkiTensor,
    result: NkiTensor,
) -> np.ndarray:
    """Accumulates ``result``'s free-axis ``op`` per partition into the Vector accumulators
    (after ``command``; see :func:`_accumulator_start`) and returns their lanes, one per
    partition of ``data``."""
    lanes = data.shape[0]
    registers, function = _accumulator_start(api, run, lanes, op, command, initial, data)
    rows = alu.as_f32(result).reshape(lanes, -1)
    registers[:lanes] = function(registers[:lanes], function.reduce(rows, axis=1))
    return registers[:lanes]


def _write_reduce_result(api: str, reduce_res: NkiTensor | None, values: np.ndarray) -> None:
    if reduce_res is None:
        return
    alu.require(api, "reduce_res", reduce_res, alu.ON_CHIP)
    if reduce_res.shape[0] != values.shape[0] or alu.per_partition(reduce_res) != 1:
        raise errors.ShapeMismatch(
            f"'{api}' reduce_res must be [{values.shape[0]}, 1], got {reduce_res!r}"
        )
    alu.write(reduce_res, values, api)


def tensor_scalar_reduce(
    dst: NkiTensor,
    data: NkiTensor,
    op0: Any,
    operand0: float | NkiTensor,
    reduce_op: Any,
    reduce_res: NkiTensor | None = None,
    reverse0: bool = False,
    reduce_cmd: reduce_cmd = reduce_cmd.reset_reduce,
    reduce_init: float | NkiTensor | None = None,
    reduce_res_negate: bool = False,
    name: Any = None,
) -> None:
    """``dst = data op0 operand0`` and its free-axis ``reduce_op`` (add, multiply, max, min)
    accumulated per partition into the Vector accumulators, read into ``reduce_res [P, 1]``."""
    api = "tensor_scalar_reduce"
    run = runtime.active_run(api)
    if op0 in language.BITVEC_OPS:
        raise errors.UnsupportedOperator(f"'{api}' takes an arithmetic op0")
    if reverse0:
        raise errors.UnsupportedOperator(
            f"'{api}' reverse0 is not supported yet (the API reference)"
        )
    _tensor_scalar(api, dst, data, op0, operand0, False, None, None, False, engine.vector)
    accumulated = _accumulate_free_axis(api, run, reduce_op, reduce_cmd, reduce_init, data, dst)
    _write_reduce_result(api, reduce_res, -accumulated if reduce_res_negate else accumulated)
    run.count("vector", "tensor_scalar_reduce", (data, operand0), (dst, reduce_res))


def tensor_scalar_cumulative(
    dst: NkiTensor,
    src: NkiTensor,
    op0: Any,
    op1: Any,
    imm0: float | NkiTensor,
    imm1: float | NkiTensor | None = None,
    reduce_cmd: reduce_cmd = reduce_cmd.reset_reduce,
    name: Any = None,
) -> None:
    """Per partition, ``reg = op1(op0(src[i], imm0), reg); dst[i] = reg`` along the free
    elements, ``reg`` starting from ``op1``'s identity (``reset_reduce``), ``imm1``
    (``load_reduce``) or its last value (``reduce``)."""
    api = "tensor_scalar_cumulative"
    run = runtime.active_run(api)
    operands = alu.require_all(api, alu.ON_CHIP, dst=dst, src=src)
    alu.check_elements(api, operands)
    for tile in (dst, src):
        if tile.dtype.kind in "iu" and tile.dtype.itemsize == 4:
            raise errors.UnsupportedDtype(f"'{api}' does not take 32-bit integers ({tile!r})")
    if op1 not in (
        language.add,
        language.subtract,
        language.multiply,
        language.maximum,
        language.minimum,
    ):
        raise errors.UnsupportedOperator(f"'{api}' op1 must be add, subtract, multiply, max or min")
    lanes = src.shape[0]
    registers, function = _accumulator_start(api, run, lanes, op1, reduce_cmd, imm1, src)
    values = _alu(api, op0)(alu.as_f32(src), _per_partition_operand(api, "imm0", imm0, src))
    values = np.asarray(values, np.float32).reshape(lanes, -1)
    result = np.zeros_like(values)
    state = registers[:lanes].copy()
    for i in range(0 if runtime.values_skipped() else values.shape[1]):  # trace-only: zeros
        state = np.asarray(function(values[:, i], state), np.float32)
        result[:, i] = state
    registers[:lanes] = state
    alu.write(dst, result, api)
    run.count("vector", "tensor_scalar_cumulative", (src, imm0, imm1), (dst,))


def exponential(
    dst: NkiTensor,
    src: NkiTensor,
    max_value: float | NkiTensor = 0.0,
    reduce_res: NkiTensor | None = None,
    reduce_cmd: reduce_cmd = reduce_cmd.idle,
    reduce_init: float | NkiTensor = 0.0,
    name: Any = None,
) -> None:
    """``dst = exp(src - max_value)`` (``max_value`` a scalar or [P, 1] tile) on the Vector
    engine (NeuronCore-v4), summing the results into the accumulators unless ``idle``."""
    api = "exponential"
    run = runtime.active_run(api)
    _require_version(api, 4)
    operands = alu.require_all(api, alu.ON_CHIP, dst=dst, src=src)
    alu.check_elements(api, operands)
    result = np.exp(alu.as_f32(src) - _per_partition_operand(api, "max_value", max_value, src))
    alu.write(dst, result, api)
    if reduce_cmd is not reduce_cmd.idle:
        lanes = src.shape[0]
        registers, _ = _accumulator_start(
            api, run, lanes, language.add, reduce_cmd, reduce_init, src
        )
        registers[:lanes] += np.asarray(result, np.float32).reshape(lanes, -1).sum(axis=1)
        _write_reduce_result(api, reduce_res, registers[:lanes])
    run.count("vector", "exponential", (src, max_value), (dst, reduce_res))


def select_reduce(
    dst: NkiTensor,
    predicate: NkiTensor,
    on_true: NkiTensor,
    on_false: float | NkiTensor,
    reduce_res: NkiTensor | None = None,
    reduce_cmd: reduce_cmd = reduce_cmd.idle,
    reduce_op: Any = language.maximum,
    reverse_pred: bool = False,
    name: Any = None,
) -> None:
    """``dst = where(predicate, on_true, on_false)`` (``on_false`` a scalar or [P, 1] tile),
    with its free-axis maximum accumulated unless ``idle`` (Vector engine)."""
    api = "select_reduce"
    run = runtime.active_run(api)
    operands = alu.require_all(api, alu.ON_CHIP, dst=dst, predicate=predicate, on_true=on_true)
    alu.check_not_both_psum(api, predicate, on_true)
    alu.check_elements(api, operands)
    # bool_ is stored as uint8 (nki.api.shared.rst); AWS's test passes a bool predicate
    # (nki/test/test_nki_isa_select_reduce.py@81ce03a).
    if predicate.dtype.kind not in "iub" or predicate.dtype.itemsize > 2:
        raise errors.UnsupportedDtype(
            f"'{api}' predicate must be bool/int8/uint8/int16/uint16, got {predicate!r}"
        )
    if reduce_op not in (language.maximum, language.max):
        raise errors.UnsupportedOperator(f"'{api}' reduces with nl.maximum only")
    chosen = predicate.values.reshape(on_true.shape) != 0
    if reverse_pred:
        chosen = ~chosen
    result = np.where(
        chosen, alu.as_f32(on_true), _per_partition_operand(api, "on_false", on_false, on_true)
    )
    alu.write(dst, result, api)
    if reduce_cmd is not reduce_cmd.idle:
        lanes = on_true.shape[0]
        registers, function = _accumulator_start(
            api, run, lanes, reduce_op, reduce_cmd, None, on_true
        )
        registers[:lanes] = function(registers[:lanes], result.reshape(lanes, -1).max(axis=1))
        _write_reduce_result(api, reduce_res, registers[:lanes])
    run.count("vector", "select_reduce", (predicate, on_true, on_false), (dst, reduce_res))


_FP32_MIN = float(np.finfo(np.float32).min)


def range_select(
    dst: NkiTensor,
    on_true_tile: NkiTensor,
    comp_op0: Any,
    comp_op1: Any,
    bound0: NkiTensor,
    bound1: NkiTensor,
    reduce_cmd: reduce_cmd = reduce_cmd.reset_reduce,
    reduce_res: NkiTensor | None = None,
    reduce_op: Any = language.maximum,
    range_start: int = 0,
    on_false_value: float = _FP32_MIN,
    name: Any = None,
) -> None:
    """``dst = on_true_tile`` where ``comp_op0(range_start + i, bound0)`` and
    ``comp_op1(range_start + i, bound1)`` hold for free index ``i``, else ``on_false_value``
    (which must be FP32_MIN); the free-axis maximum is accumulated (Vector engine, v3+)."""
    api = "range_select"
    run = runtime.active_run(api)
    _require_version(api, 3)
    operands = alu.require_all(api, alu.ON_CHIP, dst=dst, on_true_tile=on_true_tile)
    alu.check_elements(api, operands)
    comparisons = (
        language.equal,
        language.less,
        language.less_equal,
        language.greater,
        language.greater_equal,
    )
    if comp_op0 not in comparisons or comp_op1 not in comparisons:
        raise errors.UnsupportedOperator(
            f"'{api}' compares with equal/less/less_equal/greater/greater_equal"
        )
    # A float32 value: the reference's own literal for FP32_MIN (-3.4028235e+38, which
    # nki-library's attention kernels pass) is FP32_MIN once rounded to float32.
    if np.float32(on_false_value) != np.float32(_FP32_MIN):
        raise errors.UnsupportedOperator(f"'{api}' on_false_value must be FP32_MIN ({_FP32_MIN})")
    for bound_name, bound in (("bound0", bound0), ("bound1", bound1)):
        if bound.dtype != language.float32:
            raise errors.UnsupportedDtype(f"'{api}' {bound_name} must be float32, got {bound!r}")
    lanes = on_true_tile.shape[0]
    values = alu.as_f32(on_true_tile).reshape(lanes, -1)
    index = np.float32(range_start) + np.arange(values.shape[1], dtype=np.float32)[None, :]
    low = _per_partition_operand(api, "bound0", bound0, values)
    high = _per_partition_operand(api, "bound1", bound1, values)
    mask = _alu(api, comp_op0)(index, low) & _alu(api, comp_op1)(index, high)
    result = np.where(mask, values, np.float32(on_false_value))
    alu.write(dst, result, api)
    registers, function = _accumulator_start(
        api, run, lanes, reduce_op, reduce_cmd, None, on_true_tile
    )
    if reduce_cmd is not reduce_cmd.idle:
        registers[:lanes] = function(registers[:lanes], result.max(axis=1))
        _write_reduce_result(api, reduce_res, registers[:lanes])
    run.count("vector", "range_select", (on_true_tile, bound0, bound1), (dst, reduce_res))


# -- Vector engine: top-8 search ---------------------------------------------------------
def max8(dst: NkiTensor, src: NkiTensor, name: Any = None) -> None:
    """``dst [P, 8]`` = the 8 largest of each partition's 8..16384 elements, descending."""
    api = "max8"
    run = runtime.active_run(api)
    values = _top8_source(api, dst, src)
    alu.write(dst, -np.sort(-values, axis=1)[:, :8], api)
    run.count("vector", "max8", (src,), (dst,))


def _top8_source(api: str, dst: NkiTensor, src: NkiTensor) -> np.ndarray:
    alu.require(api, "dst", dst, alu.ON_CHIP)
    alu.require(api, "src", src, alu.ON_CHIP)
    alu.check_partitions(api, {"dst": dst, "src": src})
    if not 8 <= alu.per_partition(src) <= 16384 or alu.per_partition(dst) != 8:
        raise errors.ShapeMismatch(
            f"'{api}' reads 8..16384 elements per partition into [P, 8]: {src!r} -> {dst!r}"
        )
    return alu.as_f32(src).reshape(src.shape[0], -1)


def nc_find_index8(dst: NkiTensor, data: NkiTensor, vals: NkiTensor, name: Any = None) -> None:
    """``dst [P, 8]`` (uint16/uint32) = the index of the first occurrence of each of the 8
    ``vals`` in each partition of ``data``; all-ones where a value is absent. Duplicate
    ``vals`` take successive occurrences, in ascending order (nki.isa.nc_match_replace8)."""
    api = "nc_find_index8"
    run = runtime.active_run(api)
    values = _top8_source(api, dst, data)
    if dst.dtype not in (language.uint16, language.uint32):
        raise errors.UnsupportedDtype(f"'{api}' writes uint16 or uint32 indices, got {dst!r}")
    wanted = _eight_values(api, vals, data)
    indices = np.full(wanted.shape, np.iinfo(dst.dtype).max, np.int64)
    for lane in range(values.shape[0]):
        taken: set[int] = set()
        for slot in range(8):
            matches = [
                i for i in np.flatnonzero(values[lane] == wanted[lane, slot]) if i not in taken
            ]
            if matches:
                indices[lane, slot] = matches[0]
                taken.add(int(matches[0]))
    alu.write(dst, indices, api)
    run.count("vector", "nc_find_index8", (data, vals), (dst,))


def _eight_values(api: str, vals: NkiTensor, data: NkiTensor) -> np.ndarray:
    alu.require(api, "vals", vals, alu.ON_CHIP)
    if vals.shape[0] != data.shape[0] or alu.per_partition(vals) != 8:
        raise errors.ShapeMismatch(f"'{api}' vals must hold 8 values per partition, got {vals!r}")
    return alu.as_f32(vals).reshape(vals.shape[0], 8)


def nc_match_replace8(
    dst: NkiTensor,
    data: NkiTensor,
    vals: NkiTensor,
    imm: float,
    dst_idx: NkiTensor | None = None,
    name: Any = None,
) -> None:
    """``dst`` = ``data`` with the first occurrence of each of the 8 ``vals`` replaced by
    ``imm``; ``dst_idx [P, 8]`` gets the matched positions. Duplicate ``vals`` are processed
    from slot 7 down, so the first occurrence lands in the highest duplicate slot."""
    _match_replace8(dst, data, vals, imm, dst_idx, range(7, -1, -1))


def _match_replace8(
    dst: NkiTensor,
    data: NkiTensor,
    vals: NkiTensor,
    imm: float,
    dst_idx: NkiTensor | None,
    slots: range,
) -> None:
    """:func:`nc_match_replace8` matching the ``vals`` slots in the order a generation
    documents: 7 down to 0 here (nki.isa.nc_match_replace8, "Behavior with duplicate
    vals"); 0 up to 7 in the legacy generation's NumPy equivalent
    (general/nki/api/nki/isa/__init__.py@0521004c)."""
    api = "nc_match_replace8"
    run = runtime.active_run(api)
    operands = alu.require_all(api, alu.ON_CHIP, dst=dst, data=data)
    alu.check_elements(api, operands)
    lanes = data.shape[0]
    values = alu.as_f32(data).reshape(lanes, -1).copy()
    wanted = _eight_values(api, vals, data)
    positions = np.full((lanes, 8), np.iinfo(np.uint32).max, np.int64)
    for lane in range(lanes):
        matched = np.zeros(values.shape[1], np.bool_)
        for slot in slots:
            hits = np.flatnonzero((values[lane] == wanted[lane, slot]) & ~matched)
            if hits.size:
                positions[lane, slot] = hits[0]
                matched[hits[0]] = True
        values[lane, matched] = np.float32(imm)
    alu.write(dst, values, api)
    if dst_idx is not None:
        alu.require(api, "dst_idx", dst_idx, alu.ON_CHIP)
        if dst_idx.shape[0] != lanes or alu.per_partition(dst_idx) != 8:
            raise errors.ShapeMismatch(f"'{api}' dst_idx must be [{lanes}, 8], got {dst_idx!r}")
        alu.write(dst_idx, positions, api)
    run.count("vector", "nc_match_replace8", (data, vals, imm), (dst, dst_idx))


# -- GpSimd engine: gathers and scans ----------------------------------------------------
def nc_n_gather(dst: NkiTensor, data: NkiTensor, indices: NkiTensor, name: Any = None) -> None:
    """Per partition, ``dst[p].flat[i] = data[p].flat[indices[p].flat[i]]`` (SBUF; uint32
    indices; ``dst`` in ``data``'s dtype; GpSimd engine)."""
    api = "nc_n_gather"
    run = runtime.active_run(api)
    operands = alu.require_all(api, alu.SBUF, dst=dst, data=data, indices=indices)
    alu.check_partitions(api, operands)
    if indices.dtype != language.uint32 or dst.dtype != data.dtype:
        raise errors.UnsupportedDtype(f"'{api}' needs uint32 indices and dst in {data.dtype}")
    if alu.per_partition(dst) != alu.per_partition(indices):
        raise errors.ShapeMismatch(f"'{api}' writes one element per index: {indices!r} -> {dst!r}")
    flat = indices.values.reshape(indices.shape[0], -1).astype(np.int64)
    count = alu.per_partition(data)
    if flat.size and flat.max() >= count:
        raise errors.TensorAccessOutOfBound(f"'{api}' index {flat.max()} outside 0..{count - 1}")
    rows = data.values.reshape(data.shape[0], -1)
    alu.write(dst, np.take_along_axis(rows, flat, axis=1), api)
    run.count("gpsimd", "nc_n_gather", (data, indices), (dst,))


def nonzero_with_count(
    dst: NkiTensor, src: NkiTensor, index_offset: int = 0, padding_val: int = -1, name: Any = None
) -> None:
    """On partitions 0, 16, ..., 112 only: the indices (plus ``index_offset``) of ``src``'s
    nonzero elements, then ``padding_val``, then their count (GpSimd engine, v3+). The free
    axes count as one, row-major: ``dst`` has one element per partition more than ``src``
    ("exactly 1 more element than the source tensor in the free dimension", nki.isa
    reference; nki-library@d2ad3a5 core/subkernels/find_nonzero_indices.py passes a 3-D
    ``src`` [P, tiles, T] with a 2-D ``dst`` [P, tiles * T + 1])."""
    api = "nonzero_with_count"
    run = runtime.active_run(api)
    _require_version(api, 3)
    alu.require(api, "dst", dst, alu.SBUF)
    alu.require(api, "src", src, alu.SBUF)
    alu.check_partitions(api, {"dst": dst, "src": src})
    if src.dtype not in (language.float32, language.int32) or dst.dtype != language.int32:
        raise errors.UnsupportedDtype(
            f"'{api}' reads float32/int32 into int32, got {src!r} -> {dst!r}"
        )
    free = alu.per_partition(src)
    if alu.per_partition(dst) != free + 1:
        raise errors.ShapeMismatch(
            f"'{api}' needs dst with F + 1 elements per partition for src with F: "
            f"{src!r} -> {dst!r}"
        )
    for lane in range(0, src.shape[0], 16):
        found = np.flatnonzero(src.values[lane] != 0) + int(index_offset)
        row = np.full(free + 1, int(padding_val), np.int64)
        row[: found.size] = found
        row[-1] = found.size
        dst.values[lane] = row.astype(np.int32).reshape(dst.shape[1:])
    run.count("gpsimd", "nonzero_with_count", (src,), (dst,))


# -- DMA: transposes ----------------------------------------------------------------------
# nki.isa.dma_transpose: the permutation of each rank.
_DMA_TRANSPOSE_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


def dma_transpose(
    dst: NkiTensor,
    src: NkiTensor,
    axes: Any = None,
    priority: Any = None,
    dge_mode: dge_mode = dge_mode.unknown,
    oob_mode: oob_mode = oob_mode.error,
    name: Any = None,
) -> None:
    """``dst = src`` transposed by a DMA: 2-D [1, 0], 3-D [2, 1, 0], 4-D [3, 1, 2, 0] (or
    ``axes``); 2-byte dtypes, ``src.shape[-1] <= 128``."""
    _dma_transpose(dst, src, axes, two_byte_rows=True, oob=oob_mode)


def _dma_transpose(
    dst: NkiTensor,
    src: NkiTensor,
    axes: Any,
    two_byte_rows: bool,
    oob: oob_mode = oob_mode.error,
) -> None:
    """:func:`dma_transpose`; ``two_byte_rows``: the rule "src.dtype is 2 bytes,
    src.shape[-1] <= 128" (nki.isa.dma_transpose), which the legacy generation's reference
    (general/nki/api/nki/isa/__init__.py@0521004c) does not state."""
    api = "dma_transpose"
    run = runtime.active_run(api)
    alu.require(api, "dst", dst, (*alu.HBM, *alu.SBUF))
    alu.require(api, "src", src, (*alu.HBM, *alu.SBUF), oob is oob_mode.skip)
    permutation = tuple(axes) if axes is not None else _DMA_TRANSPOSE_AXES.get(src.ndim)
    if permutation is None or sorted(permutation) != list(range(src.ndim)):
        raise errors.ShapeMismatch(
            f"'{api}' transposes 2-D to 4-D tensors, got {src!r} axes={axes}"
        )
    if two_byte_rows and (src.dtype.itemsize not in (2, 4) or src.shape[-1] > 128):
        raise errors.UnsupportedDtype(
            f"'{api}' moves 2-byte dtypes with src.shape[-1] <= 128, got {src!r}"
        )
    if two_byte_rows and src.dtype.itemsize == 4:
        warnings.warn(
            f"'{api}' of {src!r}: the reference allows 2-byte dtypes (nki.isa.dma_transpose), "
            "but nki-library@d2ad3a5's float32 attention_cte and moe_tkg kernels transpose "
            "4-byte data by DMA in their trn2 tests: simulated as a transpose",
            errors.DeviceRanItWarning,
            stacklevel=3,
        )
    values = alu.dma_values(src, dst.dtype).transpose(permutation)
    if values.shape != dst.shape:
        raise errors.ShapeMismatch(f"'{api}' of {src!r} gives {list(values.shape)}, dst is {dst!r}")
    if src.out_of_bounds is not None:  # skipped: what the gathered row lands on stays
        outside = np.broadcast_to(
            src.out_of_bounds.reshape((-1,) + (1,) * (src.ndim - 1)), src.shape
        ).transpose(permutation)
        values = np.where(outside, dst.values, values)
    alu.write(dst, values, api)
    run.count_dma(
        not src.on_chip,
        not dst.on_chip,
        src.size * src.dtype.itemsize,
        "dma_transpose",
        (src,),
        (dst,),
    )


# -- randomness ---------------------------------------------------------------------------
def dropout(dst: NkiTensor, data: NkiTensor, prob: float | NkiTensor, name: Any = None) -> None:
    """``dst = data`` with each element zeroed with probability ``prob`` (a scalar or a
    [P, 1] tile); ``dst`` keeps ``data``'s dtype (Vector engine)."""
    _dropout(dst, data, prob, same_dtype=True)


def _dropout(dst: NkiTensor, data: NkiTensor, prob: float | NkiTensor, same_dtype: bool) -> None:
    """:func:`dropout`, also ``nl.dropout`` of both generations; ``same_dtype``: the rule
    that ``dst`` keeps ``data``'s dtype (nki.isa.dropout, nki/api/nki/isa/__init__.py
    @81ce03a), where ``nl.dropout`` and the legacy instruction take a ``dtype``
    (general/nki/api/nki/isa/__init__.py@0521004c)."""
    api = "dropout"
    run = runtime.active_run(api)
    operands = alu.require_all(api, alu.ON_CHIP, dst=dst, data=data)
    alu.check_elements(api, operands)
    if same_dtype and dst.dtype != data.dtype:
        raise errors.UnsupportedDtype(f"'{api}' dst must have data's dtype {data.dtype}")
    drop = _per_partition_operand(api, "prob", prob, data)
    keep = prng.uniform(run, "vector", data.shape) >= drop
    alu.write(dst, np.where(keep, data.values, 0), api)
    run.count("vector", "dropout", (data, prob), (dst,))


def rng(dst: NkiTensor, engine: engine = engine.vector, name: Any = None) -> None:
    """32 random bits per element of the integer tile ``dst``, truncated to its width."""
    api = "rng"
    run = runtime.active_run(api)
    tiles = [alu.require(api, "dst", dst, alu.ON_CHIP)]
    allowed = ("vector", "gpsimd") if runtime.current_target().version >= 3 else ("vector",)
    chosen = _engine(api, engine, "vector", allowed)
    if chosen == "gpsimd":
        alu.check_no_psum_on_gpsimd(api, tiles)
    if dst.dtype.kind not in "iu":
        raise errors.UnsupportedDtype(f"'{api}' writes integer tiles, got {dst!r}")
    bits = prng.bits(run, chosen, dst.shape)
    unsigned = np.dtype(f"u{dst.dtype.itemsize}")  # keep the least significant bits
    dst.values[...] = bits.astype(unsigned).view(dst.dtype)
    run.count(chosen, "rng", (), (dst,))


def rand2(dst: NkiTensor, min: float | NkiTensor, max: float | NkiTensor, name: Any = None) -> None:
    """Uniform random values in ``[min, max]`` (scalars or [P, 1] tiles), NeuronCore-v4."""
    api = "rand2"
    run = runtime.active_run(api)
    _require_version(api, 4)
    alu.require(api, "dst", dst, alu.ON_CHIP)
    low = _per_partition_operand(api, "min", min, dst)
    high = _per_partition_operand(api, "max", max, dst)
    if np.any(np.asarray(low) >= np.asarray(high)):
        raise ValueError(f"'{api}' needs min < max")
    alu.write(dst, low + (high - low) * prng.uniform(run, "vector", dst.shape), api)
    run.count("vector", "rand2", (min, max), (dst,))


def set_rng_seed(src_seeds: NkiTensor, name: Any = None) -> None:
    """Seeds the Vector engine's generators (every lane) from the 32-bit value of the
    ``[1, 1]`` SBUF/PSUM tile ``src_seeds``: one seed, one sequence (nki.isa.set_rng_seed)."""
    api = "set_rng_seed"
    run = runtime.active_run(api)
    alu.require(api, "src_seeds", src_seeds, alu.ON_CHIP)
    if src_seeds.shape != (1, 1) or src_seeds.dtype.itemsize != 4:
        raise errors.ShapeMismatch(f"'{api}' takes a [1, 1] 32-bit tile, got {src_seeds!r}")
    seed = int(src_seeds.values.reshape(-1).view(np.uint32)[0])
    run.rng_states["vector"] = prng.seeded(seed, "vector")
    run.count("vector", api, (src_seeds,), ())


def _rng_state_operand(api: str, tile: NkiTensor, requested: engine, name: str) -> str:
    """The engine of a PRNG state transfer and the checks of nki.isa.rand_set_state /
    rand_get_state: NeuronCore-v3+, GpSimd (and the Vector engine from v4), a uint32 tile
    of 6 (GpSimd) or 24 (Vector) elements per partition, GpSimd without PSUM."""
    _require_version(api, 3)
    allowed = ("gpsimd", "vector") if runtime.current_target().version >= 4 else ("gpsimd",)
    chosen = _engine(api, requested, "gpsimd", allowed)
    alu.require(api, name, tile, alu.ON_CHIP)
    if chosen == "gpsimd":
        alu.check_no_psum_on_gpsimd(api, [tile])
    if tile.dtype != language.uint32 or alu.per_partition(tile) != prng.WORDS[chosen]:
        raise errors.ShapeMismatch(
            f"'{api}' on the {chosen} engine moves {prng.WORDS[chosen]} uint32 per partition, "
            f"got {tile!r}"
        )
    return chosen


def rand_set_state(src_seeds: NkiTensor, engine: engine = engine.gpsimd, name: Any = None) -> None:
    """Sets the PRNG state of each compute lane of ``engine`` from the matching partition
    of ``src_seeds`` (uint32, SBUF; nki.isa.rand_set_state)."""
    api = "rand_set_state"
    run = runtime.active_run(api)
    alu.require(api, "src_seeds", src_seeds, alu.SBUF)
    chosen = _rng_state_operand(api, src_seeds, engine, "src_seeds")
    lanes = src_seeds.shape[0]
    prng.states(run, chosen)[:lanes] = src_seeds.values.reshape(lanes, -1)
    run.count(chosen, api, (src_seeds,), ())


def rand_get_state(dst: NkiTensor, engine: engine = engine.gpsimd, name: Any = None) -> None:
    """Writes the PRNG state of each compute lane of ``engine`` into the matching partition
    of ``dst`` (uint32; SBUF, or PSUM from NeuronCore-v4 on the Vector engine;
    nki.isa.rand_get_state)."""
    api = "rand_get_state"
    run = runtime.active_run(api)
    if runtime.current_target().version < 4:
        alu.require(api, "dst", dst, alu.SBUF)
    chosen = _rng_state_operand(api, dst, engine, "dst")
    lanes = dst.shape[0]
    alu.write(dst, prng.states(run, chosen)[:lanes].copy(), api)
    run.count(chosen, api, (), (dst,))


# nki.isa.topk, "Constraints".
_TOPK_SNAKE = 16


def topk(
    val_dst: NkiTensor,
    idx_dst: NkiTensor,
    src: NkiTensor,
    n: int,
    sorted: bool = False,
    name: Any = None,
) -> None:
    """The ``k`` (``val_dst``'s free size) largest of ``n`` bfloat16 values of each group of
    16 partitions and their indices, on the GpSimd engine (nki.isa.topk, NKI 0.6; layout and
    ``sorted`` as the 0.7 reference gives them: https://awsdocs-neuron.readthedocs-hosted.com/
    en/v2.33.0/nki/api/generated/nki.isa.topk.html). A group's
    ``src`` holds one "snake": element ``s`` at partition ``s % 16``, column ``s // 16``.
    Its results come back in the same layout: result ``j`` at partition ``j % 16``, column
    ``j // 16`` of ``val_dst`` (bfloat16) and ``idx_dst`` (uint32 snake indices), so only
    the first ``ceil(k / 16)`` columns are written. The simulator gives them in descending
    order of value (ties: lower index first), whatever ``sorted`` says: the copy of the page
    this follows is cut off before it says which order ``sorted=True`` gives. The device
    writes a column across all 16 partitions at once; where 16 does not divide ``k``, the
    last column's partitions past the ``k``-th result get NaN and index 0xFFFFFFFF here
    (the reference gives no values)."""
    api = "topk"
    run = runtime.active_run(api)
    if not isinstance(sorted, bool):
        raise TypeError(f"'{api}' sorted must be True or False, got {sorted!r}")
    alu.require_all(api, alu.SBUF, val_dst=val_dst, idx_dst=idx_dst, src=src)
    alu.check_partitions(api, {"val_dst": val_dst, "idx_dst": idx_dst, "src": src})
    partitions, k, n = src.shape[0], alu.per_partition(val_dst), int(n)
    if src.dtype != language.bfloat16 or val_dst.dtype != language.bfloat16:
        raise errors.UnsupportedDtype(f"'{api}' reads and writes bfloat16 values: {src!r}")
    if idx_dst.dtype != language.uint32:
        raise errors.UnsupportedDtype(f"'{api}' writes uint32 indices, got {idx_dst!r}")
    if val_dst.ndim != 2 or idx_dst.shape != val_dst.shape or partitions % _TOPK_SNAKE:
        raise errors.ShapeMismatch(
            f"'{api}' needs val_dst and idx_dst [P, k] with P a multiple of 16: "
            f"{val_dst!r}, {idx_dst!r}"
        )
    if not 8 <= n < 65536 or not 1 <= k <= min(n, 32767):
        raise errors.SizeOfDimensionExceedArchLimit(
            f"'{api}' takes 8 <= n < 65536 and 1 <= K < 32768 with K <= n; got n={n}, K={k}"
        )
    if alu.per_partition(src) < -(-n // _TOPK_SNAKE):
        raise errors.ShapeMismatch(f"'{api}' n={n} needs {-(-n // 16)} columns of {src!r}")
    columns = alu.as_f32(src).reshape(partitions // _TOPK_SNAKE, _TOPK_SNAKE, -1)
    written = -(-k // _TOPK_SNAKE)  # the columns holding results; the others keep theirs
    values = np.empty((partitions, written), np.float32)
    indices = np.empty((partitions, written), np.int64)
    for group, block in enumerate(columns):
        snake = block.T.reshape(-1)[:n]
        top = np.lexsort((np.arange(n), -snake))[:k]  # largest first, ties: lower index
        snake_values = np.full(written * _TOPK_SNAKE, np.nan, np.float32)
        snake_indices = np.full(written * _TOPK_SNAKE, 0xFFFFFFFF, np.int64)
        snake_values[:k], snake_indices[:k] = snake[top], top
        rows = slice(group * _TOPK_SNAKE, (group + 1) * _TOPK_SNAKE)
        values[rows] = snake_values.reshape(written, _TOPK_SNAKE).T
        indices[rows] = snake_indices.reshape(written, _TOPK_SNAKE).T
    alu.write(val_dst[:, 0:written], values, api)
    alu.write(idx_dst[:, 0:written], indices, api)
    run.count("gpsimd", api, (src,), (val_dst, idx_dst))


# -- cross-partition movement, DMA compute, core-to-core transfers -------------------------
def nc_stream_shuffle(dst: NkiTensor, src: NkiTensor, shuffle_mask: Any, name: Any = None) -> None:
    """Within each 32-partition quadrant, ``dst`` partition ``i`` takes ``src`` partition
    ``shuffle_mask[i]`` (255: ``dst`` partition ``i`` unchanged); same dtype and elements per
    partition (Vector engine)."""
    api = "nc_stream_shuffle"
    run = runtime.active_run(api)
    alu.require(api, "dst", dst, alu.ON_CHIP)
    alu.require(api, "src", src, alu.ON_CHIP)
    mask = [int(m) for m in shuffle_mask]
    if len(mask) != 32 or any(not (0 <= m < 32 or m == 255) for m in mask):
        raise errors.ShapeMismatch(
            f"'{api}' shuffle_mask must list 32 partitions (or 255), got {mask}"
        )
    if dst.dtype != src.dtype or alu.per_partition(dst) != alu.per_partition(src):
        raise errors.ShapeMismatch(
            f"'{api}' needs one dtype and elements per partition: {src!r} -> {dst!r}"
        )
    source = src.values.reshape(src.shape[0], -1).copy()  # in-place shuffles read the old values
    result = dst.values.reshape(dst.shape[0], -1).copy()
    for partition in range(dst.shape[0]):
        quadrant, lane = divmod(partition, 32)
        if mask[lane] != 255:
            origin = quadrant * 32 + mask[lane]
            if origin >= src.shape[0]:
                raise errors.TensorAccessOutOfBound(f"'{api}' reads partition {origin} of {src!r}")
            result[partition] = source[origin]
    alu.write(dst, result, api)
    run.count("vector", "nc_stream_shuffle", (src,), (dst,))


def dma_compute(
    dst: NkiTensor,
    srcs: list[NkiTensor],
    reduce_op: Any,
    scales: Any = None,
    unique_indices: bool = True,
    oob_mode: oob_mode = oob_mode.error,
    name: Any = None,
) -> None:
    """``dst = srcs[0] + srcs[1] + ...`` computed by a DMA in float32 (``reduce_op`` nl.add,
    ``scales`` all 1.0, up to 16 sources of ``dst``'s element count, HBM or SBUF)."""
    api = "dma_compute"
    run = runtime.active_run(api)
    skipping = oob_mode is _OOB_SKIP
    alu.require(api, "dst", dst, (*alu.HBM, *alu.SBUF), skipping)
    if reduce_op is not language.add:
        raise errors.UnsupportedOperator(f"'{api}' reduces with nl.add only")
    if scales is not None and any(float(scale) != 1.0 for scale in scales):
        raise errors.UnsupportedOperator(f"'{api}' scales must all be 1.0, got {scales}")
    if not 1 <= len(srcs) <= 16:
        raise errors.ShapeMismatch(f"'{api}' takes 1 to 16 sources, got {len(srcs)}")
    total = np.zeros(dst.size, np.float32)
    skip = None
    for i, src in enumerate(srcs):
        alu.require(api, f"srcs[{i}]", src, (*alu.HBM, *alu.SBUF), skipping)
        if src.size != dst.size:
            raise errors.ShapeMismatch(f"'{api}' srcs[{i}] {src!r} does not match {dst!r}")
        total += alu.as_f32(src).reshape(-1)
        rows = alu.skipped_rows(api, src, dst)
        skip = rows if skip is None else skip if rows is None else skip | rows
    alu.write(dst, total, api, skip)
    run.count_dma(
        any(not s.on_chip for s in srcs),
        not dst.on_chip,
        dst.size * dst.dtype.itemsize,
        "dma_compute",
        (*srcs,),
        (dst,),
    )


@reference.deprecated("nki.isa.sendrecv")
def sendrecv(
    src: NkiTensor,
    dst: NkiTensor,
    send_to_rank: int,
    recv_from_rank: int,
    pipe_id: int,
    dma_engine: dma_engine = dma_engine.dma,
    name: Any = None,
) -> None:
    """Deprecated in NKI 0.8 for :func:`nki.lnc.sendrecv`, which it runs; NKI 0.8 ignores
    ``pipe_id`` (sendrecvs pair up by program order)."""
    from asickernels.simulate.nki import lnc  # lnc builds on this module

    lnc.sendrecv(src, dst, send_to_rank, recv_from_rank, dma_engine, name)


@reference.deprecated("nki.isa.sendrecv_compute")
def sendrecv_compute(
    src: NkiTensor,
    dst: NkiTensor,
    send_to_rank: int,
    recv_from_rank: int,
    reduce_op: Any,
    name: Any = None,
) -> None:
    """NKI 0.7's ``nki.isa.sendrecv_compute``, deprecated in 0.8 for
    :func:`nki.lnc.sendrecv_compute`, which it runs."""
    from asickernels.simulate.nki import lnc  # lnc builds on this module

    lnc.sendrecv_compute(src, dst, send_to_rank, recv_from_rank, reduce_op, name)


# -- engine sequencer registers ----------------------------------------------------------
class VirtualRegister(NKIObject):
    """A 32-bit integer register of an engine sequencer (deprecated in NKI 0.8 for
    :class:`NkiScalar`). Python control flow on it (``while reg:``, ``int(reg)``,
    ``range(reg)``) ran under the parser frontend, which NKI 0.7 removed: it still runs
    here, with a :class:`~asickernels.simulate.nki.errors.DeprecatedApiWarning`."""

    __slots__ = ("frozen", "value")

    def __init__(self, state: int | None = None, frozen: bool = False) -> None:
        reference.warn_changed("nki.isa.VirtualRegister")
        self.value = 0 if state is None else int(state)
        self.frozen = frozen

    @classmethod
    def holding(cls, value: int, frozen: bool = False) -> VirtualRegister:
        """A register holding ``value``, made by the simulator (no warning)."""
        register = cls.__new__(cls)
        register.value, register.frozen = int(value), frozen
        return register

    def __index__(self) -> int:
        reference.warn_changed("nki.isa.VirtualRegister.__index__")
        return self.value

    __int__ = __index__

    def __bool__(self) -> bool:
        reference.warn_changed("nki.isa.VirtualRegister.__bool__")
        return self.value != 0

    def __repr__(self) -> str:
        return f"VirtualRegister({self.value})"


@reference.deprecated("nki.isa.register_alloc")
def register_alloc(x: int | None = None) -> VirtualRegister:
    """A new register, holding ``x`` (0 when None)."""
    runtime.active_run("register_alloc")
    return VirtualRegister.holding(0 if x is None else x)


@reference.deprecated("nki.isa.register_move")
def register_move(dst: VirtualRegister, src: int | VirtualRegister) -> None:
    """``dst = src`` (an integer or another register)."""
    runtime.active_run("register_move")
    dst.value = src.value if isinstance(src, VirtualRegister) else int(src)


def _single_element(api: str, tensor: NkiTensor) -> NkiTensor:
    alu.require(api, "tensor", tensor, (*alu.HBM, *alu.SBUF))
    if tensor.size != 1 or tensor.dtype.itemsize > 4:
        raise errors.ShapeMismatch(f"'{api}' moves one value of up to 32 bits, got {tensor!r}")
    return tensor


@reference.deprecated("nki.isa.register_load")
def register_load(dst: VirtualRegister, src: NkiTensor) -> None:
    """``dst`` = the single (up to 32-bit) value of ``src`` (HBM or SBUF)."""
    runtime.active_run("register_load")
    dst.value = int(_single_element("register_load", src).values.reshape(-1)[0])


@reference.deprecated("nki.isa.register_store")
def register_store(dst: NkiTensor, src: VirtualRegister) -> None:
    """Writes the register ``src`` into the single-element tensor ``dst`` (HBM or SBUF)."""
    runtime.active_run("register_store")
    alu.write(_single_element("register_store", dst), np.array([src.value]), "register_store")


# -- Scalar engine: activate2 (NeuronCore-v4) ---------------------------------------------
_ACTIVATE2_STAGES = {
    (language.multiply, language.add),
    (language.multiply, language.subtract),
    (language.multiply, language.bypass),
    (language.add, language.bypass),
    (language.subtract, language.bypass),
    (language.bypass, language.bypass),
}
# activate2's reductions and their identities.
_SCALAR_REDUCE: dict[Any, tuple[Any, float]] = {
    language.add: (np.add, 0.0),
    language.maximum: (np.maximum, -np.inf),
    language.minimum: (np.minimum, np.inf),
    language.abs_max: (lambda a, b: np.maximum(np.abs(a), np.abs(b)), 0.0),
    language.abs_min: (lambda a, b: np.minimum(np.abs(a), np.abs(b)), np.inf),
}


def activate2(
    dst: NkiTensor,
    op: Any,
    data: NkiTensor,
    imm0: float | NkiTensor,
    imm1: float | NkiTensor,
    op0: Any,
    op1: Any,
    relu_param: float | NkiTensor = 0.0,
    reverse0: bool = False,
    reverse1: bool = False,
    reduce_op: Any = None,
    reduce_res: NkiTensor | None = None,
    reduce_cmd: reduce_cmd = reduce_cmd.idle,
    engine: engine = engine.scalar,
    name: Any = None,
) -> None:
    """``dst = op((data op0 imm0) op1 imm1)`` on the Scalar engine (NeuronCore-v4), or the
    GpSimd engine without reduction (``engine``, NKI 0.7), ``op0``
    / ``op1`` one of the six documented pairs (``nl.bypass`` skips a stage), ``relu_param``
    the negative slope of ``nl.prelu``; optional free-axis reduction into the Scalar
    accumulators (add, max, min, abs_max, abs_min)."""
    api = "activate2"
    run = runtime.active_run(api)
    _require_version(api, 4)
    operands = alu.require_all(api, alu.ON_CHIP, dst=dst, data=data)
    alu.check_elements(api, operands)
    chosen = _activation_engine(api, engine, operands, reduce_op, reduce_res, reduce_cmd)
    if (op0, op1) not in _ACTIVATE2_STAGES:
        raise errors.UnsupportedOperator(f"'{api}' does not take op0={op0!r}, op1={op1!r}")
    values = alu.as_f32(data)
    for stage, immediate, reverse in ((op0, imm0, reverse0), (op1, imm1, reverse1)):
        if stage is language.bypass:
            continue
        operand = _per_partition_operand(api, "immediate", immediate, data)
        function = language.ALU_OPS[stage]
        values = function(operand, values) if reverse else function(values, operand)
    if op is language.prelu:
        slope = _per_partition_operand(api, "relu_param", relu_param, data)
        result = np.where(values >= 0, values, values * slope)
    elif op in language.ACTIVATIONS:
        result = language.ACTIVATIONS[op](values)
    else:
        raise errors.UnsupportedOperator(f"'{api}' does not take op={op!r}")
    result = np.asarray(result, np.float32)
    alu.write(dst, result, api)
    if reduce_cmd is not reduce_cmd.idle or reduce_res is not None:
        if reduce_op not in _SCALAR_REDUCE:
            raise errors.UnsupportedOperator(
                f"'{api}' reduces with add, maximum, minimum, abs_max or abs_min"
            )
        function, identity = _SCALAR_REDUCE[reduce_op]
        registers = _reduce_registers(run)
        lanes = data.shape[0]
        if reduce_cmd in (reduce_cmd.reset, reduce_cmd.reset_reduce):
            registers[:lanes] = identity
        if reduce_cmd in (reduce_cmd.reduce, reduce_cmd.reset_reduce):
            rows = result.reshape(lanes, -1)
            folded = rows[:, 0]
            for column in range(1, rows.shape[1]):
                folded = function(folded, rows[:, column])
            registers[:lanes] = function(registers[:lanes], folded)
        _write_reduce_result(api, reduce_res, registers[:lanes])
    run.count(chosen, "activate2", (data, imm0, imm1), (dst, reduce_res))


def local_gather(
    dst: NkiTensor,
    src_buffer: NkiTensor,
    index: NkiTensor,
    num_elem_per_idx: int = 1,
    num_valid_indices: int | None = None,
    name: Any = None,
) -> None:
    """GpSimd gather: each of the 8 cores serves 16 partitions; it flattens its 16-partition
    slice of ``index`` (uint16, partition axis first) to its first ``num_valid_indices``
    offsets, and every partition it serves reads ``num_elem_per_idx`` contiguous free
    elements of ``src_buffer`` at each offset (the NumPy semantics of
    nki/test/test_nki_isa_local_gather.py)."""
    api = "local_gather"
    run = runtime.active_run(api)
    alu.require_all(api, alu.SBUF, dst=dst, src_buffer=src_buffer, index=index)
    partitions = src_buffer.shape[0]
    if index.shape[0] != partitions or partitions % 16:
        raise errors.NumPartitionMismatch(
            f"'{api}' needs src_buffer and index on the same multiple of 16 partitions: "
            f"{src_buffer!r}, {index!r}"
        )
    if index.dtype != language.uint16 or dst.dtype != src_buffer.dtype:
        raise errors.UnsupportedDtype(f"'{api}' takes uint16 indices and keeps src_buffer's dtype")
    if int(num_elem_per_idx) not in (1, 2, 4, 8, 16, 32):
        raise errors.UnsupportedOperator(f"'{api}' num_elem_per_idx must be 1, 2, 4, 8, 16 or 32")
    per_core = 16 * alu.per_partition(index)
    if num_valid_indices is None:
        warnings.warn(
            f"'{api}' without num_valid_indices: NKI 0.8 leaves the results undefined and warns;"
            " pass it explicitly (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/"
            "about-neuron/announcements/neuron2.x/announce-intent-eos-nki-virtualregister-lnc-"
            "apis.html). The simulator gathers every index slot, as releases before 0.8 did.",
            errors.DeprecatedApiWarning,
            stacklevel=3,
        )
    valid = per_core if num_valid_indices is None else int(num_valid_indices)
    if not 0 < valid <= min(per_core, 4096):
        raise errors.ShapeMismatch(
            f"'{api}' num_valid_indices {valid} outside 1..{min(per_core, 4096)}"
        )
    width = int(num_elem_per_idx)
    if alu.per_partition(dst) != valid * width or dst.shape[0] != partitions:
        raise errors.ShapeMismatch(
            f"'{api}' writes {valid} x {width} elements per partition into {dst!r}"
        )
    rows = src_buffer.values.reshape(partitions, -1)
    offsets = index.values.reshape(partitions, -1).astype(np.int64)
    gathered = np.empty((partitions, valid, width), rows.dtype)
    for start in range(0, partitions, 16):
        core_offsets = offsets[start : start + 16].flatten(order="F")[:valid]
        if core_offsets.max() + width > rows.shape[1]:
            raise errors.TensorAccessOutOfBound(
                f"'{api}' offset {core_offsets.max()} of {src_buffer!r}"
            )
        columns = core_offsets[:, None] + np.arange(width)[None, :]
        gathered[start : start + 16] = rows[start : start + 16][:, columns]
    alu.write(dst, gathered, api)
    run.count("gpsimd", "local_gather", (src_buffer, index), (dst,))


def sequence_bounds(dst: NkiTensor, segment_ids: NkiTensor, name: Any = None) -> None:
    """For ``segment_ids [1, n]``, ``dst [1, 2, n]`` holds each element's segment start and
    end (exclusive); padding (id 0) gets start ``n`` and end ``-1`` (GpSimd; float32 or
    int32; the NumPy semantics of nki/test/test_nki_isa_sequence_bounds.py)."""
    api = "sequence_bounds"
    run = runtime.active_run(api)
    alu.require_all(api, alu.SBUF, dst=dst, segment_ids=segment_ids)
    n = alu.per_partition(segment_ids)
    if segment_ids.shape[0] != 1 or dst.shape[0] != 1 or alu.per_partition(dst) != 2 * n:
        raise errors.ShapeMismatch(
            f"'{api}' maps [1, n] ids to [1, 2, n] bounds: {segment_ids!r} -> {dst!r}"
        )
    for tile in (dst, segment_ids):
        if tile.dtype not in (language.float32, language.int32):
            raise errors.UnsupportedDtype(f"'{api}' takes float32 or int32, got {tile!r}")
    ids = segment_ids.values.reshape(-1)
    starts = np.empty(n, np.int64)
    ends = np.empty(n, np.int64)
    for i in range(n):
        starts[i] = n if ids[i] == 0 else (starts[i - 1] if i and ids[i] == ids[i - 1] else i)
    for i in range(n - 1, -1, -1):
        ends[i] = (
            -1 if ids[i] == 0 else (ends[i + 1] if i < n - 1 and ids[i] == ids[i + 1] else i + 1)
        )
    alu.write(dst, np.stack([starts, ends])[None], api)
    run.count("gpsimd", "sequence_bounds", (segment_ids,), (dst,))


# -- removed instructions -----------------------------------------------------------------
@reference.deprecated("nki.isa.tensor_copy_dynamic_src")
def tensor_copy_dynamic_src(
    dst: NkiTensor, src: NkiTensor, engine: engine = engine.unknown, name: Any = None
) -> None:
    """:func:`tensor_copy` from a ``src`` view at a run-time offset (``.ap(scalar_offset=)``
    makes it), the Neuron 2.27 instruction."""
    tensor_copy(dst, src, engine, name)


@reference.deprecated("nki.isa.tensor_copy_dynamic_dst")
def tensor_copy_dynamic_dst(
    dst: NkiTensor, src: NkiTensor, engine: engine = engine.unknown, name: Any = None
) -> None:
    """:func:`tensor_copy` into a ``dst`` view at a run-time offset, the Neuron 2.27
    instruction."""
    tensor_copy(dst, src, engine, name)


# -- instruction handles ------------------------------------------------------------------
class NkiInstruction(NKIObject):
    """The handle every ``nki.isa`` instruction returns (nki.isa.NkiInstruction, NKI 0.6).
    ``consumer.depends_on(*producers)`` orders the consumer after the producers; the
    simulator runs in program order, which satisfies every edge, and checks the documented
    rule that an edge does not cross into or out of a dynamic loop (``nl.fori_loop`` /
    ``nl.while_loop``): both instructions at the same nesting, or the producer in an
    enclosing scope."""

    __slots__ = ("handle", "loops", "producers")

    def __init__(self, handle: Any) -> None:
        self.handle = handle  # the instruction's name
        run = runtime.active_run(str(handle))
        self.loops = tuple(run.dynamic_loops)
        self.producers: list[NkiInstruction] = []

    def depends_on(
        self, *producers: NkiInstruction, kind: dependency | None = None
    ) -> NkiInstruction:
        if kind is not None and not isinstance(kind, dependency):
            raise TypeError(
                f"depends_on kind must be nki.isa.dependency.runtime or .schedule, got {kind!r}"
            )
        for producer in producers:
            if not isinstance(producer, NkiInstruction):
                raise TypeError(f"depends_on takes NkiInstructions, got {producer!r}")
            if self.loops[: len(producer.loops)] != producer.loops:
                raise errors.NkiValidationError(
                    f"{self!r} depends on {producer!r} across a dynamic loop boundary: the "
                    "producer must sit at the consumer's loop nesting or in an enclosing scope"
                )
            self.producers.append(producer)
        return self

    def __repr__(self) -> str:
        return f"NkiInstruction({self.handle})"


def _returns_instruction(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def instruction(*args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs)
        return NkiInstruction(function.__name__) if result is None else result

    return instruction


# Every instruction returns its handle (or its value, when it has one: scalar_load, ...).
for _name in __all__:
    _function = globals()[_name]
    if callable(_function) and not isinstance(_function, type):
        globals()[_name] = _returns_instruction(_function)
