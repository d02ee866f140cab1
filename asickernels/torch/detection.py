"""torchvision's detection models on XLA devices: :func:`xla_ready` swaps their
post-processing for static-shape versions, so that a forward pass is one XLA graph with no
CPU fallback and no host sync.

torchvision's post-processing indexes with boolean masks, ``torch.where`` and ``nonzero``,
whose output shapes depend on the data: torch_xla runs those on the CPU (``aten::nonzero``
fallbacks) and compiles a new graph for every new count. Here the same steps run with fixed
shapes: per-level top-k with a validity mask, per-class NMS (asickernels' kernels) and
padding, the JAX functions of :mod:`asickernels.detection` as the operators
``torch.ops.asickernels.top_candidates`` and ``select_detections`` (spliced into torch_xla's
graph with ``call_jax``; on CPU tensors run under ``jax.jit``; fake kernels give their static
output shapes). Scores and box decoding stay torchvision's own code, so on CPU the trimmed
detections are torchvision's. A ready model has no graph break: ``torch.compile(model,
fullgraph=True)`` and ``torch.export.export(model, (images,))`` take it whole.

Each image's detections come padded to the model's ``detections_per_img``: ``boxes [D, 4]``,
``scores [D]``, ``labels [D]`` (int64), Mask R-CNN's ``masks [D, 1, H, W]``, and
``num_detections`` (a 0-d int32 tensor); past the count boxes, scores and masks are 0 and
labels -1. :func:`trim` cuts them on the host, once.

Training-mode forwards compute torchvision's losses with static shapes too
(:mod:`asickernels.torch.detection_training`).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Hashable, Sequence

import jax
import torch
import torchvision.ops
from torch import Tensor
from torchvision.models.detection import FCOS, FasterRCNN, RetinaNet, roi_heads
from torchvision.models.detection.roi_heads import RoIHeads
from torchvision.models.detection.rpn import RegionProposalNetwork
from torchvision.models.detection.ssd import SSD
from torchvision.models.detection.transform import GeneralizedRCNNTransform
from torchvision.ops import boxes as box_ops

from asickernels import detection
from asickernels.kernels import registry
from asickernels.torch import ops, vision

__all__ = ["trim", "xla_ready"]


@functools.cache
def _jitted(
    function: Callable[..., tuple[jax.Array, ...]], statics: tuple[tuple[str, Hashable], ...]
) -> Callable[..., tuple[jax.Array, ...]]:
    return jax.jit(functools.partial(function, **dict(statics)))


def _define_selection(
    function: Callable[..., tuple[jax.Array, ...]], text: str, *, nms: bool = False
) -> Callable[..., tuple[Tensor, ...]]:
    """``function`` (of :mod:`asickernels.detection`) as the operator
    ``asickernels::<its name>`` of schema ``text``, so that ``torch.compile`` and
    ``torch.export`` trace it as one node: on CPU tensors it runs under ``jax.jit`` on host
    copies; on XLA tensors inside torch_xla's graph (``call_jax``; for a function that
    runs NMS, ``nms``, with the selection policy's NMS backend for torch_xla, one that lowers
    into the graph); its fake kernel gives the output shapes and dtypes by
    ``jax.eval_shape`` of ``function`` itself."""

    def cpu(*tensors: Tensor, **statics: Hashable) -> tuple[Tensor, ...]:
        out = _jitted(function, tuple(sorted(statics.items())))(*map(ops.to_host, tensors))
        return tuple(ops.to_torch(o) for o in out)

    def fake(*tensors: Tensor, **statics: Hashable) -> tuple[Tensor, ...]:
        specs = [jax.ShapeDtypeStruct(t.shape, ops.numpy_dtype(t.dtype)) for t in tensors]
        out = jax.eval_shape(functools.partial(function, **statics), *specs)
        return tuple(tensors[0].new_empty(o.shape, dtype=ops.torch_dtype(o.dtype)) for o in out)

    def xla(*tensors: Tensor, **statics: Hashable) -> tuple[Tensor, ...]:
        from torch_xla.core import xla_builder

        if nms:  # (the dispatcher leaves out a backend=None: the schema's default)
            from asickernels.kernels import policy, public
            from asickernels.torch.xla import where_xla_tensors_live

            requested = statics.get("backend")
            assert requested is None or isinstance(requested, str)  # as the schema says
            statics["backend"] = policy.select(
                public.nms, requested, where_xla_tensors_live(), "float32"
            )
        return tuple(xla_builder.call_jax(function, tensors, statics))

    operator = ops.define(function.__name__, text, cpu, fake)
    operator.register_kernel("xla")(xla)
    return getattr(torch.ops.asickernels, function.__name__)


_top_candidates_op = _define_selection(
    detection.top_candidates,
    "(Tensor scores, *, int k, float score_threshold) -> (Tensor, Tensor)",
)
_select_detections_op = _define_selection(
    detection.select_detections,
    "(Tensor boxes, Tensor scores, Tensor labels, Tensor valid, *, float iou_threshold, "
    "int max_detections, float? min_size=None, str? backend=None) "
    "-> (Tensor, Tensor, Tensor, Tensor)",
    nms=True,
)


def _clip(boxes: Tensor, image_shapes: Sequence[tuple[int, int]]) -> Tensor:
    """``[B, N, 4]`` boxes clipped to each image (torchvision's ``clip_boxes_to_image``)."""
    return torch.stack(
        [box_ops.clip_boxes_to_image(b, s) for b, s in zip(boxes, image_shapes, strict=True)]
    )


def _detections(
    boxes: Tensor,
    scores: Tensor,
    labels: Tensor,
    valid: Tensor,
    *,
    iou_threshold: float,
    max_detections: int,
    backend: str | None,
    min_size: float | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`asickernels.detection.select_detections` on torch tensors (labels int64)."""
    out_boxes, out_scores, out_labels, count = _select_detections_op(
        boxes,
        scores,
        labels.to(torch.int32),
        valid,
        iou_threshold=float(iou_threshold),
        max_detections=max_detections,
        min_size=min_size,
        backend=backend,
    )
    return out_boxes, out_scores, out_labels.to(torch.int64), count


def _top_candidates(model: RetinaNet | FCOS | SSD, scores: Tensor) -> tuple[Tensor, Tensor]:
    """The ``model.topk_candidates`` best of each row of ``scores [R, A]`` above
    ``model.score_thresh``: ``(indices [R, k] int64, valid [R, k])``."""
    indices, valid = _top_candidates_op(
        scores,
        k=min(model.topk_candidates, scores.shape[1]),
        score_threshold=float(model.score_thresh),
    )
    return indices.to(torch.int64), valid


def _model_detections(
    model: RetinaNet | FCOS | SSD, boxes: Tensor, scores: Tensor, labels: Tensor, valid: Tensor
) -> list[dict[str, Tensor]]:
    """Per-class NMS at ``model.nms_thresh`` over ``[B, N]`` candidates, padded to
    ``model.detections_per_img``: one dict of detections per image."""
    out = _detections(
        boxes,
        scores,
        labels,
        valid,
        iou_threshold=model.nms_thresh,
        max_detections=model.detections_per_img,
        backend=model._asickernels_backend,
    )
    return [
        {"boxes": b, "scores": s, "labels": lab, "num_detections": c}
        for b, s, lab, c in zip(*out, strict=True)
    ]


def _dense_postprocess(
    self: RetinaNet | FCOS,
    head_outputs: dict[str, list[Tensor]],
    anchors: list[list[Tensor]],
    image_shapes: list[tuple[int, int]],
) -> list[dict[str, Tensor]]:
    """RetinaNet's and FCOS's ``postprocess_detections`` with static shapes: per level the
    ``topk_candidates`` best scores above ``score_thresh`` (``scores [B, A_l * C]``: the
    class probability, for FCOS its geometric mean with the centerness), their boxes
    decoded and clipped, then per-class NMS over all levels."""
    logits, box_regression = head_outputs["cls_logits"], head_outputs["bbox_regression"]
    if isinstance(self, FCOS):
        centerness = head_outputs["bbox_ctrness"]
        scores = [
            torch.sqrt(torch.sigmoid(c) * torch.sigmoid(n)).flatten(1)
            for c, n in zip(logits, centerness, strict=True)
        ]
        decode = self.box_coder.decode
    else:
        scores = [torch.sigmoid(c).flatten(1) for c in logits]
        decode = self.box_coder.decode_single
    level_boxes, level_scores, level_labels, level_valid = [], [], [], []
    for level, (level_score, regression) in enumerate(zip(scores, box_regression, strict=True)):
        num_classes = level_score.shape[1] // regression.shape[1]
        indices, valid = _top_candidates(self, level_score)
        anchor_idxs = torch.div(indices, num_classes, rounding_mode="floor")
        level_anchors = torch.stack([a[level] for a in anchors])
        rows = anchor_idxs.unsqueeze(-1).expand(-1, -1, 4)
        decoded = decode(
            torch.gather(regression, 1, rows).reshape(-1, 4),
            torch.gather(level_anchors, 1, rows).reshape(-1, 4),
        )
        level_boxes.append(_clip(decoded.reshape(rows.shape), image_shapes))
        level_scores.append(torch.gather(level_score, 1, indices))
        level_labels.append(indices % num_classes)
        level_valid.append(valid)
    return _model_detections(
        self,
        torch.cat(level_boxes, 1),
        torch.cat(level_scores, 1),
        torch.cat(level_labels, 1),
        torch.cat(level_valid, 1),
    )


def _ssd_postprocess(
    self: SSD,
    head_outputs: dict[str, Tensor],
    anchors: list[Tensor],
    image_shapes: list[tuple[int, int]],
) -> list[dict[str, Tensor]]:
    """SSD's ``postprocess_detections`` with static shapes: per image and class (but the
    background) the ``topk_candidates`` best anchors scoring above ``score_thresh``, then
    per-class NMS over all of them."""
    boxes = _clip(
        torch.stack(
            [
                self.box_coder.decode_single(regression, image_anchors)
                for regression, image_anchors in zip(
                    head_outputs["bbox_regression"], anchors, strict=True
                )
            ]
        ),
        image_shapes,
    )
    scores = torch.softmax(head_outputs["cls_logits"], -1)[:, :, 1:].transpose(1, 2)
    num_images, num_labels, num_anchors = scores.shape
    indices, valid = _top_candidates(self, scores.reshape(num_images * num_labels, num_anchors))
    indices = indices.reshape(num_images, num_labels, -1)
    labels = torch.arange(1, num_labels + 1, device=scores.device)[:, None].expand_as(indices[0])
    rows = indices.flatten(1).unsqueeze(-1).expand(-1, -1, 4)
    return _model_detections(
        self,
        torch.gather(boxes, 1, rows),
        torch.gather(scores, 2, indices).flatten(1),
        labels.flatten().expand(num_images, -1),
        valid.reshape(num_images, -1),
    )


def _filter_proposals(
    self: RegionProposalNetwork,
    proposals: Tensor,
    objectness: Tensor,
    image_shapes: list[tuple[int, int]],
    num_anchors_per_level: list[int],
) -> tuple[list[Tensor], list[Tensor]]:
    """The RPN's ``filter_proposals`` with static shapes: per level the ``pre_nms_top_n``
    best (torchvision's own top-k), clipped, small and low-scoring boxes masked, per-level
    NMS, ``post_nms_top_n`` proposals per image padded with the box ``(0, 0, 0, 0)`` (whose
    refined boxes have zero size, so that the RoI heads drop them as small)."""
    num_images = proposals.shape[0]
    objectness = objectness.detach().reshape(num_images, -1)
    levels = torch.cat(
        [
            torch.full((n,), level, dtype=torch.int64, device=proposals.device)
            for level, n in enumerate(num_anchors_per_level)
        ]
    )
    top = self._get_top_n_idx(objectness, num_anchors_per_level)
    images = torch.arange(num_images, device=proposals.device)[:, None]
    scores = torch.sigmoid(objectness[images, top])
    boxes, scores, _, _ = _detections(
        _clip(proposals[images, top], image_shapes),
        scores,
        levels[top],
        scores >= self.score_thresh,
        iou_threshold=self.nms_thresh,
        max_detections=self.post_nms_top_n(),
        backend=self._asickernels_backend,
        min_size=self.min_size,
    )
    return list(boxes), list(scores)


def _roi_heads_postprocess(
    self: RoIHeads,
    class_logits: Tensor,
    box_regression: Tensor,
    proposals: list[Tensor],
    image_shapes: list[tuple[int, int]],
) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """The RoI heads' ``postprocess_detections`` with static shapes: every (proposal,
    class) pair but the background's is a candidate; scores above ``score_thresh``, boxes
    of at least 1e-2 px, per-class NMS, ``detections_per_img`` per image, padded."""
    num_images, num_classes = len(proposals), class_logits.shape[-1]
    per_image = (num_images, -1, num_classes)
    boxes = self.box_coder.decode(box_regression, proposals).reshape(*per_image, 4)
    boxes = _clip(boxes.flatten(1, 2), image_shapes).reshape(*per_image, 4)[:, :, 1:]
    scores = torch.softmax(class_logits, -1).reshape(per_image)
    labels = torch.arange(num_classes, device=scores.device).expand_as(scores)[:, :, 1:]
    boxes, scores, labels = boxes.flatten(1, 2), scores[:, :, 1:].flatten(1), labels.flatten(1)
    out_boxes, out_scores, out_labels, _ = _detections(
        boxes,
        scores,
        labels,
        scores > self.score_thresh,
        iou_threshold=self.nms_thresh,
        max_detections=self.detections_per_img,
        backend=self._asickernels_backend,
        min_size=1e-2,
    )
    return list(out_boxes), list(out_scores), list(out_labels)


def _roi_heads_forward(
    self: RoIHeads, *args: object, **kwargs: object
) -> tuple[list[dict[str, Tensor]], dict[str, Tensor]]:
    """torchvision's ``RoIHeads.forward``, whose eval-mode detections also get their
    ``num_detections`` (labels are -1 past it)."""
    result, losses = type(self).forward(self, *args, **kwargs)
    if not self.training:
        for image in result:
            image["num_detections"] = (image["labels"] >= 0).sum(dtype=torch.int32)
    return result, losses


def _paste_weights(
    start: Tensor, end: Tensor, mask_size: int, image_size: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Along one image axis, for every (detection, pixel): the two mask rows (or columns)
    and their weights that ``F.interpolate(mode="bilinear", align_corners=False)`` of the
    ``mask_size`` mask to the box's ``end - start + 1`` pixels reads (PyTorch's
    ``area_pixel_compute_source_index``), and whether the pixel is inside the box."""
    pixel = torch.arange(image_size, device=start.device)
    offset = pixel - start[:, None]  # [D, image_size]
    length = (end - start + 1).clamp(min=1)[:, None]
    scale = mask_size / length.to(torch.float32)
    source = ((offset.to(torch.float32) + 0.5) * scale - 0.5).clamp(min=0)
    first = source.floor().to(torch.int64)
    weight = (source - first).clamp(0, 1)
    low = first.clamp(max=mask_size - 1)
    high = low + (first < mask_size - 1).to(torch.int64)
    inside = (offset >= 0) & (pixel <= end[:, None])
    return low, high, 1 - weight, weight, inside


def _paste_masks(masks: Tensor, boxes: Tensor, image_shape: tuple[int, int]) -> Tensor:
    """torchvision's ``paste_masks_in_image`` with static shapes: ``masks [D, 1, M, M]``,
    ``boxes [D, 4]`` -> ``[D, 1, H, W]``, each mask resized to its box (bilinear, as
    ``F.interpolate``: columns first, then rows) and placed in the image, zero outside."""
    padded, scale = roi_heads.expand_masks(masks[:, 0], padding=1)
    boxes = roi_heads.expand_boxes(boxes, scale).to(torch.int64)
    height, width = image_shape
    size = padded.shape[-1]
    left, right, w_left, w_right, in_x = _paste_weights(boxes[:, 0], boxes[:, 2], size, width)
    top, bottom, w_top, w_bottom, in_y = _paste_weights(boxes[:, 1], boxes[:, 3], size, height)
    columns = (  # [D, M, W]
        w_left[:, None] * padded.gather(2, left[:, None].expand(-1, size, -1))
        + w_right[:, None] * padded.gather(2, right[:, None].expand(-1, size, -1))
    )
    pasted = (  # [D, H, W]
        w_top[..., None] * columns.gather(1, top[..., None].expand(-1, -1, width))
        + w_bottom[..., None] * columns.gather(1, bottom[..., None].expand(-1, -1, width))
    )
    inside = in_y[:, :, None] & in_x[:, None, :]
    return torch.where(inside, pasted, torch.zeros((), dtype=pasted.dtype, device=pasted.device))[
        :, None
    ]


def _transform_postprocess(
    self: GeneralizedRCNNTransform,
    result: list[dict[str, Tensor]],
    image_shapes: list[tuple[int, int]],
    original_image_sizes: list[tuple[int, int]],
) -> list[dict[str, Tensor]]:
    """The transform's ``postprocess`` (boxes back to the original image sizes), with the
    masks pasted by :func:`_paste_masks`; padding detections get zero masks."""
    if self.training or not any("masks" in image for image in result):
        return type(self).postprocess(self, result, image_shapes, original_image_sizes)
    boxes_only = [{k: v for k, v in image.items() if k != "masks"} for image in result]
    resized = type(self).postprocess(self, boxes_only, image_shapes, original_image_sizes)
    for image, before, size in zip(resized, result, original_image_sizes, strict=True):
        pasted = _paste_masks(before["masks"], image["boxes"], size)
        real = (image["labels"] >= 0)[:, None, None, None]
        image["masks"] = torch.where(real, pasted, torch.zeros_like(pasted[:1]))
    return resized


def _swap(module: torch.nn.Module, backend: str | None, **methods: Callable[..., object]) -> None:
    """Binds ``methods`` to ``module`` as instance attributes (its class, and so other
    instances, keep torchvision's code)."""
    for name, function in methods.items():
        setattr(module, name, types.MethodType(function, module))
    setattr(module, "_asickernels_backend", backend)  # noqa: B010


def _static_pooler(pool: torchvision.ops.MultiScaleRoIAlign) -> vision.MultiScaleRoIAlign:
    return vision.MultiScaleRoIAlign(
        pool.featmap_names,
        pool.output_size,
        pool.sampling_ratio,
        canonical_scale=pool.canonical_scale,
        canonical_level=pool.canonical_level,
    )


def xla_ready(model: torch.nn.Module, *, backend: str | None = None) -> torch.nn.Module:
    """``model`` (a torchvision RetinaNet, FCOS, SSD/SSDlite, Faster or Mask R-CNN), with
    its eval-mode post-processing replaced by the static-shape one (in place; the model is
    returned).

    Faster and Mask R-CNN also get :class:`asickernels.torch.vision.MultiScaleRoIAlign` as
    their RoI pooling, and their RPN passes ``post_nms_top_n`` proposals per image on,
    padded with the box ``(0, 0, 0, 0)``. Mask R-CNN's masks are computed for every padded
    detection and pasted into the image with static shapes (torchvision's bilinear resize
    to the box, written as two gathers); padding detections get zero masks.
    In train mode the model returns torchvision's losses, computed with static shapes
    (:func:`asickernels.torch.detection_training.training_forward`: matching, sampling,
    RPN proposals and losses without boolean indexing or host syncs; FPN backbones
    upsample with index selects, whose backward XLA lowers on every device).

    Args:
      model: a ``torchvision.models.detection`` model of a supported kind.
      backend: the NMS backend (see :func:`asickernels.batched_nms`); None lets the
        selection policy choose: on torch_xla's CPU device that is the TPU kernel run
        simulated (checking what a TPU runs, slowly); ``"xla"`` is the plain XLA one.

    Returns:
      ``model``, whose eval-mode forward returns per image ``boxes [D, 4]``, ``scores [D]``,
      ``labels [D]``, for Mask R-CNN ``masks [D, 1, H, W]``, and ``num_detections``, with
      ``D`` the model's ``detections_per_img`` (see the module docstring); :func:`trim`
      gives torchvision's variable-length dicts.

    Raises:
      TypeError: ``model`` is of another kind (Keypoint R-CNN is not supported yet), or
        ``backend`` is neither a string nor None.
      ValueError: ``backend`` names no backend.
    """
    if backend is not None:
        if not isinstance(backend, str):
            raise TypeError(f"backend must be a backend name or None, got {backend!r}")
        registry.backend(backend)  # ValueError for an unknown name
    from asickernels.torch import detection_training

    detection_training.add_training_forward(model)
    if isinstance(model, (RetinaNet, FCOS)):
        _swap(model, backend, postprocess_detections=_dense_postprocess)
        return model
    if isinstance(model, SSD):
        _swap(model, backend, postprocess_detections=_ssd_postprocess)
        return model
    if isinstance(model, FasterRCNN) and not model.roi_heads.has_keypoint():
        _swap(model.rpn, backend, filter_proposals=_filter_proposals)
        _swap(
            model.roi_heads,
            backend,
            postprocess_detections=_roi_heads_postprocess,
            forward=_roi_heads_forward,
        )
        for name in ("box_roi_pool", "mask_roi_pool"):
            pool = getattr(model.roi_heads, name)
            if isinstance(pool, torchvision.ops.MultiScaleRoIAlign):
                setattr(model.roi_heads, name, _static_pooler(pool))
        if model.roi_heads.has_mask():
            _swap(model.transform, backend, postprocess=_transform_postprocess)
        return model
    raise TypeError(
        "model must be one of torchvision's RetinaNet, FCOS, SSD, Faster and Mask R-CNN (not "
        f"Keypoint R-CNN yet), got {type(model).__name__}"
    )


def trim(detections: Sequence[dict[str, Tensor]]) -> list[dict[str, Tensor]]:
    """Padded detections (from a model made :func:`xla_ready`) -> torchvision's per-image
    dicts of CPU tensors holding only the ``num_detections`` real entries. One host
    transfer for XLA tensors (after one ``torch_xla.sync()``).

    Raises:
      TypeError: ``detections`` is not a sequence of dicts of tensors.
      ValueError: a dict has no ``num_detections``.
    """
    if not isinstance(detections, Sequence) or not all(
        isinstance(d, dict) and all(isinstance(t, Tensor) for t in d.values()) for d in detections
    ):
        raise TypeError(
            "detections must be a sequence of dicts of tensors (a detection model's output), "
            f"got {type(detections).__name__}"
        )
    if not all("num_detections" in d for d in detections):
        raise ValueError(
            "detections must come from a model made xla_ready: a dict has no num_detections"
        )
    if any(t.device.type == "xla" for d in detections for t in d.values()):
        import torch_xla

        torch_xla.sync()
    trimmed = []
    for image in detections:
        count = int(image["num_detections"].cpu())
        trimmed.append({k: v.cpu()[:count] for k, v in image.items() if k != "num_detections"})
    return trimmed
