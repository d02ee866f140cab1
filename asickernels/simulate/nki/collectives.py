"""``nki.collectives``: collective communication between ranks, with the names and signatures
of the NKI 0.8 reference (nki/api/nki.collectives.rst; the docstrings of
nki/api/nki/collectives/__init__.py at aws-neuron-sdk 81ce03a, NKI 0.6, for the semantics;
the prepare/trigger split of NKI 0.7, nki.collectives.all_to_all_v_prepare and
all_gather_v_prepare pages).

A rank is one Logical NeuronCore: a launch of :func:`nki.multi_rank_simulate` runs
``world_size`` ranks, ``nki.collectives.rank_id()`` being each one's index (a plain kernel
call is rank 0 of a world of one). At LNC=2 both physical cores of a rank issue the
collectives, each meeting the same core of the other ranks: a collective on SBUF tiles
exchanges each core's own tiles, one on a rank's shared HBM tensors does the same work twice.

Collectives meet by program order within a rank-list: the n-th collective a core issues on
rank-list ``[0, 1]`` meets the n-th of the other cores on it. Ranks calling different
collectives, other shapes, dtypes, operators or replica groups raise
:class:`~asickernels.simulate.nki.errors.CollectiveMismatch`; a rank that never arrives or a
cycle of waits raises :class:`~asickernels.simulate.nki.errors.CollectiveDeadlock`. Each
names the ranks, cores and calls (see :mod:`.world`). Reductions (``nl.add``,
``nl.minimum``, ``nl.maximum``) run in float32 (integers: int64) in rank-list order and cast
to the destination's dtype, as the DMA engines' compute (nki.isa.dma_compute).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from asickernels.simulate.nki import alu, errors, language, runtime, scalar
from asickernels.simulate.nki.isa import NkiInstruction, VirtualRegister
from asickernels.simulate.nki.lnc import check_priority
from asickernels.simulate.nki.tensor import NKIObject, NkiTensor, dtype_name
from asickernels.simulate.nki.world import Call, World

__all__ = [
    "ReplicaGroup",
    "all_gather",
    "all_gather_v",
    "all_gather_v_prepare",
    "all_gather_v_trigger",
    "all_reduce",
    "all_to_all",
    "all_to_all_v",
    "all_to_all_v_prepare",
    "all_to_all_v_trigger",
    "collective_permute",
    "collective_permute_implicit",
    "collective_permute_implicit_current_processing_rank_id",
    "collective_permute_implicit_reduce",
    "rank_id",
    "rg_partition_op",
]

_REDUCE = {language.add: np.add, language.minimum: np.minimum, language.maximum: np.maximum}
# collective_permute_implicit: "The maximum number of channels is 4 for replica groups
# containing all devices inside a node and 2 for other supported replica groups."
_MAX_CHANNELS = 4


class rg_partition_op(enum.Enum):
    """How :meth:`ReplicaGroup.from_partition_op` maps a rank to its rank-list id:
    ``rank & operand``, ``rank // operand`` or ``rank % operand`` (NKI 0.7 reference,
    nki.collectives.ReplicaGroup page)."""

    bitwise_and = "bitwise_and"
    div = "div"
    mod = "mod"


class ReplicaGroup(NKIObject):
    """The ranks a collective runs on, as a list of rank-lists: the collective runs
    independently within each rank-list, and each rank is in at most one rank-list (NKI 0.7
    reference). ``ReplicaGroup([[0, 1, 2, 3], [4, 5, 6, 7]])``."""

    __slots__ = ("_value",)

    def __init__(self, rank_lists: Sequence[Sequence[int]]) -> None:
        lists: list[tuple[int, ...]] = []
        for rank_list in rank_lists:
            ranks = tuple(_rank(r, "ReplicaGroup") for r in rank_list)
            if not ranks:
                raise ValueError("ReplicaGroup: a rank-list needs at least one rank")
            lists.append(ranks)
        if not lists:
            raise ValueError("ReplicaGroup needs at least one rank-list")
        every = [r for ranks in lists for r in ranks]
        if len(set(every)) != len(every):
            raise ValueError(
                f"ReplicaGroup({[list(r) for r in lists]}): each rank must be in only one rank-list"
            )
        self._value = tuple(lists)

    @staticmethod
    def from_partition_op(world_size: int, op: rg_partition_op, operand: int) -> ReplicaGroup:
        """Ranks ``[0, world_size)`` sharing ``op(rank, operand)`` form one rank-list, in the
        order of that id: ``from_partition_op(8, rg_partition_op.mod, 4)`` is
        ``ReplicaGroup([[0, 4], [1, 5], [2, 6], [3, 7]])``."""
        if not isinstance(op, rg_partition_op):
            raise TypeError(f"from_partition_op: op must be an rg_partition_op, got {op!r}")
        size, value = _rank(world_size, "world_size"), _rank(operand, "operand")
        if size < 1 or (op is not rg_partition_op.bitwise_and and value < 1):
            raise ValueError(f"from_partition_op({world_size}, {op}, {operand}): out of range")
        key: Callable[[int], int] = {
            rg_partition_op.bitwise_and: lambda r: r & value,
            rg_partition_op.div: lambda r: r // value,
            rg_partition_op.mod: lambda r: r % value,
        }[op]
        ids = sorted({key(r) for r in range(size)})
        return ReplicaGroup([[r for r in range(size) if key(r) == i] for i in ids])

    def rank_list(self, rank: int) -> tuple[int, ...]:
        """The rank-list holding ``rank``."""
        for ranks in self._value:
            if rank in ranks:
                return ranks
        raise errors.UnsupportedOperator(f"rank {rank} is in no rank-list of {self!r}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReplicaGroup) and self._value == other._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __repr__(self) -> str:
        return f"ReplicaGroup({[list(ranks) for ranks in self._value]})"


def rank_id(name: str | None = None) -> VirtualRegister:
    """This core's rank in the launch's world (0 outside :func:`nki.multi_rank_simulate`),
    in a register (the 0.7 reference: "This returns a VirtualRegister today")."""
    run = runtime.active_run("rank_id")
    return VirtualRegister.holding(run.launch.rank, frozen=True)


# -- the data-moving collectives ------------------------------------------------------------
def all_reduce(
    srcs: Sequence[NkiTensor],
    dsts: Sequence[NkiTensor],
    replica_group: ReplicaGroup,
    op: Any,
    priority: int | None = None,
    name: str | None = None,
) -> Any:
    """Every rank of the rank-list gets ``op`` over all ranks' ``srcs[i]`` in ``dsts[i]``
    (same shapes). Tensors all in HBM or all in SBUF; several only in HBM."""
    api = "all_reduce"
    pairs = _operands(api, srcs, dsts, hbm_only=False)
    reduce = _reduce_op(api, op)
    for src, dst in pairs:
        _same_shape(api, src, dst)
    payloads, _, _ = _meet(api, replica_group, pairs, priority, {"op": _op_name(op)})
    for i, (_, dst) in enumerate(pairs):
        alu.write(dst, _reduced(reduce, [p[i] for p in payloads], dst), api)
    return _issued(api, pairs)


def all_gather(
    srcs: Sequence[NkiTensor],
    dsts: Sequence[NkiTensor],
    replica_group: ReplicaGroup,
    collective_dim: int,
    priority: int | None = None,
    name: str | None = None,
) -> Any:
    """Every rank gets all ranks' ``srcs[i]`` concatenated in rank-list order along
    ``collective_dim`` in ``dsts[i]``: 0 in HBM; 0 or 1 for SBUF tiles, which must be 2-D."""
    api = "all_gather"
    pairs = _operands(api, srcs, dsts, hbm_only=False)
    dim = _collective_dim(api, collective_dim, pairs, sbuf_dims=(0, 1))
    size = len(_rank_list(api, replica_group))
    for src, dst in pairs:
        _scaled_shape(api, src, dst, dim, size)
    payloads, _, _ = _meet(api, replica_group, pairs, priority, {"collective_dim": dim})
    for i, (_, dst) in enumerate(pairs):
        alu.write(dst, np.concatenate([p[i] for p in payloads], axis=dim), api)
    return _issued(api, pairs)


def reduce_scatter(
    srcs: Sequence[NkiTensor],
    dsts: Sequence[NkiTensor],
    replica_group: ReplicaGroup,
    collective_dim: int,
    op: Any,
    priority: int | None = None,
    name: str | None = None,
) -> Any:
    """``op`` over all ranks' ``srcs[i]``, split along ``collective_dim`` (0 only) into as
    many chunks as ranks: the rank at position ``k`` of its rank-list gets chunk ``k``."""
    api = "reduce_scatter"
    pairs = _operands(api, srcs, dsts, hbm_only=False)
    reduce = _reduce_op(api, op)
    dim = _collective_dim(api, collective_dim, pairs, sbuf_dims=(0,))
    size = len(_rank_list(api, replica_group))
    for src, dst in pairs:
        _scaled_shape(api, dst, src, dim, size)
    payloads, position, _ = _meet(
        api, replica_group, pairs, priority, {"op": _op_name(op), "collective_dim": dim}
    )
    for i, (_, dst) in enumerate(pairs):
        chunk = dst.shape[0]
        reduced = _reduced(
            reduce, [p[i][position * chunk : (position + 1) * chunk] for p in payloads], dst
        )
        alu.write(dst, reduced, api)
    return _issued(api, pairs)


def all_to_all(
    srcs: Sequence[NkiTensor],
    dsts: Sequence[NkiTensor],
    replica_group: ReplicaGroup,
    collective_dim: int,
    priority: int | None = None,
    name: str | None = None,
) -> Any:
    """Each rank splits ``srcs[i]`` along ``collective_dim`` (0 only) into as many chunks as
    ranks and sends chunk ``k`` to the rank at position ``k``; ``dsts[i]`` (the shape of
    ``srcs[i]``) gets the chunks received, in rank-list order. HBM only."""
    api = "all_to_all"
    pairs = _operands(api, srcs, dsts, hbm_only=True)
    dim = _collective_dim(api, collective_dim, pairs, sbuf_dims=(0,))
    size = len(_rank_list(api, replica_group))
    for src, dst in pairs:
        _same_shape(api, src, dst)
        if src.shape[0] % size:
            raise errors.ShapeMismatch(
                f"'{api}' splits dimension 0 of {src!r} into {size} equal chunks"
            )
    payloads, position, _ = _meet(api, replica_group, pairs, priority, {"collective_dim": dim})
    for i, (_, dst) in enumerate(pairs):
        chunk = dst.shape[0] // size
        received = [p[i][position * chunk : (position + 1) * chunk] for p in payloads]
        alu.write(dst, np.concatenate(received, axis=0), api)
    return _issued(api, pairs)


def collective_permute(
    srcs: Sequence[NkiTensor],
    dsts: Sequence[NkiTensor],
    source_target_pairs: Sequence[tuple[int, int]],
    priority: int | None = None,
    name: str | None = None,
) -> Any:
    """For each ``(source, target)`` pair, rank ``target``'s ``dsts[0]`` gets rank
    ``source``'s ``srcs[0]`` (one tensor each, HBM). Every rank named in a pair takes part;
    a rank named in none has nothing to do. A rank is the source and the target of at most
    one pair each (two senders to one destination would race)."""
    api = "collective_permute"
    pairs = _operands(api, srcs, dsts, hbm_only=True, single=True)
    ((_, dst),) = pairs
    edges = [(_rank(s, api), _rank(t, api)) for s, t in source_target_pairs]
    for side, label in ((0, "source"), (1, "target")):
        seen = [edge[side] for edge in edges]
        if len(set(seen)) != len(seen):
            raise errors.UnsupportedOperator(
                f"'{api}' source_target_pairs {edges}: a rank is the {label} of two pairs"
            )
    run = runtime.active_run(api)
    members = tuple(sorted({r for edge in edges for r in edge}))
    if run.launch.rank not in members:
        return _issued(api, pairs)
    group = ReplicaGroup([members])
    payloads, _, ranks = _meet(api, group, pairs, priority, {"pairs": tuple(edges)})
    sources = [s for s, t in edges if t == run.launch.rank]
    if sources:  # the signature made every member's tensors of one shape
        alu.write(dst, payloads[ranks.index(sources[0])][0], api)
    return _issued(api, pairs)


def collective_permute_implicit(
    srcs_by_channel: Sequence[Sequence[NkiTensor]],
    dsts_by_channel: Sequence[Sequence[NkiTensor]],
    replica_group: ReplicaGroup,
    channel_ids: Sequence[int] = (0,),
    priority: int | None = None,
    name: str | None = None,
) -> Any:
    """A ring step: on every channel, each rank's ``dsts_by_channel[c][0]`` gets its
    predecessor's ``srcs_by_channel[c][0]`` (rank-list order, the last rank's successor
    being the first). One tensor per channel; ``channel_ids`` are 0, 1, ... (at most 4)."""
    api = "collective_permute_implicit"
    pairs = [
        (src, dst) for src, dst in _channels(api, [srcs_by_channel, dsts_by_channel], channel_ids)
    ]
    for src, dst in pairs:
        _same_shape(api, src, dst)
    payloads, position, _ = _meet(api, replica_group, pairs, priority, {"channels": len(pairs)})
    predecessor = payloads[position - 1]
    for c, (_, dst) in enumerate(pairs):
        alu.write(dst, predecessor[c], api)
    return _issued(api, pairs)


def collective_permute_implicit_reduce(
    srcs0_by_channel: Sequence[Sequence[NkiTensor]],
    srcs1_by_channel: Sequence[Sequence[NkiTensor]],
    dsts_by_channel: Sequence[Sequence[NkiTensor]],
    replica_group: ReplicaGroup,
    op: Any,
    channel_ids: Sequence[int] = (0,),
    priority: int | None = None,
    name: str | None = None,
) -> Any:
    """:func:`collective_permute_implicit` of ``op(srcs0_by_channel[c][0],
    srcs1_by_channel[c][0])``: each rank reduces its own two sources, sends the result to
    its successor and receives its predecessor's into ``dsts_by_channel[c][0]``."""
    api = "collective_permute_implicit_reduce"
    reduce = _reduce_op(api, op)
    triples = _channels(api, [srcs0_by_channel, srcs1_by_channel, dsts_by_channel], channel_ids)
    for src0, src1, dst in triples:
        _same_shape(api, src0, dst)
        _same_shape(api, src1, dst)
    pairs = [(src0, dst) for src0, _, dst in triples]
    reduced = [_reduced(reduce, [_values(src0), _values(src1)], dst) for src0, src1, dst in triples]
    payloads, position, _ = _meet(
        api,
        replica_group,
        pairs,
        priority,
        {"op": _op_name(op), "channels": len(triples)},
        values=reduced,
    )
    for c, (_, _, dst) in enumerate(triples):
        alu.write(dst, payloads[position - 1][c], api)
    return _issued(api, pairs)


def collective_permute_implicit_current_processing_rank_id(
    iteration_id: int, replica_group: ReplicaGroup, channel_id: int = 0, name: str | None = None
) -> VirtualRegister:
    """The rank whose data this rank holds after ``iteration_id`` steps of
    :func:`collective_permute_implicit` on ``channel_id``: its own at 0, then its
    predecessor's, and so on around the rank-list; in a register."""
    api = "collective_permute_implicit_current_processing_rank_id"
    run = runtime.active_run(api)
    if not 0 <= int(channel_id) < _MAX_CHANNELS:
        raise errors.UnsupportedOperator(f"'{api}' channel_id={channel_id}: channels are 0-3")
    ranks = replica_group.rank_list(run.launch.rank)
    position = ranks.index(run.launch.rank)
    return VirtualRegister.holding(
        ranks[(position - scalar.value_of(iteration_id)) % len(ranks)], frozen=True
    )


# -- variable-length collectives --------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Prepared:
    """A ``*_v`` collective set up by its prepare: the operands, and the metadata as read then
    (per rank-list position: send counts, send displacements, receive displacements)."""

    api: str
    src: NkiTensor
    dst: NkiTensor
    replica_group: ReplicaGroup
    metadata: NkiTensor
    recv_counts_known: bool
    has_rdispls: bool
    priority: int | None
    send_counts: tuple[int, ...]
    send_displs: tuple[int, ...]
    recv_displs: tuple[int, ...] | None

    def __str__(self) -> str:
        return f"{self.api}_prepare"


def _variable_length(api: str, phase: str, doc: str) -> Callable[..., Any]:
    """The four ``*_v`` entry points of ``api`` share one signature: ``phase`` "run" does
    the whole collective, "prepare" only its first half (NKI 0.7: "All arguments match
    all_to_all_v()")."""

    def collective(
        srcs: Sequence[NkiTensor],
        dsts: Sequence[NkiTensor],
        replica_group: ReplicaGroup,
        metadata_tensor: NkiTensor,
        recv_counts_known: bool = False,
        has_rdispls: bool = False,
        priority: int | None = None,
        name: str | None = None,
    ) -> Any:
        prepared = _prepare(api, srcs, dsts, replica_group, metadata_tensor,
                            recv_counts_known, has_rdispls, priority)  # fmt: skip
        return _trigger(prepared) if phase == "run" else _hold(prepared)

    collective.__name__ = collective.__qualname__ = api if phase == "run" else f"{api}_prepare"
    collective.__doc__ = doc
    return collective


all_to_all_v = _variable_length(
    "all_to_all_v",
    "run",
    """All-to-all of flat element buffers with per-rank counts known at run time. The
    ``uint32`` ``metadata_tensor`` (HBM ``(rows, n)`` or SBUF ``(1, rows, n)``, ``n`` ranks
    in the rank-list, rows 3 or 4) holds per rank-list position ``r``: row 0 the elements
    sent to ``r``, row 1 where in ``src`` they start, row 2 the elements received from ``r``
    (written here unless ``recv_counts_known``), row 3 (``has_rdispls``, 4 rows) where in
    ``dst`` they go; without it the chunk from ``r`` lands at ``r * (dst.size // n)``.
    One tensor each, in HBM; every chunk must fit its buffer (checked at run time).""",
)
all_gather_v = _variable_length(
    "all_gather_v",
    "run",
    """All-gather of flat element buffers: each rank sends the one chunk
    ``src[send_displ : send_displ + send_count]`` (rows 0 and 1 of ``metadata_tensor``,
    first column) to every rank, where the chunk from position ``s`` lands at
    ``s * (dst.size // n)``; row 2 gets the counts received unless ``recv_counts_known``.
    Current limitations (0.6 reference): ``has_rdispls=True`` is not supported, only LNC=2,
    every rank-list has exactly 4 ranks.""",
)
all_to_all_v_prepare = _variable_length(
    "all_to_all_v",
    "prepare",
    """The first half of :func:`all_to_all_v`: reads ``metadata_tensor`` now (not ``srcs``
    or ``dsts``) and returns the instruction :func:`all_to_all_v_trigger` takes. Each
    prepare must be followed by its trigger before any other prepare (NKI 0.7).""",
)
all_gather_v_prepare = _variable_length(
    "all_gather_v",
    "prepare",
    """The first half of :func:`all_gather_v` (see :func:`all_to_all_v_prepare`).""",
)


def all_to_all_v_trigger(prepare_instr: Any, name: str | None = None) -> Any:
    """Runs the :func:`all_to_all_v` that ``prepare_instr`` set up: reads ``srcs`` and
    writes ``dsts`` now."""
    return _trigger(_release("all_to_all_v", prepare_instr))


def all_gather_v_trigger(prepare_instr: Any, name: str | None = None) -> Any:
    """Runs the :func:`all_gather_v` that ``prepare_instr`` set up."""
    return _trigger(_release("all_gather_v", prepare_instr))


def check_no_prepared(run: runtime.Run) -> None:
    """At the end of a kernel: "Each prepare must be followed by exactly one trigger"."""
    if run.prepared is not None:
        raise errors.NkiValidationError(
            f"the kernel ended with a {run.prepared.api}_prepare that no "
            f"{run.prepared.api}_trigger ran"
        )


def _prepare(
    api: str,
    srcs: Sequence[NkiTensor],
    dsts: Sequence[NkiTensor],
    replica_group: ReplicaGroup,
    metadata: NkiTensor,
    recv_counts_known: bool,
    has_rdispls: bool,
    priority: int | None,
) -> _Prepared:
    """Checks a ``*_v`` collective's operands and reads its metadata."""
    run = runtime.active_run(api)
    ((src, dst),) = _operands(api, srcs, dsts, hbm_only=True, single=True)
    check_priority(api, priority)
    ranks = _rank_list(api, replica_group)
    if api == "all_gather_v":
        if has_rdispls:
            raise errors.UnsupportedOperator(f"'{api}': has_rdispls=True is not supported")
        if run.launch.cores != 2:
            raise errors.UnsupportedOperator(f"'{api}' is supported only at LNC=2 (kernel[2])")
        if len(ranks) != 4:
            raise errors.UnsupportedOperator(
                f"'{api}': every rank-list must have exactly 4 ranks (intra-chip), "
                f"{list(ranks)} has {len(ranks)}"
            )
    rows = _metadata_rows(api, metadata, len(ranks), has_rdispls)
    return _Prepared(
        api,
        src,
        dst,
        replica_group,
        metadata,
        bool(recv_counts_known),
        bool(has_rdispls),
        priority,
        tuple(int(v) for v in rows[0]),
        tuple(int(v) for v in rows[1]),
        tuple(int(v) for v in rows[3]) if has_rdispls else None,
    )


def _metadata_rows(api: str, metadata: NkiTensor, size: int, has_rdispls: bool) -> np.ndarray:
    """The ``(rows, size)`` values of a ``*_v`` metadata tensor: uint32, contiguous, HBM
    ``(rows, size)`` or SBUF ``(1, rows, size)``, 4 rows with ``has_rdispls``, else 3 or 4."""
    alu.require(api, "metadata_tensor", metadata, (*alu.HBM, *alu.SBUF))
    shape = metadata.shape if not metadata.on_chip else metadata.shape[1:]
    rows_allowed = (4,) if has_rdispls else (3, 4)
    layout_ok = (metadata.on_chip and len(metadata.shape) == 3 and metadata.shape[0] == 1) or (
        not metadata.on_chip and len(metadata.shape) == 2
    )
    if not layout_ok or shape[0] not in rows_allowed or shape[1] != size:
        expected = "(1, rows, n) in SBUF" if metadata.on_chip else "(rows, n) in HBM"
        raise errors.ShapeMismatch(
            f"'{api}' metadata_tensor {metadata!r} must be {expected} with n={size} ranks and "
            f"rows {' or '.join(map(str, rows_allowed))}"
        )
    if dtype_name(metadata.dtype) != "uint32":
        raise errors.UnsupportedDtype(f"'{api}' metadata_tensor must be uint32, got {metadata!r}")
    if not metadata.is_contiguous():
        raise errors.ShapeMismatch(f"'{api}' metadata_tensor {metadata!r} must be contiguous")
    return _values(metadata).reshape(shape).astype(np.int64)


def _hold(prepared: _Prepared) -> Any:
    """Puts a prepare in its core's one slot ("Prepares share a single slot, so an
    intervening prepare of any kind is rejected")."""
    run = runtime.active_run(prepared.api)
    if run.prepared is not None:
        raise errors.NkiValidationError(
            f"'{prepared.api}_prepare' while a {run.prepared.api}_prepare awaits its trigger: "
            "each prepare must be followed by exactly one trigger, with no other prepare between"
        )
    run.prepared = prepared
    return _instruction(prepared)


def _release(api: str, prepare_instr: Any) -> _Prepared:
    """The prepare ``prepare_instr`` set up, taken out of its core's slot."""
    run = runtime.active_run(f"{api}_trigger")
    prepared = getattr(prepare_instr, "handle", None)
    if not isinstance(prepared, _Prepared) or prepared is not run.prepared:
        raise errors.NkiValidationError(
            f"'{api}_trigger' needs the instruction of the {api}_prepare before it; got "
            f"{prepare_instr!r} (pending: "
            f"{'none' if run.prepared is None else run.prepared.api + '_prepare'})"
        )
    if prepared.api != api:
        raise errors.NkiValidationError(
            f"'{api}_trigger' given the instruction of a {prepared.api}_prepare"
        )
    run.prepared = None
    return prepared


def _trigger(prepared: _Prepared) -> Any:
    """Runs a prepared ``*_v`` collective."""
    api, src, dst = prepared.api, prepared.src, prepared.dst
    pairs = [(src, dst)]
    size = len(_rank_list(api, prepared.replica_group))
    send = (prepared.send_counts, prepared.send_displs)
    if api == "all_gather_v":  # one chunk for every destination: rows 0/1, first column
        send = (prepared.send_counts[:1] * size, prepared.send_displs[:1] * size)
    flat = _values(src).reshape(-1)
    chunks = []
    for r, (count, start) in enumerate(zip(*send, strict=True)):
        if start + count > flat.size:
            raise errors.TensorAccessOutOfBound(
                f"'{api}' sends elements [{start}, {start + count}) of {src!r} "
                f"({flat.size} elements) to rank-list position {r}"
            )
        chunks.append(flat[start : start + count])
    payloads, position, _ = _meet(
        api,
        prepared.replica_group,
        pairs,
        prepared.priority,
        {"recv_counts_known": prepared.recv_counts_known, "has_rdispls": prepared.has_rdispls},
        values=[chunks],
    )
    received = [p[0][position] for p in payloads]
    out = _values(dst).reshape(-1)
    slot = out.size // size
    for s, chunk in enumerate(received):
        start = prepared.recv_displs[s] if prepared.recv_displs is not None else s * slot
        end = start + chunk.size
        if end > out.size or (prepared.recv_displs is None and chunk.size > slot):
            raise errors.TensorAccessOutOfBound(
                f"'{api}' receives {chunk.size} elements from rank-list position {s} at "
                f"[{start}, {end}) of {dst!r}" + ("" if prepared.recv_displs else f" (slot {slot})")
            )
        out[start:end] = alu.cast(chunk, out.dtype)
    alu.write(dst, out, api)
    if not prepared.recv_counts_known:
        counts = np.array([chunk.size for chunk in received], np.uint32)
        metadata = prepared.metadata
        row = metadata[2:3, :] if not metadata.on_chip else metadata[0:1, 2:3, :]
        alu.write(row, counts, api)
    return _issued(api, pairs)


# -- shared by every collective ------------------------------------------------------------
def _meet(
    api: str,
    replica_group: ReplicaGroup,
    pairs: Sequence[tuple[NkiTensor, NkiTensor]],
    priority: int | None,
    params: dict[str, Any],
    values: list[Any] | None = None,
) -> tuple[list[list[Any]], int, tuple[int, ...]]:
    """Meets the other ranks of this rank's rank-list (the same physical core of each) in
    this core's next collective on it, contributing ``values`` (default: each pair's source
    values). Returns every rank's contribution in rank-list order, this rank's position in
    it, and the rank-list."""
    run = runtime.active_run(api)
    check_priority(api, priority)
    ranks = _rank_list(api, replica_group)
    world = World.of(run)
    outside = [r for r in ranks if r >= world.ranks]
    if outside:
        raise errors.UnsupportedOperator(
            f"'{api}' on {replica_group!r}: this launch runs {world.ranks} rank(s), so ranks "
            f"{outside} do not exist; run the kernel with "
            "nki.multi_rank_simulate(kernel, world_size=..., per_rank_inputs=...)"
        )
    rank, program = run.core
    operands = tuple(
        (src.shape, dtype_name(src.dtype), dst.shape, dtype_name(dst.dtype)) for src, dst in pairs
    )
    signature = (api, replica_group, tuple(sorted(params.items())), operands)
    shown = ", ".join(f"{k}={v}" for k, v in params.items())
    detail = (
        f"{api}(" + ", ".join(
            f"{list(s)} {sd} -> {list(d)} {dd}" for s, sd, d, dd in operands
        ) + f", {shown}, replica_group={replica_group!r})"
    )  # fmt: skip
    contributed = values if values is not None else [_values(src) for src, _ in pairs]
    number = run.next_meeting(("collective", ranks))
    where = f"collective #{number} of rank-list {list(ranks)}"
    if world.lnc > 1:
        where += f" on core {program}"
    calls = world.meet(
        run.core,
        ("collective", ranks, program, number),
        where,
        [(r, program) for r in ranks],
        Call(detail, signature, contributed),
    )
    return [calls[(r, program)].payload for r in ranks], ranks.index(rank), ranks


def _rank_list(api: str, replica_group: ReplicaGroup) -> tuple[int, ...]:
    if not isinstance(replica_group, ReplicaGroup):
        raise TypeError(
            f"'{api}' replica_group must be a nki.collectives.ReplicaGroup, got "
            f"{type(replica_group).__name__}"
        )
    return replica_group.rank_list(runtime.active_run(api).launch.rank)


def _operands(
    api: str,
    srcs: Sequence[NkiTensor],
    dsts: Sequence[NkiTensor],
    hbm_only: bool,
    single: bool = False,
) -> list[tuple[NkiTensor, NkiTensor]]:
    """``srcs`` and ``dsts`` paired: lists of tensors of one length, all in HBM or all in
    SBUF (``hbm_only``: HBM), several only in HBM, exactly one with ``single``."""
    runtime.active_run(api)
    if not isinstance(srcs, (list, tuple)) or not isinstance(dsts, (list, tuple)):
        raise TypeError(f"'{api}' takes srcs and dsts as lists of tensors")
    if len(srcs) != len(dsts) or not srcs or (single and len(srcs) != 1):
        wanted = "exactly one tensor each" if single else "equally many tensors, at least one"
        raise errors.ShapeMismatch(f"'{api}' srcs ({len(srcs)}) and dsts ({len(dsts)}): {wanted}")
    regions = alu.HBM if hbm_only else (*alu.HBM, *alu.SBUF)
    tensors = [alu.require(api, f"srcs[{i}]", t, regions) for i, t in enumerate(srcs)]
    tensors += [alu.require(api, f"dsts[{i}]", t, regions) for i, t in enumerate(dsts)]
    if len({t.on_chip for t in tensors}) > 1:
        raise errors.UnsupportedMemory(
            f"'{api}' tensors must all be in HBM or all in SBUF, not mixed: {tensors}"
        )
    if len(srcs) > 1 and tensors[0].on_chip:
        raise errors.UnsupportedMemory(
            f"'{api}' of several tensors (coalesced) is supported only in HBM"
        )
    return list(zip(srcs, dsts, strict=True))


def _channels(
    api: str, operand_lists: list[Sequence[Sequence[NkiTensor]]], channel_ids: Sequence[int]
) -> list[tuple[NkiTensor, ...]]:
    """Per channel, the one tensor of each of ``operand_lists`` (``*_by_channel``), checked
    against ``channel_ids``: consecutive from 0, one per channel, at most 4 channels."""
    runtime.active_run(api)
    counts = {len(lists) for lists in operand_lists}
    channels = len(operand_lists[0])
    if len(counts) > 1 or list(channel_ids) != list(range(channels)) or channels == 0:
        raise errors.UnsupportedOperator(
            f"'{api}' needs one inner list per channel in every *_by_channel argument and "
            f"channel_ids 0, 1, ... (consecutive from 0); got {[len(x) for x in operand_lists]} "
            f"lists and channel_ids={list(channel_ids)}"
        )
    if channels > _MAX_CHANNELS:
        raise errors.UnsupportedOperator(f"'{api}' uses at most {_MAX_CHANNELS} channels")
    result = []
    for c in range(channels):
        inner = [lists[c] for lists in operand_lists]
        if any(len(tensors) != 1 for tensors in inner):
            raise errors.UnsupportedOperator(
                f"'{api}' channel {c}: each inner list holds exactly one tensor (coalesced "
                "communication is not supported)"
            )
        tensors = tuple(
            alu.require(api, f"channel {c} operand", t[0], (*alu.HBM, *alu.SBUF)) for t in inner
        )
        result.append(tensors)
    return result


def _collective_dim(
    api: str, dim: int, pairs: Sequence[tuple[NkiTensor, NkiTensor]], sbuf_dims: tuple[int, ...]
) -> int:
    """``collective_dim``: 0 for HBM tensors, one of ``sbuf_dims`` for 2-D SBUF tiles."""
    on_chip = pairs[0][0].on_chip
    allowed = sbuf_dims if on_chip else (0,)
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or int(dim) not in allowed:
        where = "SBUF" if on_chip else "HBM"
        raise errors.UnsupportedOperator(
            f"'{api}' collective_dim={dim!r}: {where} tensors support {list(allowed)}"
        )
    if on_chip and any(len(t.shape) != 2 for pair in pairs for t in pair):
        raise errors.ShapeMismatch(f"'{api}' on SBUF takes 2-D tiles (one free dimension)")
    return int(dim)


def _same_shape(api: str, a: NkiTensor, b: NkiTensor) -> None:
    if a.shape != b.shape:
        raise errors.ShapeMismatch(f"'{api}' needs {a!r} and {b!r} of one shape")


def _scaled_shape(api: str, part: NkiTensor, whole: NkiTensor, dim: int, size: int) -> None:
    """``whole`` is ``part`` with dimension ``dim`` ``size`` times as long."""
    expected = list(part.shape)
    expected[dim] *= size
    if list(whole.shape) != expected:
        raise errors.ShapeMismatch(
            f"'{api}' over {size} ranks along dimension {dim}: {part!r} goes with a tensor of "
            f"shape {expected}, got {whole!r}"
        )


def _reduce_op(api: str, op: Any) -> Any:
    if op not in _REDUCE:
        raise errors.UnsupportedOperator(
            f"'{api}' reduces with nl.add, nl.minimum or nl.maximum, got {op!r}"
        )
    return _REDUCE[op]


def _op_name(op: Any) -> str:
    return getattr(op, "__name__", str(op))


def _reduced(reduce: Any, parts: list[np.ndarray], dst: NkiTensor) -> np.ndarray:
    """``reduce`` over ``parts`` in order, in float32 (int64 for integer destinations)."""
    wide = np.int64 if dst.dtype.kind in "iu" else np.float32
    total = np.asarray(parts[0]).astype(wide)
    for part in parts[1:]:
        total = reduce(total, np.asarray(part).astype(wide))
    return total


def _issued(api: str, pairs: Sequence[tuple[NkiTensor, NkiTensor]]) -> Any:
    """Counts the collective (one DMA, its bytes those written) and returns its instruction."""
    run = runtime.active_run(api)
    srcs, dsts = [s for s, _ in pairs], [d for _, d in pairs]
    written = sum(d.size * d.dtype.itemsize for d in dsts)
    run.count_dma(not srcs[0].on_chip, not dsts[0].on_chip, written, api, srcs, dsts)
    return _instruction(api)


def _instruction(handle: Any) -> Any:
    """What a collective returns: the NKI 0.7 ``NkiInstruction`` around ``handle``."""
    return NkiInstruction(handle)


def _values(tensor: NkiTensor) -> np.ndarray:
    """A copy of ``tensor``'s values, in its dtype."""
    return np.array(alu.dma_values(tensor, tensor.dtype))


def _rank(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < 0:
        raise ValueError(f"{where}: ranks are non-negative ints, got {value!r}")
    return int(value)
