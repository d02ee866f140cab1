"""``neuronxcc.nki.isa.constants``: the legacy instruction enums under the module name AWS's
tests import (``from neuronxcc.nki.isa.constants import dge_mode``,
nki/test/test_nki_isa_dma_transpose.py at aws-neuron-sdk 81ce03a)."""

from asickernels.simulate.nki.legacy.isa import dge_mode, engine, nc_version, oob_mode, reduce_cmd

__all__ = ["dge_mode", "engine", "nc_version", "oob_mode", "reduce_cmd"]
