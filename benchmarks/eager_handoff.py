"""How long handing a host kernel's numpy output over to JAX takes, by public JAX API.

An eager call that runs a host implementation (see :mod:`asickernels.kernels.eager`)
returns JAX arrays: its numpy outputs, 64-byte aligned, are handed over without a copy.
Right after the kernel has swept its inputs through the caches, the hand-over's own code
runs cold, so it is timed in that state: each round runs the cpu backend's GIOU host
twin on unaligned ``1024x256`` inputs (1 MiB output) once per hand-over, then times that
hand-over of its output (``block_until_ready`` included), the hand-overs in turns:

* ``device_put``: ``jax.device_put(out)``;
* ``make_array_from_callback``: ``jax.make_array_from_callback`` with the default device's
  sharding (what the eager path uses);
* ``none``: no hand-over (the numpy output itself), the floor.

Run from the repository root, e.g.
``python benchmarks/eager_handoff.py --json benchmarks/results/eager_overhead/handoff_1.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from eager_overhead import misaligned, record

import asickernels
from asickernels.benchmarking import timing, workloads
from asickernels.kernels import registry

HANDOVERS: dict[str, Callable[[np.ndarray, Any], Any]] = {
    "device_put": lambda out, sharding: jax.device_put(out),
    "make_array_from_callback": lambda out, sharding: jax.make_array_from_callback(
        out.shape, sharding, lambda _: out
    ),
    "none": lambda out, sharding: out,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    op = workloads.WORKLOADS["giou"]
    case = op.bench_case(op.parse_size("1024x256"), np.random.default_rng(0))
    boxes1, boxes2 = (misaligned(a).reshape(-1, 4) for a in case.arrays)
    host_twin = registry.implementation(asickernels.giou, "cpu", host=True)
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    samples: dict[str, list[float]] = {name: [] for name in HANDOVERS}
    for _ in range(args.rounds):
        for name, hand_over in HANDOVERS.items():
            out = host_twin(boxes1, boxes2)
            start = time.perf_counter()
            timing.synchronize(hand_over(out, sharding))
            samples[name].append(time.perf_counter() - start)
    rows = {}
    for name, taken in samples.items():
        measured = timing.Timing.from_samples(taken[2:], None)  # the first rounds warm up
        rows[name] = {
            "median_us": measured.median_s * 1e6,
            "p10_us": measured.p10_s * 1e6,
            "p90_us": measured.p90_s * 1e6,
            "repeats": measured.repeats,
        }
        print(
            f"{name:26} median {rows[name]['median_us']:8.1f} µs"
            f"  p10 {rows[name]['p10_us']:8.1f}  p90 {rows[name]['p90_us']:8.1f}",
            flush=True,
        )
    if args.json:
        record(args.json, args, handovers=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
