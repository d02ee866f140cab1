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
"ours_jit" is the JAX entry point under jax.jit (XLA FFI); "ours_host" the numpy entry point
(ctypes), which eager calls use.
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
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torchvision

from asickernels.backends.cpu import _library
from asickernels.backends.cpu import giou as cpu_giou
from asickernels.backends.cpu import int8_matmul as cpu_matmul
from asickernels.backends.cpu import nms as cpu_nms
from asickernels.backends.xla import giou as xla_giou
from asickernels.benchmarking.workloads import jittered, random_boxes, seed_style_boxes

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


def nms_rows(rng: np.random.Generator, budget: float) -> list[dict[str, Any]]:
    rows = []
    for op in ("nms", "batched_nms"):
        for kind, make in (("overlapping", seed_style_boxes), ("sparse", sparse_boxes)):
            for n in NMS_SIZES:
                boxes, scores = make(rng, n)
                categories = (
                    rng.integers(0, CATEGORIES, n).astype(np.int32) if op == "batched_nms" else None
                )
                static = {"iou_threshold": IOU, "max_output_size": MAX_OUTPUT}
                host_args = (
                    boxes[None],
                    scores[None],
                    None if categories is None else categories[None],
                )
                jax_args = [jax.device_put(a) for a in host_args if a is not None]

                def run_host():
                    return cpu_nms.nms_host(*host_args, score_threshold=-np.inf, **static)

                if categories is None:
                    jitted = jax.jit(
                        lambda b, s: cpu_nms.nms(b, s, None, score_threshold=-np.inf, **static)
                    )
                else:
                    jitted = jax.jit(
                        lambda b, s, c: cpu_nms.nms(b, s, c, score_threshold=-np.inf, **static)
                    )
                tb, ts = torch.from_numpy(boxes), torch.from_numpy(scores)
                if categories is None:
                    peer = lambda: torchvision.ops.nms(tb, ts, IOU)  # noqa: E731
                else:
                    tc = torch.from_numpy(categories.astype(np.int64))
                    peer = lambda: torchvision.ops.batched_nms(tb, ts, tc, IOU)  # noqa: E731
                indices, count = run_host()
                want = peer()[:MAX_OUTPUT].numpy()
                agrees = bool(np.array_equal(indices[0, : count[0]], want))
                times = {
                    "ours_host": timed(run_host, budget),
                    "ours_jit": timed(lambda: ready(jitted(*jax_args)), budget),
                    "torchvision": timed_torch(peer, budget),
                }
                rows.append(
                    {
                        "op": op,
                        "size": f"N={n} {kind}",
                        "kept": int(count[0]),
                        "agrees_with_torchvision_first_128": agrees,
                        "us": times,
                        "cpu_us": cpu_of(times),
                        "ratio_host_vs_torchvision": times["ours_host"] / times["torchvision"],
                        "ratio_jit_vs_torchvision": times["ours_jit"] / times["torchvision"],
                        "target": "<= 0.5",
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    return rows


def giou_rows(rng: np.random.Generator, budget: float) -> list[dict[str, Any]]:
    rows = []
    for shape in GIOU_SIZES:
        b1 = random_boxes(rng, shape).reshape(-1, 4)
        b2 = jittered(rng, b1)
        p = b1.shape[0]
        j1, j2 = jax.device_put(b1), jax.device_put(b2)
        t1, t2 = torch.from_numpy(b1), torch.from_numpy(b2)
        ours_jit = jax.jit(cpu_giou.giou)
        xla_jit = jax.jit(xla_giou.giou)
        forward = {
            "ours_host": timed(lambda: cpu_giou.giou_host(b1, b2), budget),
            "ours_jit": timed(lambda: ready(ours_jit(j1, j2)), budget),
            "xla_jit": timed(lambda: ready(xla_jit(j1, j2)), budget),
            "torchvision": timed_torch(
                lambda: torchvision.ops.generalized_box_iou_loss(t1, t2, reduction="none"), budget
            ),
        }
        ours_grad = jax.jit(jax.value_and_grad(lambda a, b: jnp.mean(1.0 - cpu_giou.giou(a, b))))
        xla_grad = jax.jit(jax.value_and_grad(lambda a, b: jnp.mean(1.0 - xla_giou.giou(a, b))))
        cotangent = np.full((p,), -1.0 / p, np.float32)

        def host_loss_and_grad():
            loss = np.mean(1.0 - cpu_giou.giou_host(b1, b2))
            return loss, cpu_giou.giou_vjp_host(b1, b2, cotangent)[0]

        def torch_loss_and_grad():
            a = t1.clone().requires_grad_(True)
            loss = torchvision.ops.generalized_box_iou_loss(a, t2, reduction="mean")
            loss.backward()
            return loss, a.grad

        backward = {
            "ours_host": timed(host_loss_and_grad, budget),
            "ours_jit": timed(lambda: ready(ours_grad(j1, j2)), budget),
            "xla_jit": timed(lambda: ready(xla_grad(j1, j2)), budget),
            "torchvision": timed_torch(torch_loss_and_grad, budget),
        }
        label = "x".join(map(str, shape)) + " pairs"
        for op, times in (("giou", forward), ("giou_loss_fwd_bwd", backward)):
            rows.append(
                {
                    "op": op,
                    "size": label,
                    "us": times,
                    "cpu_us": cpu_of(times),
                    "ratio_jit_vs_xla": times["ours_jit"] / times["xla_jit"],
                    "ratio_host_vs_xla": times["ours_host"] / times["xla_jit"],
                    "ratio_jit_vs_torchvision": times["ours_jit"] / times["torchvision"],
                    "ratio_host_vs_torchvision": times["ours_host"] / times["torchvision"],
                    "target": "<= 1.0 vs xla_jit and <= 0.5 vs torchvision",
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def matmul_rows(rng: np.random.Generator, budget: float) -> list[dict[str, Any]]:
    rows = []
    for s in MATMUL_SIZES:
        x = rng.integers(-128, 128, (s, s), dtype=np.int8)
        y = rng.integers(-128, 128, (s, s), dtype=np.int8)
        jx, jy = jax.device_put(x), jax.device_put(y)
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)
        ours_jit = jax.jit(
            lambda a, b: cpu_matmul.int8_matmul(
                a, b, x_scale=None, y_scale=None, out_dtype=jnp.int32
            )
        )
        xla_dot = jax.jit(lambda a, b: jax.lax.dot(a, b, preferred_element_type=jnp.int32))
        got = cpu_matmul.int8_matmul_host(x, y, x_scale=None, y_scale=None, out_dtype=np.int32)
        exact = bool(np.array_equal(got, torch._int_mm(tx, ty).numpy()))
        times = {
            "ours_host": timed(
                lambda: cpu_matmul.int8_matmul_host(
                    x, y, x_scale=None, y_scale=None, out_dtype=np.int32
                ),
                budget,
            ),
            "ours_jit": timed(lambda: ready(ours_jit(jx, jy)), budget),
            "torch_int_mm": timed_torch(lambda: torch._int_mm(tx, ty), budget),
            # XLA's int8 dot is ~100x slower at large S: a few calls are enough.
            "xla_dot": timed(
                lambda: ready(xla_dot(jx, jy)), budget, max_reps=3 if s >= 2048 else 2000
            ),
        }
        best_peer = min(times["torch_int_mm"], times["xla_dot"])
        rows.append(
            {
                "op": "int8_matmul",
                "size": f"{s}^3",
                "equals_torch_int_mm": exact,
                "us": times,
                "cpu_us": cpu_of(times),
                "ratio_jit_vs_best_peer": times["ours_jit"] / best_peer,
                "ratio_host_vs_best_peer": times["ours_host"] / best_peer,
                "target": "<= 1.0 vs min(xla_dot, torch_int_mm)",
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def overhead_row(budget: float) -> dict[str, Any]:
    """A minimal call (one box / one 1x1 product) through every entry point and peer: what is
    dispatch rather than kernel."""
    box = np.array([[0.0, 0.0, 1.0, 1.0]], np.float32)
    score = np.array([0.5], np.float32)
    jbox, jscore = jax.device_put(box), jax.device_put(score)
    tbox, tscore = torch.from_numpy(box), torch.from_numpy(score)
    nms_jit = jax.jit(
        lambda b, s: cpu_nms.nms(
            b[None], s[None], None, iou_threshold=0.5, max_output_size=1, score_threshold=-np.inf
        )
    )
    giou_jit = jax.jit(cpu_giou.giou)
    empty_jit = jax.jit(lambda b: b)
    times = {
        "ours_host_giou_P1": timed(lambda: cpu_giou.giou_host(box, box), budget),
        "ours_host_nms_N1": timed(
            lambda: cpu_nms.nms_host(
                box[None],
                score[None],
                None,
                iou_threshold=0.5,
                max_output_size=1,
                score_threshold=-np.inf,
            ),
            budget,
        ),
        "ours_jit_giou_P1": timed(lambda: ready(giou_jit(jbox, jbox)), budget),
        "ours_jit_nms_N1": timed(lambda: ready(nms_jit(jbox, jscore)), budget),
        "jax_jit_identity": timed(lambda: ready(empty_jit(jbox)), budget),
        "torchvision_nms_N1": timed_torch(lambda: torchvision.ops.nms(tbox, tscore, 0.5), budget),
    }
    row = {"op": "overhead", "size": "minimal call", "us": times, "cpu_us": cpu_of(times)}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="write the results JSON here")
    parser.add_argument("--budget", type=float, default=0.4, help="seconds per measurement")
    parser.add_argument("--only", choices=("overhead", "nms", "giou", "matmul"), default=None)
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
    sections = {
        "overhead": lambda: [overhead_row(args.budget)],
        "nms": lambda: nms_rows(rng, args.budget),
        "giou": lambda: giou_rows(rng, args.budget),
        "matmul": lambda: matmul_rows(rng, args.budget),
    }
    for name, run in sections.items():
        if args.only in (None, name):
            rows += run()
    header["load_average_at_end"] = os.getloadavg()
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"header": header, "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
