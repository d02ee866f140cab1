"""The frontends beside the JAX API (the op declarations themselves, :data:`asickernels.OPS`)
and :mod:`asickernels.torch`: the XLA-SPMD wrappers, the ops over device meshes, one shard
per device. Their per-op functions, and :mod:`asickernels.torch`'s, are generated from the
declarations by :mod:`~asickernels.frontends.generate`.

* :mod:`~asickernels.frontends.jax_spmd`: JAX, over a ``jax.sharding.Mesh``
  (``shard_map`` around the per-shard kernel).
* :mod:`~asickernels.frontends.torch_xla_spmd`: torch_xla, over a
  ``torch_xla.distributed.spmd.Mesh`` (manual-sharding regions around the kernel).
* :mod:`~asickernels.frontends.torch_tpu`: TorchTPU, every op as a ``torch.tpu.pallas.jax_op``
  operator (and over a mesh, through its partition specs).
* :mod:`~asickernels.frontends.spmd_plan`: compiles the JAX programs for TPU pod-slice
  topologies with libtpu (no TPU needed) and reports the collectives and per-device memory
  (``asickernels spmd-plan``).

Nothing is imported here, so that neither torch nor libtpu is loaded unless asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asickernels.kernels.declaration import Op


def sharded_ops(ops: Iterable[Op] | None = None) -> list[Op]:
    """The ops with SPMD wrappers: those of ``ops`` (default :data:`asickernels.OPS`) whose
    declaration names a partition rule."""
    if ops is None:
        import asickernels

        ops = asickernels.OPS
    return [op for op in ops if op.partition != "none"]


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
