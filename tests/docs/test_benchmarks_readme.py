"""benchmarks/README.md: rendered from the recorded JSON only (the committed file is what the
renderer gives, so it cannot drift), and its summaries compare only rows that ran natively."""

from __future__ import annotations

import importlib.util
import json

from conftest import REPO as ROOT

from asickernels import cli
from asickernels.benchmarking import harness, markdown
from asickernels.benchmarking.timing import Timing


def _render_module():
    spec = importlib.util.spec_from_file_location("render", ROOT / "benchmarks" / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_eager_ab_page_is_what_its_script_renders():
    spec = importlib.util.spec_from_file_location("eager_ab", ROOT / "benchmarks" / "eager_ab.py")
    assert spec is not None and spec.loader is not None
    eager_ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(eager_ab)
    page = ROOT / "benchmarks" / "results" / "eager_ab" / "README.md"
    assert page.read_text() == eager_ab.rendered(page), (
        "run `python benchmarks/eager_ab.py --render benchmarks/results/eager_ab`"
    )


def test_the_committed_benchmarks_readme_is_what_the_renderer_gives():
    render = _render_module()
    assert render.OUT.read_text() == render.rendered(), (
        "benchmarks/README.md differs from the recorded results: run `python benchmarks/render.py`"
    )


def test_every_recorded_document_is_a_section_with_its_command():
    text = (ROOT / "benchmarks" / "README.md").read_text()
    assert text.startswith("# Benchmarks\n") and markdown.COMMAND in text
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        assert f"## `{json.loads(path.read_text())['command']}`" in text
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.md")):
        assert f"(results/{path.name})" in text


def test_a_fresh_bench_renders_with_links_to_other_results(capsys, tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    argv = ["bench", "--ops", "nms", "--backends", "reference,numpy", "--size", "nms=64:8:0.1"]
    argv += ["--repeats", "2", "--quiet", "--json", str(results / "cpu.json")]
    assert cli.main(argv) == 0
    (results / "tpu_estimates.md").write_text("## TPU estimates\n")
    out = tmp_path / "BENCHMARKS.md"
    assert _render_module().main(["--results", str(results), "--out", str(out)]) == 0
    text = out.read_text()
    assert "## `asickernels bench --ops nms" in text and "cores" in text
    assert "[results/tpu_estimates.md](results/tpu_estimates.md)" in text
    assert "| nms | N=64 out=8 iou>0.1 |" in text  # the medians table
    capsys.readouterr()


def test_no_results_is_an_error_not_an_empty_file(tmp_path, capsys):
    out = tmp_path / "README.md"
    assert _render_module().main(["--results", str(tmp_path), "--out", str(out)]) == 1
    assert not out.exists() and "no results" in capsys.readouterr().err


def _row(name, role, mode, median, size="N=8"):
    timing = Timing.from_samples([median], None)
    return harness.BenchRow("nms", size, {}, name, role, mode, "ok", timing=timing)


def test_summaries_compare_only_rows_that_ran_natively():
    rows = [
        _row("xla", "peer", "native", 2.0),
        _row("numpy", "peer", "native", 4.0),
        _row("interpreted_peer", "peer", "simulated", 0.5),  # never the fastest peer
        _row("fast", "ours", "native", 1.0),
        _row("slow", "ours", "native", 8.0),
        _row("pallas_tpu", "ours", "simulated", 0.1),  # never counted as ahead
    ]
    pairs = markdown.native_comparisons(rows)
    assert [(ours.implementation, peer.implementation) for ours, peer in pairs] == [
        ("fast", "xla"),
        ("slow", "xla"),
    ]
    summary = "\n".join(markdown._summary(rows))
    assert "- fast: faster than the fastest native peer at 1 of 1 sizes (2× to 2×)." in summary
    assert "- slow: faster than the fastest native peer at 0 of 1 sizes; not at nms N=8 (4×" in (
        summary
    )
    assert "pallas_tpu: faster" not in summary
    assert "Simulated here, so not compared: interpreted_peer, pallas_tpu" in summary


def test_sizes_without_a_native_peer_are_not_compared():
    rows = [_row("nki", "peer", "simulated", 2.0), _row("cpu", "ours", "native", 1.0)]
    assert markdown.native_comparisons(rows) == []
    assert not any(line.startswith("- cpu") for line in markdown._summary(rows))


def test_the_eager_table_marks_misses_of_both_targets():
    rows = [
        _row("default", "ours", "native", 100e-6, "small"),
        _row("default-jit-numpy", "ours", "native", 100e-6, "small"),
        _row("default-eager", "ours", "native", 125e-6, "small"),  # 1.25 > 1.2 of jit-numpy
        _row("default", "ours", "native", 1e-3, "large"),
        _row("default-jit-numpy", "ours", "native", 1.2e-3, "large"),
        _row("default-eager", "ours", "native", 1.4e-3, "large"),  # 1.4 > 1.3 of jitted
    ]
    table = markdown._eager_table(rows)
    assert table is not None
    small = next(line for line in table.splitlines() if "| small |" in line)
    large = next(line for line in table.splitlines() if "| large |" in line)
    assert "| 1.25 **no** | 1.25 |" in small  # under 200 µs only the numpy target applies
    assert "| 1.17 | 1.40 **no** |" in large
