"""Kernels of the ``torch.ops.asickernels`` operators for torch_xla tensors (device "xla"),
generated from the op declarations.

The JAX op is handed to ``torch_xla.core.xla_builder.call_jax``, which traces it to HLO
once per shape and static arguments and splices it into the lazy torch_xla graph: on a TPU
the Pallas kernels are compiled by Mosaic as part of the torch_xla program; on a CPU PJRT
device the selection policy runs them simulated (interpret mode lowers to plain HLO), so a
CPU run of a torch_xla program checks the very kernels a TPU run uses. Host backends (the
NKI and GpSimd kernels on Neuron devices, or any host backend asked for by name) run on
host copies of the tensors. torch_xla is imported only when an XLA tensor reaches a kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import jax
import torch

import asickernels
from asickernels.kernels import policy, registry
from asickernels.kernels.declaration import Op
from asickernels.kernels.eager import x64_scope
from asickernels.torch import ops


def where_xla_tensors_live() -> policy.Where:
    """The selection policy's view of this process's XLA devices: TPU, Neuron, or a CPU
    PJRT device (on which the TPU kernels run simulated)."""
    import torch_xla.runtime as xr

    device_type = xr.device_type()
    if device_type is None:
        raise RuntimeError("torch_xla has no device: set PJRT_DEVICE (TPU, NEURON or CPU)")
    kind = device_type.lower()
    generation = None
    if kind == "tpu":
        from asickernels import tpu_generations

        generation = tpu_generations.generation_of(jax.devices()[0])
    return policy.Where(kind, generation, simulated_ok=kind == "cpu", embedded=True)


@functools.cache
def _jax_function(op: Op, present: tuple[str, ...]) -> Callable[..., object]:
    """``op`` over its present arrays by position (one stable function per signature, so
    ``call_jax`` reuses its trace)."""

    def function(*arrays: jax.Array, **statics: object) -> object:
        return op(**dict(zip(present, arrays, strict=True)), **statics)

    return function


@functools.cache
def _jax_vjp(op: Op, present: tuple[str, ...]) -> Callable[..., object]:
    def function(*arrays: jax.Array, backend: str | None, **statics: object) -> object:
        *inputs, cotangent = arrays
        values = {name: None for name in op.array_names} | dict(zip(present, inputs, strict=True))
        assert op.vjp is not None
        return op.vjp(values, statics, backend, cotangent)

    return function


def call(
    op: Op,
    tensors: Mapping[str, torch.Tensor | None],
    statics: Mapping[str, object],
    backend: str | None,
    cotangent: torch.Tensor | None = None,
) -> ops.Outputs:
    """``op`` (or its VJP, given a cotangent) on XLA tensors (``statics`` as the JAX op takes
    them: :func:`ops.jax_statics`), as its operator (or the backward operator) returns it."""
    from torch_xla.core import xla_builder

    specs = {n: ops.spec_of(t) for n, t in tensors.items()}
    plan = op.plan(specs, **statics)
    chosen = None
    if op.kernel is not None:
        chosen = policy.select(op.kernel, backend, where_xla_tensors_live(), plan.dtype)
    device = next(t.device for t in tensors.values() if t is not None)
    if chosen is not None and registry.backend(chosen).array_kind == "numpy":
        on_host = [None if t is None else t.cpu() for t in tensors.values()]
        if cotangent is None:
            result = ops.run_on_cpu(op, *on_host, backend=chosen, **statics)
        else:
            result = ops.run_vjp_on_cpu(op, cotangent.cpu(), *on_host, backend=chosen, **statics)
        return jax.tree.map(lambda r: r.to(device), result)
    present = tuple(n for n, t in tensors.items() if t is not None)
    arrays = [tensors[n] for n in present]
    options = dict(statics)
    if op.kernel is not None:
        options["backend"] = chosen
    with x64_scope(plan.x64):
        if cotangent is None:
            return xla_builder.call_jax(_jax_function(op, present), arrays, options)
        options.setdefault("backend", None)
        grads = xla_builder.call_jax(_jax_vjp(op, present), [*arrays, cotangent], options)
        return ops.single_or_tuple(tuple(grads))


def run_on_xla(
    op: Op, *tensors: torch.Tensor | None, backend: str | None = None, **statics: object
) -> ops.Outputs:
    """The operator's XLA kernel (arguments as :func:`ops.run_on_cpu` takes them)."""
    return call(op, ops.named_tensors(op, tensors), ops.jax_statics(op, statics), backend)


def run_vjp_on_xla(
    op: Op,
    cotangent: torch.Tensor,
    *tensors: torch.Tensor | None,
    backend: str | None = None,
    **statics: object,
) -> ops.Outputs:
    """The backward operator's XLA kernel (arguments as :func:`ops.run_vjp_on_cpu` takes
    them)."""
    named, given = ops.named_tensors(op, tensors), ops.jax_statics(op, statics)
    return call(op, named, given, backend, cotangent)


for _op in asickernels.OPS:
    _forward, _backward = ops.OPERATORS[_op.name]
    _forward.register_kernel("xla")(functools.partial(run_on_xla, _op))
    if _backward is not None:
        _backward.register_kernel("xla")(functools.partial(run_vjp_on_xla, _op))
