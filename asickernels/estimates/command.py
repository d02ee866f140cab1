"""``asickernels estimate``: TPU estimates of our kernels (:mod:`.tpu_report`) or of a user's
function (:mod:`asickernels.simulate.tpu_estimate.user_function`), or with ``--neuron`` NKI
estimates of our kernels (:mod:`.nki_estimates`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from asickernels.simulate.tpu_estimate import estimate as cost

# The ops of the TPU estimate table (what ``--op`` takes; :func:`.tpu_report.estimate_cases`).
OPS = ("int8_matmul", "w8a8_matmul", "bf16_matmul", "giou", "giou_grad", "nms")


def _run_cli(args: argparse.Namespace) -> int:
    from asickernels.estimates import nki_estimates

    if args.neuron is not None or args.kernel or args.timeline:  # no TPU compiler needed
        return nki_estimates.run_cli(args)  # refuses --kernel/--timeline without --neuron
    from asickernels.estimates import tpu_report
    from asickernels.simulate import tpu_compile

    if args.render:  # compiles nothing
        clashing = [
            flag for flag in ("generation", "op", "tune", "function", "arg") if getattr(args, flag)
        ]
        if clashing:
            print(f"--render compiles nothing: drop --{', --'.join(clashing)}", file=sys.stderr)
            return 2
        return tpu_report.run(
            (),
            tune_blocks=False,
            markdown=args.markdown,
            verbose=False,
            json_path=args.json,
            recorded=args.render,
        )
    missing = tpu_compile.libtpu_status()
    if missing:
        print(f"cannot compile for TPU here: {missing}", file=sys.stderr)
        return 2
    if args.function:
        return _estimate_user_function(args)
    if args.arg:
        print("--arg needs --function", file=sys.stderr)
        return 2
    return tpu_report.run(
        args.generation or cost.DEFAULT_GENERATIONS,
        tune_blocks=args.tune,
        markdown=args.markdown,
        verbose=args.verbose,
        json_path=args.json,
        ops=args.op,
    )


def _estimate_user_function(args: argparse.Namespace) -> int:
    from asickernels.simulate.tpu_estimate import user_function

    try:
        specs = [user_function.parse_arg_spec(text) for text in args.arg or ()]
        if str(Path.cwd()) not in sys.path:  # `--function mymodule:f` from the current folder
            sys.path.insert(0, str(Path.cwd()))
        import jax

        examples = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in specs]
        estimates = user_function.estimate_function(
            args.function, *examples, generations=args.generation or cost.DEFAULT_GENERATIONS
        )
    except (ValueError, cost.EstimateError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for estimate in estimates:
        print(estimate.report())
    return 0


# `asickernels estimate --help`, printed as written (lines of at most 78 characters).
ESTIMATE_DESCRIPTION = """\
Estimate kernel times without the hardware: estimates, not measurements.

TPU (the default): compile each kernel with libtpu, the real TPU compiler, on
this machine, and turn the instruction schedule it produced into time at each
chip's clock and HBM bandwidth, calibrated on published TPU v5e timings.
Each estimate is printed beside its roofline; exits 1 if one falls below it.
All cases on all generations take one to two hours on 2 cores: narrow them
with --generation and --op. Your own function: --function module:name with
one --arg DTYPE[SHAPE] per argument (device time, floor, bound, assumptions).

AWS Neuron (--neuron): run our NKI kernels in the NKI simulator and time them
with its cost model, for trn1/inf2, trn2 and trn3 (no libtpu needed)."""
ESTIMATE_EPILOG = """\
examples:
  asickernels estimate --generation v6e --op int8_matmul
  asickernels estimate --render benchmarks/results/tpu_estimates/estimates.json
  asickernels estimate --function mykernels:matmul --generation v5p \\
      --arg bfloat16[4096,4096] --arg bfloat16[4096,4096]
  asickernels estimate --neuron trn2 --kernel giou --timeline giou.png

TPU estimates need libtpu:
  {install}.
More: docs/tpu-compile-and-estimates.md and docs/nki-simulator.md."""


def register_cli(subparsers: Any) -> None:
    """Adds ``asickernels estimate``."""
    from asickernels.estimates import nki_estimates
    from asickernels.simulate import tpu_compile

    parser = subparsers.add_parser(
        "estimate",
        help="estimate kernel times: TPU from the compiler's schedule, Neuron (--neuron) "
        "from the NKI simulator's cost model (estimates, not measurements)",
        description=ESTIMATE_DESCRIPTION,
        epilog=ESTIMATE_EPILOG.format(install=tpu_compile.LIBTPU_INSTALL),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--generation",
        action="append",
        choices=sorted(cost.GENERATIONS),
        help=f"TPU generation (repeatable; default: {', '.join(cost.DEFAULT_GENERATIONS)})",
    )
    parser.add_argument(
        "--tune", action="store_true", help="also sweep int8 matmul blocks and NMS tiles (slow)"
    )
    parser.add_argument(
        "--markdown",
        metavar="PATH",
        help="write the estimates as markdown (TPU: with calibration and tuning)",
    )
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="write one row per (case, generation): name, op, impl, shape, generation, "
        "program_ms, kernel_ms, roofline_ms, calibrated_ms (with --neuron: op, size, "
        "generation, estimate_us, roofline_us, bound, busy_share, instructions)",
    )
    parser.add_argument(
        "--render",
        metavar="JSON",
        nargs="+",
        help="compile nothing (no libtpu needed): merge these recorded --json files and "
        "write the comparison table, --json and --markdown from them (the calibration "
        "against published timings compiles, so a full run writes it)",
    )
    parser.add_argument(
        "--op",
        action="append",
        choices=OPS,
        metavar="OP",
        help=f"only cases of this op (repeatable; default: all): {', '.join(OPS)}",
    )
    parser.add_argument(
        "--verbose", "-v", action="store_true", help="show loops, assumptions, costliest programs"
    )
    parser.add_argument(
        "--function",
        metavar="MODULE:NAME",
        help="estimate this jitted function or Pallas kernel (importable from the current "
        "folder or the environment) instead of ours",
    )
    parser.add_argument(
        "--arg",
        action="append",
        metavar="DTYPE[SHAPE]",
        help="an example argument of --function, e.g. bfloat16[1024,1024] (repeatable, in order)",
    )
    nki_estimates.add_arguments(parser)
    parser.set_defaults(handler=_run_cli)
