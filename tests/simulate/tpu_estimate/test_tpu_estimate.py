"""The TPU schedule estimate: the listing parser and walk (on small synthetic listings and on
real libtpu dumps stored under tests/data/tpu_dumps), the seed-equivalent kernels, and one
real compile (slow)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import DATA, REPO

from asickernels import tpu_generations
from asickernels.estimates import command, tpu_cases, tpu_report
from asickernels.kernels.nms import greedy_nms
from asickernels.simulate import tpu_compile
from asickernels.simulate.tpu_estimate import cases as tpu_cost_cases
from asickernels.simulate.tpu_estimate import estimate as tpu_cost
from asickernels.simulate.tpu_estimate import parsing, roofline
from asickernels.simulate.tpu_estimate import seed_kernels as seeds
from asickernels.simulate.tpu_estimate import walk as walking

DUMPS = DATA / "tpu_dumps"
STREAM_BYTES = 2 * 1024 * 512 * 4  # the stored stream kernel reads and writes 1024x512 f32


# -- synthetic listings ------------------------------------------------------------------------


def listing(*bundles: tuple[str, str, str]) -> str:
    """Bundles as (marker, ops joined by ' ;; ', trailing comment) in the libtpu format."""
    lines = ["= control target key start", "LB: loop body", "= control target key end", ""]
    for address, (marker, ops, trailer) in enumerate(bundles):
        label = f"{address:#x}" if address else "0"
        comment = f" /* {trailer} */" if trailer else ""
        lines.append(f"{label:>6} {marker:2}: {{ {ops} }}{comment}")
    return "\n".join(lines) + "\n"


DELAY = ("", "", "")  # an empty branch delay slot


def branch_and_delay_slots(op: str) -> tuple[tuple[str, str, str], ...]:
    """The bundle of the branch ``op`` and its 4 empty delay slots, as libtpu lays them out
    (before v7x's 6)."""
    return (("", op, ""), DELAY, DELAY, DELAY, DELAY)


def counted_loop(trips: int) -> str:
    """s0 counts 1..trips; the back-edge is taken while s0 < trips."""
    return listing(
        ("", "%s1_s0 = smov 0", ""),
        ("LB", "%s2_s0 = sadd.s32 1, %s1_s0", "Start region 5"),
        ("", f"%p3_p0 = scmp.ge.s32.totalorder %s2_s0, {trips} /* loop exit test */", ""),
        *branch_and_delay_slots("%4 = sbr.rel (!%p3_p0) target = $region5"),
        ("", "%5 = vsyncpa [#allocation1], 1", ""),
    )  # fmt: skip


def walk(text: str, **options: object) -> walking.Walker:
    dump = parsing.Dump({"TLP": parsing.parse_program("TLP", text)}, {})
    walker = walking.Walker(dump, bytes_per_cycle=options.pop("bytes_per_cycle", 32.0), **options)  # type: ignore[arg-type]
    walker.run()
    return walker


def test_counted_loop_runs_its_trips_with_delay_slots() -> None:
    walker = walk(counted_loop(3))
    # 1 bundle, 3 x (3 body bundles + 4 delay slots), 1 exit bundle.
    assert walker.machine.now == 1 + 3 * 7 + 1
    (loop,) = walking.loop_tree(walker.dump.programs["TLP"])
    assert (loop.start, loop.end) == (1, 7)
    (walked,) = walker.loops["TLP"]
    assert walked.entries == 1 and walked.trips == 3
    assert walker.executions("TLP")[:3] == [1, 3, 3]


def test_long_loop_is_extrapolated_exactly_for_a_uniform_body() -> None:
    trips = 5 * walking.LOOP_SAMPLE_END
    walker = walk(counted_loop(trips))
    assert walker.machine.now == pytest.approx(1 + trips * 7 + 1)
    assert walker.machine.walked < 2 * walking.LOOP_SAMPLE_END * 7
    assert walker.loops["TLP"][0].trips == pytest.approx(trips)


def predicated(skip: bool) -> str:
    return listing(
        ("", f"%s1_s1 = smov {1 if skip else 0}", ""),
        ("", "%p2_p0 = scmp.ne.s32.totalorder %s1_s1, 0", ""),
        *branch_and_delay_slots("%3 = sbr.rel (%p2_p0) target = $region7"),
        ("", "%v4_v0 = vadd.f32 %v1_v1, %v2_v2", ""),
        ("", "%v5_v0 = vadd.f32 %v1_v1, %v2_v2", ""),
        ("PF", "%6 = vsyncpa [#allocation1], 1", "Start/End empty region 7"),
    )  # fmt: skip


def test_predicated_region_runs_only_when_its_branch_falls_through() -> None:
    assert walk(predicated(skip=True)).machine.now == 8
    assert walk(predicated(skip=False)).machine.now == 10


def test_unknown_forward_branch_runs_its_region_and_is_counted() -> None:
    text = predicated(skip=True).replace("smov 1", "spop %9")
    walker = walk(text)
    assert walker.machine.now == 10
    assert walker.machine.unresolved_branches == 1


def test_predicated_move_keeps_the_old_value_when_off() -> None:
    text = listing(
        ("", "%s1_s1 = smov 7  ;;  %p2_p1 = pmov 0", ""),
        ("", "%s3_s1 = smov (%p2_p1, %s1_s1), 0", ""),
        ("", "%s4_s2 = sadd.s32 %s3_s1, 1", ""),
    )
    assert walk(text).machine.registers["s2"] == 8


def test_bundle_reads_happen_before_its_writes() -> None:
    text = listing(
        ("", "%s1_s1 = smov 1  ;;  %s2_s2 = smov 2", ""),
        ("", "%s3_s1 = smov %s2_s2  ;;  %s4_s2 = smov %s1_s1", ""),
    )
    registers = walk(text).machine.registers
    assert (registers["s1"], registers["s2"]) == (2, 1)


def dma_then_wait(granules: int) -> tuple[tuple[str, str, str], ...]:
    """Three bundles (for :func:`listing`): s5 = 0, a fetch of ``granules`` from HBM address s5
    to VMEM address s5, and the wait for it."""
    return (
        ("", "%s1_s5 = smov 0", ""),
        ("", f"%2 = dma.hbm_to_vmem [thread:$0]  /*hbm=*/%s1_s5, /*size_in_granules=*/{granules}, "
             "/*vmem=*/%s1_s5, /*dst_syncflagno=*/[#allocation3]", ""),
        ("", f"%3 = dma.done.wait [#allocation3], {granules} /* local-dma-wait */", ""),
    )  # fmt: skip


def test_dma_wait_stalls_for_bytes_over_bandwidth_plus_latency() -> None:
    granules = 1024
    nbytes = granules * walking.GRANULE_BYTES
    walker = walk(listing(*dma_then_wait(granules)), bytes_per_cycle=32.0, dma_latency_cycles=100.0)
    # Issued at cycle 1, done at 1 + bytes/32 + 100, then the wait bundle itself.
    assert walker.machine.now == pytest.approx(1 + nbytes / 32 + 100 + 1)
    assert walker.machine.hbm_bytes == nbytes
    assert walker.machine.dma_wait_cycles == pytest.approx(nbytes / 32 + 100 - 1)


def data_dependent_loop() -> str:
    return listing(
        ("LB", "%s1_s0 = spop %7", "Start region 3"),
        ("", "%p2_p0 = scmp.lt.s32.totalorder %s1_s0, 5", ""),
        *branch_and_delay_slots("%3 = sbr.rel (%p2_p0) target = $region3"),
    )  # fmt: skip


def test_data_dependent_loop_uses_the_given_trips_else_one() -> None:
    assert walk(data_dependent_loop()).loops["TLP"][0].trips == 1
    walker = walk(data_dependent_loop(), loop_trips={"TLP": {0: [4, 2]}})
    assert walker.loops["TLP"][0].trips == 4
    assert walker.machine.now == 4 * 7
    assert any("trips given" in note for note in walker.machine.unresolved_loops)


def test_calls_walk_the_callee_every_time() -> None:
    top = listing(
        ("", "%1 = inlined_call /* %k.1 = custom-call(%x) */", ""),
        ("", "%2 = inlined_call /* %k.2 = custom-call(%x) */", ""),
    )
    callee = listing(("", "", ""), ("", "", ""), ("", "", ""))
    dump = parsing.Dump(
        {"TLP": parsing.parse_program("TLP", top), "k.1": parsing.parse_program("k.1", callee)},
        {"k.2": "k.1"},
    )
    walker = walking.Walker(dump, bytes_per_cycle=1.0)
    assert walker.run() == 2 + 2 * 3
    assert walker.stats["k.1"].calls == 2


@pytest.mark.parametrize(
    ("condition", "bound", "counter", "step", "expected"),
    [
        ("ge", 10, 3, 1, 7),
        ("ge", 10, 3, 2, 4),
        ("lt", 10, 3, 1, 7),
        ("eq", 10, 4, 2, 3),
        ("ne", 10, 4, 2, 3),
    ],
)
def test_remaining_iterations(
    condition: str, bound: int, counter: int, step: int, expected: int
) -> None:
    # The back-edge is taken while the compare says "continue": not (counter >= bound) etc.
    continue_when = condition in ("lt", "ne")
    test = walking._ExitTest(condition, True, "s0", bound, continue_when)
    assert walking._remaining_iterations(test, counter, step, bound) == expected
    # A bound held in a register (a grid sized at run time) gives the same trips.
    in_register = walking._ExitTest(condition, True, "s0", "s1", continue_when)
    assert walking._remaining_iterations(in_register, counter, step, bound) == expected


def test_parse_errors_are_clear() -> None:
    with pytest.raises(parsing.ScheduleError, match="no bundles"):
        parsing.parse_bundles("nothing here")
    with pytest.raises(parsing.ScheduleError, match="gaps"):
        parsing.parse_bundles(listing(DELAY).replace("     0   :", "   0x1   :"))
    with pytest.raises(parsing.ScheduleError, match="no top-level program"):
        parsing.load_dump(DUMPS)


# -- stored real dumps -------------------------------------------------------------------------


def stored_dump(name: str, tmp_path: Path) -> Path:
    with tarfile.open(DUMPS / f"{name}.tar.gz") as archive:
        archive.extractall(tmp_path, filter="data")
    return tmp_path


def analysis_total(folder: Path, program: str) -> int:
    (path,) = folder.glob(f"*-{program}-*-schedule-analysis_final_bundles.txt")
    line = next(line for line in path.read_text().splitlines() if "total scheduled bundles" in line)
    return int(line.split(":")[1])


def test_stored_dump_parses_to_the_compilers_bundle_counts(tmp_path: Path) -> None:
    folder = stored_dump("stream_v5e", tmp_path)
    dump = parsing.load_dump(folder)
    assert set(dump.programs) == {
        "TLP",
        "function.1",
        "<late-initialization>",
        "<late-finalization>",
    }
    assert dump.mosaic_kernels == {"function.1"}
    for name, program in dump.programs.items():
        assert len(program.bundles) == analysis_total(folder, name)
        assert len(program.utilization) == len(program.bundles)
    assert (
        dict(
            zip(
                *[dump.programs["function.1"].units, dump.programs["function.1"].capacity],
                strict=True,
            )
        )["MXU"]
        == 4
    )


def test_stream_kernel_grid_loop_and_bandwidth_bound(tmp_path: Path) -> None:
    dump = parsing.load_dump(stored_dump("stream_v5e", tmp_path))
    estimate = tpu_cost.estimate_dump(dump, "v5e", dma_latency_s=0.0)
    # Grid of 4 row blocks, software-pipelined over 2 extra stages.
    assert any("loop #0" in line and "6.0 trips" in line for line in estimate.loops)
    assert estimate.hbm_bytes == STREAM_BYTES
    bound = STREAM_BYTES / tpu_generations.get("v5e").hbm_bytes_per_s
    assert bound <= estimate.kernel_s <= 1.15 * bound
    assert estimate.dma_wait_cycles > estimate.schedule_cycles  # memory-bound
    assert 0 < estimate.utilization["VSTORE"] < 1


def test_seed_nms_dump_counts_one_grid_step_per_output(tmp_path: Path) -> None:
    dump = parsing.load_dump(stored_dump("seed_nms_256_v5e", tmp_path))
    estimate = tpu_cost.estimate_dump(dump, "v5e")
    assert estimate.kernels == ("nms_pallas.1",)
    assert any(
        line.startswith("nms_pallas.1 loop #0") and "18.0 trips" in line for line in estimate.loops
    )
    assert estimate.device_s > estimate.kernel_s > 0
    assert estimate.per_call_s == pytest.approx(estimate.device_s + tpu_cost.CALL_OVERHEAD_S)
    slower = tpu_cost.estimate_dump(dump, "v5e", dma_latency_s=10 * tpu_cost.DMA_LATENCY_S)
    assert slower.device_s > estimate.device_s


def stream_row(tmp_path: Path, **case_fields: object) -> tpu_report.Row:
    dump = parsing.load_dump(stored_dump("stream_v5e", tmp_path))
    estimate = tpu_cost.estimate_dump(dump, "v5e", case="stream")
    case = tpu_cost_cases.stream_case()
    return tpu_report.Row(dataclasses.replace(case, **case_fields), estimate)  # type: ignore[arg-type]


def test_markdown_says_estimates_not_measurements(tmp_path: Path) -> None:
    row = stream_row(tmp_path, op="stream", impl="pallas_tpu")
    record = tpu_report.normalize(row.as_json())
    text = "\n".join(tpu_report.markdown_document(["v5e"], [record], None, []))
    assert "not measurements" in text
    assert f"| {row.case.name} | stream | pallas_tpu | v5e |" in text


def test_json_row_has_the_documented_fields_and_flags_a_walk_below_the_roofline(
    tmp_path: Path,
) -> None:
    row = stream_row(tmp_path, op="stream", impl="pallas_tpu", shape="1024x512")
    fields = row.as_json()
    assert set(fields) == {
        "name", "op", "impl", "shape", "generation", "program_ms", "kernel_ms",
        "roofline_ms", "calibrated_ms", "mxu_stall_ms", "below_floor",
    }  # fmt: skip
    assert fields["roofline_ms"] == pytest.approx(STREAM_BYTES / 819e9 * 1e3)
    assert fields["program_ms"] >= fields["roofline_ms"] and not row.below_roofline
    # An estimate twice as fast as the bytes allow is flagged, never clamped.
    faster = tpu_report.Row(
        dataclasses.replace(row.case, work=roofline.Work(4 * STREAM_BYTES)), row.estimate
    )
    assert faster.below_roofline
    flagged = tpu_report.normalize(faster.as_json())
    assert flagged["below_floor"] and flagged["program_ms"] == fields["program_ms"]
    assert "(below floor)" in "\n".join(tpu_report.estimates_markdown([flagged]))


RECORDED = REPO / "benchmarks" / "results" / "tpu_estimates" / "estimates.json"


def test_recorded_estimates_are_never_below_their_roofline() -> None:
    if not RECORDED.exists():
        pytest.skip(f"{RECORDED} not recorded (asickernels estimate --json PATH)")
    rows = [tpu_report.normalize(row) for row in json.loads(RECORDED.read_text())]
    assert rows
    low = [(r["name"], r["generation"]) for r in rows if r["below_floor"]]
    assert not low, low


def test_roofline_bounds() -> None:
    # 8192^3 int8 on v5e is MXU-bound: 2 * 8192^3 / 394e12.
    work = roofline.matmul(8192, 8192, 8192, dtype="int8", out_bytes=4)
    assert work.seconds("v5e") == pytest.approx(2 * 8192**3 / 394e12)
    # Decode (M = 1) is bound by the weight bytes.
    assert roofline.matmul(1, 4096, 4096, dtype="int8", out_bytes=4).seconds(
        "v5e"
    ) == pytest.approx((4096 * 4096 + 4096 + 4 * 4096) / 819e9)
    assert roofline.giou(10**6, gradient=False).seconds("v6e") == pytest.approx(36e6 / 1640e9)


# -- cases and the command ---------------------------------------------------------------------


def test_register_cli_adds_estimate() -> None:
    parser = argparse.ArgumentParser()
    command.register_cli(parser.add_subparsers())
    args = parser.parse_args(["estimate", "--generation", "v6e", "--markdown", "out.md"])
    assert args.generation == ["v6e"] and args.markdown == "out.md" and callable(args.handler)
    with pytest.raises(SystemExit):
        parser.parse_args(["estimate", "--generation", "v9"])


def test_unknown_generation_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown generation"):
        tpu_cost.compile_with_dumps(tpu_cost_cases.stream_case(), "v9", tmp_path)


def test_nms_case_takes_its_trips_from_the_kernels_model() -> None:
    from asickernels.backends.pallas_tpu import nms

    case = tpu_cases.nms_case(256)
    boxes, scores = seeds.seed_nms_inputs()
    model = nms.loop_trips(
        boxes, scores, tile=256, iou_threshold=seeds.SEED_NMS_IOU_THRESHOLD,
        max_output_size=seeds.SEED_NMS_OUTPUTS,
    )  # fmt: skip
    ((program, trips),) = case.loop_trips
    assert program == tpu_cases.NMS_PROGRAM
    assert dict(trips) == {0: model.tiles, 1: model.cross[1:], 2: model.passes}


# -- the seed-equivalent kernels ---------------------------------------------------------------


def test_seed_nms_designs_keep_what_the_reference_keeps() -> None:
    boxes, scores = seeds.seed_nms_inputs(64, seed=3)
    indices, count = greedy_nms(
        boxes[None], scores[None], None, iou_threshold=seeds.SEED_NMS_IOU_THRESHOLD,
        max_output_size=64, score_threshold=-math.inf,
    )  # fmt: skip
    expected = sorted(indices[0, : count[0]])
    kept_jax = np.asarray(
        seeds.nms_jax(jnp.asarray(boxes), jnp.asarray(scores), max_output_size=64)
    )
    kept_pallas = np.asarray(
        seeds.nms_pallas(
            jnp.asarray(boxes), jnp.asarray(scores), max_output_size=64, interpret=True
        )
    )[0]
    assert sorted(np.flatnonzero(kept_jax)) == expected
    assert sorted(np.flatnonzero(kept_pallas)) == expected


def test_seed_matmuls_match_numpy() -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (256, 384), dtype=np.int8)
    y = rng.integers(-128, 128, (384, 256), dtype=np.int8)
    product = seeds.matmul_pallas(
        jnp.asarray(x), jnp.asarray(y), bm=128, bk=128, bn=128, interpret=True
    )
    np.testing.assert_array_equal(np.asarray(product), x.astype(np.int64) @ y.astype(np.int64))
    xb, yb = (jnp.asarray(a, jnp.bfloat16) for a in (x / 64, y / 64))
    floats = seeds.matmul_pallas(xb, yb, bm=128, bk=128, bn=128, interpret=True)
    np.testing.assert_allclose(
        np.asarray(floats, np.float32),
        np.asarray(xb, np.float32) @ np.asarray(yb, np.float32),
        rtol=2e-2,
        atol=0.5,
    )


def test_seed_cases_reject_bad_arguments() -> None:
    with pytest.raises(ValueError, match="variant"):
        seeds.nms_case("cuda")
    with pytest.raises(ValueError, match="divide"):
        seeds.matmul_case("int8", size=1000)


# -- without libtpu ----------------------------------------------------------------------------


def test_lowering_without_libtpu_says_what_to_install() -> None:
    """Where libtpu is missing (here its import is blocked in a fresh interpreter, which is
    what jax sees where it was never installed), lowering for a TPU names the tpu extra
    instead of jax's "TPU support not installed"."""
    program = (
        "import sys\n"
        "sys.modules['libtpu'] = None\n"
        "from asickernels.simulate import tpu_compile\n"
        "try:\n"
        "    tpu_compile.lower_for_tpu(lambda x: x + 1, [((4,), 'float32')], 'v5e')\n"
        "except ModuleNotFoundError as error:\n"
        "    print(error)\n"
    )
    env = {name: value for name, value in os.environ.items() if name != "TPU_LIBRARY_PATH"}
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=env, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    assert "cannot compile for TPU v5e here: libtpu is not installed" in done.stdout
    assert 'pip install -e ".[tpu]"' in done.stdout


# -- one real compile --------------------------------------------------------------------------


@pytest.mark.slow
def test_real_compile_of_the_stream_kernel_is_bandwidth_bound() -> None:
    missing = tpu_compile.libtpu_status()
    if missing:
        pytest.skip(missing)
    estimate = tpu_cost.estimate_case(tpu_cost_cases.stream_case(), "v5e")
    bound = STREAM_BYTES / tpu_generations.get("v5e").hbm_bytes_per_s
    assert bound <= estimate.kernel_s <= 1.3 * bound
    assert estimate.kernels
