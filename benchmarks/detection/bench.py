"""torchvision's detection models on the torch_xla CPU device: plain torch_xla against the
same models made ``asickernels.torch.detection.xla_ready``, and CPU torchvision.

Run in the torch environment:

    PJRT_DEVICE=CPU .venv-torch-xla/bin/python benchmarks/detection/bench.py \
        --batches 3 --plain-timeout 90 --out benchmarks/detection/results.json

Per model (asickernels.testing.detection_models: RetinaNet, FCOS, Faster and Mask R-CNN on
MobileNetV3-small FPN backbones, SSD300 on VGG16, SSDlite320 on MobileNetV3-large; random
weights, low score thresholds, batches of 2 images) and per way of running it:
  * ``plain_xla``: torchvision's model on the XLA device, with a ``torch_xla.sync()`` after
    the backbone (a forward hook) so that its graphs stay small enough to finish; a batch
    taking longer than ``--plain-timeout`` seconds is interrupted and the row says
    ``did_not_finish_in_seconds``;
  * ``ready`` / ``ready_xla_nms``: :func:`xla_ready` with the NMS backend the selection
    policy picks on torch_xla's CPU device (the TPU kernel, simulated) / named ``xla``;
  * ``cpu_torchvision``: torchvision's model on CPU tensors.
Columns: CPU fallbacks per image (torch_xla counters ``aten::*`` and ``torchvision::*``),
graph compilations on the first batch and on each later batch of new data of the same
shape, host transfers during the forward (before the detections are read), wall time per
image (median over the batches after the first; every batch runs through every variant in
turn, in one process), and the largest difference of the detections (and masks) from CPU
torchvision's and from plain torch_xla's (each detection matched to one of the same label;
"unmatched" counts those without a match within 1e-3 px; ``same_within_1e-4``: every
detection matched, scores and boxes within 1e-4; see tests/frontends/test_detection.py for
why near-tied scores may reorder). Last, SSD300's batched NMS at COCO's size on CPU:
torchvision against asickernels' ``cpu`` backend (``--nms-repeats`` turns).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pathlib
import platform
import signal
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("PJRT_DEVICE", "CPU")

import numpy as np
import torch
import torch_xla
import torch_xla.debug.metrics as metrics
import torchvision

from asickernels.benchmarking import timing
from asickernels.testing import detection_models
from asickernels.torch import detection


def _fallbacks() -> int:
    return sum(
        metrics.counter_value(name) or 0
        for name in metrics.counter_names()
        if name.startswith(("aten::", "torchvision::"))
    )


def _compilations() -> int:
    data = metrics.metric_data("CompileTime")
    return 0 if data is None else int(data[0])


def _plain(built: torch.nn.Module) -> torch.nn.Module:
    """torchvision's model as a torch_xla user runs it: a sync after the backbone."""
    built.backbone.register_forward_hook(lambda *_: torch_xla.sync())
    return built


def _host(result: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    torch_xla.sync()
    return [{k: v.cpu() for k, v in image.items()} for image in result]


def _transfers() -> int:
    data = metrics.metric_data("TransferFromDeviceTime")
    return 0 if data is None else int(data[0])


def _on_xla(built: torch.nn.Module, trim: bool) -> Any:
    """One batch on the XLA device -> (host detections, fallbacks, compilations, host
    transfers during the forward: before the detections are read)."""
    device = torch_xla.device()
    built = built.to(device)
    torch_xla.sync()

    def run(batch: list[torch.Tensor]) -> tuple[Any, float, int, int]:
        metrics.clear_all()
        result = built([image.to(device) for image in batch])
        transfers = _transfers()
        result = detection.trim(result) if trim else _host(result)
        return result, _fallbacks() / len(batch), _compilations(), transfers

    return run


def _on_cpu(built: torch.nn.Module) -> Any:
    def run(batch: list[torch.Tensor]) -> tuple[Any, None, None, None]:
        return built(batch), None, None, None

    return run


class _TimedOut(Exception):
    pass


def _capped(run: Any, seconds: float) -> Any:
    """``run``, interrupted (a signal between Python steps; torch_xla returns to Python at
    every CPU fallback) once it has taken ``seconds``."""

    def interrupt(*_: Any) -> None:
        raise _TimedOut

    def capped(batch: list[torch.Tensor]) -> Any:
        previous = signal.signal(signal.SIGALRM, interrupt)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return run(batch)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    return capped


def _measure(runners: dict[str, Any], batches: list[list[torch.Tensor]]) -> dict[str, Any]:
    """Every batch through every runner in turn (interleaved, so that a change in the
    machine's load touches all of them alike)."""
    columns = ("outputs", "fallbacks", "compilations", "transfers", "seconds")
    runs: dict[str, dict[str, Any]] = {name: {c: [] for c in columns} for name in runners}
    with torch.no_grad():
        for batch in batches:
            for name, run in runners.items():
                if "did_not_finish_in_seconds" in runs[name]:
                    continue
                start = time.perf_counter()
                try:
                    output, fallbacks, compilations, transfers = run(batch)
                except _TimedOut:
                    runs[name]["did_not_finish_in_seconds"] = round(time.perf_counter() - start)
                    continue
                runs[name]["seconds"].append((time.perf_counter() - start) / len(batch))
                for column, value in zip(
                    columns, (output, fallbacks, compilations, transfers), strict=False
                ):
                    runs[name][column].append(value)
    results: dict[str, dict[str, Any]] = {}
    for name, run in runs.items():
        if "did_not_finish_in_seconds" in run:
            results[name] = {
                "did_not_finish_in_seconds": run["did_not_finish_in_seconds"],
                "batches_finished": len(run["seconds"]),
            }
            continue
        results[name] = {
            "seconds_per_image": statistics.median(run["seconds"][1:]),
            "seconds_per_image_first_batch": run["seconds"][0],
            "outputs": run["outputs"],
        }
        if name != "cpu_torchvision":
            results[name]["fallbacks_per_image"] = run["fallbacks"]
            results[name]["compilations_per_batch"] = run["compilations"]
            results[name]["host_transfers_in_forward_per_batch"] = run["transfers"]
    return results


def _difference(expected: list, actual: list) -> dict[str, float]:
    """Largest score and box differences over detections matched one to one (same label,
    nearest box first), and how many found no match within 1e-3 px."""
    worst_score = worst_box = worst_mask = 0.0
    unmatched = count_difference = 0
    for want_batch, got_batch in zip(expected, actual, strict=True):
        for want, got in zip(want_batch, got_batch, strict=True):
            count_difference += abs(len(want["scores"]) - len(got["scores"]))
            free = torch.ones(len(got["scores"]), dtype=torch.bool)
            for row, (box, score, label) in enumerate(
                zip(want["boxes"], want["scores"], want["labels"], strict=True)
            ):
                distance = (got["boxes"] - box).abs().amax(-1).double()
                distance[(got["labels"] != label) | ~free] = float("inf")
                if len(distance) == 0 or float(distance.min()) > 1e-3:
                    unmatched += 1
                    continue
                best = int(distance.argmin())
                free[best] = False
                worst_box = max(worst_box, float(distance[best]))
                worst_score = max(worst_score, abs(float(got["scores"][best] - score)))
                if "masks" in want:
                    difference = float((got["masks"][best] - want["masks"][row]).abs().max())
                    worst_mask = max(worst_mask, difference)
    same = unmatched == count_difference == 0 and max(worst_score, worst_box) <= 1e-4
    return {
        "max_score_difference": worst_score,
        "max_box_difference_px": worst_box,
        "max_mask_difference": worst_mask,
        "unmatched": unmatched,
        "count_difference": count_difference,
        "same_within_1e-4": same,
    }


def _ssd_nms(repeats: int) -> dict[str, Any]:
    """SSD300's batched NMS at COCO's size (91 classes: up to 90 x 400 candidates, per
    class torchvision's top-k of one image's random-weight scores), on CPU tensors:
    ``torchvision.ops.batched_nms(...)[:200]`` against asickernels' ``cpu`` backend
    (``max_output_size=200``, as :func:`xla_ready` runs it, and every kept box), in turns."""
    import asickernels

    torch.manual_seed(0)
    built = torchvision.models.detection.ssd300_vgg16(weights=None, weights_backbone=None)
    captured: dict[str, Any] = {}

    def capture(head_outputs: Any, anchors: Any, image_shapes: Any) -> list:
        captured.update(head=head_outputs, anchors=anchors, shapes=image_shapes)
        return []

    built.eval().postprocess_detections = capture
    with torch.no_grad():
        built(detection_models.images(shapes=((300, 300),)))
    boxes = built.box_coder.decode_single(
        captured["head"]["bbox_regression"][0], captured["anchors"][0]
    )
    scores = torch.softmax(captured["head"]["cls_logits"][0], -1)
    candidates: list[list[torch.Tensor]] = [[], [], []]
    for label in range(1, scores.shape[1]):
        passing = scores[:, label] > built.score_thresh
        top, index = scores[passing, label].topk(min(built.topk_candidates, int(passing.sum())))
        candidates[0].append(boxes[passing][index])
        candidates[1].append(top)
        candidates[2].append(torch.full_like(index, label))
    cand_boxes, cand_scores, cand_labels = (torch.cat(c) for c in candidates)
    arrays = (cand_boxes.numpy(), cand_scores.numpy(), cand_labels.numpy())
    limit = built.detections_per_img
    peers = {
        "torchvision": lambda: torchvision.ops.batched_nms(
            cand_boxes, cand_scores, cand_labels, built.nms_thresh
        )[:limit],
        f"cpu_max_output_{limit}": lambda: asickernels.batched_nms(
            *arrays, iou_threshold=built.nms_thresh, max_output_size=limit, backend="cpu"
        ),
        "cpu_all_kept": lambda: asickernels.batched_nms(
            *arrays,
            iou_threshold=built.nms_thresh,
            max_output_size=len(cand_scores),
            backend="cpu",
        ),
    }
    want = peers["torchvision"]().numpy()
    for name in list(peers)[1:]:
        indices, count = peers[name]()
        assert (np.asarray(indices)[: min(int(count), limit)] == want).all(), name
    seconds = timing.round_robin(peers, repeats)
    return {
        "candidates": len(cand_scores),
        "kept": int(peers["cpu_all_kept"]()[1]),
        "median_ms": {name: 1e3 * statistics.median(t) for name, t in seconds.items()},
        "min_ms": {name: 1e3 * min(t) for name, t in seconds.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=sorted(detection_models.BUILDERS))
    parser.add_argument("--batches", type=int, default=4, help="batches of new data (>= 2)")
    parser.add_argument("--skip-plain", action="store_true", help="leave out plain torch_xla")
    parser.add_argument(
        "--plain-timeout", type=float, default=120.0, help="seconds per plain torch_xla batch"
    )
    parser.add_argument("--nms-repeats", type=int, default=20, help="SSD NMS timing turns")
    parser.add_argument("--out", type=str, default=None)
    args = parser.parse_args(argv)
    rows = []
    for kind in args.models:
        batches = [detection_models.images_for(kind, seed) for seed in range(1, args.batches + 1)]
        reference = detection_models.model(kind)
        runners = {"cpu_torchvision": _on_cpu(reference)}
        if not args.skip_plain:
            runners["plain_xla"] = _capped(
                _on_xla(_plain(copy.deepcopy(reference)), trim=False), args.plain_timeout
            )
        runners["ready"] = _on_xla(detection.xla_ready(copy.deepcopy(reference)), trim=True)
        runners["ready_xla_nms"] = _on_xla(
            detection.xla_ready(copy.deepcopy(reference), backend="xla"), trim=True
        )
        runs = _measure(runners, batches)
        cpu = runs["cpu_torchvision"]
        for name, run in runs.items():
            row = {"model": kind, "run": name} | {k: v for k, v in run.items() if k != "outputs"}
            if "outputs" in run and name != "cpu_torchvision":
                row["vs_cpu_torchvision"] = _difference(cpu["outputs"], run["outputs"])
                if "outputs" in runs.get("plain_xla", {}) and name != "plain_xla":
                    row["vs_plain_xla"] = _difference(runs["plain_xla"]["outputs"], run["outputs"])
            rows.append(row)
            print(json.dumps(row), flush=True)
    document = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "versions": {
            "torch": torch.__version__,
            "torchvision": torchvision.__version__,
            "torch_xla": torch_xla.__version__,
        },
        "images_per_batch": len(detection_models.SHAPES),
        "image_shapes": {
            kind: [list(image.shape) for image in detection_models.images_for(kind)]
            for kind in args.models
        },
        "rows": rows,
    }
    if args.nms_repeats:
        document["ssd300_coco_batched_nms_cpu"] = _ssd_nms(args.nms_repeats)
        print(json.dumps(document["ssd300_coco_batched_nms_cpu"]), flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
