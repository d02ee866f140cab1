"""Compiling for a real TPU, without a TPU.

libtpu (the ``tpu`` extra: ``pip install -e ".[tpu]"`` in a clone) can compile for a TPU
topology described by name, on any host: ``jax.experimental.topologies.get_topology_desc``
yields TPU devices to lower and compile against. A kernel that compiles this way has passed
Mosaic and the TPU backend for real (block shapes, dtypes, layouts, VMEM capacity).
:func:`lower_for_tpu` lowers any function for a generation; the gate that compiles our
kernels at their benchmark shapes (``asickernels compile``) is
:mod:`asickernels.estimates.compile_gate`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, MutableMapping, Sequence
from typing import TYPE_CHECKING, TypeAlias

from asickernels import tpu_generations as generations
from asickernels.jax_compat import single_device_sharding
from asickernels.tpu_generations import LIBTPU_INSTALL

if TYPE_CHECKING:
    import jax

TOPOLOGIES = {
    name: topology
    for name, facts in generations.GENERATIONS.items()
    if (topology := facts.topology) is not None
}
ArgSpec: TypeAlias = tuple[tuple[int, ...], str]  # an array argument: (shape, dtype name)
# A function to compile, and its arguments.
Built = tuple[Callable[..., object], list[ArgSpec]]


# libtpu compiling on a machine with no TPU: setdefault into the environment before it loads.
LIBTPU_WITHOUT_A_TPU = {
    "TPU_SKIP_MDS_QUERY": "1",  # no cloud metadata server to ask
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",  # no machine-wide lock between processes that compile
    # One host, this one: unset, libtpu prints an INVALID_ARGUMENT error with a source trace
    # and a "could not determine TPU accelerator type" warning at every load.
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_HOST_BOUNDS": "1,1,1",
}


def set_libtpu_environment(env: MutableMapping[str, str] = os.environ) -> None:
    """Sets :data:`LIBTPU_WITHOUT_A_TPU` in ``env`` where unset (what is set is kept)."""
    for name, value in LIBTPU_WITHOUT_A_TPU.items():
        env.setdefault(name, value)


def libtpu_status() -> str | None:
    """None when libtpu can compile here, else why not and what to install."""
    try:
        import libtpu  # noqa: F401
    except ImportError:
        return f"libtpu is not installed ({LIBTPU_INSTALL})"
    return None


@functools.cache
def topology_device(generation: str) -> jax.Device:
    """A TPU device of ``generation`` from a named topology (no TPU attached).

    Raises ValueError for a generation with no topology, ModuleNotFoundError (saying what
    to install) where libtpu is not installed."""
    set_libtpu_environment()
    from jax.experimental import topologies

    if generation not in TOPOLOGIES:
        raise ValueError(f"no topology for {generation!r}; known: {sorted(TOPOLOGIES)}")
    try:
        description = topologies.get_topology_desc(
            platform="tpu", topology_name=TOPOLOGIES[generation]
        )
    except RuntimeError as error:  # jax: "JAX TPU support not installed"
        missing = libtpu_status()
        if missing is None:
            raise
        raise ModuleNotFoundError(
            f"cannot compile for TPU {generation} here: {missing}", name="libtpu"
        ) from error
    return description.devices[0]


def lower_for_tpu(
    fn: Callable[..., object], arg_specs: Sequence[ArgSpec], generation: str
) -> jax.stages.Lowered:
    """``jax.jit(fn).lower(...)`` with the arguments on one TPU device of ``generation``:
    the Pallas kernels lower to Mosaic with that generation's blocks (they follow the
    lowering). Raises as :func:`topology_device`."""
    import jax

    sharding = single_device_sharding(topology_device(generation))
    args = [jax.ShapeDtypeStruct(shape, dtype, sharding=sharding) for shape, dtype in arg_specs]
    return jax.jit(fn).lower(*args)
