"""Helpers the current-API (``import nki``) simulator tests share."""

from __future__ import annotations

from asickernels.simulate import nki
from asickernels.simulate.nki import isa as nisa
from asickernels.simulate.nki import language as nl


def run(kernel, *args):
    """``kernel`` (a function) simulated on numpy ``args``."""
    return nki.simulate(kernel)(*args)


def stored(tile):
    """``tile`` copied to a new shared_hbm output (to return it from a kernel)."""
    out = nl.ndarray(tile.shape, dtype=tile.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=tile)
    return out
