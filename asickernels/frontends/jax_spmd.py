"""The ops over a ``jax.sharding.Mesh``: each shard runs the ordinary op inside ``shard_map``.

Mosaic (Pallas TPU) kernels cannot be partitioned by the compiler, so the partitioning is
written out here: GIOU, the GIOU loss and NMS are data-parallel over their batch axes (NMS
is sequential along N, which therefore stays whole on each device), and the int8 matmul
shards M and N, and K with an exact int32 ``psum`` of the partial products.

Each function takes its op's arguments (:data:`asickernels.OPS`) plus ``mesh`` and the
partition, and runs the rule its op's ``partition`` names: ``"batch"`` (every array split
along its leading batch dims as ``batch_spec``; the op's ``core_ndim`` per array says
which dims those are), ``"loss"`` (batch, with the reduction finished across shards) and
``"matmul"`` (``m_axis``/``k_axis``/``n_axis``). Each validates the *global* inputs with
the op's own checks and returns what the unsharded op returns (NMS and int8 exactly; GIOU
and the loss up to float32 rounding: the shards and the whole are compiled apart).
``backend`` picks the per-shard kernel and must be a JAX backend (``"xla"``,
``"pallas_tpu"``, ...); ``config`` is the per-shard kernel's, as in the unsharded op.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt
from jax.sharding import Mesh, PartitionSpec
from jax.typing import ArrayLike

import asickernels
from asickernels.backends.xla.int8_matmul import dequantize
from asickernels.frontends import run_rule, sharded_ops
from asickernels.kernels.declaration import Op, Plan, Spec

AxisName = str | tuple[str, ...] | None
Arrays = dict[str, ArrayLike | None]  # an op's array arguments by name
Outputs = jax.Array | tuple[jax.Array, ...]


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


def _validate(op: Op, arrays: Arrays, statics: dict[str, object]) -> Plan:
    """Runs the op's own validation on the global shapes, without computing anything."""
    specs = {
        n: None if a is None else Spec(np.shape(a), np.result_type(a)) for n, a in arrays.items()
    }
    return op.plan(specs, **statics)


def _run(
    body: Callable[..., Outputs],
    mesh: Mesh,
    in_specs: tuple[PartitionSpec, ...],
    out_specs: PartitionSpec | tuple[PartitionSpec, ...],
    *arrays: ArrayLike,
) -> Outputs:
    return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)(
        *arrays
    )


def _batch_rule(
    op: Op, mesh: Mesh, batch_spec: PartitionSpec, arrays: Arrays, options: dict[str, object]
) -> Outputs:
    """Each shard runs ``op`` on its slice of the leading batch dims; outputs keep them."""
    params = {p.name: p for p in op.params}
    present = {n: a for n, a in arrays.items() if a is not None}
    first = next(iter(present))
    batch_shape = np.shape(present[first])[: np.ndim(present[first]) - params[first].core_ndim]
    _check_spec(mesh, batch_spec, batch_shape, f"{first} (batch dims)")
    plan = _validate(op, arrays, {k: v for k, v in options.items() if k in op.static_names})
    # Unlisted trailing dims are whole on every device: one spec serves every array.
    in_specs = (batch_spec,) * len(present)
    out_specs = tuple(batch_spec for _ in plan.output_list())

    def body(*local: jax.Array) -> Outputs:
        return op(**dict(zip(present, local, strict=True)), **options)

    return _run(
        body, mesh, in_specs, out_specs if len(out_specs) > 1 else out_specs[0], *present.values()
    )


def _loss_rule(
    op: Op, mesh: Mesh, batch_spec: PartitionSpec, arrays: Arrays, options: dict[str, object]
) -> Outputs:
    """A masked loss: per-box losses per shard; ``"sum"`` and ``"mean"`` (over the valid
    boxes of the whole global batch, 0 when there are none) are ``psum``-ed over the
    sharded axes before dividing. ``"none"`` is sharded as ``batch_spec``."""
    reduction = options["reduction"]
    present = {n: a for n, a in arrays.items() if a is not None}
    first = next(iter(present))
    batch_shape = np.shape(present[first])[:-1]
    _check_spec(mesh, batch_spec, batch_shape, first)
    axes = _axes_of(batch_spec)
    box_spec = PartitionSpec(*batch_spec, *[None] * (len(batch_shape) + 1 - len(batch_spec)))
    in_specs = tuple(
        box_spec if np.ndim(a) > len(batch_shape) else batch_spec for a in present.values()
    )

    def shard_loss(*local: jax.Array) -> jax.Array:
        given = dict(zip(present, local, strict=True))
        if reduction == "none":
            return op(**given, **options)
        total = jax.lax.psum(op(**given, **{**options, "reduction": "sum"}), axes)
        if reduction == "sum":
            return total
        mask = given.get("mask")
        valid = jnp.full(given[first].shape[:-1], True) if mask is None else mask != 0
        count = jax.lax.psum(valid.sum(dtype=jnp.int32), axes)
        return total / jnp.maximum(count, 1).astype(total.dtype)

    out_spec = batch_spec if reduction == "none" else PartitionSpec()
    return _run(shard_loss, mesh, in_specs, out_spec, *present.values())


def _matmul_rule(
    op: Op,
    mesh: Mesh,
    axes: tuple[AxisName, AxisName, AxisName],
    arrays: Arrays,
    options: dict[str, object],
) -> Outputs:
    """int8 matmul with M, K and N sharded over the mesh axes ``(m_axis, k_axis, n_axis)``.

    With K sharded, every shard computes its exact int32 partial product and the partials
    are summed with an int32 ``psum`` (exact, because the global K is limited to
    ``INT8_MATMUL_MAX_K``); the scales are applied once, after the sum, as the op does.
    Returns ``[M, N]`` (int32, or ``out_dtype``) sharded as ``P(m_axis, n_axis)``."""
    m_axis, k_axis, n_axis = axes
    x, y, x_scale, y_scale = (arrays[n] for n in ("x", "y", "x_scale", "y_scale"))
    out_dtype = options.pop("out_dtype")
    out = _validate(op, arrays, {"out_dtype": out_dtype}).outputs.dtype  # type: ignore[union-attr]
    assert x is not None and y is not None  # required: validation refused None
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
            return op(xb, yb, x_scale=xs, y_scale=ys, out_dtype=out if scaled else None, **options)
        acc = jax.lax.psum(op(xb, yb, **options), k_axis)
        if not scaled:
            return acc
        return dequantize(acc, _vector(xs, xb.shape[0]), _vector(ys, yb.shape[1]), out)

    in_specs = (PartitionSpec(m_axis, k_axis), PartitionSpec(k_axis, n_axis), *scale_specs)
    return _run(shard_product, mesh, in_specs, PartitionSpec(m_axis, n_axis), x, y, *scale_arrays)


def _vector(scale: jax.Array | None, length: int) -> jax.Array:
    """A float32 ``[length]`` scale from None (ones), a scalar or a ``[length]`` shard."""
    value = jnp.float32(1.0) if scale is None else jnp.asarray(scale).astype(jnp.float32)
    return jnp.broadcast_to(value, (length,))


_RULES: dict[str, Callable[..., Outputs]] = {
    "batch": _batch_rule,
    "loss": _loss_rule,
    "matmul": _matmul_rule,
}


__all__ = [op.name for op in sharded_ops()]  # the functions below


# -- generated by asickernels/frontends/generate.py from the op declarations: do not edit --


def batched_nms(
    boxes: ArrayLike,
    scores: ArrayLike,
    idxs: ArrayLike,
    *,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float | None = None,
    mesh: Mesh,
    batch_spec: PartitionSpec,
    backend: str | None = None,
    config: object = None,
) -> tuple[jax.Array, jax.Array]:
    """:func:`asickernels.batched_nms` over ``mesh``, split along the batch dims as
    ``batch_spec``."""
    return run_rule(_RULES, asickernels.batched_nms, locals())


def box_iou(
    boxes1: ArrayLike,
    boxes2: ArrayLike,
    *,
    mesh: Mesh,
    batch_spec: PartitionSpec,
    backend: str | None = None,
    config: object = None,
) -> jax.Array:
    """:func:`asickernels.box_iou` over ``mesh``, split along the batch dims as ``batch_spec``."""
    return run_rule(_RULES, asickernels.box_iou, locals())


def ciou(
    boxes1: ArrayLike,
    boxes2: ArrayLike,
    *,
    mesh: Mesh,
    batch_spec: PartitionSpec,
    backend: str | None = None,
    config: object = None,
) -> jax.Array:
    """:func:`asickernels.ciou` over ``mesh``, split along the batch dims as ``batch_spec``."""
    return run_rule(_RULES, asickernels.ciou, locals())


def ciou_loss(
    preds: ArrayLike,
    targets: ArrayLike,
    *,
    mask: ArrayLike | None = None,
    reduction: str = "mean",
    mesh: Mesh,
    batch_spec: PartitionSpec,
    backend: str | None = None,
    config: object = None,
) -> jax.Array:
    """:func:`asickernels.ciou_loss` over ``mesh``, split along the batch dims as
    ``batch_spec``; ``"sum"`` and ``"mean"`` reduce across the shards (the mean over the valid
    boxes of the global batch)."""
    return run_rule(_RULES, asickernels.ciou_loss, locals())


def ciou_vjp(
    boxes1: ArrayLike,
    boxes2: ArrayLike,
    cotangent: ArrayLike,
    *,
    mesh: Mesh,
    batch_spec: PartitionSpec,
    backend: str | None = None,
    config: object = None,
) -> tuple[jax.Array, jax.Array]:
    """:func:`asickernels.ciou_vjp` over ``mesh``, split along the batch dims as ``batch_spec``."""
    return run_rule(_RULES, asickernels.ciou_vjp, locals())


def diou(
    boxes1: ArrayLike,
    boxes2: ArrayLike,
    *,
    mesh: Mesh,
    batch_spec: PartitionSpec,
    backend: str | None = None,
    config: object = None,
) -> jax.Array:
    """:func:`asickernels.diou` over ``mesh``, split along the batch dims as ``batch_spec``."""
    return run_rule(_RULES, asickernels.diou, locals())


def diou_loss(
    preds: ArrayLike,
    targets: ArrayLike,
    *,
    mask: ArrayLike | None = None,
    reduction: str = "mean",
    mesh: Mesh,
    batch_spec: PartitionSpec,
    backend: str | None = None,
    config: object = None,
) -> jax.Array:
    """:func:`asickernels.diou_loss` over ``mesh``, split along the batch dims as
    ``batch_spec``; ``"sum"`` and ``"mean"`` reduce across the shards (the mean over the valid
    boxes of the global batch)."""
    return run_rule(_RULES, asickernels.diou_loss, locals())


def diou_vjp(
    boxes1: ArrayLike,
    boxes2: ArrayLike,
    cotangent: ArrayLike,
    *,
    mesh: Mesh,
    batch_spec: PartitionSpec,
    backend: str | None = None,
    config: object = None,
) -> tuple[jax.Array, jax.Array]:
    """:func:`asickernels.diou_vjp` over ``mesh``, split along the batch dims as ``batch_spec``."""
    return run_rule(_RULES, asickernels.diou_vjp, locals())


def generalized_box_iou(
    boxes1: ArrayLike,
    boxes2: ArrayLike,
    *,
    mesh: Mesh,
    batch_spec: PartitionSpec,
    backend: str | None = None,
    config: object = None,
) -> jax.Array:
    """:func:`asickernels.generalized_box_iou` over ``mesh``, split along the batch dims as
    ``batch_spec``."""
    return run_rule(_RULES, asickernels.generalized_box_iou, locals())


def giou(
    boxes1: ArrayLike,
    boxes2: ArrayLike,
    *,
    mesh: Mesh,
    batch_spec: PartitionSpec,
    backend: str | None = None,
    config: object = None,
) -> jax.Array:
    """:func:`asickernels.giou` over ``mesh``, split along the batch dims as ``batch_spec``."""
    return run_rule(_RULES, asickernels.giou, locals())


def giou_loss(
    preds: ArrayLike,
    targets: ArrayLike,
    *,
    mask: ArrayLike | None = None,
    reduction: str = "mean",
    mesh: Mesh,
    batch_spec: PartitionSpec,
    backend: str | None = None,
    config: object = None,
) -> jax.Array:
    """:func:`asickernels.giou_loss` over ``mesh``, split along the batch dims as
    ``batch_spec``; ``"sum"`` and ``"mean"`` reduce across the shards (the mean over the valid
    boxes of the global batch)."""
    return run_rule(_RULES, asickernels.giou_loss, locals())


def giou_vjp(
    boxes1: ArrayLike,
    boxes2: ArrayLike,
    cotangent: ArrayLike,
    *,
    mesh: Mesh,
    batch_spec: PartitionSpec,
    backend: str | None = None,
    config: object = None,
) -> tuple[jax.Array, jax.Array]:
    """:func:`asickernels.giou_vjp` over ``mesh``, split along the batch dims as ``batch_spec``."""
    return run_rule(_RULES, asickernels.giou_vjp, locals())


def int8_matmul(
    x: ArrayLike,
    y: ArrayLike,
    *,
    x_scale: ArrayLike | None = None,
    y_scale: ArrayLike | None = None,
    out_dtype: npt.DTypeLike | None = None,
    mesh: Mesh,
    m_axis: AxisName = None,
    k_axis: AxisName = None,
    n_axis: AxisName = None,
    backend: str | None = None,
    config: object = None,
) -> jax.Array:
    """:func:`asickernels.int8_matmul` over ``mesh``, with M, K and N split over the mesh axes
    ``m_axis``, ``k_axis`` and ``n_axis`` (None: whole on every device); the result is sharded
    as ``P(m_axis, n_axis)``."""
    return run_rule(_RULES, asickernels.int8_matmul, locals())


def linear_sum_assignment(
    cost: ArrayLike,
    *,
    row_mask: ArrayLike | None = None,
    col_mask: ArrayLike | None = None,
    mesh: Mesh,
    batch_spec: PartitionSpec,
    backend: str | None = None,
    config: object = None,
) -> tuple[jax.Array, jax.Array]:
    """:func:`asickernels.linear_sum_assignment` over ``mesh``, split along the batch dims as
    ``batch_spec``."""
    return run_rule(_RULES, asickernels.linear_sum_assignment, locals())


def nms(
    boxes: ArrayLike,
    scores: ArrayLike,
    *,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float | None = None,
    mesh: Mesh,
    batch_spec: PartitionSpec,
    backend: str | None = None,
    config: object = None,
) -> tuple[jax.Array, jax.Array]:
    """:func:`asickernels.nms` over ``mesh``, split along the batch dims as ``batch_spec``."""
    return run_rule(_RULES, asickernels.nms, locals())
