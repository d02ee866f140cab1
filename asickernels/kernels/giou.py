"""GIOU of paired boxes, its gradient, and the masked GIOU loss."""

from __future__ import annotations

from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from asickernels.kernels import _checks, registry

Reduction = Literal["none", "sum", "mean"]
# Padding boxes are replaced by this box on both sides before GIOU runs, so that whatever
# the padding holds (zeros, NaN) the loss and its gradient there are exactly 0.
_SAFE_BOX = (0.0, 0.0, 1.0, 1.0)


def _check_pair(boxes1: Any, boxes2: Any) -> tuple[Any, Any]:
    boxes1 = _checks.as_array(boxes1, "boxes1")
    boxes2 = _checks.as_array(boxes2, "boxes2")
    _checks.check_boxes(boxes1, "boxes1")
    _checks.check_boxes(boxes2, "boxes2")
    if boxes1.shape != boxes2.shape:
        raise ValueError(
            f"boxes1 and boxes2 must have the same shape (paired boxes), got "
            f"{tuple(boxes1.shape)} and {tuple(boxes2.shape)}"
        )
    return boxes1, boxes2


def _run_giou(chosen: registry.Backend, boxes1: Any, boxes2: Any, config: Any) -> Any:
    """Flattens ``[..., 4]`` to ``[P, 4]``, runs the backend, restores the batch shape.
    Returns the backend's own array kind (numpy or jax)."""
    batch_shape = tuple(boxes1.shape[:-1])
    xp = jnp if chosen.array_kind == "jax" else np
    if _checks.size(batch_shape) == 0:
        return xp.zeros(batch_shape, xp.float32)
    flat1, flat2 = registry.to_backend_arrays(chosen, [boxes1, boxes2])
    impl = registry.implementation("giou", chosen.name)
    out = impl(flat1.reshape(-1, 4), flat2.reshape(-1, 4), config=config)
    return out.reshape(batch_shape)


def giou(boxes1: Any, boxes2: Any, *, backend: str | None = None, config: Any = None) -> jax.Array:
    """Generalized IoU of paired boxes.

    Args:
      boxes1, boxes2: ``[..., 4]`` boxes ``(x1, y1, x2, y2)``, same shape; float32 or
        bfloat16 (float16/float64 accepted), computed in float32.
      backend: a name from :func:`asickernels.available_backends`, or None for the best one
        for where the inputs live.
      config: backend-specific tuning (e.g. block sizes); None uses the backend's defaults.

    Returns:
      ``[...]`` float32 GIOU in ``[-1, 1]``, equal to ``1 - torchvision.ops.
      generalized_box_iou_loss``. Differentiable with ``jax.grad`` on the JAX backends.
    """
    boxes1, boxes2 = _check_pair(boxes1, boxes2)
    chosen = registry.resolve("giou", backend, [boxes1, boxes2])
    return registry.to_jax(_run_giou(chosen, boxes1, boxes2, config), jnp.float32)


def giou_vjp(
    boxes1: Any, boxes2: Any, cotangent: Any, *, backend: str | None = None, config: Any = None
) -> tuple[jax.Array, jax.Array]:
    """Gradient of ``sum(cotangent * giou(boxes1, boxes2))`` with respect to both inputs.

    ``boxes1, boxes2 [..., 4]``, ``cotangent [...]`` -> ``(d_boxes1, d_boxes2)``, float32
    ``[..., 4]``. Backends that register a ``giou_vjp`` kernel (the host backends) use it;
    the JAX backends differentiate their ``giou`` (a ``custom_vjp`` kernel on Pallas).
    """
    boxes1, boxes2 = _check_pair(boxes1, boxes2)
    cotangent = _checks.as_array(cotangent, "cotangent")
    _checks.check_float(cotangent, "cotangent")
    if tuple(cotangent.shape) != tuple(boxes1.shape[:-1]):
        raise ValueError(
            f"cotangent must have shape {tuple(boxes1.shape[:-1])}, got {tuple(cotangent.shape)}"
        )
    chosen = registry.resolve("giou", backend, [boxes1, boxes2])
    if chosen.array_kind == "jax" and chosen.name not in registry.backends_for("giou_vjp"):
        b1, b2, ct = registry.to_backend_arrays(chosen, [boxes1, boxes2, cotangent])
        _, pullback = jax.vjp(lambda a, b: _run_giou(chosen, a, b, config), b1, b2)
        d1, d2 = pullback(ct.astype(jnp.float32))
    elif _checks.size(tuple(boxes1.shape[:-1])) == 0:
        d1 = d2 = jnp.zeros(boxes1.shape, jnp.float32)
    else:
        b1, b2, ct = registry.to_backend_arrays(chosen, [boxes1, boxes2, cotangent])
        impl = registry.implementation("giou_vjp", chosen.name)
        d1, d2 = impl(b1.reshape(-1, 4), b2.reshape(-1, 4), ct.reshape(-1), config=config)
        d1, d2 = d1.reshape(boxes1.shape), d2.reshape(boxes1.shape)
    return registry.to_jax(d1, jnp.float32), registry.to_jax(d2, jnp.float32)


def differentiable_backends() -> list[str]:
    """Backends :func:`giou_vjp` can run on: JAX backends, differentiated through their
    ``giou``, and host backends that register a ``giou_vjp`` kernel."""
    with_vjp = set(registry.backends_for("giou_vjp"))
    return [
        name
        for name in registry.backends_for("giou")
        if name in with_vjp or registry.backend(name).array_kind == "jax"
    ]


def giou_loss(
    preds: Any,
    targets: Any,
    *,
    mask: Any = None,
    reduction: Reduction = "mean",
    backend: str | None = None,
    config: Any = None,
) -> jax.Array:
    """``1 - giou(preds, targets)`` over the valid (non-padding) boxes.

    Args:
      preds, targets: ``[..., 4]`` boxes, same shape (see :func:`giou`).
      mask: ``[...]`` bool (or 0/1), True where the box is real; None means all are. Padding
        boxes may hold anything (even NaN): their loss and gradient are exactly 0.
      reduction: ``"none"`` -> ``[...]`` per-box loss (0 at padding); ``"sum"``; ``"mean"``
        over valid boxes, 0 (not NaN) when there are none.

    Returns:
      float32 loss: ``[...]`` for ``"none"``, else a scalar.
    """
    preds, targets = _check_pair(preds, targets)
    if reduction not in ("none", "sum", "mean"):
        raise ValueError(f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")
    batch_shape = tuple(preds.shape[:-1])
    if mask is not None:
        mask = _checks.as_array(mask, "mask")
        if tuple(mask.shape) != batch_shape:
            raise ValueError(f"mask must have shape {batch_shape}, got {tuple(mask.shape)}")
        if not (np.issubdtype(mask.dtype, np.number) or mask.dtype == np.bool_):
            raise TypeError(f"mask must be bool or numeric, got dtype {mask.dtype}")
    chosen = registry.resolve("giou", backend, [preds, targets])
    xp: Any = jnp if chosen.array_kind == "jax" else np
    preds, targets, mask = registry.to_backend_arrays(chosen, [preds, targets, mask])
    if mask is None:
        valid = xp.ones(batch_shape, bool)
    else:
        valid = mask != 0
        safe = xp.asarray(_SAFE_BOX, preds.dtype)
        preds = xp.where(valid[..., None], preds, safe)
        targets = xp.where(valid[..., None], targets, safe)
    loss = xp.where(valid, 1.0 - _run_giou(chosen, preds, targets, config).astype(xp.float32), 0.0)
    if reduction == "sum":
        loss = loss.sum()
    elif reduction == "mean":
        count = valid.sum()
        loss = loss.sum() / xp.maximum(count, 1)
    return registry.to_jax(loss, jnp.float32)
