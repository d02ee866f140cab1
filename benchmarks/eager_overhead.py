"""What an eager call costs over JAX's own ``jax.jit``, per op and bench size.

For every op of ``asickernels bench`` at its default sizes, three calls of the public API
with ``backend=None`` are timed in turns in one process (see
:func:`asickernels.benchmarking.timing.measure_alternately`):

* ``eager``: the op called on the bench's numpy inputs;
* ``jit_numpy``: ``jax.jit`` of the op called on the same numpy inputs;
* ``jit_device``: ``jax.jit`` of the op called on the inputs already on the device.

With ``--unaligned`` every input is first copied to memory that is not 64-byte aligned
(numpy's own allocations are 16-byte aligned, so most are not), which XLA's CPU client
copies before a compiled call: the case the host-twin switch in
:mod:`asickernels.kernels.eager` is for. For ops whose kernel has a host twin on the
cpu backend, a fourth call is timed in the same turns:

* ``host_twin``: what an eager call on that path runs before it hands its numpy outputs
  to JAX (the op's computation on the cpu backend's host twin, numpy in and out), so that
  ``eager - host_twin`` is the hand-over to JAX and the call's dispatch.

The JSON output holds the medians, 10-90% spreads and the ratios ``eager / jit_numpy``
(target <= 1.2 at every size) and ``eager / jit_device`` (target <= 1.3 where
``jit_device`` takes >= 200 µs), with the command that made it. Run from the repository
root, e.g. ``python benchmarks/eager_overhead.py --json benchmarks/results/eager.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

import asickernels
from asickernels.benchmarking import report, timing, workloads
from asickernels.kernels import registry
from asickernels.kernels.cases import Case, Workload

MODES = {"eager": "eager", "jit_numpy": "jit-numpy", "jit_device": "jit"}
DEVICE_TARGET_FROM_S = 200e-6


def misaligned(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``array`` whose data starts 16 bytes past a 64-byte boundary."""
    raw = np.empty(array.nbytes + 128, np.uint8)
    start = (16 - raw.ctypes.data) % 64
    out = raw[start : start + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


def host_twin_call(op: Workload, case: Case) -> Callable[[], Any] | None:
    """The op's computation on the cpu backend's host twin, as an eager call runs it (None
    when the op's kernel has none)."""
    public = op.op
    arrays, statics, _, _ = public.bind(case.arrays, dict(case.static))
    plan = public.plan(arrays, **statics)
    if public.kernel is None or not registry.has_host_implementation(public.kernel, "cpu"):
        return None
    runner = registry.Runner(public, "cpu", True, None)
    return lambda: public.compute(runner, plan, **arrays, **plan.statics)


def bench_size(op: Workload, text: str, args: argparse.Namespace) -> dict[str, Any]:
    size = op.parse_size(text)
    case = op.bench_case(size, np.random.default_rng(0))
    if args.unaligned:
        case.arrays = tuple(map(misaligned, case.arrays))
    calls = [workloads.prepare_default(op, mode, case).call for mode in MODES.values()]  # type: ignore[arg-type]
    modes = list(MODES)
    host_twin = host_twin_call(op, case)
    if host_twin is not None:
        calls.append(host_twin)
        modes.append("host_twin")
    first = [timing.timed_call(call)[1] for call in calls]
    timings = timing.measure_alternately(
        calls,
        first_calls_s=first,
        warmup=args.warmup,
        repeats=args.repeats,
        min_repeats=3,
        budget_s=args.budget,
    )
    row: dict[str, Any] = {"op": op.name, "size": size.label}
    for name, measured in zip(modes, timings, strict=True):
        row[name] = {
            "median_us": measured.median_s * 1e6,
            "p10_us": measured.p10_s * 1e6,
            "p90_us": measured.p90_s * 1e6,
            "repeats": measured.repeats,
        }
    eager, jit_numpy, jit_device = (t.median_s for t in timings[:3])
    row["eager_over_jit_numpy"] = eager / jit_numpy
    row["eager_over_jit_device"] = eager / jit_device
    row["meets_numpy_target"] = eager / jit_numpy <= 1.2
    row["device_target_applies"] = jit_device >= DEVICE_TARGET_FROM_S
    row["meets_device_target"] = jit_device < DEVICE_TARGET_FROM_S or eager / jit_device <= 1.3
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default=",".join(workloads.WORKLOADS), help="comma-separated ops")
    parser.add_argument("--max-int8", type=int, default=8192, help="largest int8_matmul size")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=60, help="timed calls per mode")
    parser.add_argument("--budget", type=float, default=2.0, help="seconds per mode and size")
    parser.add_argument("--sizes", help="comma-separated sizes (default: the op's bench sizes)")
    parser.add_argument("--unaligned", action="store_true", help="inputs not 64-byte aligned")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    rows = []
    for name in args.ops.split(","):
        op = workloads.WORKLOADS[name]
        for text in args.sizes.split(",") if args.sizes else op.default_sizes:
            if name == "int8_matmul" and int(text) > args.max_int8:
                continue
            row = bench_size(op, text, args)
            rows.append(row)
            print(
                f"{row['op']:20} {row['size']:24} eager {row['eager']['median_us']:10.1f} µs"
                f"  jit-numpy {row['jit_numpy']['median_us']:10.1f}"
                f"  jit-device {row['jit_device']['median_us']:10.1f}"
                f"  eager/jit-numpy {row['eager_over_jit_numpy']:5.2f}"
                f"  eager/jit-device {row['eager_over_jit_device']:5.2f}"
                + (
                    f"  host-twin {row['host_twin']['median_us']:10.1f}"
                    if "host_twin" in row
                    else ""
                ),
                flush=True,
            )
    if args.json:
        record(args.json, args, rows=rows)
    return 0


def record(path: str, args: argparse.Namespace, **results: Any) -> None:
    """Writes ``results`` to ``path`` as JSON, with the command, its settings, the time,
    the machine (load average included) and the versions."""
    result = {
        "command": shlex.join(["python", *sys.argv]),
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "asickernels": asickernels.__file__,
        "settings": vars(args),
        "machine": report.machine(),
        "versions": report.versions(),
        **results,
    }
    with open(path, "w") as file:
        json.dump(result, file, indent=1)


if __name__ == "__main__":
    sys.exit(main())
