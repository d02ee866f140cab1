"""The `asickernels` command and the benchmarking harness behind it: argument errors,
plug-in commands, `info`, `check` exit codes, a tiny bench with its JSON and plot
(benchmarks/README.md rendering: tests/docs/test_benchmarks_readme.py)."""

from __future__ import annotations

import io
import json
import shlex
import sys
import types

import numpy as np
import pytest

import asickernels
from asickernels import cli
from asickernels.benchmarking import device, harness, peers, schema, workloads
from asickernels.benchmarking.progress import LOG_INTERVAL_S, Progress, render_bar
from asickernels.benchmarking.timing import Timing
from asickernels.kernels import cases, int8_matmul_cases, nms_cases, registry
from asickernels.kernels.giou import reference_giou
from asickernels.kernels.int8_matmul import reference_int8_matmul
from asickernels.kernels.nms import greedy_nms
from asickernels.kernels.registry import Availability, Backend


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_line(capsys, line, *more):
    """:func:`run` of the command ``line`` as a shell splits it, then the words ``more``."""
    return run(capsys, *shlex.split(line), *more)


# -- argument errors and plug-ins ----------------------------------------------------------


def test_help_lists_every_command_including_plugins(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for command in ("info", "check", "bench", "run", *cli.PLUGINS):
        assert command in out


@pytest.mark.parametrize("command", ["info", "check", "bench", "run", *cli.PLUGINS])
def test_every_command_describes_itself_in_plain_text(capsys, monkeypatch, command):
    """`asickernels COMMAND --help`: a description for users, not a module docstring with
    reStructuredText markup, within 80 columns."""
    monkeypatch.setenv("COLUMNS", "80")  # argparse wraps to the terminal's width
    code, out, _ = run(capsys, command, "--help")
    assert code == 0
    rest = out.partition("\n\n")[2]  # after the usage lines
    description = rest.partition("options:")[0]
    assert len(description.split()) >= 15, f"{command} --help has no description"
    for markup in ("``", ":mod:", ":func:", ":data:", ":meth:", "This module"):
        assert markup not in out, f"{command} --help shows {markup!r}"
    assert max(map(len, out.splitlines())) <= 80


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "required"),
        (["bench", "--ops", "giou,nope"], "unknown op nope"),
        (["check", "--backends", "nonsense"], "unknown backend nonsense"),
        (["bench", "--size", "nms=abc"], "nms: expected N"),
        (["bench", "--size", "giou=0x3"], "giou: expected P or AxB"),
        (["bench", "--size", "int8_matmul=8x999999x8"], "K <="),
        (["bench", "--size", "nothing=3"], "expected OP=SIZE"),
        (["bench", "--repeats", "0"], "must be >= 1"),
        (["run", "--budget", "-1"], "must be > 0"),
        (["bench", "--ops", "giou", "--size", "nms=64"], "--ops leaves out"),
        (["check", "--ops", "nms", "--backends", "torchvision"], "unknown backend torchvision"),
        (["check", "--backends", "reference"], "unknown backend reference"),
        (["check", "--ops", "roi_pool", "--backends", "gpsimd"], "none of them implements"),
        (["check", "--json", "/nonexistent/x.json"], "--json /nonexistent/x.json: no folder"),
        (["bench", "--plot", "/nonexistent/p.png"], "--plot /nonexistent/p.png: no folder"),
    ],
)
def test_argument_errors_exit_2_with_a_message(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert message in err


def test_plot_without_matplotlib_is_refused_before_anything_runs(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # find_spec("matplotlib") is None
    monkeypatch.setattr(harness, "bench", None)  # benchmarking would raise
    code, _, err = run(capsys, "bench", "--ops", "giou", "--plot", str(tmp_path / "p.png"))
    assert code == 2 and "--plot draws with matplotlib" in err


def test_missing_plugin_module_exits_2_and_stays_listed(capsys, monkeypatch):
    monkeypatch.setitem(cli.PLUGINS, "ghost", ("asickernels.no_such_module", "a future command"))
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "ghost" in out and "a future command" in out
    code, _, err = run(capsys, "ghost", "--flag")
    assert code == 2
    assert "asickernels.no_such_module does not import" in err


def test_plugin_is_imported_only_when_used_and_runs_its_handler(capsys, monkeypatch):
    module = types.ModuleType("fake_plugin")

    def register_cli(subparsers):
        parser = subparsers.add_parser("ghost", help="a test command")
        parser.add_argument("--value", type=int, required=True)
        parser.set_defaults(handler=lambda args: args.value)

    module.register_cli = register_cli
    monkeypatch.setitem(sys.modules, "fake_plugin", module)
    monkeypatch.setitem(cli.PLUGINS, "ghost", ("fake_plugin", "a test command"))
    assert run(capsys, "ghost", "--value", "7")[0] == 7
    assert run(capsys, "ghost")[0] == 2  # its own argument error

    del module.register_cli
    code, _, err = run(capsys, "ghost")
    assert code == 2 and "has no register_cli" in err


# -- info ----------------------------------------------------------------------------------


def test_info_lists_every_backend_and_peer_with_its_mode(capsys):
    code, out, _ = run(capsys, "info")
    assert code == 0
    for name in harness.implementation_names():
        status = harness.availability_of(name)
        line = next(line for line in out.splitlines() if line.startswith(name + " "))
        assert status.mode in line
    assert "cores" in out and "compile" in out


def test_info_without_libtpu_lists_the_libtpu_commands_as_unavailable(capsys, monkeypatch):
    """`compile` and `spmd-plan` need libtpu; the hint serves a wheel's user and a clone."""
    monkeypatch.setitem(sys.modules, "libtpu", None)  # `import libtpu` raises ImportError
    code, out, _ = run(capsys, "info")
    assert code == 0
    states = {line.split()[0]: line for line in out.splitlines() if line.split()[:1]}
    for command, state in cli.WITHOUT_LIBTPU.items():
        assert state in states[command] and "available" not in states[command]
    assert 'To enable them: libtpu is not installed (pip install "jax[tpu]" (in a clone:' in out
    assert 'pip install -e ".[tpu]"' in out


def test_info_is_short_and_the_full_one_adds_ops_and_the_policy(capsys):
    code, short, _ = run(capsys, "info")
    assert code == 0
    assert len(short.splitlines()) <= 40
    assert "backend=None here (cpu) runs cpu for every kernel" in short
    assert "Selection policy" not in short and "info --full" in short
    code, full, _ = run(capsys, "info", "--full")
    assert code == 0
    assert "Selection policy" in full and "TPU v5e" in full
    cpu_line = next(line for line in full.splitlines() if line.startswith("cpu "))
    assert ",".join(harness.ops_of("cpu")) in cpu_line


def test_check_prints_one_row_per_op_and_backend_as_its_help_says(capsys):
    code, out, _ = run(capsys, "check", "--help")
    assert code == 0 and "one row per op and backend" in " ".join(out.split())
    assert "peers" in out  # says where they go instead
    code, out, _ = run(capsys, "check", "--ops", "giou", "--backends", "cpu,xla", "--quiet")
    assert code == 0
    cases = workloads.WORKLOADS["giou"].check_cases(np.random.default_rng(0))
    assert len(cases) > 1
    rows = [line for line in out.splitlines() if line.startswith("giou ")]
    assert [row.split()[1] for row in rows] == ["xla", "cpu"]


def test_check_takes_every_backend_it_checks_and_no_peer():
    parse = cli.build_parser().parse_args
    checked = harness.checked_names()
    assert parse(["check", "--backends", ",".join(checked)]).backends == checked
    assert not set(checked) & set(peers.PEERS) and "reference" not in checked
    assert set(harness.implementation_names()) - set(checked) == {*peers.PEERS, "reference"}


def test_the_nki_runner_says_in_one_line_that_a_script_is_missing(capsys, tmp_path):
    from asickernels.simulate.nki.__main__ import main

    assert main([str(tmp_path / "missing.py"), "--flag"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert f"cannot open '{tmp_path / 'missing.py'}': no such file" in err


def test_the_compile_table_is_aligned_whatever_the_names():
    from asickernels.estimates.compile_gate import CompileResult, format_table

    results = [
        CompileResult("giou", "8x4", "v5e", True, 1.5, "", 2**20, None, 3 * 2**20),
        CompileResult(
            "linear_sum_assignment_vjp", "64x128x128x4", "v5p", False, 0.2, "Mosaic refused it"
        ),
    ]
    header, rule, first, second = format_table(results).splitlines()
    assert set(rule) == {"-"}
    for line in (first, second):  # each column starts under its header
        for column in ("shape", "gen", "result"):
            assert line[header.index(column) - 1] == " " and line[header.index(column)] != " "
    assert first.index("3.00 MiB") + len("3.00 MiB") == header.index("HBM") + len("HBM")
    assert "FAILED" in second and second.endswith("Mosaic refused it")


def test_the_cli_quiets_libtpu_without_hiding_what_the_user_set(monkeypatch):
    from asickernels.simulate import tpu_compile

    for name in tpu_compile.LIBTPU_WITHOUT_A_TPU:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "host-a,host-b")
    assert cli.main(["--version"]) == 0
    import os

    assert os.environ["TPU_WORKER_HOSTNAMES"] == "host-a,host-b"
    assert os.environ["TPU_HOST_BOUNDS"] == "1,1,1" and os.environ["TPU_SKIP_MDS_QUERY"] == "1"


def test_info_prints_no_libtpu_errors():
    """libtpu, loaded by jax where it is installed, logs an INVALID_ARGUMENT error and a
    warning at every load without a TPU unless told it is one host
    (tpu_compile.LIBTPU_WITHOUT_A_TPU)."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "asickernels", "info"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for noise in ("INVALID_ARGUMENT", "E0000", "could not determine TPU", "Source Location"):
        assert noise not in done.stderr


def test_estimate_render_compiles_nothing_and_needs_no_libtpu(capsys, monkeypatch, tmp_path):
    from conftest import REPO

    from asickernels.simulate.tpu_estimate import estimate

    def compile_with_dumps(*args, **kwargs):
        raise AssertionError("--render compiled")

    monkeypatch.setattr(estimate, "compile_with_dumps", compile_with_dumps)
    monkeypatch.setitem(sys.modules, "libtpu", None)  # `import libtpu` raises ImportError
    recorded = REPO / "benchmarks" / "results" / "tpu_estimates" / "estimates.json"
    markdown = tmp_path / "estimates.md"
    code, out, err = run(capsys, "estimate", "--render", str(recorded), "--markdown", str(markdown))
    assert code == 0, err
    assert "| int8_matmul |" in out and "compiling" not in err
    assert "| int8_matmul |" in markdown.read_text()
    code, _, err = run(capsys, "estimate", "--render", str(recorded), "--op", "giou")
    assert code == 2 and "--render compiles nothing: drop --op" in err


def test_estimate_rows_without_a_pallas_kernel_show_no_kernel_time():
    from asickernels.estimates import tpu_report

    def row(name, kernels):
        estimate = types.SimpleNamespace(
            generation="v5e", device_s=2e-3, kernel_s=1e-3 if kernels else 0.0,
            kernels=kernels, utilization={},
        )  # fmt: skip
        return tpu_report.Row(types.SimpleNamespace(name=name, work=None), estimate)

    header, pallas, xla = tpu_report.estimates_text([row("ours", ["k"]), row("xla", [])], False)
    kernel_column = slice(header.index("program ms") + 11, header.index("kernel ms") + 9)
    assert pallas[kernel_column].strip() == "1.0000"
    assert xla[kernel_column].strip() == "-"


# -- check exit codes (a planted backend) --------------------------------------------------


def _off_by_one_matmul(x, y, *, x_scale, y_scale, out_dtype, config=None):
    return reference_int8_matmul(x, y, x_scale=x_scale, y_scale=y_scale, out_dtype=out_dtype) + 1


def _raising_matmul(x, y, **kwargs):
    raise RuntimeError("kernel exploded")


def _not_landed_matmul(x, y, **kwargs):
    import asickernels.backends.not_landed_yet  # noqa: F401  (a kernel whose module is missing)


@pytest.fixture
def planted(monkeypatch):
    """Registers test backends in a copy of the registry, restored afterwards."""
    # Kernel modules register into the registry when first imported; backends_for imports
    # every backend's now, or one first imported inside the copy would miss after the restore.
    registry.backends_for(asickernels.giou)
    for table in ("_BACKENDS", "_IMPLEMENTATIONS", "_LOADED", "_AVAILABILITY", "_IMPORTED"):
        monkeypatch.setattr(registry, table, dict(getattr(registry, table)))

    def plant(name, target, counters=None, *, op=asickernels.int8_matmul, **details):
        probe = lambda: Availability("native", "planted by a test")  # noqa: E731
        support = details.pop("support", registry.Support())
        kind = details.pop("array_kind", "numpy")
        registry.register_backend(Backend(name, kind, probe, "test", counters=counters, **details))
        registry.register(op, name, target, support=support)

    return plant


@pytest.mark.parametrize(
    ("target", "status", "shown"),
    [
        (_off_by_one_matmul, "fail", "FAIL"),
        (_raising_matmul, "error", "kernel exploded"),
        (_not_landed_matmul, "error", "ModuleNotFoundError"),
    ],
)
def test_check_exits_1_when_a_backend_is_wrong_or_raises(
    capsys, planted, tmp_path, target, status, shown
):
    planted("planted", target)
    path = tmp_path / "check.json"
    code, out, _ = run_line(
        capsys, "check --ops int8_matmul --backends planted --quiet --json", str(path)
    )
    assert code == 1
    assert shown in out
    document = json.loads(path.read_text())
    schema.validate(document)
    assert {row["status"] for row in document["checks"]} == {status}


def test_check_exits_0_when_every_backend_matches(capsys, planted):
    planted("planted", reference_int8_matmul)
    code, out, _ = run(capsys, "check", "--ops", "int8_matmul", "--backends", "planted", "--quiet")
    cases = workloads.WORKLOADS["int8_matmul"].check_cases(np.random.default_rng(0))
    assert code == 0
    assert f"{len(cases)}/{len(cases)} runs match" in out  # every case, on planted only
    assert "FAIL" not in out


def test_missing_backend_is_listed_not_failed(capsys, planted, monkeypatch):
    planted("absent", reference_int8_matmul)
    monkeypatch.setitem(
        registry._AVAILABILITY, "absent", Availability("missing", "no such device", "buy one")
    )
    code, out, _ = run(capsys, "check", "--ops", "int8_matmul", "--backends", "absent", "--quiet")
    assert code == 0
    assert "absent (int8_matmul): no such device (install: buy one)" in out


def _giou_plus_a_tenth(boxes1, boxes2, *, config=None):
    return reference_giou(boxes1, boxes2).astype(boxes1.dtype) + 0.1


def _giou_in_float32(boxes1, boxes2, *, config=None):
    """Claims float64 but computes it in float32: wrong where float32 cannot resolve boxes."""
    if boxes1.dtype != np.float64:
        return reference_giou(boxes1, boxes2).astype(np.float32)
    narrow = reference_giou(boxes1.astype(np.float32), boxes2.astype(np.float32))
    return narrow.astype(np.float32).astype(np.float64)


def _check_giou(capsys, tmp_path, backends):
    path = tmp_path / "check.json"
    code, out, _ = run(
        capsys, "check", "--ops", "giou", "--backends", backends, "--quiet", "--json", str(path)
    )
    document = json.loads(path.read_text())
    schema.validate(document)
    return code, out, {row["case"]: row for row in document["checks"]}


def test_a_float64_case_on_a_float32_only_backend_is_not_applicable(capsys, planted, tmp_path):
    planted("narrow", reference_giou, op=asickernels.giou)  # registered float32-only
    code, out, rows = _check_giou(capsys, tmp_path, "narrow")
    assert code == 0, out
    assert rows["float64_offset_1e6"]["status"] == "n/a"
    assert "narrow computes giou in float32 only" in rows["float64_offset_1e6"]["detail"]
    assert {row["status"] for case, row in rows.items() if case != "float64_offset_1e6"} == {"ok"}
    assert "1 not applicable" in out and "FAIL" not in out


def test_a_wrong_float32_only_backend_still_fails(capsys, planted, tmp_path):
    planted("wrong", _giou_plus_a_tenth, op=asickernels.giou)
    code, out, rows = _check_giou(capsys, tmp_path, "wrong")
    assert code == 1
    assert "FAILED" in out
    assert rows["random_130"]["status"] == "fail"
    assert rows["float64_offset_1e6"]["status"] == "n/a"


def test_float64_cases_run_in_float64_and_a_backend_that_narrows_them_fails(
    capsys, planted, tmp_path
):
    wide = registry.Support(registry.FLOAT32_AND_64)
    planted("narrows", _giou_in_float32, op=asickernels.giou, support=wide)
    code, out, rows = _check_giou(capsys, tmp_path, "narrows")
    assert code == 1, out
    assert rows["float64_offset_1e6"]["status"] == "fail"
    assert {row["status"] for case, row in rows.items() if case != "float64_offset_1e6"} == {"ok"}


def test_jax_backends_get_float64_cases_in_x64_mode():
    op = workloads.WORKLOADS["giou"]
    case = next(
        c for c in op.check_cases(np.random.default_rng(0)) if c.name == "float64_offset_1e6"
    )
    for prepared in (
        workloads.prepare_backend(op, "xla", case),
        workloads.prepare_default(op, "jit", case),
    ):
        got = prepared.canonical(prepared.call())
        assert got.dtype == np.float64
        assert op.compare(got, op.expected(case)).passed


def test_a_jax_backend_this_jax_cannot_trace_is_not_applicable(capsys, planted, tmp_path):
    planted(
        "eager_only",
        "asickernels.backends.xla.giou:giou",
        op=asickernels.giou,
        array_kind="jax",
        traceable=lambda: False,
    )
    code, out, rows = _check_giou(capsys, tmp_path, "eager_only")
    assert code == 0, out
    assert {row["status"] for row in rows.values()} == {"n/a"}
    assert all("cannot run under jax.jit" in row["detail"] for row in rows.values())
    path = tmp_path / "run.json"
    argv = ["run", "--ops", "giou", "--backends", "eager_only", "--size", "giou=8", "--quiet"]
    code, out, _ = run(capsys, *argv, "--json", str(path))
    document = json.loads(path.read_text())
    schema.validate(document)
    assert code == 0, out
    assert {row["status"] for row in document["results"]} == {"n/a"}


# -- bench ---------------------------------------------------------------------------------


def test_tiny_bench_writes_schema_json_and_a_plot(capsys, tmp_path):
    path, png = tmp_path / "bench.json", tmp_path / "bench.png"
    code, out, _ = run_line(
        capsys,
        "bench --ops giou,nms --backends reference,xla,numpy --size giou=8x8 --size nms=64:8"
        " --repeats 2 --budget 0.01 --quiet --json",
        str(path),
        "--plot",
        str(png),
    )
    assert code == 0, out
    document = json.loads(path.read_text())
    schema.validate(document)
    assert document["command"].startswith("asickernels bench --ops giou,nms")
    rows = {(r["op"], r["implementation"]): r for r in document["results"]}
    assert set(rows) == {
        ("giou", "reference"),
        ("giou", "xla"),
        ("nms", "reference"),
        ("nms", "xla"),
        ("nms", "numpy"),
    }
    for row in rows.values():
        assert row["status"] == "ok" and row["timing"]["repeats"] >= 2
        assert row["max_error"] <= row["tolerance"]
    peer_ratios = [
        r["ratio_to_fastest_peer"]
        for (op, _), r in rows.items()
        if op == "nms" and r["role"] == "peer"
    ]
    assert min(peer_ratios) == pytest.approx(1.0)
    assert rows[("nms", "reference")]["role"] == "reference"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "vs fastest peer" in out


def test_bench_skips_sizes_it_cannot_afford_and_reports_counters(capsys, planted, tmp_path):
    planted("counted", reference_int8_matmul, counters=lambda: {"instructions": 12.0})
    path = tmp_path / "bench.json"
    code, out, _ = run_line(
        capsys,
        "bench --ops int8_matmul --backends counted --size int8_matmul=4,128"
        " --max-call-seconds 1e-9 --repeats 2 --quiet --json",
        str(path),
    )
    assert code == 0
    small, large = json.loads(path.read_text())["results"]
    assert small["status"] == "ok" and small["counters"] == {"instructions": 12.0}
    assert large["status"] == "skipped" and "--max-call-seconds" in large["detail"]
    assert "instructions=12" in out


def test_failing_bench_row_is_not_timed(planted):
    planted("planted", _off_by_one_matmul)
    op = workloads.WORKLOADS["int8_matmul"]
    settings = harness.BenchSettings(
        sizes={"int8_matmul": [op.parse_size("16")]}, selected=frozenset({"planted"})
    )
    (row,) = harness.bench(settings)
    assert row.status == "fail" and row.timing is None and row.max_error == 1.0


def test_run_checks_then_benches(capsys, planted, tmp_path):
    planted("planted", reference_int8_matmul)
    path = tmp_path / "run.json"
    code, out, _ = run_line(
        capsys,
        "run --ops int8_matmul --backends planted --size int8_matmul=8 --quiet --json",
        str(path),
    )
    assert code == 0
    assert out.index("== check") < out.index("== bench")
    document = json.loads(path.read_text())
    assert document["checks"] and document["results"]
    assert {row["case"] for row in document["checks"]} == workloads.WORKLOADS[
        "int8_matmul"
    ].quick_cases


# -- pieces --------------------------------------------------------------------------------


def test_schema_rejects_malformed_documents():
    good = {
        "schema": schema.SCHEMA,
        "command": "x",
        "created": "now",
        "settings": None,
        "machine": {
            "cpu_model": "c",
            "cores": 2,
            "platform": "p",
            "python": "3",
            "jax_backend": "cpu",
            "devices": [],
            "load_average": [],
        },
        "versions": {},
        "checks": [],
        "results": [],
    }
    schema.validate(good)
    row = {
        "op": "giou",
        "size": "s",
        "params": {},
        "implementation": "xla",
        "role": "peer",
        "mode": "native",
        "status": "ok",
        "detail": "",
        "max_error": 0.0,
        "tolerance": 0.0,
        "checked": "all",
        "timing": None,
        "ratio_to_fastest_peer": None,
        "counters": {},
    }
    for broken, message in (
        ({**good, "schema": "other/1"}, "schema"),
        ({k: v for k, v in good.items() if k != "machine"}, "missing fields"),
        ({**good, "results": [row]}, "timing must be present"),
        ({**good, "results": [{**row, "role": "boss"}]}, "role"),
        ({**good, "results": [{**row, "max_error": "0"}]}, "max_error"),
    ):
        with pytest.raises(ValueError, match=message):
            schema.validate(broken)


def test_max_error_is_in_units_of_the_tolerance_as_the_schema_says():
    """schema.py: float outputs in units of the op's tolerance (tolerance 1), exact outputs
    as the number of differing entries (tolerance 0)."""
    want = np.array([0.5, -0.25])
    atol = 2e-5  # float32 GIOU: oracle tolerance atol, rtol 0
    for off_by, passed in ((0.5, True), (2.0, False)):
        got = (want + [off_by * atol, 0.0]).astype(np.float32)
        comparison = workloads.WORKLOADS["giou"].compare(got, want)
        assert comparison.tolerance == 1.0 and comparison.passed is passed
        assert comparison.max_error == pytest.approx(off_by, rel=1e-2)
    exact = cases.oracle_comparison(asickernels.nms, np.array([1, 2, 3]), np.array([1, 5, 4]))
    assert (exact.max_error, exact.tolerance, exact.passed) == (2.0, 0.0, False)


def test_timing_statistics():
    timing = Timing.from_samples([4.0, 1.0, 3.0, 2.0, 5.0], first_call_s=9.0)
    assert (timing.median_s, timing.min_s, timing.max_s, timing.repeats) == (3.0, 1.0, 5.0, 5)
    assert timing.p10_s == pytest.approx(1.4) and timing.p90_s == pytest.approx(4.6)
    assert timing.spread == pytest.approx((4.6 - 1.4) / 2 / 3)


def test_progress_bar_writes_a_line_every_few_seconds_when_not_a_terminal():
    stream, now = io.StringIO(), [0.0]
    progress = Progress(stream=stream, clock=lambda: now[0])
    progress.start(5)
    for label, seconds in (("a", 0.0), ("b", 1.0), ("c", LOG_INTERVAL_S - 1.1), ("d", 0.2)):
        now[0] += seconds
        progress.step(label)
    now[0] += LOG_INTERVAL_S
    progress.step("e")
    assert stream.getvalue().splitlines() == [
        render_bar(0, 5, "a"),
        render_bar(3, 5, "d"),
        render_bar(4, 5, "e"),
    ]
    assert render_bar(1, 2, "x", width=4) == "[##..] 1/2  x"
    quiet = io.StringIO()
    Progress(enabled=False, stream=quiet).step("nothing")
    assert quiet.getvalue() == ""


def test_progress_bar_on_a_terminal_is_cleared_when_its_block_ends_even_by_an_error():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    with pytest.raises(KeyboardInterrupt), Progress(stream=stream) as progress:
        progress.start(2)
        progress.step("a")
        raise KeyboardInterrupt
    assert stream.getvalue() == "\r\x1b[K" + render_bar(0, 2, "a") + "\r\x1b[K"


@pytest.mark.parametrize("categories", [False, True])
def test_numpy_nms_peer_agrees_with_the_reference(categories):
    rng = np.random.default_rng(5)
    boxes, scores = nms_cases.seed_style_boxes(rng, 300)
    cats = rng.integers(0, 4, 300) if categories else None
    kept = peers.numpy_nms(boxes, scores, 0.3, 50, cats)
    want, count = greedy_nms(
        boxes[None],
        scores[None],
        None if cats is None else cats[None],
        iou_threshold=0.3,
        max_output_size=50,
        score_threshold=-np.inf,
    )
    assert kept == list(want[0, : count[0]])


def test_big_int8_outputs_are_checked_on_sampled_rows(monkeypatch):
    monkeypatch.setattr(int8_matmul_cases, "_FULL_CHECK_MACS", 1000)
    op = workloads.WORKLOADS["int8_matmul"]
    x, y = np.ones((512, 8), np.int8), np.ones((8, 8), np.int8)
    expected = op.expected(cases.Case("big", (x, y)))
    rows, want, _ = expected
    assert rows is not None and 0 < len(rows) < 512 and want.shape == (len(rows), 8)
    got = np.full((512, 8), 8, np.int32)
    assert op.compare(got, expected).passed
    got[rows[0], 0] = 2
    comparison = op.compare(got, expected)
    assert not comparison.passed and "sampled rows" in comparison.checked


# -- device timing paths (no device here: a planted timer and a stand-in SDK) --------------


def test_a_native_backend_with_a_device_timer_is_timed_by_it(planted):
    def timer(op, case, warmup, iters):
        assert op == "int8_matmul" and case.arrays[0].shape == (16, 16)
        return Timing(2e-6, 1e-6, 1e-6, 3e-6, 4e-6, iters, None, "planted device timer")

    probe = lambda: Availability("native", "a planted device")  # noqa: E731
    registry.register_backend(Backend("device", "numpy", probe, "test", device_timer=timer))
    registry.register(asickernels.int8_matmul, "device", reference_int8_matmul)
    op = workloads.WORKLOADS["int8_matmul"]
    settings = harness.BenchSettings(
        sizes={"int8_matmul": [op.parse_size("16")]}, selected=frozenset({"device"}), repeats=7
    )
    (row,) = harness.bench(settings)
    assert row.status == "ok" and row.timing.method == "planted device timer"
    assert row.timing.repeats == 7 and row.timing.median_s == 2e-6


def test_nki_latency_reads_the_sdk_percentiles(monkeypatch):
    calls = []

    class Latency:
        def get_latency_percentile(self, p):
            return {0: 10.0, 10: 11.0, 50: 12.0, 90: 15.0, 100: 20.0}[p]  # microseconds

    def benchmark(warmup, iters):
        def wrap(kernel):
            def run(*args, **kwargs):
                calls.append((warmup, iters, kernel(*args, **kwargs)))

            run.benchmark_result = types.SimpleNamespace(nc_latency=Latency())
            return run

        return wrap

    sdk = types.ModuleType("neuronxcc")
    sdk.nki = types.SimpleNamespace(benchmark=benchmark)
    monkeypatch.setitem(sys.modules, "neuronxcc", sdk)
    timing = device.nki_latency(lambda a: a + 1, (1,), warmup=2, iters=9)
    assert calls == [(2, 9, 2)]
    assert (
        timing.min_s,
        timing.p10_s,
        timing.median_s,
        timing.p90_s,
        timing.max_s,
    ) == pytest.approx((10e-6, 11e-6, 12e-6, 15e-6, 20e-6))
    assert timing.repeats == 9 and "nki.benchmark" in timing.method


@pytest.mark.parametrize("op_name", ["giou", "nms", "int8_matmul"])
def test_the_nki_backend_times_every_kernel_its_op_launches(monkeypatch, op_name):
    """On a Neuron host `bench` asks the nki backend's device timer; it runs the public op as
    on CPU and has each kernel launch timed by nki.benchmark (stood in for here)."""
    launched = []

    def fake_latency(kernel, args, *, warmup, iters, kwargs=None):
        launched.append(kernel.__name__)
        return Timing(1e-6, 1e-6, 1e-6, 1e-6, 1e-6, iters, None, "fake")

    monkeypatch.setattr(device, "nki_latency", fake_latency)
    op = workloads.WORKLOADS[op_name]
    case = op.bench_case(op.parse_size(op.default_sizes[0]), np.random.default_rng(0))
    timing = registry.backend("nki").device_timer(op_name, case, 2, 5)
    assert launched and all(name.endswith("_kernel") for name in launched)
    assert timing.median_s == pytest.approx(1e-6 * len(launched)) and timing.repeats == 5
    assert f"{len(launched)} kernel launch" in timing.method


# -- every op has a workload ---------------------------------------------------------------

# Declared ops that `check` and `bench` do not run, and why: pytest's conformance suite
# checks them on every backend.
NOT_WORKLOADS = {
    # gradients and losses of ops that are workloads (giou_vjp is one: the detection loss)
    "giou_loss": "GIOU's loss, 1 - giou",
    "diou_vjp": "DIoU's gradient",
    "diou_loss": "DIoU's loss",
    "ciou_vjp": "CIoU's gradient",
    "ciou_loss": "CIoU's loss",
    "roi_align_vjp": "RoIAlign's gradient",
    "roi_pool_vjp": "RoIPool's gradient",
    "quantize_int8": "int8_matmul's input preparation",
}


def test_every_declared_op_has_a_check_and_bench_workload():
    import asickernels

    declared = {op.name for op in asickernels.OPS}
    assert set(NOT_WORKLOADS) <= declared
    assert declared - set(NOT_WORKLOADS) == set(workloads.WORKLOADS)
    for name, op in workloads.WORKLOADS.items():
        assert op.quick_cases <= {c.name for c in op.check_cases(np.random.default_rng(0))}, name
        assert set(op.quick_sizes) <= set(op.default_sizes), name


def test_check_runs_the_roi_ops_on_their_conformance_cases(capsys, tmp_path):
    path = tmp_path / "check.json"
    code, out, _ = run(
        capsys, "check", "--ops", "roi_align,roi_pool", "--backends", "xla,cpu", "--quick",
        "--quiet", "--json", str(path),
    )  # fmt: skip
    assert code == 0, out
    rows = json.loads(path.read_text())["checks"]
    assert {(r["op"], r["implementation"], r["case"]) for r in rows} == {
        (op, backend, "random_f32")
        for op in ("roi_align", "roi_pool")
        for backend in ("xla", "cpu")
    }
    assert all(r["status"] == "ok" for r in rows)
    pool = workloads.WORKLOADS["roi_pool"]
    statics = {c.name: c.static for c in pool.check_cases(np.random.default_rng(0))}
    assert statics["aligned_ratio_2"] == {"output_size": (2, 2), "spatial_scale": 1.0}


def test_roi_bench_sizes_are_detection_shaped(capsys, tmp_path):
    op = workloads.WORKLOADS["roi_align"]
    size = op.parse_size("1000")
    assert size.params == {"k": 1000, "input_shape": [2, 256, 50, 68]}
    case = op.bench_case(op.parse_size("50:1x8x20x30"), np.random.default_rng(0))
    features, rois = case.arrays
    assert features.shape == (1, 8, 20, 30) and rois.shape == (50, 5)
    assert features.dtype == rois.dtype == np.float32
    assert case.static == {
        "output_size": (7, 7), "spatial_scale": 1 / 16, "sampling_ratio": 2, "aligned": True,
    }  # fmt: skip
    image = np.array([30, 20]) * 16
    assert np.all(rois[:, 1:3] >= 0) and np.all(rois[:, 3:] <= image - 1)
    assert np.all(rois[:, 3:] > rois[:, 1:3]) and np.all(np.diff(rois[:, 0]) >= 0)
    for text in ("0", "5:1x8x20", "5:0x8x20x30", "x"):
        with pytest.raises(ValueError, match="K\\[:NxCxHxW\\]"):
            op.parse_size(text)
    path = tmp_path / "bench.json"
    code, out, _ = run(
        capsys, "bench", "--ops", "roi_align,roi_pool", "--backends", "xla,cpu",
        "--size", "roi_align=6:2x8x20x30", "--size", "roi_pool=6:2x8x20x30",
        "--repeats", "2", "--budget", "0.01", "--quiet", "--json", str(path),
    )  # fmt: skip
    assert code == 0, out
    rows = json.loads(path.read_text())["results"]
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows)
    assert {r["size"] for r in rows} == {"K=6 2x8x20x30"}
