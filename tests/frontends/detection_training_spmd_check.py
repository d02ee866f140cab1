"""A training step of a detection model made ``xla_ready`` (``retinanet``, ``fcos``,
``faster_rcnn`` or ``mask_rcnn``: the first argument) under torch_xla SPMD on 4 CPU
devices, the batch sharded over them, against the same step unsharded (run in its own
process by tests/frontends/test_detection_training.py: SPMD mode and the device count are
fixed when the XLA runtime starts). Prints "ok" when the losses and the updated weights
agree. With ``--float64`` it first prints how far both steps' weights, and the same step
on CPU tensors, land from a float64 CPU step (the exact answer, up to its rounding)."""

from __future__ import annotations

import copy
import os
import sys

os.environ["PJRT_DEVICE"] = "CPU"
os.environ["CPU_NUM_DEVICES"] = "4"

import numpy as np
import torch
import torch_xla
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr

xr.use_spmd()

from asickernels.testing import detection_models  # noqa: E402
from asickernels.torch import detection  # noqa: E402
from asickernels.torch.detection_training import pad_targets  # noqa: E402

TOLERANCE = 1e-5
# The random-weight heads have huge gradients: a step of 1e-5 moves a weight by up to 35
# (RetinaNet) or 176 (FCOS: FPN biases, gradients up to 1.8e7). A weight's rounding error
# is then the learning rate times its gradient's, which scales with the largest gradient
# of its tensor, not with the weight: each tensor is allowed TOLERANCE of its largest
# update (item 2's "gradients to 1e-5 of the largest"), and at least TOLERANCE. Measured
# against a float64 CPU step (``--float64``), FCOS's single-device, sharded and CPU
# float32 steps land up to 2.2e-6, 2.1e-6 and 1.8e-6 of a tensor's largest update away
# (1.5e-5 is one float32 ulp at 176), and the sharded and single-device steps differ by
# <= 5.6e-7 of it: rounding.
LEARNING_RATE = 1e-5
SHAPES = ((128, 160),) * 4
SAMPLING = ("faster_rcnn", "mask_rcnn")


def targets(masks: bool) -> list[dict[str, torch.Tensor]]:
    """1-3 random boxes per image (Mask R-CNN: each box's left half its mask), padded to 3."""
    generator = torch.Generator().manual_seed(0)
    out = []
    for (height, width), count in zip(SHAPES, (1, 2, 3, 1), strict=True):
        corner = torch.rand(count, 2, generator=generator) * 60
        boxes = torch.cat([corner, corner + 20 + torch.rand(count, 2, generator=generator) * 40], 1)
        target = {"boxes": boxes, "labels": torch.randint(1, 5, (count,), generator=generator)}
        if masks:
            target["masks"] = torch.zeros(count, height, width, dtype=torch.uint8)
            for mask, (x1, y1, x2, y2) in zip(target["masks"], boxes.long().tolist(), strict=True):
                mask[y1:y2, x1 : (x1 + x2) // 2 + 1] = 1
        out.append(target)
    return pad_targets(out, 3)


def model(kind: str) -> torch.nn.Module:
    built = detection_models.model(kind)
    if kind in SAMPLING:
        built.rpn._pre_nms_top_n["training"] = 200
        built.rpn._post_nms_top_n["training"] = 100
        # Sample every candidate: the comparison does not rest on the random draws.
        built.rpn.fg_bg_sampler.batch_size_per_image = 10**6
        built.roi_heads.fg_bg_sampler.batch_size_per_image = 10**6
    return detection.xla_ready(built, backend="xla").train()


def step(
    model: torch.nn.Module,
    batch: list[dict[str, torch.Tensor]],
    mesh: xs.Mesh | None,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[dict, list[torch.Tensor]]:
    """One SGD step on ``device`` (default: the XLA device) in ``dtype`` -> (losses,
    updated weights) on the host."""
    device = device or torch_xla.device()
    model = copy.deepcopy(model).to(device, dtype)
    if mesh is not None:

        def shard(_: torch.nn.Module, args: tuple[torch.Tensor]) -> None:
            # The batched images [B, 3, H, W], split along B (annotated in place).
            xs.mark_sharding(args[0], mesh, ("data", None, None, None))

        model.backbone.register_forward_pre_hook(shard)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    images = [image.to(device, dtype) for image in detection_models.images(shapes=SHAPES)]
    batch = [
        {k: v.to(device) for k, v in t.items()} | {"boxes": t["boxes"].to(device, dtype)}
        for t in batch
    ]
    losses = model(images, batch)
    sum(losses.values()).backward()
    optimizer.step()
    if device.type == "xla":
        torch_xla.sync()
    return (
        {k: v.detach().cpu() for k, v in losses.items()},
        [p.detach().cpu() for p in model.parameters()],
    )


def report_float64(
    ready: torch.nn.Module, batch: list[dict[str, torch.Tensor]], steps: dict[str, list]
) -> None:
    """Prints how far each step's weights land from a float64 CPU step's, as the largest
    over the tensors of (largest difference / the tensor's largest update)."""
    _, truth = step(ready, batch, None, torch.device("cpu"), torch.float64)
    _, steps["cpu_float32"] = step(ready, batch, None, torch.device("cpu"))
    before = [p.detach().double() for p in ready.parameters()]
    for name, weights in steps.items():
        worst = max(
            float((got.double() - want).abs().max() / (want - start).abs().max().clamp(min=1e-30))
            for got, want, start in zip(weights, truth, before, strict=True)
            # (below that, an update is not much larger than its weights' own rounding)
            if (want - start).abs().max() > 1.0
        )
        print(f"{name}: up to {worst:.2e} of a tensor's largest update from float64")


def main(kind: str, float64: bool = False) -> None:
    assert xr.global_runtime_device_count() == 4
    mesh = xs.Mesh(np.arange(4), (4,), ("data",))
    ready = model(kind)
    batch = targets(masks=kind == "mask_rcnn")
    want_losses, want_weights = step(ready, batch, None)
    got_losses, got_weights = step(ready, batch, mesh)
    if float64:
        report_float64(ready, batch, {"single_device": want_weights, "sharded": got_weights})
    for name, loss in want_losses.items():
        torch.testing.assert_close(got_losses[name], loss, rtol=TOLERANCE, atol=0.0, msg=name)
    largest_update = largest_difference = 0.0
    for got, want, before in zip(got_weights, want_weights, ready.parameters(), strict=True):
        update = float((want - before.detach()).abs().max())
        torch.testing.assert_close(got, want, rtol=TOLERANCE, atol=TOLERANCE * max(1.0, update))
        largest_update = max(largest_update, update)
        largest_difference = max(largest_difference, float((got - want).abs().max()))
    # The step moves the weights by far more than the tolerance (the check is not vacuous).
    assert largest_update > 100 * TOLERANCE, largest_update
    print(kind, {k: float(v) for k, v in got_losses.items()}, largest_update, largest_difference)
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "retinanet", "--float64" in sys.argv)
