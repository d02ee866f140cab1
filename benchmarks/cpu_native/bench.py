# ruff: noqa: B023  (each closure is timed inside the loop iteration that defines it)
"""Native CPU backend against its CPU peers, side by side in one process.

Run in the torch environment, where torchvision, torch and JAX (0.7.1) live together:

    PJRT_DEVICE=CPU .venv-torch-xla/bin/python benchmarks/cpu_native/bench.py \
        --out benchmarks/cpu_native/results.json

Rows (median wall time of repeated calls, inputs already in each library's own arrays; for
torch peers the better of its default thread count and one thread):
  * overhead: a minimal call (one box) through each entry point;
  * nms / batched_nms (16 categories): N = 256 ... 16384, 128 outputs, IoU 0.1, on the NMS
    article's overlapping boxes and on sparse boxes; peer torchvision.ops.nms / batched_nms;
  * giou forward and GIOU-loss forward+backward (mean loss): peers a jitted XLA function
    (asickernels' xla backend) and torchvision.ops.generalized_box_iou_loss (+ autograd);
  * int8 matmul S^3: peers XLA's int8 dot (jax.lax.dot, preferred int32) and torch._int_mm.
Every "ours" row goes through the public API with backend=None, which on a CPU host is the
native cpu backend: "ours_eager" is `asickernels.<op>` called on numpy arrays (as the README
does), "ours_jit" the same call under jax.jit on device arrays, "ours_torch" the PyTorch
frontend `asickernels.torch.<op>` on CPU tensors (eager, with autograd for the loss).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torchvision

import asickernels as ak
import asickernels.torch as akt
from asickernels.backends.cpu import _library
from asickernels.kernels.cases import bench_boxes, jittered
from asickernels.kernels.nms_cases import seed_style_boxes

NMS_SIZES = (256, 1024, 4096, 16384)
GIOU_SIZES = ((64, 64), (256, 256), (1024, 256))
MATMUL_SIZES = (256, 512, 1024, 2048, 4096)
MAX_OUTPUT, IOU = 128, 0.1
CATEGORIES = 16


class Timing(float):
    """Median wall microseconds per call, with ``cpu_us``: the median process CPU time per
    call (all threads), a figure other work on a shared machine disturbs less."""

    cpu_us: float


def timed(call: Callable[[], Any], budget: float, max_reps: int = 2000) -> Timing:
    """Median of ``call`` after one warm-up, repeated within ``budget`` seconds (at least 3
    times)."""
    call()
    walls: list[float] = []
    cpus: list[float] = []
    deadline = time.perf_counter() + budget
    while len(walls) < 3 or (time.perf_counter() < deadline and len(walls) < max_reps):
        cpu, start = time.process_time(), time.perf_counter()
        call()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    timing = Timing(statistics.median(walls) * 1e6)
    timing.cpu_us = statistics.median(cpus) * 1e6
    return timing


def cpu_of(times: dict[str, Timing]) -> dict[str, float]:
    return {name: t.cpu_us for name, t in times.items()}


def timed_torch(call: Callable[[], Any], budget: float, **kwargs: Any) -> Timing:
    """The better of torch's default thread count and one thread: on a machine shared with
    other work, torch's OpenMP threads can wait on each other for a whole time slice."""
    default = timed(call, budget, **kwargs)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return min(default, timed(call, budget, **kwargs))
    finally:
        torch.set_num_threads(threads)


def ready(value: Any) -> Any:
    return jax.block_until_ready(value)


def sparse_boxes(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Small integer boxes (sides 1..32) spread so that about one in a hundred pairs of
    neighbours overlaps: most boxes survive NMS."""
    span = int(64 * np.sqrt(n)) + 64
    corner = rng.integers(0, span, (n, 2))
    boxes = np.concatenate([corner, corner + rng.integers(1, 33, (n, 2))], axis=1)
    return boxes.astype(np.float32), rng.uniform(0.0, 1.0, n).astype(np.float32)


def nms_rows(rng: np.random.Generator, budget: float) -> Iterator[dict[str, Any]]:
    for op in ("nms", "batched_nms"):
        for kind, make in (("overlapping", seed_style_boxes), ("sparse", sparse_boxes)):
            for n in NMS_SIZES:
                boxes, scores = make(rng, n)
                categories = (
                    rng.integers(0, CATEGORIES, n).astype(np.int32) if op == "batched_nms" else None
                )
                static = {"iou_threshold": IOU, "max_output_size": MAX_OUTPUT}
                arrays = (boxes, scores) if categories is None else (boxes, scores, categories)
                public = getattr(ak, op)
                jitted = jax.jit(lambda *a: public(*a, **static))
                jax_args = [jax.device_put(a) for a in arrays]
                tensors = [torch.from_numpy(a) for a in arrays]
                frontend = getattr(akt, op)
                tb, ts = tensors[0], tensors[1]
                if categories is None:
                    peer = lambda: torchvision.ops.nms(tb, ts, IOU)  # noqa: E731
                else:
                    tc = torch.from_numpy(categories.astype(np.int64))
                    peer = lambda: torchvision.ops.batched_nms(tb, ts, tc, IOU)  # noqa: E731
                indices, count = public(*arrays, **static)
                want = peer()[:MAX_OUTPUT].numpy()
                agrees = bool(np.array_equal(np.asarray(indices)[: int(count)], want))
                times = {
                    "ours_eager": timed(lambda: ready(public(*arrays, **static)), budget),
                    "ours_jit": timed(lambda: ready(jitted(*jax_args)), budget),
                    "ours_torch": timed_torch(lambda: frontend(*tensors, **static), budget),
                    "torchvision": timed_torch(peer, budget),
                }
                yield {
                    "op": op,
                    "size": f"N={n} {kind}",
                    "kept": int(count),
                    "agrees_with_torchvision_first_128": agrees,
                    "us": times,
                    "cpu_us": cpu_of(times),
                    "ratio_eager_vs_torchvision": times["ours_eager"] / times["torchvision"],
                    "ratio_jit_vs_torchvision": times["ours_jit"] / times["torchvision"],
                    "ratio_torch_vs_torchvision": times["ours_torch"] / times["torchvision"],
                    "ratio_eager_vs_jit": times["ours_eager"] / times["ours_jit"],
                    "target": "<= 0.5",
                }


def giou_rows(rng: np.random.Generator, budget: float) -> Iterator[dict[str, Any]]:
    for shape in GIOU_SIZES:
        b1 = bench_boxes(rng, shape).reshape(-1, 4)
        b2 = jittered(rng, b1)
        j1, j2 = jax.device_put(b1), jax.device_put(b2)
        t1, t2 = torch.from_numpy(b1), torch.from_numpy(b2)
        ours_jit = jax.jit(ak.giou)
        xla_jit = jax.jit(lambda a, b: ak.giou(a, b, backend="xla"))
        forward = {
            "ours_eager": timed(lambda: ready(ak.giou(b1, b2)), budget),
            "ours_jit": timed(lambda: ready(ours_jit(j1, j2)), budget),
            "ours_torch": timed_torch(lambda: akt.giou(t1, t2), budget),
            "xla_jit": timed(lambda: ready(xla_jit(j1, j2)), budget),
            "torchvision": timed_torch(
                lambda: torchvision.ops.generalized_box_iou_loss(t1, t2, reduction="none"), budget
            ),
        }
        ours_grad = jax.jit(jax.value_and_grad(lambda a, b: ak.giou_loss(a, b)))
        xla_grad = jax.jit(jax.value_and_grad(lambda a, b: ak.giou_loss(a, b, backend="xla")))

        def torch_loss_and_grad(loss_fn: Callable[..., Any]) -> Any:
            a = t1.clone().requires_grad_(True)
            loss = loss_fn(a)
            loss.backward()
            return loss, a.grad

        backward = {
            "ours_jit": timed(lambda: ready(ours_grad(j1, j2)), budget),
            "ours_torch": timed_torch(
                lambda: torch_loss_and_grad(lambda a: akt.giou_loss(a, t2)), budget
            ),
            "xla_jit": timed(lambda: ready(xla_grad(j1, j2)), budget),
            "torchvision": timed_torch(
                lambda: torch_loss_and_grad(
                    lambda a: torchvision.ops.generalized_box_iou_loss(a, t2, reduction="mean")
                ),
                budget,
            ),
        }
        label = "x".join(map(str, shape)) + " pairs"
        for op, times in (("giou", forward), ("giou_loss_fwd_bwd", backward)):
            ratios = {
                f"ratio_{name}_vs_{peer}": times[f"ours_{name}"] / times[peer]
                for name in ("eager", "jit", "torch")
                for peer in ("xla_jit", "torchvision")
                if f"ours_{name}" in times
            }
            if "ours_eager" in times:
                ratios["ratio_eager_vs_jit"] = times["ours_eager"] / times["ours_jit"]
            yield {
                "op": op,
                "size": label,
                "us": times,
                "cpu_us": cpu_of(times),
                **ratios,
                "target": "<= 1.0 vs xla_jit and <= 0.5 vs torchvision",
            }


def matmul_rows(rng: np.random.Generator, budget: float) -> Iterator[dict[str, Any]]:
    for s in MATMUL_SIZES:
        x = rng.integers(-128, 128, (s, s), dtype=np.int8)
        y = rng.integers(-128, 128, (s, s), dtype=np.int8)
        jx, jy = jax.device_put(x), jax.device_put(y)
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)
        ours_jit = jax.jit(ak.int8_matmul)
        xla_dot = jax.jit(lambda a, b: jax.lax.dot(a, b, preferred_element_type=jnp.int32))
        exact = bool(
            np.array_equal(np.asarray(ak.int8_matmul(x, y)), torch._int_mm(tx, ty).numpy())
        )
        times = {
            "ours_eager": timed(lambda: ready(ak.int8_matmul(x, y)), budget),
            "ours_jit": timed(lambda: ready(ours_jit(jx, jy)), budget),
            "ours_torch": timed_torch(lambda: akt.int8_matmul(tx, ty), budget),
            "torch_int_mm": timed_torch(lambda: torch._int_mm(tx, ty), budget),
            # XLA's int8 dot is ~100x slower at large S: a few calls are enough.
            "xla_dot": timed(
                lambda: ready(xla_dot(jx, jy)), budget, max_reps=3 if s >= 2048 else 2000
            ),
        }
        best_peer = min(times["torch_int_mm"], times["xla_dot"])
        yield {
            "op": "int8_matmul",
            "size": f"{s}^3",
            "equals_torch_int_mm": exact,
            "us": times,
            "cpu_us": cpu_of(times),
            "ratio_eager_vs_best_peer": times["ours_eager"] / best_peer,
            "ratio_jit_vs_best_peer": times["ours_jit"] / best_peer,
            "ratio_torch_vs_best_peer": times["ours_torch"] / best_peer,
            "ratio_eager_vs_jit": times["ours_eager"] / times["ours_jit"],
            "target": "<= 1.0 vs min(xla_dot, torch_int_mm)",
        }


def overhead_row(budget: float) -> dict[str, Any]:
    """A minimal call (one box) through every public entry point and a peer: what is
    dispatch rather than kernel."""
    box = np.array([[0.0, 0.0, 1.0, 1.0]], np.float32)
    score = np.array([0.5], np.float32)
    jbox, jscore = jax.device_put(box), jax.device_put(score)
    tbox, tscore = torch.from_numpy(box), torch.from_numpy(score)
    static = {"iou_threshold": 0.5, "max_output_size": 1}
    nms_jit = jax.jit(lambda b, s: ak.nms(b, s, **static))
    giou_jit = jax.jit(ak.giou)
    empty_jit = jax.jit(lambda b: b)
    times = {
        "ours_eager_giou_P1": timed(lambda: ready(ak.giou(box, box)), budget),
        "ours_eager_nms_N1": timed(lambda: ready(ak.nms(box, score, **static)), budget),
        "ours_jit_giou_P1": timed(lambda: ready(giou_jit(jbox, jbox)), budget),
        "ours_jit_nms_N1": timed(lambda: ready(nms_jit(jbox, jscore)), budget),
        "ours_torch_giou_P1": timed_torch(lambda: akt.giou(tbox, tbox), budget),
        "ours_torch_nms_N1": timed_torch(lambda: akt.nms(tbox, tscore, **static), budget),
        "jax_jit_identity": timed(lambda: ready(empty_jit(jbox)), budget),
        "torchvision_nms_N1": timed_torch(lambda: torchvision.ops.nms(tbox, tscore, 0.5), budget),
    }
    return {"op": "overhead", "size": "minimal call", "us": times, "cpu_us": cpu_of(times)}


def markdown(document: dict[str, Any]) -> str:
    """The results as a BENCHMARKS.md section: per row our three entry points, the peers
    and the ratios the targets are stated in (microseconds, medians)."""
    header = document["header"]
    lines = [
        "## Native CPU backend against its CPU peers",
        f"Command: `{header['command']}` ({header['time_utc']}); {header['cpu']}, "
        f"{header['cpu_count']} cores, int8 path {header['int8_path']}; load average "
        f"{header['load_average_at_start'][0]:.1f} at the start (above the core count: other "
        "processes competed, timings are noisy). ours_eager = the public JAX op on numpy "
        "arrays, ours_jit = the same under `jax.jit`, ours_torch = `asickernels.torch` on CPU "
        "tensors; all with `backend=None` (the `cpu` backend). Times in µs.",
        "",
        "| op | size | timings (µs) | ratios | target |",
        "|---|---|---|---|---|",
    ]
    for row in document["rows"]:
        times = ", ".join(f"{name} {value:.1f}" for name, value in row["us"].items())
        ratios = ", ".join(
            f"{name.removeprefix('ratio_')} {value:.2f}"
            for name, value in row.items()
            if name.startswith("ratio_")
        )
        lines.append(
            f"| {row['op']} | {row['size']} | {times} | {ratios} | {row.get('target', '')} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="write the results JSON here")
    parser.add_argument("--budget", type=float, default=0.4, help="seconds per measurement")
    parser.add_argument("--only", choices=("overhead", "nms", "giou", "matmul"), default=None)
    parser.add_argument(
        "--markdown", default=None, help="also write the results as a BENCHMARKS.md section"
    )
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model = next(
        (line.split(":", 1)[1].strip() for line in lscpu.splitlines() if "Model name" in line), ""
    )
    header = {
        "command": "PJRT_DEVICE=CPU .venv-torch-xla/bin/python " + " ".join(sys.argv),
        "cpu": model,
        "cpu_count": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "int8_path": _library.int8_matmul_path(),
        "versions": {
            "python": platform.python_version(),
            "jax": jax.__version__,
            "torch": torch.__version__,
            "torchvision": torchvision.__version__,
        },
        "torch_threads": torch.get_num_threads(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(json.dumps(header), flush=True)
    rows: list[dict[str, Any]] = []
    sections: dict[str, Callable[[], Iterable[dict[str, Any]]]] = {
        "overhead": lambda: [overhead_row(args.budget)],
        "nms": lambda: nms_rows(rng, args.budget),
        "giou": lambda: giou_rows(rng, args.budget),
        "matmul": lambda: matmul_rows(rng, args.budget),
    }
    for name, run in sections.items():
        if args.only in (None, name):
            for row in run():
                print(json.dumps(row), flush=True)
                rows.append(row)
    header["load_average_at_end"] = os.getloadavg()
    document = {"header": header, "rows": rows}
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(document, handle, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as handle:
            handle.write(markdown(document))


if __name__ == "__main__":
    main()
