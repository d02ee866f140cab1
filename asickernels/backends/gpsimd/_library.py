"""The asickernels GpSimd operator library: its C++ sources, the host build (through the
GpSimd shim's user entry point, on any machine with g++) and the Neuron build (torch-neuronx
on trn1/inf2).

The same ``csrc/*.cpp`` serve both: ``giou.cpp`` and ``nms.cpp`` are the compute sources,
``shape.cpp`` the shape source with the ``NEURON_LIBRARY`` registration. Both ops run in
multicore mode (all 8 GpSimd cores).
"""

from __future__ import annotations

import functools
import glob
import os
from pathlib import Path
from typing import Any

import numpy as np

from asickernels.simulate import gpsimd as shim

_HERE = Path(__file__).parent
COMPUTE_SOURCES = (_HERE / "csrc" / "giou.cpp", _HERE / "csrc" / "nms.cpp")
SHAPE_SOURCES = (_HERE / "csrc" / "shape.cpp",)
# The NEURON_LIBRARY name in shape.cpp: the ops are torch.ops.asickernels_gpsimd.<op>.
LIBRARY_NAME = "asickernels_gpsimd"
# "1" selects the AddressSanitizer + UBSan host build (the process needs LD_PRELOAD, see
# asickernels.simulate.gpsimd.load).
SANITIZE_ENV = "ASICKERNELS_GPSIMD_SANITIZE"

_host: shim.CustomOpLibrary | None = None


def host_library() -> shim.CustomOpLibrary:
    """The host build of the library (built on first use, then cached on disk)."""
    global _host
    _host = _load_host_library(os.environ.get(SANITIZE_ENV) == "1")
    return _host


@functools.cache
def _load_host_library(sanitize: bool) -> shim.CustomOpLibrary:
    return shim.load(
        LIBRARY_NAME, COMPUTE_SOURCES, SHAPE_SOURCES, multicore=True, sanitize=sanitize
    )


def host_counters() -> dict[str, float]:
    """Counters of the last host run (see
    :meth:`asickernels.simulate.gpsimd.CustomOpLibrary.stats`); empty before the first."""
    return {} if _host is None else _host.stats()


def neuron_unavailable_reason() -> str | None:
    """None when torch-neuronx imports and a Neuron device exists, else why not."""
    if not glob.glob("/dev/neuron*"):
        return "no Neuron device (/dev/neuron*)"
    try:
        from torch_neuronx.xla_impl import custom_op  # noqa: F401
    except Exception as error:  # the PyPI placeholder packages raise on import
        return f"torch_neuronx does not import: {error!r}"
    return None


@functools.cache
def on_neuron() -> bool:
    """Whether the ops run on a NeuronCore here (probed once per process)."""
    return neuron_unavailable_reason() is None


def build_neuron_library(build_directory: str | os.PathLike[str] | None = None) -> Path:
    """Builds ``lib<LIBRARY_NAME>.so`` for the GpSimd engine (multicore, all 8 cores) with
    ``torch_neuronx.xla_impl.custom_op`` and loads it, which defines
    ``torch.ops.asickernels_gpsimd.giou`` and ``.nms``. A library already built from the
    same sources in ``build_directory`` is loaded as is.

    Needs a trn1/inf2 host (NeuronCore-v2) with torch-neuronx and the
    ``aws-neuronx-gpsimd-customop-lib`` / ``aws-neuronx-gpsimd-tools`` packages. The default
    directory is ``<cache>/neuron-<hash of the sources>``.
    """
    from torch_neuronx.xla_impl import custom_op

    sources = [*COMPUTE_SOURCES, *SHAPE_SOURCES]
    directory = Path(build_directory or shim.cache_dir() / f"neuron-{shim.source_digest(sources)}")
    library = directory / f"lib{LIBRARY_NAME}.so"
    if library.exists():
        custom_op.load_library(str(library))
        return library
    directory.mkdir(parents=True, exist_ok=True)
    custom_op.load(
        name=LIBRARY_NAME,
        compute_srcs=[str(p) for p in COMPUTE_SOURCES],
        shape_srcs=[str(p) for p in SHAPE_SOURCES],
        build_directory=str(directory),
        multicore=True,
    )
    return library


@functools.cache
def _neuron_ops() -> Any:
    import torch

    build_neuron_library()
    return getattr(torch.ops, LIBRARY_NAME)


def run_on_neuron(op: str, *args: Any) -> np.ndarray:
    """Runs ``torch.ops.asickernels_gpsimd.<op>`` on the XLA (Neuron) device; numpy arrays
    are moved to the device, the result comes back as numpy."""
    import torch
    import torch_xla.core.xla_model as xm

    device = xm.xla_device()
    converted = [torch.from_numpy(a).to(device) if isinstance(a, np.ndarray) else a for a in args]
    return getattr(_neuron_ops(), op)(*converted).cpu().numpy()
