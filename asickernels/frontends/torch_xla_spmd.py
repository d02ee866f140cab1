"""The ops over a ``torch_xla.distributed.spmd`` mesh (torch_xla SPMD mode, ``xr.use_spmd()``).

The same partitioning as :mod:`asickernels.frontends.jax_spmd`, written the way
torch_xla runs its own Pallas kernels under SPMD: each input is annotated with
``mark_sharding`` and enters a *manual sharding* region (``enable_manual_sharding``), where
the ``torch.ops.asickernels`` operator sees only its device's shard; the result leaves the
region (``disable_manual_sharding``) as a global tensor with a known sharding. Reductions
across shards (the GIOU loss, K-sharded matmul partial products) are ordinary torch ops
on those global tensors, for which the SPMD partitioner inserts the all-reduce.

Partition specs are torch_xla's: a tuple with one entry per dim, each a mesh axis name or
index, a tuple of them, or None. As in the JAX module, each function takes its op's
arguments (those of :mod:`asickernels.torch`) plus ``mesh`` and the partition, and runs
the rule its op's ``partition`` names (``"batch"``, ``"loss"``, ``"matmul"``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

import torch
import torch_xla
import torch_xla.distributed.spmd as xs
from torch import Tensor

import asickernels
from asickernels import INT8_MATMUL_MAX_K
from asickernels.frontends import run_rule, sharded_ops
from asickernels.kernels.declaration import Op, Plan
from asickernels.torch import ops as torch_ops

AxisName: TypeAlias = str | int | tuple[str | int, ...] | None
Spec: TypeAlias = tuple[AxisName, ...]  # one entry per dim
Tensors: TypeAlias = dict[str, Tensor | None]  # an op's array arguments by name


def _ways(mesh: xs.Mesh, entry: AxisName) -> int:
    if entry is None:
        return 1
    names = entry if isinstance(entry, tuple) else (entry,)
    sizes = mesh.shape()
    axis_names = list(sizes)
    return math.prod(sizes[axis_names[a]] if isinstance(a, int) else sizes[a] for a in names)


def _full_spec(spec: Sequence[AxisName], ndim: int, what: str) -> Spec:
    if len(spec) > ndim:
        raise ValueError(f"{what}: partition spec {tuple(spec)} is longer than its {ndim} dims")
    return (*spec, *[None] * (ndim - len(spec)))


def _check_even(mesh: xs.Mesh, tensor: torch.Tensor, spec: Spec, what: str) -> None:
    for dim, entry in zip(tensor.shape, spec, strict=True):
        if dim % _ways(mesh, entry):
            raise ValueError(
                f"{what}: a dim of size {dim} cannot be split evenly {_ways(mesh, entry)} ways "
                f"({entry!r}); pad it (and mask the padding) or change the mesh"
            )


def _reshardable(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, or a view of it when it already carries a sharding: ``mark_sharding``
    refuses to re-annotate a tensor (even with its own sharding), while a view is a new
    graph value that the partitioner reshards as needed; the caller's tensor is untouched."""
    if torch_xla._XLAC._get_xla_sharding_spec(tensor):
        return tensor.view(tensor.shape)
    return tensor


def _shard_map(
    fn: Callable[..., Any],
    mesh: xs.Mesh,
    in_specs: Sequence[Spec],
    out_specs: Sequence[Spec],
    tensors: Sequence[torch.Tensor],
) -> list[torch.Tensor]:
    """Runs ``fn`` on each device's shards of ``tensors`` and reassembles its outputs (a
    tensor or a tuple) into global tensors sharded as ``out_specs``."""
    local = [
        xs.enable_manual_sharding(_reshardable(t), spec, mesh=mesh).global_tensor
        for t, spec in zip(tensors, in_specs, strict=True)
    ]
    outputs = fn(*local)
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    return [
        xs.disable_manual_sharding(
            out, spec, [d * _ways(mesh, e) for d, e in zip(out.shape, spec, strict=True)],
            mesh=mesh,
        ).global_tensor
        for out, spec in zip(outputs, out_specs, strict=True)
    ]  # fmt: skip


class _DifferentiableShardMap(torch.autograd.Function):
    """:func:`_shard_map` of a differentiable ``fn`` with one output. Manual-sharding
    regions are not differentiated by torch_xla, so the backward pass is its own region:
    it re-runs ``fn`` on the shards and takes the gradient there with the operator's own
    autograd (cheap for GIOU, which is elementwise)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, fn: Callable[..., torch.Tensor], mesh: xs.Mesh, in_specs: Sequence[Spec],
        out_spec: Spec, *tensors: torch.Tensor,
    ) -> torch.Tensor:  # fmt: skip
        ctx.fn, ctx.mesh, ctx.in_specs, ctx.out_spec = fn, mesh, in_specs, out_spec
        ctx.save_for_backward(*tensors)
        return _shard_map(fn, mesh, in_specs, [out_spec], tensors)[0]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        tensors = ctx.saved_tensors
        wanted = [i for i, needs in enumerate(ctx.needs_input_grad[4:]) if needs]

        def local_grads(*local: torch.Tensor) -> tuple[torch.Tensor, ...]:
            *inputs, local_grad = local
            with torch.enable_grad():
                inputs = [t.detach().requires_grad_(i in wanted) for i, t in enumerate(inputs)]
                out = ctx.fn(*inputs)
                return torch.autograd.grad(out, [inputs[i] for i in wanted], local_grad)

        grads = _shard_map(
            local_grads, ctx.mesh, [*ctx.in_specs, ctx.out_spec],
            [ctx.in_specs[i] for i in wanted], [*tensors, grad.contiguous()],
        )  # fmt: skip
        by_input: list[torch.Tensor | None] = [None] * len(tensors)
        for i, g in zip(wanted, grads, strict=True):
            by_input[i] = g
        return (None, None, None, None, *by_input)


def _plan(op: Op, tensors: Mapping[str, Tensor | None], statics: Mapping[str, object]) -> Plan:
    """The op's own validation of the global shapes and dtypes."""
    specs = {n: torch_ops.spec_of(t) for n, t in tensors.items()}
    return op.plan(specs, **torch_ops.jax_statics(op, statics))


def _library_call(
    op: Op, names: Sequence[str], options: Mapping[str, object]
) -> Callable[..., Any]:
    """``torch.ops.asickernels.<op>`` over the tensors ``names``, by position."""
    library_op = getattr(torch.ops.asickernels, op.name)

    def call(*local: Tensor) -> Any:
        given = dict(zip(names, local, strict=True))
        return library_op(*(given.get(n) for n in op.array_names), **options)

    return call


def _batch_rule(
    op: Op,
    mesh: xs.Mesh,
    batch_spec: Sequence[AxisName],
    tensors: Tensors,
    options: dict[str, object],
) -> Any:
    """Each device runs the operator on its slice of the leading batch dims (differentiable
    for ops with a VJP; N of NMS and the box coordinates stay whole)."""
    params = {p.name: p for p in op.params}
    present = {n: t for n, t in tensors.items() if t is not None}
    statics = {k: v for k, v in options.items() if k in op.static_names}
    plan = _plan(op, tensors, statics)
    first = next(iter(present))
    batch_ndim = present[first].dim() - params[first].core_ndim
    batch = _full_spec(batch_spec, batch_ndim, f"{first} (batch dims)")
    in_specs = [batch + (None,) * (t.dim() - batch_ndim) for t in present.values()]
    for (name, t), spec in zip(present.items(), in_specs, strict=True):
        _check_even(mesh, t, spec, name)
    out_specs = [batch + (None,) * (len(s.shape) - batch_ndim) for s in plan.output_list()]
    call = _library_call(op, list(present), options)
    if op.vjp is not None and len(out_specs) == 1:
        return _DifferentiableShardMap.apply(call, mesh, in_specs, out_specs[0], *present.values())
    outputs = _shard_map(call, mesh, in_specs, out_specs, list(present.values()))
    return tuple(outputs) if len(outputs) > 1 else outputs[0]


def _loss_rule(
    op: Op,
    mesh: xs.Mesh,
    batch_spec: Sequence[AxisName],
    tensors: Tensors,
    options: dict[str, object],
) -> Any:
    """Per-box losses per device (0 at padding); ``"sum"`` and ``"mean"`` (over the valid
    boxes of the global batch, 0 when there are none) reduce the global tensor, which the
    partitioner turns into an all-reduce. Differentiable."""
    reduction = options["reduction"]
    per_box = _batch_rule(op, mesh, batch_spec, tensors, {**options, "reduction": "none"})
    if reduction == "none":
        return per_box
    if reduction == "sum":
        return per_box.sum()
    mask = tensors.get("mask")
    count = per_box.numel() if mask is None else (mask != 0).sum()
    return per_box.sum() / torch.clamp(torch.as_tensor(count, device=per_box.device), min=1)


def _matmul_rule(
    op: Op,
    mesh: xs.Mesh,
    axes: tuple[AxisName, AxisName, AxisName],
    tensors: Tensors,
    options: dict[str, object],
) -> Any:
    """int8 matmul of ``x [M, K]``, ``y [K, N]`` with M, K and N sharded over ``m_axis``,
    ``k_axis``, ``n_axis``. With K sharded, each shard's exact int32 partial product is
    summed in int32 across the K shards (exact: K is limited to ``INT8_MATMUL_MAX_K``), and
    the scales are applied once after the sum. Scales are None, 0-d or ``[M]`` / ``[N]``."""
    m_axis, k_axis, n_axis = axes
    x, y, x_scale, y_scale = (tensors[n] for n in ("x", "y", "x_scale", "y_scale"))
    plan = _plan(op, tensors, {"out_dtype": options["out_dtype"]})
    assert x is not None and y is not None  # required: validation refused None
    x_spec, y_spec = (m_axis, k_axis), (k_axis, n_axis)
    _check_even(mesh, x, x_spec, "x")
    _check_even(mesh, y, y_spec, "y")
    if k_axis is None:
        given = {n: t for n, t in tensors.items() if t is not None}
        scale_specs = {
            "x_scale": (m_axis,) if x_scale is not None and x_scale.dim() else (),
            "y_scale": (n_axis,) if y_scale is not None and y_scale.dim() else (),
        }
        specs = [{"x": x_spec, "y": y_spec, **scale_specs}[n] for n in given]
        call = _library_call(op, list(given), options)
        return _shard_map(call, mesh, specs, [(m_axis, n_axis)], list(given.values()))[0]
    if x.shape[1] > INT8_MATMUL_MAX_K:
        raise ValueError(
            f"K = {x.shape[1]} exceeds {INT8_MATMUL_MAX_K}: the int32 sum over "
            "the sharded K could overflow; leave K unsharded (the op then splits it exactly)"
        )
    unscaled = _library_call(op, ["x", "y"], {**options, "out_dtype": None})

    def partial_product(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return unscaled(xb, yb).unsqueeze(0)  # one [1, M, N] partial per K shard

    partials = _shard_map(
        partial_product, mesh, [x_spec, y_spec], [(k_axis, m_axis, n_axis)], [x, y]
    )[0]
    acc = partials.sum(0, dtype=torch.int32)
    out = torch_ops.torch_dtype(plan.outputs.dtype)  # type: ignore[union-attr]
    if out == torch.int32:
        return acc
    ones = torch.ones((), dtype=torch.float32, device=acc.device)
    xs_ = (ones if x_scale is None else x_scale.to(torch.float32)).reshape(-1, 1)
    ys_ = (ones if y_scale is None else y_scale.to(torch.float32)).reshape(1, -1)
    # The op's dequantization: float32 product of the exact sum and both scales, cast once.
    return (acc.to(torch.float32) * xs_ * ys_).to(out)


_RULES: dict[str, Callable[..., Any]] = {
    "batch": _batch_rule,
    "loss": _loss_rule,
    "matmul": _matmul_rule,
}


__all__ = [op.name for op in sharded_ops()]  # the functions below


# -- generated by asickernels/frontends/generate.py from the op declarations: do not edit --


def batched_nms(
    boxes: Tensor,
    scores: Tensor,
    idxs: Tensor,
    *,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float | None = None,
    mesh: xs.Mesh,
    batch_spec: Sequence[AxisName],
    backend: str | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`asickernels.torch.batched_nms` over ``mesh``, split along the batch dims as
    ``batch_spec``."""
    return run_rule(_RULES, asickernels.batched_nms, locals())


def box_iou(
    boxes1: Tensor,
    boxes2: Tensor,
    *,
    mesh: xs.Mesh,
    batch_spec: Sequence[AxisName],
    backend: str | None = None,
) -> Tensor:
    """:func:`asickernels.torch.box_iou` over ``mesh``, split along the batch dims as
    ``batch_spec``."""
    return run_rule(_RULES, asickernels.box_iou, locals())


def ciou(
    boxes1: Tensor,
    boxes2: Tensor,
    *,
    mesh: xs.Mesh,
    batch_spec: Sequence[AxisName],
    backend: str | None = None,
) -> Tensor:
    """:func:`asickernels.torch.ciou` over ``mesh``, split along the batch dims as
    ``batch_spec``."""
    return run_rule(_RULES, asickernels.ciou, locals())


def ciou_loss(
    preds: Tensor,
    targets: Tensor,
    *,
    mask: Tensor | None = None,
    reduction: str = "mean",
    mesh: xs.Mesh,
    batch_spec: Sequence[AxisName],
    backend: str | None = None,
) -> Tensor:
    """:func:`asickernels.torch.ciou_loss` over ``mesh``, split along the batch dims as
    ``batch_spec``; ``"sum"`` and ``"mean"`` reduce across the shards (the mean over the valid
    boxes of the global batch)."""
    return run_rule(_RULES, asickernels.ciou_loss, locals())


def ciou_vjp(
    boxes1: Tensor,
    boxes2: Tensor,
    cotangent: Tensor,
    *,
    mesh: xs.Mesh,
    batch_spec: Sequence[AxisName],
    backend: str | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`asickernels.torch.ciou_vjp` over ``mesh``, split along the batch dims as
    ``batch_spec``."""
    return run_rule(_RULES, asickernels.ciou_vjp, locals())


def diou(
    boxes1: Tensor,
    boxes2: Tensor,
    *,
    mesh: xs.Mesh,
    batch_spec: Sequence[AxisName],
    backend: str | None = None,
) -> Tensor:
    """:func:`asickernels.torch.diou` over ``mesh``, split along the batch dims as
    ``batch_spec``."""
    return run_rule(_RULES, asickernels.diou, locals())


def diou_loss(
    preds: Tensor,
    targets: Tensor,
    *,
    mask: Tensor | None = None,
    reduction: str = "mean",
    mesh: xs.Mesh,
    batch_spec: Sequence[AxisName],
    backend: str | None = None,
) -> Tensor:
    """:func:`asickernels.torch.diou_loss` over ``mesh``, split along the batch dims as
    ``batch_spec``; ``"sum"`` and ``"mean"`` reduce across the shards (the mean over the valid
    boxes of the global batch)."""
    return run_rule(_RULES, asickernels.diou_loss, locals())


def diou_vjp(
    boxes1: Tensor,
    boxes2: Tensor,
    cotangent: Tensor,
    *,
    mesh: xs.Mesh,
    batch_spec: Sequence[AxisName],
    backend: str | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`asickernels.torch.diou_vjp` over ``mesh``, split along the batch dims as
    ``batch_spec``."""
    return run_rule(_RULES, asickernels.diou_vjp, locals())


def generalized_box_iou(
    boxes1: Tensor,
    boxes2: Tensor,
    *,
    mesh: xs.Mesh,
    batch_spec: Sequence[AxisName],
    backend: str | None = None,
) -> Tensor:
    """:func:`asickernels.torch.generalized_box_iou` over ``mesh``, split along the batch dims
    as ``batch_spec``."""
    return run_rule(_RULES, asickernels.generalized_box_iou, locals())


def giou(
    boxes1: Tensor,
    boxes2: Tensor,
    *,
    mesh: xs.Mesh,
    batch_spec: Sequence[AxisName],
    backend: str | None = None,
) -> Tensor:
    """:func:`asickernels.torch.giou` over ``mesh``, split along the batch dims as
    ``batch_spec``."""
    return run_rule(_RULES, asickernels.giou, locals())


def giou_loss(
    preds: Tensor,
    targets: Tensor,
    *,
    mask: Tensor | None = None,
    reduction: str = "mean",
    mesh: xs.Mesh,
    batch_spec: Sequence[AxisName],
    backend: str | None = None,
) -> Tensor:
    """:func:`asickernels.torch.giou_loss` over ``mesh``, split along the batch dims as
    ``batch_spec``; ``"sum"`` and ``"mean"`` reduce across the shards (the mean over the valid
    boxes of the global batch)."""
    return run_rule(_RULES, asickernels.giou_loss, locals())


def giou_vjp(
    boxes1: Tensor,
    boxes2: Tensor,
    cotangent: Tensor,
    *,
    mesh: xs.Mesh,
    batch_spec: Sequence[AxisName],
    backend: str | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`asickernels.torch.giou_vjp` over ``mesh``, split along the batch dims as
    ``batch_spec``."""
    return run_rule(_RULES, asickernels.giou_vjp, locals())


def int8_matmul(
    x: Tensor,
    y: Tensor,
    *,
    x_scale: Tensor | None = None,
    y_scale: Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    mesh: xs.Mesh,
    m_axis: AxisName = None,
    k_axis: AxisName = None,
    n_axis: AxisName = None,
    backend: str | None = None,
) -> Tensor:
    """:func:`asickernels.torch.int8_matmul` over ``mesh``, with M, K and N split over the mesh
    axes ``m_axis``, ``k_axis`` and ``n_axis`` (None: whole on every device); the result is
    sharded as ``(m_axis, n_axis)``."""
    return run_rule(_RULES, asickernels.int8_matmul, locals())


def linear_sum_assignment(
    cost: Tensor,
    *,
    row_mask: Tensor | None = None,
    col_mask: Tensor | None = None,
    mesh: xs.Mesh,
    batch_spec: Sequence[AxisName],
    backend: str | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`asickernels.torch.linear_sum_assignment` over ``mesh``, split along the batch dims
    as ``batch_spec``."""
    return run_rule(_RULES, asickernels.linear_sum_assignment, locals())


def nms(
    boxes: Tensor,
    scores: Tensor,
    *,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float | None = None,
    mesh: xs.Mesh,
    batch_spec: Sequence[AxisName],
    backend: str | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`asickernels.torch.nms` over ``mesh``, split along the batch dims as
    ``batch_spec``."""
    return run_rule(_RULES, asickernels.nms, locals())
