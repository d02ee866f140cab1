"""TorchTPU (``torch-tpu``): every op of :data:`asickernels.OPS` as a TorchTPU operator,
``torch.ops.asickernels_tpu.<name>``, registered through TorchTPU's public
``torch.tpu.pallas.jax_op``.

Importing this module registers them; :mod:`asickernels.torch` does so the first time a tensor
on the ``tpu`` device reaches one of its functions, and runs them there, so users call
``asickernels.torch.<op>`` on any device. Each operator is the JAX op itself, traced with
``jax.jit`` and exported for TPU by TorchTPU (``jax.export``: the Pallas kernels lower to
Mosaic), with TorchTPU's fake kernel (from the exported module's output avals: the shapes
and dtypes the op declares). Its schema is the op's: the arrays as positional tensors (in
declaration order), the static values and ``str? backend=None`` keyword-only.

* ``backend=None`` is the selection policy's choice for a TPU of the generation of JAX's
  default device (the Pallas kernel where the op has one and the policy prefers it, else
  XLA); a backend named by the caller must be a JAX backend.
* The differentiable ops get autograd (``torch.library.register_autograd``, which
  ``jax_op`` does not add) through a second operator, ``<name>_backward``: the op's VJP,
  exported the same way.
* :func:`sharded` registers an op over a mesh (``jax_op``'s ``mesh`` and partition specs)
  by its partition rule (batch, loss or matmul): each rank passes its local shard, and the
  shards run the rule of :mod:`asickernels.frontends.jax_spmd`.

On a host without a TPU, Pallas's Mosaic lowering reads the TPU generation from JAX's
default device: trace under ``jax.default_device`` of a TPU topology device
(:func:`asickernels.simulate.tpu_compile.topology_device`). Never create a ``tpu`` tensor
there: TorchTPU aborts the process.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import torch
import torch_tpu  # noqa: F401  (provides torch.tpu)

import asickernels
from asickernels import tpu_generations
from asickernels.frontends import jax_spmd
from asickernels.kernels import policy
from asickernels.kernels.declaration import Op, Param
from asickernels.torch import ops

NAMESPACE = "asickernels_tpu"

# The annotation TorchTPU reads for each schema type (jax_op infers the schema, and which
# arguments are static, from the function's annotations: every non-tensor is static).
_ANNOTATIONS: dict[str, Any] = {
    "Tensor": jax.Array,
    "Tensor?": jax.Array | None,
    "float": float,
    "float?": float | None,
    "int": int,
    "int?": int | None,
    "int[]": Sequence[int],
    "str": str,
    "bool": bool,
    "ScalarType?": torch.dtype | None,
}
_BACKEND = inspect.Parameter(
    "backend", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=str | None
)


def signature(params: Sequence[Param], outputs: int) -> inspect.Signature:
    """The annotated signature ``jax_op`` turns into the operator's schema: arrays
    positional, static values and ``backend`` keyword-only."""
    positional, keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
    ordered = [p for p in params if p.kind == "array"] + [p for p in params if p.kind == "static"]
    annotated = [
        inspect.Parameter(
            p.name,
            positional if p.kind == "array" else keyword,
            default=p.default,
            annotation=_ANNOTATIONS[p.torch_type],
        )
        for p in ordered
    ]
    returns = jax.Array if outputs == 1 else tuple[(jax.Array,) * outputs]  # type: ignore[misc]
    return inspect.Signature([*annotated, _BACKEND], return_annotation=returns)


def tpu_backend(op: Op, values: Mapping[str, Any]) -> str | None:
    """The backend ``op`` runs on for a TPU (None for an op without a kernel): the one named
    in ``values``, else the selection policy's for the generation of JAX's default device
    (on a host without a TPU, Pallas kernels are taken as if native)."""
    arrays = {n: values[n] for n in op.array_names}
    plan = op.plan(arrays, **{n: values[n] for n in op.static_names})
    if op.kernel is None or values["backend"] is not None:
        return values["backend"]  # type: ignore[no-any-return]
    device = policy.default_device()
    generation = tpu_generations.generation_of(device) if device.platform == "tpu" else None
    where = policy.Where("tpu", generation, traced=True, simulated_ok=True, embedded=True)
    return policy.select(op.kernel, None, where, plan.dtype)


def _function(
    name: str, sig: inspect.Signature, body: Callable[[dict[str, Any]], Any]
) -> Callable[..., Any]:
    """A function of signature ``sig`` that calls ``body`` with its arguments by name."""

    def function(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return body(dict(bound.arguments))

    function.__signature__ = sig  # type: ignore[attr-defined]
    function.__name__ = function.__qualname__ = name
    return function


def forward_function(op: Op) -> Callable[..., Any]:
    """``op`` as the JAX function its TorchTPU operator exports (Pallas interpret mode when
    run on a CPU, Mosaic when lowered for a TPU)."""
    sig = signature(op.params, len(op.outputs))
    return _function(
        op.name, sig, lambda values: op(**values | {"backend": tpu_backend(op, values)})
    )


def backward_function(op: Op) -> Callable[..., Any]:
    """``op``'s VJP as the JAX function its ``<name>_backward`` operator exports: the
    gradients of the differentiable arrays, given the cotangent first."""
    assert op.vjp is not None
    vjp = op.vjp
    params = ops.backward_params(op)

    def body(values: dict[str, Any]) -> Any:
        backend = tpu_backend(op, values)
        arrays = {n: values[n] for n in op.array_names}
        statics = {n: values[n] for n in op.static_names}
        grads = tuple(vjp(arrays, statics, backend, values["cotangent"]))
        return grads[0] if len(grads) == 1 else grads

    return _function(f"{op.name}_backward", signature(params, len(op.differentiable)), body)


def _register(op: Op) -> ops.CustomOp:
    jax_op = torch.tpu.pallas.jax_op  # type: ignore[attr-defined]
    forward: ops.CustomOp = jax_op(f"{NAMESPACE}::{op.name}", forward_function(op))
    if op.vjp is not None:
        backward = jax_op(f"{NAMESPACE}::{op.name}_backward", backward_function(op))
        ops.register_autograd(op, forward, backward)
    return forward


OPERATORS: dict[str, ops.CustomOp] = {op.name: _register(op) for op in asickernels.OPS}


Axes = tuple[str | None, str | None, str | None]  # (m_axis, k_axis, n_axis)


def _layout(op: Op, batch_spec: jax.sharding.PartitionSpec | None, axes: Axes) -> dict[str, Any]:
    """The partition arguments of ``op``'s :mod:`~asickernels.frontends.jax_spmd` wrapper:
    ``batch_spec`` for the ``"batch"`` and ``"loss"`` rules, ``m_axis``/``k_axis``/``n_axis``
    for ``"matmul"``. Each dim is split over one mesh axis at most: ``jax_op`` maps a local
    dim to its global size through a single axis."""
    if op.partition == "none":
        raise ValueError(f"{op.name} has no partition rule: it cannot be registered over a mesh")
    if op.partition == "matmul":
        if batch_spec is not None:
            raise ValueError(
                f"batch_spec: {op.name} is split by m_axis, k_axis and n_axis, not batch_spec"
            )
        layout: dict[str, Any] = dict(zip(("m_axis", "k_axis", "n_axis"), axes, strict=True))
        entries: tuple[object, ...] = axes
    else:
        if batch_spec is None or any(a is not None for a in axes):
            raise ValueError(
                f"batch_spec: {op.name} is split along its batch dims by batch_spec "
                "(required), not by m_axis, k_axis or n_axis"
            )
        layout, entries = {"batch_spec": batch_spec}, tuple(batch_spec)
    several = [e for e in entries if e is not None and not isinstance(e, str)]
    if several:
        raise ValueError(
            f"{'/'.join(layout)}: {several[0]!r} splits a dim over several mesh axes; "
            "TorchTPU's jax_op splits each dim over one mesh axis at most"
        )
    return layout


def partition_specs(
    op: Op, layout: dict[str, Any]
) -> tuple[tuple[jax.sharding.PartitionSpec, ...], tuple[jax.sharding.PartitionSpec, ...]]:
    """``jax_op``'s input and output partition specs for ``op`` split as ``layout``: how each
    rank's local tensors relate to the global arrays of the rule.

    * ``"batch"``: every array and output split as ``batch_spec``.
    * ``"loss"``: the arrays split as ``batch_spec``; the output too, which is right for
      ``reduction="none"`` (per-box losses, batch-sharded). A ``"sum"``/``"mean"`` loss is a
      scalar, which no spec splits: every rank gets the whole, replicated by the rule's
      ``psum`` (``reduction`` is a static argument, so one spec must serve all three).
    * ``"matmul"``: ``x`` as ``(m_axis, k_axis)``, ``y`` as ``(k_axis, n_axis)``, the result as
      ``(m_axis, n_axis)``; the scales whole on every rank (a scalar or the global ``[M]`` /
      ``[N]`` vector: one spec must fit both; the rule slices each shard's part).
    """
    p = jax.sharding.PartitionSpec
    if op.partition == "matmul":
        m, k, n = layout["m_axis"], layout["k_axis"], layout["n_axis"]
        arrays = {"x": p(m, k), "y": p(k, n), "x_scale": p(), "y_scale": p()}
        return tuple(arrays[a] for a in op.array_names), (p(m, n),)
    spec = layout["batch_spec"]
    return tuple(spec for _ in op.array_names), tuple(spec for _ in op.outputs)


def sharded_function(
    op: Op,
    mesh: jax.sharding.Mesh,
    batch_spec: jax.sharding.PartitionSpec | None = None,
    *,
    m_axis: str | None = None,
    k_axis: str | None = None,
    n_axis: str | None = None,
) -> Callable[..., Any]:
    """``op`` over ``mesh`` as the JAX function :func:`sharded` registers: its
    :mod:`~asickernels.frontends.jax_spmd` wrapper on the global arrays.

    Raises:
      ValueError: ``op`` has no partition rule, or the partition arguments do not fit it
        (see :func:`sharded`).
    """
    layout = _layout(op, batch_spec, (m_axis, k_axis, n_axis))
    wrapper = getattr(jax_spmd, op.name)

    def body(values: dict[str, Any]) -> Any:
        backend = tpu_backend(op, values)
        return wrapper(**values | {"backend": backend}, mesh=mesh, **layout)

    return _function(op.name, signature(op.params, len(op.outputs)), body)


def sharded_backward_function(
    op: Op, mesh: jax.sharding.Mesh, batch_spec: jax.sharding.PartitionSpec
) -> Callable[..., Any]:
    """The VJP of :func:`sharded_function` (JAX differentiates the rule through
    ``shard_map``) as the JAX function of the sharded ``<name>_backward`` operator: the
    gradients of the differentiable arrays, given the cotangent first.

    A loss's cotangent comes broadcast over the boxes (``preds.shape[:-1]``, split as
    ``batch_spec``) for every reduction: ``jax_op``'s one spec for it must fit the
    per-box losses of ``"none"``; a ``"sum"``/``"mean"`` cotangent is then any element."""
    forward = sharded_function(op, mesh, batch_spec)

    def body(values: dict[str, Any]) -> Any:
        cotangent = values.pop("cotangent")
        if values.get("reduction", "none") != "none":
            cotangent = cotangent[(0,) * cotangent.ndim]

        def of(*wrt: jax.Array) -> Any:
            return forward(**values | dict(zip(op.differentiable, wrt, strict=True)))

        _, vjp = jax.vjp(of, *(values[n] for n in op.differentiable))
        grads = vjp(cotangent)
        return grads[0] if len(grads) == 1 else grads

    params = ops.backward_params(op)
    return _function(f"{op.name}_backward", signature(params, len(op.differentiable)), body)


def sharded(
    op: Op,
    mesh: jax.sharding.Mesh,
    batch_spec: jax.sharding.PartitionSpec | None = None,
    *,
    name: str,
    m_axis: str | None = None,
    k_axis: str | None = None,
    n_axis: str | None = None,
) -> ops.CustomOp:
    """``op`` over ``mesh`` by its partition rule, as :mod:`~asickernels.frontends.jax_spmd`
    runs it, registered as ``asickernels_tpu::<name>`` with ``jax_op``'s ``mesh`` and
    partition specs (:func:`partition_specs`): each rank passes its local shard of every
    array and gets its shard of every output. A differentiable op gets autograd through a
    sharded ``asickernels_tpu::<name>_backward`` operator
    (:func:`sharded_backward_function`): each rank gets the gradients of its shards.

    * ``"batch"`` ops (GIOU, NMS, ...) and the ``"loss"`` ops (the box losses) split along
      their batch dims as ``batch_spec``; a loss's ``"sum"`` and ``"mean"`` reduce across
      the shards (the mean over the valid boxes of the global batch), and every rank gets
      the scalar.
    * ``int8_matmul`` splits M, K and N over the mesh axes ``m_axis``, ``k_axis``, ``n_axis``
      (None: whole on every rank; a split K is summed exactly with an int32 ``psum``); the
      scales are passed whole on every rank; the result is sharded ``(m_axis, n_axis)``.

    Each entry of ``batch_spec`` and each axis names one mesh axis (or None). Registering
    a name again with the same op, mesh and partition returns the operator registered first.

    Raises:
      ValueError: ``name`` is already registered over another op, mesh or partition, or is
        the name of an unsharded operator (``<op>`` or ``<op>_backward``).
      ValueError: ``op`` has no partition rule; ``batch_spec`` given for ``int8_matmul`` or
        missing for another op; an axis for an op other than ``int8_matmul``; a dim split
        over several mesh axes.
    """
    layout = _layout(op, batch_spec, (m_axis, k_axis, n_axis))
    registration = (op.name, mesh, tuple(layout.items()))
    if name in _SHARDED:
        earlier, operator = _SHARDED[name]
        if earlier == registration:
            return operator
        raise ValueError(
            f"name: {NAMESPACE}::{name} is already registered over another op, mesh or "
            "partition; jax_op would replace it under the earlier operator: pick a new name"
        )
    names = [name, f"{name}_backward"] if op.vjp is not None else [name]
    if taken := [n for n in names if n in _registered_names()]:
        raise ValueError(f"name: {NAMESPACE}::{taken[0]} is already an operator's name")
    inputs, outputs = partition_specs(op, layout)
    jax_op = torch.tpu.pallas.jax_op  # type: ignore[attr-defined]
    forward: ops.CustomOp = jax_op(
        f"{NAMESPACE}::{name}",
        sharded_function(op, mesh, batch_spec, m_axis=m_axis, k_axis=k_axis, n_axis=n_axis),
        mesh=mesh,
        input_partition_specs=inputs,
        output_partition_specs=outputs,
    )
    if op.vjp is not None:  # one output, so one cotangent, split as that output
        assert batch_spec is not None  # int8_matmul, the one op split otherwise, has no VJP
        spec_of = dict(zip(op.array_names, inputs, strict=True))
        backward = jax_op(
            f"{NAMESPACE}::{name}_backward",
            sharded_backward_function(op, mesh, batch_spec),
            mesh=mesh,
            input_partition_specs=(*outputs, *inputs),
            output_partition_specs=tuple(spec_of[n] for n in op.differentiable),
        )
        if op.partition == "loss":
            backward = _cotangent_per_box(backward)
        ops.register_autograd(op, forward, backward)
    _SHARDED[name] = (registration, forward)
    return forward


# What each name was registered as by `sharded`. jax_op (torch.library.custom_op) silently
# replaces an operator registered again under its name: the earlier operator then runs the
# later's function, and when the replaced library is garbage-collected torch drops its
# cached `torch.ops` entry, so operator objects taken before that stop matching.
_SHARDED: dict[str, tuple[tuple[object, ...], ops.CustomOp]] = {}


def _registered_names() -> set[str]:
    """The operator names taken in the namespace: each op's and each :func:`sharded` name,
    with their ``_backward``."""
    return {n for base in [*OPERATORS, *_SHARDED] for n in (base, f"{base}_backward")}


def _cotangent_per_box(backward: ops.CustomOp) -> Callable[..., Any]:
    """``backward`` of a sharded loss, its cotangent (a ``"sum"``/``"mean"`` scalar, or the
    per-box losses' of ``"none"``) broadcast over the rank's boxes (``preds.shape[:-1]``), as
    :func:`sharded_backward_function` takes it."""

    def call(cotangent: torch.Tensor, preds: torch.Tensor, *rest: Any, **keyword: Any) -> Any:
        return backward(cotangent.expand(preds.shape[:-1]), preds, *rest, **keyword)

    return call
