"""Pairwise IoU/GIOU, paired DIoU/CIoU with their gradients, and the DIoU/CIoU losses: the
declarations (semantics: :mod:`asickernels.reference`, torchvision's formulas with
``eps = 1e-7``).

Kernel calling conventions (beside those in :mod:`asickernels.kernels.registry`):

* ``box_iou``, ``generalized_box_iou``: ``(boxes1 [B, N, 4], boxes2 [B, M, 4]) -> [B, N, M]``;
  B, N, M >= 1.
* ``diou``, ``ciou``: as ``giou``, ``[P, 4]`` x2 -> ``[P]``; ``diou_vjp``, ``ciou_vjp``: as
  ``giou_vjp``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from asickernels import reference
from asickernels.kernels import _checks
from asickernels.kernels.declaration import Array, Check, Op, Plan, Runner, Spec, array, cast
from asickernels.kernels.giou import (
    giou_vjp,
    masked_loss_op,
    metric_plan,
    paired_metric_op,
    paired_vjp_op,
)

# Pairwise ------------------------------------------------------------------------------------


def _check_pairwise(kernel: str) -> Check:
    def check(specs: Mapping[str, Spec | None], statics: Mapping[str, object]) -> Plan:
        a, b = _checks.required(specs, "boxes1"), _checks.required(specs, "boxes2")
        _checks.check_boxes(a, "boxes1", min_ndim=2)
        _checks.check_boxes(b, "boxes2", min_ndim=2)
        if a.shape[:-2] != b.shape[:-2]:
            raise ValueError(
                f"boxes1 [..., N, 4] and boxes2 [..., M, 4] must have the same leading dims, "
                f"got {a.shape} and {b.shape}"
            )
        return metric_plan(kernel, a.shape[:-1] + b.shape[-2:-1], a, b, paired=False)

    return check


def _compute_pairwise(runner: Runner, plan: Plan, boxes1: Array, boxes2: Array) -> Array:
    """Runs the kernel on ``[B, N, 4]``, ``[B, M, 4]`` views (one image when unbatched)."""
    out = plan.outputs
    assert isinstance(out, Spec)
    flat1 = cast(boxes1.reshape(-1, *boxes1.shape[-2:]), out.dtype)
    flat2 = cast(boxes2.reshape(-1, *boxes2.shape[-2:]), out.dtype)
    assert plan.kernel is not None
    return cast(runner.kernel(plan.kernel)(flat1, flat2), out.dtype).reshape(out.shape)


def _pairwise_giou_vjp(
    arrays: Mapping[str, Array | None],
    statics: Mapping[str, object],
    backend: str | None,
    cotangent: Array,
) -> tuple[Array, Array]:
    """The paired :func:`giou_vjp` on every pair, summed over the other side's boxes."""
    import jax
    import jax.numpy as jnp

    on_device = any(isinstance(a, jax.Array) for a in (*arrays.values(), cotangent))
    xp: Any = jnp if on_device else np
    shape = tuple(cotangent.shape) + (4,)
    b1 = xp.broadcast_to(xp.asarray(arrays["boxes1"])[..., :, None, :], shape)
    b2 = xp.broadcast_to(xp.asarray(arrays["boxes2"])[..., None, :, :], shape)
    d1, d2 = giou_vjp(b1, b2, cotangent, backend=backend)
    return d1.sum(-2), d2.sum(-3)


_PAIRWISE_DOC = """{what} of every pair of boxes, as torchvision's ``{torchvision}`` (with
    ``eps = 1e-7`` in the denominators: degenerate boxes give finite values).

    Args:
      boxes1: ``[..., N, 4]`` boxes ``(x1, y1, x2, y2)``; float32, bfloat16 or float16
        (computed in float32), or float64 (computed in float64).
      boxes2: ``[..., M, 4]``, the same leading dims.
      backend, config: see :func:`asickernels.giou`.

    Returns:
      ``[..., N, M]`` float32 (float64 for float64 boxes).{gradient}
    """

box_iou = Op(
    "box_iou",
    [array("boxes1", 2), array("boxes2", 2)],
    check=_check_pairwise("box_iou"),
    compute=_compute_pairwise,
    reference=reference.box_iou,
    doc=_PAIRWISE_DOC.format(
        what="IoU",
        torchvision="box_iou",
        gradient=" Differentiable with ``jax.grad`` on the JAX backends.",
    ),
)

generalized_box_iou = Op(
    "generalized_box_iou",
    [array("boxes1", 2), array("boxes2", 2)],
    check=_check_pairwise("generalized_box_iou"),
    compute=_compute_pairwise,
    reference=reference.generalized_box_iou,
    vjp=_pairwise_giou_vjp,
    differentiable=("boxes1", "boxes2"),
    doc=_PAIRWISE_DOC.format(
        what="Generalized IoU",
        torchvision="generalized_box_iou",
        gradient=" Differentiable (``jax.grad`` on the JAX backends; PyTorch autograd runs the "
        "paired ``giou_vjp`` on every pair). ``-generalized_box_iou(pred, target)`` is DETR's "
        "matching cost.",
    ),
)


# Paired DIoU / CIoU ------------------------------------------------------------------------


def _vjp_doc(metric: str) -> str:
    return f"""Gradient of ``sum(cotangent * {metric}(boxes1, boxes2))`` with respect to both
    inputs{" (``alpha`` held constant, as torchvision and the CIoU paper do)" if metric == "ciou" else ""}.

    ``boxes1, boxes2 [..., 4]``, ``cotangent [...]`` -> ``(d_boxes1, d_boxes2)`` ``[..., 4]``,
    float32 (float64 for float64 boxes). JAX backends differentiate their ``{metric}`` kernel.
    """


def _metric_doc(metric: str, what: str) -> str:
    return f"""{what} of paired boxes.

    Args:
      boxes1, boxes2: ``[..., 4]`` boxes ``(x1, y1, x2, y2)``, same shape; float32, bfloat16
        or float16 (computed in float32), or float64 (computed in float64).
      backend, config: see :func:`asickernels.giou`.

    Returns:
      ``[...]`` float32 (float64 for float64 inputs), equal to ``1 -
      torchvision.ops.{"distance" if metric == "diou" else "complete"}_box_iou_loss`` (up to
      ``eps``). Differentiable with ``jax.grad`` on the JAX backends.
    """


def _loss_doc(metric: str) -> str:
    return f"""``1 - {metric}(preds, targets)`` over the valid (non-padding) boxes, with
    :func:`asickernels.giou_loss`'s ``mask`` and ``reduction`` (padding may hold anything,
    even NaN: its loss and gradient are exactly 0; ``"mean"`` is 0 when no box is valid).

    Returns:
      float32 loss (float64 for float64 boxes): ``[...]`` for ``"none"``, else a scalar.
    """


diou_vjp = paired_vjp_op("diou", reference=reference.diou_vjp, doc=_vjp_doc("diou"))
ciou_vjp = paired_vjp_op("ciou", reference=reference.ciou_vjp, doc=_vjp_doc("ciou"))
diou = paired_metric_op(
    "diou", reference=reference.diou, vjp=diou_vjp, doc=_metric_doc("diou", "Distance IoU (DIoU)")
)
ciou = paired_metric_op(
    "ciou", reference=reference.ciou, vjp=ciou_vjp, doc=_metric_doc("ciou", "Complete IoU (CIoU)")
)
diou_loss = masked_loss_op(
    "diou", reference=reference.diou_loss, vjp=diou_vjp, doc=_loss_doc("diou")
)
ciou_loss = masked_loss_op(
    "ciou", reference=reference.ciou_loss, vjp=ciou_vjp, doc=_loss_doc("ciou")
)
