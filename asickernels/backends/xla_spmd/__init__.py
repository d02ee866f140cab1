"""XLA-SPMD wrappers: the ops over device meshes, one shard per device.

* :mod:`~asickernels.backends.xla_spmd.jax_spmd`: JAX, over a ``jax.sharding.Mesh``
  (``shard_map`` around the per-shard kernel).
* :mod:`~asickernels.backends.xla_spmd.torch_xla_spmd`: torch_xla, over a
  ``torch_xla.distributed.spmd.Mesh`` (manual-sharding regions around the kernel).
* :mod:`~asickernels.backends.xla_spmd.plan`: compiles the JAX programs for TPU pod-slice
  topologies with libtpu (no TPU needed) and reports the collectives and per-device memory
  (``asickernels spmd-plan``).

Nothing is imported here, so that neither torch nor libtpu is loaded unless asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asickernels.kernels.declaration import Op


def run_rule(rules: Mapping[str, Callable[..., Any]], op: Op, arguments: dict[str, Any]) -> Any:
    """``op``'s partition rule (``rules[op.partition]``) on ``arguments``, a wrapper's
    parameters by name (its ``locals()``): the op's own, ``mesh`` and the partition
    (``m_axis``/``k_axis``/``n_axis`` for ``"matmul"``, else ``batch_spec``). A rule takes
    ``(op, mesh, partition, arrays by name, other arguments by name)``."""
    values = dict(arguments)
    mesh = values.pop("mesh")
    if op.partition == "matmul":
        layout: object = tuple(values.pop(name) for name in ("m_axis", "k_axis", "n_axis"))
    else:
        layout = values.pop("batch_spec")
    arrays = {name: values.pop(name) for name in op.array_names}
    return rules[op.partition](op, mesh, layout, arrays, values)
