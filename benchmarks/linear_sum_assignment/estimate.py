"""TPU time estimates of DETR's matcher (:func:`asickernels.matcher.hungarian_match`:
matching cost, then ``linear_sum_assignment`` with the padded targets masked) at DETR's
sizes, from libtpu's schedule (:func:`asickernels.simulate.tpu_estimate.estimate_function`).

The example inputs are real: random logits (100 queries, 92 classes) and boxes, image ``b``
with a random number of targets in ``[1, 100]`` padded to 100 and masked. The function runs
on them on CPU first, so the trips of XLA's ``while`` loops (the ``xla`` backend's searches)
and, inside the ``pallas_tpu`` kernel, of its search and path-flip loops (which stop on cost
values: the kernel body is run with its values) are counted from that run, not assumed.
No TPU was used: these are estimates, not measurements, and no TPU measurement exists to
judge them.

    python benchmarks/linear_sum_assignment/estimate.py --batches 2,64 --json benchmarks/linear_sum_assignment/estimate.json
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import sys
import time
from typing import Any

from bench import QUERIES, detr_inputs

from asickernels import matcher
from asickernels.simulate.tpu_estimate import estimate_function
from asickernels.simulate.tpu_estimate.estimate import EstimateError

TARGETS = 100


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="2,64")
    parser.add_argument("--backends", default="pallas_tpu,xla")
    parser.add_argument("--generations", default="v5e,v6e,v5p")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for batch in map(int, args.batches.split(",")):
        inputs = detr_inputs(batch, TARGETS, seed=batch)
        for backend in args.backends.split(","):
            match = functools.partial(
                matcher.hungarian_match,
                cost_class=1.0,
                cost_bbox=5.0,
                cost_giou=2.0,
                backend=backend,
            )
            start = time.perf_counter()
            try:
                estimates = estimate_function(
                    match, *inputs, generations=tuple(args.generations.split(","))
                )
            except EstimateError as error:  # e.g. the walk's bundle limit: record, go on
                print(f"B={batch} backend={backend}: {error}", flush=True)
                rows.append({"batch": batch, "backend": backend, "error": str(error)})
                continue
            seconds = time.perf_counter() - start
            for estimate in estimates:
                print(f"B={batch} backend={backend}\n{estimate.report()}\n", flush=True)
                rows.append(
                    {
                        "batch": batch,
                        "queries": QUERIES,
                        "targets": TARGETS,
                        "mean_targets": float(inputs[4].sum(1).mean()),
                        "backend": backend,
                        "generation": estimate.generation,
                        "device_ms": 1e3 * estimate.device_s,
                        "pallas_kernels_ms": 1e3 * estimate.kernel_s,
                        "per_call_ms": 1e3 * estimate.per_call_s,
                        "bound": estimate.bound,
                        "assumptions": [*estimate.unresolved, *estimate.assumptions],
                        "seconds_to_estimate_all_generations": seconds,
                    }
                )
    if args.json:
        document = {
            "command": "python benchmarks/linear_sum_assignment/estimate.py "
            + " ".join(sys.argv[1:]),
            "rows": rows,
        }
        pathlib.Path(args.json).write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
