"""Training steps of torchvision's detection models: on the torch_xla CPU device as
:func:`asickernels.torch.detection.xla_ready` makes them (static-shape losses), as plain
torch_xla runs torchvision's code, and on CPU tensors with torchvision.

Run in the torch environment, one model per process (the recorded runs: fcos,
faster_rcnn, mask_rcnn, retinanet, ssdlite (3 steps) and ssd in turn, each to its own
``benchmarks/detection/results_training_<model>.json``; written to a scratch directory
first, as their "command" says):

    PJRT_DEVICE=CPU .venv-torch-xla/bin/python benchmarks/detection/bench_training.py \
        --models fcos --steps 2 --plain-timeout 900 \
        --out benchmarks/detection/results_training_fcos.json

Recorded on a 2-core machine shared with other jobs: load average 0.1 when FCOS ran, 1-15
for the others (the files from mask_rcnn on record it). Steps per second (the second step;
the first compiles), xla_ready on the torch_xla CPU device / plain torch_xla / CPU
torchvision: FCOS 1.76 / 0.046 / 7.8, Faster R-CNN 0.25 / 0.0014 / 0.054, Mask R-CNN 0.26
/ 0.0019 / 0.10, RetinaNet 0.58 / 0.0079 / 0.027, SSDlite 0.92 / 0.032 / 0.62 (load 3-5),
SSD300 0.16 / 0.031 / 0.11 (load 3-4). Every xla_ready step: 0 fallbacks, one compilation
(first step 17-199 s); plain torch_xla: 13-56 fallbacks and 5-56 compilations every step
(first step 22-812 s). CPU torchvision is the most load-sensitive: its two intra-op
threads wait on each other when the cores are oversubscribed (measured beside these runs,
FCOS's CPU step: 1.0-1.3 s with ``torch.set_num_threads(1)``, 10-19 s with 2 threads; 0.13
s on the idle machine). So under load its column understates CPU torchvision; FCOS's row,
on the idle machine, is the fair one: there CPU torchvision's step is 4.4x faster than
xla_ready's on the torch_xla CPU device (which stands in for a TPU here), and xla_ready's
38x faster than plain torch_xla's.

A step is forward, losses, backward and an SGD update on a batch of 2 images
(asickernels.testing.detection_models' shapes) with 1 and 3 random boxes padded to 4
(``pad_targets``; torchvision's own runs get the unpadded targets); every step has new
images and boxes. Per model and way of running it (each step runs every way in turn, in
one process): steps per second (median over the steps after the first, which compiles),
the first step's seconds, CPU fallbacks and graph compilations per step (torch_xla's
counters). A plain torch_xla step taking longer than ``--plain-timeout`` seconds is
interrupted (``did_not_finish_in_seconds``).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pathlib
import platform
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch
import torch_xla
import torch_xla.debug.metrics as metrics
import torchvision
from bench import _capped, _compilations, _fallbacks, _TimedOut

from asickernels.testing import detection_models
from asickernels.torch import detection
from asickernels.torch.detection_training import pad_targets

LEARNING_RATE = 1e-6
# The R-CNNs' RPN keeps this many proposals per image before and after NMS in training
# (torchvision's defaults, 2000 and 2000, make a graph too large to compile here in minutes).
RPN_TRAINING_TOP_N = (200, 100)


def _batch(kind: str, step: int) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
    images = detection_models.images_for(kind, seed=step + 1)
    generator = torch.Generator().manual_seed(step)
    targets = []
    for image, count in zip(images, (1, 3), strict=True):
        height, width = image.shape[1:]
        corner = torch.rand(count, 2, generator=generator) * torch.tensor([width, height]) * 0.5
        size = 16 + torch.rand(count, 2, generator=generator) * 60
        boxes = torch.cat([corner, corner + size], 1).round()
        target = {"boxes": boxes, "labels": torch.randint(1, 5, (count,), generator=generator)}
        if kind == "mask_rcnn":
            target["masks"] = torch.zeros(count, height, width, dtype=torch.uint8)
            for mask, (x1, y1, x2, y2) in zip(target["masks"], boxes.long().tolist(), strict=True):
                mask[y1:y2, x1 : (x1 + x2) // 2 + 1] = 1
        targets.append(target)
    return images, targets


def _stepper(model: torch.nn.Module, device: torch.device | None, padded: bool) -> Any:
    """A training step of ``model`` on ``device`` (None: CPU) -> (fallbacks, compilations)."""
    model = model.train()
    if device is not None:
        model.to(device)
        torch_xla.sync()  # moved 0-d buffers become device data (docs/torch.md)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)

    def step(batch: tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]) -> Any:
        images, targets = batch
        if padded:
            targets = pad_targets(targets, 4)
        if device is not None:
            metrics.clear_all()
            images = [image.to(device) for image in images]
            targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
        optimizer.zero_grad()
        losses = model(images, targets)
        sum(losses.values()).backward()
        optimizer.step()
        if device is None:
            return None, None
        torch_xla.sync()
        return _fallbacks(), _compilations()

    return step


def _measure(kind: str, runners: dict[str, Any], steps: int) -> list[dict[str, Any]]:
    runs: dict[str, dict[str, Any]] = {
        name: {"seconds": [], "fallbacks": [], "compilations": []} for name in runners
    }
    for step in range(steps):
        batch = _batch(kind, step)
        for name, run in runners.items():
            if "did_not_finish_in_seconds" in runs[name]:
                continue
            start = time.perf_counter()
            try:
                fallbacks, compilations = run(batch)
            except _TimedOut:
                runs[name]["did_not_finish_in_seconds"] = round(time.perf_counter() - start)
                continue
            runs[name]["seconds"].append(time.perf_counter() - start)
            runs[name]["fallbacks"].append(fallbacks)
            runs[name]["compilations"].append(compilations)
    rows = []
    for name, run in runs.items():
        row: dict[str, Any] = {"model": kind, "run": name, "steps_finished": len(run["seconds"])}
        if "did_not_finish_in_seconds" in run:
            row["did_not_finish_in_seconds"] = run["did_not_finish_in_seconds"]
        if len(run["seconds"]) >= 2:
            row["steps_per_second"] = 1 / statistics.median(run["seconds"][1:])
        if run["seconds"]:
            row["seconds_first_step"] = run["seconds"][0]
        if name != "cpu_torchvision":
            row["fallbacks_per_step"] = run["fallbacks"]
            row["compilations_per_step"] = run["compilations"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["retinanet", "fcos", "faster_rcnn"])
    parser.add_argument("--steps", type=int, default=4, help="steps of new data (>= 2)")
    parser.add_argument("--skip-plain", action="store_true", help="leave out plain torch_xla")
    parser.add_argument(
        "--plain-timeout", type=float, default=300.0, help="seconds per plain torch_xla step"
    )
    parser.add_argument("--out", type=str, default=None)
    args = parser.parse_args(argv)
    device = torch_xla.device()
    load_average_at_start = os.getloadavg()
    rows = []
    for kind in args.models:
        reference = detection_models.model(kind)
        if kind in ("faster_rcnn", "mask_rcnn"):  # (as the tests: 2000 by default)
            reference.rpn._pre_nms_top_n["training"] = RPN_TRAINING_TOP_N[0]
            reference.rpn._post_nms_top_n["training"] = RPN_TRAINING_TOP_N[1]
        runners = {"cpu_torchvision": _stepper(copy.deepcopy(reference), None, padded=False)}
        if not args.skip_plain:
            runners["plain_xla"] = _capped(
                _stepper(copy.deepcopy(reference), device, padded=False), args.plain_timeout
            )
        ready = detection.xla_ready(copy.deepcopy(reference), backend="xla")
        runners["ready_xla_nms"] = _stepper(ready, device, padded=True)
        rows += _measure(kind, runners, args.steps)
    document = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average_at_start": load_average_at_start,
            "load_average_at_end": os.getloadavg(),
        },
        "versions": {
            "torch": torch.__version__,
            "torchvision": torchvision.__version__,
            "torch_xla": torch_xla.__version__,
        },
        "rows": rows,
    }
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
