"""Runs AWS's NKI kernel library's own test suite (aws-neuron/nki-library at d2ad3a5, read
unchanged from the vendor tree) in its simulation mode on asickernels' NKI simulator::

    python tests/simulate/nki/nkilib_suite.py [-n 2] [pytest arguments]   # make test-nkilib

in an environment with the suite's test dependencies (requirements-nkilib.txt). The suite's
``--test-mode simulation`` imports AWS's CPU simulator as ``nki_cpu_simulator`` and the SDK's
``neuron_dtypes``; ``-p asickernels.simulate.nki.pytest_plugin`` hooks both onto the
simulator. It runs the suite's default simulation selection: ``test/integration`` on
``--platform-target trn2``, without the large shapes its conftest skips in simulation.

This module is also the pytest plugin the run loads (``-p nkilib_suite``): it supplies the one
module the d2ad3a5 snapshot lacks, runs the multi-rank cases on every rank, caps each worker's
memory at its share of the machine's (a case needing more fails with a MemoryError naming the
allocation, instead of the OOM killer ending workers), and marks the cases known to fail, each
with its reason, as strict xfails (a case that starts passing fails the run until it leaves
the list). A case that runs out of memory in its worker (its share, less what the cases before
it left reserved there) is run again alone, in a fresh process with the whole share; the
results page (``--nkilib-results PATH``) counts its second outcome and says so.

``--nkilib-tree DIR`` runs another checkout of nki-library (a newer one, or one's own) the same
way, without the snapshot's lists of unimportable files and known failures.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
FOLDER = "nki-library@d2ad3a5"
# Where the tree is: tests/data/vendor (tests/fetch_vendor.py's folder) or the copy beside the
# checkout (CI's), as tests/conftest.py looks for vendor files.
TREES = (REPO / "tests" / "data" / "vendor" / FOLDER, REPO.parent / "shared" / "vendor" / FOLDER)


def vendor_tree() -> Path | None:
    """The nki-library tree at d2ad3a5 (symbolic links resolved: pytest registers a conftest
    by its path, so test paths given in the resolved form must name the same files), or None
    where neither place has it."""
    tree = next((tree for tree in TREES if (tree / "test" / "conftest.py").is_file()), None)
    return None if tree is None else tree.resolve()


def _in_tree(tree: Path, argument: str) -> str | None:
    """A test file, folder or node id of ``tree`` that an argument names (a relative path read
    from the current directory), with its path made absolute; None for other arguments."""
    path, separator, node = argument.partition("::")
    if not Path(path).exists() or not Path(path).resolve().is_relative_to(tree):
        return None
    return f"{Path(path).resolve()}{separator}{node}"


# Options naming a file the run writes: read from the current directory, as they are given.
OUTPUT_OPTIONS = ("--junitxml", "--junit-xml")


def _absolute_outputs(arguments: list[str]) -> list[str]:
    """``arguments`` with the paths of :data:`OUTPUT_OPTIONS` made absolute."""
    absolute = []
    for index, argument in enumerate(arguments):
        option, equals, value = argument.partition("=")
        if equals and option in OUTPUT_OPTIONS:
            argument = f"{option}={Path(value).absolute()}"
        elif index and arguments[index - 1] in OUTPUT_OPTIONS:
            argument = str(Path(argument).absolute())
        absolute.append(argument)
    return absolute


def command(tree: Path, work: Path, arguments: list[str]) -> list[str]:
    """The pytest command run from ``work`` (artifacts and logs go there; nothing is written
    into ``tree``): the test files, folders and node ids of ``tree`` that ``arguments`` name,
    else the suite's default simulation selection, ``test/integration``."""
    in_tree = [_in_tree(tree, argument) for argument in arguments]
    default = [] if any(in_tree) else [str(tree / "test" / "integration")]
    arguments = [path or argument for path, argument in zip(in_tree, arguments, strict=True)]
    arguments = _absolute_outputs(arguments)
    return [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "asickernels.simulate.nki.pytest_plugin",
        "-p",
        "nkilib_suite",
        "-p",
        "no:cacheprovider",
        *default,
        "--test-mode",
        "simulation",
        "--output-directory",
        str(work / "output"),
        "-o",
        f"artifacts_dir={work / 'artifacts'}",
        "--force-local-cleanup",  # each case's dumped inputs and outputs (up to a GB)
        *arguments,
    ]


def main(arguments: list[str]) -> int:
    """Runs the suite (``arguments``: pytest's, and ``--nkilib-results PATH`` for the results
    page), then each case that ran out of memory in its worker again alone; returns pytest's
    exit status, 1 where a case rerun still fails."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--nkilib-results", type=Path)
    parser.add_argument("--nkilib-tree", type=Path)
    options, pytest_arguments = parser.parse_known_args(arguments)
    if options.nkilib_tree is not None:
        tree = options.nkilib_tree.resolve()
        if not (tree / "test" / "conftest.py").is_file():
            print(
                f"error: {options.nkilib_tree} is not an nki-library checkout (no test/conftest.py)"
            )
            return int(pytest.ExitCode.USAGE_ERROR)
    else:
        found = vendor_tree()
        if found is None:
            print(f"skipped: {FOLDER} is in none of {[str(t) for t in TREES]}")
            return 0
        tree = found
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="nkilib-suite-") as folder:
        work = Path(folder)
        environment = {
            **os.environ,
            # the simulator, this plugin, and the suite's own import root (nkilib_src)
            "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE), str(tree / "src")]),
            # compiled modules (pytest's rewritten tests too) go here, not into the tree
            "PYTHONPYCACHEPREFIX": str(work / "pycache"),
            # One BLAS/OpenMP thread per process, before numpy loads (the suite's conftest
            # asks for it in xdist workers only, after numpy has started its threads):
            # OpenBLAS's threads spin on a busy machine, a 128x128x512 matmul taking 50x
            # the CPU time of one thread.
            **dict.fromkeys(("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"), "1"),
            # The seed of the sweeps' random parameters, as the suite's conftest gives every
            # xdist worker (test/conftest.py:26-28, 829-843): a case run again alone, without
            # xdist, is then the same case.
            "NEURON_PYTHONHASHSEED": os.environ.get("NEURON_PYTHONHASHSEED", "0"),
        }
        environment.pop("PYTHONDONTWRITEBYTECODE", None)

        def run(pytest_arguments: list[str], outcomes: Path) -> tuple[int, dict[str, Any]]:
            status = subprocess.call(
                [*command(tree, work, pytest_arguments), "--nkilib-outcomes", str(outcomes)],
                cwd=work,
                env=environment,
            )
            return status, json.loads(outcomes.read_text()) if outcomes.is_file() else {}

        status, results = run(pytest_arguments, work / "outcomes.json")
        cases = results.get("cases", {})
        rerun = results.get("out_of_memory", [])
        lost = []  # not collected again: the first outcome stands
        for index, nodeid in enumerate(rerun):
            # The same collection as the first run (the sweeps draw their parameters while
            # the test files import, so another selection would draw other cases), one case.
            again = [*pytest_arguments, "-n", "0", "--nkilib-only", nodeid]
            _, alone = run(again, work / f"rerun{index}.json")
            if nodeid in alone.get("cases", {}):
                cases[nodeid] = alone["cases"][nodeid]
            else:
                lost.append(nodeid)
        if rerun and status == pytest.ExitCode.TESTS_FAILED:  # not an interrupted run
            failing = any(
                outcome in ("error", "failed", "xpassed") for outcome, _ in cases.values()
            )
            status = int(failing)
    if options.nkilib_results is not None and cases:
        command_line = shlex.join(["python", "tests/simulate/nki/nkilib_suite.py", *arguments])
        run_line = (
            f"Written by `{command_line}` ({time.strftime('%Y-%m-%d')}, asickernels "
            f"{_commit()}, {(time.monotonic() - started) / 60:.0f} min wall on "
            f"{os.cpu_count()} cores, load average {os.getloadavg()[1]:.1f}): "
            f"{_tree_name(tree)}'s `test/integration` in `--test-mode simulation`, "
            f"every {results['every']}. case of each test function"
            + (
                f", starting at its case {results['offset']} (the first is 0)."
                if results["offset"]
                else "."
            )
        )
        if rerun:
            passed = sum(cases[n][0] == "passed" for n in rerun)
            run_line += (
                f" {len(rerun)} cases ran out of memory in their worker (each worker's share of "
                f"the memory, less what the cases before it left reserved) and ran again, each "
                f"alone in a fresh process with the whole share: {passed} of them passed then"
                + (
                    "; not collected again (their first outcome stands): "
                    + ", ".join(f"`{nodeid}`" for nodeid in lost)
                    + "."
                    if lost
                    else "."
                )
            )
        page = results_markdown(cases, run_line, snapshot=_is_snapshot(tree))
        options.nkilib_results.write_text(page)
        print(f"results: {options.nkilib_results}")
    return status


# What a case's report says when it ran out of memory: numpy's and torch's allocation failures
# (also where the suite wraps them in its own exceptions, or a negative test's assertion
# follows them), and a thread whose stack the address-space cap left no room for.
_OUT_OF_MEMORY = re.compile(
    r"MemoryError|Unable to allocate|can't allocate memory|Cannot allocate memory"
    r"|can't start new thread"
)


def out_of_memory(outcome: str, report: str) -> bool:
    """Whether a case failed for want of memory: its whole ``report`` (the traceback and
    every exception in it) matches :data:`_OUT_OF_MEMORY`."""
    return outcome in ("error", "failed") and _OUT_OF_MEMORY.search(report) is not None


# Modules the d2ad3a5 snapshot's test framework imports but does not contain, with the names
# imported from each; both serve device runs only. test/utils/core_lock_client.py imports
# LockResult and LockStatus from test/utils/scripts/remote_lock_scripts.py (remote core
# locking for --target-host; the public repository adds the file after d2ad3a5), and
# test/utils/test_orchestrator.py imports analyze_trace from test/utils/perf_analysis_private.py
# (--enable-perf-analysis on device profiles; never published).
SNAPSHOT_GAPS = {
    "test.utils.scripts.remote_lock_scripts": ("LockResult", "LockStatus"),
    "test.utils.perf_analysis_private": ("analyze_trace",),
}
_GAP_PACKAGES = {"test.utils.scripts"}


class _AbsentFromSnapshot:
    """Stands for a name of a missing module: importable, unusable."""

    def __init__(self, qualified_name: str) -> None:
        self.qualified_name = qualified_name

    def _refuse(self) -> RuntimeError:
        return RuntimeError(
            f"{self.qualified_name} is missing from aws-neuron/nki-library@d2ad3a5; it serves "
            "device runs only (--target-host, --enable-perf-analysis)"
        )

    def __getattr__(self, attribute: str) -> Any:
        raise self._refuse()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse()


class _SnapshotGapFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Provides the :data:`SNAPSHOT_GAPS` modules where the tree lacks them (it sits last on
    ``sys.meta_path``: a tree that has the real file wins)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in SNAPSHOT_GAPS and fullname not in _GAP_PACKAGES:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=fullname in _GAP_PACKAGES)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name, "absent from aws-neuron/nki-library@d2ad3a5")
        for name in SNAPSHOT_GAPS.get(spec.name, ()):
            setattr(module, name, _AbsentFromSnapshot(f"{spec.name}.{name}"))
        if spec.name in _GAP_PACKAGES:
            module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


# Test files (under test/integration/nkilib/) the d2ad3a5 snapshot cannot import, and why.
_MLP_SYNTAX = (
    "src/nkilib_src/nkilib/core/mlp/mlp.py cannot be imported: the tail of mlp()'s docstring is "
    "repeated after its closing quotes, an IndentationError at line 203"
)
UNIMPORTABLE = {
    "core/mlp/test_mlp_cte.py": _MLP_SYNTAX,
    "core/mlp/test_mlp_tkg.py": _MLP_SYNTAX,
    "experimental/transformer/test_transformer_tkg.py": (
        f"its kernel experimental/transformer/transformer_tkg.py imports mlp (line 23); {_MLP_SYNTAX}"
    ),
    "core/qkv/test_qkv_tkg.py": (
        "line 929 marks a test with Platforms.TRN1, but the file never imports Platforms: NameError"
    ),
    "experimental/subkernels/test_topk_reduce.py": (
        "imports nkilib_src.nkilib.experimental.subkernels.topk_reduce, which the snapshot "
        "does not contain"
    ),
}
# Cases known to fail, and why: strict xfails. A key is a case's node id from
# test/integration/nkilib/, or a test function's (every case of it).
_GEN_MASK = (
    "vendor bug in every test mode: generate_gen_mask_inputs (test_gen_mask_tkg.py:363) passes "
    "the output as 'mask_out_hbm.must_alias_input', and _run_test's output descriptor "
    "(line 422) reads kernel_input['mask_out_hbm']: KeyError before the kernel runs"
)
KNOWN_FAILURES: dict[str, str] = {
    f"core/attention/test_gen_mask_tkg.py::TestGenMaskTkg::{function}": _GEN_MASK
    for function in (
        "test_flat_kv_strided_mask_generation",
        "test_flat_kv_nonstrided_mask_generation",
        "test_block_kv_mask_generation",
        "test_swa_mask_generation",
        "test_flat_kv_with_active_mask",
        "test_block_kv_with_active_mask",
    )
}
# NeuronCore-v4 only (trn3): these tests check nisa.quantize_mx's scales as a whole tile.
_UNWRITTEN_MX_SCALES = (
    "vendor test compares memory its kernel never writes: nisa.quantize_mx writes 4 scale rows "
    "of each 32-partition quadrant, and the golden expects zeros in the other 28 "
    "(test_quantize_to_mx.py:60-81, test_rmsnorm_mx_quantize_tkg.py:80-92, 130-132, "
    "test_mxfp_load.py:46-47, 76), which "
    "hold the sentinel 4 of unwritten integer memory, as in the SDK's simulator "
    "(guides/nki_simulator.rst@81ce03a, 'Uninitialized Memory Detection'); with zeros there, "
    "most cases still fail on the OCP scale the golden computes, which NKI 0.5 replaced by one "
    "two times larger (release-notes/components/nki.rst@81ce03a, NKI 0.5.0, Improvements)"
)
KNOWN_FAILURES.update(
    {
        "core/utils/test_quantize_to_mx.py::TestQuantizeToMxHardware::test_quantize_mx_hw": (
            _UNWRITTEN_MX_SCALES
        ),
        "experimental/mxfp_subkernels/test_mxfp_load.py::TestMxfpLoadPerformance::"
        "test_mxfp_load_performance": _UNWRITTEN_MX_SCALES,
        **{
            "core/subkernels/test_rmsnorm_mx_quantize_tkg.py::TestRmsNormQuantizeMxTKGKernel::"
            + function: _UNWRITTEN_MX_SCALES
            for function in (
                "test_rmsnorm_mx_quantize_tkg",
                "test_rmsnorm_mx_quantize_tkg_residual",
            )
        },
    }
)
# Node ids are relative to the suite's rootdir, test/ (its pytest.ini): integration/nkilib/...
_ROOT = "integration/nkilib/"


def _relative(path: Any) -> str | None:
    """A path's or node id's part after integration/nkilib/ (None: not under it)."""
    text = str(path).replace(os.sep, "/")
    return text.split(_ROOT, 1)[1] if _ROOT in text else None


def _is_snapshot(tree: Path) -> bool:
    """Whether ``tree`` is the d2ad3a5 snapshot, whose gaps and known failures this module
    lists (another checkout, ``--nkilib-tree``, runs with none of them)."""
    return tree.name == FOLDER


def _tree_name(tree: Path) -> str:
    return "aws-neuron/nki-library@d2ad3a5" if _is_snapshot(tree) else f"the nki-library at {tree}"


def pytest_ignore_collect(collection_path: Path, config: Any) -> bool | None:
    if not _is_snapshot(config.rootpath.parent):
        return None
    return True if _relative(collection_path) in UNIMPORTABLE else None


def pytest_addoption(parser: Any) -> None:
    parser.addoption(
        "--nkilib-every",
        type=int,
        default=1,
        help="run every N-th case the suite selects in each test function (its first included)",
    )
    parser.addoption(
        "--nkilib-offset",
        type=int,
        default=0,
        help="with --nkilib-every N: start at the K-th case of each function (0 <= K < N), a "
        "sample disjoint from another offset's",
    )
    parser.addoption(
        "--nkilib-only",
        default=None,
        help="run only the case of this node id, of all those collected (the runner's reruns)",
    )
    parser.addoption(
        "--nkilib-outcomes",
        type=Path,
        default=None,
        help="write each case's outcome and error message (JSON; the runner reads it)",
    )


# Why a case marked with another test mode is skipped.
OTHER_MODE = (
    "marked @pytest.mark.{mode}: the suite runs it in that mode whatever --test-mode says "
    "(test/conftest.py, fixture trace_mode: markers override the session's mode), i.e. "
    "through the Neuron compiler (test/utils/kernel_tracer.py imports "
    "nki.compiler.frontend.ParserFrontend), which simulation does not have"
)


def _other_mode(item: Any) -> str | None:
    """The test mode other than simulation that a case's marker names, if any (the first,
    as the suite's trace_mode fixture takes it)."""
    from test.utils.common_dataclasses import TraceMode  # the suite's framework

    return next(
        (
            mode.value
            for mode in TraceMode
            if mode is not TraceMode.Simulator and item.get_closest_marker(mode.value)
        ),
        None,
    )


@pytest.hookimpl(trylast=True)  # after the suite's conftest marks the cases it skips
def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    every = config.getoption("nkilib_every")
    offset = config.getoption("nkilib_offset")
    if not 0 <= offset < every:
        raise pytest.UsageError(f"--nkilib-offset {offset} must lie in [0, {every})")
    only = config.getoption("nkilib_only")
    snapshot = _is_snapshot(config.rootpath.parent)
    seen: dict[str, int] = {}
    kept, dropped = [], []
    for item in items:
        if only is not None and item.nodeid != only:
            dropped.append(item)
            continue
        mode = _other_mode(item)
        if mode is not None:
            item.add_marker(pytest.mark.skip(reason=OTHER_MODE.format(mode=mode)))
        skipped = any(mark.name == "skip" for mark in item.iter_markers())
        if every > 1 and not skipped and only is None:
            function = item.nodeid.split("[")[0]
            seen[function] = seen.get(function, -1) + 1
            if seen[function] % every != offset:
                dropped.append(item)
                continue
        kept.append(item)
        reason = _known_failure(item.nodeid) if snapshot else None
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


# A case's outcome from its reports: the first of these that any phase had.
OUTCOMES = ("error", "failed", "xpassed", "xfailed", "passed", "skipped")
_outcomes: dict[str, str] = {}
_messages: dict[str, str] = {}
_out_of_memory: set[str] = set()


def _outcome(report: Any) -> str:
    if report.when != "call" and report.failed:
        return "error"
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    return str(report.outcome)


def pytest_runtest_logreport(report: Any) -> None:
    """Each phase of each case (in xdist's controller too: workers send their reports); a
    setup or teardown that passed says nothing of the case (a skipped case has both)."""
    if report.when != "call" and report.passed:
        return
    outcome = _outcome(report)
    previous = _outcomes.get(report.nodeid, "skipped")
    _outcomes[report.nodeid] = min(outcome, previous, key=OUTCOMES.index)
    if outcome in ("error", "failed") and report.nodeid not in _messages:
        crash = getattr(report.longrepr, "reprcrash", None)
        _messages[report.nodeid] = crash.message if crash else str(report.longrepr)
    if out_of_memory(outcome, str(report.longrepr)):
        _out_of_memory.add(report.nodeid)


def pytest_collectreport(report: Any) -> None:
    if report.failed:  # a test file that did not import: an error of its own
        _outcomes[report.nodeid] = "error"
        _messages[report.nodeid] = str(report.longrepr).strip().splitlines()[-1]


def results_markdown(cases: dict[str, tuple[str, str]], run: str, snapshot: bool = True) -> str:
    """The results page of ``cases`` (node id: outcome, error message): totals, the outcome
    per test file, and each case that did not pass (expected failures by reason, failures
    grouped by the first line of their error); ``snapshot``: the cases are the d2ad3a5
    snapshot's, so the page lists the test files it cannot import."""
    outcomes = {nodeid: outcome for nodeid, (outcome, _) in cases.items()}
    messages = {nodeid: message for nodeid, (_, message) in cases.items() if message}
    files: dict[str, dict[str, int]] = {}
    for nodeid, outcome in outcomes.items():
        file = (_relative(nodeid) or nodeid).split("::")[0]
        counts = files.setdefault(file, dict.fromkeys(OUTCOMES, 0))
        counts[outcome] += 1
    total = {outcome: sum(c[outcome] for c in files.values()) for outcome in OUTCOMES}
    ran = sum(total.values()) - total["skipped"]
    rate = f"{100 * total['passed'] / ran:.1f}%" if ran else "-"
    lines = [
        "# nki-library's simulation suite on asickernels' NKI simulator",
        "",
        run,
        "",
        f"**{total['passed']} of {ran} cases passed ({rate})**; "
        + ", ".join(f"{total[o]} {o}" for o in OUTCOMES if o != "passed")
        + " (skipped: the large shapes the suite's conftest skips in simulation, and the "
        + "cases marked to run in a compiler mode instead).",
        "",
        "| test file | " + " | ".join(OUTCOMES) + " |",
        "| --- |" + " ---: |" * len(OUTCOMES),
    ]
    for file in sorted(files):
        lines.append(f"| {file} | " + " | ".join(str(files[file][o]) for o in OUTCOMES) + " |")
    if snapshot:
        lines += ["", "## Test files not collected", ""]
        lines += [f"- `{path}`: {reason}" for path, reason in UNIMPORTABLE.items()]
    lines += ["", "## Expected failures (strict xfails)", ""]
    xfailed = [n for n, o in outcomes.items() if o == "xfailed"]
    for reason in dict.fromkeys(_known_failure(n) for n in xfailed):
        cases = [n for n in xfailed if _known_failure(n) == reason]
        lines.append(f"- {len(cases)} cases: {reason}")
    lines += ["", "## Failures and errors, by error", ""]
    failing = [n for n, o in outcomes.items() if o in ("error", "failed", "xpassed")]
    by_message: dict[str, list[str]] = {}
    for nodeid in failing:
        message = messages.get(nodeid, "passed unexpectedly").strip().splitlines() or [""]
        by_message.setdefault(message[0][:300], []).append(nodeid)
    for message, cases in sorted(by_message.items(), key=lambda item: -len(item[1])):
        lines.append(f"- {len(cases)} x `{message}`")
        lines += [f"  - `{_relative(case) or case}`" for case in sorted(cases)]
    return "\n".join(lines) + "\n"


# test_attn_blk_model's cases with QuantizationType.ROW (its value, 2), read from the case id:
# AttnBlkTestConfig.test_id() joins the config's fields with "-" (test_attention_block_tkg_utils.py
# :76-87), quantization_type the 20th (index 19; no field before it holds a "-").
_ATTENTION_BLOCK_MODEL = (
    "experimental/transformer/test_attention_block_tkg.py::TestRangeAttnBlk::test_attn_blk_model["
)
_QUANTIZATION_FIELD, _ROW = 19, "2"
_ROW_QUANTIZATION = (
    "vendor bug in every test mode: for any quantization but NONE, _generate_inputs "
    "(test_attention_block_tkg.py:557-558) makes per-tensor [128, 3] QKV weight scales, which "
    "the ROW-quantization reference multiplies into the [B, S, heads * d_head] projection "
    "(qkv_tkg_torch.py:166): RuntimeError computing the golden"
)
_ILL_CONDITIONED = (
    "vendor test ill-conditioned in every test mode: with the fp8 KV cache, attention runs on "
    "the unscaled fp8 keys (cache drawn with std 60, test_attention_block_tkg.py:596, 612), so "
    "logits reach 130-270 and the softmax is an argmax whose top two differ by under 1; the "
    "golden leaves out the kernel's fp8 casts of K/V and of the STATIC-quantized QKV input "
    "(attention_block_tkg_torch.py:520-547 against attention_block_tkg.py:1734-1735; "
    "qkv_tkg_torch.py:148-153 against qkv_tkg.py:803, 850-866), and with those casts added the "
    "golden matches itself at cosine 0.979-0.991 on the 4 ranks, below the test's 0.99; with "
    "the cache and its scales divided by 64 the simulator matches the golden at >= 0.9995"
)
KNOWN_FAILURES[
    _ATTENTION_BLOCK_MODEL + "MODEL_WIP_GENERALITY_8-4-128-7168-None-131072-131072-1-32-True-"
    "False-True-False-False-True-True-False-False-bfloat16-1-2-False-True-False-False-False-None-"
    "True-True-default-4-1-False]"
] = _ILL_CONDITIONED
# The same configuration at batch 32, 16 heads, 1024 tokens, KVDP 8 (the every-64 sample from
# offset 16): cosine 0.985-0.991 on the 8 ranks, the caches exact, allclose passing.
KNOWN_FAILURES[
    _ATTENTION_BLOCK_MODEL + "MODEL_WIP_GENERALITY_32-16-128-7168-None-1024-1024-1-32-True-"
    "False-True-False-False-True-True-False-False-bfloat16-1-2-False-True-False-False-False-None-"
    "True-True-default-8-1-False]"
] = _ILL_CONDITIONED

_MOE_BLOCK_MODEL = (
    "core/moe_block/test_moe_block_tkg.py::TestMoEBlockTkgKernel::test_moe_block_kernel_model["
)
# The end of an fp8-weight model case's id, from its 256 global experts on (le-: local experts).
_FP8_ID_TAIL = (
    "_ge-256_le-{}_tk-8_rf-0_af-0_sm-1_wd-[('float8_e4m3fn_x4', '<u4')]_id-bfloat16_se-1_bi-0_"
    "cl-0_ra-1_np-1_sr-0_rd-bfloat16]"
)
# NeuronCore-v4 only (trn3, MX weights). The router's inputs are seeded; the MX expert weights are
# drawn before the test seeds numpy (test_moe_block_tkg.py:282 against 284), so they differ from
# run to run, and the failing row's size with them: never under the test's 5%.
_ROUTING_TIE = (
    "vendor test ill-conditioned in every test mode: token {token}'s 8th and 9th router logits "
    "differ by {gap} in the golden's float32 (experts {kept}: {kept_logit}, {other}: "
    "{other_logit}), well under one bf16 step there (0.002); the kernel computes the router "
    "in bf16 (its logits differ from the golden's by up to 0.004) and picks expert {picked}, so "
    "the token {effect} this rank's local expert {local} and its output row is all wrong; "
    "without that token the output {rest}"
)
_ROUTING_TIES = {  # (batch, intermediate size, local experts): what the tie does
    (128, 512, 16): {
        "token": 55, "gap": "2.6e-4", "kept": 179, "kept_logit": 0.49530, "other": 103,
        "other_logit": 0.49503, "picked": 103, "effect": "goes to", "local": 103,
        "rest": "is within 4.8% of its range, under the test's 5% (one run's weights)",
    },
    (64, 2048, 2): {
        "token": 18, "gap": "1.2e-4", "kept": 204, "kept_logit": 0.49423, "other": 47,
        "other_logit": 0.49411, "picked": 47, "effect": "misses", "local": 204,
        "rest": "differs by up to 5.6% of its range in one run (one element, at 5.4 standard "
        "deviations of the difference): the MX weights' draw decides the rest",
    },
}  # fmt: skip
KNOWN_FAILURES.update(
    {
        _MOE_BLOCK_MODEL
        + f"MODEL_WIP_GENERALITY_ln-2_ae-1_ba-{batch}_sq-1_hi-7168_ha-None_im-{size}"
        + _FP8_ID_TAIL.format(experts): _ROUTING_TIE.format(**tie)
        for (batch, size, experts), tie in _ROUTING_TIES.items()
    }
)

# NeuronCore-v4 only (trn3, MX weights), where the intermediate size I is no multiple of 512.
_UNWRITTEN_INTERMEDIATE = (
    "vendor kernel computes on memory it never writes: the down projection's nc_matmul_mx "
    "contracts over all 128 partitions of the last 512-wide intermediate tile ({where}), of "
    "which the kernel wrote {written} (I {size}), counting on the weights' "
    "zero padding; unwritten memory holds NaN here, as in the SDK's simulator "
    "(guides/nki_simulator.rst@81ce03a, 'Uninitialized Memory Detection'), and 0 x NaN is NaN"
)
_MOE_BLOCK_UNIT_I384 = (
    "core/moe_block/test_moe_block_tkg.py::TestMoEBlockTkgKernel::test_moe_block_kernel_unit["
    "ln-2_ae-0_ba-1_sq-1_hi-3072_ha-None_im-384_ge-128_le-128_tk-4_rf-1_af-3_sm-1_wd-[{}]_"
    "id-float16_se-0_bi-1_cl-1_ra-0_np-0_sr-0_rd-float16]"
)
_FP4_ALL_EXPERT = (
    "MODEL_WIP_GENERALITY_ln-2_ae-1_ba-{}_sq-4_hi-3072_ha-2880_im-{}_ge-128_le-{}_tk-4_rf-1_af-3_"
    "sm-1_wd-[('float4_e2m1fn_x4', '<u2')]_id-bfloat16_se-0_bi-1_cl-1_ra-0_np-0_sr-0_rd-bfloat16]"
)
KNOWN_FAILURES.update(
    {
        "core/moe/moe_cte/test_moe_bwmm_mx_cte.py::TestMoeBwmmMxCteKernel::"
        "test_moe_bwmm_mx_cte_unit[2-3072-10240-384-128-256-4-ActFnType.Swish-"
        "ExpertAffinityScaleMode.POST_SCALE-dtype0-weight_dtype0-1-True-False-7.0-None-7.0--7.0-"
        "False-None]": _UNWRITTEN_INTERMEDIATE.format(
            written=96, size=384, where="bwmm_shard_on_block_mx.py:1170-1290"
        ),
        **{
            _MOE_BLOCK_UNIT_I384.format(weights): _UNWRITTEN_INTERMEDIATE.format(
                written=96, size=384, where="down_projection_mx_shard_H.py:181-188"
            )
            for weights in ("('float4_e2m1fn_x4', '<u2')", "('float8_e4m3fn_x4', '<u4')")
        },
        **{
            _MOE_BLOCK_MODEL + _FP4_ALL_EXPERT.format(batch, size, experts): (
                _UNWRITTEN_INTERMEDIATE.format(
                    written=written, size=size, where="down_projection_mx.py:349"
                )
            )
            for batch, size, experts, written in (
                (128, 1440, 2, 104),
                (128, 1440, 4, 104),
                (512, 360, 16, 88),
            )
        },
    }
)

_NO_GATE_UP_BIAS = (
    "vendor bug in every test mode: with no bias (bi-0) the test passes gate_up_bias None, and "
    "the selective-expert MX projection reads gate_up_bias.dtype unconditionally "
    "(gate_up_projection_mx_shard_H.py:325): AttributeError"
)
KNOWN_FAILURES.update(
    {
        _MOE_BLOCK_MODEL
        + f"{kind}_ln-2_ae-0_ba-1_sq-{tokens}_hi-7168_ha-None_im-{size}"
        + _FP8_ID_TAIL.format(256): _NO_GATE_UP_BIAS
        for kind, tokens, size in (
            ("MODEL_WIP_GENERALITY", 4, 256),
            ("MODEL_WIP_OPTIMAL", 1, 128),
        )
    }
)
KNOWN_FAILURES[
    _MOE_BLOCK_MODEL + "MODEL_WIP_GENERALITY_ln-2_ae-0_ba-16_sq-1_hi-3072_ha-2880_im-360_ge-128_"
    "le-128_tk-4_rf-1_af-3_sm-1_wd-[('float4_e2m1fn_x4', '<u2')]_id-bfloat16_se-0_bi-1_cl-1_"
    "ra-0_np-0_sr-0_rd-bfloat16]"
] = (
    "vendor test asks what its kernel refuses, in every test mode: the MX projection's "
    "kernel_assert needs the last 512-wide intermediate tile's size divisible by 32 "
    "(projection_mx_constants.py:111), and this configuration's is 360"
)


# NeuronCore-v4 only (trn3): test_moe_tkg.py's all-expert cases with MX weights.
_MOE_TKG = "core/moe/moe_tkg/test_moe_tkg.py::TestMoeTkgKernel::"
_MX_ALL_EXPERT = "_all_expert-1_quant_dtype-[('float"
_PLAIN_MX_WEIGHTS = (
    "vendor bug: the all-expert MX kernel reads .base_tensor of its weights "
    "(gate_up_projection_mx.py:354), an attribute of nki-library's TensorView, which itself "
    "reads it only of a TensorView (core/utils/tensor_view.py:100-111); this test passes plain "
    "tensors (test_moe_tkg_utils.py:213-216), where the MoE block test wraps the same weights in "
    "TensorView (test_moe_block_tkg.py:151-152), and the NKI API reference (SDK 81ce03a) lists "
    "no NkiTensor.base_tensor: AttributeError"
)


def _known_failure(nodeid: str) -> str | None:
    case = _relative(nodeid) or ""
    if case.startswith(_MOE_TKG) and _MX_ALL_EXPERT in case:
        return _PLAIN_MX_WEIGHTS
    if case.startswith(_ATTENTION_BLOCK_MODEL):
        fields = case[len(_ATTENTION_BLOCK_MODEL) :].split("-")
        if len(fields) > _QUANTIZATION_FIELD and fields[_QUANTIZATION_FIELD] == _ROW:
            return _ROW_QUANTIZATION
    return KNOWN_FAILURES.get(case, KNOWN_FAILURES.get(case.split("[")[0]))


def pytest_terminal_summary(terminalreporter: Any, config: Any) -> None:
    if _is_snapshot(config.rootpath.parent):
        terminalreporter.section("nki-library test files not collected (d2ad3a5)")
        for path, reason in UNIMPORTABLE.items():
            terminalreporter.write_line(f"{path}: {reason}")
    path = config.getoption("nkilib_outcomes")
    if path is not None and not hasattr(config, "workerinput"):
        cases = {n: (outcome, _messages.get(n, "")) for n, outcome in _outcomes.items()}
        results = {
            "rootdir": str(config.rootpath),
            "every": config.getoption("nkilib_every"),
            "offset": config.getoption("nkilib_offset"),
            "cases": cases,
            "out_of_memory": sorted(_out_of_memory),
        }
        path.write_text(json.dumps(results))


def _git(*arguments: str) -> str:
    """``git`` in the checkout: its stripped output."""
    command = ["git", "-C", str(REPO), *arguments]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


def _commit() -> str:
    """The checkout's commit (with ``+`` when it has changes), or ``unknown``."""
    try:
        head = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+" if dirty else "")


def pytest_load_initial_conftests(early_config: Any, parser: Any, args: Any) -> None:
    """Before the suite's conftest imports core_lock_client."""
    if not any(isinstance(finder, _SnapshotGapFinder) for finder in sys.meta_path):
        sys.meta_path.append(_SnapshotGapFinder())


# The share of the machine's memory the processes running cases may take together.
MEMORY_SHARE = 0.75


def limit_memory(workers: int) -> int:
    """Caps this process's address space at its share (one of ``workers``) of
    :data:`MEMORY_SHARE` of physical memory, and returns the cap in bytes. A case needing
    more (the suite's largest shapes take 13-16 GB) then fails with a MemoryError that
    names the allocation, where it would have had the kernel's OOM killer end its worker,
    or a neighbour."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cap = int(physical * MEMORY_SHARE / max(workers, 1))
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    return cap


def pytest_configure(config: Any) -> None:
    """Limits each process's memory (:func:`limit_memory`; an xdist worker learns how many
    run cases from ``PYTEST_XDIST_WORKER_COUNT``). Repairs the one d2ad3a5 framework bug
    that fails every simulated case: ``Orchestrator`` sets ``_compiled_kernel`` only in its
    compile step, which simulation mode skips
    (test/utils/test_orchestrator.py, ``_run_compilation``), and then reads it
    (``_rename_neff_outputs_to_python_names``): AttributeError. The public repository's next
    version of that file (e9ef98f) initialises it to None in ``__init__``; so does this.
    Also gives simulation mode the multi-rank launch it lacks (:func:`_simulate_ranks`)."""
    limit_memory(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    orchestrator = sys.modules.get("test.utils.test_orchestrator")
    if orchestrator is None:
        return
    if not hasattr(orchestrator.Orchestrator, "_compiled_kernel"):
        orchestrator.Orchestrator._compiled_kernel = None
    single_rank = orchestrator.Orchestrator._run_simulator_inference
    if getattr(single_rank, "__wrapped__", None) is None:
        orchestrator.Orchestrator._run_simulator_inference = _simulate_ranks(single_rank)


def _simulate_ranks(single_rank: Any) -> Any:
    """``Orchestrator._run_simulator_inference`` for cases with ``collective_ranks`` > 1.

    d2ad3a5's simulation mode launches one rank: test/utils/simulation_setup.py's
    ``simulate_kernel`` calls ``kernel_input.items()`` and ``nki.cpu_simulate(kernel)[lnc]``,
    so a ``PerRankLazyInputGenerator`` input fails (it has no ``items``) and a shared-input
    collective names ranks the launch lacks. On devices the suite runs ``collective_ranks``
    ranks, rank ``r`` on ``kernel_input.for_rank(r)`` (``__dump_per_rank_inputs__``), and
    validates each rank's outputs from ``output_worker_{r}/`` (test/utils/output_validator.py,
    lines 89-114; rank 0 only for a golden that is not per rank). This runs those ranks
    (:func:`rank_outputs`) and writes the outputs there; single-rank cases are left to the
    suite's own path."""
    from test.utils.common_dataclasses import (  # the suite's framework: importable here
        INF_ARTIFACT_DIR_NAME,
        PerRankLazyInputGenerator,
        normalize_golden_output,
    )
    from test.utils.exceptions import InferenceException

    def run(orchestrator: Any, kernel_under_test: Any) -> str | None:
        ranks = kernel_under_test.inference_args.collective_ranks
        if ranks <= 1:
            return single_rank(orchestrator, kernel_under_test)
        inputs = kernel_under_test.kernel_input or {}
        per_rank = [
            inputs.for_rank(rank) if isinstance(inputs, PerRankLazyInputGenerator) else inputs
            for rank in range(ranks)
        ]
        golden = kernel_under_test.validation_args.golden_output
        compiler = kernel_under_test.compiler_input
        try:
            outputs = rank_outputs(
                kernel_under_test.kernel_func,
                compiler.logical_nc_config,
                compiler.platform_target.get_nc_gen(),
                per_rank,
                [normalize_golden_output(golden, rank) for rank in range(ranks)],
            )
        except Exception as error:  # as the suite's single-rank path reports it
            raise InferenceException(str(error)) from error
        path = os.path.join(
            orchestrator.fs_config.artifacts_output_directory_path, INF_ARTIFACT_DIR_NAME
        )
        for rank, tensors in enumerate(outputs):
            orchestrator.__dump_tensors__(os.path.join(path, f"output_worker_{rank}"), tensors, str)
        return path

    run.__wrapped__ = single_rank  # type: ignore[attr-defined]
    return run


def rank_outputs(
    kernel: Any,
    lnc: int,
    generation: str,
    per_rank_inputs: list[dict[str, Any]],
    golden: list[dict[str, Any]],
) -> list[dict[str, np.ndarray]]:
    """Runs ``kernel`` at LNC degree ``lnc`` on ``len(per_rank_inputs)`` ranks of the
    NeuronCore ``generation`` (``gen3``, ...) with ``nki.multi_rank_simulate``, rank ``r``
    called with the keyword arguments ``per_rank_inputs[r]`` (less the suite's
    ``.must_alias_input`` suffix, as simulation_setup.py strips it), and names rank ``r``'s
    outputs as ``golden[r]`` does, cast to its dtypes (as simulation_setup.py's
    ``run_simulator_inference`` does for one rank)."""
    from asickernels.simulate import nki
    from asickernels.simulate.nki import runtime

    kernel = kernel if isinstance(kernel, nki.Kernel) else nki.Kernel(kernel)
    with runtime.targeting(generation):
        results = nki.multi_rank_simulate(
            kernel[lnc],
            world_size=len(per_rank_inputs),
            per_rank_inputs=[
                ((), {k.removesuffix(".must_alias_input"): v for k, v in inputs.items()})
                for inputs in per_rank_inputs
            ],
        )
    outputs = []
    for rank, (result, expected) in enumerate(zip(results, golden, strict=True)):
        returned = (
            [] if result is None else result if isinstance(result, (list, tuple)) else [result]
        )
        if len(returned) != len(expected):
            raise RuntimeError(
                f"rank {rank}'s kernel returned {len(returned)} outputs but expected "
                f"{len(expected)}: {list(expected)}"
            )
        outputs.append(
            {
                name: np.asarray(output, dtype=reference.dtype)
                for (name, reference), output in zip(expected.items(), returned, strict=True)
            }
        )
    return outputs


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
