"""The ops over a ``jax.sharding.Mesh``: each shard runs the ordinary op inside ``shard_map``.

Mosaic (Pallas TPU) kernels cannot be partitioned by the compiler, so the partitioning is
written out here: GIOU, the GIOU loss and NMS are data-parallel over their batch axes (NMS
is sequential along N, which therefore stays whole on each device), and the int8 matmul
shards M and N, and K with an exact int32 ``psum`` of the partial products.

Every function takes the same inputs as its op in :mod:`asickernels` plus ``mesh`` and the
partition of the inputs, validates the *global* inputs with the op's own checks, and returns
what the unsharded op returns (GIOU and NMS bit for bit; the loss up to float32 summation
order). ``backend`` picks the per-shard kernel and must be a JAX backend (``"xla"``,
``"pallas_tpu"``, ...).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

import asickernels
from asickernels.backends.xla.int8_matmul import dequantize
from asickernels.kernels.giou import Reduction

AxisName = str | tuple[str, ...] | None


def _axes_of(spec: PartitionSpec) -> tuple[str, ...]:
    """The mesh axis names a partition spec shards over, in order."""
    names: list[str] = []
    for entry in spec:
        if entry is None:
            continue
        names.extend((entry,) if isinstance(entry, str) else entry)
    return tuple(names)


def _check_spec(mesh: Mesh, spec: PartitionSpec, shape: Sequence[int], what: str) -> None:
    """``spec`` may shard only ``shape``'s dims, over axes of ``mesh``, evenly."""
    if len(spec) > len(shape):
        raise ValueError(
            f"{what}: partition spec {spec} has {len(spec)} entries but only {len(shape)} "
            f"dims ({tuple(shape)}) may be sharded"
        )
    used = _axes_of(spec)
    unknown = [name for name in used if name not in mesh.shape]
    if unknown:
        raise ValueError(f"{what}: mesh axes {unknown} are not in the mesh {dict(mesh.shape)}")
    if len(set(used)) != len(used):
        raise ValueError(f"{what}: partition spec {spec} uses a mesh axis twice")
    for dim, entry in zip(shape, spec, strict=False):
        ways = int(np.prod([mesh.shape[name] for name in _axes_of(PartitionSpec(entry))]))
        if dim % ways:
            raise ValueError(
                f"{what}: a dim of size {dim} cannot be split evenly {ways} ways ({entry!r}); "
                "pad it (and mask the padding) or change the mesh"
            )


def _validate(op: Callable[..., Any], *arrays: Any, **static: Any) -> Any:
    """Runs the op's own validation on the global shapes, without computing anything."""
    return jax.eval_shape(functools.partial(op, **static), *arrays)


def _run(
    body: Callable[..., Any], mesh: Mesh, in_specs: tuple[Any, ...], out_specs: Any, *arrays: Any
) -> Any:
    return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)(
        *arrays
    )


def giou(
    boxes1: Any,
    boxes2: Any,
    *,
    mesh: Mesh,
    batch_spec: PartitionSpec,
    backend: str | None = None,
    config: Any = None,
) -> jax.Array:
    """:func:`asickernels.giou` with the batch dims ``[...]`` partitioned by ``batch_spec``.

    ``boxes1, boxes2 [..., 4]`` -> ``[...]`` float32, sharded as ``batch_spec``. Differentiable.
    """
    options = {"backend": backend, "config": config}
    _validate(asickernels.giou, boxes1, boxes2, **options)
    _check_spec(mesh, batch_spec, np.shape(boxes1)[:-1], "boxes")
    box_spec = PartitionSpec(*batch_spec, *[None] * (np.ndim(boxes1) - len(batch_spec)))
    body = functools.partial(asickernels.giou, **options)
    return _run(body, mesh, (box_spec, box_spec), batch_spec, boxes1, boxes2)


def giou_loss(
    preds: Any,
    targets: Any,
    *,
    mesh: Mesh,
    batch_spec: PartitionSpec,
    mask: Any = None,
    reduction: Reduction = "mean",
    backend: str | None = None,
    config: Any = None,
) -> jax.Array:
    """:func:`asickernels.giou_loss` with the batch dims partitioned by ``batch_spec``.

    ``"mean"`` is the mean over the valid boxes of the whole global batch: each shard sums
    its loss and counts its valid boxes, and both are ``psum``-ed over the sharded axes
    before dividing (0 when no box anywhere is valid). ``"none"`` returns the per-box loss
    sharded as ``batch_spec``; ``"sum"`` and ``"mean"`` a replicated scalar. Differentiable.
    """
    options = {"backend": backend, "config": config}
    _validate(asickernels.giou_loss, preds, targets, mask=mask, reduction=reduction, **options)
    _check_spec(mesh, batch_spec, np.shape(preds)[:-1], "preds")
    box_spec = PartitionSpec(*batch_spec, *[None] * (np.ndim(preds) - len(batch_spec)))
    axes = _axes_of(batch_spec)

    def shard_loss(p: jax.Array, t: jax.Array, m: jax.Array | None = None) -> jax.Array:
        if reduction == "none":
            return asickernels.giou_loss(p, t, mask=m, reduction="none", **options)
        total = jax.lax.psum(asickernels.giou_loss(p, t, mask=m, reduction="sum", **options), axes)
        if reduction == "sum":
            return total
        valid = jnp.full(p.shape[:-1], True) if m is None else m != 0
        count = jax.lax.psum(valid.sum(dtype=jnp.int32), axes)
        return total / jnp.maximum(count, 1).astype(jnp.float32)

    out_spec = batch_spec if reduction == "none" else PartitionSpec()
    if mask is None:
        return _run(shard_loss, mesh, (box_spec, box_spec), out_spec, preds, targets)
    in_specs = (box_spec, box_spec, batch_spec)
    return _run(shard_loss, mesh, in_specs, out_spec, preds, targets, mask)


def nms(
    boxes: Any,
    scores: Any,
    *,
    mesh: Mesh,
    batch_spec: PartitionSpec,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float | None = None,
    backend: str | None = None,
    config: Any = None,
) -> tuple[jax.Array, jax.Array]:
    """:func:`asickernels.nms` with the batch dims of ``scores [..., N]`` partitioned by
    ``batch_spec`` (N itself stays whole: greedy NMS is sequential along it).

    Returns ``(indices [..., max_output_size], num_valid [...])`` sharded as ``batch_spec``.
    """
    return _sharded_nms(
        asickernels.nms, mesh, batch_spec, (boxes, scores),
        iou_threshold=iou_threshold, max_output_size=max_output_size,
        score_threshold=score_threshold, backend=backend, config=config,
    )  # fmt: skip


def batched_nms(
    boxes: Any,
    scores: Any,
    idxs: Any,
    *,
    mesh: Mesh,
    batch_spec: PartitionSpec,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float | None = None,
    backend: str | None = None,
    config: Any = None,
) -> tuple[jax.Array, jax.Array]:
    """:func:`asickernels.batched_nms` (per-category NMS) partitioned as :func:`nms`."""
    return _sharded_nms(
        asickernels.batched_nms, mesh, batch_spec, (boxes, scores, idxs),
        iou_threshold=iou_threshold, max_output_size=max_output_size,
        score_threshold=score_threshold, backend=backend, config=config,
    )  # fmt: skip


def _sharded_nms(
    op: Callable[..., tuple[jax.Array, jax.Array]],
    mesh: Mesh,
    batch_spec: PartitionSpec,
    arrays: tuple[Any, ...],
    **options: Any,
) -> tuple[jax.Array, jax.Array]:
    _validate(op, *arrays, **options)
    batch_shape = np.shape(arrays[1])[:-1]
    _check_spec(mesh, batch_spec, batch_shape, "scores (batch dims)")
    per_box = PartitionSpec(*batch_spec, *[None] * (len(batch_shape) + 1 - len(batch_spec)))
    boxes_spec = PartitionSpec(*per_box, None)
    in_specs = (boxes_spec, per_box, per_box)[: len(arrays)]
    return _run(functools.partial(op, **options), mesh, in_specs, (per_box, batch_spec), *arrays)


def int8_matmul(
    x: Any,
    y: Any,
    *,
    mesh: Mesh,
    m_axis: AxisName = None,
    k_axis: AxisName = None,
    n_axis: AxisName = None,
    x_scale: Any = None,
    y_scale: Any = None,
    out_dtype: Any = None,
    backend: str | None = None,
    config: Any = None,
) -> jax.Array:
    """:func:`asickernels.int8_matmul` of ``x [M, K]`` and ``y [K, N]`` with M, K and N
    sharded over the mesh axes ``m_axis``, ``k_axis`` and ``n_axis`` (None: not sharded).

    With K sharded, every shard computes its exact int32 partial product and the partials
    are summed with an int32 ``psum`` (exact, because the global K is limited to
    ``INT8_MATMUL_MAX_K``); the scales are applied once, after the sum, as the op does.

    Returns ``[M, N]`` (int32, or ``out_dtype``) sharded as ``P(m_axis, n_axis)``.
    """
    options = {"backend": backend, "config": config}
    out = _validate(
        asickernels.int8_matmul, x, y, x_scale=x_scale, y_scale=y_scale, out_dtype=out_dtype,
        **options,
    ).dtype  # fmt: skip
    (m, k), n = np.shape(x), np.shape(y)[1]
    _check_spec(mesh, PartitionSpec(m_axis, k_axis), (m, k), "x")
    _check_spec(mesh, PartitionSpec(k_axis, n_axis), (k, n), "y")
    if k_axis is not None and k > asickernels.INT8_MATMUL_MAX_K:
        raise ValueError(
            f"K = {k} exceeds {asickernels.INT8_MATMUL_MAX_K}: the int32 psum over the "
            "sharded K could overflow; leave K unsharded (the op then splits it exactly)"
        )
    scaled = out != np.int32
    scale_arrays = [s for s in (x_scale, y_scale) if s is not None]
    scale_specs = [
        PartitionSpec(axis) if np.ndim(s) else PartitionSpec()
        for s, axis in ((x_scale, m_axis), (y_scale, n_axis))
        if s is not None
    ]

    def shard_product(xb: jax.Array, yb: jax.Array, *scales: jax.Array) -> jax.Array:
        given = iter(scales)
        xs = next(given) if x_scale is not None else None
        ys = next(given) if y_scale is not None else None
        if k_axis is None:
            return asickernels.int8_matmul(
                xb, yb, x_scale=xs, y_scale=ys, out_dtype=out if scaled else None, **options
            )
        acc = jax.lax.psum(asickernels.int8_matmul(xb, yb, **options), k_axis)
        if not scaled:
            return acc
        return dequantize(acc, _vector(xs, xb.shape[0]), _vector(ys, yb.shape[1]), out)

    in_specs = (PartitionSpec(m_axis, k_axis), PartitionSpec(k_axis, n_axis), *scale_specs)
    return _run(shard_product, mesh, in_specs, PartitionSpec(m_axis, n_axis), x, y, *scale_arrays)


def _vector(scale: jax.Array | None, length: int) -> jax.Array:
    """A float32 ``[length]`` scale from None (ones), a scalar or a ``[length]`` shard."""
    value = jnp.float32(1.0) if scale is None else jnp.asarray(scale).astype(jnp.float32)
    return jnp.broadcast_to(value, (length,))
