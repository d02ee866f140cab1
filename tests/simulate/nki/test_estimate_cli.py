"""``asickernels estimate --neuron``: modelled NeuronCore times of our NKI kernels beside their
roofline, the engine timeline as a PNG / Chrome trace, and the recorded estimates (drift)."""

from __future__ import annotations

import contextlib
import io
import json
import sys

import pytest
from conftest import DATA, REPO

from asickernels import cli
from asickernels.simulate.nki import kernel_estimates
from asickernels.simulate.nki.estimate import GENERATIONS, estimate, generation_of
from asickernels.simulate.nki.timeline_png import write_timeline_png
from asickernels.simulate.nki.trace import Access, Instruction

RECORDED = DATA / "nki_kernel_estimates.json"
REGENERATE = f"asickernels estimate --neuron --json {RECORDED.relative_to(REPO)}"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def cli_rows(tmp_path_factory):
    """One run of the command for every kernel and generation: (exit code, stdout, rows)."""
    path = tmp_path_factory.mktemp("estimates") / "rows.json"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["estimate", "--neuron", "--json", str(path)])
    return code, out.getvalue(), json.loads(path.read_text())["rows"]


def test_a_row_per_kernel_and_generation_at_or_above_its_roofline(cli_rows):
    code, printed, rows = cli_rows
    assert code == 0 and "not measurements" in printed
    names = {generation_of(version).name for version in GENERATIONS}
    got = {(row["op"], row["generation"]) for row in rows}
    assert got == {(op, name) for op in kernel_estimates.KERNEL_NAMES for name in names}
    for row in rows:
        assert row["estimate_us"] > 0 and row["roofline_us"] > 0, row
        assert row["estimate_us"] >= row["roofline_us"], row  # the model never beats physics
        assert row["instructions"] > 0 and row["bound"] in printed
    for op in kernel_estimates.KERNEL_NAMES:
        assert op in printed


def test_the_estimates_equal_their_recorded_values(cli_rows):
    """Fails when the cost model or a kernel moves an estimate. If the change is meant,
    regenerate the record with the command in the message (it prints the new table)."""
    recorded = json.loads(RECORDED.read_text())
    assert recorded["command"] == REGENERATE
    _, _, rows = cli_rows
    key = ("op", "size", "generation")
    now = {tuple(row[k] for k in key): row for row in rows}
    drifted = [
        f"{' '.join(name)}: recorded {old['estimate_us']:.4f} us / {old['instructions']} "
        f"instructions, now {now[name]['estimate_us']:.4f} us / "
        f"{now[name]['instructions']}"
        for old in recorded["rows"]
        if (name := tuple(old[k] for k in key)) in now
        and (
            now[name]["estimate_us"] != pytest.approx(old["estimate_us"], rel=1e-9)
            or now[name]["instructions"] != old["instructions"]
        )
    ]
    missing = sorted(set(now) ^ {tuple(old[k] for k in key) for old in recorded["rows"]})
    assert not drifted and not missing, (
        f"{len(drifted)} NKI kernel estimate(s) drifted from {RECORDED.name} (e.g. "
        f"{'; '.join(drifted[:3])}) and {len(missing)} row(s) were added or removed "
        f"{missing[:3]}. If the change is intended, regenerate: `{REGENERATE}`"
    )


def test_the_roofline_is_bytes_over_hbm_or_ops_over_the_engine_peak():
    v2 = generation_of(2)
    matmul = kernel_estimates.Work(hbm_bytes=1.0, ops=2.0 * 4096**3, engine="tensor")
    # 128 x 128 multiply-adds per TensorE cycle at 2.8 GHz (trainium_inferentia2_arch.rst).
    assert matmul.roofline_us(v2) == pytest.approx(2.0 * 4096**3 / (2 * 128 * 128 * 2.8) / 1e3)
    stream = kernel_estimates.Work(hbm_bytes=410e6)  # 410 GB/s: half of 820 GB/s per device
    assert stream.roofline_us(v2) == pytest.approx(1000.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--neuron", "trn9"], "'trn9' is not a NeuronCore target; use one of"),
        (["--kernel", "giou"], "--kernel needs --neuron"),
        (["--neuron", "--generation", "v5e"], "--generation apply to TPU estimates"),
        (["--neuron", "trn2", "--timeline", "t.png"], "one kernel on one generation"),
        (["--neuron", "--kernel", "giou", "--timeline", "t.png"], "one kernel on one generation"),
        (["--neuron", "trn2", "--kernel", "giou", "--timeline", "t.svg"], "end in .png or .json"),
    ],
)
def test_bad_options_are_clear_errors(argv, message, capsys):
    assert cli.main(["estimate", *argv]) == 2
    assert message in capsys.readouterr().err


def test_generation_names_and_versions():
    assert kernel_estimates.parse_generations("") == [2, 3, 4]
    assert kernel_estimates.parse_generations("trn1,inf2,trn3") == [2, 4]  # one NeuronCore-v2
    assert kernel_estimates.parse_generations("trn2,") == [3]
    with pytest.raises(ValueError, match="no cost model for NeuronCore-v5"):
        kernel_estimates.kernel_rows([5], ["giou"])
    with pytest.raises(ValueError, match="at least one"):
        kernel_estimates.kernel_rows([], ["giou"])
    with pytest.raises(ValueError, match="no NKI kernel estimate for"):
        kernel_estimates.kernel_rows([2], ["matmul"])


def test_the_timeline_is_written_as_chrome_trace_json(tmp_path, capsys):
    path = tmp_path / "diou.json"
    argv = ["estimate", "--neuron", "trn2", "--kernel", "diou", "--timeline", str(path)]
    assert cli.main(argv) == 0
    trace = json.loads(path.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    other = trace["otherData"]
    assert spans and other["estimate"] and other["generation"] == GENERATIONS[3].name
    low, high = other["band_us"]  # the estimate's range over DMA-rate and overlap assumptions
    end_us = max(e["ts"] + e["dur"] for e in spans)
    assert low <= end_us <= high
    out = capsys.readouterr().out
    assert f"wrote {path}" in out and "band us" in out


def test_the_timeline_png_is_written(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the PNG needs the bench extra (matplotlib)")
    path = tmp_path / "diou.png"
    argv = ["estimate", "--neuron", "trn2", "--kernel", "diou", "--timeline", str(path)]
    assert cli.main(argv) == 0
    assert path.read_bytes().startswith(PNG_MAGIC) and path.stat().st_size > 5000
    capsys.readouterr()


def _tiny_estimate(timeline: bool):
    load = Instruction(
        "dma",
        "load",
        (Access("hbm", 128, 1, 0, 8191, (128, 64), "float32", 4, 1),),
        (Access("sbuf", 128, 2, 0, 8191, (128, 64), "float32", 4, 1),),
    )
    return estimate([load], 2, timeline=timeline)


def test_the_png_writer_takes_the_chrome_trace_or_its_file(tmp_path):
    pytest.importorskip("matplotlib", reason="the PNG needs the bench extra (matplotlib)")
    trace = tmp_path / "t.json"
    _tiny_estimate(timeline=True).write_chrome_trace(str(trace))
    write_timeline_png(trace, tmp_path / "from_file.png", title="load")
    write_timeline_png(_tiny_estimate(timeline=True).chrome_trace(), tmp_path / "from_dict.png")
    for name in ("from_file.png", "from_dict.png"):
        assert (tmp_path / name).read_bytes().startswith(PNG_MAGIC)
    with pytest.raises(ValueError, match="timeline=True"):
        write_timeline_png(_tiny_estimate(timeline=False).chrome_trace(), tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_without_matplotlib_the_error_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    # asickernels is not on PyPI: matplotlib itself, or the bench extra from a clone.
    with pytest.raises(ImportError, match=r'pip install matplotlib .*pip install -e "\.\[bench\]"'):
        write_timeline_png(_tiny_estimate(timeline=True).chrome_trace(), tmp_path / "x.png")


def test_the_cli_refuses_a_png_timeline_without_matplotlib_before_estimating(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # find_spec("matplotlib") is None
    monkeypatch.setattr(kernel_estimates, "kernel_rows", None)  # estimating would raise
    png = tmp_path / "t.png"
    argv = ["estimate", "--neuron", "trn2", "--kernel", "giou", "--timeline", str(png)]
    assert cli.main(argv) == 2
    assert "a PNG needs matplotlib" in capsys.readouterr().err and not png.exists()


def test_the_benchmarks_page_shows_the_calibration_with_its_command():
    """benchmarks/README.md (rendered by benchmarks/render.py; tests/docs checks it is what
    the renderer gives) has the calibration: command, figures, errors, median, rank order."""
    calibration = json.loads((REPO / "benchmarks/nki_estimate/calibration.json").read_text())
    page = (REPO / "benchmarks/README.md").read_text()
    section = page[page.index("## NKI cost model against published device figures") :]
    assert f"`{calibration['command']}`" in section
    for row in calibration["model"]["rows"]:
        error = f"{row['error']:+.1%}" if row["absolute"] else "ratio only"
        cells = f"| {row['published_ms']:g} | {row['estimate_ms']:.3f} | {error} | {row['bound']} |"
        assert f"| {row['kernel']} | {row['family']} |" in section and cells in section
    absolute = sum(row["absolute"] for row in calibration["model"]["rows"])
    median = calibration["model"]["median_abs_error"]
    assert f"Median |error| over the {absolute} absolute rows: {median:.1%}" in section
    for family in calibration["model"]["rank_order_agrees"]:
        assert f"{family}: agrees" in section or f"{family}: **does not agree**" in section
