"""Direct allocation: on-chip tensors a kernel places at addresses of its own.

A placed tensor is a view of its NeuronCore's one physical SBUF or PSUM
(:meth:`asickernels.simulate.nki.runtime.Run.physical`, a ``[128, bytes per partition]``
byte array), not storage of its own: two tensors placed at overlapping addresses see each
other's writes, as on the device, and a kernel whose placements collide computes what the
device would (the SDK's own simulator "allocates each tensor independently without
simulating overlapping memory regions", nki/guides/nki_simulator.rst@81ce03a, "Memory
Model"). Placed tensors count nothing against the capacity that the compiler's own tiles
are checked against: the kernel owns that memory.

An address is ``(partition, byte)``: the tensor's first partition, and its first byte in
each partition it spans (a tile takes the same bytes on every partition). The current API
takes it as ``nl.ndarray(..., address=(partition_offset, free_offset))`` (bytes:
nki/migration/index.rst@81ce03a, "Improved allocation API", places a PSUM tensor at
``bank_id * 2048`` and translates a block allocated at byte ``sca`` to ``sca + i * n_k * 2``
for bfloat16); the legacy one through ``nki.compiler.sbuf``/``psum`` allocation functions
(:mod:`asickernels.simulate.nki.legacy.compiler`). The rules checked here:

* the tensor lies inside the memory: partitions ``partition .. partition + P`` within 128,
  bytes within the partition (SBUF: the target's bytes per partition, less what the legacy
  compiler keeps: "192KiB-16KiB ... 16KiB is allocated for compiler internal usage",
  general/nki/api/nki/compiler/sbuf.py@0521004c, ``alloc``; PSUM: 8 banks of 2 KiB);
* the first partition follows the ISA: 0 for more than 64 partitions, 0 or 64 for 33-64,
  a multiple of 32 for 32 or fewer (the same ``alloc`` reference);
* a PSUM tensor starts at a bank ("The allocation for PSUM tensors must start at the
  beginning of each bank", nki/migration/index.rst@81ce03a) and, before NeuronCore-v4,
  stays within it (the rule for every PSUM tile, :meth:`runtime.Run.allocate`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from asickernels.simulate.nki import errors, runtime

__all__ = ["LEGACY_SBUF_RESERVED", "check", "place", "view"]

# general/nki/api/nki/compiler/sbuf.py@0521004c (``alloc``): "a valid byte_addr can be any
# integer values from 0 (inclusive) to 192KiB-16KiB ... 16KiB is allocated for compiler
# internal usage" (the legacy compiler's direct allocation).
LEGACY_SBUF_RESERVED = 16 * 1024


def check(
    run: runtime.Run,
    in_psum: bool,
    partitions: int,
    nbytes: int,
    address: Any,
    what: str,
    reserved: int = 0,
) -> tuple[int, int]:
    """``address`` as ``(partition, byte)`` for a tile of ``partitions`` x ``nbytes`` bytes
    per partition in SBUF (or PSUM), after the rules of the module docstring;
    ``reserved``: bytes at the top of each SBUF partition the kernel may not place into."""
    try:
        partition, byte = (int(a) for a in address)
    except (TypeError, ValueError):
        raise TypeError(
            f"{what}: address must be (partition_offset, free_offset), got {address!r}"
        ) from None
    memory = "PSUM" if in_psum else "SBUF"
    row = runtime.PSUM_BANKS * runtime.PSUM_BANK_BYTES
    if not in_psum:
        row = run.target.sbuf_bytes_per_partition - reserved
    if partition < 0 or byte < 0 or partition + partitions > runtime.PMAX or byte + nbytes > row:
        raise errors.TensorAccessOutOfBound(
            f"{what} at address ({partition}, {byte}) spans partitions [{partition}, "
            f"{partition + partitions}) and bytes [{byte}, {byte + nbytes}); {memory} has "
            f"{runtime.PMAX} partitions of {row} bytes"
            + (f" a kernel may place into ({reserved} are the compiler's)" if reserved else "")
        )
    step = 128 if partitions > 64 else 64 if partitions > 32 else 32
    if partition % step:
        raise errors.InvalidAddress(
            f"{what} spans {partitions} partitions, so it must start at a partition that is a "
            f"multiple of {step} (the ISA's rule), not {partition}"
        )
    if in_psum:
        bank, within = divmod(byte, runtime.PSUM_BANK_BYTES)
        if within:
            raise errors.InvalidAddress(
                f"{what}: a PSUM tensor starts at a bank (a multiple of "
                f"{runtime.PSUM_BANK_BYTES} bytes), not at byte {byte}"
            )
        if nbytes > runtime.PSUM_BANK_BYTES and run.target.version < 4:
            raise errors.SizeOfDimensionExceedArchLimit(
                f"{what} needs {nbytes} bytes per partition from bank {bank}; a PSUM tile fits "
                f"one bank of {runtime.PSUM_BANK_BYTES} bytes before NeuronCore-v4"
            )
    return partition, byte


def view(
    run: runtime.Run, in_psum: bool, dtype: np.dtype[Any], tile: tuple[int, ...], address: Any
) -> np.ndarray:
    """The ``tile``-shaped (partition axis first) view of ``dtype`` at a checked
    ``address`` of the run's physical SBUF (or PSUM)."""
    partition, byte = address
    nbytes = math.prod(tile[1:]) * dtype.itemsize
    rows = run.physical(in_psum)[partition : partition + tile[0], byte : byte + nbytes]
    return rows.view(dtype).reshape(tile)


def place(
    run: runtime.Run,
    in_psum: bool,
    dtype: np.dtype[Any],
    tile: tuple[int, ...],
    address: Any,
    what: str,
) -> tuple[np.ndarray, runtime.Allocation]:
    """A tensor of ``tile`` shape placed at ``address`` (the current API's
    ``nl.ndarray(..., address=)``): its view of the physical memory and its allocation."""
    if len(tile) < 2:
        raise errors.LeadingDimensionOfTensorMustBePartition(
            f"{what}: an on-chip tile needs a partition axis and at least one free axis"
        )
    nbytes = math.prod(tile[1:]) * dtype.itemsize
    placed = check(run, in_psum, tile[0], nbytes, address, what)
    return view(run, in_psum, dtype, tile, placed), run.place(in_psum, placed, nbytes)
