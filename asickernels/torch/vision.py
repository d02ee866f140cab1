"""Drop-ins for ``torchvision.ops`` box functions and RoI pooling (RoIAlign, RoIPool), running asickernels' kernels.

Same names, signatures and return types as torchvision's (``nms`` returns every kept index,
int64, in decreasing score order; the IoU functions return ``[N, M]`` matrices; the losses
take ``reduction="none"`` by default), on CPU and torch_xla tensors: every function calls
the ``torch.ops.asickernels.*`` operators (:mod:`asickernels.torch`), so autograd, fake
tensors and torch_xla work as they do for those. Integer and float16/bfloat16 boxes are
upcast to float32 as torchvision upcasts them; float64 is computed in float64.

Errors: an argument of the wrong type (None included) raises a TypeError naming it; the
shapes torchvision checks raise what torchvision raises (RuntimeError for ``nms`` inputs,
AssertionError for RoI boxes); values asickernels refuses (an ``eps`` other than 1e-7, an
``iou_threshold`` outside ``[0, 1]``, an ``output_size`` below 1) raise a ValueError.

Differences from torchvision (kept on purpose; see the README):

* ``eps = 1e-7`` is in every denominator (torchvision's ``box_iou``, ``generalized_box_iou``
  and ``distance_box_iou``'s IoU have none), so degenerate boxes give finite values where
  torchvision returns NaN; CIoU's aspect term is ``atan(w / (h + eps))`` (torchvision:
  ``atan(w / h)``, NaN or inf for zero-height boxes). Other ``eps`` values are refused.
* ``nms`` never keeps a box with a NaN score, and ``iou_threshold`` must be in ``[0, 1]``.
* ``box_iou`` has no gradient (the other functions do).
* ``distance_box_iou`` / ``complete_box_iou`` run the paired DIoU/CIoU kernels on all
  ``N * M`` pairs.
* ``nms`` and ``batched_nms`` return as many indices as they keep, so on XLA devices they
  read the count on the host; :mod:`asickernels.torch.detection` keeps detection models
  free of that sync (padded outputs with a count).
* ``MultiScaleRoIAlign`` pools every RoI at every level (RoIs of other levels shrunk to
  one-pixel boxes, whose sampling is cheap) and keeps each RoI's own level with a mask:
  static shapes, no ``nonzero``.
"""

import math
from collections.abc import Callable

import torch
import torchvision.ops
from torch import Tensor
from torchvision.ops import poolers

import asickernels.torch  # noqa: F401  (registers torch.ops.asickernels.*)

__all__ = [
    "MultiScaleRoIAlign",
    "RoIPool",
    "batched_nms",
    "box_iou",
    "complete_box_iou",
    "complete_box_iou_loss",
    "distance_box_iou",
    "distance_box_iou_loss",
    "generalized_box_iou",
    "generalized_box_iou_loss",
    "nms",
    "roi_align",
    "roi_pool",
]


def _tensor(value: Tensor, name: str) -> Tensor:
    """``value``, or a TypeError naming the argument ``name`` if it is not a tensor."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a Tensor, got {type(value).__name__}")
    return value


def _number(value: float, name: str, kind: type[float] | type[int] = float) -> float:
    """``kind(value)`` (as torchvision converts it), or a TypeError naming the argument
    ``name`` if that fails (None, for one)."""
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number, got {value!r}") from None


def _flag(value: bool, name: str) -> bool:
    """``bool(value)`` for True, False, 1 or 0; a TypeError naming ``name`` otherwise."""
    if value not in (True, False):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def _upcast(t: Tensor, name: str) -> Tensor:
    """float32 for everything but float32 and float64 (torchvision's ``_upcast_non_float``);
    a TypeError naming the argument ``name`` if ``t`` is not a tensor."""
    if _tensor(t, name).dtype not in (torch.float32, torch.float64):
        return t.float()
    return t


def _check_eps(eps: float) -> None:
    # A literal, not a module constant: TorchScript cannot read float globals.
    if eps != 1e-7:
        raise ValueError(f"asickernels computes with eps=1e-7, got eps={eps}")


def _check_nms_inputs(boxes: Tensor, scores: Tensor) -> None:
    _tensor(boxes, "boxes")
    _tensor(scores, "scores")
    # torchvision's TORCH_CHECKs (ops/cpu/nms_kernel.cpp), raising RuntimeError as they do.
    if boxes.dim() != 2:
        raise RuntimeError(f"boxes should be a 2d tensor, got {boxes.dim()}D")
    if boxes.size(1) != 4:
        raise RuntimeError(f"boxes should have 4 elements in dimension 1, got {boxes.size(1)}")
    if scores.dim() != 1:
        raise RuntimeError(f"scores should be a 1d tensor, got {scores.dim()}D")
    if boxes.size(0) != scores.size(0):
        raise RuntimeError(
            "boxes and scores should have same number of elements in dimension 0, got "
            f"{boxes.size(0)} and {scores.size(0)}"
        )


def _kept(indices: Tensor, num_valid: Tensor) -> Tensor:
    return indices[: int(num_valid.item())].to(torch.int64)


def nms(boxes: Tensor, scores: Tensor, iou_threshold: float) -> Tensor:
    """``torchvision.ops.nms``: boxes ``[N, 4]`` ``(x1, y1, x2, y2)``, scores ``[N]`` ->
    the int64 indices of the kept boxes, in decreasing order of score. A box is suppressed
    when its IoU with a kept box is greater than ``iou_threshold`` (in ``[0, 1]``: else a
    ValueError). A non-tensor box or score argument raises a TypeError naming it."""
    _check_nms_inputs(boxes, scores)
    threshold = _number(iou_threshold, "iou_threshold")
    if boxes.size(0) == 0:
        return torch.empty((0,), dtype=torch.int64, device=boxes.device)
    indices, num_valid = torch.ops.asickernels.nms(
        _upcast(boxes, "boxes"),
        _upcast(scores, "scores"),
        iou_threshold=threshold,
        max_output_size=boxes.size(0),
    )
    return _kept(indices, num_valid)


def batched_nms(boxes: Tensor, scores: Tensor, idxs: Tensor, iou_threshold: float) -> Tensor:
    """``torchvision.ops.batched_nms``: NMS within each category ``idxs [N]`` (boxes of
    different categories never suppress each other) -> int64 kept indices in decreasing
    order of score. Empty ``boxes`` give an empty result whatever the other arguments are
    (as torchvision: its own test calls ``batched_nms(empty, None, None, None)``); otherwise
    a non-tensor argument raises a TypeError naming it."""
    if _tensor(boxes, "boxes").numel() == 0:
        return torch.empty((0,), dtype=torch.int64, device=boxes.device)
    _tensor(idxs, "idxs")
    threshold = _number(iou_threshold, "iou_threshold")
    _check_nms_inputs(boxes, scores)
    if idxs.dim() != 1 or idxs.size(0) != boxes.size(0):
        raise RuntimeError(
            f"idxs should be a 1d tensor of {boxes.size(0)} elements, got shape {tuple(idxs.shape)}"
        )
    indices, num_valid = torch.ops.asickernels.batched_nms(
        _upcast(boxes, "boxes"),
        _upcast(scores, "scores"),
        idxs,
        iou_threshold=threshold,
        max_output_size=boxes.size(0),
    )
    return _kept(indices, num_valid)


def box_iou(boxes1: Tensor, boxes2: Tensor) -> Tensor:
    """``torchvision.ops.box_iou``: ``[N, 4]`` x ``[M, 4]`` -> ``[N, M]`` IoU."""
    return torch.ops.asickernels.box_iou(_upcast(boxes1, "boxes1"), _upcast(boxes2, "boxes2"))


def generalized_box_iou(boxes1: Tensor, boxes2: Tensor) -> Tensor:
    """``torchvision.ops.generalized_box_iou``: ``[N, 4]`` x ``[M, 4]`` -> ``[N, M]`` GIoU."""
    return torch.ops.asickernels.generalized_box_iou(
        _upcast(boxes1, "boxes1"), _upcast(boxes2, "boxes2")
    )


def _all_pairs(boxes1: Tensor, boxes2: Tensor) -> tuple[Tensor, Tensor]:
    """``[N, 4]``, ``[M, 4]`` -> both ``[N, M, 4]``: every pair, for the paired kernels."""
    first, second = _upcast(boxes1, "boxes1"), _upcast(boxes2, "boxes2")
    n, m = first.size(0), second.size(0)
    first = first.unsqueeze(1).expand(n, m, 4)
    second = second.unsqueeze(0).expand(n, m, 4)
    return first, second


def distance_box_iou(boxes1: Tensor, boxes2: Tensor, eps: float = 1e-7) -> Tensor:
    """``torchvision.ops.distance_box_iou``: ``[N, 4]`` x ``[M, 4]`` -> ``[N, M]`` DIoU."""
    _check_eps(eps)
    first, second = _all_pairs(boxes1, boxes2)
    return torch.ops.asickernels.diou(first, second)


def complete_box_iou(boxes1: Tensor, boxes2: Tensor, eps: float = 1e-7) -> Tensor:
    """``torchvision.ops.complete_box_iou``: ``[N, 4]`` x ``[M, 4]`` -> ``[N, M]`` CIoU."""
    _check_eps(eps)
    first, second = _all_pairs(boxes1, boxes2)
    return torch.ops.asickernels.ciou(first, second)


def _check_reduction(reduction: str) -> None:
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(
            f"Invalid Value for arg 'reduction': '{reduction} \n Supported reduction modes: "
            "'none', 'mean', 'sum'"
        )


def _iou_loss(op_name: str, what: str) -> Callable[..., Tensor]:
    """torchvision's ``<what>_loss`` signature over ``torch.ops.asickernels.<op_name>``."""
    operator = getattr(torch.ops.asickernels, op_name)

    def loss(boxes1: Tensor, boxes2: Tensor, reduction: str = "none", eps: float = 1e-7) -> Tensor:
        _check_reduction(reduction)
        _check_eps(eps)
        return operator(_upcast(boxes1, "boxes1"), _upcast(boxes2, "boxes2"), reduction=reduction)

    loss.__name__ = loss.__qualname__ = f"{what}_loss"
    loss.__doc__ = (
        f"``torchvision.ops.{what}_loss``: ``1 - {op_name.split('_')[0].upper()}`` of paired "
        'boxes ``[..., 4]``; ``reduction`` "none" (``[...]``), "mean" (0 for no boxes) or "sum".'
    )
    return loss


generalized_box_iou_loss = _iou_loss("giou_loss", "generalized_box_iou")
distance_box_iou_loss = _iou_loss("diou_loss", "distance_box_iou")
complete_box_iou_loss = _iou_loss("ciou_loss", "complete_box_iou")


def _rois(boxes: Tensor | list[Tensor]) -> Tensor:
    """``[K, 5]`` RoIs (batch index first) from a ``[K, 5]`` tensor or per-image ``[L, 4]``
    boxes, checked as torchvision's ``check_roi_boxes_shape`` checks them."""
    if isinstance(boxes, (list, tuple)):
        for i, per_image in enumerate(boxes):
            if _tensor(per_image, f"boxes[{i}]").dim() != 2 or per_image.size(1) != 4:
                raise AssertionError(
                    "The shape of the tensor in the boxes list is not correct as List[Tensor[L, 4]]"
                )
        concatenated = torch.cat(list(boxes), 0)
        index = torch.cat(
            [
                torch.full_like(b[:, :1], i, layout=torch.strided, device=b.device)
                for i, b in enumerate(boxes)
            ],
            0,
        )
        return torch.cat([index, concatenated], 1)
    if not isinstance(boxes, Tensor):
        raise TypeError(
            f"boxes must be a Tensor[K, 5] or a list of Tensor[L, 4], got {type(boxes)}"
        )
    if boxes.dim() != 2 or boxes.size(1) != 5:
        raise AssertionError("The boxes tensor shape is not correct as Tensor[K, 5]")
    return boxes


def _pool(
    operator: Callable[..., Tensor],
    input: Tensor,
    boxes: Tensor | list[Tensor],
    output_size: int | tuple[int, int] | list[int],
    spatial_scale: float,
    **options: object,
) -> Tensor:
    """``operator`` (``torch.ops.asickernels.roi_align`` or ``roi_pool``) on ``input`` and
    the RoIs of ``boxes`` (see :func:`_rois`), in the input's dtype."""
    _tensor(input, "input")
    rois = _rois(boxes)
    if isinstance(output_size, int) and not isinstance(output_size, bool):
        size = [output_size, output_size]
    elif isinstance(output_size, (tuple, list)) and len(output_size) == 2:
        size = list(output_size)
    else:
        raise TypeError(f"output_size must be an int or a pair of ints, got {output_size!r}")
    return operator(
        input,
        rois.to(input.dtype),
        output_size=size,
        spatial_scale=_number(spatial_scale, "spatial_scale"),
        **options,
    )


def roi_align(
    input: Tensor,
    boxes: Tensor | list[Tensor],
    output_size: int | tuple[int, int] | list[int],
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = False,
) -> Tensor:
    """``torchvision.ops.roi_align``: ``input [N, C, H, W]``, ``boxes`` ``Tensor[K, 5]``
    (batch index, x1, y1, x2, y2) or per-image ``[Tensor[L, 4]]`` -> ``[K, C, *output_size]``
    in the input's dtype; differentiable in ``input`` (see :func:`asickernels.roi_align`)."""
    return _pool(
        torch.ops.asickernels.roi_align,
        input,
        boxes,
        output_size,
        spatial_scale,
        sampling_ratio=int(_number(sampling_ratio, "sampling_ratio", int)),
        aligned=_flag(aligned, "aligned"),
    )


def roi_pool(
    input: Tensor,
    boxes: Tensor | list[Tensor],
    output_size: int | tuple[int, int] | list[int],
    spatial_scale: float = 1.0,
) -> Tensor:
    """``torchvision.ops.roi_pool``: ``input [N, C, H, W]``, ``boxes`` ``Tensor[K, 5]``
    (batch index, x1, y1, x2, y2) or per-image ``[Tensor[L, 4]]`` -> ``[K, C, *output_size]``,
    each bin's maximum, in the input's dtype; differentiable in ``input`` (see
    :func:`asickernels.roi_pool`)."""
    return _pool(torch.ops.asickernels.roi_pool, input, boxes, output_size, spatial_scale)


class RoIPool(torchvision.ops.RoIPool):
    """``torchvision.ops.RoIPool`` (same arguments, same results) running :func:`roi_pool`."""

    def forward(self, input: Tensor, rois: Tensor | list[Tensor]) -> Tensor:
        return roi_pool(input, rois, self.output_size, self.spatial_scale)


def _setup_scales(
    features: list[Tensor],
    image_shapes: list[tuple[int, int]],
    canonical_scale: int,
    canonical_level: int,
) -> tuple[list[float], poolers.LevelMapper]:
    """torchvision's ``poolers._setup_scales`` (each level's scale the power of 2 nearest its
    height over the largest image's, and the level mapper) in Python arithmetic on shapes,
    which ``torch.compile`` and ``torch.export`` fold into constants; torchvision's reads
    tensors back with ``.item()``, a graph break."""
    if not image_shapes:
        raise ValueError("images list should not be empty")
    height = max(shape[0] for shape in image_shapes)
    exponents = [round(math.log2(feature.shape[-2] / height)) for feature in features]
    mapper = poolers.initLevelMapper(
        -exponents[0],
        -exponents[-1],
        canonical_scale=canonical_scale,
        canonical_level=canonical_level,
    )
    return [2.0**e for e in exponents], mapper


class MultiScaleRoIAlign(torchvision.ops.MultiScaleRoIAlign):
    """``torchvision.ops.MultiScaleRoIAlign`` (same arguments, same results) running
    :func:`roi_align`, with static shapes: no per-level ``nonzero`` (see the module
    docstring)."""

    def forward(
        self,
        x: dict[str, Tensor],
        boxes: list[Tensor],
        image_shapes: list[tuple[int, int]],
    ) -> Tensor:
        if not isinstance(x, dict):
            raise TypeError(f"x must be a dict of feature maps, got {type(x).__name__}")
        if not isinstance(image_shapes, (list, tuple)):
            raise TypeError(
                f"image_shapes must be a list of (height, width), got {type(image_shapes).__name__}"
            )
        features = poolers._filter_input(x, self.featmap_names)
        if self.scales is None or self.map_levels is None:  # type: ignore[has-type]
            self.scales, self.map_levels = _setup_scales(
                features, image_shapes, self.canonical_scale, self.canonical_level
            )
        rois = _rois(boxes)
        if len(features) == 1:
            return roi_align(
                features[0], rois, self.output_size, self.scales[0], self.sampling_ratio
            )
        levels = self.map_levels(boxes)
        result = None
        for level, (level_features, scale) in enumerate(zip(features, self.scales, strict=True)):
            here = levels == level
            # Elsewhere the RoI shrinks to the point (0, 0): one sample per bin, no cost.
            shrunk = torch.cat([rois[:, :1], torch.where(here[:, None], rois[:, 1:], 0.0)], 1)
            pooled = roi_align(level_features, shrunk, self.output_size, scale, self.sampling_ratio)
            kept = torch.where(here[:, None, None, None], pooled, 0.0).to(features[0].dtype)
            result = kept if result is None else result + kept
        assert result is not None
        return result
