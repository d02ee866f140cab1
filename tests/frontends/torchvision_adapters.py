"""The ``adapters`` module that the corpus copies of torchvision's tests import
(``../shared/corpus/torchvision/README.md``): it only renames, putting
:mod:`asickernels.torch.vision`'s functions where the tests look for torchvision's.

``ASICKERNELS_TORCHVISION_PEER`` picks the peer: ``asickernels`` (default) or
``torchvision`` (the control: torchvision's own ops, nothing replaced).
"""

from __future__ import annotations

import os

PEER = os.environ.get("ASICKERNELS_TORCHVISION_PEER", "asickernels")
if PEER not in ("asickernels", "torchvision"):
    raise ValueError(
        f"ASICKERNELS_TORCHVISION_PEER must be asickernels or torchvision, got {PEER!r}"
    )
# The torch.ops namespace whose operators the generated opcheck tests exercise.
OPCHECK_NAMESPACE = "asickernels" if PEER == "asickernels" else "torchvision"


def install() -> None:
    """Replaces torchvision.ops' nms, batched_nms (and both of its implementations),
    generalized_box_iou, generalized_box_iou_loss, roi_align (also inside ``RoIAlign``),
    roi_pool, RoIPool and MultiScaleRoIAlign with asickernels' (PEER=asickernels)."""
    if PEER != "asickernels":
        return
    import importlib

    import torchvision.ops
    import torchvision.ops.boxes
    import torchvision.ops.poolers

    from asickernels.torch import vision

    renames = {
        "nms": vision.nms,
        "batched_nms": vision.batched_nms,
        "generalized_box_iou": vision.generalized_box_iou,
        "generalized_box_iou_loss": vision.generalized_box_iou_loss,
        "roi_align": vision.roi_align,
        "roi_pool": vision.roi_pool,
        "RoIPool": vision.RoIPool,
        "MultiScaleRoIAlign": vision.MultiScaleRoIAlign,
    }
    for name, function in renames.items():
        setattr(torchvision.ops, name, function)
    torchvision.ops.boxes.nms = vision.nms
    torchvision.ops.boxes.batched_nms = vision.batched_nms
    torchvision.ops.boxes._batched_nms_vanilla = vision.batched_nms
    torchvision.ops.boxes._batched_nms_coordinate_trick = vision.batched_nms
    # torchvision.ops.RoIAlign.forward calls its own module's roi_align.
    importlib.import_module("torchvision.ops.roi_align").roi_align = vision.roi_align
    torchvision.ops.poolers.roi_align = vision.roi_align
    torchvision.ops.poolers.MultiScaleRoIAlign = vision.MultiScaleRoIAlign
