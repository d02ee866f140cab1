"""DETR's ``HungarianMatcher`` for PyTorch (CPU and torch_xla tensors), a drop-in for
``facebookresearch/detr``'s ``models/matcher.py``: the same constructor, the same
``forward(outputs, targets)`` returning a list of ``(index_i, index_j)`` int64 tensors per
image, but the assignment runs in ``torch.ops.asickernels.linear_sum_assignment`` (on the
device, inside the torch_xla graph) instead of SciPy on the host.

:meth:`HungarianMatcher.match_padded` is the static-shape variant for training steps that
must not sync with the host: padded targets with a mask in, ``(assignment [B, Q],
num_assigned [B])`` out. ``forward`` reads the assignment on the host once, to build the
variable-length index lists DETR's loss takes. The cost is DETR's (see
:mod:`asickernels.matcher`), with the GIoU through
:func:`asickernels.torch.generalized_box_iou`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

import asickernels.torch as at


def box_cxcywh_to_xyxy(boxes: Tensor) -> Tensor:
    """``(cx, cy, w, h)`` -> ``(x1, y1, x2, y2)``, on the last dim (DETR's ``box_ops``)."""
    cx, cy, w, h = boxes.unbind(-1)
    return torch.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], dim=-1)


class HungarianMatcher(nn.Module):
    """DETR's matcher: one-to-one matching of queries to targets at the least
    ``cost_class * class cost + cost_bbox * L1 cost + cost_giou * GIoU cost``.

    Args:
      cost_class, cost_bbox, cost_giou: the weights (not all 0: ValueError, as DETR).
      backend: the asickernels backend of both ops (None: the selection policy's).
    """

    def __init__(
        self,
        cost_class: float = 1,
        cost_bbox: float = 1,
        cost_giou: float = 1,
        *,
        backend: str | None = None,
    ) -> None:
        super().__init__()
        if cost_class == 0 and cost_bbox == 0 and cost_giou == 0:
            raise ValueError("all costs can't be 0")
        self.cost_class, self.cost_bbox, self.cost_giou = cost_class, cost_bbox, cost_giou
        self.backend = backend

    @torch.no_grad()
    def matching_cost(
        self, pred_logits: Tensor, pred_boxes: Tensor, target_labels: Tensor, target_boxes: Tensor
    ) -> Tensor:
        """``pred_logits [B, Q, C]``, ``pred_boxes [B, Q, 4]``, ``target_labels [B, T]``,
        ``target_boxes [B, T, 4]`` (boxes ``(cx, cy, w, h)``) -> DETR's cost ``[B, Q, T]``."""
        prob = pred_logits.softmax(-1)
        index = target_labels.long()[:, None, :].expand(-1, prob.shape[1], -1)
        class_cost = -torch.gather(prob, 2, index)
        l1 = torch.cdist(pred_boxes, target_boxes.to(pred_boxes.dtype), p=1)
        giou = at.generalized_box_iou(
            box_cxcywh_to_xyxy(pred_boxes),
            box_cxcywh_to_xyxy(target_boxes.to(pred_boxes.dtype)),
            backend=self.backend,
        )
        return self.cost_bbox * l1 + self.cost_class * class_cost + self.cost_giou * -giou

    @torch.no_grad()
    def match_padded(
        self,
        pred_logits: Tensor,
        pred_boxes: Tensor,
        target_labels: Tensor,
        target_boxes: Tensor,
        target_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The static-shape matching: :meth:`matching_cost`, then
        :func:`asickernels.torch.linear_sum_assignment` with padded targets (``target_mask
        [B, T]`` False) masked out -> ``(assignment [B, Q]`` int32, the target of each
        query or -1; ``num_assigned [B]`` int32), on the inputs' device."""
        cost = self.matching_cost(pred_logits, pred_boxes, target_labels, target_boxes)
        mask = None if target_mask is None else target_mask.to(torch.bool)
        return at.linear_sum_assignment(cost, col_mask=mask, backend=self.backend)

    @torch.no_grad()
    def forward(
        self, outputs: Mapping[str, Tensor], targets: Sequence[Mapping[str, Tensor]]
    ) -> list[tuple[Tensor, Tensor]]:
        """DETR's signature: ``outputs = {"pred_logits": [B, Q, C], "pred_boxes": [B, Q,
        4]}``, ``targets`` a list of B ``{"labels": [T_i], "boxes": [T_i, 4]}`` -> a list of
        B ``(index_i, index_j)`` int64 tensors of length ``min(Q, T_i)``, ``index_i``
        ascending, on the inputs' device."""
        logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]
        batch, device = logits.shape[0], logits.device
        width = max([len(t["labels"]) for t in targets] + [1])
        labels = torch.zeros((batch, width), dtype=torch.int64, device=device)
        target_boxes = torch.zeros((batch, width, 4), dtype=boxes.dtype, device=device)
        mask = torch.zeros((batch, width), dtype=torch.bool, device=device)
        for b, target in enumerate(targets):
            count = len(target["labels"])
            labels[b, :count] = target["labels"].to(device)
            target_boxes[b, :count] = target["boxes"].to(device, boxes.dtype)
            mask[b, :count] = True
        assignment, _ = self.match_padded(logits, boxes, labels, target_boxes, mask)
        rows = assignment.cpu()
        pairs = []
        for row in rows:
            i = torch.nonzero(row >= 0).flatten()
            pairs.append((i.to(device), row[i].to(torch.int64).to(device)))
        return pairs
