"""The nki-samples CI latency thresholds as upper bounds on the cost model.

Until aws-neuron/nki-samples fc5c69f, each reference kernel's perf test asserted that its
latency percentile on a device was at or below a threshold (microseconds);
benchmarks/nki_estimate/nki_samples.py records them, with the estimates, in nki_samples.json.
A threshold bounds the device from above only: an estimate above it over-estimates the device.
Here the cheapest cases whose estimate is within its bound are re-estimated from the kernels
of nki-samples@8370e11 (conftest's ``VENDOR``; the test checks they are the very source
recorded, fc5c69f^'s) and must stay within it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import REPO, VENDOR, VENDOR_MISSING, load_module, vendor_present

from asickernels.simulate.nki import install as hook
from asickernels.simulate.nki.estimate import estimate

pytestmark = pytest.mark.skipif(not vendor_present("nki-samples@8370e11"), reason=VENDOR_MISSING)
SAMPLES = VENDOR / "nki-samples@8370e11"
SCRIPT = REPO / "benchmarks/nki_estimate/nki_samples.py"
# Three kernels, three bound engines, each simulated in seconds: adaptive average pooling
# (DMA-bound, estimate/threshold 0.83 when recorded), select-and-scatter (DMA, 0.71) and the
# fp8 double-row matmul on trn2 (TensorE, 0.98).
CASES = ("test_adaptive_avg_pool2d[1]", "test_select_and_scatter[0]", "test_double_row_matmul[0]")


def _script() -> Any:
    """nki_samples.py (not a package: loaded from its path)."""
    return sys.modules.get("nki_estimate_nki_samples") or load_module(
        SCRIPT, "nki_estimate_nki_samples"
    )


@pytest.fixture
def recorded() -> Iterator[dict[str, dict[str, Any]]]:
    """nki_samples.json's rows by case, with the simulator installed for the kernels."""
    if hook.real_sdk_available("neuronxcc"):
        pytest.skip("a real neuronxcc is installed: the hook does not shadow it")
    rows = json.loads((SCRIPT.parent / "nki_samples.json").read_text())["rows"]
    yield {row["case"]: row for row in rows}
    hook.uninstall()
    for module in [m for m in sys.modules if m.startswith("nki_samples_reference_")]:
        del sys.modules[module]  # imported from VENDOR with the hook installed


@pytest.mark.parametrize("name", CASES)
def test_estimate_does_not_exceed_the_devices_threshold(name, recorded):
    script = _script()
    row = recorded[name]
    source = SAMPLES / row["kernel"].partition(":")[0]
    assert script.blob_id(source.read_text()) == row["kernel_blob"], (
        f"{source} is not the kernel source the threshold was set for"
    )
    kernels = script.import_kernels(source)
    version, trace, _ = script.trace_of(row["file"], kernels, script.params_of(row))
    assert version == {"trn1": 2, "trn2": 3}[row["target"]]
    latency_us = estimate(trace, version).latency_us
    assert latency_us <= row["threshold_us"], (
        f"{name}: estimated {latency_us:.1f} us, above the P{row['percentile']} the device "
        f"met in nki-samples CI ({row['threshold_us']} us): the model over-estimates it"
    )
