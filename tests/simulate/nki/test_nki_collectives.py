"""``nki.collectives``, ``nki.lnc`` and multi-rank launches (``nki.multi_rank_simulate``)
against numpy: every collective on several rank counts, rank-list layouts, sizes and LNC
degrees; and the errors for collectives that disagree or cannot complete, each of which
must come back at once (a hang fails the test after 60 s instead of stalling the run)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asickernels.simulate import nki
from asickernels.simulate.nki import collectives as ncc
from asickernels.simulate.nki import errors, lnc
from asickernels.simulate.nki import isa as nisa
from asickernels.simulate.nki import language as nl
from asickernels.simulate.nki.collectives import ReplicaGroup, rg_partition_op

REDUCE = {nl.add: np.add, nl.minimum: np.minimum, nl.maximum: np.maximum}


@pytest.fixture(autouse=True)
def trn2(monkeypatch):
    """sendrecv and core_barrier need NeuronCore-v3 (trn2)."""
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)


def ranks_run(kernel, inputs: list[tuple[Any, ...]], **kwargs) -> list[Any]:
    """``kernel`` on ``len(inputs)`` ranks, rank r called with ``*inputs[r]`` and ``kwargs``."""
    return nki.multi_rank_simulate(
        kernel, world_size=len(inputs), per_rank_inputs=[(args, kwargs) for args in inputs]
    )


def finishes(call: Callable[[], Any], seconds: float = 60) -> BaseException | None:
    """Runs ``call`` in a thread; its exception (None if it returned). A call still running
    after ``seconds`` fails the test (a hang), instead of stalling the suite."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"still running after {seconds} s: a hang"
    return outcome[0]


def layouts(world: int) -> list[ReplicaGroup]:
    """Rank-list layouts of equal-size lists over ``world`` ranks."""
    groups = [ReplicaGroup.from_partition_op(world, rg_partition_op.bitwise_and, 0)]
    for size in range(1, world):
        if world % size == 0:
            groups.append(ReplicaGroup.from_partition_op(world, rg_partition_op.div, size))
            groups.append(ReplicaGroup.from_partition_op(world, rg_partition_op.mod, world // size))
    return groups


@st.composite
def worlds(draw, max_ranks: int = 6) -> tuple[int, ReplicaGroup, int]:
    """(world size, replica group, LNC degree)."""
    world = draw(st.integers(1, max_ranks))
    return world, draw(st.sampled_from(layouts(world))), draw(st.sampled_from([1, 2]))


def hbm_collective(collective, out_shape, **params):
    """A kernel: the rank's ``x`` copied to a private HBM tensor, ``collective`` from it
    into a new shared HBM tensor of ``out_shape``, returned."""

    @nki.jit
    def kernel(x, replica_group):
        src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.private_hbm)
        dst = nl.ndarray(out_shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=src, src=x)
        collective(srcs=[src], dsts=[dst], replica_group=replica_group, **params)
        return dst

    return kernel


def sbuf_collective(collective, out_shape, **params):
    """As :func:`hbm_collective`, on SBUF tiles; at LNC=2 each core adds its program id to
    its tile first, so the cores exchange different data."""

    @nki.jit
    def kernel(x, replica_group):
        src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=src, src=x)
        nisa.tensor_scalar(dst=src, data=src, op0=nl.add, operand0=float(nl.program_id()))
        dst = nl.ndarray(out_shape, dtype=x.dtype, buffer=nl.sbuf)
        collective(srcs=[src], dsts=[dst], replica_group=replica_group, **params)
        out = nl.ndarray((nl.num_programs(), *out_shape), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[nl.program_id()], src=dst)
        return out

    return kernel


def reduce_in_order(op, arrays):
    total = arrays[0].astype(np.float32)
    for a in arrays[1:]:
        total = REDUCE[op](total, a.astype(np.float32))
    return total


# -- ReplicaGroup ------------------------------------------------------------------------
def test_replica_group_from_partition_op_matches_the_reference_examples():
    """The three examples of the NKI 0.7 ReplicaGroup page (8 ranks)."""
    assert ReplicaGroup.from_partition_op(8, rg_partition_op.bitwise_and, 0) == ReplicaGroup(
        [list(range(8))]
    )
    assert ReplicaGroup.from_partition_op(8, rg_partition_op.div, 4) == ReplicaGroup(
        [[0, 1, 2, 3], [4, 5, 6, 7]]
    )
    strided = ReplicaGroup.from_partition_op(8, rg_partition_op.mod, 4)
    assert repr(strided) == "ReplicaGroup([[0, 4], [1, 5], [2, 6], [3, 7]])"


def test_replica_group_refuses_bad_rank_lists():
    with pytest.raises(ValueError, match="only one rank-list"):
        ReplicaGroup([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="at least one rank"):
        ReplicaGroup([[0], []])
    with pytest.raises(ValueError, match="non-negative"):
        ReplicaGroup([[0, -1]])
    with pytest.raises(TypeError):
        ReplicaGroup.from_partition_op(4, "div", 2)


# -- the collectives against numpy --------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(
    worlds(),
    st.sampled_from([nl.add, nl.minimum, nl.maximum]),
    st.sampled_from([np.float32, ml_dtypes.bfloat16, np.int32]),
    st.tuples(st.integers(1, 9), st.integers(1, 7)),
    st.integers(0, 2**31 - 1),
)
def test_all_reduce_hbm(world_group_lnc, op, dtype, shape, seed):
    world, group, lnc_degree = world_group_lnc
    rng = np.random.default_rng(seed)
    xs = [(rng.normal(size=shape) * 8).astype(dtype) for _ in range(world)]
    kernel = hbm_collective(ncc.all_reduce, shape, op=op)[lnc_degree]
    outs = ranks_run(kernel, [(x, group) for x in xs])
    for rank in range(world):
        ranks = group.rank_list(rank)
        expected = reduce_in_order(op, [xs[r] for r in ranks]).astype(dtype)
        np.testing.assert_array_equal(outs[rank], expected)


@settings(max_examples=20, deadline=None)
@given(worlds(max_ranks=4), st.integers(1, 32), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_all_gather_hbm_and_sbuf(world_group_lnc, rows, cols, seed):
    world, group, lnc_degree = world_group_lnc
    size = len(group.rank_list(0))
    rng = np.random.default_rng(seed)
    xs = [rng.normal(size=(rows, cols)).astype(np.float32) for _ in range(world)]
    for kernel, dim, per_core in (
        (hbm_collective(ncc.all_gather, (rows * size, cols), collective_dim=0), 0, False),
        (sbuf_collective(ncc.all_gather, (rows * size, cols), collective_dim=0), 0, True),
        (sbuf_collective(ncc.all_gather, (rows, cols * size), collective_dim=1), 1, True),
    ):
        outs = ranks_run(kernel[lnc_degree], [(x, group) for x in xs])
        for rank in range(world):
            for core in range(lnc_degree if per_core else 1):
                parts = [xs[r] + core for r in group.rank_list(rank)]
                got = outs[rank][core] if per_core else outs[rank]
                np.testing.assert_array_equal(got, np.concatenate(parts, axis=dim))


@settings(max_examples=20, deadline=None)
@given(
    worlds(max_ranks=4),
    st.sampled_from([nl.add, nl.maximum]),
    st.integers(1, 16),
    st.integers(1, 5),
    st.integers(0, 2**31 - 1),
)
def test_reduce_scatter_hbm_and_sbuf(world_group_lnc, op, chunk, cols, seed):
    world, group, lnc_degree = world_group_lnc
    size = len(group.rank_list(0))
    rng = np.random.default_rng(seed)
    xs = [rng.normal(size=(chunk * size, cols)).astype(np.float32) for _ in range(world)]
    for kernel, per_core in (
        (hbm_collective(ncc.reduce_scatter, (chunk, cols), collective_dim=0, op=op), False),
        (sbuf_collective(ncc.reduce_scatter, (chunk, cols), collective_dim=0, op=op), True),
    ):
        outs = ranks_run(kernel[lnc_degree], [(x, group) for x in xs])
        for rank in range(world):
            ranks = group.rank_list(rank)
            k = ranks.index(rank)
            for core in range(lnc_degree if per_core else 1):
                total = reduce_in_order(op, [xs[r] + core for r in ranks])
                got = outs[rank][core] if per_core else outs[rank]
                np.testing.assert_array_equal(got, total[k * chunk : (k + 1) * chunk])


@settings(max_examples=20, deadline=None)
@given(worlds(), st.integers(1, 4), st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_all_to_all(world_group_lnc, chunk, cols, seed):
    world, group, lnc_degree = world_group_lnc
    size = len(group.rank_list(0))
    rng = np.random.default_rng(seed)
    xs = [rng.normal(size=(chunk * size, cols)).astype(np.float32) for _ in range(world)]
    kernel = hbm_collective(ncc.all_to_all, (chunk * size, cols), collective_dim=0)[lnc_degree]
    outs = ranks_run(kernel, [(x, group) for x in xs])
    for rank in range(world):
        ranks = group.rank_list(rank)
        k = ranks.index(rank)
        expected = np.concatenate([xs[r][k * chunk : (k + 1) * chunk] for r in ranks])
        np.testing.assert_array_equal(outs[rank], expected)


def test_coalesced_all_reduce_and_its_limits():
    """Several tensors in one collective, in HBM only; all in HBM or all in SBUF."""

    @nki.jit
    def coalesced(a, b, replica_group):
        dsts = [nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm) for t in (a, b)]
        ncc.all_reduce(srcs=[a, b], dsts=dsts, replica_group=replica_group, op=nl.add)
        return tuple(dsts)

    group = ReplicaGroup([[0, 1, 2]])
    a = [np.full((2, 3), r, np.float32) for r in range(3)]
    b = [np.full((4,), 10 * r, np.int32) for r in range(3)]
    outs = ranks_run(coalesced, [(a[r], b[r], group) for r in range(3)])
    for sum_a, sum_b in outs:
        np.testing.assert_array_equal(sum_a, np.full((2, 3), 3.0))
        np.testing.assert_array_equal(sum_b, np.full((4,), 30))

    @nki.jit
    def mixed(x, replica_group):
        tile = nl.load(x)
        dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        ncc.all_reduce(srcs=[tile], dsts=[dst], replica_group=replica_group, op=nl.add)

    with pytest.raises(errors.UnsupportedMemory, match="all be in HBM or all in SBUF"):
        ranks_run(mixed, [(np.ones((2, 2), np.float32), ReplicaGroup([[0]]))])

    @nki.jit
    def sbuf_pair(x, replica_group):
        tiles = [nl.load(x), nl.load(x)]
        ncc.all_reduce(srcs=tiles, dsts=tiles, replica_group=replica_group, op=nl.add)

    with pytest.raises(errors.UnsupportedMemory, match="coalesced"):
        ranks_run(sbuf_pair, [(np.ones((2, 2), np.float32), ReplicaGroup([[0]]))])


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 6), st.data())
def test_collective_permute_follows_its_pairs(world, data):
    """Each target gets its source's tensor; a rank no pair names keeps its dst."""
    members = data.draw(st.permutations(range(world)))[: data.draw(st.integers(1, world))]
    targets = data.draw(st.permutations(members))
    pairs = list(zip(members, targets, strict=True))

    @nki.jit
    def kernel(x):
        dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.private_hbm)
        nisa.dma_copy(dst=src, src=x)
        nisa.dma_copy(dst=dst, src=x)
        ncc.collective_permute(srcs=[src], dsts=[dst], source_target_pairs=pairs)
        return dst

    xs = [np.full((3, 2), r, np.float32) for r in range(world)]
    outs = ranks_run(kernel, [(x,) for x in xs])
    received = {t: s for s, t in pairs}
    for rank in range(world):
        np.testing.assert_array_equal(outs[rank], xs[received.get(rank, rank)])


def test_collective_permute_refuses_two_senders_to_one_target():
    @nki.jit
    def kernel(x):
        ncc.collective_permute(srcs=[x], dsts=[x], source_target_pairs=[(0, 1), (2, 1)])

    with pytest.raises(errors.UnsupportedOperator, match="target of two pairs"):
        ranks_run(kernel, [(np.ones((1, 1), np.float32),)] * 3)


@pytest.mark.parametrize("lnc_degree", [1, 2])
@pytest.mark.parametrize("channels", [1, 2, 4])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_ring_all_gather_with_collective_permute_implicit(world, channels, lnc_degree):
    """A ring all-gather as fg_allgather (nki-library) builds it: after step i, channel c of
    every rank holds the chunk of rank collective_permute_implicit_current_processing_rank_id(i),
    which the rank stores at that rank's place."""
    group = ReplicaGroup([list(range(world))])

    @nki.jit
    def ring(x, replica_group):
        rows, cols = x.shape
        out = nl.ndarray((world, rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
        bufs = [[nl.ndarray((rows, cols // channels), dtype=x.dtype) for _ in range(channels)]
                for _ in range(2)]  # fmt: skip
        for c in range(channels):
            nisa.dma_copy(
                dst=bufs[0][c], src=x[:, c * cols // channels : (c + 1) * cols // channels]
            )
        for step in range(world):
            held = bufs[step % 2]
            for c in range(channels):
                rank = ncc.collective_permute_implicit_current_processing_rank_id(
                    iteration_id=step, replica_group=replica_group, channel_id=c
                )
                width = cols // channels
                nisa.dma_copy(
                    dst=out.ap([[cols, rows], [1, width]], offset=c * width, scalar_offset=rank,
                               indirect_dim=0),
                    src=held[c],
                )  # fmt: skip
            if step < world - 1:
                ncc.collective_permute_implicit(
                    srcs_by_channel=[[t] for t in held],
                    dsts_by_channel=[[t] for t in bufs[(step + 1) % 2]],
                    replica_group=replica_group,
                    channel_ids=list(range(channels)),
                )
        return out

    xs = [np.random.default_rng(r).normal(size=(4, 8)).astype(np.float32) for r in range(world)]
    for out in ranks_run(ring[lnc_degree], [(x, group) for x in xs]):
        np.testing.assert_array_equal(out, np.stack(xs))


@pytest.mark.parametrize("op", [nl.add, nl.minimum, nl.maximum])
def test_collective_permute_implicit_reduce_sends_the_reduced_pair(op):
    world = 3
    group = ReplicaGroup([[2, 0, 1]])  # ring order 2 -> 0 -> 1 -> 2

    @nki.jit
    def kernel(a, b, replica_group):
        t0, t1, dst = nl.load(a), nl.load(b), nl.ndarray(a.shape, dtype=a.dtype)
        ncc.collective_permute_implicit_reduce(
            srcs0_by_channel=[[t0]],
            srcs1_by_channel=[[t1]],
            dsts_by_channel=[[dst]],
            replica_group=replica_group,
            op=op,
        )
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=dst)
        return out

    rng = np.random.default_rng(0)
    a = [rng.normal(size=(8, 4)).astype(np.float32) for _ in range(world)]
    b = [rng.normal(size=(8, 4)).astype(np.float32) for _ in range(world)]
    outs = ranks_run(kernel, [(a[r], b[r], group) for r in range(world)])
    predecessor = {0: 2, 1: 0, 2: 1}
    for rank in range(world):
        p = predecessor[rank]
        np.testing.assert_array_equal(outs[rank], REDUCE[op](a[p], b[p]))


def test_channel_ids_must_count_from_zero():
    @nki.jit
    def kernel(x, replica_group):
        ncc.collective_permute_implicit(
            srcs_by_channel=[[x]], dsts_by_channel=[[x]], replica_group=replica_group,
            channel_ids=[1],
        )  # fmt: skip

    with pytest.raises(errors.UnsupportedOperator, match="consecutive from 0"):
        ranks_run(kernel, [(np.ones((2, 2), np.float32), ReplicaGroup([[0]]))])


# -- variable-length collectives ----------------------------------------------------------
def a2av_kernel(capacity: int, has_rdispls: bool, recv_counts_known: bool, split: bool):
    """An all_to_all_v of flat float32 buffers of ``capacity`` elements; returns ``dst`` and
    the metadata after the call. With ``split``, as all_to_all_v_prepare + _trigger."""

    @nki.jit
    def kernel(x, metadata, replica_group):
        src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        dst = nl.ndarray((capacity,), dtype=x.dtype, buffer=nl.shared_hbm)
        meta = nl.ndarray(metadata.shape, dtype=metadata.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=meta, src=metadata)
        zeros = nl.zeros((1, capacity), dtype=x.dtype)
        nisa.dma_copy(dst=dst, src=zeros)
        args = dict(srcs=[src], dsts=[dst], replica_group=replica_group, metadata_tensor=meta,
                    recv_counts_known=recv_counts_known, has_rdispls=has_rdispls)  # fmt: skip
        if split:
            prepared = ncc.all_to_all_v_prepare(**args)
            nisa.dma_copy(dst=src, src=x)  # the data may arrive after the prepare
            ncc.all_to_all_v_trigger(prepared)
        else:
            nisa.dma_copy(dst=src, src=x)
            ncc.all_to_all_v(**args)
        return dst, meta

    return kernel


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.booleans(), st.booleans(), st.booleans(), st.data())
def test_all_to_all_v(world, has_rdispls, recv_counts_known, split, data):
    slot = 5
    capacity = slot * world
    row = st.lists(st.integers(0, slot), min_size=world, max_size=world)
    counts = np.array(data.draw(st.lists(row, min_size=world, max_size=world)))
    # counts[s, r]: the elements rank s sends to rank r
    group = ReplicaGroup([list(range(world))])
    xs, metas = [], []
    for s in range(world):
        x = np.random.default_rng(s).normal(size=(20,)).astype(np.float32)
        starts = [data.draw(st.integers(0, 20 - c)) for c in counts[s]]
        rows = [counts[s], starts, np.zeros(world)]
        if has_rdispls:  # receive in reverse slot order
            rows.append([(world - 1 - r) * slot for r in range(world)])
        xs.append(x)
        metas.append(np.array(rows, np.uint32))
    kernel = a2av_kernel(capacity, has_rdispls, recv_counts_known, split)
    outs = ranks_run(kernel, [(xs[r], metas[r], group) for r in range(world)])
    for r, (dst, meta) in enumerate(outs):
        expected = np.zeros(capacity, np.float32)
        for s in range(world):
            start = int(metas[s][1][r])
            at = (world - 1 - s) * slot if has_rdispls else s * slot
            expected[at : at + counts[s, r]] = xs[s][start : start + counts[s, r]]
        np.testing.assert_array_equal(dst, expected)
        row2 = np.zeros(world) if recv_counts_known else counts[:, r]
        np.testing.assert_array_equal(meta[2], row2)
        np.testing.assert_array_equal(meta[:2], metas[r][:2])


@pytest.mark.parametrize("metadata_in", ["hbm", "sbuf"])
@pytest.mark.parametrize("split", [False, True])
def test_all_gather_v_on_four_ranks_at_lnc2(metadata_in, split):
    """Each rank broadcasts src[displ : displ + count] (rows 0/1, first column); the chunk
    from rank s lands in slot s; row 2 gets the counts received."""
    world, slot = 4, 6
    counts, displs = [3, 0, 6, 1], [2, 0, 1, 5]
    group = ReplicaGroup([[0, 1, 2, 3]])

    @nki.jit
    def kernel(x, metadata, replica_group):
        src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=src, src=x)
        dst = nl.ndarray((world * slot,), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=dst, src=nl.zeros((1, world * slot), dtype=x.dtype))
        if metadata_in == "hbm":
            meta = nl.ndarray(metadata.shape, dtype=metadata.dtype, buffer=nl.shared_hbm)
        else:
            meta = nl.ndarray((1, *metadata.shape), dtype=metadata.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=meta, src=metadata)
        args = dict(srcs=[src], dsts=[dst], replica_group=replica_group, metadata_tensor=meta)
        if split:
            ncc.all_gather_v_trigger(ncc.all_gather_v_prepare(**args))
        else:
            ncc.all_gather_v(**args)
        counts_out = nl.ndarray((1, world), dtype=metadata.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=counts_out, src=meta[2:3] if metadata_in == "hbm" else meta[0, 2:3])
        return dst, counts_out

    xs = [np.arange(8, dtype=np.float32) + 100 * r for r in range(world)]
    metas = [
        np.array([[counts[r]] * world, [displs[r]] * world, [0] * world], np.uint32)
        for r in range(world)
    ]
    outs = ranks_run(kernel[2], [(xs[r], metas[r], group) for r in range(world)])
    expected = np.zeros(world * slot, np.float32)
    for s in range(world):
        expected[s * slot : s * slot + counts[s]] = xs[s][displs[s] : displs[s] + counts[s]]
    for dst, received in outs:
        np.testing.assert_array_equal(dst, expected)
        np.testing.assert_array_equal(received[0], counts)


def test_all_gather_v_limitations():
    """NKI 0.6's all_gather_v limitations: LNC=2, rank-lists of 4 ranks, no has_rdispls."""

    def kernel_with(**options):
        @nki.jit
        def kernel(x, metadata, replica_group):
            ncc.all_gather_v(srcs=[x], dsts=[x], replica_group=replica_group,
                             metadata_tensor=metadata, **options)  # fmt: skip

        return kernel

    x, meta = np.ones((8,), np.float32), np.zeros((3, 2), np.uint32)
    with pytest.raises(errors.UnsupportedOperator, match="LNC=2"):
        ranks_run(kernel_with(), [(x, meta, ReplicaGroup([[0, 1]]))] * 2)
    with pytest.raises(errors.UnsupportedOperator, match="exactly 4 ranks"):
        ranks_run(kernel_with()[2], [(x, meta, ReplicaGroup([[0, 1]]))] * 2)
    with pytest.raises(errors.UnsupportedOperator, match="has_rdispls"):
        ranks_run(kernel_with(has_rdispls=True)[2], [(x, meta, ReplicaGroup([[0, 1]]))] * 2)


def test_v_collectives_check_metadata_and_sizes():
    group = ReplicaGroup([[0, 1]])

    @nki.jit
    def kernel(x, metadata, replica_group):
        src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=src, src=x)
        dst = nl.ndarray((4,), dtype=x.dtype, buffer=nl.shared_hbm)
        meta = nl.ndarray(metadata.shape, dtype=metadata.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=meta, src=metadata)
        ncc.all_to_all_v(srcs=[src], dsts=[dst], replica_group=replica_group, metadata_tensor=meta)

    x = np.ones((8,), np.float32)
    ok = np.array([[1, 1], [0, 0], [0, 0]], np.uint32)
    with pytest.raises(errors.UnsupportedDtype, match="uint32"):
        ranks_run(kernel, [(x, ok.astype(np.int32), group)] * 2)
    with pytest.raises(errors.ShapeMismatch, match="n=2 ranks"):
        ranks_run(kernel, [(x, np.zeros((3, 3), np.uint32), group)] * 2)
    too_many = np.array([[3, 3], [0, 0], [0, 0]], np.uint32)  # 3 > a slot of 4 // 2
    with pytest.raises(errors.TensorAccessOutOfBound, match="slot 2"):
        ranks_run(kernel, [(x, too_many, group)] * 2)
    past_src = np.array([[1, 1], [8, 0], [0, 0]], np.uint32)
    with pytest.raises(errors.TensorAccessOutOfBound, match="sends elements"):
        ranks_run(kernel, [(x, past_src, group)] * 2)


def test_prepare_and_trigger_pair_up_one_at_a_time():
    group = ReplicaGroup([[0]])

    def prepare(meta, src, dst):
        return ncc.all_to_all_v_prepare(
            srcs=[src], dsts=[dst], replica_group=group, metadata_tensor=meta
        )

    def kernel_doing(steps):
        @nki.jit
        def kernel(x, metadata):
            meta = nl.ndarray(metadata.shape, dtype=metadata.dtype, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=meta, src=metadata)
            src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=src, src=x)
            steps(meta, src)

        return kernel

    x, meta = np.ones((4,), np.float32), np.array([[2], [0], [0]], np.uint32)
    with pytest.raises(errors.NkiValidationError, match="no other prepare between"):
        nki.simulate(kernel_doing(lambda m, s: [prepare(m, s, s), prepare(m, s, s)]))(x, meta)
    with pytest.raises(errors.NkiValidationError, match="no all_to_all_v_trigger ran"):
        nki.simulate(kernel_doing(lambda m, s: prepare(m, s, s)))(x, meta)
    with pytest.raises(errors.NkiValidationError, match="given the instruction of a"):
        nki.simulate(kernel_doing(lambda m, s: ncc.all_gather_v_trigger(prepare(m, s, s))))(x, meta)
    with pytest.raises(errors.NkiValidationError, match="pending: none"):
        nki.simulate(kernel_doing(lambda m, s: ncc.all_to_all_v_trigger(object())))(x, meta)


# -- rank ids and launches ----------------------------------------------------------------
@pytest.mark.parametrize("lnc_degree", [1, 2])
def test_rank_id_selects_each_ranks_slice(lnc_degree):
    """nki-library's rank_id_kernel pattern (test_collectives.py@d2ad3a5): rank_id as the
    scalar_offset of a DMA picks the rank's slice."""

    @nki.jit
    def kernel(table):
        _, rows, cols = table.shape
        out = nl.ndarray((rows, cols), dtype=table.dtype, buffer=nl.shared_hbm)
        picked = table.ap(pattern=[[cols, rows], [1, cols]], scalar_offset=ncc.rank_id(),
                          indirect_dim=0)  # fmt: skip
        nisa.dma_copy(dst=out, src=picked)
        return out

    table = np.random.default_rng(1).normal(size=(3, 4, 5)).astype(np.float32)
    outs = nki.multi_rank_simulate(
        kernel[lnc_degree], world_size=3, per_rank_inputs={r: ((table,), {}) for r in range(3)}
    )
    for rank, out in enumerate(outs):
        np.testing.assert_array_equal(out, table[rank])


def test_multi_rank_simulate_checks_its_inputs():
    @nki.jit
    def kernel(x, scale):
        return x

    x = np.ones((2, 2), np.float32)
    with pytest.raises(ValueError, match="2 entries for world_size=3"):
        nki.multi_rank_simulate(kernel, world_size=3, per_rank_inputs=[((x, 1), {})] * 2)
    with pytest.raises(ValueError, match="one per rank"):
        nki.multi_rank_simulate(
            kernel, world_size=2, per_rank_inputs={0: ((x, 1), {}), 2: ((x, 1), {})}
        )
    with pytest.raises(ValueError, match="one shape and dtype"):
        nki.multi_rank_simulate(
            kernel, world_size=2, per_rank_inputs=[((x, 1), {}), ((np.ones((2, 3)), 1), {})]
        )
    with pytest.raises(ValueError, match="static and must be equal"):
        nki.multi_rank_simulate(kernel, world_size=2, per_rank_inputs=[((x, 1), {}), ((x, 2), {})])
    with pytest.raises(ValueError, match="one kernel specialization"):
        nki.multi_rank_simulate(
            kernel, world_size=2, per_rank_inputs=[((x, 1), {}), ((x,), {"scale": 1})]
        )
    with pytest.raises(ValueError, match="positive int"):
        nki.multi_rank_simulate(kernel, world_size=0, per_rank_inputs=[])
    with pytest.raises(NotImplementedError, match="multi_rank_execute"):
        nki.multi_rank_execute(kernel, world_size=1, per_rank_inputs=[((x, 1), {})])


def test_ranks_have_their_own_hbm():
    """An array given to two ranks is copied for each: one rank's write is not the other's."""

    @nki.jit
    def kernel(x):
        tile = nl.load(x)
        nisa.tensor_scalar(dst=tile, data=tile, op0=nl.add, operand0=1.0)
        nl.store(x, tile)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x)
        return out

    shared = np.zeros((2, 2), np.float32)
    outs = ranks_run(kernel, [(shared,), (shared,)])
    for out in outs:
        np.testing.assert_array_equal(out, 1.0)
    np.testing.assert_array_equal(shared, 0.0)


def test_a_collective_naming_ranks_outside_the_launch_says_how_to_run_it():
    kernel = hbm_collective(ncc.all_reduce, (2, 2), op=nl.add)
    error = finishes(lambda: kernel(np.ones((2, 2), np.float32), ReplicaGroup([[0, 1]])))
    assert isinstance(error, errors.UnsupportedOperator)
    assert "multi_rank_simulate" in str(error) and "[1]" in str(error)


def test_lnc_degree_from_the_environment(monkeypatch):
    """An unbracketed kernel runs at NEURON_LOGICAL_NC_CONFIG (1 or 2), else LNC=1."""

    @nki.jit
    def programs(x):
        out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=nl.full((1, 1), nl.num_programs(), nl.int32))
        return out

    x = np.zeros((1, 1), np.float32)
    assert programs(x)[0, 0] == 1
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    assert programs(x)[0, 0] == 2
    assert programs[1](x)[0, 0] == 1  # the bracket wins
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "4")
    with pytest.raises(ValueError, match="1 or 2"):
        programs(x)


def test_lnc2_is_refused_on_trn1(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")

    @nki.jit
    def kernel(x):
        return x

    with pytest.raises(errors.UnsupportedOperator, match="NCC_EARG001"):
        kernel[2](np.zeros((1, 1), np.float32))


# -- nki.lnc --------------------------------------------------------------------------------
@pytest.mark.parametrize("op", [nl.add, nl.minimum, nl.maximum])
@pytest.mark.parametrize("memory", ["sbuf", "private_hbm"])
def test_sendrecv_compute_reduces_the_two_cores_tiles(op, memory):
    @nki.jit
    def kernel(x):
        core = nl.program_id()
        buffer = nl.sbuf if memory == "sbuf" else nl.private_hbm
        src = nl.ndarray(x.shape[1:], dtype=x.dtype, buffer=buffer)
        dst = nl.ndarray(x.shape[1:], dtype=x.dtype, buffer=buffer)
        nisa.dma_copy(dst=src, src=x[core])
        lnc.sendrecv_compute(src=src, dst=dst, send_to_rank=1 - core, recv_from_rank=1 - core,
                             reduce_op=op)  # fmt: skip
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[core], src=dst)
        return out

    x = np.random.default_rng(2).normal(size=(2, 16, 8)).astype(np.float32)
    out = kernel[2](x)
    np.testing.assert_array_equal(out[0], REDUCE[op](x[0], x[1]))
    np.testing.assert_array_equal(out[1], REDUCE[op](x[1], x[0]))


def test_the_deprecated_isa_entry_points_warn_and_run():
    """NKI 0.8 keeps nki.isa.sendrecv/sendrecv_compute/core_barrier as deprecated wrappers
    of nki.lnc (announce-intent-eos-nki-virtualregister-lnc-apis); pipe_id is ignored."""

    @nki.jit
    def kernel(x):
        core = nl.program_id()
        mine = nl.load(x[core])
        got = nl.ndarray(mine.shape, dtype=mine.dtype)
        summed = nl.ndarray(mine.shape, dtype=mine.dtype)
        nisa.sendrecv(src=mine, dst=got, send_to_rank=1 - core, recv_from_rank=1 - core,
                      pipe_id=7 * core)  # fmt: skip
        nisa.sendrecv_compute(src=mine, dst=summed, send_to_rank=1 - core,
                              recv_from_rank=1 - core, reduce_op=nl.add)  # fmt: skip
        out = nl.ndarray((2, *x.shape), dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out[0, core], got)
        nl.store(out[1, core], summed)
        nisa.core_barrier(out, (0, 1))
        return out

    x = np.arange(2 * 4 * 3, dtype=np.float32).reshape(2, 4, 3)
    with pytest.warns(
        errors.DeprecatedApiWarning, match=r"NKI 0\.8.*use nki\.lnc\.(sendrecv|core_barrier)"
    ):
        out = kernel[2](x)
    np.testing.assert_array_equal(out[0], x[::-1])
    np.testing.assert_array_equal(out[1], x[::-1] + x)


def test_lnc_rules():
    tile_kernel = nki.jit(lambda x, call: call(nl.load(x)))
    x = np.zeros((4, 4), np.float32)

    def sendrecv(**kwargs):
        return lambda t: lnc.sendrecv(src=t, dst=t, send_to_rank=1 - nl.program_id(),
                                      recv_from_rank=1 - nl.program_id(), **kwargs)  # fmt: skip

    with pytest.raises(errors.UnsupportedOperator, match="LNC=2"):
        tile_kernel(x, sendrecv())
    with pytest.raises(errors.UnsupportedOperator, match="NeuronCore-v4"):
        tile_kernel[2](x, sendrecv(priority=1))
    with pytest.raises(errors.UnsupportedOperator, match="takes no priority"):
        tile_kernel[2](x, sendrecv(dma_engine=nisa.dma_engine.gpsimd_dma, priority=0))
    with pytest.raises(errors.UnsupportedOperator, match="cores="):
        tile_kernel[2](x, lambda t: lnc.core_barrier(t, (0, 2)))
    with pytest.raises(errors.UnsupportedOperator, match=r"nl\.add, nl\.maximum or nl\.minimum"):
        tile_kernel[2](x, lambda t: lnc.sendrecv_compute(t, t, 0, 0, nl.multiply))
    # LNC=1: the paired core runs another Logical NeuronCore; (0,) or 0: this core alone
    for cores in ((0, 1), [0, 1], (0,), 0):
        tile_kernel(x, lambda t, cores=cores: lnc.core_barrier(t, cores))


def test_sendrecv_priority_on_trn3(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")

    @nki.jit
    def swap(x):
        core = nl.program_id()
        mine = nl.load(x[core])
        got = nl.ndarray(mine.shape, dtype=mine.dtype)
        lnc.sendrecv(src=mine, dst=got, send_to_rank=1 - core, recv_from_rank=1 - core, priority=3)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out[core], got)
        return out

    x = np.arange(8, dtype=np.float32).reshape(2, 2, 2)
    np.testing.assert_array_equal(swap[2](x), x[::-1])


# -- calls that disagree or cannot complete: clear errors, never hangs ----------------------
def mismatch(kernel, inputs) -> BaseException:
    error = finishes(lambda: ranks_run(kernel, inputs))
    assert error is not None, "expected an error"
    return error


def assert_mismatch_naming(error: BaseException | None, named: tuple[str, ...]) -> None:
    """``error`` is a :class:`CollectiveMismatch` whose message names each of ``named``."""
    assert isinstance(error, errors.CollectiveMismatch)
    for fragment in named:
        assert fragment in str(error)


def test_ranks_calling_different_collectives():
    @nki.jit
    def kernel(x, replica_group):
        src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=src, src=x)
        if int(ncc.rank_id()) == 0:
            ncc.all_reduce(srcs=[src], dsts=[src], replica_group=replica_group, op=nl.add)
        else:
            dst = nl.ndarray((4, 2), dtype=x.dtype, buffer=nl.shared_hbm)
            ncc.all_gather(srcs=[src], dsts=[dst], replica_group=replica_group, collective_dim=0)

    group = ReplicaGroup([[0, 1]])
    error = mismatch(kernel, [(np.ones((2, 2), np.float32), group)] * 2)
    named = ("collective #0 of rank-list [0, 1]", "rank 0: all_reduce", "rank 1: all_gather")
    assert_mismatch_naming(error, named)


@nki.jit
def all_reduce_of_more_rows_on_rank_1(x, replica_group):
    rows = 2 + int(ncc.rank_id())
    src = nl.ndarray((rows, 2), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=src, src=x[:rows])
    ncc.all_reduce(srcs=[src], dsts=[src], replica_group=replica_group, op=nl.add)


@nki.jit
def all_reduce_by_maximum_on_rank_1(x, replica_group):
    op = nl.add if int(ncc.rank_id()) == 0 else nl.maximum
    ncc.all_reduce(srcs=[x], dsts=[x], replica_group=replica_group, op=op)


@pytest.mark.parametrize(
    ("kernel", "named"),
    [
        (
            all_reduce_of_more_rows_on_rank_1,
            ("rank 0: all_reduce([2, 2]", "rank 1: all_reduce([3, 2]"),
        ),
        (all_reduce_by_maximum_on_rank_1, ("op=add", "op=maximum")),
    ],
)
def test_ranks_reducing_differently(kernel, named):
    """The mismatch names each rank's call: the sizes, or the operators, it reduces with."""
    error = mismatch(kernel, [(np.ones((4, 2), np.float32), ReplicaGroup([[0, 1]]))] * 2)
    assert_mismatch_naming(error, named)


def test_a_rank_that_never_arrives():
    @nki.jit
    def kernel(x, replica_group):
        if int(ncc.rank_id()) != 2:
            ncc.all_reduce(srcs=[x], dsts=[x], replica_group=replica_group, op=nl.add)

    error = mismatch(kernel, [(np.ones((2, 2), np.float32), ReplicaGroup([[0, 1, 2]]))] * 3)
    assert isinstance(error, errors.CollectiveDeadlock)
    message = str(error)
    assert "rank 0 waits in collective #0 of rank-list [0, 1, 2], all_reduce(" in message
    assert "rank 2, which finished the kernel without reaching it" in message


def test_collectives_waiting_for_each_other_in_a_cycle():
    """Rank 0 reduces over [0, 1, 2] then over [0, 1]; rank 1 in the other order: each waits
    for the other (rank 2 waits for both)."""
    everyone, pair = ReplicaGroup([[0, 1, 2]]), ReplicaGroup([[0, 1], [2]])

    @nki.jit
    def kernel(x):
        order = [everyone, pair] if int(ncc.rank_id()) != 1 else [pair, everyone]
        for group in order:
            ncc.all_reduce(srcs=[x], dsts=[x], replica_group=group, op=nl.add)

    error = mismatch(kernel, [(np.ones((2, 2), np.float32),)] * 3)
    assert isinstance(error, errors.CollectiveDeadlock)
    message = str(error)
    assert "rank 0 waits in collective #0 of rank-list [0, 1, 2]" in message
    assert "rank 1, which waits in collective #0 of rank-list [0, 1]" in message


def test_cores_waiting_in_a_barrier_and_a_sendrecv():
    @nki.jit
    def kernel(x):
        tile = nl.load(x)
        if nl.program_id() == 0:
            lnc.core_barrier(x, (0, 1))
        lnc.sendrecv(src=tile, dst=tile, send_to_rank=1 - nl.program_id(),
                     recv_from_rank=1 - nl.program_id())  # fmt: skip
        if nl.program_id() == 1:
            lnc.core_barrier(x, (0, 1))

    error = finishes(lambda: kernel[2](np.ones((2, 2), np.float32)))
    assert isinstance(error, errors.CollectiveDeadlock)
    assert "core 0 waits in core_barrier #0" in str(error)
    assert "core 1 waits in sendrecv #0" in str(error)


@nki.jit
def sendrecv_to_core_1_from_both_cores(x):
    tile = nl.load(x)
    lnc.sendrecv(src=tile, dst=tile, send_to_rank=1, recv_from_rank=1)  # core 1: to itself


@nki.jit
def sendrecv_against_sendrecv_compute(x):
    tile, core = nl.load(x), nl.program_id()
    if core == 0:
        lnc.sendrecv(src=tile, dst=tile, send_to_rank=1, recv_from_rank=1)
    else:
        lnc.sendrecv_compute(src=tile, dst=tile, send_to_rank=0, recv_from_rank=0,
                             reduce_op=nl.add)  # fmt: skip


@nki.jit
def sendrecv_of_a_wider_tile_on_core_1(x):
    core = nl.program_id()
    tile = nl.load(x[:, 0 : 1 + core])
    lnc.sendrecv(src=tile, dst=tile, send_to_rank=1 - core, recv_from_rank=1 - core)


@pytest.mark.parametrize(
    ("kernel", "named"),
    [
        (sendrecv_to_core_1_from_both_cores, ("do not pair up", "core 1: sendrecv(")),
        (sendrecv_against_sendrecv_compute, ("core 0: sendrecv(", "core 1: sendrecv_compute(")),
        (sendrecv_of_a_wider_tile_on_core_1, ("another shape",)),
    ],
)
def test_sendrecvs_that_disagree(kernel, named):
    error = finishes(lambda: kernel[2](np.ones((2, 2), np.float32)))
    assert_mismatch_naming(error, named)


def test_a_failing_rank_stops_the_others_with_its_own_error():
    @nki.jit
    def kernel(x, replica_group):
        if int(ncc.rank_id()) == 1:
            nisa.memset(dst=nl.ndarray((129, 4), dtype=nl.float32), value=0.0)  # breaks a rule
        ncc.all_reduce(srcs=[x], dsts=[x], replica_group=replica_group, op=nl.add)

    error = mismatch(kernel, [(np.ones((2, 2), np.float32), ReplicaGroup([[0, 1, 2]]))] * 3)
    assert isinstance(error, errors.NumPartitionExceedArchLimit)


# -- empty index ranges at LNC=2 ------------------------------------------------------------
def test_a_core_given_no_rows_runs_and_an_instruction_on_them_is_refused():
    """nki-library's cross_entropy_forward gives LNC=2 core 0 zero of one row and never
    touches the empty slice (nki-library@d2ad3a5, loss tests, B=T=1)."""

    @nki.jit
    def halves(x, touch_empty):
        rows = x.shape[0]
        core, cores = nl.program_id(), nl.num_programs()
        start = core * (rows // cores)
        count = rows - start if core == cores - 1 else rows // cores
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        mine, theirs = x[nl.ds(start, count)], out[nl.ds(start, count)]
        if count or touch_empty:
            nisa.dma_copy(dst=theirs, src=mine)
        return out

    x = np.array([[1.0, 2.0]], np.float32)
    np.testing.assert_array_equal(halves[2](x, False), x)
    with pytest.raises(errors.TensorAccessOutOfBound, match="empty view"):
        halves[2](x, True)


def test_empty_ranges_past_the_end_are_refused():
    @nki.jit
    def past(x):
        return x[nl.ds(3, 0)]

    with pytest.raises(errors.TensorAccessOutOfBound, match=r"empty range \[3, 3\)"):
        past(np.ones((2, 2), np.float32))
