"""Renders benchmarks/README.md from the recorded results in benchmarks/results/.

    asickernels bench --quiet --repeats 100 --json benchmarks/results/cpu.json  # measure
    python benchmarks/render.py                                                 # render

Every ``benchmarks/results/*.json`` (written by ``asickernels bench/run --json``) becomes a
section, then the NKI cost model's calibration (``benchmarks/nki_estimate/calibration.json``,
written by ``benchmarks/nki_estimate/calibrate.py``); every ``benchmarks/results/*.md``
(written by other tools, e.g. ``asickernels estimate --markdown``) is linked, in file-name
order.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

from asickernels.benchmarking.markdown import render

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results"
NKI_CALIBRATION = HERE / "nki_estimate" / "calibration.json"
OUT = HERE / "README.md"


def _link(path: pathlib.Path, out: pathlib.Path) -> str:
    return pathlib.Path(os.path.relpath(path.resolve(), out.resolve().parent)).as_posix()


def rendered(
    results: pathlib.Path = RESULTS,
    out: pathlib.Path = OUT,
    nki_calibration: pathlib.Path = NKI_CALIBRATION,
) -> str:
    """The text of ``out`` rendered from ``results`` and ``nki_calibration`` (when it
    exists; links relative to ``out``'s folder)."""
    documents = [json.loads(path.read_text()) for path in sorted(results.glob("*.json"))]
    if not documents:
        raise FileNotFoundError(f"no results in {results}: run `asickernels bench --json ...`")
    links = [_link(path, out) for path in sorted(results.glob("*.md"))]
    calibration = None
    if nki_calibration.is_file():
        calibration = (json.loads(nki_calibration.read_text()), _link(nki_calibration, out))
    return render(documents, links, calibration)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=pathlib.Path, default=RESULTS)
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    args = parser.parse_args(argv)
    try:
        text = rendered(args.results, args.out)
    except FileNotFoundError as error:
        print(error, file=sys.stderr)
        return 1
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
