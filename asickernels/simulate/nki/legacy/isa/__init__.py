"""``neuronxcc.nki.isa`` (``nisa``) of Neuron SDK 2.2x: one instruction per call, each
*returning* its result tile (the current API passes ``dst`` first instead). Signatures and
rules follow general/nki/api/nki/isa/__init__.py at aws-neuron-sdk 0521004c (Neuron 2.26).
Engines compute in float32 and cast the result to ``dtype`` (default: the input's dtype, or
the promoted dtype of two inputs)."""

from __future__ import annotations

import functools
import math
import warnings
from enum import IntEnum
from typing import Any

import numpy as np

from asickernels.simulate.nki import errors, runtime, trace
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


_ReduceCmd = reduce_cmd
_OobMode = oob_mode


def _input(api: str, name: str, data: Any, mask: Any) -> tuple[Tensor, np.ndarray | None]:
    """An on-chip input tile and the mask over its shape (its reads checked in bounds)."""
    runtime.active_run(api)
    tile = nl.require_tile(api, name, data, nl.ON_CHIP)
    where = mask_values(api, mask, tile.shape)
    check_in_bounds(api, tile, where)
    return tile, where


# -- instructions run by the core instruction set -------------------------------------------
def _core_tensor(tile: Tensor, buffer: MemoryRegion | None = None) -> NkiTensor:
    """A legacy tile's values as a core tensor in the same memory (for a core instruction),
    or in ``buffer``, where the compiler places a result tile the instruction needs there."""
    return NkiTensor(tile.read(), tile.dtype, buffer or tile.buffer, None)  # read(): a copy


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
    if callable(value) and value in nl.ALU_OPS:  # by the numpy function it computes
        function: Any = nl.ALU_OPS[value]
        return _CORE_ALU_OPS.get(function, value)
    if callable(value) and (value in nl.ACTIVATIONS or value is np.copy):  # by name
        name = getattr(value, "__name__", "")
        return getattr(core_language, "abs" if name == "absolute" else name, value)
    return value


# The core's binary ALU operators by the numpy function they compute (np.add -> nl.add).
_CORE_ALU_OPS = {
    function: op
    for op, function in core_language.ALU_OPS.items()
    if isinstance(function, np.ufunc) and function.nin == 2
}


def _run_core(
    api: str,
    instruction: Any,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    mask: Any,
    dst: Tensor | None = None,
    buffer: MemoryRegion = MemoryRegion.sbuf,
    core_dtype: np.dtype[Any] | None = None,
    masked_inputs: bool = True,
    reads: tuple[Tensor, ...] = (),
    pinned: bool | None = None,
    **operands: Any,
) -> Tensor:
    """Runs the core ``instruction(dst, **operands)`` on copies of the legacy operands and
    writes its result into ``dst`` (or a new tile of ``shape``/``dtype``) where ``mask``
    holds: the legacy generation's calling convention over the one implementation.
    ``core_dtype``: the core result's dtype where the instruction fixes it (then cast to
    ``dtype``); ``masked_inputs``: the mask covers the inputs shaped like the result (not
    for a transpose); ``reads``: tiles the instruction reads through prepared values (the
    adapter checked their bounds); ``pinned``: whether the kernel chose the engine, where
    the core instruction cannot tell (None: as the core records it)."""
    runtime.active_run(api)
    executed = mask_values(api, mask, shape)
    for name, value in operands.items():
        if isinstance(value, Tensor):  # the core instruction checks its memories
            nl.require_tile(api, name, value, (*nl.ON_CHIP, *nl.HBM))
            aligned = masked_inputs and value.shape == tuple(shape)
            check_in_bounds(api, value, executed if aligned else None)
    # The result's memory is the legacy tile's (accounted there): an empty core allocation.
    scratch = runtime.Allocation(runtime.active_run(api), buffer is MemoryRegion.psum, 0)
    computed = dtype if core_dtype is None else core_dtype
    core_dst = NkiTensor(np.zeros(shape, computed), computed, buffer, scratch)
    if dst is not None:
        nl.require_tile(api, "dst", dst, (*nl.ON_CHIP, *nl.HBM))
        core_dst = _core_tensor(dst)
    converted = {name: _core_operand(v) for name, v in operands.items()}
    run = runtime.active_run(api)
    # The trace records the kernel's tiles, not the core's copies: the core instruction
    # traces into a scratch list, and the engine it counted itself on is traced here.
    recorded, accesses = run.trace, run.trace_accesses
    core_trace: list[trace.Instruction] | None = None if recorded is None else []
    run.trace, run.trace_accesses = core_trace, False
    before, transfers = dict(run.instructions), run.dma_transfers
    try:
        instruction(core_dst, **converted)
    finally:
        run.trace, run.trace_accesses = recorded, accesses
    out = dst if dst is not None else nl.new_tile(shape, dtype, api, buffer)
    out.write(core_dst.values, executed, api)
    if recorded is not None:
        counted = [e for e, n in run.instructions.items() if n != before.get(e, 0)]
        engine = "dma" if run.dma_transfers != transfers else counted[0]
        tiles = [*reads, *(v for n, v in operands.items()
                           if isinstance(v, Tensor) and n not in _WRITTEN_OPERANDS)]  # fmt: skip
        written = [
            v for n, v in operands.items() if isinstance(v, Tensor) and n in _WRITTEN_OPERANDS
        ]
        # The core's own record gives the parameters (the operator), unless a mask made
        # this a partial result.
        params = core_trace[-1].params if core_trace and mask is None else None
        if pinned is None:
            pinned = core_trace[-1].pinned if core_trace else True
        recorded.append(trace.instruction(engine, api, tiles, (out, *written), params, pinned))
    for name in _WRITTEN_OPERANDS & set(operands):  # e.g. reduce_res: copied back
        if isinstance(operands[name], Tensor):
            operands[name].write(converted[name].values.reshape(operands[name].shape), None, api)
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
    """``op(data * scale + bias)`` on the Scalar engine (the core ``activation``); ``scale``
    a scalar or a float32 ``[P, 1]`` vector, ``bias`` a ``[P, 1]`` vector. ``reduce_cmd``
    drives the engine's 128 accumulation registers (reset to zero / reduce into with any
    ALU ``reduce_op`` / both) and ``reduce_res`` reads them out."""
    api = "activation"
    if bias is not None and not isinstance(bias, Tensor):
        raise TypeError(f"'{api}' bias must be a [P, 1] tile")  # "a vector" (2.26 reference)
    command = _ReduceCmd(reduce_cmd)
    if command in (_ReduceCmd.reduce, _ReduceCmd.reset_reduce) and reduce_op is None:
        raise TypeError(f"'{api}': reduce_cmd={command.name} needs reduce_op")
    out_dtype = nki_dtype(dtype) if dtype else data.dtype
    reduce_ops = tuple(core_language.ALU_OPS)
    return _run_core(
        api, functools.partial(core_isa._activation, reduce_ops=reduce_ops), data.shape,
        out_dtype, mask, op=op, data=data, bias=bias, scale=scale, reduce_op=reduce_op,
        reduce_res=reduce_res, reduce_cmd=command,
    )  # fmt: skip


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
    """``op``-reduction of ``data`` over its trailing free ``axis`` (the core
    ``tensor_reduce``, Vector engine); ``negate`` multiplies the result by -1. Masked-out
    inputs take no part; a result element whose inputs are all masked out is not written.
    Reducing every free axis gives ``[P, 1]`` (see ``nl.reduced``)."""
    api = "tensor_reduce"
    tile, where = _input(api, "data", data, mask)
    axes = core_language.reduce_axes(api, tile, axis)
    shape, written = nl.reduced(tile.shape, axes, keepdims, where)
    out_dtype = nki_dtype(dtype) if dtype else tile.dtype
    reduce = functools.partial(core_isa._tensor_reduce, included=where)
    return _run_core(
        api, reduce, shape, out_dtype, written, reads=(tile,), op=op, data=_core_tensor(tile),
        axis=axes, negate=negate, keepdims=keepdims,
    )  # fmt: skip


def _identity_filled(api: str, tile: Tensor, where: np.ndarray | None, op: Any) -> NkiTensor:
    """``tile``'s values with the masked-out ones replaced by ``op``'s identity, so that they
    take no part in a reduction."""
    values = tile.read()
    if where is not None:
        identity = core_language.IDENTITIES.get(nl.ALU_OPS.get(op), None)
        if identity is None:
            raise errors.UnsupportedOperator(f"'{api}' cannot mask a reduction by {op!r}")
        if not is_float(tile.dtype) and np.isinf(identity):
            limits = np.iinfo(tile.dtype)
            identity = limits.min if identity < 0 else limits.max
        values = np.where(where, values, np.array(identity).astype(tile.dtype))
    return NkiTensor(values, tile.dtype, tile.buffer, None)


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
    mean and variance*count of the even elements, then of the odd elements (the core
    ``bn_stats``, Vector engine). Masked-out elements are left out."""
    api = "bn_stats"
    tile, where = _input(api, "data", data, mask)
    out_dtype = nki_dtype(dtype) if dtype else tile.dtype
    statistics = functools.partial(core_isa._bn_stats, included=where)
    return _run_core(api, statistics, (tile.shape[0], 6), out_dtype, None, reads=(tile,),
                     data=_core_tensor(tile))  # fmt: skip


def bn_aggr(data: Tensor, *, mask: Any = None, dtype: Any = None, **kwargs: Any) -> Tensor:
    """Per partition, the mean and (population) variance from ``bn_stats`` outputs: a
    multiple of 3 elements per partition, ``(count, mean, variance*count)`` tuples (the core
    ``bn_aggr``); masked-out triples take no part."""
    api = "bn_aggr"
    tile, where = _input(api, "data", data, mask)
    values = nl.as_f32(tile).reshape(tile.shape[0], -1)
    if where is not None and values.shape[1] % 3 == 0:  # a masked triple counts 0 elements
        triples = values.reshape(tile.shape[0], -1, 3)
        keep: Any = np.broadcast_to(where, tile.shape).reshape(triples.shape).all(axis=2)
        values = np.where(keep[..., None], triples, 0).reshape(values.shape)
    out_dtype = nki_dtype(dtype) if dtype else tile.dtype
    return _run_core(api, core_isa.bn_aggr, (tile.shape[0], 2), out_dtype, None, reads=(tile,),
                     data=values)  # fmt: skip


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
    ``vals`` (the core ``nc_find_index8``; uint32 by default, or uint16); the mask applies
    to ``data`` only (masked-out elements are never found)."""
    api = "nc_find_index8"
    tile, _ = _input(api, "data", data, None)
    values = _per_partition_elements(api, tile, mask)
    out_dtype = nki_dtype(dtype) if dtype else nl.uint32
    return _run_core(
        api, core_isa.nc_find_index8, (tile.shape[0], 8), out_dtype, None, reads=(tile,),
        data=values, vals=vals,
    )  # fmt: skip


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
    by ``imm``; their indices go to ``dst_idx`` if given (the core ``nc_match_replace8``,
    matching the slots in the 2.26 reference's order, 0 to 7)."""
    api = "nc_match_replace8"
    tile, _ = _input(api, "data", data, mask)
    values = _per_partition_elements(api, tile, mask)  # masked-out: -inf, never matched
    out_dtype = nki_dtype(dtype) if dtype else tile.dtype
    match = functools.partial(core_isa._match_replace8, slots=range(8))
    return _run_core(
        api, match, tile.shape, out_dtype, mask, reads=(tile,), data=values.reshape(tile.shape),
        vals=vals, imm=imm, dst_idx=dst_idx,
    )  # fmt: skip


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
    ``[P, 1]`` tile of per-partition probabilities; the core ``dropout``) in ``dtype``
    (the 2.26 reference's ``dtype``)."""
    nl.require_tile("dropout", "data", data, nl.ON_CHIP)
    out_dtype = nki_dtype(dtype) if dtype else data.dtype
    drop = functools.partial(core_isa._dropout, same_dtype=False)
    return _run_core("dropout", drop, data.shape, out_dtype, mask, data=data, prob=prob)


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
    """Copies ``src`` into ``dst``, a tile view at a run-time offset within each partition
    (the core ``tensor_copy``); equal partitions and elements per partition."""
    _run_core(
        "tensor_copy_dynamic_dst", core_isa.tensor_copy, dst.shape, dst.dtype, mask, dst,
        src=src, engine=engine,
    )  # fmt: skip


def dma_transpose(src: Tensor, *, axes: Any = None, mask: Any = None, dtype: Any = None,
                  **kwargs: Any) -> Tensor:  # fmt: skip
    """``src`` (HBM or SBUF) transposed by DMA into a new SBUF tile (the core
    ``dma_transpose``): permutation (1, 0), (2, 1, 0) or (3, 1, 2, 0) for 2-, 3- and 4-D
    tiles, any dtype (the 2.26 reference states no 2-byte rule)."""
    api = "dma_transpose"
    tile = nl.require_tile(api, "src", src, (*nl.HBM, MemoryRegion.sbuf))
    expected = _DMA_TRANSPOSE_AXES.get(tile.ndim)
    if expected is None or (axes is not None and tuple(axes) != expected):
        raise errors.ShapeMismatch(
            f"'{api}' of {tile!r}: supported axes are (1, 0), (2, 1, 0) and (3, 1, 2, 0)"
        )
    shape = tuple(tile.shape[axis] for axis in expected)
    out_dtype = nki_dtype(dtype) if dtype else tile.dtype
    transpose = functools.partial(core_isa._dma_transpose, two_byte_rows=False)
    return _run_core(api, transpose, shape, out_dtype, mask, masked_inputs=False, src=tile,
                     axes=expected)  # fmt: skip


# "Supported axes are (1, 0), (2, 1, 0), and (3, 1, 2, 0)" (2.26 reference, dma_transpose).
_DMA_TRANSPOSE_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


def reciprocal(
    data: Tensor, *, dtype: Any = None, mask: Any = None, engine: Any = engine.unknown, **kw: Any
) -> Tensor:
    """``1 / data`` element-wise (the core ``reciprocal``, Vector engine). ``engine`` unset:
    the compiler chooses Scalar or Vector (general/nki/api/nki/isa/__init__.py@2086a70)."""
    out_dtype = nki_dtype(dtype) if dtype else data.dtype
    pinned = engine is not unknown_engine
    return _run_core(
        "reciprocal", core_isa.reciprocal, data.shape, out_dtype, mask, pinned=pinned, data=data
    )


def tensor_partition_reduce(
    op: Any, data: Tensor, *, mask: Any = None, dtype: Any = None, **kwargs: Any
) -> Tensor:
    """``op``-reduction across the partitions of ``data`` into a ``[1, ...]`` tile (the core
    ``tensor_partition_reduce``, GpSimd engine; ``op`` one of add, max, bitwise_or,
    bitwise_and); masked-out elements take no part."""
    api = "tensor_partition_reduce"
    tile, where = _input(api, "data", data, mask)
    out_dtype = nki_dtype(dtype) if dtype else tile.dtype
    return _run_core(
        api, core_isa.tensor_partition_reduce, (1, *tile.shape[1:]), out_dtype, None,
        reads=(tile,), op=op, data=_identity_filled(api, tile, where, op),
    )  # fmt: skip


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
    return tensor_engine_matmul("nc_matmul", stationary, moving, mask, kwargs.get("perf_mode"))


def tensor_engine_matmul(
    api: str, stationary: Tensor, moving: Tensor, mask: Any, perf_mode: Any = None
) -> Tensor:
    """``stationary.T @ moving`` into a new float32 PSUM tile (the core ``nc_matmul``, without
    its fp32-pair rule, which the 2.26 reference does not state); ``perf_mode`` double-row
    takes ``[K, 2, free]`` fp8 operands (nki/test/test_nki_isa_nc_matmul.py@81ce03a). The
    compiler copies a PSUM result tile to SBUF for it: AWS's flash_attn_bwd (nki-samples
    attention.py@8370e11) multiplies an nc_transpose result."""
    mode = core_isa.matmul_perf_mode(perf_mode or "none")
    for name, tile in (("stationary", stationary), ("moving", moving)):
        nl.require_tile(api, name, tile, (MemoryRegion.sbuf,))
        check_in_bounds(api, tile, None)
    free = 1 if mode is core_isa.matmul_perf_mode.none else 2
    shape = (math.prod(stationary.shape[free:]), math.prod(moving.shape[free:]))
    matmul = functools.partial(
        core_isa._nc_matmul, accumulate=None, tile_position=(), tile_size=(), perf_mode=mode,
        fp32_pairs=False,
    )  # fmt: skip
    return _run_core(
        api, matmul, shape, nl.float32, mask, None, MemoryRegion.psum, masked_inputs=False,
        reads=(stationary, moving), stationary=_core_tensor(stationary, MemoryRegion.sbuf),
        moving=_core_tensor(moving, MemoryRegion.sbuf),
    )  # fmt: skip


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
    """Swaps the partition axis and the (flattened) free axes (the core ``nc_transpose``): on
    the Tensor engine up to 128x128 from SBUF into PSUM, on the Vector engine up to 32x32
    (the default engine follows the size)."""
    api = "nc_transpose"
    tile, _ = _input(api, "data", data, None)
    flat = tile.reshape((tile.shape[0], math.prod(tile.shape[1:])))
    chosen = core_isa._transpose_engine(api, flat, _core_operand(engine))
    buffer = MemoryRegion.psum if chosen == "tensor" else MemoryRegion.sbuf
    source: Any = flat
    if chosen == "tensor":  # from SBUF (a compiler-placed PSUM result is copied there)
        nl.require_tile(api, "data", tile, (MemoryRegion.sbuf,))
        source = _core_tensor(flat, MemoryRegion.sbuf)
    out_dtype = nki_dtype(dtype) if dtype else tile.dtype
    return _run_core(
        api, core_isa.nc_transpose, flat.shape[::-1], out_dtype, mask, None, buffer,
        masked_inputs=False, reads=(tile,) if source is not flat else (), data=source,
        engine=engine,
    )  # fmt: skip


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
    out.write(bounds.values, None, api)
    return out


def iota(expr: Any, dtype: Any, *, mask: Any = None, **kwargs: Any) -> Tensor:
    """A tile holding the values of the affine index expression ``expr`` (of ``nl.arange``
    grids), computed in int32 and cast to ``dtype`` (the core ``iota``, GpSimd engine)."""
    api = "iota"
    runtime.active_run(api)
    if not isinstance(expr, IndexGrid):
        raise TypeError(f"'{api}' takes an affine expression of nl.arange, got {expr!r}")
    if expr.values.ndim < 2:
        raise errors.LeadingDimensionOfTensorMustBePartition(
            f"'{api}' needs a 2-D expression (partition, free), got shape {expr.shape}"
        )
    pattern, offset, multiplier = _affine_form(api, expr.values)
    return _run_core(
        api, core_isa.iota, expr.shape, nki_dtype(dtype), mask, pattern=pattern, offset=offset,
        channel_multiplier=multiplier,
    )  # fmt: skip


def _affine_form(api: str, values: np.ndarray) -> tuple[list[list[int]], int, int]:
    """Index-expression ``values`` over ``[P, free...]`` as the core's affine form
    ``(pattern [[step, count], ...], offset, channel_multiplier)``; the reference takes "an
    affine expression" (iota's ``expr``, affine_select's ``pred``), anything else is refused."""
    origin = (0,) * values.ndim

    def step(axis: int) -> int:
        if values.shape[axis] < 2:
            return 0
        return int(
            values[tuple(1 if a == axis else 0 for a in range(values.ndim))] - values[origin]
        )

    pattern = [[step(axis), values.shape[axis]] for axis in range(1, values.ndim)]
    form = (pattern, int(values[origin]), step(0))
    if not np.array_equal(core_isa._affine_values(api, values.shape, *form), values):
        raise TypeError(f"'{api}' takes an affine expression of nl.arange values")
    return form


def affine_select(
    pred: Any, on_true_tile: Tensor, on_false_value: float, *, mask: Any = None,
    dtype: Any = None, **kwargs: Any,
) -> Tensor:  # fmt: skip
    """``on_true_tile`` where the affine predicate ``pred`` holds, else ``on_false_value``
    (the core ``affine_select``, GpSimd engine). ``pred`` is one comparison of index
    expressions (e.g. a causal mask), not masks combined with ``&``/``|`` (2.26 reference)."""
    api = "affine_select"
    tile = nl.require_tile(api, "on_true_tile", on_true_tile, nl.ON_CHIP)
    if not isinstance(pred, Mask) or pred.comparison is None:
        raise TypeError(f"'{api}' takes one affine comparison of nl.arange expressions as pred")
    difference, compare = pred.comparison
    try:
        difference = np.broadcast_to(difference, tile.shape)
    except ValueError:
        raise errors.ShapeMismatch(
            f"'{api}': pred of shape {list(difference.shape)} does not fit {tile!r}"
        ) from None
    pattern, offset, multiplier = _affine_form(api, difference)
    out_dtype = nki_dtype(dtype) if dtype else tile.dtype
    check_in_bounds(api, tile, mask_values(api, mask, tile.shape))
    # The legacy compiler copies a PSUM tile to SBUF for GpSimd: AWS's flash_fwd
    # (nki-samples attention.py@8370e11) selects from ``qk_psum``.
    source = _core_tensor(tile, MemoryRegion.sbuf)
    return _run_core(
        api, core_isa.affine_select, tile.shape, out_dtype, mask, reads=(tile,),
        pattern=pattern, channel_multiplier=multiplier, on_true_tile=source,
        on_false_value=on_false_value, cmp_op=compare, offset=offset,
    )  # fmt: skip


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
    runtime.active_run(api)
    for name, side in (("dst", dst), ("src", src)):
        nl.require_tile(api, name, side, (*nl.HBM, MemoryRegion.sbuf))
    if dst.size != src.size:
        raise errors.ShapeMismatch(f"'{api}' from {src!r} to {dst!r}: sizes differ")
    if dst_rmw_op not in (None, np.add, nl.add):
        raise errors.UnsupportedOperator(f"'{api}' dst_rmw_op takes only np.add")
    where = mask_values(api, mask, dst.shape)
    if oob_mode == _OobMode.skip:  # "silently skips any operations involving" them
        if dst_rmw_op is not None:
            raise ValueError(f"'{api}': dst_rmw_op allows only oob_mode.error")
        skipped = np.zeros(dst.shape, np.bool_)
        for side in (src, dst):
            if side.out_of_bounds is not None:
                skipped |= side.out_of_bounds.reshape(dst.shape)
        where = ~skipped if where is None else where & ~skipped
    # A DMA moves the elements in order: the mask covers src's in that order.
    check_in_bounds(api, src, None if where is None else where.reshape(src.shape))
    copy = functools.partial(core_isa._dma_copy, accumulate=dst_rmw_op is not None)
    executed = None if where is None else Mask(where)
    _run_core(api, copy, dst.shape, dst.dtype, executed, dst, reads=(src,),
              src=_core_tensor(src))  # fmt: skip


def memset(
    shape: Any, value: Any, dtype: Any, *, mask: Any = None, engine: Any = engine.unknown, **kw: Any
) -> Tensor:
    """A new SBUF tile of ``shape`` filled with ``value`` (the core ``memset``; Vector or
    GpSimd engine)."""
    dims = tuple(int(s) for s in shape)
    return _run_core(
        "memset", core_isa.memset, dims, nki_dtype(dtype), mask, value=value, engine=engine
    )
