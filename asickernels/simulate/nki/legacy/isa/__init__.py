"""``neuronxcc.nki.isa`` (``nisa``) of Neuron SDK 2.2x: one instruction per call, each
*returning* its result tile (the current API passes ``dst`` first instead). Signatures and
rules follow general/nki/api/nki/isa/__init__.py at aws-neuron-sdk 0521004c (Neuron 2.26).
Engines compute in float32 and cast the result to ``dtype`` (default: the input's dtype, or
the promoted dtype of two inputs)."""

from __future__ import annotations

import math
import warnings
import weakref
from collections.abc import Sequence
from enum import IntEnum
from typing import Any

import numpy as np

from asickernels.simulate.nki import alu, errors, runtime, trace
from asickernels.simulate.nki import isa as core_isa
from asickernels.simulate.nki import language as core_language
from asickernels.simulate.nki.legacy import language as nl
from asickernels.simulate.nki.legacy.tile import (
    IndexGrid,
    Mask,
    Tensor,
    check_in_bounds,
    mask_values,
)
from asickernels.simulate.nki.tensor import MemoryRegion, NkiTensor, is_float, nki_dtype

NkiValidationError = errors.NkiValidationError


# The enums keep the SDK's names and values (general/nki/api/nki/isa/__init__.py).
class engine(IntEnum):
    tensor = 1
    vector = 5
    scalar = 2
    gpsimd = 3
    sync = 6
    unknown = 0


dma_engine = "dma"  # DMA queues are not an ``engine`` member in this generation
tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
unknown_engine = engine.unknown


fp32 = nl.fp32  # float32 constants: ``nisa.fp32.min``


class reduce_cmd(IntEnum):
    """What an instruction does with its engine's accumulation registers."""

    idle = 0
    reset = 1
    reset_reduce = 3
    reduce = 2
    load_reduce = 4


class nc_version(IntEnum):
    """gen2 = trn1/inf2, gen3 = trn2."""

    gen2 = 2
    gen3 = 3


class oob_mode(IntEnum):
    error = 0
    skip = 1


class dge_mode(IntEnum):
    none = 0
    swdge = 1
    hwdge = 2
    unknown = 3


def get_nc_version() -> nc_version:
    """The simulated target (``NEURON_PLATFORM_TARGET_OVERRIDE``); trn3 is not a target of
    this generation."""
    version = runtime.current_target().version
    if version not in (2, 3):
        raise errors.UnsupportedEngine(f"neuronxcc.nki has no NeuronCore-v{version} target")
    return nc_version(version)


def _alu(api: str, op: Any) -> Any:
    if op not in nl.ALU_OPS:
        raise errors.UnsupportedOperator(f"'{api}' does not take op={op!r}")
    return nl.ALU_OPS[op]


def _engine(api: str, requested: Any, default: str, allowed: tuple[str, ...]) -> str:
    chosen = engine(requested)
    if chosen is engine.unknown:
        return default
    if chosen.name not in allowed:
        raise errors.UnsupportedEngine(f"'{api}' runs on {'/'.join(allowed)}, not {chosen.name}")
    return chosen.name


def _same_layout(api: str, operands: dict[str, Tensor]) -> None:
    """Equal partitions and equal elements per partition (err_num_partition_mismatch)."""
    nl.check_partitions(api, operands)
    if len({math.prod(t.shape[1:]) for t in operands.values()}) > 1:
        listed = ", ".join(f"{n}{list(t.shape)}" for n, t in operands.items())
        raise errors.ShapeMismatch(f"'{api}' needs equal elements per partition, got {listed}")


def _per_partition_scalar(
    api: str, name: str, value: Any, data: Tensor, bitvec: bool = False
) -> Any:
    """A scalar, or a ``[P, 1]`` (or ``[P]``) tile's values shaped to broadcast on ``data``
    (float32, or integers for bitvec operators)."""
    if not isinstance(value, Tensor):
        return nl.operand_values(api, value, bitvec)
    nl.require_tile(api, name, value, nl.ON_CHIP)
    if value.shape[0] != data.shape[0] or math.prod(value.shape[1:]) != 1:
        raise errors.ShapeMismatch(
            f"'{api}' {name} must be a scalar or a [{data.shape[0]}, 1] tile, got {value!r}"
        )
    check_in_bounds(api, value, None)
    values = nl.operand_values(api, value, bitvec)
    return values.reshape((data.shape[0],) + (1,) * (data.ndim - 1))


def _result(
    api: str,
    values: np.ndarray,
    dtype: Any,
    default: np.dtype[Any],
    where: np.ndarray | None,
    engine_name: str,
    buffer: MemoryRegion = MemoryRegion.sbuf,
    reads: Sequence[Any] = (),
) -> Tensor:
    out = nl.new_tile(tuple(values.shape), nki_dtype(dtype) if dtype else default, api, buffer)
    out.write(values, where, api)
    runtime.active_run(api).count(engine_name, api, reads, (out,))
    return out


_ReduceCmd = reduce_cmd
_OobMode = oob_mode
_ACCUMULATORS: weakref.WeakKeyDictionary[runtime.Run, np.ndarray] = weakref.WeakKeyDictionary()


def _free_reduction(api: str, op: Any, values: np.ndarray, tile: Tensor) -> np.ndarray:
    """``op``-reduction of ``values`` (shaped like ``tile``) over all its free axes."""
    return np.asarray(_alu(api, op).reduce(values.reshape(tile.shape[0], -1), axis=1))


def _write_reduction(api: str, reduce_res: Tensor, reduced: np.ndarray) -> None:
    """Writes one value per partition into ``reduce_res`` ``[P, 1]``."""
    nl.require_tile(api, "reduce_res", reduce_res, nl.ON_CHIP)
    if reduce_res.shape[0] != reduced.shape[0] or math.prod(reduce_res.shape[1:]) != 1:
        raise errors.ShapeMismatch(
            f"'{api}' reduce_res must be [{reduced.shape[0]}, 1], got {reduce_res!r}"
        )
    reduce_res.write(reduced.reshape(reduce_res.shape), None, api)


def _input(api: str, name: str, data: Any, mask: Any) -> tuple[Tensor, np.ndarray | None]:
    """An on-chip input tile and the mask over its shape (its reads checked in bounds)."""
    runtime.active_run(api)
    tile = nl.require_tile(api, name, data, nl.ON_CHIP)
    where = mask_values(api, mask, tile.shape)
    check_in_bounds(api, tile, where)
    return tile, where


# -- instructions run by the core instruction set -------------------------------------------
def _core_tensor(tile: Tensor) -> NkiTensor:
    """A legacy tile's values as a core tensor in the same memory (for a core instruction)."""
    return NkiTensor(tile.read().copy(), tile.dtype, tile.buffer, None)


def _core_operand(value: Any) -> Any:
    """A legacy operand for a core instruction: tiles as core tensors, ALU operators and
    enums as the core's, anything else unchanged."""
    if isinstance(value, Tensor):
        return _core_tensor(value)
    if isinstance(value, np.ndarray):  # values an adapter prepared (e.g. masked out)
        return NkiTensor(value, value.dtype, MemoryRegion.sbuf, None)
    if isinstance(value, reduce_cmd):
        return core_isa.reduce_cmd[value.name]
    if isinstance(value, engine):
        return core_isa.engine[value.name]
    if callable(value) and value in nl.ALU_OPS:
        name = getattr(value, "__name__", "")
        renamed = {"max": "maximum", "amax": "maximum", "min": "minimum", "amin": "minimum"}
        return getattr(core_language, renamed.get(name, name))
    return value


def _run_core(
    api: str,
    instruction: Any,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    mask: Any,
    dst: Tensor | None = None,
    buffer: MemoryRegion = MemoryRegion.sbuf,
    **operands: Any,
) -> Tensor:
    """Runs the core ``instruction(dst, **operands)`` on copies of the legacy operands and
    writes its result into ``dst`` (or a new tile of ``shape``/``dtype``) where ``mask``
    holds: the legacy generation's calling convention over the one implementation."""
    for name, value in operands.items():
        if isinstance(value, Tensor):  # the mask covers inputs shaped like the result
            _input(api, name, value, mask if value.shape == tuple(shape) else None)
    # The result's memory is the legacy tile's (accounted there): an empty core allocation.
    scratch = runtime.Allocation(runtime.active_run(api), buffer is MemoryRegion.psum, 0)
    core_dst = NkiTensor(np.zeros(shape, dtype), dtype, buffer, scratch)
    if dst is not None:
        nl.require_tile(api, "dst", dst, nl.ON_CHIP)
        core_dst = _core_tensor(dst)
    converted = {name: _core_operand(v) for name, v in operands.items()}
    run = runtime.active_run(api)
    instruction(core_dst, **converted)
    out = dst if dst is not None else nl.new_tile(shape, dtype, api, buffer)
    out.write(core_dst.data, mask_values(api, mask, out.shape), api)
    if run.trace:  # the core instruction traced its copies: trace the legacy tiles instead
        tiles = [v for v in operands.values() if isinstance(v, Tensor)]
        params = run.trace[-1].params if mask is None else None  # a mask: a partial result
        run.trace[-1] = trace.instruction(run.trace[-1].engine, api, tiles, (out,), params)
    for name in _WRITTEN_OPERANDS & set(operands):  # e.g. reduce_res: copied back
        if isinstance(operands[name], Tensor):
            operands[name].write(converted[name].data.reshape(operands[name].shape), None, api)
    return out


# Operands a core instruction writes besides ``dst``.
_WRITTEN_OPERANDS = frozenset({"reduce_res", "dst_idx"})


def tensor_scalar_cumulative(
    src: Tensor,
    dst: Tensor,
    op0: Any,
    op1: Any,
    imm0: Any,
    imm1: Any = None,
    reduce_cmd: reduce_cmd = reduce_cmd.reset_reduce,
    *,
    mask: Any = None,
    **kwargs: Any,
) -> Tensor:
    """Per partition, ``reg = op1(op0(src[i], imm0), reg); dst[i] = reg`` along the free
    elements (the core ``tensor_scalar_cumulative``; AWS's test,
    nki/test/test_nki_isa_tensor_scalar_cumulative.py@81ce03a, passes ``dst``)."""
    return _run_core(
        "tensor_scalar_cumulative", core_isa.tensor_scalar_cumulative, dst.shape, dst.dtype,
        mask, dst, src=src, op0=op0, op1=op1, imm0=imm0, imm1=imm1, reduce_cmd=reduce_cmd,
    )  # fmt: skip


def local_gather(
    src_buffer: Tensor,
    index: Tensor,
    num_elem_per_idx: int = 1,
    num_valid_indices: int | None = None,
    *,
    mask: Any = None,
    **kwargs: Any,
) -> Tensor:
    """GpSimd gather (the core ``local_gather``): a ``[P, num_valid_indices,
    num_elem_per_idx]`` tile (by default every index of a core's 16 partitions is valid)."""
    per_core = 16 * math.prod(index.shape[1:])
    valid = per_core if num_valid_indices is None else int(num_valid_indices)
    shape = (src_buffer.shape[0], valid, int(num_elem_per_idx))
    return _run_core(
        "local_gather", core_isa.local_gather, shape, src_buffer.dtype, mask,
        src_buffer=src_buffer, index=index, num_elem_per_idx=num_elem_per_idx,
        num_valid_indices=num_valid_indices,
    )  # fmt: skip


# -- Scalar engine -----------------------------------------------------------------------
def activation(
    op: Any,
    data: Tensor,
    *,
    bias: Tensor | None = None,
    scale: Any = 1.0,
    reduce_op: Any = None,
    reduce_res: Tensor | None = None,
    reduce_cmd: reduce_cmd = reduce_cmd.idle,
    mask: Any = None,
    dtype: Any = None,
    **kwargs: Any,
) -> Tensor:
    """``op(data * scale + bias)`` on the Scalar engine; ``scale`` a scalar or a float32
    ``[P, 1]`` vector, ``bias`` a ``[P, 1]`` vector. With ``reduce_cmd`` idle and
    ``reduce_op``/``reduce_res``, the results reduced over the free axes go to
    ``reduce_res`` ``[P, 1]``; otherwise ``reduce_cmd`` drives the engine's 128 accumulation
    registers (reset to zero / reduce into / both) and ``reduce_res`` reads them out."""
    api = "activation"
    tile, where = _input(api, "data", data, mask)
    if op not in nl.ACTIVATIONS:
        raise errors.UnsupportedOperator(f"'{api}' does not take op={op!r}")
    if isinstance(scale, Tensor) and scale.dtype != nl.float32:
        raise errors.UnsupportedDtype(f"'{api}' scale must be float32, got {scale.dtype}")
    values = nl.as_f32(tile) * _per_partition_scalar(api, "scale", scale, tile)
    if bias is not None:
        if not isinstance(bias, Tensor):
            raise TypeError(f"'{api}' bias must be a [P, 1] tile")
        values = values + _per_partition_scalar(api, "bias", bias, tile)
    values = np.asarray(nl.ACTIVATIONS[op](values), np.float32)
    out = _result(api, values, dtype, tile.dtype, where, "scalar", reads=(tile, bias, scale))
    command = _ReduceCmd(reduce_cmd)
    if command is _ReduceCmd.idle:
        if (reduce_op is None) != (reduce_res is None):
            raise TypeError(f"'{api}': give reduce_op and reduce_res together")
        if reduce_res is not None:
            _write_reduction(api, reduce_res, _free_reduction(api, reduce_op, values, tile))
        return out
    # The 128 accumulation registers of the Scalar engine, kept per run.
    registers = _ACCUMULATORS.setdefault(
        runtime.active_run(api), np.zeros(runtime.PMAX, np.float32)
    )
    partitions = tile.shape[0]
    if command in (_ReduceCmd.reset, _ReduceCmd.reset_reduce):
        registers[:] = 0
    if command in (_ReduceCmd.reduce, _ReduceCmd.reset_reduce):
        if reduce_op is None:
            raise TypeError(f"'{api}': reduce_cmd={command.name} needs reduce_op")
        part = _free_reduction(api, reduce_op, values, tile)
        registers[:partitions] = _alu(api, reduce_op)(registers[:partitions], part)
    if reduce_res is not None:
        _write_reduction(api, reduce_res, registers[:partitions].copy())
    return out


def activation_reduce(
    op: Any,
    data: Tensor,
    *,
    reduce_op: Any,
    reduce_res: Tensor,
    bias: Tensor | None = None,
    scale: Any = 1.0,
    mask: Any = None,
    dtype: Any = None,
    **kwargs: Any,
) -> Tensor:
    """:func:`activation` with ``reduce_cmd=reset_reduce``: the results reduced over the
    free axes go to ``reduce_res`` (on NeuronCore-v2 ``reduce_op`` must be add)."""
    if runtime.current_target().version == 2 and _alu("activation_reduce", reduce_op) is not np.add:
        raise errors.UnsupportedOperator(
            "'activation_reduce' on NeuronCore-v2 reduces with add only"
        )
    return activation(
        op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
        reduce_cmd=_ReduceCmd.reset_reduce, mask=mask, dtype=dtype,
    )  # fmt: skip


# -- Vector engine -----------------------------------------------------------------------
def tensor_tensor(
    data1: Tensor,
    data2: Tensor,
    op: Any,
    *,
    dtype: Any = None,
    mask: Any = None,
    engine: Any = engine.unknown,
    **kwargs: Any,
) -> Tensor:
    """``op(data1, data2)`` element-wise (the core ``tensor_tensor``): equal partitions and
    elements per partition; the result in ``dtype`` or the promoted input dtype."""
    out_dtype = nki_dtype(dtype) if dtype else nl.promote([data1, data2])
    data1, data2 = _broadcast_vector("tensor_tensor", data1, data2)
    return _run_core(
        "tensor_tensor", core_isa.tensor_tensor, data1.shape, out_dtype, mask,
        data1=data1, data2=data2, op=op, engine=engine,
    )  # fmt: skip


def _broadcast_vector(api: str, data1: Tensor, data2: Tensor) -> tuple[Tensor, Tensor]:
    """A ``[P, 1]`` operand repeated along the other's free axes, with a warning: the
    reference wants "the same number of elements per partition", but AWS's device-tested
    ``quantized_double_row_matmul`` (nki-samples reference/double_row_matmul.py@8370e11)
    multiplies a ``[128, 512]`` tile by a ``[128, 1]`` scale."""
    for vector, other in ((data2, data1), (data1, data2)):
        if (
            isinstance(vector, Tensor)
            and isinstance(other, Tensor)
            and vector.shape[0] == other.shape[0]
            and math.prod(vector.shape[1:]) == 1 < math.prod(other.shape[1:])
        ):
            warnings.warn(
                f"'{api}' repeats the [P, 1] operand {vector!r} along the free axes of "
                f"{other!r}; the reference asks for equal elements per partition",
                errors.BroadcastOperandWarning,
                stacklevel=3,
            )
            repeated = vector.reshape((vector.shape[0],) + (1,) * (other.ndim - 1))
            repeated = repeated.broadcast_to(other.shape)
            return (other, repeated) if vector is data2 else (repeated, other)
    return data1, data2


def tensor_scalar(
    data: Tensor,
    op0: Any,
    operand0: Any,
    reverse0: bool = False,
    op1: Any = None,
    operand1: Any = None,
    reverse1: bool = False,
    *,
    dtype: Any = None,
    mask: Any = None,
    engine: Any = engine.unknown,
    **kwargs: Any,
) -> Tensor:
    """``(data op0 operand0) op1 operand1`` (the core ``tensor_scalar``); each operand a
    scalar or a ``[P, 1]`` vector broadcast along the free axes; ``reverse`` swaps an
    operator's sides."""
    out_dtype = nki_dtype(dtype) if dtype else data.dtype
    return _run_core(
        "tensor_scalar", core_isa.tensor_scalar, data.shape, out_dtype, mask, data=data,
        op0=op0, operand0=operand0, reverse0=reverse0, op1=op1, operand1=operand1,
        reverse1=reverse1, engine=engine,
    )  # fmt: skip


def tensor_scalar_reduce(
    *,
    data: Tensor,
    op0: Any,
    operand0: Any,
    reduce_op: Any,
    reduce_res: Tensor,
    reverse0: bool = False,
    dtype: Any = None,
    mask: Any = None,
    **kwargs: Any,
) -> Tensor:
    """``data op0 operand0`` (as :func:`tensor_scalar`), also reduced with ``reduce_op``
    over all free axes into ``reduce_res`` ``[P, 1]`` (the core ``tensor_scalar_reduce``)."""
    out_dtype = nki_dtype(dtype) if dtype else data.dtype
    return _run_core(
        "tensor_scalar_reduce", core_isa.tensor_scalar_reduce, data.shape, out_dtype, mask,
        data=data, op0=op0, operand0=operand0, reduce_op=reduce_op, reduce_res=reduce_res,
        reverse0=reverse0,
    )  # fmt: skip


def scalar_tensor_tensor(
    *,
    data: Tensor,
    op0: Any,
    operand0: Any,
    op1: Any,
    operand1: Tensor,
    reverse0: bool = False,
    reverse1: bool = False,
    dtype: Any = None,
    mask: Any = None,
    **kwargs: Any,
) -> Tensor:
    """``(data op0 operand0) op1 operand1`` (the core ``scalar_tensor_tensor``):
    ``operand0`` a scalar or ``[P, 1]`` vector, ``operand1`` a tile shaped like ``data``."""
    out_dtype = nki_dtype(dtype) if dtype else data.dtype
    return _run_core(
        "scalar_tensor_tensor", core_isa.scalar_tensor_tensor, data.shape, out_dtype, mask,
        data=data, op0=op0, operand0=operand0, op1=op1, operand1=operand1, reverse0=reverse0,
        reverse1=reverse1,
    )  # fmt: skip


_COMPARISONS = (np.equal, np.less, np.less_equal, np.greater, np.greater_equal)


def range_select(
    *,
    on_true_tile: Tensor,
    comp_op0: Any,
    comp_op1: Any,
    bound0: Tensor,
    bound1: Tensor,
    reduce_cmd: reduce_cmd = reduce_cmd.idle,
    reduce_res: Tensor | None = None,
    reduce_op: Any = np.amax,
    range_start: int = 0,
    on_false_value: float = fp32.min,
    mask: Any = None,
    dtype: Any = None,
    **kwargs: Any,
) -> Tensor:
    """``on_true_tile`` where ``comp_op0(i, bound0) & comp_op1(i, bound1)`` for the free
    index ``i`` (plus ``range_start``), else ``on_false_value``; the max of the result goes
    to ``reduce_res`` through the Vector accumulators (the core ``range_select``,
    NeuronCore-v3 and later)."""
    api = "range_select"
    tile, _ = _input(api, "on_true_tile", on_true_tile, mask)
    if comp_op0 not in _COMPARISONS or comp_op1 not in _COMPARISONS:
        raise errors.UnsupportedOperator(f"'{api}' compares with np.equal/less/greater(_equal)")
    if not is_float(tile.dtype):
        raise errors.UnsupportedDtype(f"'{api}' selects from float tiles, got {tile.dtype}")
    out_dtype = nki_dtype(dtype) if dtype else tile.dtype
    return _run_core(
        api, core_isa.range_select, tile.shape, out_dtype, mask, on_true_tile=tile,
        comp_op0=comp_op0, comp_op1=comp_op1, bound0=bound0, bound1=bound1,
        reduce_cmd=reduce_cmd, reduce_res=reduce_res, reduce_op=reduce_op,
        range_start=range_start, on_false_value=on_false_value,
    )  # fmt: skip


def select_reduce(
    *,
    dst: Tensor,
    predicate: Tensor,
    on_true: Tensor,
    on_false: Any,
    reduce_res: Tensor | None = None,
    reduce_cmd: reduce_cmd = reduce_cmd.idle,
    reduce_op: Any = np.amax,
    reverse_pred: bool = False,
    mask: Any = None,
    dtype: Any = None,
    **kwargs: Any,
) -> None:
    """``dst = where(predicate, on_true, on_false)`` (``on_false`` a float32 scalar or a
    ``[P, 1]`` vector); its max per partition goes to ``reduce_res`` through the Vector
    accumulators (the core ``select_reduce``)."""
    _run_core(
        "select_reduce", core_isa.select_reduce, dst.shape, dst.dtype, mask, dst,
        predicate=predicate, on_true=on_true, on_false=on_false, reduce_res=reduce_res,
        reduce_cmd=reduce_cmd, reduce_op=reduce_op, reverse_pred=reverse_pred,
    )  # fmt: skip


def tensor_reduce(
    op: Any,
    data: Tensor,
    axis: Any,
    *,
    mask: Any = None,
    dtype: Any = None,
    negate: bool = False,
    keepdims: bool = False,
    **kwargs: Any,
) -> Tensor:
    """``op``-reduction of ``data`` over its trailing free ``axis`` (Vector engine);
    ``negate`` multiplies the result by -1."""
    function = _alu("tensor_reduce", op)
    return nl.reduce(
        "tensor_reduce", function, data, axis, dtype, mask, keepdims, negate, trailing=True
    )


def tensor_tensor_scan(
    data0: Tensor,
    data1: Tensor,
    initial: Any,
    op0: Any,
    op1: Any,
    reverse0: bool = False,
    reverse1: bool = False,
    *,
    dtype: Any = None,
    mask: Any = None,
    **kwargs: Any,
) -> Tensor:
    """Per partition, ``result[:, i] = op1(op0(data0[:, i], result[:, i-1]), data1[:, i])``
    from ``initial`` (the core ``tensor_tensor_scan``); the result in ``dtype`` or the
    promoted dtype of the inputs."""
    out_dtype = nki_dtype(dtype) if dtype else nl.promote([data0, data1])
    return _run_core(
        "tensor_tensor_scan", core_isa.tensor_tensor_scan, data0.shape, out_dtype, mask,
        data0=data0, data1=data1, initial=initial, op0=op0, op1=op1, reverse0=reverse0,
        reverse1=reverse1,
    )  # fmt: skip


def bn_stats(data: Tensor, *, mask: Any = None, dtype: Any = None, **kwargs: Any) -> Tensor:
    """Per partition, 6 statistics of ``data`` (<= 512 elements per partition): count,
    mean and variance*count of the even elements, then of the odd elements (Vector
    engine). Masked-out elements are left out."""
    api = "bn_stats"
    tile, where = _input(api, "data", data, mask)
    free = math.prod(tile.shape[1:])
    if free > nl.tile_size.bn_stats_fmax:
        raise errors.SizeOfDimensionExceedArchLimit(
            f"'{api}' of {tile!r}: {free} elements per partition exceed the architecture "
            f"limitation of {nl.tile_size.bn_stats_fmax}"
        )
    values = nl.as_f32(tile).reshape(tile.shape[0], free)
    included = None if where is None else np.broadcast_to(where, tile.shape).reshape(values.shape)
    result = alu.batch_norm_stats(values, included)
    return _result(api, result, dtype, tile.dtype, None, "vector", reads=(tile,))


def bn_aggr(data: Tensor, *, mask: Any = None, dtype: Any = None, **kwargs: Any) -> Tensor:
    """Per partition, the mean and (population) variance from ``bn_stats`` outputs: a
    multiple of 3 elements per partition, ``(count, mean, variance*count)`` tuples."""
    api = "bn_aggr"
    tile, where = _input(api, "data", data, mask)
    free = math.prod(tile.shape[1:])
    if free % 3:
        raise errors.ShapeMismatch(
            f"'{api}' takes (count, mean, variance*count) triples; {tile!r} has {free} elements "
            "per partition"
        )
    values = nl.as_f32(tile).reshape(tile.shape[0], free // 3, 3)
    if where is not None:  # masked-out triples take no part
        keep: Any = np.broadcast_to(where, tile.shape).reshape(values.shape).all(axis=2)
        values = np.where(keep[..., None], values, 0)
    return _result(
        api, alu.batch_norm_aggregate(values), dtype, tile.dtype, None, "vector", reads=(tile,)
    )


def tensor_copy_predicated(
    *,
    src: Any,
    dst: Tensor,
    predicate: Tensor,
    reverse_pred: bool = False,
    mask: Any = None,
    dtype: Any = None,
    **kwargs: Any,
) -> None:
    """Copies ``src`` (a tile or a scalar) into ``dst`` where ``predicate`` (bool or
    uint8/16/32) is nonzero (zero with ``reverse_pred``); other ``dst`` elements keep their
    values (the core ``tensor_copy_predicated``)."""
    _run_core(
        "tensor_copy_predicated", core_isa.tensor_copy_predicated, dst.shape, dst.dtype, mask,
        dst, src=src, predicate=predicate, reverse_pred=reverse_pred,
    )  # fmt: skip


def tensor_copy(
    src: Tensor, *, mask: Any = None, dtype: Any = None, engine: Any = engine.unknown, **kw: Any
) -> Tensor:
    """A copy of the on-chip tile ``src`` in ``dtype`` (the core ``tensor_copy``; Vector,
    Scalar or GpSimd engine)."""
    out_dtype = nki_dtype(dtype) if dtype else src.dtype
    return _run_core(
        "tensor_copy", core_isa.tensor_copy, src.shape, out_dtype, mask, src=src, engine=engine
    )


def max8(*, src: Tensor, mask: Any = None, dtype: Any = None, **kwargs: Any) -> Tensor:
    """The 8 largest values of each partition, in descending order: ``[P, 8]`` (the core
    ``max8``; masked-out elements are never selected)."""
    api = "max8"
    tile, _ = _input(api, "src", src, None)
    values = _per_partition_elements(api, tile, mask).astype(np.float32)
    out_dtype = nki_dtype(dtype) if dtype else tile.dtype
    return _run_core(api, core_isa.max8, (tile.shape[0], 8), out_dtype, None, src=values)


def nc_find_index8(
    *, data: Tensor, vals: Tensor, mask: Any = None, dtype: Any = None, **kwargs: Any
) -> Tensor:
    """Per partition, the index of the first occurrence in ``data`` of each of the 8
    ``vals`` (uint32 by default, or uint16); undefined for values ``data`` lacks."""
    api = "nc_find_index8"
    tile, _ = _input(api, "data", data, None)
    wanted, _ = _input(api, "vals", vals, None)
    out_dtype = nki_dtype(dtype) if dtype else nl.uint32
    if out_dtype not in (nl.uint16, nl.uint32):
        raise errors.UnsupportedDtype(f"'{api}' returns uint16 or uint32, not {out_dtype}")
    if wanted.shape[0] != tile.shape[0] or math.prod(wanted.shape[1:]) != 8:
        raise errors.ShapeMismatch(f"'{api}' vals must be [{tile.shape[0]}, 8], got {wanted!r}")
    values = _per_partition_elements(api, tile, mask)
    targets = nl.as_f32(wanted).reshape(tile.shape[0], 8)
    matches = values[:, None, :] == targets[:, :, None]  # [P, 8, N]
    found = np.where(matches.any(axis=2), matches.argmax(axis=2), 0)
    return _result(api, found, out_dtype, out_dtype, None, "vector", reads=(tile,))


def nc_match_replace8(
    *,
    data: Tensor,
    vals: Tensor,
    imm: float,
    dst_idx: Tensor | None = None,
    mask: Any = None,
    dtype: Any = None,
    **kwargs: Any,
) -> Tensor:
    """``data`` with the first occurrence of each of the 8 ``vals`` per partition replaced
    by ``imm``; their indices go to ``dst_idx`` if given (Vector engine)."""
    api = "nc_match_replace8"
    tile, where = _input(api, "data", data, mask)
    wanted, _ = _input(api, "vals", vals, None)
    if wanted.shape[0] != tile.shape[0] or math.prod(wanted.shape[1:]) != 8:
        raise errors.ShapeMismatch(f"'{api}' vals must be [{tile.shape[0]}, 8], got {wanted!r}")
    values = _per_partition_elements(api, tile, mask)  # masked-out: -inf, never matched
    replaced = nl.as_f32(tile).reshape(values.shape).copy()
    targets = nl.as_f32(wanted).reshape(tile.shape[0], 8)
    indices = np.zeros((tile.shape[0], 8), np.uint32)
    for p in range(tile.shape[0]):  # the reference's loop: first match of each value
        for j in range(8):
            matches = np.flatnonzero(values[p] == targets[p, j])
            if matches.size:
                indices[p, j] = matches[0]
                values[p, matches[0]] = np.nan  # matched once
                replaced[p, matches[0]] = np.float32(imm)
    if dst_idx is not None:
        nl.require_tile(api, "dst_idx", dst_idx, nl.ON_CHIP)
        if dst_idx.size != indices.size:
            raise errors.ShapeMismatch(f"'{api}' dst_idx must hold 8 per partition: {dst_idx!r}")
        dst_idx.write(indices.reshape(dst_idx.shape), None, api)
    return _result(
        api, replaced.reshape(tile.shape), dtype, tile.dtype, where, "vector", reads=(tile,)
    )


def nc_stream_shuffle(
    src: Tensor, dst: Tensor, shuffle_mask: Any, *, dtype: Any = None, mask: Any = None, **kw: Any
) -> None:
    """Within each quadrant of 32 partitions, ``dst`` partition ``i`` takes ``src``
    partition ``shuffle_mask[i]`` (255: unmodified) (the core ``nc_stream_shuffle``)."""
    _run_core(
        "nc_stream_shuffle", core_isa.nc_stream_shuffle, dst.shape, dst.dtype, mask, dst,
        src=src, shuffle_mask=shuffle_mask,
    )  # fmt: skip


def _per_partition_elements(api: str, tile: Tensor, mask: Any) -> np.ndarray:
    """``tile``'s values per partition ``[P, N]`` (8 <= N <= 16384); masked-out elements
    become -inf so they are never selected."""
    free = math.prod(tile.shape[1:])
    if not 8 <= free <= 16384:
        raise errors.SizeOfDimensionExceedArchLimit(
            f"'{api}' reads 8 to 16384 elements per partition, {tile!r} has {free}"
        )
    where = mask_values(api, mask, tile.shape)
    check_in_bounds(api, tile, where)
    values = nl.as_f32(tile)
    if where is not None:
        values = np.where(where, values, -np.inf)
    return np.asarray(values).reshape(tile.shape[0], free)


def dropout(data: Tensor, prob: Any, *, mask: Any = None, dtype: Any = None, **kw: Any) -> Tensor:
    """``data`` with elements replaced by zero with probability ``prob`` (a scalar, or a
    ``[P, 1]`` tile of per-partition probabilities; Vector engine)."""
    api = "dropout"
    tile, where = _input(api, "data", data, mask)
    probability = _per_partition_scalar(api, "prob", prob, tile)
    keep = nl.generator(api).random(tile.shape) >= probability
    values = np.where(keep, nl.as_f32(tile), np.float32(0))
    return _result(api, values, dtype, tile.dtype, where, "vector", reads=(tile,))


def tensor_copy_dynamic_src(
    src: Tensor, *, mask: Any = None, dtype: Any = None, engine: Any = engine.unknown, **kw: Any
) -> Tensor:
    """A copy of ``src``, a tile view at a run-time offset within each partition (indexed
    with values from an SBUF tile)."""
    return tensor_copy(src, mask=mask, dtype=dtype, engine=engine)


def tensor_copy_dynamic_dst(
    *,
    dst: Tensor,
    src: Tensor,
    mask: Any = None,
    dtype: Any = None,
    engine: Any = engine.unknown,
    **kwargs: Any,
) -> None:
    """Copies ``src`` into ``dst``, a tile view at a run-time offset within each partition;
    equal partitions and elements per partition."""
    api = "tensor_copy_dynamic_dst"
    target, where = _input(api, "dst", dst, mask)
    source, _ = _input(api, "src", src, mask)
    _same_layout(api, {"dst": target, "src": source})
    chosen = _engine(api, engine, "vector", ("vector", "scalar", "gpsimd"))
    values = source.read() if source.dtype == target.dtype else nl.as_f32(source)
    target.write(values.reshape(target.shape), where, api)
    runtime.active_run(api).count(chosen, api, (source,), (target,))


def dma_transpose(src: Tensor, *, axes: Any = None, mask: Any = None, dtype: Any = None,
                  **kwargs: Any) -> Tensor:  # fmt: skip
    """``src`` (HBM or SBUF) transposed by DMA into a new SBUF tile: permutation (1, 0),
    (2, 1, 0) or (3, 1, 2, 0) for 2-, 3- and 4-D tiles."""
    api = "dma_transpose"
    run = runtime.active_run(api)
    tile = nl.require_tile(api, "src", src, (*nl.HBM, MemoryRegion.sbuf))
    permutations = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}
    expected = permutations.get(tile.ndim)
    if expected is None or (axes is not None and tuple(axes) != expected):
        raise errors.ShapeMismatch(
            f"'{api}' of {tile!r}: supported axes are (1, 0), (2, 1, 0) and (3, 1, 2, 0)"
        )
    check_in_bounds(api, tile, None)
    values = tile.read().transpose(expected)
    where = mask_values(api, mask, values.shape)
    out_dtype = nki_dtype(dtype) if dtype else tile.dtype
    out = nl.new_tile(tuple(values.shape), out_dtype, api)
    out.write(values if out_dtype == tile.dtype else values.astype(np.float32), where, api)
    run.count_dma(not tile.on_chip, False, tile.size * tile.itemsize)
    return out


def reciprocal(data: Tensor, *, dtype: Any = None, mask: Any = None, **kwargs: Any) -> Tensor:
    """``1 / data`` element-wise (the core ``reciprocal``, Vector engine)."""
    out_dtype = nki_dtype(dtype) if dtype else data.dtype
    return _run_core("reciprocal", core_isa.reciprocal, data.shape, out_dtype, mask, data=data)


def tensor_partition_reduce(
    op: Any, data: Tensor, *, mask: Any = None, dtype: Any = None, **kwargs: Any
) -> Tensor:
    """``op``-reduction across the partitions of ``data`` into a ``[1, ...]`` tile (GpSimd
    engine; ``op`` one of add, max, bitwise_or, bitwise_and)."""
    api = "tensor_partition_reduce"
    tile, where = _input(api, "data", data, mask)
    if tile.buffer is MemoryRegion.psum:
        raise errors.UnsupportedMemory(f"'{api}' on the GpSimd engine cannot access PSUM")
    function = _PARTITION_REDUCE.get(op)
    if function is None:
        raise errors.UnsupportedOperator(f"'{api}' takes add, max, bitwise_or, bitwise_and")
    bitwise = function in (np.bitwise_or, np.bitwise_and)
    values = tile.read().astype(np.int64) if bitwise else nl.as_f32(tile)
    if where is not None:  # masked-out elements take no part
        identity = {np.add: 0, np.maximum: -np.inf, np.bitwise_or: 0, np.bitwise_and: -1}
        values = np.where(where, values, identity[function])
    result = function.reduce(values, axis=0, keepdims=True)
    return _result(api, np.asarray(result), dtype, tile.dtype, None, "gpsimd", reads=(tile,))


_PARTITION_REDUCE: dict[Any, Any] = {
    **dict.fromkeys((nl.add, np.add), np.add),
    **dict.fromkeys((nl.maximum, nl.max, np.maximum, np.max, np.amax), np.maximum),
    **dict.fromkeys((nl.bitwise_or, np.bitwise_or), np.bitwise_or),
    **dict.fromkeys((nl.bitwise_and, np.bitwise_and), np.bitwise_and),
}


# -- Tensor engine -----------------------------------------------------------------------
def nc_matmul(
    stationary: Tensor,
    moving: Tensor,
    *,
    is_stationary_onezero: bool = False,
    is_moving_onezero: bool = False,
    is_transpose: bool = False,
    tile_position: tuple[int, ...] = (),
    tile_size: tuple[int, ...] = (),
    mask: Any = None,
    **kwargs: Any,
) -> Tensor:
    """``stationary.T @ moving`` on the Tensor engine: ``stationary [K, M]`` and ``moving
    [K, N]`` in SBUF (K <= 128 partitions, M <= 128, N <= 512); a new float32 PSUM tile.
    ``is_*_onezero`` and ``is_transpose`` (``moving`` is an identity matrix) are performance
    hints; PE tiling (``tile_position``/``tile_size``) is checked against its documented
    requirements and computes the same product."""
    if tile_position or tile_size:
        _check_pe_tiling(tuple(tile_position), tuple(tile_size), stationary)
    perf_mode = kwargs.get("perf_mode")
    if perf_mode is not None and core_isa.matmul_perf_mode(perf_mode).name != "none":
        # [K, 2, free] fp8 operands (nki/test/test_nki_isa_nc_matmul.py@81ce03a): the core
        # instruction's double-row mode.
        shape = (math.prod(stationary.shape[2:]), math.prod(moving.shape[2:]))
        return _run_core(
            "nc_matmul", core_isa.nc_matmul, shape, nl.float32, mask, None, MemoryRegion.psum,
            stationary=stationary, moving=moving, perf_mode=perf_mode,
        )  # fmt: skip
    return nl.tensor_engine_matmul("nc_matmul", stationary, moving, mask)


def _check_pe_tiling(position: tuple[int, ...], size: tuple[int, ...], stationary: Any) -> None:
    """The requirements the nc_matmul reference lists for ``tile_position``/``tile_size``."""
    api = "nc_matmul"
    if len(position) != 2 or len(size) != 2:
        raise ValueError(f"'{api}': set both tile_position and tile_size as (row, column)")
    if any(int(v) % 32 for v in (*position, *size)):
        raise ValueError(f"'{api}': tile_position {position} and tile_size {size} must be "
                         "multiples of 32")  # fmt: skip
    if isinstance(stationary, Tensor) and (
        size[0] < stationary.shape[0] or size[1] < math.prod(stationary.shape[1:])
    ):
        raise errors.SizeOfDimensionExceedArchLimit(
            f"'{api}': tile_size {size} is smaller than the stationary tile {stationary!r}"
        )
    if tuple(size) == (32, 32) and runtime.current_target().version == 2:
        raise ValueError(f"'{api}': a 32x32 PE tile is not supported on NeuronCore-v2")
    if any(int(p) + int(z) > runtime.PMAX for p, z in zip(position, size, strict=True)):
        raise ValueError(f"'{api}': PE tile {position}+{size} exceeds the 128x128 array")


def nc_transpose(
    data: Tensor, *, mask: Any = None, dtype: Any = None, engine: Any = engine.unknown, **kw: Any
) -> Tensor:
    """Swaps the partition axis and the (flattened) free axes: on the Tensor engine up to
    128x128 from SBUF into PSUM, on the Vector engine up to 32x32 (the default engine
    follows the size)."""
    api = "nc_transpose"
    tile, _ = _input(api, "data", data, None)
    partitions, free = tile.shape[0], math.prod(tile.shape[1:])
    default = "vector" if partitions <= 32 and free <= 32 else "tensor"
    chosen = _engine(api, engine, default, ("tensor", "vector"))
    limit = 128 if chosen == "tensor" else 32
    if partitions > limit or free > limit:
        raise errors.SizeOfDimensionExceedArchLimit(
            f"'{api}' of {tile!r} on the {chosen} engine: at most {limit}x{limit}"
        )
    if chosen == "tensor":
        nl.require_tile(api, "data", tile, (MemoryRegion.sbuf,))
    values = nl.as_f32(tile).reshape(partitions, free).T
    where = mask_values(api, mask, (free, partitions))
    buffer = MemoryRegion.psum if chosen == "tensor" else MemoryRegion.sbuf
    return _result(api, values, dtype, tile.dtype, where, chosen, buffer, reads=(tile,))


# -- GpSimd engine ----------------------------------------------------------------------
def sequence_bounds(*, segment_ids: Tensor, dtype: Any = None) -> Tensor:
    """For segment ids ``[1, N]`` (0 = padding), each element's segment start and end
    (exclusive) as ``[1, 2, N]``; padding gets start N and end -1 (GpSimd engine). The
    current API's instruction computes it (same semantics, ``dst`` first)."""
    api = "sequence_bounds"
    tile, _ = _input(api, "segment_ids", segment_ids, None)
    if tile.shape[0] != 1:
        raise errors.NumPartitionMismatch(f"'{api}' takes one partition, got {tile!r}")
    out_dtype = nki_dtype(dtype) if dtype else tile.dtype
    ids = NkiTensor(tile.read().reshape(1, -1), tile.dtype, MemoryRegion.sbuf, None)
    bounds = NkiTensor(
        np.empty((1, 2, ids.shape[1]), out_dtype), out_dtype, MemoryRegion.sbuf, None
    )
    core_isa.sequence_bounds(bounds, ids)  # checks the dtypes, counts the instruction
    out = nl.new_tile(bounds.shape, out_dtype, api)
    out.write(bounds.data, None, api)
    return out


def iota(expr: Any, dtype: Any, *, mask: Any = None, **kwargs: Any) -> Tensor:
    """A tile holding the values of the affine index expression ``expr`` (of
    ``nl.arange`` grids), computed in int32 and cast to ``dtype`` (GpSimd engine)."""
    api = "iota"
    runtime.active_run(api)
    if not isinstance(expr, IndexGrid):
        raise TypeError(f"'{api}' takes an affine expression of nl.arange, got {expr!r}")
    values = np.asarray(expr.values, np.int64).astype(np.int32)
    if values.ndim < 2:
        raise errors.LeadingDimensionOfTensorMustBePartition(
            f"'{api}' needs a 2-D expression (partition, free), got shape {values.shape}"
        )
    where = mask_values(api, mask, values.shape)
    return _result(api, values, dtype, nki_dtype(dtype), where, "gpsimd")


def affine_select(
    pred: Any, on_true_tile: Tensor, on_false_value: float, *, mask: Any = None,
    dtype: Any = None, **kwargs: Any,
) -> Tensor:  # fmt: skip
    """``on_true_tile`` where the affine predicate ``pred`` (one comparison of index
    expressions, e.g. a causal mask) holds, else ``on_false_value`` (GpSimd engine)."""
    api = "affine_select"
    tile, where = _input(api, "on_true_tile", on_true_tile, mask)
    if not isinstance(pred, Mask):
        raise TypeError(f"'{api}' takes an affine comparison of nl.arange expressions as pred")
    chosen = mask_values(api, pred, tile.shape)
    assert chosen is not None  # pred is a Mask
    values = np.where(chosen, nl.as_f32(tile), np.float32(on_false_value))
    return _result(api, values, dtype, tile.dtype, where, "gpsimd", reads=(tile,))


def dma_copy(
    *,
    dst: Tensor,
    src: Tensor,
    mask: Any = None,
    dst_rmw_op: Any = None,
    oob_mode: oob_mode = oob_mode.error,
    dge_mode: dge_mode = dge_mode.unknown,
) -> None:
    """``dst = src`` (or ``dst += src`` with ``dst_rmw_op=np.add``) by DMA between HBM and
    SBUF views of equal shape; different dtypes are cast."""
    api = "dma_copy"
    run = runtime.active_run(api)
    regions = (*nl.HBM, MemoryRegion.sbuf)
    target = nl.require_tile(api, "dst", dst, regions)
    source = nl.require_tile(api, "src", src, regions)
    if math.prod(target.shape) != math.prod(source.shape):
        raise errors.ShapeMismatch(f"'{api}' from {source!r} to {target!r}: sizes differ")
    where = mask_values(api, mask, target.shape)
    if oob_mode == _OobMode.skip:  # "silently skips any operations involving" them
        if dst_rmw_op is not None:
            raise ValueError(f"'{api}': dst_rmw_op allows only oob_mode.error")
        skipped = np.zeros(target.shape, np.bool_)
        for side in (source, target):
            if side.out_of_bounds is not None:
                skipped |= side.out_of_bounds.reshape(target.shape)
        kept = ~skipped
        where = kept if where is None else where & kept
    check_in_bounds(api, source, None if where is None else where.reshape(source.shape))
    values = source.read().reshape(target.shape)
    if dst_rmw_op is not None:
        if dst_rmw_op not in (np.add, nl.add):
            raise errors.UnsupportedOperator(f"'{api}' dst_rmw_op takes only np.add")
        values = nl.as_f32(target) + values.astype(np.float32)
    target.write(values if values.dtype == target.dtype else values.astype(np.float32), where, api)
    run.count_dma(not source.on_chip, not target.on_chip, source.size * source.itemsize)


def memset(
    shape: Any, value: Any, dtype: Any, *, mask: Any = None, engine: Any = engine.unknown, **kw: Any
) -> Tensor:
    """A new SBUF tile of ``shape`` filled with ``value`` (the core ``memset``; Vector or
    GpSimd engine)."""
    dims = tuple(int(s) for s in shape)
    return _run_core(
        "memset", core_isa.memset, dims, nki_dtype(dtype), mask, value=value, engine=engine
    )
