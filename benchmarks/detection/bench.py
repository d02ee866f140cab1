"""torchvision's detection models on the torch_xla CPU device: plain torch_xla against the
same models made ``asickernels.torch.detection.xla_ready``, and CPU torchvision.

Run in the torch environment:

    PJRT_DEVICE=CPU .venv-torch-xla/bin/python benchmarks/detection/bench.py \
        --out benchmarks/detection/results.json

Per model (asickernels.testing.detection_models: MobileNetV3-small FPN, random weights,
score thresholds 0, batches of 2 images) and per way of running it:
  * ``plain_xla``: torchvision's model on the XLA device, with a ``torch_xla.sync()`` after
    the backbone (a forward hook) so that its graphs stay small enough to finish;
  * ``ready`` / ``ready_xla_nms``: :func:`xla_ready` with the NMS backend the selection
    policy picks on torch_xla's CPU device (the TPU kernel, simulated) / named ``xla``;
  * ``cpu_torchvision``: torchvision's model on CPU tensors.
Columns: CPU fallbacks per image (torch_xla counters ``aten::*`` and ``torchvision::*``),
graph compilations on the first batch and on each later batch of new data of the same
shape, wall time per image (median over the batches after the first; every batch runs
through every variant in turn, in one process), and
the largest difference of the detections from CPU torchvision's and from plain torch_xla's
(each detection matched to one of the same label; "unmatched" counts those without a
match within 1e-3 px; see tests/frontends/test_detection.py for why near-tied scores may reorder).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
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


def _on_xla(built: torch.nn.Module, trim: bool) -> Any:
    """One batch on the XLA device -> (host detections, fallbacks, compilations)."""
    device = torch_xla.device()
    built = built.to(device)
    torch_xla.sync()

    def run(batch: list[torch.Tensor]) -> tuple[Any, float, int]:
        metrics.clear_all()
        result = built([image.to(device) for image in batch])
        result = detection.trim(result) if trim else _host(result)
        return result, _fallbacks() / len(batch), _compilations()

    return run


def _on_cpu(built: torch.nn.Module) -> Any:
    def run(batch: list[torch.Tensor]) -> tuple[Any, None, None]:
        return built(batch), None, None

    return run


def _measure(runners: dict[str, Any], batches: list[list[torch.Tensor]]) -> dict[str, Any]:
    """Every batch through every runner in turn (interleaved, so that a change in the
    machine's load touches all of them alike)."""
    runs: dict[str, dict[str, list]] = {
        name: {"outputs": [], "fallbacks": [], "compilations": [], "seconds": []}
        for name in runners
    }
    with torch.no_grad():
        for batch in batches:
            for name, run in runners.items():
                start = time.perf_counter()
                output, fallbacks, compilations = run(batch)
                runs[name]["seconds"].append((time.perf_counter() - start) / len(batch))
                runs[name]["outputs"].append(output)
                runs[name]["fallbacks"].append(fallbacks)
                runs[name]["compilations"].append(compilations)
    results = {}
    for name, run in runs.items():
        results[name] = {
            "seconds_per_image": statistics.median(run["seconds"][1:]),
            "seconds_per_image_first_batch": run["seconds"][0],
            "outputs": run["outputs"],
        }
        if name != "cpu_torchvision":
            results[name]["fallbacks_per_image"] = run["fallbacks"]
            results[name]["compilations_per_batch"] = run["compilations"]
    return results


def _difference(expected: list, actual: list) -> dict[str, float]:
    """Largest score and box differences over detections matched one to one (same label,
    nearest box first), and how many found no match within 1e-3 px."""
    worst_score = worst_box = 0.0
    unmatched = count_difference = 0
    for want_batch, got_batch in zip(expected, actual, strict=True):
        for want, got in zip(want_batch, got_batch, strict=True):
            count_difference += abs(len(want["scores"]) - len(got["scores"]))
            free = torch.ones(len(got["scores"]), dtype=torch.bool)
            for box, score, label in zip(
                want["boxes"], want["scores"], want["labels"], strict=True
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
    return {
        "max_score_difference": worst_score,
        "max_box_difference_px": worst_box,
        "unmatched": unmatched,
        "count_difference": count_difference,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=sorted(detection_models.BUILDERS))
    parser.add_argument("--batches", type=int, default=4, help="batches of new data (>= 2)")
    parser.add_argument("--skip-plain", action="store_true", help="leave out plain torch_xla")
    parser.add_argument("--out", type=str, default=None)
    args = parser.parse_args(argv)
    batches = [detection_models.images(seed) for seed in range(1, args.batches + 1)]
    rows = []
    for kind in args.models:
        reference = detection_models.model(kind)
        runners = {"cpu_torchvision": _on_cpu(reference)}
        if not args.skip_plain:
            runners["plain_xla"] = _on_xla(_plain(copy.deepcopy(reference)), trim=False)
        runners["ready"] = _on_xla(detection.xla_ready(copy.deepcopy(reference)), trim=True)
        runners["ready_xla_nms"] = _on_xla(
            detection.xla_ready(copy.deepcopy(reference), backend="xla"), trim=True
        )
        runs = _measure(runners, batches)
        cpu = runs["cpu_torchvision"]
        for name, run in runs.items():
            row = {"model": kind, "run": name} | {k: v for k, v in run.items() if k != "outputs"}
            if name != "cpu_torchvision":
                row["vs_cpu_torchvision"] = _difference(cpu["outputs"], run["outputs"])
                if "plain_xla" in runs and name != "plain_xla":
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
        "images_per_batch": len(batches[0]),
        "image_shapes": [list(image.shape) for image in batches[0]],
        "rows": rows,
    }
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(document, handle, indent=2)
            handle.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
