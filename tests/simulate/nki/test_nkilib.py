"""AWS's NKI kernel library (aws-neuron/nki-library@d2ad3a5) on the simulator: the
``nki_cpu_simulator`` drop-in its test suite imports (the names of its
test/utils/simulation_setup.py and ``nki.cpu_simulate(kernel)[lnc](**inputs)``), the
``neuron_dtypes`` stand-in, the rules its kernels showed the simulator refusing wrongly, and
a few of its kernels run unchanged through the drop-in against numpy. The whole suite runs
in ``make test-nkilib`` (tests/simulate/nki/nkilib_suite.py)."""

from __future__ import annotations

import dataclasses
import importlib
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import nkilib_suite
import numpy as np
import pytest

from asickernels.simulate import nki as simulator
from asickernels.simulate.nki import errors, neuron_dtypes
from asickernels.simulate.nki import install as hook
from asickernels.simulate.nki import isa as nisa
from asickernels.simulate.nki import language as nl
from asickernels.simulate.nki.tensor import PACKED_X4, NkiTensor

HOOKED = ("nki", "neuronxcc", "nki_cpu_simulator", "neuron_dtypes")
TREE = nkilib_suite.vendor_tree()
needs_tree = pytest.mark.skipif(
    TREE is None, reason=f"{nkilib_suite.FOLDER} absent from {nkilib_suite.TREES}"
)


def _forget(*roots: str) -> None:
    for name in [n for n in sys.modules if n.split(".")[0] in roots]:
        del sys.modules[name]


@pytest.fixture
def hooked() -> Iterator[None]:
    """The import hook installed (and nothing else of its names imported) for the test."""
    if any(hook.real_sdk_available(root) for root in HOOKED):
        pytest.skip("a real Neuron SDK or CPU simulator is installed here")
    hook.uninstall()
    _forget(*HOOKED, "nkilib_src")
    importlib.invalidate_caches()
    hook.install()
    yield
    hook.uninstall()
    _forget(*HOOKED, "nkilib_src")
    importlib.invalidate_caches()


def test_drop_in_provides_the_modules_simulation_setup_imports(hooked):
    import nki_cpu_simulator.nki.builtin as sim_builtin
    import nki_cpu_simulator.nki.compiler as sim_ncc
    import nki_cpu_simulator.nki.isa as sim_nisa
    import nki_cpu_simulator.nki.isa.constants as sim_nisa_constants
    import nki_cpu_simulator.nki.language as sim_nl
    import nki_cpu_simulator.nki.language.dtypes as sim_dtypes
    import nki_cpu_simulator.nki.tensor as sim_ntensor
    import nki_cpu_simulator.nki.typing as sim_nt
    from nki_cpu_simulator import nki as sim_nki

    assert sim_nki is simulator and sim_nl is simulator.language and sim_nisa is simulator.isa
    assert sim_nisa_constants.oob_mode is simulator.isa.oob_mode
    assert sim_dtypes.float8_e4m3fn_x4 is simulator.language.float8_e4m3fn_x4
    assert sim_nt.tensor is simulator.typing.tensor and sim_ntensor.NkiTensor
    assert sim_builtin.__name__.endswith("builtin") and sim_ncc is simulator.compiler
    import neuron_dtypes

    assert neuron_dtypes is sys.modules["asickernels.simulate.nki.neuron_dtypes"]


def _halves(x):
    """Each logical core copies its half of the rows (core 0 gets none of a 1-row input)."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    core, rows = nl.program_id(0), x.shape[0]
    start = core * (rows // 2)
    count = rows // 2 if core == 0 else rows - rows // 2
    source, target = x[nl.ds(start, count)], out[nl.ds(start, count)]
    for row in range(count):
        tile = nl.ndarray((1, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=source[row : row + 1])
        nisa.dma_copy(dst=target[row : row + 1], src=tile)
    return out


@pytest.mark.parametrize("rows", [1, 5])
def test_cpu_simulate_runs_each_logical_core_and_reads_the_generation(rows, monkeypatch):
    x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    monkeypatch.setenv(simulator.NC_VERSION_ENV, "gen3")
    assert np.array_equal(simulator.cpu_simulate(simulator.jit(_halves))[2](x=x), x)

    def version(x):
        out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
        nl.store(out, nl.full((1, 1), nisa.get_nc_version().value, dtype=nl.int32))
        return out

    assert simulator.cpu_simulate(version)(x)[0, 0] == 3  # gen3 = trn2
    monkeypatch.setenv(simulator.NC_VERSION_ENV, "gen9")
    with pytest.raises(ValueError, match="NKI_NC_VERSION"):
        simulator.cpu_simulate(version)[1](x)


def test_an_output_in_private_hbm_is_returned_with_a_warning():
    def copy(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.hbm)
        nisa.dma_copy(dst=out, src=nl.load(x))
        return out

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with pytest.warns(errors.DeviceRanItWarning, match="shared_hbm"):
        assert np.array_equal(simulator.simulate(copy)(x), x)
    with pytest.raises(errors.UnsupportedMemory):
        simulator.simulate(nl.load)(x)  # an SBUF tile is no output


def test_nonzero_with_count_reads_several_free_axes_row_major(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    x = np.zeros((128, 2, 4), np.float32)
    x[0, 0, 1] = x[0, 1, 2] = 3.0
    x[16, 1, 3] = -1.0

    def kernel(x):
        tile = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x)
        found = nl.ndarray((128, 9), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(found, 0)
        nisa.nonzero_with_count(dst=found, src=tile, index_offset=16, padding_val=-1)
        out = nl.ndarray(found.shape, dtype=nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=found)
        return out

    result = simulator.simulate(kernel)(x)
    assert list(result[0]) == [17, 22, -1, -1, -1, -1, -1, -1, 2]
    assert list(result[16]) == [23, *[-1] * 7, 1]
    assert not result[1].any()  # only partitions 0, 16, ..., 112 are written

    def too_short(x):
        tile = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        found = nl.ndarray((128, 8), dtype=nl.int32, buffer=nl.sbuf)
        nisa.nonzero_with_count(dst=found, src=tile)

    with pytest.raises(errors.ShapeMismatch):
        simulator.simulate(too_short)(x)


@pytest.mark.parametrize("name", ["float8_e4m3fn_x4", "float8_e5m2_x4", "float4_e2m1fn_x4"])
def test_static_cast_packs_four_values_as_nc_matmul_mx_reads_them(name):
    element, nbytes = PACKED_X4[name]
    values = np.array([[0.5, -1.0, 1.5, 2.0, -0.5, 0.0, 3.0, 4.0]], np.float32)
    packed = neuron_dtypes.static_cast(values, getattr(nl, name))
    assert packed.shape == (1, 2) and packed.dtype == getattr(nl, name)
    assert packed.dtype.itemsize == nbytes == neuron_dtypes.sizeinbytes(getattr(nl, name))
    codes = values.astype(element).view(np.uint8)
    if nbytes == 2:
        codes = codes[..., 0::2] | (codes[..., 1::2] << 4)
    assert np.array_equal(packed.view(np.uint8), codes)  # the first value in the low bits
    assert np.array_equal(neuron_dtypes.static_cast(packed, np.float32), values)
    tile = NkiTensor(packed, packed.dtype, nl.sbuf, None)
    assert np.array_equal(nisa._unpack_mx(tile).reshape(1, 8), values)


def test_static_cast_rounds_as_the_element_formats_do():
    values = np.array([1.00390625, 3.0e38, -2.5, 7.9], np.float32)
    bf16 = neuron_dtypes.static_cast(values, nl.bfloat16)
    assert bf16.dtype == ml_dtypes.bfloat16
    assert np.array_equal(bf16, values.astype(ml_dtypes.bfloat16))
    tf32 = neuron_dtypes.static_cast(np.float32([1 + 2**-11 + 2**-12]), nl.tfloat32)
    assert tf32[0] == np.float32(1 + 2**-10)  # nearest, 10 mantissa bits
    assert list(neuron_dtypes.static_cast(np.float32([-2.5, 7.9]), np.int32)) == [-2, 7]
    assert neuron_dtypes.is_float_type(nl.bfloat16) and neuron_dtypes.is_float_type(np.float16)
    assert not neuron_dtypes.is_float_type(np.int32)
    assert neuron_dtypes.finfo(nl.float8_e4m3fn).max == 448
    with pytest.raises(ValueError, match="4k"):
        neuron_dtypes.static_cast(np.zeros((2, 3), np.float32), nl.float8_e4m3fn_x4)


def _import_nkilib(module: str):
    """A module of the library's kernels (``nkilib_src.nkilib...``) from the vendor tree."""
    sys.path.insert(0, str(TREE / "src"))
    try:
        return importlib.import_module(module)
    finally:
        sys.path.remove(str(TREE / "src"))


@needs_tree
@pytest.mark.parametrize("shape", [(256, 6), (128, 1030)])
def test_nkilib_cumsum(hooked, shape, monkeypatch):
    """core/cumsum: the running sum over the last axis (test_cumsum.py's fast cases)."""
    monkeypatch.setenv(simulator.NC_VERSION_ENV, "gen3")
    import nki

    cumsum = _import_nkilib("nkilib_src.nkilib.core.cumsum").cumsum
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    result = nki.cpu_simulate(cumsum)[1](x=x)
    np.testing.assert_allclose(result, np.cumsum(x, axis=-1), rtol=1e-4, atol=1e-4)


@needs_tree
@pytest.mark.parametrize("positions", [1, 37])
def test_nkilib_cross_entropy_forward_at_lnc2(hooked, positions, monkeypatch):
    """experimental/loss: per-position loss and log-sum-exp over a 3000-token vocabulary on
    two logical cores; one position leaves core 0 with no rows (the suite's smallest case)."""
    monkeypatch.setenv(simulator.NC_VERSION_ENV, "gen3")
    import nki

    loss = _import_nkilib("nkilib_src.nkilib.experimental.loss")
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(positions, 3000)).astype(np.float32)
    targets = rng.integers(0, 3000, size=positions).astype(np.int32)
    result, lse = nki.cpu_simulate(loss.cross_entropy_forward)[2](
        logits_hbm=logits, targets_hbm=targets, chunk_size=1024, dtype=nl.float32
    )
    expected_lse = np.log(np.exp(logits.astype(np.float64)).sum(axis=1))
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-5)
    np.testing.assert_allclose(
        result, expected_lse - logits[np.arange(positions), targets], rtol=1e-4, atol=1e-4
    )


@needs_tree
def test_nkilib_find_nonzero_indices(hooked, monkeypatch):
    """core/subkernels: per column, the row indices of its nonzero entries and their count,
    through nonzero_with_count on a 3-D tile."""
    monkeypatch.setenv(simulator.NC_VERSION_ENV, "gen3")
    import nki

    kernel = _import_nkilib("nkilib_src.nkilib.core.subkernels.find_nonzero_indices")
    rng = np.random.default_rng(2)
    x = (rng.random((512, 8)) < 0.3).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing device-ran-it about this kernel
        indices, counts = nki.cpu_simulate(kernel.find_nonzero_indices)[2](
            input_tensor=x, chunk_size=256
        )
    for column in range(8):
        rows = np.flatnonzero(x[:, column])
        assert counts.reshape(-1)[column] == rows.size
        assert np.array_equal(indices[column, : rows.size], rows)


def test_nc_versions_are_ordered_among_themselves_and_against_their_numbers():
    gen2, gen3, gen4 = nisa.nc_version.gen2, nisa.nc_version.gen3, nisa.nc_version.gen4
    assert gen2 < gen3 <= gen3 < gen4 and gen4 >= gen3 and gen4 > 3 and gen3 >= 3
    assert (
        min(gen3, 2) == 2 and not gen3 >= gen4 and sorted([gen4, gen2, gen3]) == [gen2, gen3, gen4]
    )
    assert gen3 != 3  # still an enum: equal only to itself
    with pytest.raises(TypeError):
        assert gen3 < "gen4"
    with pytest.raises(TypeError):
        assert gen3 < True


@pytest.mark.parametrize(("fill", "accepted"), [(-3.4028235e38, True), (-3.0e38, False)])
def test_range_select_takes_fp32_min_as_the_reference_writes_it(fill, accepted):
    """The reference's FP32_MIN literal (nki-library's attention kernels pass it) is the
    float32 minimum once rounded; another fill is refused."""
    x = np.arange(8, dtype=np.float32).reshape(1, 8)

    def kernel(x):
        selected = nl.ndarray((1, 8), dtype=nl.float32)
        nisa.range_select(
            dst=selected,
            on_true_tile=nl.load(x),
            comp_op0=nl.greater_equal,
            comp_op1=nl.less,
            bound0=nl.full((1, 1), 2.0, nl.float32),
            bound1=nl.full((1, 1), 5.0, nl.float32),
            on_false_value=fill,
        )
        out = nl.ndarray((1, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, selected)
        return out

    if not accepted:
        with pytest.raises(errors.UnsupportedOperator, match="FP32_MIN"):
            simulator.simulate(kernel)(x)
        return
    minimum = np.finfo(np.float32).min
    expected = np.where((x >= 2) & (x < 5), x, minimum)
    np.testing.assert_array_equal(simulator.simulate(kernel)(x), expected)


def test_on_chip_views_stay_two_dimensional_under_integer_indices():
    """nki-language-guide.rst@81ce03a, "Tensor Indexing": integers on every free axis keep the
    last at size 1; nki-library's attention_cte.py:2734-2745 (d2ad3a5) takes a range_select
    bound as ``ubs[:num_p, group]`` and indexes it again with ``[:num_p, :1]``."""
    bounds = np.arange(6, dtype=np.float32).reshape(2, 3)

    def kernel(bounds):
        cube = nl.ndarray((4, 5, 6), dtype=nl.float32)
        assert (cube[:, 0].shape, cube[:, 0, 1].shape, cube[0, 0, 1].shape) == (
            (4, 6),
            (4, 1),
            (1, 1),
        )
        upper = nl.load(bounds)[:2, 2]
        out = nl.ndarray((2, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        assert out[0, 0].shape == (1,)  # HBM views stay at least 1-D
        nl.store(out, upper[:2, :1])
        return out

    np.testing.assert_array_equal(simulator.simulate(kernel)(bounds), bounds[:, 2:])


@pytest.mark.parametrize(
    ("target", "is_transpose", "accepted"),
    [("trn2", True, True), ("trn2", False, False), ("trn1", True, False)],
)
def test_transpose_mode_writes_bfloat16_psum_from_neuroncore_v3(
    target, is_transpose, accepted, monkeypatch
):
    """trainium2_arch.rst@81ce03a, "Built-in Transpose Support": from NeuronCore-v3 a bf16
    transpose writes bf16 PSUM (nki-library@d2ad3a5 bwmm_shard_on_I.py:767-782 on trn2); a
    plain matmul still writes float32 there."""
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", target)
    x = (np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5).astype(ml_dtypes.bfloat16)

    def kernel(x):
        tile = nl.load(x)
        identity = nl.shared_identity_matrix(3, dtype=nl.bfloat16)
        transposed = nl.ndarray((4, 3), dtype=nl.bfloat16, buffer=nl.psum)
        nisa.nc_matmul(transposed, tile, identity, is_transpose=is_transpose)
        out = nl.ndarray((4, 3), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        nl.store(out, nl.copy(transposed))
        return out

    if not accepted:
        with pytest.raises(errors.UnsupportedDtype, match="float32 PSUM"):
            simulator.simulate(kernel)(x)
        return
    np.testing.assert_array_equal(simulator.simulate(kernel)(x), x.T)


def test_nki_object_subclasses_get_the_compilers_default_initializer():
    """nki-language-guide.rst, "Class Support": with or without @dataclass, one parameter per
    field defaulting to its class value (None without one), then __post_init__; plain class
    attributes are fields too (nki-library's SectionParams); a frozen dataclass stays frozen."""

    @dataclasses.dataclass
    class Section(nl.NKIObject):
        index = None
        offset = 0

    class Toggle(nl.NKIObject):
        x: int
        y: bool = False

        def __post_init__(self):
            self.doubled = None if self.x is None else 2 * self.x

    @dataclasses.dataclass(frozen=True)
    class Limits(nl.NKIObject):  # nki-library's TopkHardwareParams, ClampLimits
        upper: float = None

    section = Section(index=3)
    assert (Limits().upper, Limits(2.0).upper) == (None, 2.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Limits().upper = 1.0
    assert (section.index, section.offset) == (3, 0)
    toggle = Toggle(4)
    assert (toggle.x, toggle.y, toggle.doubled) == (4, False, 8)
    assert (Toggle().x, Toggle(1, True).y, Toggle(1, extra=5).extra) == (None, True, 5)
    with pytest.raises(TypeError):
        Toggle(1, True, 3)
    with pytest.raises(TypeError):
        Toggle(1, x=2)


def test_dma_transpose_of_float32_runs_with_a_warning(monkeypatch):
    """The reference allows 2-byte dtypes; nki-library's float32 kernels transpose 4-byte data."""
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)

    def kernel(x):
        tile = nl.ndarray((4, 3), dtype=nl.float32)
        nisa.dma_transpose(dst=tile, src=x)
        out = nl.ndarray((4, 3), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=tile)
        return out

    with pytest.warns(errors.DeviceRanItWarning, match="2-byte"):
        np.testing.assert_array_equal(simulator.simulate(kernel)(x), x.T)


def _report(nodeid: str, when: str, outcome: str, **extra: object) -> object:
    """A stand-in for pytest's TestReport: the fields the results recorder reads."""
    fields = dict(nodeid=nodeid, when=when, outcome=outcome, longrepr=None, **extra)
    fields.update(passed=outcome == "passed", failed=outcome == "failed")
    fields.update(skipped=outcome == "skipped")
    return type("Report", (), fields)()


def test_results_count_a_case_by_its_call_not_its_passing_setup_or_teardown(monkeypatch):
    monkeypatch.setattr(nkilib_suite, "_outcomes", {})
    monkeypatch.setattr(nkilib_suite, "_messages", {})
    root = "integration/nkilib/core/x/test_x.py::test_"
    phases = {
        "skipped": [("setup", "skipped"), ("teardown", "passed")],
        "passed": [("setup", "passed"), ("call", "passed"), ("teardown", "passed")],
        "failed": [("setup", "passed"), ("call", "failed"), ("teardown", "passed")],
        "error": [("setup", "passed"), ("call", "passed"), ("teardown", "failed")],
    }
    for name, reports in phases.items():
        for when, outcome in reports:
            nkilib_suite.pytest_runtest_logreport(_report(root + name, when, outcome))
    assert nkilib_suite._outcomes == {root + name: name for name in phases}
    cases = {n: (o, nkilib_suite._messages.get(n, "")) for n, o in nkilib_suite._outcomes.items()}
    page = nkilib_suite.results_markdown(cases, "run")
    assert "**1 of 3 cases passed (33.3%)**" in page
    assert "| core/x/test_x.py | 1 | 1 | 0 | 0 | 1 | 1 |" in page
    assert "## Test files not collected" in page
    # another checkout (--nkilib-tree) has none of the snapshot's gaps
    assert "## Test files not collected" not in nkilib_suite.results_markdown(
        cases, "run", snapshot=False
    )


def test_another_nkilib_checkout_runs_without_the_snapshots_lists(tmp_path, capsys):
    assert nkilib_suite._is_snapshot(tmp_path / nkilib_suite.FOLDER)
    assert not nkilib_suite._is_snapshot(tmp_path / "nki-library")
    status = nkilib_suite.main(["--nkilib-tree", str(tmp_path)])
    assert status == pytest.ExitCode.USAGE_ERROR
    assert "not an nki-library checkout" in capsys.readouterr().out


@pytest.mark.parametrize(
    "outcome, message, rerun",
    [
        ("failed", "numpy._core._exceptions._ArrayMemoryError: Unable to allocate 80.0 MiB", True),
        ("failed", "RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried", True),
        (
            "error",
            "InferenceException: [enforce fail] Error code 12 (Cannot allocate memory)",
            True,
        ),
        ("failed", "test.utils.exceptions.InferenceException: can't start new thread", True),
        ("failed", "ValidationException: Unable to allocate 48.0 MiB for an array", True),
        ("failed", "MemoryError: Unable to allocate 2.91 GiB\n...\nE   AssertionError", True),
        ("failed", "AssertionError: outputs differ", False),
        ("xfailed", "MemoryError", False),
        ("passed", "", False),
    ],
)
def test_cases_that_ran_out_of_memory_are_run_again_alone(outcome, message, rerun):
    assert nkilib_suite.out_of_memory(outcome, message) is rerun


def test_the_plugin_lists_a_case_that_ran_out_of_memory_by_its_whole_report(monkeypatch):
    for name, value in (("_outcomes", {}), ("_messages", {}), ("_out_of_memory", set())):
        monkeypatch.setattr(nkilib_suite, name, value)
    report = _report("integration/nkilib/x/test_x.py::test_negative", "call", "failed")
    report.longrepr = "MemoryError: Unable to allocate 2.91 GiB\n\nE   AssertionError"
    nkilib_suite.pytest_runtest_logreport(report)
    assert nkilib_suite._out_of_memory == {report.nodeid}


def _gather_ranks(input, replica_group, num_ranks):
    """test_collectives.py@d2ad3a5's all_gather_hbm_kernel: every rank's rows, rank order."""
    from asickernels.simulate.nki import collectives as ncc

    src = nl.ndarray(input.shape, dtype=input.dtype, buffer=nl.shared_hbm, name="src")
    dst = nl.ndarray(
        (input.shape[0] * num_ranks, input.shape[1]),
        dtype=input.dtype,
        buffer=nl.shared_hbm,
        name="dst",
    )
    out = nl.ndarray(dst.shape, dtype=input.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=src, src=input)
    ncc.all_gather(dsts=[dst], srcs=[src], replica_group=replica_group, collective_dim=0)
    nisa.dma_copy(dst=out, src=dst)
    return out


@pytest.mark.parametrize("lnc", [1, 2])
def test_collective_cases_run_every_rank_with_its_own_inputs(lnc):
    """The suite's multi-rank cases (collective_ranks > 1): rank r runs on its own inputs (a
    PerRankLazyInputGenerator's for_rank(r)), its ".must_alias_input" names stripped, and
    its outputs come back under the golden's names and dtypes."""
    from asickernels.simulate.nki.collectives import ReplicaGroup

    ranks = 2
    x = np.random.default_rng(3).normal(size=(ranks, 4, 8)).astype(np.float32)
    group = ReplicaGroup([list(range(ranks))])
    inputs = [
        {"input.must_alias_input": x[r], "replica_group": group, "num_ranks": ranks}
        for r in range(ranks)
    ]
    golden = [{"out": np.zeros((ranks * 4, 8), np.float64)} for _ in range(ranks)]
    outputs = nkilib_suite.rank_outputs(_gather_ranks, lnc, "gen3", inputs, golden)
    for rank in range(ranks):
        assert list(outputs[rank]) == ["out"] and outputs[rank]["out"].dtype == np.float64
        np.testing.assert_array_equal(outputs[rank]["out"], x.reshape(ranks * 4, 8))
    with pytest.raises(RuntimeError, match="rank 0's kernel returned 1 outputs but expected 2"):
        nkilib_suite.rank_outputs(_gather_ranks, lnc, "gen3", inputs, [{"a": 0, "b": 0}] * 2)


def test_a_case_beyond_its_workers_memory_share_fails_with_a_memory_error():
    """Each process running cases is capped at its share of physical memory: an allocation
    beyond it raises a MemoryError naming its size instead of drawing the OOM killer."""
    script = (
        "import os, numpy as np, nkilib_suite\n"
        "physical = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')\n"
        "workers = max(1, int(physical * nkilib_suite.MEMORY_SHARE // 2**31))\n"
        "cap = nkilib_suite.limit_memory(workers)\n"
        "assert cap == int(physical * nkilib_suite.MEMORY_SHARE / workers), cap\n"
        "np.ones(2**24)\n"  # 128 MiB: within the share
        "try:\n"
        "    np.ones(cap // 8)\n"
        "except MemoryError as error:\n"
        "    print(error)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(nkilib_suite.__file__).parent,
    )
    assert "Unable to allocate" in done.stdout and "GiB" in done.stdout, done.stdout


@pytest.mark.parametrize("quantization, known", [("0", False), ("1", False), ("2", True)])
def test_attention_block_cases_with_row_quantization_are_known_failures(quantization, known):
    """test_attn_blk_model's golden fails for QuantizationType.ROW (2) whatever the kernel
    does: read from the 20th field of the case id (AttnBlkTestConfig.test_id())."""
    fields = "16-1-128-5376-None-1024-1024-1-32-True-False-True-False-True-True-True-False-False"
    node = (
        "integration/nkilib/experimental/transformer/test_attention_block_tkg.py::"
        f"TestRangeAttnBlk::test_attn_blk_model[MODEL_WIP_OPTIMAL_{fields}-bfloat16-"
        f"{quantization}-2-False-True-False-False-False-None-True-True-default-1-1-False]"
    )
    reason = nkilib_suite._known_failure(node)
    assert (reason is not None and "qkv_tkg_torch.py:166" in reason) is known
