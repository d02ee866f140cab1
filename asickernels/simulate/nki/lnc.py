"""``nki.lnc``: exchange, reduction and synchronization between the two physical cores of a
Logical NeuronCore (NKI 0.8, nki/api/nki.lnc.rst: ``core_barrier``, ``sendrecv``,
``sendrecv_compute``; the ``nki.isa`` functions of the same names are its deprecated
wrappers).

Each core is a thread of the launch (``kernel[2]``). A ``sendrecv`` or ``sendrecv_compute``
meets its peer's by program order, "the Nth sendrecv on one rank rendezvous with the Nth
sendrecv on the peer rank" (nki.lnc.sendrecv, 0.8); barriers likewise. Calls that disagree
(another peer, shape or dtype, a ``sendrecv`` against a ``sendrecv_compute``) raise
:class:`~asickernels.simulate.nki.errors.CollectiveMismatch`; a core waiting for a peer that
finished or waits elsewhere raises
:class:`~asickernels.simulate.nki.errors.CollectiveDeadlock` (see :mod:`.world`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from asickernels.simulate.nki import alu, errors, isa, language, runtime
from asickernels.simulate.nki.tensor import NkiTensor, dtype_name
from asickernels.simulate.nki.world import Call, World

__all__ = ["core_barrier", "sendrecv", "sendrecv_compute"]

# nki.lnc.sendrecv_compute, 0.8: "Supported operations are nl.add, nl.maximum, and nl.minimum."
_REDUCE_OPS = {language.add: np.add, language.maximum: np.maximum, language.minimum: np.minimum}


def core_barrier(
    data: NkiTensor, cores: Any, engine: isa.engine = isa.engine.gpsimd, name: Any = None
) -> None:
    """Waits until the physical cores ``cores`` of this Logical NeuronCore reach this barrier
    (the n-th barrier of each). ``cores`` is ``(0, 1)`` (also as a list), or ``(0,)`` / ``0``
    for this core alone, as AWS's nki-library passes at LNC=1 (bwmm_shard_on_I.py@d2ad3a5).
    At LNC=1 the paired core runs another Logical NeuronCore (nki.lnc, 0.8): the simulator
    does not run it, so the barrier returns at once. NeuronCore-v3 or newer."""
    api = "core_barrier"
    run = runtime.active_run(api)
    _require_v3(api)
    alu.require(api, "data", data)
    listed = (int(cores),) if isinstance(cores, (int, np.integer)) else tuple(int(c) for c in cores)
    if not listed or any(c not in (0, 1) for c in listed) or len(set(listed)) != len(listed):
        raise errors.UnsupportedOperator(
            f"'{api}' cores={cores!r}: only the cores (0, 1) of one HBM stack can synchronize"
        )
    run.count("gpsimd", api, (data,), ())
    waiting = tuple(c for c in sorted(listed) if c < run.launch.cores)
    if run.program_id not in waiting or len(waiting) < 2:
        return
    world = World.of(run)
    rank = run.launch.rank
    number = run.next_meeting(api)
    world.meet(
        run.core,
        (api, rank, number),
        f"core_barrier #{number}" + (f" of rank {rank}" if world.ranks > 1 else ""),
        [(rank, c) for c in waiting],
        Call(f"core_barrier(cores={listed})", ("core_barrier", waiting)),
    )


def sendrecv(
    src: NkiTensor,
    dst: NkiTensor,
    send_to_rank: int,
    recv_from_rank: int,
    dma_engine: isa.dma_engine = isa.dma_engine.dma,
    name: Any = None,
    priority: int | None = None,
) -> None:
    """Sends the SBUF tile ``src`` to core ``send_to_rank`` of this Logical NeuronCore and
    receives into ``dst`` what core ``recv_from_rank`` sends (LNC=2, NeuronCore-v3+; ranks 0
    or 1; ``src`` and ``dst`` of one shape and dtype; ``gpsimd_dma`` moves at most 1024,
    512, 256 bytes per partition of 32-, 16-, 8-bit data and takes no ``priority``)."""
    api = "sendrecv"
    alu.require(api, "src", src, alu.SBUF)
    alu.require(api, "dst", dst, alu.SBUF)
    if src.dtype != dst.dtype or src.shape != dst.shape:
        raise errors.ShapeMismatch(
            f"'{api}' needs src and dst of one shape and dtype: {src!r}, {dst!r}"
        )
    if dma_engine is isa.dma_engine.gpsimd_dma:
        if alu.per_partition(src) > 256:
            raise errors.SizeOfDimensionExceedArchLimit(
                f"'{api}' gpsimd_dma moves at most 256 elements per partition, got {src!r}"
            )
        if priority is not None:
            raise errors.UnsupportedOperator(f"'{api}' with gpsimd_dma takes no priority")
    received = _exchange(api, src, dst, send_to_rank, recv_from_rank, priority, "")
    alu.write(dst, received, api)


def sendrecv_compute(
    src: NkiTensor,
    dst: NkiTensor,
    send_to_rank: int,
    recv_from_rank: int,
    reduce_op: Any,
    name: Any = None,
    priority: int | None = None,
) -> None:
    """``dst = reduce_op(src, the peer's src)``: sends ``src`` to core ``send_to_rank``,
    receives the tile core ``recv_from_rank`` sends, and reduces the two in the DMA engine
    (float32, as ``dma_compute``). ``reduce_op`` is ``nl.add``, ``nl.maximum`` or
    ``nl.minimum``; ``src`` and ``dst`` one shape, both in SBUF or both in private HBM
    (nki.lnc.sendrecv_compute, 0.8). LNC=2, NeuronCore-v3+."""
    api = "sendrecv_compute"
    if reduce_op not in _REDUCE_OPS:
        raise errors.UnsupportedOperator(
            f"'{api}' reduces with nl.add, nl.maximum or nl.minimum, got {reduce_op!r}"
        )
    alu.require(api, "src", src, (*alu.SBUF, language.private_hbm))
    alu.require(api, "dst", dst, (src.buffer,))
    if src.shape != dst.shape:
        raise errors.ShapeMismatch(f"'{api}' needs src and dst of one shape: {src!r}, {dst!r}")
    op_name = getattr(reduce_op, "__name__", str(reduce_op))
    peer = _exchange(api, src, dst, send_to_rank, recv_from_rank, priority, op_name)
    combined = _REDUCE_OPS[reduce_op](alu.as_f32(src), peer.astype(np.float32))
    alu.write(dst, combined, api)


def _exchange(
    api: str,
    src: NkiTensor,
    dst: NkiTensor,
    send_to_rank: int,
    recv_from_rank: int,
    priority: int | None,
    op_name: str,
) -> np.ndarray:
    """Meets the peer's n-th ``sendrecv``/``sendrecv_compute``: posts ``src``'s values for
    core ``send_to_rank`` and returns what core ``recv_from_rank`` posted for this core."""
    run = runtime.active_run(api)
    _require_v3(api)
    check_priority(api, priority)
    if run.launch.cores != 2:
        raise errors.UnsupportedOperator(
            f"'{api}' exchanges tiles between the two cores of an LNC=2 launch (kernel[2]); "
            f"this launch has {run.launch.cores} core"
        )
    to, source = int(send_to_rank), int(recv_from_rank)
    if to not in (0, 1) or source not in (0, 1):
        raise errors.UnsupportedOperator(
            f"'{api}' send_to_rank={send_to_rank}, recv_from_rank={recv_from_rank}: ranks "
            "within an LNC=2 Logical NeuronCore are 0 or 1"
        )
    world = World.of(run)
    rank, me = run.core
    number = run.next_meeting("sendrecv")
    detail = (
        f"{api}(src={list(src.shape)} {dtype_name(src.dtype)}, dst={list(dst.shape)} "
        f"{dtype_name(dst.dtype)}, send_to_rank={to}, recv_from_rank={source}"
        + (f", reduce_op={op_name}" if op_name else "")
        + ")"
    )
    payload = (
        to,
        source,
        src.shape,
        src.dtype,
        dst.shape,
        dst.dtype,
        np.array(alu.dma_values(src, src.dtype)),
    )
    calls = world.meet(
        run.core,
        ("sendrecv", rank, number),
        f"sendrecv #{number}" + (f" of rank {rank}" if world.ranks > 1 else ""),
        [(rank, 0), (rank, 1)],
        Call(detail, (api, op_name), payload),
    )
    sender = calls[(rank, source)].payload
    if sender[0] != me or calls[(rank, to)].payload[1] != me:
        listed = "; ".join(f"{world.name(core)}: {call.detail}" for core, call in calls.items())
        raise errors.CollectiveMismatch(
            f"the cores of sendrecv #{number} do not pair up (each must receive from the core "
            f"that sends to it): {listed}"
        )
    if sender[2] != dst.shape or (api == "sendrecv" and sender[3] != dst.dtype):
        listed = "; ".join(f"{world.name(core)}: {call.detail}" for core, call in calls.items())
        raise errors.CollectiveMismatch(
            f"sendrecv #{number} sends a tile of another shape or dtype than its receiver's "
            f"dst: {listed}"
        )
    run.count_dma(
        not src.on_chip, not dst.on_chip, src.size * src.dtype.itemsize, api, (src,), (dst,)
    )
    return np.asarray(sender[6])


def check_priority(api: str, priority: int | None) -> None:
    """``priority``: a DMA quality-of-service level 0 (highest) to 3, NeuronCore-v4 or newer
    (nki.collectives and nki.lnc pages, 0.8)."""
    if priority is None:
        return
    if isinstance(priority, bool) or not isinstance(priority, (int, np.integer)):
        raise TypeError(f"'{api}' priority must be an int 0-3 or None, got {priority!r}")
    if not 0 <= int(priority) <= 3:
        raise errors.UnsupportedOperator(f"'{api}' priority={priority}: levels are 0 to 3")
    target = runtime.current_target()
    if target.version < 4:
        raise errors.UnsupportedOperator(
            f"'{api}' priority is a NeuronCore-v4+ feature; the target is "
            f"NeuronCore-v{target.version} ({target.platforms})"
        )


def _require_v3(api: str) -> None:
    target = runtime.current_target()
    if target.version < 3:
        raise errors.UnsupportedOperator(
            f"'{api}' is available on NeuronCore-v3 or newer; the target is "
            f"NeuronCore-v{target.version} ({target.platforms})"
        )
