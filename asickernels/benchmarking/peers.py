"""Peers timed beside our backends: implementations that are not ours.

* ``torchvision``: ``torchvision.ops.nms``, ``batched_nms``, ``roi_align``, ``roi_pool`` and
  ``generalized_box_iou_loss`` (forward, and its backward through autograd), when
  torchvision imports (it is in the torch_xla environment, not in the main one).
* ``numpy``: greedy NMS in numpy in the style of the NMS article's CPU baseline (sort once,
  then repeatedly take the best remaining box and drop the boxes that overlap it), written
  to the library's rule (suppress when IoU > threshold; equal scores by index).

The registered ``"xla"`` backend is the third peer (jitted ``jax.numpy``; for int8 matmul,
XLA's int8 dot with ``preferred_element_type=int32``): see :data:`PEER_BACKENDS`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from asickernels.benchmarking.workloads import Prepared
from asickernels.kernels import public
from asickernels.kernels.cases import Case
from asickernels.kernels.declaration import Op
from asickernels.kernels.registry import Availability

if TYPE_CHECKING:
    import torch

# Registered backends that count as peers (what you get without custom kernels).
PEER_BACKENDS: dict[str, str] = {
    "xla": "jitted jax.numpy (for int8 matmul: XLA's int8 dot, preferred_element_type=int32)",
}


@dataclasses.dataclass(frozen=True)
class Peer:
    name: str
    description: str
    probe: Callable[[], Availability]
    builders: dict[Op, Callable[[Case], Prepared]]  # the prepared call of each op


def _pad_indices(kept: npt.ArrayLike, max_output_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Kept indices (any length, best first) -> (``[max_output_size]`` padded with -1, count)."""
    head = np.asarray(kept, np.int64)[:max_output_size]
    indices = np.full((max_output_size,), -1, np.int32)
    indices[: head.size] = head
    return indices, np.asarray(head.size, np.int32)


def _single_image(case: Case) -> None:
    if case.arrays[0].ndim != 2 or case.static.get("score_threshold") is not None:
        raise ValueError("this peer takes one image's boxes [N, 4] and no score threshold")


# -- numpy ---------------------------------------------------------------------------------


def numpy_nms(
    boxes: np.ndarray,
    scores: np.ndarray,
    iou_threshold: float,
    max_output_size: int,
    categories: np.ndarray | None = None,
) -> list[int]:
    """Greedy NMS of ``boxes [N, 4]`` by ``scores [N]``: kept indices, best first.

    With ``categories``, boxes of different categories are moved apart by an offset larger
    than any coordinate, so they never overlap (torchvision's ``batched_nms`` trick).
    """
    if categories is not None and boxes.size:
        boxes = boxes + (categories * (np.max(boxes) + 1)).astype(boxes.dtype)[:, None]
    x1, y1, x2, y2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    areas = (x2 - x1) * (y2 - y1)
    order = np.argsort(-scores, kind="stable")
    remaining = order[~np.isnan(scores[order])]
    kept: list[int] = []
    while remaining.size and len(kept) < max_output_size:
        best, rest = remaining[0], remaining[1:]
        kept.append(int(best))
        width = np.clip(np.minimum(x2[best], x2[rest]) - np.maximum(x1[best], x1[rest]), 0, None)
        height = np.clip(np.minimum(y2[best], y2[rest]) - np.maximum(y1[best], y1[rest]), 0, None)
        inter = width * height
        union = areas[best] + areas[rest] - inter
        iou = np.where(union > 0, inter / np.where(union > 0, union, 1), 0)
        remaining = rest[iou <= iou_threshold]
    return kept


def _numpy_nms_builder(case: Case) -> Prepared:
    _single_image(case)
    boxes, scores = case.arrays[0], case.arrays[1]
    categories = case.arrays[2] if len(case.arrays) > 2 else None
    threshold, max_output = case.static["iou_threshold"], case.static["max_output_size"]
    return Prepared(
        lambda: numpy_nms(boxes, scores, threshold, max_output, categories),
        lambda kept: _pad_indices(kept, max_output),
    )


def _numpy_probe() -> Availability:
    return Availability("native", f"numpy {np.__version__}")


# -- torchvision ---------------------------------------------------------------------------


# PyTorch's CPU build (PyPI's Linux torch is the CUDA build: several GB of nvidia wheels that
# no asickernels path uses). Installed first, it satisfies the torch extra's requirements.
TORCH_INSTALL = "pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu"


@functools.cache
def _torchvision_probe() -> Availability:
    try:
        import torch
        import torchvision
        import torchvision.ops
    except ImportError as error:
        return Availability(
            "missing",
            f"torchvision does not import here ({error})",
            f"{TORCH_INSTALL} (the CPU build)",
        )
    return Availability(
        "native", f"torchvision {torchvision.__version__}, torch {torch.__version__}, CPU"
    )


def _torchvision_nms(case: Case) -> Prepared:
    import torch
    from torchvision import ops

    _single_image(case)
    boxes, scores = torch.from_numpy(case.arrays[0]), torch.from_numpy(case.arrays[1])
    threshold, max_output = case.static["iou_threshold"], case.static["max_output_size"]
    if len(case.arrays) > 2:
        categories = torch.from_numpy(case.arrays[2])
        call = functools.partial(ops.batched_nms, boxes, scores, categories, threshold)
    else:
        call = functools.partial(ops.nms, boxes, scores, threshold)
    return Prepared(call, lambda kept: _pad_indices(kept.numpy(), max_output))


def _torch_pairs(case: Case) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
    """The case's two box arrays as float32 ``[P, 4]`` CPU tensors, and their batch shape."""
    import torch

    shape = case.arrays[0].shape[:-1]
    first, second = (torch.from_numpy(a.reshape(-1, 4).astype(np.float32)) for a in case.arrays[:2])
    return first, second, shape


def _torchvision_giou(case: Case) -> Prepared:
    from torchvision import ops

    first, second, shape = _torch_pairs(case)
    return Prepared(
        lambda: ops.generalized_box_iou_loss(first, second, reduction="none"),
        lambda loss: (1.0 - loss.numpy()).reshape(shape),
    )


def _torchvision_giou_vjp(case: Case) -> Prepared:
    import torch
    from torchvision import ops

    first, second, shape = _torch_pairs(case)
    first.requires_grad_(True)
    second.requires_grad_(True)
    # d/dx sum(c * giou) = -d/dx sum(c * loss), since giou = 1 - loss.
    negative_cotangent = -torch.from_numpy(case.arrays[2].reshape(-1).astype(np.float32))

    def call() -> tuple[torch.Tensor, ...]:
        loss = ops.generalized_box_iou_loss(first, second, reduction="none")
        return torch.autograd.grad((loss * negative_cotangent).sum(), (first, second))

    return Prepared(call, lambda grads: tuple(g.numpy().reshape((*shape, 4)) for g in grads))


def _torchvision_metric(loss_name: str) -> Callable[[Case], Prepared]:
    """DIoU or CIoU as ``1 - torchvision.ops.<loss_name>``."""

    def prepare(case: Case) -> Prepared:
        from torchvision import ops

        first, second, shape = _torch_pairs(case)
        loss = getattr(ops, loss_name)
        return Prepared(
            lambda: loss(first, second, reduction="none"),
            # float32, as computed: the oracle's tolerance follows the result's dtype.
            lambda out: (1.0 - out.numpy()).reshape(shape),
        )

    return prepare


def _torchvision_pairwise(function_name: str) -> Callable[[Case], Prepared]:
    """``torchvision.ops.<function_name>`` on each image's ``[N, 4]`` x ``[M, 4]`` boxes."""

    def prepare(case: Case) -> Prepared:
        import torch
        from torchvision import ops

        function = getattr(ops, function_name)
        first, second = case.arrays
        images = [
            (torch.from_numpy(a.astype(np.float32)), torch.from_numpy(b.astype(np.float32)))
            for a, b in zip(
                first.reshape(-1, *first.shape[-2:]),
                second.reshape(-1, *second.shape[-2:]),
                strict=True,
            )
        ]
        shape = first.shape[:-1] + second.shape[-2:-1]
        return Prepared(
            lambda: [function(a, b) for a, b in images],
            lambda out: np.stack([o.numpy() for o in out]).reshape(shape),
        )

    return prepare


def _torchvision_pooling(function_name: str) -> Callable[[Case], Prepared]:
    """``torchvision.ops.<function_name>`` (``roi_align`` or ``roi_pool``) on the case's
    feature map and ``[K, 5]`` RoIs, with its statics."""

    def prepare(case: Case) -> Prepared:
        import torch
        from torchvision import ops

        function = functools.partial(getattr(ops, function_name), **case.static)
        features, rois = (torch.from_numpy(np.ascontiguousarray(a)) for a in case.arrays)
        return Prepared(lambda: function(features, rois), lambda out: out.numpy())

    return prepare


PEERS: dict[str, Peer] = {
    peer.name: peer
    for peer in (
        Peer(
            "torchvision",
            "torchvision.ops (nms, batched_nms, box_iou, generalized_box_iou, roi_align, "
            "roi_pool and the GIoU, DIoU and CIoU losses)",
            _torchvision_probe,
            {
                public.giou: _torchvision_giou,
                public.giou_vjp: _torchvision_giou_vjp,
                public.nms: _torchvision_nms,
                public.batched_nms: _torchvision_nms,
                public.box_iou: _torchvision_pairwise("box_iou"),
                public.generalized_box_iou: _torchvision_pairwise("generalized_box_iou"),
                public.diou: _torchvision_metric("distance_box_iou_loss"),
                public.ciou: _torchvision_metric("complete_box_iou_loss"),
                public.roi_align: _torchvision_pooling("roi_align"),
                public.roi_pool: _torchvision_pooling("roi_pool"),
            },
        ),
        Peer(
            "numpy",
            "greedy NMS in numpy, in the style of the NMS article's CPU baseline",
            _numpy_probe,
            {public.nms: _numpy_nms_builder, public.batched_nms: _numpy_nms_builder},
        ),
    )
}
