"""The ``asickernels`` command (also ``python -m asickernels``).

``info``, ``check``, ``bench`` and ``run`` live here; other modules add commands through
``register_cli(subparsers)`` (listed in :data:`PLUGINS`, imported only when used).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any

import asickernels
from asickernels.benchmarking import harness, report
from asickernels.benchmarking.harness import BenchRow, BenchSettings, CheckRow
from asickernels.benchmarking.progress import Progress
from asickernels.benchmarking.workloads import WORKLOADS
from asickernels.kernels.cases import Size

# Commands other modules provide: name -> (module with register_cli, one-line help).
PLUGINS: dict[str, tuple[str, str]] = {
    "compile": (
        "asickernels.estimates.compile_gate",
        "compile every Pallas kernel for real TPU generations with libtpu (no TPU needed)",
    ),
    "estimate": (
        "asickernels.estimates.command",
        "estimate kernel times: TPU from the compiler's schedule, Neuron (--neuron) from the "
        "NKI simulator's cost model (estimates, not measurements)",
    ),
    "spmd-plan": (
        "asickernels.frontends.spmd_plan",
        "compile sharded programs for TPU pod slices: inserted collectives, per-device memory",
    ),
}
# Plug-in commands that compile with libtpu: what `info` says of each where it is missing.
WITHOUT_LIBTPU = {
    "compile": "needs libtpu",
    "estimate": "--neuron only (TPU estimates need libtpu)",
    "spmd-plan": "needs libtpu",
}

# `run` is the main job: it must finish in a few minutes on a 2-core machine.
BENCH_DEFAULTS = {"repeats": 20, "warmup": 1, "budget": 2.0, "max_call_seconds": 10.0}
RUN_DEFAULTS = {"repeats": 5, "warmup": 1, "budget": 0.3, "max_call_seconds": 0.5}


class PluginUnavailableError(RuntimeError):
    """A plug-in command's module is missing or broken."""


class UsageError(ValueError):
    """Arguments that parse one by one but do not fit together."""


# -- argument types ------------------------------------------------------------------------


def _name_list(choices: Callable[[], Sequence[str]], what: str) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [name.strip() for name in text.split(",") if name.strip()]
        unknown = [name for name in names if name not in choices()]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(unknown) or repr(text)}; choose from {', '.join(choices())}"
            )
        return names

    return parse


def _size_spec(text: str) -> tuple[str, list[Size]]:
    op, separator, specs = text.partition("=")
    if not separator or op not in WORKLOADS:
        raise argparse.ArgumentTypeError(
            f"expected OP=SIZE[,SIZE...] with OP one of {', '.join(WORKLOADS)}, got {text!r}"
        )
    try:
        return op, [WORKLOADS[op].parse_size(spec.strip()) for spec in specs.split(",")]
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{op}: {error}") from None


def _number(kind: type, low: float, *, strict: bool = False) -> Callable[[str], Any]:
    """A ``kind`` number >= ``low`` (> ``low`` if ``strict``)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {low}, got {text}")
        return value

    return parse


# -- commands ------------------------------------------------------------------------------


def _policy_text() -> str:
    """What ``backend=None`` runs, per kernel and compute dtype, here and on each TPU
    generation (with the fallbacks the selection policy takes, e.g. int8 on v4/v7x)."""
    import jax

    from asickernels import tpu_generations
    from asickernels.kernels import policy

    places: list[tuple[str, str, str | None]] = [
        (f"here ({jax.default_backend()})", jax.default_backend(), None)
    ]
    places += [(f"TPU {name}", "tpu", name) for name in tpu_generations.NAMES]
    rows = []
    for label, platform, generation in places:
        table = policy.describe(
            asickernels.OPS, platform, generation, assume_native=generation is not None
        )
        for kernel, by_dtype in table.items():
            rows.append([label, kernel, *(f"{dtype}: {name}" for dtype, name in by_dtype.items())])
    width = max(len(r) for r in rows)
    rows = [r + [""] * (width - len(r)) for r in rows]
    headers = ("where", "kernel", *(["backend=None picks"] + [""] * (width - 3)))
    return "Selection policy (asickernels/kernels/policy.py):\n" + report.text_table(headers, rows)


def _policy_here() -> str:
    """One line: what ``backend=None`` runs here, kernels grouped by the backends picked."""
    import jax

    from asickernels.kernels import policy

    platform = jax.default_backend()
    kernels_by_choice: dict[str, list[str]] = {}
    for kernel, by_dtype in policy.describe(asickernels.OPS, platform).items():
        choices = dict.fromkeys(name.split(" (")[0] for name in by_dtype.values())
        kernels_by_choice.setdefault(" or ".join(choices), []).append(kernel)
    if len(kernels_by_choice) == 1:
        ((choice, _),) = kernels_by_choice.items()
        return f"backend=None here ({platform}) runs {choice} for every kernel"
    groups = "; ".join(f"{choice}: {', '.join(k)}" for choice, k in kernels_by_choice.items())
    return f"backend=None here ({platform}) runs {groups}"


def _info(args: argparse.Namespace) -> int:
    described = report.machine()
    versions = report.versions()
    print(
        f"asickernels {versions['asickernels']}  python {described['python']}  jax {versions['jax']}  "
        f"numpy {versions['numpy']}"
    )
    print(
        f"machine: {described['cpu_model']}, {described['cores']} cores; JAX platform "
        f"{described['jax_backend']} ({', '.join(described['devices'])})"
    )
    print()
    lines, hints = [], []
    for name in harness.implementation_names():
        status = harness.availability_of(name)
        ops = [",".join(harness.ops_of(name))] if args.full else []
        lines.append([name, harness.role_of(name), status.mode, *ops, status.detail])
        if status.install_hint:
            hints.append(f"  {name}: {status.install_hint}")
    ops_header = ("ops",) if args.full else ()
    print(report.text_table(("backend", "role", "runs here", *ops_header, "detail"), lines))
    if hints:
        print("\nTo install or enable:\n" + "\n".join(hints))
    print()
    print(_policy_text() if args.full else _policy_here())
    print()
    missing_libtpu = _libtpu_missing()
    plugin_lines = [
        [name, _plugin_state(name, module, missing_libtpu), *([module] if args.full else []), text]
        for name, (module, text) in PLUGINS.items()
    ]
    module_header = ("module",) if args.full else ()
    print(report.text_table(("command", "state", *module_header, "what it does"), plugin_lines))
    if missing_libtpu and any(line[1] in WITHOUT_LIBTPU.values() for line in plugin_lines):
        print(f"\nTo enable them: {missing_libtpu}")
    if not args.full:
        print(
            "\n`asickernels info --full` adds each backend's ops and which backend backend=None "
            "picks per kernel and dtype, here and on each TPU generation."
        )
    return 0


def _libtpu_missing() -> str | None:
    """None when libtpu is installed, else what to install."""
    from asickernels.simulate import tpu_compile

    return tpu_compile.libtpu_status()


def _plugin_state(name: str, module: str, missing_libtpu: str | None) -> str:
    try:
        if importlib.util.find_spec(module) is None:
            return "not installed"
    except ImportError:
        return "not installed"
    if missing_libtpu and name in WITHOUT_LIBTPU:
        return WITHOUT_LIBTPU[name]
    return "available"


def _selection(args: argparse.Namespace) -> tuple[list[str], frozenset[str] | None]:
    ops = args.ops or list(WORKLOADS)
    return ops, frozenset(args.backends) if args.backends else None


def _run_check(args: argparse.Namespace) -> tuple[list[CheckRow], bool]:
    ops, selected = _selection(args)
    with Progress(enabled=not args.quiet) as progress:
        rows = harness.check(ops, selected, seed=args.seed, quick=args.quick, progress=progress)
    print(report.text_table(report.CHECK_HEADERS, report.check_table(rows)))
    print("\n" + report.CHECK_LEGEND)
    _print_missing(rows)
    bad = [row for row in rows if row.status in ("fail", "error")]
    ran = [row for row in rows if row.status not in ("missing", "n/a")]
    not_applicable = sum(row.status == "n/a" for row in rows)
    print(
        f"\ncheck: {len(ran) - len(bad)}/{len(ran)} runs match the float64 reference"
        + (f"; {len(bad)} FAILED" if bad else "")
        + (
            f"; {not_applicable} not applicable (refused by the backend by design)"
            if not_applicable
            else ""
        )
    )
    return rows, not bad


def _print_missing(rows: Sequence[BenchRow | CheckRow]) -> None:
    missing = report.missing_lines(rows)
    if missing:
        print("\nNot run (cannot run here):\n" + "\n".join(f"  {line}" for line in missing))


def _bench_settings(args: argparse.Namespace) -> BenchSettings:
    ops, selected = _selection(args)
    chosen = dict(args.size or [])
    stray = sorted(set(chosen) - set(ops))
    if stray:
        raise UsageError(f"--size given for {', '.join(stray)}, which --ops leaves out")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot draws with matplotlib: pip install matplotlib")
    defaults = {
        op: WORKLOADS[op].quick_sizes if args.quick else WORKLOADS[op].default_sizes for op in ops
    }
    sizes = {
        op: chosen.get(op) or [WORKLOADS[op].parse_size(s) for s in defaults[op]] for op in ops
    }
    return BenchSettings(
        sizes=sizes,
        selected=selected,
        warmup=args.warmup,
        repeats=args.repeats,
        min_repeats=min(3, args.repeats),
        budget_s=args.budget,
        max_call_s=args.max_call_seconds,
        force=args.force,
        seed=args.seed,
    )


def _run_bench(args: argparse.Namespace, settings: BenchSettings) -> tuple[list[BenchRow], bool]:
    with Progress(enabled=not args.quiet) as progress:
        rows = harness.bench(settings, progress)
    print(report.text_table(report.BENCH_HEADERS, report.bench_table(rows)))
    print("\n" + report.BENCH_LEGEND)
    _print_missing(rows)
    bad = [row for row in rows if row.status in ("fail", "error")]
    if bad:
        print(f"bench: {len(bad)} rows FAILED or raised (see result and notes)")
    if args.plot:
        report.plot(rows, args.plot)
        print(f"plot written to {args.plot}")
    return rows, not bad


def _write_json(args: argparse.Namespace, **parts: Any) -> None:
    if args.json:
        doc = report.document(args.command_line, **parts)
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(doc, handle, indent=1)
            handle.write("\n")
        print(f"results written to {args.json}")


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuses, before any work, an output file whose folder does not exist."""
    for flag, path in (("--json", args.json), ("--plot", getattr(args, "plot", None))):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise UsageError(f"{flag} {path}: no folder {os.path.dirname(os.path.abspath(path))}")


def _check(args: argparse.Namespace) -> int:
    _check_outputs(args)
    ops, selected = _selection(args)
    if selected:
        checked = {c.name for _, backends in harness.check_plan(ops, None) for c in backends}
        if not selected & checked:
            raise UsageError(
                f"--backends {','.join(sorted(selected))}: none of them implements "
                f"{', '.join(ops)}; these run: {', '.join(sorted(checked))}"
            )
    rows, ok = _run_check(args)
    _write_json(args, checks=rows)
    return 0 if ok else 1


def _bench(args: argparse.Namespace) -> int:
    _check_outputs(args)
    settings = _bench_settings(args)
    rows, ok = _run_bench(args, settings)
    _write_json(args, results=rows, settings=settings)
    return 0 if ok else 1


def _run(args: argparse.Namespace) -> int:
    _check_outputs(args)
    settings = _bench_settings(args)
    print("== check: every op on every backend against the float64 reference ==\n")
    checks, checks_ok = _run_check(args)
    print("\n== bench: quick timings (`asickernels bench` for the full run) ==\n")
    results, bench_ok = _run_bench(args, settings)
    _write_json(args, checks=checks, results=results, settings=settings)
    return 0 if checks_ok and bench_ok else 1


# -- parser --------------------------------------------------------------------------------


def _add_selection(parser: argparse.ArgumentParser, *, peers: bool) -> None:
    parser.add_argument(
        "--ops",
        type=_name_list(lambda: list(WORKLOADS), "op"),
        metavar="OP[,OP...]",
        help=f"ops to run (default: all: {', '.join(WORKLOADS)})",
    )
    names = harness.implementation_names if peers else harness.checked_names
    parser.add_argument(
        "--backends",
        type=_name_list(names, "backend"),
        metavar="NAME[,NAME...]",
        help="backends and peers to run (default: all; `asickernels info` lists them)"
        if peers
        else "backends to check (default: all; `asickernels info` lists them; peers, other "
        "libraries' implementations, are compared and timed by bench)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed of the inputs (default 0)")
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="write the results as JSON (schema: asickernels.benchmarking.schema)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar on stderr")


def _add_timing(parser: argparse.ArgumentParser, defaults: dict[str, float]) -> None:
    sizes = "; ".join(
        f"{op}: {o.size_syntax}, default {','.join(o.default_sizes)}" for op, o in WORKLOADS.items()
    )
    parser.add_argument(
        "--size",
        action="append",
        type=_size_spec,
        metavar="OP=SIZE[,SIZE...]",
        help=f"sizes of one op (repeatable). {sizes}",
    )

    def number(
        flag: str, parse: Callable[[str], Any], text: str, metavar: str | None = None
    ) -> None:
        dest = flag.removeprefix("--").replace("-", "_")  # argparse's name for the option
        parser.add_argument(
            flag,
            type=parse,
            default=defaults[dest],
            metavar=metavar,
            help=f"{text} (default %(default)s)",
        )

    number("--repeats", _number(int, 1), "timed calls per row, at most")
    number("--warmup", _number(int, 0), "untimed calls after the first, compiling one")
    seconds = _number(float, 0, strict=True)
    number(
        "--budget",
        seconds,
        "time for one row's timed calls; fewer repeats when slow, never fewer than 3",
        "SECONDS",
    )
    number(
        "--max-call-seconds",
        seconds,
        "skip a size whose per-call time, extrapolated from a smaller size, exceeds this",
        "SECONDS",
    )
    parser.add_argument(
        "--force", action="store_true", help="run every size, however long it takes"
    )
    parser.add_argument(
        "--plot", metavar="PATH", help="also draw the timings as a PNG (matplotlib)"
    )


def build_parser(plugin: str | None = None) -> argparse.ArgumentParser:
    """The command-line parser; ``plugin`` names the plug-in command to load for real (the
    others are listed with their help line only)."""
    parser = argparse.ArgumentParser(
        prog="asickernels",
        description="GIOU, NMS and int8 matmul kernels for TPUs and AWS Neuron: check them, time them.",
        epilog="`asickernels COMMAND --help` describes a command and its options.",
    )
    parser.add_argument(
        "--version", action="version", version=f"asickernels {asickernels.__version__}"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    info = commands.add_parser(
        "info",
        help="platform, devices, and how each backend runs here",
        description="Show this machine's platform and devices; each backend and peer with how "
        "it runs here (native, simulated, or missing and what to install); what backend=None "
        "runs here; and the optional commands.",
    )
    info.add_argument(
        "--full",
        action="store_true",
        help="also each backend's ops, and which backend backend=None picks per kernel and "
        "dtype, here and on each TPU generation",
    )
    info.set_defaults(handler=_info)
    check = commands.add_parser(
        "check",
        help="every op on every backend against the float64 reference (exit 1 on any failure)",
        description="Run every op on every backend on its check cases (random, edge and "
        "adversarial inputs) and compare each result with the float64 reference. Prints one "
        "row per op and backend (cases passed, worst error, what failed); a backend that "
        "cannot run here is listed, not failed. Exits 1 if any result is wrong or a call "
        "raises.",
    )
    _add_selection(check, peers=False)
    check.add_argument(
        "--quick", action="store_true", help="only a few cases per op (the ones `run` uses)"
    )
    check.set_defaults(handler=_check)
    for name, text, description, handler, defaults, quick in (
        (
            "bench",
            "check, then time every op on every backend and peer",
            "Time every op on every backend and peer (other libraries' implementations) at "
            "each size, after checking the result against the float64 reference; a wrong "
            "result is reported, not timed. Sizes whose call would take too long are "
            "skipped (see --max-call-seconds, --force). Exits 1 if any result is wrong or a "
            "call raises.",
            _bench,
            BENCH_DEFAULTS,
            False,
        ),
        (
            "run",
            "the main job: quick check, then quick bench (a few minutes)",
            "The main job, in a few minutes: `check --quick` (a few cases per op), then a "
            "quick bench (small sizes, few repeats). `asickernels check` and `asickernels "
            "bench` are the full runs. Exits 1 if anything fails.",
            _run,
            RUN_DEFAULTS,
            True,
        ),
    ):
        sub = commands.add_parser(name, help=text, description=description)
        _add_selection(sub, peers=True)
        _add_timing(sub, defaults)
        sub.set_defaults(handler=handler, quick=quick)

    for name, (module, text) in PLUGINS.items():
        if name != plugin:
            commands.add_parser(name, help=text, add_help=False)
            continue
        try:
            loaded = importlib.import_module(module)
        except ImportError as error:
            raise PluginUnavailableError(
                f"this command is not available: {module} does not import ({error})"
            ) from None
        if not hasattr(loaded, "register_cli"):
            raise PluginUnavailableError(
                f"this command is not available: {module} has no register_cli"
            )
        loaded.register_cli(commands)
        if name not in commands.choices:
            raise PluginUnavailableError(f"{module}.register_cli did not add the {name!r} command")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    from asickernels.simulate import tpu_compile

    tpu_compile.set_libtpu_environment()  # before jax loads libtpu
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    try:
        parser = build_parser(command if command in PLUGINS else None)
    except PluginUnavailableError as error:
        print(f"asickernels {command}: {error}", file=sys.stderr)
        return 2
    try:
        args = parser.parse_args(argv)
        args.command_line = shlex.join(["asickernels", *argv])
        return int(args.handler(args))
    except SystemExit as stop:  # argparse: --help, --version, usage errors
        return stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 2
    except UsageError as error:
        print(f"asickernels {command}: error: {error}", file=sys.stderr)
        return 2
