"""CPU timings of the PyTorch frontend against torchvision's eager ops at the seed sizes:
GIOU of 1024x256 box pairs, and NMS of 1024 boxes (128 outputs, IoU threshold 0.1).

    PJRT_DEVICE=CPU .venv-torch-xla/bin/python tests/torch_cpu_timings.py [--backends xla,...]

Each line is the median of --repeats timed calls after a warm-up call (compiles happen
there). ``--backends`` lists the library's CPU implementations to time through the
frontend; the fastest is the one to put in ``asickernels.torch.ops.CPU_BACKEND``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torchvision.ops

import asickernels.torch as at
from asickernels.testing.cases import grid_boxes, random_boxes


def median_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backends", default="xla")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rng = np.random.default_rng(0)
    b1 = torch.from_numpy(random_boxes(rng, (1024, 256)))
    b2 = torch.from_numpy(random_boxes(rng, (1024, 256)))
    boxes = torch.from_numpy(grid_boxes(rng, (1024,), span=2000, size=120))
    scores = torch.from_numpy(rng.permutation(1024).astype(np.float32))

    rows = [
        (
            "GIOU 1024x256",
            "torchvision 1 - generalized_box_iou_loss",
            lambda: 1 - torchvision.ops.generalized_box_iou_loss(b1, b2, reduction="none"),
        ),
        (
            "NMS 1024 -> 128, 0.1",
            "torchvision nms",
            lambda: torchvision.ops.nms(boxes, scores, 0.1),
        ),
    ]
    for backend in args.backends.split(","):
        rows.append(
            (
                "GIOU 1024x256",
                f"asickernels.torch.giou [{backend}]",
                lambda b=backend: at.giou(b1, b2, backend=b),
            )
        )
        rows.append(
            (
                "NMS 1024 -> 128, 0.1",
                f"asickernels.torch.nms [{backend}]",
                lambda b=backend: at.nms(
                    boxes, scores, iou_threshold=0.1, max_output_size=128, backend=b
                ),
            )
        )
    rows.sort(key=lambda row: row[0])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; median of {args.repeats}")
    for op, name, fn in rows:
        print(f"{op:<22} {name:<44} {median_ms(fn, args.repeats):8.3f} ms")


if __name__ == "__main__":
    main()
