"""``nki.isa.constants``: the instruction enums under the module name the API reference uses
(``nki.isa.constants.engine.tensor`` in the ``nc_transpose`` docstring of
general/nki/api/nki/isa/__init__.py at aws-neuron-sdk 0521004c)."""

from asickernels.simulate.nki.isa import (
    dge_mode,
    dma_engine,
    engine,
    matmul_perf_mode,
    nc_version,
    oob_mode,
    reduce_cmd,
)

__all__ = [
    "dge_mode",
    "dma_engine",
    "engine",
    "matmul_perf_mode",
    "nc_version",
    "oob_mode",
    "reduce_cmd",
]
