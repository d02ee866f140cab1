"""``nki.compiler`` (and the legacy ``neuronxcc.nki.compiler``, the same API): compiler
directives and direct allocation (general/nki/api/nki/compiler/ at aws-neuron-sdk 0521004c;
the same functions are in the current reference's nki.compiler page, NKI 0.8).

Directives that only steer optimisation leave a kernel's results unchanged and are
accepted as no-ops. Direct allocation places each logical tile of a tensor at an address of
the core's physical SBUF or PSUM (:mod:`asickernels.simulate.nki.placement`, which checks
the rules): ``nl.ndarray(shape, dtype, buffer=ncc.sbuf.mod_alloc(base_addr=...))``. The
allocation functions compute the placements as the reference's own example functions do
(nki/test/test_sbuf_modulo_alloc.py and test_psum_modulo_alloc.py, ``NKI_EXAMPLE_0``, at
aws-neuron-sdk 81ce03a), which the ``mod_alloc`` pages say they are equivalent to. A tensor
of the current API has no block dimensions, so its one tile is placed where block ``()``
goes: ``buffer=ncc.sbuf.mod_alloc(base_addr=a)`` is ``address=(0, a)``. ``CompileConfig``,
``SpecializationConfig`` and their enums (``nki.jit(compile_config=...)``, NKI 0.7/0.8) come
from :mod:`asickernels.simulate.nki.compile_config`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from asickernels.simulate.nki import errors, runtime
from asickernels.simulate.nki.compile_config import *  # noqa: F403 (CompileConfig and its enums)
from asickernels.simulate.nki.tensor import MemoryRegion


def _directive(func: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
    return func if func is not None else (lambda function: function)


skip_middle_end_transformations = _directive
force_auto_alloc = _directive
enable_stack_allocator = _directive


class Directive:
    """A scheduling directive for ``nl.sequential_range(..., directives=...)``; the simulator
    runs every instruction in program order, which satisfies each of them."""

    def __init__(self, kind: str, **options: Any) -> None:
        self.kind = kind
        self.options = options


def no_reorder() -> Directive:
    """Keeps the loop's operations in program order."""
    return Directive("no_reorder")


def multi_buffer(factor: int = 2) -> Directive:
    """Allocates ``factor`` buffers for the loop's tensors (placement only)."""
    return Directive("multi_buffer", factor=factor)


Placer = Callable[[tuple[int, ...], int, int], Sequence[int]]


class DirectAllocation:
    """What ``sbuf.alloc``/``mod_alloc`` and ``psum.alloc``/``mod_alloc`` return: the
    ``buffer=`` of a tensor whose logical tiles the kernel places. ``place(idx, pdim_size,
    fdim_size)`` gives a block's ``(start_partition, byte_addr)`` in SBUF, or ``(bank_id,
    start_partition, byte_addr)`` in PSUM (``fdim_size``: the tile's bytes per partition)."""

    def __init__(self, region: MemoryRegion, place: Placer, api: str) -> None:
        if not callable(place):
            raise TypeError(f"nki.compiler.{api} takes a callable, got {place!r}")
        self.region = region
        self.place = place
        self.api = api

    def address(self, block: tuple[int, ...], partitions: int, nbytes: int) -> tuple[int, int]:
        """Block ``block``'s ``(partition, byte)`` in the memory (PSUM: bank * 2 KiB)."""
        # by keyword, as the compiler calls it: nki-samples@0898a77 allocated_attention.py
        # passes functools.partial(psum_addr, bank_map=...) of psum_addr(bank_map, idx, ...)
        placed = self.place(idx=block, pdim_size=partitions, fdim_size=nbytes)  # type: ignore[call-arg]
        placed = tuple(int(a) for a in placed)
        if self.region is MemoryRegion.sbuf:
            if len(placed) != 2:
                raise errors.InvalidAddress(
                    f"nki.compiler.{self.api}: the function returned {placed} for block {block}; "
                    "an SBUF placement is (start_partition, byte_addr)"
                )
            return placed[0], placed[1]
        # general/nki/api/nki/compiler/psum.py@0521004c (alloc): "(bank_id, start_partition,
        # byte_addr) ... In current release, start_partition and byte_addr must both be 0."
        if len(placed) != 3 or placed[1:] != (0, 0):
            raise errors.InvalidAddress(
                f"nki.compiler.{self.api}: the function returned {placed} for block {block}; a "
                "PSUM placement is (bank_id, 0, 0): start_partition and byte_addr must be 0"
            )
        bank = placed[0]
        if not 0 <= bank < runtime.PSUM_BANKS:
            raise errors.InvalidAddress(
                f"nki.compiler.{self.api}: bank {bank} for block {block}; PSUM has banks "
                f"0-{runtime.PSUM_BANKS - 1}"
            )
        return 0, bank * runtime.PSUM_BANK_BYTES

    def __repr__(self) -> str:
        return f"nki.compiler.{self.api}"


def _linearize(shape: Sequence[int], indices: Sequence[int]) -> int:
    return sum(i * math.prod(shape[dim + 1 :]) for dim, i in enumerate(indices))


def _modulo(base: int, tiles: Sequence[int], scale: int, indices: tuple[int, ...]) -> int:
    """The reference's ``modulo_allocate_func``: ``base`` plus the block index taken modulo
    ``tiles`` (default all ones), linearised, times ``scale``."""
    shape = tuple(int(t) for t in tiles) or (1,) * len(indices)
    wrapped = tuple(i % s for i, s in zip(indices, shape, strict=False))
    return _linearize(shape, wrapped) * scale + base


class _Buffer:
    """``nki.compiler.sbuf`` / ``psum``: automatic allocation (the compiler places the
    tensor, as ``buffer=nl.sbuf`` does) or direct allocation."""

    def __init__(self, region: MemoryRegion) -> None:
        self.region = region

    def auto_alloc(self) -> MemoryRegion:
        return self.region

    def alloc(self, func: Placer) -> DirectAllocation:
        """Places each logical block where ``func(idx, pdim_size, fdim_size)`` says (see
        :class:`DirectAllocation`)."""
        return DirectAllocation(self.region, func, f"{self.region.value}.alloc")


class _Sbuf(_Buffer):
    def mod_alloc(
        self,
        *,
        base_addr: int,
        base_partition: int = 0,
        num_par_tiles: Sequence[int] = (),
        num_free_tiles: Sequence[int] = (),
    ) -> DirectAllocation:
        """Block ``idx`` at partition ``base_partition + (idx mod num_par_tiles) *
        pdim_size`` and byte ``base_addr + (idx mod num_free_tiles) * fdim_size``
        (linearised over the block dimensions). ``base_partition`` "Must be 0 in the
        current version" (general/nki/api/nki/compiler/sbuf.py@0521004c)."""
        if base_partition != 0:
            raise errors.InvalidAddress(
                f"nki.compiler.sbuf.mod_alloc(base_partition={base_partition}): it must be 0"
            )

        def place(idx: tuple[int, ...], pdim_size: int, fdim_size: int) -> tuple[int, int]:
            return (
                _modulo(base_partition, num_par_tiles, pdim_size, idx),
                _modulo(base_addr, num_free_tiles, fdim_size, idx),
            )

        return DirectAllocation(self.region, place, "sbuf.mod_alloc")


class _Psum(_Buffer):
    def mod_alloc(
        self,
        *,
        base_bank: int,
        base_addr: int = 0,
        base_partition: int = 0,
        num_bank_tiles: Sequence[int] = (),
        num_par_tiles: Sequence[int] = (),
        num_free_tiles: Sequence[int] = (),
    ) -> DirectAllocation:
        """Block ``idx`` in bank ``base_bank + (idx mod num_bank_tiles)`` (linearised over
        the block dimensions). "base_addr ... Must be 0", "base_partition ... Must be 0",
        ``num_par_tiles``/``num_free_tiles`` "Currently must be an empty tuple or (1, 1,
        ...)" (general/nki/api/nki/compiler/psum.py@0521004c)."""
        if base_addr != 0 or base_partition != 0:
            raise errors.InvalidAddress(
                f"nki.compiler.psum.mod_alloc(base_addr={base_addr}, "
                f"base_partition={base_partition}): both must be 0"
            )
        if any(int(n) != 1 for n in (*num_par_tiles, *num_free_tiles)):
            raise errors.InvalidAddress(
                f"nki.compiler.psum.mod_alloc(num_par_tiles={tuple(num_par_tiles)}, "
                f"num_free_tiles={tuple(num_free_tiles)}): each must be () or all ones"
            )

        def place(idx: tuple[int, ...], pdim_size: int, fdim_size: int) -> tuple[int, int, int]:
            return _modulo(base_bank, num_bank_tiles, 1, idx), 0, 0

        return DirectAllocation(self.region, place, "psum.mod_alloc")


sbuf = _Sbuf(MemoryRegion.sbuf)
psum = _Psum(MemoryRegion.psum)
