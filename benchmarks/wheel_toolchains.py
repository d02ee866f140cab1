"""The cpu backend's library built by two toolchains, timed in turns in one process.

The wheel CI ships builds the library with ``zig c++`` for glibc 2.28 (``setup.py``,
``$ASICKERNELS_ZIG``); a developer's ``pip install -e .`` builds it with g++. Same sources
and flags: this checks that the two compute the same bits at every instruction-set level
and times them against each other. Both libraries are loaded at once and the kernels' host
entry points (the backend's host twins, what CPU torch tensors and large eager calls run:
no XLA between the call and the kernel) run on each in turns, in alternating order, so that
drift on a shared machine falls on both alike.

Build the two libraries (as ``.ci/package`` and ``pip install -e .`` do), then run from the
repository root, e.g.::

    python setup.py build_ext -b /tmp/gxx -t /tmp/gxx-tmp
    ASICKERNELS_ZIG="python -m ziglang" python setup.py build_ext -b /tmp/zig -t /tmp/zig-tmp
    python benchmarks/wheel_toolchains.py \\
        --library g++=/tmp/gxx/asickernels/backends/cpu/_kernels.abi3.so \\
        --library zig=/tmp/zig/asickernels/backends/cpu/_kernels.abi3.so --json out.json
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from eager_overhead import record

import asickernels
from asickernels.backends.cpu import _library
from asickernels.benchmarking import timing
from asickernels.kernels import registry
from asickernels.kernels.cases import random_boxes
from asickernels.kernels.declaration import Op


def _cases() -> dict[str, Callable[[], Any]]:
    """Each kernel's host twin on fixed inputs of a size that takes 0.1-10 ms here."""
    rng = np.random.default_rng(0)

    def twin(kernel: Op) -> Callable[..., Any]:
        return registry.implementation(kernel, "cpu", host=True)

    b1, b2 = (random_boxes(rng, (262144,)).astype(np.float32) for _ in range(2))
    cotangent = rng.normal(size=262144).astype(np.float32)
    p1, p2 = (random_boxes(rng, (1, 1024)).astype(np.float32) for _ in range(2))
    boxes = random_boxes(rng, (1, 4096)).astype(np.float32)
    scores = rng.uniform(size=(1, 4096)).astype(np.float32)
    x = rng.integers(-128, 128, (1024, 1024), dtype=np.int8)
    y = rng.integers(-128, 128, (1024, 1024), dtype=np.int8)
    features = rng.normal(size=(2, 256, 50, 68)).astype(np.float32)
    corners = random_boxes(rng, (100,), scale=400).astype(np.float32)
    rois = np.concatenate([rng.integers(0, 2, (100, 1)).astype(np.float32), corners], axis=1)
    roi_statics = {"spatial_scale": 0.125, "output_size": (7, 7), "sampling_ratio": 2}
    return {
        "giou 262144 pairs": lambda: twin(asickernels.giou)(b1, b2),
        "giou_vjp 262144 pairs": lambda: twin(asickernels.giou_vjp)(b1, b2, cotangent),
        "ciou 262144 pairs": lambda: twin(asickernels.ciou)(b1, b2),
        "box_iou 1024x1024": lambda: twin(asickernels.box_iou)(p1, p2),
        "nms N=4096 out=128 iou>0.1": lambda: twin(asickernels.nms)(
            boxes, scores, None, iou_threshold=0.1, max_output_size=128, score_threshold=-np.inf
        ),
        "int8_matmul 1024^3": lambda: twin(asickernels.int8_matmul)(
            x, y, x_scale=None, y_scale=None, out_dtype=np.dtype(np.int32)
        ),
        "roi_align K=100 2x256x50x68": lambda: twin(asickernels.roi_align)(
            features, rois, aligned=True, **roi_statics
        ),
    }


def _load(path: Path) -> ctypes.CDLL:
    """The library at ``path``, loaded and set up as the package loads its own."""
    _library.built_library = lambda: path  # type: ignore[assignment]
    _library.library.cache_clear()
    return _library.library()


def _use(lib: ctypes.CDLL) -> None:
    """Makes the cpu backend's host calls run ``lib``'s handlers from now on."""
    _library.library = lambda: lib  # type: ignore[assignment]
    _library._handler.cache_clear()
    _library._handler_address.cache_clear()


def _outputs(call: Callable[[], Any]) -> list[np.ndarray]:
    result = call()
    return [np.asarray(a) for a in (result if isinstance(result, tuple) else (result,))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--library", action="append", required=True, metavar="NAME=PATH",
        help="a built _kernels library (twice or more)",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    paths = dict(item.split("=", 1) for item in args.library)
    libraries = {name: _load(Path(path)) for name, path in paths.items()}
    cases = _cases()

    # Same bits: every library at every level this CPU runs, against the first at its best.
    first = next(iter(libraries))
    _use(libraries[first])
    levels = _library.ISA_LEVELS[: _library.ISA_LEVELS.index(_library.best_isa_level()) + 1]
    expected = {case: _outputs(call) for case, call in cases.items()}
    checked = []
    for name, lib in libraries.items():
        _use(lib)
        for level in levels:
            _library.use_isa_level(level)
            for case, call in cases.items():
                for got, want in zip(_outputs(call), expected[case], strict=True):
                    np.testing.assert_array_equal(got, want, err_msg=f"{name} {level} {case}")
            checked.append(f"{name} {level}")
        _library.use_isa_level(levels[-1])
    print(f"same bits as {first} at its best level: {', '.join(checked)}", flush=True)

    samples: dict[str, dict[str, list[float]]] = {c: {n: [] for n in libraries} for c in cases}
    order = list(libraries)
    for round_ in range(args.rounds):
        for case, call in cases.items():
            for name in order if round_ % 2 == 0 else order[::-1]:
                _use(libraries[name])
                call()  # the library's own warm-up: its code and the inputs in the caches
                start = time.perf_counter()
                call()
                samples[case][name].append(time.perf_counter() - start)
    rows: dict[str, dict[str, Any]] = {}
    for case, by_library in samples.items():
        medians = {n: timing.Timing.from_samples(s, None).median_s for n, s in by_library.items()}
        rows[case] = {f"{n}_median_us": m * 1e6 for n, m in medians.items()}
        rows[case][f"{order[1]}/{first}"] = medians[order[1]] / medians[first]
        times = "  ".join(f"{n} {m * 1e6:9.1f} µs" for n, m in medians.items())
        print(f"{case:30} {times}  {order[1]}/{first} {rows[case][f'{order[1]}/{first}']:.3f}")
    if args.json:
        record(args.json, args, libraries=paths, same_bits=checked, cases=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
