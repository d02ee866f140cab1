"""The walk computes with the function's argument values (loops whose exit depends on them,
as the compiled program evaluates it), tells the runtime's own control flow from the
program's, charges long loops in steady state, and never ends before its DMAs do."""

from __future__ import annotations

import numpy as np
import pytest
from test_tpu_estimate import branch_and_delay_slots, listing, walk

from asickernels.simulate.tpu_estimate import estimate as tpu_cost
from asickernels.simulate.tpu_estimate import parsing, scalar
from asickernels.simulate.tpu_estimate import walk as walking
from asickernels.simulate.tpu_estimate.parsing import Addr


def while_on_a_parameter() -> str:
    """XLA's ``while i < n`` with ``n`` the top-level program's parameter 1: copied to
    VMEM, loaded, pushed to the scalar unit; the condition is a compare turned 0/1 by
    ``scalar_select``, masked by ``sand 1`` and tested against 0."""
    return listing(
        ("", "%s1_s0 = scalar_parameter_address 1", ""),
        ("", "%s2_s1 = sshll.u32 %s1_s0, 4  ;;  %s3_s1 = int_to_ptr.hbm [resolvable:$true] %s2_s1", ""),
        ("", "%s4_s2 = smov [#allocation8]", ""),
        ("", "%s5_s3 = sshll.u32 %s4_s2, 4", ""),
        ("", "%s6_s3 = int_to_ptr.vmem [resolvable:$true] %s5_s3", ""),
        ("", "%7 = dma.hbm_to_vmem [thread:$0]  /*hbm=*/%s3_s1, /*size_in_granules=*/16, "
             "/*vmem=*/%s6_s3, /*dst_syncflagno=*/[#allocation9]", ""),
        ("", "%8 = dma.done.wait [#allocation9], 16", ""),
        ("", "%v9_v1 = vld [vmem:[#allocation8] sm:$0xff]", ""),
        ("", "%10 = vpush %v9_v1", ""),
        ("", "%s11_s4 = spop %10  ;;  %s12_s5 = smov 0", ""),
        ("LB", "%s13_s5 = sadd.s32 1, %s12_s5", "Start region 5"),
        ("", "%p14_p0 = scmp.lt.s32.totalorder %s13_s5, %s11_s4", ""),
        ("", "%s15_s6 = scalar_select %p14_p0, 1, 0", ""),
        ("", "%s16_s7 = sand.u32 1, %s15_s6", ""),
        ("", "%p17_p1 = scmp.eq.s32.totalorder %s16_s7, 0", ""),
        *branch_and_delay_slots("%18 = sbr.rel (!%p17_p1) target = $region5"),
        ("", "%19 = vsyncpa [#allocation1], 1", ""),
    )  # fmt: skip


def test_a_loop_bound_by_an_argument_runs_the_trips_its_value_gives() -> None:
    walker = walk(while_on_a_parameter(), parameters={1: {0: 7}})
    (loop,) = walker.loops["TLP"]
    assert loop.trips == 7
    assert any(
        "loop #0: exit depends on the arguments; trips computed" in note
        for note in walker.machine.unresolved_loops
    )
    # The CPU run's count for the same while loop is compared, not taken.
    walker = walk(while_on_a_parameter(), parameters={1: {0: 7}}, observed_trips=[5])
    assert walker.loops["TLP"][0].trips == 7
    assert any("differ from the run on CPU (5)" in n for n in walker.machine.unresolved_loops)


def test_without_the_arguments_value_the_loop_is_data_dependent() -> None:
    walker = walk(while_on_a_parameter())
    assert walker.loops["TLP"][0].trips == 1
    assert any("assumed 1 trip" in note for note in walker.machine.unresolved_loops)
    walker = walk(while_on_a_parameter(), observed_trips=[4])
    assert walker.loops["TLP"][0].trips == 4


def branch_on_smem(*before: tuple[str, str, str]) -> str:
    """A forward branch on an SMEM word (``#allocation2``) after ``before``."""
    return listing(
        *before,
        ("", "%s1_s0 = sld [smem:[#allocation2]]", ""),
        ("", "%p2_p0 = scmp.ne.s32.totalorder %s1_s0, 1", ""),
        *branch_and_delay_slots("%3 = sbr.rel (%p2_p0) target = $region7"),
        ("", "%v4_v0 = vadd.f32 %v1_v1, %v2_v2", ""),
        ("PF", "%5 = vsyncpa [#allocation1], 1", "Start/End empty region 7"),
    )  # fmt: skip


def test_branches_on_the_runtimes_own_state_are_not_data_dependent() -> None:
    walker = walk(branch_on_smem())  # no program wrote the word: the runtime's state
    assert walker.machine.now == 9  # the region runs
    assert walker.machine.runtime_branches == 1
    assert not walker.machine.unresolved_branch_sites
    # A word the program stored from data is the program's: the branch is reported.
    stored = branch_on_smem(
        ("", "%s9_s9 = spop %99", ""), ("", "%8 = sst [smem:[#allocation2]] %s9_s9", "")
    )
    walker = walk(stored)
    assert walker.machine.runtime_branches == 0
    assert walker.machine.unresolved_branch_sites == {("TLP", 4): 1}
    estimate = tpu_cost.estimate_dump(
        parsing.Dump({"TLP": parsing.parse_program("TLP", stored)}, {}), "v5e"
    )
    assert any("depend on data" in note for note in estimate.assumptions)


def test_the_walk_ends_when_its_last_dma_does() -> None:
    text = listing(
        ("", "%s1_s5 = smov 0", ""),
        ("", "%2 = dma.vmem_to_hbm [thread:$0]  /*vmem=*/%s1_s5, /*size_in_granules=*/64, "
             "/*hbm=*/%s1_s5, /*dst_syncflagno=*/[#allocation3]", ""),
    )  # fmt: skip
    walker = walk(text, bytes_per_cycle=32.0)
    assert walker.machine.now == pytest.approx(1 + 64 * 32 / 32)
    assert walker.machine.dma_wait_cycles == pytest.approx(64 - 1)


def periodic_loop(trips: int) -> str:
    """A loop fetching a block (and waiting for it) on every 8th trip only."""
    return listing(
        ("", "%s1_s0 = smov 0  ;;  %s9_s9 = smov 0", ""),
        ("LB", "%s2_s0 = sadd.s32 1, %s1_s0", "Start region 5"),
        ("", "%s3_s1 = sand.u32 7, %s2_s0", ""),
        ("", "%p4_p1 = scmp.eq.s32.totalorder %s3_s1, 0", ""),
        ("", "%5 = dma.hbm_to_vmem [thread:$0] (%p4_p1), /*hbm=*/%s9_s9, /*size_in_granules=*/64, "
             "/*vmem=*/%s9_s9, /*dst_syncflagno=*/[#allocation3]", ""),
        ("", "%6 = dma.done.wait (%p4_p1), [#allocation3], 64", ""),
        ("", f"%p7_p0 = scmp.ge.s32.totalorder %s2_s0, {trips}", ""),
        *branch_and_delay_slots("%8 = sbr.rel (!%p7_p0) target = $region5"),
        ("", "%9 = vsyncpa [#allocation1], 1", ""),
    )  # fmt: skip


@pytest.mark.parametrize("trips", [1000, 1003])
def test_a_loop_in_steady_state_is_charged_by_whole_periods(
    trips: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    charged = walk(periodic_loop(trips), bytes_per_cycle=32.0, dma_latency_cycles=7.0)
    monkeypatch.setattr(walking, "STEADY_WINDOW", 10**9)
    walked = walk(periodic_loop(trips), bytes_per_cycle=32.0, dma_latency_cycles=7.0)
    assert charged.machine.now == pytest.approx(walked.machine.now, rel=1e-12)
    assert charged.machine.hbm_bytes == walked.machine.hbm_bytes == trips // 8 * 64 * 32
    assert charged.loops["TLP"][0].trips == walked.loops["TLP"][0].trips == trips
    # Walked: the window, three periods and the last period and a half at most.
    assert charged.machine.walked < (walking.STEADY_WINDOW + 5 * 8) * 11


def test_memory_words_follow_copies_and_forget_what_unknown_stores_reach() -> None:
    memory = scalar.Memory()
    memory.fill("parameter 0", {0: 3, 1: 4})
    memory.copy(Addr("parameter 0", 0), Addr("smem", 8), 2)
    assert memory.load(Addr("smem", 9)) == (4, scalar.DATA)
    assert memory.load(Addr("never", 0), unwritten=scalar.RUNTIME) == (None, scalar.RUNTIME)
    memory.store(Addr("smem", scalar.SOMEWHERE), 1, None)
    assert memory.load(Addr("smem", 9)) == (None, scalar.DATA)
    memory.copy(None, Addr("vmem", 0), 16)  # unknown source: unknown words
    assert memory.load(Addr("vmem", 3), unwritten=scalar.RUNTIME) == (None, scalar.DATA)


def test_arguments_become_parameter_words_in_their_layout() -> None:
    sizes = np.array([3, 5, 0, 8], np.int32)
    big = type("Spec", (), {"shape": (4096, 1024), "dtype": np.dtype("float32")})()
    arguments = [tpu_cost.argument(big), tpu_cost.argument(sizes), tpu_cost.argument(sizes)]
    assert arguments[0] == ("f32[4096,1024]", None)
    assert arguments[1][0] == "s32[4]"
    # The compiler dropped the first s32[4] argument (unused): the second is parameter 1.
    layouts = ("f32[4096,1024]{1,0:T(8,128)}", "s32[4]{0:T(128)}")
    words = tpu_cost.parameter_words(layouts, arguments)
    assert set(words) == {1}
    assert [words[1][i] for i in range(4)] == [3, 5, 0, 8]
    assert parsing.entry_parameters(
        "HloModule m, entry_computation_layout={(s32[4]{0:T(128)}, f32[2,3]{1,0})->f32[]}"
    ) == ("s32[4]{0:T(128)}", "f32[2,3]{1,0}")


# -- real compiles (slow) ---------------------------------------------------------------------


def _libtpu() -> None:
    from asickernels.simulate import tpu_compile

    missing = tpu_compile.libtpu_status()
    if missing:
        pytest.skip(missing)


def _row_tiles(sizes: list[int], tile: int) -> int:
    """The row tiles libtpu's ragged-dot metadata kernel has its grid visit: each non-empty
    group every tile it has rows in (as its metadata kernel's loops compute it)."""
    tiles, start = 0, 0
    for size in sizes:
        end = start + size
        tiles += (-(-end // tile) - start // tile) if size else 0
        start = end
    return tiles


@pytest.mark.slow
@pytest.mark.parametrize(("generation", "tile"), [("v5e", 128), ("v6e", 256), ("v7x", 256)])
def test_xla_grouped_matmul_grid_follows_the_group_sizes(generation: str, tile: int) -> None:
    _libtpu()
    import jax
    import jax.numpy as jnp

    from asickernels.simulate.tpu_estimate import estimate_function, xla_idioms

    m, k, n, sizes = 1024, 512, 512, [300, 0, 500, 224]
    x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((len(sizes), k, n), jnp.bfloat16)
    (estimate,) = estimate_function(
        xla_idioms.grouped_matmul, x, w, jnp.asarray(sizes, jnp.int32), generations=(generation,)
    )
    # The grid: a trip per visited row tile, plus the pipeline's first fetch and last store.
    trips = _row_tiles(sizes, tile) + walking.PIPELINE_EXTRA_TRIPS
    (grid,) = [line for line in estimate.loops if line.startswith("ragged-dot-none loop #0")]
    assert grid.endswith(f"1 entry, {trips:.1f} trips each"), grid
    assert any(
        "ragged-dot-none loop #0: exit depends on the arguments" in a for a in estimate.assumptions
    )
    assert not any("assumed 1 trip" in a or "depend on data" in a for a in estimate.assumptions)
    assert estimate.floor_s is not None and estimate.device_s >= estimate.floor_s


@pytest.mark.slow
def test_chunked_xla_attention_is_walked_in_steady_state_as_walked_whole(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    _libtpu()
    from pathlib import Path

    from asickernels.simulate.tpu_estimate import cases, xla_idioms

    target = cases.make_case(
        "chunked attention",
        f"{xla_idioms.__name__}:chunked_attention_case",
        {"heads": 2, "queries": 512, "keys": 8192, "depth": 128, "chunk": 256},
    )
    listings = tpu_cost.compile_with_dumps(target, "v5e", Path(str(tmp_path)))
    dump, facts = parsing.load_dump(listings), tpu_cost.load_facts(listings)
    charged = tpu_cost.estimate_dump(dump, "v5e", facts=facts)
    assert any("TLP loop #0 " in line and "32.0 trips each" in line for line in charged.loops)
    assert any("calls charged at the cost" in note for note in charged.assumptions)
    assert charged.floor_s is not None and charged.device_s >= charged.floor_s
    monkeypatch.setattr(walking, "STEADY_CALLS", 10**9)
    monkeypatch.setattr(walking, "STEADY_WINDOW", 10**9)
    walked = tpu_cost.estimate_dump(dump, "v5e", facts=facts)
    assert charged.device_s == pytest.approx(walked.device_s, rel=1e-9)
