"""The trn2 kernel-optimization tutorial's engine utilisations against the cost model
(benchmarks/nki_estimate/trn2_tutorial.py): the quoted figures are the file's, and the
recorded model figures are what the model gives now."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import pytest
from conftest import REPO, VENDOR_MISSING, load_module, vendor_present

pytestmark = pytest.mark.skipif(
    not vendor_present("aws-neuron-sdk@81ce03a", "nki/guides/"), reason=VENDOR_MISSING
)
SCRIPT = REPO / "benchmarks/nki_estimate/trn2_tutorial.py"
RECORDED = json.loads(SCRIPT.with_suffix(".json").read_text())


def _script() -> Any:
    """trn2_tutorial.py (not a package: loaded from its path, when a test runs)."""
    return sys.modules.get("nki_estimate_trn2_tutorial") or load_module(
        SCRIPT, "nki_estimate_trn2_tutorial"
    )


def test_the_figures_are_the_tutorials():
    """Each step's figures are the numbers of its quote, and the quote is in the file."""
    trn2_tutorial = _script()
    text = " ".join(trn2_tutorial.tutorial_text().split())
    for step, figures in trn2_tutorial.STEPS.items():
        assert figures["quote"] in text, step
        quoted = sorted(float(n) for n in re.findall(r"(\d+\.\d+)%", figures["quote"]))
        assert quoted == sorted(figures["active"].values()), step


def test_the_tutorials_kernels_are_its_five_steps():
    trn2_tutorial = _script()
    kernels = trn2_tutorial.kernels(trn2_tutorial.tutorial_text())
    assert list(kernels) == ["v1", "v2", "v3", "v4", "v5"]
    assert "TILES_IN_BLOCK_K" in kernels["v5"] and "TILES_IN_BLOCK_K" not in kernels["v4"]


@pytest.mark.slow
def test_the_recorded_utilisations_are_the_models():
    """Re-simulates v2 (1-2 min here) and estimates it: the model's active shares equal the
    recorded ones, and those recorded within 5 points still are."""
    trn2_tutorial, step = _script(), "v2"
    source = trn2_tutorial.kernels(trn2_tutorial.tutorial_text())[step]
    row = trn2_tutorial.row_of(step, {"trace": trn2_tutorial.trace_of(source, step)})
    (recorded,) = [r for r in RECORDED["rows"] if r["step"] == step]
    assert row["model_active_percent"] == pytest.approx(recorded["model_active_percent"], abs=0.01)
    assert row["within"] == recorded["within"]
    published = trn2_tutorial.STEPS[step]["active"]
    for engine, within in row["within"].items():
        gap = abs(row["model_active_percent"][engine] - published[engine])
        assert within is (gap <= trn2_tutorial.TOLERANCE)
