"""Small torchvision detection models with random weights, for the detection tests and the
detection benchmark: MobileNetV3-small FPN backbones (3 feature levels), 5 classes, score
thresholds 0 so that NMS has work, nothing downloaded. Needs torch and torchvision."""

from __future__ import annotations

from typing import Any

import torch
from torchvision.models.detection import (
    FCOS,
    FasterRCNN,
    MaskRCNN,
    RetinaNet,
    ssd300_vgg16,
    ssdlite320_mobilenet_v3_large,
)
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.backbone_utils import mobilenet_backbone
from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor

NUM_CLASSES = 5


def _backbone() -> torch.nn.Module:
    return mobilenet_backbone(
        backbone_name="mobilenet_v3_small", weights=None, fpn=True, trainable_layers=6
    )


def _retinanet(sizes: dict[str, int]) -> torch.nn.Module:
    anchors = AnchorGenerator(
        sizes=((32, 40, 50), (64, 80, 101), (128, 161, 203)),
        aspect_ratios=((0.5, 1.0, 2.0),) * 3,
    )
    return RetinaNet(_backbone(), NUM_CLASSES, anchor_generator=anchors, score_thresh=0.0, **sizes)


def _fcos(sizes: dict[str, int]) -> torch.nn.Module:
    anchors = AnchorGenerator(sizes=((8,), (16,), (32,)), aspect_ratios=((1.0,),) * 3)
    return FCOS(_backbone(), NUM_CLASSES, anchor_generator=anchors, score_thresh=0.0, **sizes)


def _faster_rcnn(sizes: dict[str, int], kind: type = FasterRCNN) -> torch.nn.Module:
    anchors = AnchorGenerator(sizes=((32, 64, 128),) * 3, aspect_ratios=((0.5, 1.0, 2.0),) * 3)
    return kind(
        _backbone(),
        NUM_CLASSES,
        rpn_anchor_generator=anchors,
        rpn_pre_nms_top_n_test=200,
        rpn_post_nms_top_n_test=100,
        box_score_thresh=0.0,
        **sizes,
    )


def _mask_rcnn(sizes: dict[str, int]) -> torch.nn.Module:
    # A one-layer, 32-channel mask head: torchvision's four 256-channel layers cost ~20
    # GFLOP per image on 100 detections.
    built = _faster_rcnn(sizes, MaskRCNN)
    built.roi_heads.mask_head = MaskRCNNHeads(built.backbone.out_channels, [32], 1)
    built.roi_heads.mask_predictor = MaskRCNNPredictor(32, 32, NUM_CLASSES)
    return built


def _ssd(sizes: dict[str, int]) -> torch.nn.Module:
    # SSD resizes every image to 300x300 (its own fixed size); ``sizes`` does not apply.
    return ssd300_vgg16(weights=None, weights_backbone=None, num_classes=NUM_CLASSES)


def _ssdlite(sizes: dict[str, int]) -> torch.nn.Module:
    return ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=NUM_CLASSES
    )


BUILDERS = {
    "retinanet": _retinanet,
    "fcos": _fcos,
    "faster_rcnn": _faster_rcnn,
    "mask_rcnn": _mask_rcnn,
    "ssd": _ssd,
    "ssdlite": _ssdlite,
}


def _heads(model: Any, kind: str) -> list[tuple[torch.nn.Module, float]]:
    """The layers :func:`model` re-draws, each with its weight std."""
    if kind in ("faster_rcnn", "mask_rcnn"):  # (the mask head keeps its own init)
        predictor = model.roi_heads.box_predictor
        return [
            (model.rpn.head, 0.1),
            (model.roi_heads.box_head, 1.0),
            (predictor.cls_score, 100.0),
            (predictor.bbox_pred, 0.1),
        ]
    if kind in ("ssd", "ssdlite"):  # their convolutions (SSDlite's batch norms stay)
        std = {"ssd": 0.01, "ssdlite": 0.05}[kind]
        return [(m, std) for m in model.head.modules() if isinstance(m, torch.nn.Conv2d)]
    return [(model.head, {"retinanet": 0.5, "fcos": 0.1}[kind])]


def model(kind: str, min_size: int = 160, max_size: int = 320) -> torch.nn.Module:
    """``kind`` (a key of :data:`BUILDERS`) in eval mode, seeded, with its heads re-drawn:
    torchvision's initialization (std 0.01, a prior bias) gives random features nearly equal
    float32 scores, and which of tied candidates survive a top-k or the
    ``detections_per_img`` cut is implementation-defined (in torchvision too). These
    weights (zero biases, a std per layer) space the kept scores >= 2.5e-6 apart (at the
    default sizes), well beyond XLA's ~1e-7 deviations, so every cut is decided."""
    torch.manual_seed(0)
    built = BUILDERS[kind](dict(min_size=min_size, max_size=max_size)).eval()
    with torch.no_grad():
        if kind == "ssdlite":  # MobileNetV3's own init shrinks the features to ~1e-20
            for module in built.backbone.modules():
                if isinstance(module, torch.nn.Conv2d):
                    torch.nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
        for head, std in _heads(built, kind):
            for name, parameter in head.named_parameters():
                if name.endswith("weight"):
                    parameter.normal_(std=std)
                else:
                    parameter.zero_()
    return built


SHAPES = ((160, 200), (180, 160))
# SSD300 resizes every image to 300x300; torch_xla's bilinear resize differs from PyTorch's
# for some ratios (pytorch/xla#8897: 180 -> 300 moves pixels by up to ~1 of the [0, 1)
# range, 160 -> 300 and 200 -> 300 agree to 2e-7), which moves SSD300's detections on the
# XLA device, with or without xla_ready. Its images avoid that ratio.
SSD_SHAPES = ((160, 200), (200, 160))


def images(seed: int = 1, shapes: tuple[tuple[int, int], ...] = SHAPES) -> list:
    """Random ``[3, H, W]`` images in ``[0, 1)``."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.rand(3, h, w, generator=generator) for h, w in shapes]


def images_for(kind: str, seed: int = 1) -> list:
    """:func:`images` of the shapes the tests and the benchmark give ``kind``."""
    return images(seed, SSD_SHAPES if kind == "ssd" else SHAPES)


def detections_per_img(built: Any) -> int:
    """The number of detections ``built`` (a model of :data:`BUILDERS`) keeps per image."""
    found = getattr(built, "detections_per_img", None)
    return int(found if found is not None else built.roi_heads.detections_per_img)
