"""Training losses of torchvision's detection models with static shapes, for XLA devices.

:func:`asickernels.torch.detection.xla_ready` binds :func:`training_forward` as the model's
``forward``: in train mode it computes the losses torchvision's code computes, but with
shapes fixed by the inputs alone (no ``nonzero``, no boolean indexing, no ``.item()``), so
that forward, losses and backward are one XLA graph with no CPU fallback and no host sync.
Eval mode runs the model's own forward (with :mod:`~asickernels.torch.detection`'s
post-processing).

- Targets are padded to the batch's largest box count ``M``; a target row whose label is
  negative is padding too (so that batches padded to a fixed ``M`` with
  :func:`pad_targets` compile once).
- Matching (torchvision's ``Matcher`` with its thresholds and ``allow_low_quality_matches``,
  FCOS's center sampling) runs on ``[B, M, N]`` quality matrices, padded rows masked.
- Losses are sums over every anchor (or sampled RoI) times a 0/1 mask, divided by the
  counts torchvision divides by (tensors, not Python ints).
- Sampling (Faster R-CNN's ``BalancedPositiveNegativeSampler``): every candidate draws a
  uniform random key on the device (``torch.rand``: torch_xla's RNG, new values every
  step without a recompile); the positives with the ``int(batch * fraction)`` largest keys
  are taken, then the negatives with the largest keys up to ``batch`` in all: torchvision's
  counts (``min(positives, batch * fraction)``, the rest negatives), and like
  ``randperm`` a uniformly random subset of each. Its results are a fixed number of
  slots with a validity mask.
- Faster and Mask R-CNN's RPN passes its ``post_nms_top_n`` (training) best proposals per
  image on, padded and masked, to the RoI heads, which add the ground-truth boxes as
  torchvision does; Mask R-CNN's mask targets are cut from the ground truth masks by
  asickernels' ``roi_align``. SSD's hard negatives are ranked by a sort, as torchvision's.
- torchvision's check for degenerate target boxes (a host sync) is not run.
- FPN backbones upsample with index selects (:func:`_fpn_forward`): the same values, and a
  backward torch_xla lowers off TPU too.
"""

from __future__ import annotations

import types
from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
import torchvision.ops
from torch import Tensor
from torchvision.models.detection import FCOS, FasterRCNN, RetinaNet, _utils
from torchvision.models.detection.image_list import ImageList
from torchvision.models.detection.roi_heads import RoIHeads
from torchvision.models.detection.rpn import RegionProposalNetwork, concat_box_prediction_layers
from torchvision.models.detection.ssd import SSD
from torchvision.ops import boxes as box_ops
from torchvision.ops.feature_pyramid_network import FeaturePyramidNetwork

from asickernels.torch import vision

__all__ = ["add_training_forward", "match", "pad_targets", "sample", "training_forward"]

BELOW_LOW_THRESHOLD = _utils.Matcher.BELOW_LOW_THRESHOLD
BETWEEN_THRESHOLDS = _utils.Matcher.BETWEEN_THRESHOLDS


def pad_targets(targets: Sequence[dict[str, Tensor]], num_boxes: int) -> list[dict[str, Tensor]]:
    """``targets`` (torchvision's per-image ``boxes [M_i, 4]``, ``labels [M_i]``) with
    ``num_boxes`` rows each: zero boxes of label -1 appended, which the training losses
    ignore. Batches padded to one ``num_boxes`` have one shape, so one compiled graph.
    Other keys are kept as they are. Nothing is modified in place.

    Raises:
      TypeError: ``targets`` is not a sequence of dicts with tensor ``boxes`` and
        ``labels``, or ``num_boxes`` is not an int.
      ValueError: an image has more than ``num_boxes`` boxes, or boxes not ``[M_i, 4]``.
    """
    if not isinstance(num_boxes, int) or isinstance(num_boxes, bool):
        raise TypeError(f"num_boxes must be an int, got {num_boxes!r}")
    if not isinstance(targets, Sequence) or not all(
        isinstance(t, dict)
        and isinstance(t.get("boxes"), Tensor)
        and isinstance(t.get("labels"), Tensor)
        for t in targets
    ):
        raise TypeError("targets must be a sequence of dicts with tensors 'boxes' and 'labels'")
    padded = []
    for target in targets:
        boxes, labels = target["boxes"], target["labels"]
        if boxes.ndim != 2 or boxes.shape[1] != 4 or labels.shape != boxes.shape[:1]:
            raise ValueError(
                f"targets' boxes must be [M, 4] and labels [M], got {tuple(boxes.shape)} "
                f"and {tuple(labels.shape)}"
            )
        extra = num_boxes - len(boxes)
        if extra < 0:
            raise ValueError(f"an image has {len(boxes)} boxes, more than num_boxes={num_boxes}")
        extended = {
            "boxes": F.pad(boxes, (0, 0, 0, extra)),
            "labels": F.pad(labels, (0, extra), value=-1),
        }
        if isinstance(target.get("masks"), Tensor):
            extended["masks"] = F.pad(target["masks"], (0, 0, 0, 0, 0, extra))
        padded.append(target | extended)
    return padded


class _GroundTruth(NamedTuple):
    """The batch's targets, stacked and padded to ``M`` boxes per image."""

    boxes: Tensor  # [B, M, 4]
    labels: Tensor  # [B, M] int64
    valid: Tensor  # [B, M], False at padding


def _stacked_targets(targets: Sequence[dict[str, Tensor]]) -> _GroundTruth:
    """Per-image targets -> their :class:`_GroundTruth`, ``M`` the largest box count (at
    least 1), padding rows invalid."""
    most = max(1, *(len(t["boxes"]) for t in targets))
    boxes = torch.stack([F.pad(t["boxes"], (0, 0, 0, most - len(t["boxes"]))) for t in targets])
    labels = torch.stack(
        [
            F.pad(t["labels"].to(torch.int64), (0, most - len(t["labels"])), value=-1)
            for t in targets
        ]
    )
    return _GroundTruth(boxes, labels, labels >= 0)


def _stacked_masks(targets: Sequence[dict[str, Tensor]], num_boxes: int) -> Tensor:
    """Per-image ``masks [M_i, H_i, W_i]`` -> float ``[B, num_boxes, H, W]``: zero masks
    appended, and each image's last row and column repeated up to the largest size (RoIs
    lie in their image, and roi_align reads a sample in the last pixel's far half as that
    pixel, as torchvision does without the padding)."""
    height = max(t["masks"].shape[1] for t in targets)
    width = max(t["masks"].shape[2] for t in targets)
    stacked = []
    for target in targets:
        masks = target["masks"].to(torch.float32)
        masks = F.pad(masks, (0, 0, 0, 0, 0, num_boxes - len(masks)))
        grow = (0, width - masks.shape[2], 0, height - masks.shape[1])
        stacked.append(F.pad(masks[None], grow, mode="replicate")[0] if any(grow) else masks)
    return torch.stack(stacked)


def _gather_rows(values: Tensor, indices: Tensor) -> Tensor:
    """``values [B, M, ...]`` at ``indices [B, N]`` (clamped to ``>= 0``) -> ``[B, N, ...]``."""
    index = indices.clamp(min=0)
    index = index.reshape(*index.shape, *(1,) * (values.ndim - 2)).expand(
        *index.shape, *values.shape[2:]
    )
    return torch.gather(values, 1, index)


def _box_iou(gt_boxes: Tensor, boxes: Tensor) -> Tensor:
    """torchvision's ``box_iou`` per image: ``[B, M, 4]``, ``[B, N, 4]`` -> ``[B, M, N]``."""
    return torch.stack([box_ops.box_iou(g, b) for g, b in zip(gt_boxes, boxes, strict=True)])


def match(matcher: _utils.Matcher, quality: Tensor, gt_valid: Tensor) -> Tensor:
    """torchvision's ``Matcher`` (its thresholds and ``allow_low_quality_matches``) on a
    batch: ``quality [B, M, N]``, ``gt_valid [B, M]`` -> ``matches [B, N]`` int64: a ground
    truth index, ``BELOW_LOW_THRESHOLD`` (-1) or ``BETWEEN_THRESHOLDS`` (-2). An image with
    no valid ground truth matches nothing (-1), as torchvision's models treat it."""
    quality = torch.where(gt_valid[:, :, None], quality, -1.0)
    values, matches = quality.max(dim=1)
    below = values < matcher.low_threshold
    between = (values >= matcher.low_threshold) & (values < matcher.high_threshold)
    kept = torch.where(
        below, BELOW_LOW_THRESHOLD, torch.where(between, BETWEEN_THRESHOLDS, matches)
    )
    if matcher.allow_low_quality_matches:
        # Every prediction that is some ground truth's best (ties included) keeps its match.
        best = quality.max(dim=2, keepdim=True).values
        is_best = ((quality == best) & gt_valid[:, :, None]).any(dim=1)
        kept = torch.where(is_best, matches, kept)
    return torch.where(gt_valid.any(dim=1, keepdim=True), kept, BELOW_LOW_THRESHOLD)


def _random_keys(shape: Sequence[int], device: torch.device) -> Tensor:
    """The sampler's keys: uniform in ``[0, 1)``, drawn on ``device``."""
    return torch.rand(tuple(shape), device=device)


def sample(
    sampler: _utils.BalancedPositiveNegativeSampler, labels: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """torchvision's ``BalancedPositiveNegativeSampler`` with static shapes: ``labels
    [B, N]`` (``>= 1`` positive, 0 negative, < 0 ignored) -> ``(indices [B, K], positive
    [B, K], valid [B, K])`` with ``K = min(batch_size_per_image, N)``: the sampled
    positives first, then the negatives; ``valid`` is False on the unused slots.

    Per image, ``min(positives, int(batch * fraction))`` positives and ``min(negatives,
    batch - those)`` negatives, each a uniformly random subset (the largest random keys)."""
    batch = sampler.batch_size_per_image
    size = min(batch, labels.shape[1])
    most_positives = min(int(batch * sampler.positive_fraction), size)
    keys = _random_keys(labels.shape, labels.device)
    is_positive, is_negative = labels >= 1, labels == 0
    # Keys of other kinds sink below every real key (which lie in [0, 1)).
    positive_keys, positive_order = torch.where(is_positive, keys, -1.0).topk(most_positives)
    negative_keys, negative_order = torch.where(is_negative, keys, -1.0).topk(size)
    num_positives = (positive_keys >= 0).sum(1, keepdim=True)
    num_negatives = torch.minimum((negative_keys >= 0).sum(1, keepdim=True), batch - num_positives)
    slot = torch.arange(size, device=labels.device)
    # Slot s holds positive s while s < num_positives, then negative s - num_positives.
    from_negatives = (slot - num_positives).clamp(min=0, max=size - 1)
    positive_slot = slot < num_positives
    indices = torch.where(
        positive_slot,
        F.pad(positive_order, (0, size - most_positives)),
        torch.gather(negative_order, 1, from_negatives),
    )
    valid = positive_slot | (slot < num_positives + num_negatives)
    return indices, positive_slot, valid


def _masked_sum(values: Tensor, mask: Tensor) -> Tensor:
    """The sum of ``values`` where ``mask`` (broadcast from the left) is True; masked-out
    values (even NaN) contribute nothing, nor their gradients."""
    mask = mask.reshape(*mask.shape, *(1,) * (values.ndim - mask.ndim))
    return torch.where(
        mask, values, torch.zeros((), dtype=values.dtype, device=values.device)
    ).sum()


def _one_hot(labels: Tensor, num_classes: int, keep: Tensor) -> Tensor:
    """``[B, N]`` labels -> ``[B, N, num_classes]`` float one-hot rows, zero where not ``keep``."""
    classes = torch.arange(num_classes, device=labels.device)
    return ((labels[..., None] == classes) & keep[..., None]).to(torch.float32)


def _retinanet_losses(
    self: RetinaNet, head_outputs: dict[str, Tensor], anchors: Tensor, gt: _GroundTruth
) -> dict[str, Tensor]:
    """RetinaNet's ``compute_loss``: focal loss over the anchors that are not between the
    thresholds, box regression over the foreground, each per image over its foreground
    count (at least 1), averaged over the images."""
    matches = match(self.proposal_matcher, _box_iou(gt.boxes, anchors), gt.valid)
    foreground = matches >= 0
    per_image_count = foreground.sum(1).clamp(min=1).to(torch.float32)
    logits = head_outputs["cls_logits"]
    num_images, _, num_classes = logits.shape
    targets = _one_hot(_gather_rows(gt.labels, matches), num_classes, foreground)
    focal = torchvision.ops.sigmoid_focal_loss(logits, targets, reduction="none")
    counted = (matches != BETWEEN_THRESHOLDS)[..., None]
    classification = torch.where(counted, focal, 0.0).sum((1, 2)) / per_image_count

    head = self.head.regression_head
    # Background anchors regress to themselves (finite targets, masked out).
    matched_boxes = torch.where(foreground[..., None], _gather_rows(gt.boxes, matches), anchors)
    regression = head_outputs["bbox_regression"]
    per_anchor = _box_losses(head._loss_type, head.box_coder, anchors, matched_boxes, regression)
    box = torch.where(foreground, per_anchor, 0.0).sum(1) / per_image_count
    return {
        "classification": classification.sum() / num_images,
        "bbox_regression": box.sum() / max(1, num_images),
    }


def _box_losses(
    kind: str, coder: _utils.BoxCoder, anchors: Tensor, gt_boxes: Tensor, regression: Tensor
) -> Tensor:
    """torchvision's ``_box_loss`` per anchor: ``[B, N, 4]`` each -> ``[B, N]``."""
    shape = regression.shape[:-1]
    anchors, gt_boxes, regression = (t.reshape(-1, 4) for t in (anchors, gt_boxes, regression))
    if kind in ("l1", "smooth_l1"):
        targets = coder.encode_single(gt_boxes, anchors)
        if kind == "l1":
            losses = F.l1_loss(regression, targets, reduction="none")
        else:
            losses = F.smooth_l1_loss(regression, targets, reduction="none", beta=1.0)
        return losses.sum(-1).reshape(shape)
    boxes = coder.decode_single(regression, anchors)
    loss = {
        "giou": vision.generalized_box_iou_loss,
        "diou": vision.distance_box_iou_loss,
        "ciou": vision.complete_box_iou_loss,
    }[kind]
    return loss(boxes, gt_boxes, reduction="none").reshape(shape)


def _fcos_matches(
    self: FCOS, anchors: Tensor, gt: _GroundTruth, num_anchors_per_level: list[int]
) -> Tensor:
    """FCOS's ``compute_loss`` matching on a batch: ``[B, N]`` ground truth indices, -1
    where none (the smallest-area ground truth whose center region and scale range hold
    the anchor's center)."""
    gt_centers = (gt.boxes[..., :2] + gt.boxes[..., 2:]) / 2  # [B, M, 2]
    centers = (anchors[..., :2] + anchors[..., 2:]) / 2  # [B, N, 2]
    sizes = anchors[..., 2] - anchors[..., 0]  # [B, N]
    pairwise = (centers[:, :, None, :] - gt_centers[:, None, :, :]).abs().max(dim=3).values
    matching = pairwise < self.center_sampling_radius * sizes[..., None]  # [B, N, M]
    x, y = centers[..., 0, None], centers[..., 1, None]
    x0, y0, x1, y1 = gt.boxes[:, None].unbind(dim=3)
    distances = torch.stack([x - x0, y - y0, x1 - x, y1 - y], dim=3)  # [B, N, M, 4]
    matching &= distances.min(dim=3).values > 0
    first, last = num_anchors_per_level[0], num_anchors_per_level[-1]
    level = torch.arange(anchors.shape[1], device=anchors.device)
    lower = torch.where(level < first, 0.0, sizes * 4)
    upper = torch.where(level >= anchors.shape[1] - last, float("inf"), sizes * 8)
    largest = distances.max(dim=3).values
    matching &= (largest > lower[..., None]) & (largest < upper[..., None])
    matching &= gt.valid[:, None, :]
    areas = (gt.boxes[..., 2] - gt.boxes[..., 0]) * (gt.boxes[..., 3] - gt.boxes[..., 1])
    values, matches = (matching.to(torch.float32) * (1e8 - areas[:, None, :])).max(dim=2)
    return torch.where(values < 1e-5, -1, matches)


def _fcos_losses(
    self: FCOS,
    head_outputs: dict[str, Tensor],
    anchors: Tensor,
    gt: _GroundTruth,
    num_anchors_per_level: list[int],
) -> dict[str, Tensor]:
    """FCOS's ``compute_loss``: focal loss over every anchor, GIoU and centerness losses
    over the foreground, each over the batch's foreground count (at least 1)."""
    matches = _fcos_matches(self, anchors, gt, num_anchors_per_level)
    foreground = matches >= 0
    count = foreground.sum().clamp(min=1).to(torch.float32)
    logits = head_outputs["cls_logits"]
    targets = _one_hot(_gather_rows(gt.labels, matches), logits.shape[-1], foreground)
    classification = torchvision.ops.sigmoid_focal_loss(logits, targets, reduction="sum")

    coder = self.head.box_coder
    matched_boxes = torch.where(foreground[..., None], _gather_rows(gt.boxes, matches), anchors)
    boxes = coder.decode(head_outputs["bbox_regression"], anchors)
    giou = vision.generalized_box_iou_loss(boxes, matched_boxes, reduction="none")
    distances = coder.encode(anchors, matched_boxes)
    left_right, top_bottom = distances[..., [0, 2]], distances[..., [1, 3]]
    centerness = torch.sqrt(
        (left_right.min(dim=-1).values / left_right.max(dim=-1).values)
        * (top_bottom.min(dim=-1).values / top_bottom.max(dim=-1).values)
    )
    centerness_loss = F.binary_cross_entropy_with_logits(
        head_outputs["bbox_ctrness"].squeeze(dim=2), centerness, reduction="none"
    )
    return {
        "classification": classification / count,
        "bbox_regression": _masked_sum(giou, foreground) / count,
        "bbox_ctrness": _masked_sum(centerness_loss, foreground) / count,
    }


def _ssd_losses(
    self: SSD, head_outputs: dict[str, Tensor], anchors: Tensor, gt: _GroundTruth
) -> dict[str, Tensor]:
    """SSD's ``compute_loss``: ``SSDMatcher`` matching (each ground truth also takes its
    best anchor; a later one wins a shared anchor), smooth L1 over the foreground, cross
    entropy over the foreground and the ``neg_to_pos_ratio`` hardest negatives per image
    (ranked by a sort, as torchvision), both over the batch's foreground count."""
    quality = torch.where(gt.valid[:, :, None], _box_iou(gt.boxes, anchors), -1.0)
    matches = match(self.proposal_matcher, quality, gt.valid)
    best_anchor = quality.max(dim=2).indices  # [B, M]
    anchor = torch.arange(anchors.shape[1], device=anchors.device)
    owners = (best_anchor[:, :, None] == anchor) & gt.valid[:, :, None]  # [B, M, N]
    gt_index = torch.arange(gt.boxes.shape[1], device=anchors.device)[None, :, None]
    owner = torch.where(owners, gt_index, -1).max(dim=1).values
    matches = torch.where(owner >= 0, owner, matches)
    foreground = matches >= 0
    count = foreground.sum().clamp(min=1).to(torch.float32)

    matched_boxes = torch.where(foreground[..., None], _gather_rows(gt.boxes, matches), anchors)
    targets = self.box_coder.encode_single(matched_boxes.reshape(-1, 4), anchors.reshape(-1, 4))
    box_loss = F.smooth_l1_loss(
        head_outputs["bbox_regression"], targets.reshape(anchors.shape), reduction="none"
    )
    classes = torch.where(foreground, _gather_rows(gt.labels, matches), 0)
    logits = head_outputs["cls_logits"]
    per_anchor = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), classes.flatten(), reduction="none"
    ).reshape(classes.shape)
    positive = classes > 0
    num_negative = self.neg_to_pos_ratio * positive.sum(1, keepdim=True)
    negative_loss = torch.where(positive, -float("inf"), per_anchor)
    rank = negative_loss.sort(1, descending=True)[1].sort(1)[1]
    hard_negative = rank < num_negative
    return {
        "bbox_regression": _masked_sum(box_loss, foreground) / count,
        "classification": (
            _masked_sum(per_anchor, positive) + _masked_sum(per_anchor, hard_negative)
        )
        / count,
    }


def _host_default_boxes(self: SSD, images: ImageList, levels: list[Tensor]) -> Tensor:
    """SSD's default boxes ``[B, N, 4]`` as its ``DefaultBoxGenerator`` computes them on the
    CPU, moved to the features' device. They depend on the shapes alone. On an XLA device
    the generator's ``(center -+ 0.5 * size) * image_size`` is fused and rounds some boxes
    1 ulp away from the CPU's; a small ground truth box inside several anchors of one size
    has exactly tied IoUs on the CPU, and the ulp then breaks the tie for another anchor
    (another matched anchor: SSDlite's box loss moved by 7e-3 relative)."""
    stand_in = torch.zeros((), dtype=levels[0].dtype)
    host_images = ImageList(stand_in.expand(images.tensors.shape), images.image_sizes)
    host_levels = [stand_in.expand(level.shape) for level in levels]
    return torch.stack(self.anchor_generator(host_images, host_levels)).to(levels[0].device)


def _nearest_indices(size_in: int, size_out: int) -> list[int]:
    """The rows (or columns) ``F.interpolate(mode="nearest")`` reads to resize ``size_in``
    to ``size_out``: PyTorch's ``nearest_idx``, ``floor(i * (float32) size_in / size_out)``."""
    scale = np.float32(size_in) / np.float32(size_out)
    return [min(int(np.floor(np.float32(i) * scale)), size_in - 1) for i in range(size_out)]


def _nearest_resize(x: Tensor, size: Sequence[int]) -> Tensor:
    """``F.interpolate(x, size, mode="nearest")`` for ``[N, C, H, W]`` as two index
    selects: the same values, and a backward (index_add) that torch_xla lowers on every
    device (its ``upsample_nearest2d_backward`` falls back to the CPU off TPU)."""
    for dim, size_out in ((2, int(size[0])), (3, int(size[1]))):
        rows = torch.tensor(_nearest_indices(x.shape[dim], size_out), device=x.device)
        x = x.index_select(dim, rows)
    return x


def _fpn_forward(self: FeaturePyramidNetwork, x: dict[str, Tensor]) -> dict[str, Tensor]:
    """torchvision's ``FeaturePyramidNetwork.forward``, its nearest upsampling as
    :func:`_nearest_resize` (the same values)."""
    names, levels = list(x.keys()), list(x.values())
    last_inner = self.get_result_from_inner_blocks(levels[-1], -1)
    results = [self.get_result_from_layer_blocks(last_inner, -1)]
    for idx in range(len(levels) - 2, -1, -1):
        inner_lateral = self.get_result_from_inner_blocks(levels[idx], idx)
        last_inner = inner_lateral + _nearest_resize(last_inner, inner_lateral.shape[-2:])
        results.insert(0, self.get_result_from_layer_blocks(last_inner, idx))
    if self.extra_blocks is not None:
        results, names = self.extra_blocks(results, levels, names)
    return OrderedDict(zip(names, results, strict=True))


def _rpn_losses(
    rpn: RegionProposalNetwork,
    images: ImageList,
    features: OrderedDict[str, Tensor],
    gt: _GroundTruth,
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """The RPN's training forward: ``(proposals [B, P, 4], valid [B, P], losses)`` with
    ``P`` its training ``post_nms_top_n``: the static-shape ``filter_proposals`` of
    :func:`~asickernels.torch.detection.xla_ready` (padding boxes ``(0, 0, 0, 0)``, which
    the minimum size excludes from the real ones), and its objectness and box losses over
    the sampled anchors."""
    levels = list(features.values())
    objectness, deltas = rpn.head(levels)
    anchor_list = rpn.anchor_generator(images, levels)
    per_level = [o[0].shape[0] * o[0].shape[1] * o[0].shape[2] for o in objectness]
    objectness, deltas = concat_box_prediction_layers(objectness, deltas)
    num_images = len(anchor_list)
    decoded = rpn.box_coder.decode(deltas.detach(), anchor_list).view(num_images, -1, 4)
    proposals = torch.stack(
        rpn.filter_proposals(decoded, objectness, images.image_sizes, per_level)[0]
    )
    proposal_valid = (proposals[..., 2] > proposals[..., 0]) & (
        proposals[..., 3] > proposals[..., 1]
    )

    anchors = torch.stack(anchor_list)
    matches = match(rpn.proposal_matcher, _box_iou(gt.boxes, anchors), gt.valid)
    foreground = matches >= 0
    labels = torch.where(foreground, 1, torch.where(matches == BETWEEN_THRESHOLDS, -1, 0))
    matched_boxes = torch.where(foreground[..., None], _gather_rows(gt.boxes, matches), anchors)
    targets = rpn.box_coder.encode_single(matched_boxes.reshape(-1, 4), anchors.reshape(-1, 4))
    indices, positive, valid = sample(rpn.fg_bg_sampler, labels)
    count = valid.sum().clamp(min=1).to(torch.float32)
    logits = torch.gather(objectness.reshape(num_images, -1), 1, indices)
    objectness_loss = F.binary_cross_entropy_with_logits(
        logits, positive.to(logits.dtype), reduction="none"
    )
    box_loss = F.smooth_l1_loss(
        _gather_rows(deltas.reshape(num_images, -1, 4), indices),
        _gather_rows(targets.reshape(num_images, -1, 4), indices),
        beta=1 / 9,
        reduction="none",
    )
    losses = {
        "loss_objectness": _masked_sum(objectness_loss, valid) / count,
        "loss_rpn_box_reg": _masked_sum(box_loss, positive) / count,
    }
    return proposals, proposal_valid, losses


def _roi_heads_losses(
    heads: RoIHeads,
    features: OrderedDict[str, Tensor],
    proposals: Tensor,
    proposal_valid: Tensor,
    image_sizes: list[tuple[int, int]],
    gt: _GroundTruth,
    gt_masks: Tensor | None,
) -> dict[str, Tensor]:
    """The RoI heads' training forward (``select_training_samples`` and
    ``fastrcnn_loss``): the ground truth boxes join the proposals, matched and sampled,
    the sampled RoIs pooled and classified, losses over the valid slots."""
    candidates = torch.cat([proposals, gt.boxes.to(proposals.dtype)], 1)
    candidate_valid = torch.cat([proposal_valid, gt.valid], 1)
    matches = match(heads.proposal_matcher, _box_iou(gt.boxes, candidates), gt.valid)
    labels = torch.where(
        matches == BELOW_LOW_THRESHOLD,
        0,
        torch.where(matches == BETWEEN_THRESHOLDS, -1, _gather_rows(gt.labels, matches)),
    )
    labels = torch.where(candidate_valid, labels, -1)  # padding proposals: never sampled
    indices, positive, valid = sample(heads.fg_bg_sampler, labels)
    rois = _gather_rows(candidates, indices)
    roi_labels = torch.where(valid, torch.gather(labels, 1, indices), 0)
    roi_matches = torch.gather(matches, 1, indices)
    matched_boxes = torch.where(positive[..., None], _gather_rows(gt.boxes, roi_matches), rois)
    targets = heads.box_coder.encode_single(matched_boxes.reshape(-1, 4), rois.reshape(-1, 4))
    # Padding proposals (zero boxes) encode to NaN: zeros, so that no NaN reaches a gradient.
    targets = torch.where(positive.reshape(-1, 1), targets, 0.0)

    pooled = heads.box_roi_pool(features, list(rois), image_sizes)
    class_logits, box_regression = heads.box_predictor(heads.box_head(pooled))
    count = valid.sum().clamp(min=1).to(torch.float32)
    classification = F.cross_entropy(class_logits, roi_labels.flatten(), reduction="none")
    num_rois, num_classes = class_logits.shape
    per_class = box_regression.reshape(num_rois, num_classes, 4)
    predicted = torch.gather(
        per_class, 1, roi_labels.reshape(num_rois, 1, 1).expand(-1, 1, 4)
    ).squeeze(1)
    box_loss = F.smooth_l1_loss(predicted, targets, beta=1 / 9, reduction="none")
    losses = {
        "loss_classifier": _masked_sum(classification, valid.flatten()) / count,
        "loss_box_reg": _masked_sum(box_loss, positive.flatten()) / count,
    }
    if gt_masks is not None:
        losses["loss_mask"] = _mask_loss(
            heads, features, image_sizes, gt_masks, rois, roi_labels, roi_matches, positive
        )
    return losses


def _mask_loss(
    heads: RoIHeads,
    features: OrderedDict[str, Tensor],
    image_sizes: list[tuple[int, int]],
    gt_masks: Tensor,
    rois: Tensor,
    roi_labels: Tensor,
    roi_matches: Tensor,
    positive: Tensor,
) -> Tensor:
    """Mask R-CNN's ``maskrcnn_loss`` over the sampled positives, which fill the first
    ``int(batch * positive_fraction)`` slots: their ground truth masks ``gt_masks [B, M,
    H, W]`` cut by asickernels' ``roi_align`` (torchvision's ``project_masks_on_boxes``),
    binary cross-entropy over the positives' pixels (0 without positives)."""
    sampler = heads.fg_bg_sampler
    slots = min(int(sampler.batch_size_per_image * sampler.positive_fraction), rois.shape[1])
    rois, labels, matches, positive = (
        t[:, :slots] for t in (rois, roi_labels, roi_matches, positive)
    )
    pooled = heads.mask_roi_pool(features, list(rois), image_sizes)
    logits = heads.mask_predictor(heads.mask_head(pooled))  # [B * slots, C, S, S]
    size = logits.shape[-1]
    num_images, num_gt = gt_masks.shape[:2]
    mask_index = (
        matches.clamp(min=0) + num_gt * torch.arange(num_images, device=rois.device)[:, None]
    )
    mask_rois = torch.cat([mask_index.to(rois.dtype)[..., None], rois], -1).reshape(-1, 5)
    targets = vision.roi_align(
        gt_masks.reshape(-1, 1, *gt_masks.shape[2:]).to(rois.dtype), mask_rois, (size, size), 1.0
    )[:, 0]
    chosen = torch.gather(logits, 1, labels.reshape(-1, 1, 1, 1).expand(-1, 1, size, size)).squeeze(
        1
    )
    per_pixel = F.binary_cross_entropy_with_logits(chosen, targets, reduction="none")
    count = positive.sum().clamp(min=1).to(per_pixel.dtype) * (size * size)
    return _masked_sum(per_pixel, positive.flatten()) / count


def _features(model: torch.nn.Module, images: ImageList) -> OrderedDict[str, Tensor]:
    features = model.backbone(images.tensors)
    return OrderedDict([("0", features)]) if isinstance(features, Tensor) else features


def training_forward(
    self: torch.nn.Module,
    images: list[Tensor],
    targets: list[dict[str, Tensor]] | None = None,
) -> object:
    """The model's ``forward``: in train mode its torchvision losses (a dict of scalar
    tensors) computed with static shapes; in eval mode the model's own forward.

    Raises:
      ValueError: train mode without ``targets``, or targets without ``boxes [M, 4]`` and
        ``labels [M]``.
    """
    if not self.training:
        return type(self).forward(self, images, targets)
    _check_targets(targets, len(images))
    assert targets is not None
    transformed, targets = self.transform(images, targets)
    gt = _stacked_targets(targets)
    features = _features(self, transformed)
    if isinstance(self, (RetinaNet, FCOS)):
        levels = list(features.values())
        head_outputs = self.head(levels)
        anchors = torch.stack(self.anchor_generator(transformed, levels))
        if isinstance(self, FCOS):
            per_level = [x.size(2) * x.size(3) for x in levels]
            return _fcos_losses(self, head_outputs, anchors, gt, per_level)
        return _retinanet_losses(self, head_outputs, anchors, gt)
    if isinstance(self, SSD):
        levels = list(features.values())
        anchors = _host_default_boxes(self, transformed, levels)
        return _ssd_losses(self, self.head(levels), anchors, gt)
    if isinstance(self, FasterRCNN):
        proposals, proposal_valid, rpn_losses = _rpn_losses(self.rpn, transformed, features, gt)
        heads_losses = _roi_heads_losses(
            self.roi_heads,
            features,
            proposals,
            proposal_valid,
            transformed.image_sizes,
            gt,
            _stacked_masks(targets, gt.boxes.shape[1]) if self.roi_heads.has_mask() else None,
        )
        return heads_losses | rpn_losses
    raise TypeError(f"no static-shape training losses for {type(self).__name__}")


def _check_targets(targets: object, num_images: int) -> None:
    if not isinstance(targets, Sequence) or len(targets) != num_images:
        raise ValueError("targets must be given in train mode: one dict per image")
    for target in targets:
        boxes = target.get("boxes") if isinstance(target, dict) else None
        labels = target.get("labels") if isinstance(target, dict) else None
        if not isinstance(boxes, Tensor) or not isinstance(labels, Tensor):
            raise ValueError("every target must be a dict with tensors 'boxes' and 'labels'")
        if boxes.ndim != 2 or boxes.shape[1] != 4 or labels.shape != boxes.shape[:1]:
            raise ValueError(
                f"targets' boxes must be [M, 4] and labels [M], got {tuple(boxes.shape)} "
                f"and {tuple(labels.shape)}"
            )


def add_training_forward(model: torch.nn.Module) -> None:
    """Binds :func:`training_forward` as ``model.forward`` (an instance attribute: the
    class, and so other instances, keep torchvision's code) for the kinds it supports."""
    if isinstance(model, (RetinaNet, FCOS, SSD)) or (
        isinstance(model, FasterRCNN) and not model.roi_heads.has_keypoint()
    ):
        model.forward = types.MethodType(training_forward, model)  # type: ignore[method-assign]
    else:
        return
    for module in model.backbone.modules():
        if isinstance(module, FeaturePyramidNetwork):
            module.forward = types.MethodType(_fpn_forward, module)  # type: ignore[method-assign]
