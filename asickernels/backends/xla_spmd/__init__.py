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
