"""The ops over a ``torch_xla.distributed.spmd`` mesh (torch_xla SPMD mode, ``xr.use_spmd()``).

The same partitioning as :mod:`asickernels.backends.xla_spmd.jax_spmd`, written the way
torch_xla runs its own Pallas kernels under SPMD: each input is annotated with
``mark_sharding`` and enters a *manual sharding* region (``enable_manual_sharding``), where
the ``torch.ops.asickernels`` operator sees only its device's shard; the result leaves the
region (``disable_manual_sharding``) as a global tensor with a known sharding. Reductions
across shards (the GIOU loss, K-sharded matmul partial products) are ordinary torch ops
on those global tensors, for which the SPMD partitioner inserts the all-reduce.

Partition specs are torch_xla's: a tuple with one entry per dim, each a mesh axis name or
index, a tuple of them, or None.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch_xla
import torch_xla.distributed.spmd as xs

import asickernels.torch  # noqa: F401  (registers torch.ops.asickernels)
from asickernels import INT8_MATMUL_MAX_K
from asickernels.kernels.giou import Reduction
from asickernels.torch.ops import check_like_jax, matmul_out_dtype, numpy_dtype

Spec = tuple[Any, ...]
AxisName = str | int | tuple[str | int, ...] | None


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
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
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


def giou(
    boxes1: torch.Tensor,
    boxes2: torch.Tensor,
    *,
    mesh: xs.Mesh,
    batch_spec: Sequence[AxisName],
    backend: str | None = None,
) -> torch.Tensor:
    """:func:`asickernels.torch.giou` of XLA tensors ``[..., 4]`` with the batch dims
    partitioned by ``batch_spec``; the result ``[...]`` is sharded as ``batch_spec``.
    Differentiable."""
    check_like_jax("giou", boxes1, boxes2)
    box_spec = _full_spec(batch_spec, boxes1.dim(), "boxes")
    _check_even(mesh, boxes1, box_spec, "boxes")

    def kernel(b1: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
        return torch.ops.asickernels.giou(b1, b2, backend)

    return _DifferentiableShardMap.apply(
        kernel, mesh, [box_spec, box_spec], box_spec[:-1], boxes1, boxes2
    )


def giou_loss(
    preds: torch.Tensor,
    targets: torch.Tensor,
    *,
    mesh: xs.Mesh,
    batch_spec: Sequence[AxisName],
    mask: torch.Tensor | None = None,
    reduction: Reduction = "mean",
    backend: str | None = None,
) -> torch.Tensor:
    """:func:`asickernels.torch.giou_loss` with the batch dims partitioned by
    ``batch_spec``. Each shard computes its per-box loss (0 at padding); ``"sum"`` and
    ``"mean"`` (over the valid boxes of the global batch, 0 when there are none) reduce the
    global tensor, and the partitioner turns that into an all-reduce. Differentiable."""
    check_like_jax("giou_loss", preds, targets, mask=mask, reduction=reduction)
    box_spec = _full_spec(batch_spec, preds.dim(), "preds")
    _check_even(mesh, preds, box_spec, "preds")
    tensors = [preds, targets] if mask is None else [preds, targets, mask]

    def kernel(p: torch.Tensor, t: torch.Tensor, m: torch.Tensor | None = None) -> torch.Tensor:
        return torch.ops.asickernels.giou_loss(p, t, m, "none", backend)

    in_specs = [box_spec, box_spec, box_spec[:-1]][: len(tensors)]
    per_box = _DifferentiableShardMap.apply(kernel, mesh, in_specs, box_spec[:-1], *tensors)
    if reduction == "none":
        return per_box
    if reduction == "sum":
        return per_box.sum()
    count = per_box.numel() if mask is None else (mask != 0).sum()
    return per_box.sum() / torch.clamp(torch.as_tensor(count, device=per_box.device), min=1)


def nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    *,
    mesh: xs.Mesh,
    batch_spec: Sequence[AxisName],
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`asickernels.torch.nms` with the batch dims of ``scores [..., N]`` partitioned
    by ``batch_spec`` (N stays whole). Outputs are sharded as ``batch_spec``."""
    options = (iou_threshold, max_output_size, score_threshold, backend)
    check_like_jax("nms", boxes, scores, **_nms_static(*options[:3]))

    def kernel(b: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ops.asickernels.nms(b, s, *options)

    return _sharded_nms(kernel, mesh, batch_spec, [boxes, scores])


def batched_nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    idxs: torch.Tensor,
    *,
    mesh: xs.Mesh,
    batch_spec: Sequence[AxisName],
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`asickernels.torch.batched_nms` partitioned as :func:`nms`."""
    options = (iou_threshold, max_output_size, score_threshold, backend)
    check_like_jax("batched_nms", boxes, scores, idxs, **_nms_static(*options[:3]))

    def kernel(
        b: torch.Tensor, s: torch.Tensor, i: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ops.asickernels.batched_nms(b, s, i, *options)

    return _sharded_nms(kernel, mesh, batch_spec, [boxes, scores, idxs])


def _nms_static(
    iou_threshold: float, max_output_size: int, score_threshold: float | None
) -> dict[str, Any]:
    return {
        "iou_threshold": iou_threshold,
        "max_output_size": max_output_size,
        "score_threshold": score_threshold,
    }


def _sharded_nms(
    kernel: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    mesh: xs.Mesh,
    batch_spec: Sequence[AxisName],
    tensors: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    scores = tensors[1]
    per_box = _full_spec(batch_spec, scores.dim() - 1, "scores (batch dims)") + (None,)
    _check_even(mesh, scores, per_box, "scores")
    in_specs = [(*per_box, None), per_box, per_box][: len(tensors)]
    indices, num_valid = _shard_map(kernel, mesh, in_specs, [per_box, per_box[:-1]], tensors)
    return indices, num_valid


def int8_matmul(
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    mesh: xs.Mesh,
    m_axis: AxisName = None,
    k_axis: AxisName = None,
    n_axis: AxisName = None,
    x_scale: torch.Tensor | None = None,
    y_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """:func:`asickernels.torch.int8_matmul` of ``x [M, K]``, ``y [K, N]`` with M, K and N
    sharded over ``m_axis``, ``k_axis``, ``n_axis``. With K sharded, each shard's exact
    int32 partial product is summed in int32 across the K shards (exact: K is limited to
    ``INT8_MATMUL_MAX_K``), and the scales are applied once after the sum.
    Scales are None, 0-d or ``[M]`` / ``[N]`` tensors on the XLA device."""
    check_like_jax(
        "int8_matmul", x, y, x_scale=x_scale, y_scale=y_scale,
        out_dtype=None if out_dtype is None else numpy_dtype(out_dtype),
    )  # fmt: skip
    x_spec, y_spec = (m_axis, k_axis), (k_axis, n_axis)
    _check_even(mesh, x, x_spec, "x")
    _check_even(mesh, y, y_spec, "y")
    out = matmul_out_dtype(x_scale, y_scale, out_dtype)
    if k_axis is None:
        scales = [s for s in (x_scale, y_scale) if s is not None]
        scale_specs = [
            (axis,) if s.dim() else ()
            for s, axis in ((x_scale, m_axis), (y_scale, n_axis))
            if s is not None
        ]

        def product(xb: torch.Tensor, yb: torch.Tensor, *given: torch.Tensor) -> torch.Tensor:
            it = iter(given)
            xs_ = next(it) if x_scale is not None else None
            ys_ = next(it) if y_scale is not None else None
            return torch.ops.asickernels.int8_matmul(xb, yb, xs_, ys_, out_dtype, backend)

        in_specs = [x_spec, y_spec, *scale_specs]
        return _shard_map(product, mesh, in_specs, [(m_axis, n_axis)], [x, y, *scales])[0]
    if x.shape[1] > INT8_MATMUL_MAX_K:
        raise ValueError(
            f"K = {x.shape[1]} exceeds {INT8_MATMUL_MAX_K}: the int32 sum over "
            "the sharded K could overflow; leave K unsharded (the op then splits it exactly)"
        )

    def partial_product(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        acc = torch.ops.asickernels.int8_matmul(xb, yb, None, None, None, backend)
        return acc.unsqueeze(0)  # one [1, M, N] partial per K shard

    partials = _shard_map(
        partial_product, mesh, [x_spec, y_spec], [(k_axis, m_axis, n_axis)], [x, y]
    )[0]
    acc = partials.sum(0, dtype=torch.int32)
    if out == torch.int32:
        return acc
    ones = torch.ones((), dtype=torch.float32, device=acc.device)
    xs_ = (ones if x_scale is None else x_scale.to(torch.float32)).reshape(-1, 1)
    ys_ = (ones if y_scale is None else y_scale.to(torch.float32)).reshape(1, -1)
    # The op's dequantization: float32 product of the exact sum and both scales, cast once.
    return (acc.to(torch.float32) * xs_ * ys_).to(out)
