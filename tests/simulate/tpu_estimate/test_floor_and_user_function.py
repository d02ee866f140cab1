"""The estimate never beats physics (MXU occupancy, HBM bytes) and states what it assumed
(TensorCore splits, data-dependent loops); the estimate of a user's own function."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from conftest import REPO
from test_tpu_estimate import branch_and_delay_slots, listing, walk

from asickernels import tpu_generations
from asickernels.estimates import command, tpu_cases, tpu_report
from asickernels.simulate import tpu_compile
from asickernels.simulate.tpu_estimate import cases, observed, program_facts, user_function
from asickernels.simulate.tpu_estimate import estimate as cost
from asickernels.simulate.tpu_estimate import seed_kernels as seeds

GUIDE = REPO / "docs" / "tpu-compile-and-estimates.md"


# -- MXU occupancy -----------------------------------------------------------------------------


def pushes(*units: str) -> str:
    return listing(
        *[("", f"%{i} = vmatmul.bf16.gmra.{unit} %v1_v1", "") for i, unit in enumerate(units)]
    )


def test_a_push_to_a_busy_mxu_stalls_until_it_is_free() -> None:
    walker = walk(pushes("mxu0", "mxu0", "mxu0"), mxu_op_cycles={"bf16": 16.0})
    # Pushes at 0, 16, 32; the last bundle ends at 33.
    assert walker.machine.now == 33
    assert walker.machine.mxu_stall_cycles == 30
    assert walker.machine.mxu_pushes == 3


def test_pushes_to_different_mxus_overlap() -> None:
    walker = walk(pushes("mxu0", "mxu1", "mxu2", "mxu3"), mxu_op_cycles={"bf16": 16.0})
    assert walker.machine.now == 4 and walker.machine.mxu_stall_cycles == 0


def test_without_rates_pushes_cost_only_their_bundle() -> None:
    assert walk(pushes("mxu0", "mxu0")).machine.now == 2
    walker = walk(pushes("mxu0", "mxu0"), mxu_op_cycles={"s8": 16.0})
    assert walker.machine.unknown_mxu_types == {"bf16"}


def test_mxu_stalls_are_extrapolated_with_their_loop() -> None:
    trips = 4 * 1024
    text = listing(
        ("", "%s1_s0 = smov 0", ""),
        ("LB", "%s2_s0 = sadd.s32 1, %s1_s0  ;;  %9 = vmatmul.bf16.gmra.mxu0 %v1_v1", "Start region 5"),
        ("", f"%p3_p0 = scmp.ge.s32.totalorder %s2_s0, {trips}", ""),
        *branch_and_delay_slots("%4 = sbr.rel (!%p3_p0) target = $region5"),
    )  # fmt: skip
    walker = walk(text, mxu_op_cycles={"bf16": 10.0})
    # Each 7-bundle iteration pushes once: 10 cycles per push beat the 7 bundles.
    assert walker.machine.now == pytest.approx(1 + trips * 10, rel=1e-3)
    assert walker.machine.mxu_pushes == pytest.approx(trips)
    assert walker.machine.mxu_stall_cycles == pytest.approx(trips * 3, rel=1e-2)


def test_mxu_push_cycles_follow_the_datasheet_peak() -> None:
    # v5e: a bf16 vreg is 16 rows; 16 x 128 x 128 MACs at 197e12 / 2 / 4 MXUs per second.
    v5e = cost.mxu_op_cycles("v5e")
    assert v5e["bf16"] == pytest.approx(16 * 128 * 128 / (197e12 / 8) * 1.5e9)
    assert v5e["s8"] == pytest.approx(v5e["bf16"])  # twice the rows at twice the rate
    v6e = cost.mxu_op_cycles("v6e")  # two 256x256 MXUs per core
    assert v6e["bf16"] == pytest.approx(16 * 256 * 256 / (918e12 / 4) * 1.75e9)
    # v7x: a device is one TensorCore (two MXUs) with half the chip's peak; fp8 at its own.
    v7x = cost.mxu_op_cycles("v7x")
    assert v7x["bf16"] == pytest.approx(16 * 256 * 256 / (2307e12 / 2 / 4) * 1.9e9)
    assert v7x["e4m3"] == pytest.approx(v7x["bf16"])  # twice the rows at twice the rate
    with pytest.raises(ValueError, match="unknown TPU generation"):
        cost.mxu_op_cycles("v9")


# -- what the jaxpr says ----------------------------------------------------------------------


blocked_matmul = functools.partial(seeds.matmul_pallas, bm=256, bk=256, bn=256)


def test_facts_count_products_per_grid_step_and_read_the_grid_split() -> None:
    specs = [((512, 1024), "bfloat16"), ((1024, 768), "bfloat16")]
    facts = program_facts.program_facts(blocked_matmul, specs)
    (call,) = facts.pallas_calls
    assert call.grid == (2, 3, 4)
    assert call.dimension_semantics == ("parallel", "parallel", "arbitrary")
    assert facts.floor.mxu_bf16_ops == 2 * 512 * 1024 * 768
    assert facts.floor.hbm_bytes == 2 * (512 * 1024 + 1024 * 768 + 512 * 768)
    assert "split over 2 TensorCores along parallel axis 0" in call.megacore("v5p")
    assert "one TensorCore per device" in call.megacore("v5e")
    assert "one TensorCore per device" in call.megacore("v7x")
    stream, stream_specs = cases.stream_builder(1024, 512, 256)  # no dimension_semantics
    (serial,) = program_facts.program_facts(stream, stream_specs).pallas_calls
    assert serial.dimension_semantics is None
    assert "runs on one of v5p's 2 TensorCores" in serial.megacore("v5p")
    assert program_facts.ProgramFacts.from_json(facts.as_json()) == facts


def test_floor_counts_nothing_that_may_not_run() -> None:
    def maybe(x: jax.Array, flag: jax.Array) -> jax.Array:
        return jax.lax.cond(flag, lambda a: a @ a, lambda a: a, x)

    def scanned(x: jax.Array) -> jax.Array:
        return jax.lax.scan(lambda c, _: (c @ c, None), x, length=3)[0]

    square = [((128, 128), "int8")]
    assert program_facts.program_facts(maybe, [*square, ((), "bool")]).floor.mxu_int8_ops == 0
    floor = program_facts.program_facts(scanned, [((1024, 1024), "bfloat16")]).floor
    assert floor.mxu_bf16_ops == 3 * 2 * 1024**3
    assert floor.bound("v5e") == "MXU" and floor.seconds("v5e") == pytest.approx(
        3 * 2 * 1024**3 / 197e12
    )


def test_ragged_dot_floor_meets_each_row_once() -> None:
    def grouped(x: jax.Array, w: jax.Array, sizes: jax.Array) -> jax.Array:
        return jax.lax.ragged_dot(x, w, sizes)

    floor = program_facts.program_facts(
        grouped, [((512, 256), "bfloat16"), ((4, 256, 128), "bfloat16"), ((4,), "int32")]
    ).floor
    assert floor.mxu_bf16_ops == 2 * 512 * 256 * 128


# -- the user's function ------------------------------------------------------------------------


def test_arg_specs_parse_or_name_the_bad_one() -> None:
    assert user_function.parse_arg_spec("bfloat16[1024, 512]") == ((1024, 512), "bfloat16")
    assert user_function.parse_arg_spec("int32[]") == ((), "int32")
    with pytest.raises(ValueError, match="expected DTYPE"):
        user_function.parse_arg_spec("1024x512")
    with pytest.raises(ValueError, match="unknown dtype 'bfloat17'"):
        user_function.parse_arg_spec("bfloat17[4]")


def test_functions_must_be_importable_in_a_fresh_process() -> None:
    reference, path = user_function.function_reference(seeds.matmul_pallas)
    assert reference == f"{seeds.__name__}:matmul_pallas" and path == seeds.__file__
    with pytest.raises(ValueError, match="module level"):
        user_function.function_reference(lambda x: x)
    with pytest.raises(ValueError, match="by keyword"):
        user_function.estimate_function(functools.partial(blocked_matmul, 1))
    with pytest.raises(ValueError, match="example argument"):
        user_function.estimate_function(blocked_matmul, [1, 2], generations=("v5e",))
    with pytest.raises(ValueError, match="generations"):
        user_function.estimate_function(blocked_matmul, generations=("v9",))


def test_the_child_imports_a_module_from_its_file(tmp_path: Path) -> None:
    module = tmp_path / "someone_elses_kernels.py"
    module.write_text("def double(x):\n    return x * 2\n")
    function, specs = user_function.build(
        "someone_elses_kernels:double", [[[4], "float32"]], path=str(module)
    )
    assert specs == [((4,), "float32")] and float(function(jnp.ones(4))[0]) == 2.0


# -- recorded rows --------------------------------------------------------------------------------


def test_rows_recorded_with_the_old_clamp_show_the_walk() -> None:
    old = {
        "name": "bf16 matmul", "op": "bf16_matmul", "impl": "xla", "shape": "8192", "generation": "v5e",
        "program_ms": 5.58, "kernel_ms": None, "roofline_ms": 5.58, "calibrated_ms": 5.70,
        "schedule_ms": 4.40, "floored": True,
    }  # fmt: skip
    row = tpu_report.normalize(old)
    assert row["program_ms"] == 4.40 and row["calibrated_ms"] == pytest.approx(4.52)
    assert row["below_floor"] and "floored" not in row and "schedule_ms" not in row
    text = "\n".join(tpu_report.estimates_markdown([row]))
    assert "4.4000 (below floor)" in text


# -- real compiles (slow) ---------------------------------------------------------------------------


def _libtpu() -> None:
    missing = tpu_compile.libtpu_status()
    if missing:
        pytest.skip(missing)


FLOOR_PROGRAMS = [
    ("bf16 matmul", lambda: cases.xla_matmul_case(1024, 1024, 1024, "bf16")),
    ("int8 matmul", lambda: cases.xla_matmul_case(1024, 1024, 1024, "int8")),
    ("copy-bound stream", lambda: cases.stream_case(2048, 512, 256)),
    # A user's memory-bound Pallas matmul (issue #42: under its HBM floor on v5e and v6e).
    ("HBM-bound Pallas matmul", lambda: cases.blocked_matmul_case(16, 8192, 8192)),
    (
        "MXU-bound Pallas matmul",
        lambda: cases.blocked_matmul_case(2048, 2048, 2048, (512, 1024, 1024)),
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("generation", ["v5e", "v6e", "v5p", "v7x"])
@pytest.mark.parametrize(("what", "make"), FLOOR_PROGRAMS, ids=[p[0] for p in FLOOR_PROGRAMS])
def test_estimates_of_programs_with_a_known_floor_stay_above_it(
    generation: str, what: str, make: object
) -> None:
    _libtpu()
    target = make()  # type: ignore[operator]
    estimate = cost.estimate_case(target, generation)
    floor = target.work.seconds(generation)
    # Never below the floor; at these small sizes the pipeline's prologue and epilogue
    # (one block in, one out, unoverlapped) can take as long as the steady state.
    assert floor <= estimate.device_s <= 4 * floor, (what, estimate.report())
    # The jaxpr's floor is the hand-written one (XLA matmul: same bytes and operations).
    assert estimate.floor_s == pytest.approx(floor, rel=0.02), (what, estimate.floor_s, floor)
    facts = tpu_generations.get(generation)
    hbm_s = target.work.hbm_bytes / facts.per_device(facts.hbm_bytes_per_s)
    assert estimate.floor_bound == ("HBM" if hbm_s == pytest.approx(floor) else "MXU")


def guide_example(tmp_path: Path) -> Path:
    """The guide's example module, as the guide prints it."""
    text = GUIDE.read_text()
    code = re.search(r"```python\n(# someone_elses_matmul\.py.*?)```", text, re.S)
    assert code, "the guide's example is gone"
    path = tmp_path / "someone_elses_matmul.py"
    path.write_text(code.group(1))
    return path


@pytest.mark.slow
def test_the_guides_example_estimates_a_kernel_that_is_not_ours(tmp_path: Path) -> None:
    _libtpu()
    guide_example(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "asickernels", "estimate", "--function", "someone_elses_matmul:matmul",
         "--arg", "bfloat16[2048,2048]", "--arg", "bfloat16[2048,2048]",
         "--generation", "v5e", "--generation", "v5p"],
        capture_output=True, text=True, cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "on TPU v5e" in out and "on TPU v5p" in out and "floor" in out and "per call" in out
    assert "split over 2 TensorCores along parallel axis 0" in out
    devices = [float(t) for t in re.findall(r"device time\s+([\d.]+) ms", out)]
    floors = [float(t) for t in re.findall(r"floor\s+([\d.]+) ms", out)]
    assert len(devices) == len(floors) == 2
    assert all(f <= d for d, f in zip(devices, floors, strict=True))


def test_the_estimate_names_every_branch_and_loop_it_had_to_assume() -> None:
    from test_tpu_estimate import data_dependent_loop, predicated

    from asickernels.simulate.tpu_estimate import parsing

    for text, expected in [
        (
            predicated(skip=True).replace("smov 1", "spop %9"),
            "TLP: 1 branch(es) at bundle 0x2 depend on data",
        ),
        (data_dependent_loop(), "TLP loop #0: data-dependent exit, assumed 1 trip"),
    ]:
        dump = parsing.Dump({"TLP": parsing.parse_program("TLP", text)}, {})
        estimate = cost.estimate_dump(dump, "v5e")
        assert any(expected in line for line in estimate.assumptions), estimate.assumptions
        assert any(expected in line for line in estimate.report().splitlines())
        assert "jaxpr could not be read" in estimate.report()  # no facts given


# -- published timings ----------------------------------------------------------------------------


def test_published_figures_carry_source_method_and_era() -> None:
    from asickernels.simulate.tpu_estimate import published

    timings = published.published_timings()
    assert {t.source for t in timings} == {published.GUIDE, published.SPARSE, published.SEED}
    assert all(t.method and t.era and t.generation == "v5e" and t.seconds > 0 for t in timings)
    assert len({t.target.name for t in timings}) == len(timings)


def test_constants_are_scored_on_the_source_they_were_not_fitted_to() -> None:
    from asickernels.simulate.tpu_estimate import published

    def row(source: str, device_s: float, slope: float, seconds: float) -> published.Walked:
        timing = published.PublishedTiming(
            source, "v5e", published.TIMEIT, "2024", seconds, cases.stream_case()
        )
        return published.Walked(timing, device_s, slope, floor_s=device_s / 2)

    # Source A says the overhead is 100 us; source B says 50 us.
    rows = [row("A", 1e-3, 0.0, 1.1e-3), row("A", 2e-3, 0.0, 2.1e-3), row("B", 1e-3, 0.0, 1.05e-3)]
    validation = published.Validation(
        tuple(rows),
        published.fit(rows),
        {s: published.fit([r for r in rows if r.timing.source != s]) for s in "AB"},
    )
    assert validation.held_out["B"][1] == pytest.approx(100e-6)
    assert validation.held_out["A"][1] == pytest.approx(50e-6)
    assert validation.held_out_errors()[2] == pytest.approx(1.1e-3 / 1.05e-3 - 1)
    assert max(abs(e) for e in validation.in_sample_errors()) < 0.05
    text = "\n".join(published.validation_markdown(validation))
    assert "leave-one-source-out" in text and "below their floor: 0 of 3" in text


def test_cli_takes_a_function_and_its_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    command.register_cli(parser.add_subparsers())
    args = parser.parse_args(
        ["estimate", "--function", "mod:f", "--arg", "bfloat16[8,8]", "--arg", "int8[8]"]
    )
    assert args.function == "mod:f" and args.arg == ["bfloat16[8,8]", "int8[8]"]
    if tpu_compile.libtpu_status():
        pytest.skip("needs libtpu")
    bad = parser.parse_args(["estimate", "--function", "mod:f", "--arg", "8x8"])
    assert bad.handler(bad) == 2
    assert "--arg '8x8': expected DTYPE[D0,D1,...]" in capsys.readouterr().err
    orphan = parser.parse_args(["estimate", "--arg", "int8[8]"])
    assert orphan.handler(orphan) == 2
    assert "--arg needs --function" in capsys.readouterr().err


# -- loops that depend on data, counted from a run ---------------------------------------------


def test_a_run_counts_each_while_loop_entry_in_order() -> None:
    def nested(n: jax.Array) -> jax.Array:
        def outer(carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
            i, total = carry
            inner = jax.lax.while_loop(
                lambda c: c[0] < i, lambda c: (c[0] + 1, c[1] + 1), (0, total)
            )
            return i + 1, inner[1]

        return jax.lax.while_loop(lambda c: c[0] < n, outer, (jnp.int32(1), jnp.int32(0)))[1]

    # The outer loop runs 3 trips (i = 1, 2, 3); its inner loops 1, 2 and 3.
    assert observed.observe(nested, [jnp.int32(4)]).while_trips == (3, 1, 2, 3)
    # Without while loops nothing runs (a large matmul would take minutes on CPU).
    huge = jax.ShapeDtypeStruct((1 << 20, 1 << 20), jnp.bfloat16)
    assert observed.observe(jnp.dot, [huge, huge]).while_trips == ()


def test_the_xla_nms_loop_runs_once_per_kept_box() -> None:
    function, _ = tpu_cases.nms_builder(256, 64, seeds.SEED_NMS_IOU_THRESHOLD, backend="xla")
    boxes, scores = seeds.seed_nms_inputs(256)
    trips = observed.observe(function, [jnp.asarray(boxes), jnp.asarray(scores)]).while_trips
    assert trips == (tpu_cases._seed_nms_kept(256, 64),)


def test_the_walk_takes_run_counted_trips_for_loops_it_cannot_decide() -> None:
    from test_tpu_estimate import data_dependent_loop

    walker = walk(data_dependent_loop(), observed_trips=[5])
    assert walker.loops["TLP"][0].trips == 5
    assert any("from running the function" in note for note in walker.machine.unresolved_loops)
    # A caller's loop_trips win over the run.
    walker = walk(data_dependent_loop(), observed_trips=[5], loop_trips={"TLP": {0: 2}})
    assert walker.loops["TLP"][0].trips == 2


@pytest.mark.slow
def test_estimate_function_counts_the_xla_nms_loop_from_the_example_inputs(
    tmp_path: Path,
) -> None:
    _libtpu()
    import importlib.util

    module_path = tmp_path / "users_nms.py"
    module_path.write_text(
        "import asickernels\n\n\n"
        "def xla_nms(boxes, scores):\n"
        f"    return asickernels.nms(boxes, scores, iou_threshold={seeds.SEED_NMS_IOU_THRESHOLD!r},"
        " max_output_size=128, backend='xla')\n"
    )
    spec = importlib.util.spec_from_file_location("users_nms", module_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["users_nms"] = module
    spec.loader.exec_module(module)
    boxes, scores = seeds.seed_nms_inputs(1024)
    (counted,) = user_function.estimate_function(
        module.xla_nms, jnp.asarray(boxes), jnp.asarray(scores), generations=("v5e",)
    )
    given = cost.estimate_case(tpu_cases.nms_xla_case(1024), "v5e")
    assert counted.device_s == pytest.approx(given.device_s, rel=1e-3)
    assert any(
        "ran the example inputs on CPU: 1 while-loop entry" in a for a in counted.assumptions
    )
