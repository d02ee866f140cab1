"""Renders BENCHMARKS.md (repo root) from the recorded results.

    asickernels bench --json benchmarks/results/cpu.json   # measure (minutes)
    python benchmarks/render.py                            # render (instant)

Every ``benchmarks/results/*.json`` (written by ``asickernels bench/run --json``) becomes a
section; every ``benchmarks/results/*.md`` (written by other tools, e.g. TPU estimates) is
appended verbatim, in file-name order.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from asickernels.benchmarking.markdown import render

ROOT = pathlib.Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=pathlib.Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "BENCHMARKS.md")
    args = parser.parse_args(argv)
    documents = [json.loads(path.read_text()) for path in sorted(args.results.glob("*.json"))]
    if not documents:
        print(
            f"no results in {args.results}: run `asickernels bench --json ...` first",
            file=sys.stderr,
        )
        return 1
    extra = [path.read_text() for path in sorted(args.results.glob("*.md"))]
    args.out.write_text(render(documents, extra))
    print(
        f"wrote {args.out} from {len(documents)} result file(s) and {len(extra)} extra section(s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
