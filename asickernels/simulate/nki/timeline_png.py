"""The cost model's engine timeline as a PNG (needs matplotlib: ``pip install matplotlib``,
or the ``bench`` extra in a clone: ``pip install -e ".[bench]"``).

The input is the Chrome/Perfetto trace the model writes (:meth:`Estimate.chrome_trace
<asickernels.simulate.nki.estimate.Estimate.chrome_trace>`, or the JSON file of
``benchmark_result.write_chrome_trace(path)``): one lane per engine, a bar per instruction.
It draws a modelled schedule, not a profile: nothing ran on a device.

    bench = nki.benchmark(kernel)
    bench(*inputs)
    bench.benchmark_result.write_chrome_trace("kernel.json")
    write_timeline_png("kernel.json", "kernel.png")

or from the command line: ``asickernels estimate --neuron trn2 --kernel giou --timeline giou.png``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["write_timeline_png"]


def _lanes(events: list[dict[str, Any]]) -> tuple[list[str], dict[Any, list[tuple[float, float]]]]:
    """Lane names in trace order and each lane's (start, duration) bars in microseconds."""
    names = {
        e["tid"]: e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    bars: dict[Any, list[tuple[float, float]]] = {tid: [] for tid in names}
    for e in events:
        if e.get("ph") == "X":
            bars.setdefault(e["tid"], []).append((float(e["ts"]), float(e["dur"])))
    return [str(names.get(tid, tid)) for tid in bars], bars


def write_timeline_png(
    trace: Mapping[str, Any] | str | os.PathLike[str],
    path: str | os.PathLike[str],
    title: str | None = None,
) -> None:
    """Draws ``trace`` (a Chrome trace dict, or the path of its JSON file, as the NKI cost
    model writes it) to the PNG ``path``: one lane per engine, a bar per instruction (a
    DMA's bar runs until its data is ready for dependants), time in microseconds, titled with
    ``title``, the modelled latency, its band (DMA-rate and overlap assumptions), the generation
    and "a cost-model estimate".

    Raises ValueError when the trace has no instructions (an estimate made without
    ``timeline=True``), ImportError saying how to install matplotlib when it is missing."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError(
            "drawing a timeline PNG needs matplotlib: pip install matplotlib (in a clone of "
            'asickernels: pip install -e ".[bench]"), or write the Chrome trace JSON and open '
            "it in ui.perfetto.dev"
        ) from None
    document: Mapping[str, Any]
    if isinstance(trace, Mapping):
        document = trace
    else:
        with open(trace, encoding="utf-8") as file:
            document = json.load(file)
    events = list(document.get("traceEvents", []))
    names, bars = _lanes(events)
    end = max((start + duration for lane in bars.values() for start, duration in lane), default=0)
    if end <= 0:
        raise ValueError(
            "the trace has no timed instructions: estimate with timeline=True "
            "(asickernels.simulate.nki.estimate.estimate) before drawing it"
        )
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(12, 0.6 * len(names) + 1.6))
    for lane, intervals in enumerate(bars.values()):
        axis.broken_barh(intervals, (lane - 0.4, 0.8), color=f"C{lane}", linewidth=0)
    axis.set_yticks(range(len(names)), names)
    axis.invert_yaxis()  # first engine on top, as in a trace viewer
    axis.set_xlim(0, end)
    axis.set_xlabel("time (µs, modelled)")
    other = document.get("otherData", {})
    generation = other.get("generation", "")
    heading = f"{title}: " if title else ""
    band = other.get("band_us")
    span = f", band {band[0]:.2f}-{band[1]:.2f} µs" if band else ""
    axis.set_title(
        f"{heading}{end:.2f} µs{span} on {generation} (a cost-model estimate, not a profile)"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
