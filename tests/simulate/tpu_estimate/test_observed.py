"""Loops and branches inside Pallas kernels, counted from a run on example inputs
(:mod:`asickernels.simulate.tpu_estimate.observed`) and weighted into the schedule walk."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_tpu_estimate import branch_and_delay_slots, dma_then_wait, listing

from asickernels.pallas_home import pl, pltpu
from asickernels.simulate.tpu_estimate import observed, parsing, program_facts
from asickernels.simulate.tpu_estimate import walk as walking


def _masked_kernel(mask_ref, limit_ref, x_ref, o_ref) -> None:
    i = pl.program_id(0)

    @pl.when(i == 0)  # depends on the step only: the walk decides it, nothing to count
    def _() -> None:
        o_ref[...] = jnp.zeros_like(o_ref)

    @pl.when(mask_ref[i] != 0)  # depends on a loaded value: counted
    def _() -> None:
        o_ref[...] += x_ref[...]

    def add_one(_: jax.Array, acc: jax.Array) -> jax.Array:
        return acc + 1.0

    # A loop whose bound is loaded: counted.
    o_ref[...] += jax.lax.fori_loop(0, limit_ref[i], add_one, jnp.zeros_like(o_ref))

    @pl.when(x_ref[0, 0] > 0)  # depends on a tensor block: not countable here
    def _() -> None:
        o_ref[...] += 1.0


def masked_sum(mask: jax.Array, limit: jax.Array, x: jax.Array) -> jax.Array:
    """Adds the (8, 128) blocks of ``x`` whose mask is set, plus limit[i] per block."""
    blocks = x.shape[0] // 8
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(blocks,),
        # A masked-out block is not fetched: its index stays that of the last set one.
        in_specs=[pl.BlockSpec((8, 128), lambda i, mask, limit: (i * (mask[i] != 0), 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i, mask, limit: (0, 0)),
    )
    return pl.pallas_call(
        _masked_kernel, grid_spec=spec, out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype)
    )(mask, limit, x)


MASK = np.array([1, 0, 0, 1, 1, 0, 1, 0], np.int32)
LIMIT = np.array([3, 0, 1, 2, 5, 0, 0, 1], np.int32)


def _observe(function, *args):  # type: ignore[no-untyped-def]
    with jax.default_device(jax.devices("cpu")[0]), pltpu.force_tpu_interpret_mode():
        return observed.observe(function, list(args))


def test_a_run_counts_a_kernels_data_dependent_branches_loops_and_fetches() -> None:
    # The big operand as a shape only: nothing reads the kernel's output, so the kernel's
    # control flow is counted without executing it.
    x = jax.ShapeDtypeStruct((64, 128), jnp.float32)
    seen = _observe(masked_sum, jnp.asarray(MASK), jnp.asarray(LIMIT), x)
    (kernel,) = seen.kernels
    assert (kernel.calls, kernel.steps, kernel.dynamic_grid) == (1, 8, False)
    when, loop, on_data = kernel.points
    assert (when.kind, when.entries, when.taken) == ("branch", 8, MASK.sum())
    assert (loop.kind, loop.entries, loop.taken) == ("loop", 8, LIMIT.sum())
    assert (on_data.kind, on_data.entries, on_data.unknown) == ("branch", 0, 8)
    assert on_data.rate is None
    # Block indices 0, 0, 0, 3, 4, 0, 6, 0: fetched on each change (and the first step).
    ((nbytes, fetches),) = kernel.fetches
    assert (nbytes, fetches) == (8 * 128 * 4, 6)
    assert kernel.fetch_rate(nbytes) == pytest.approx(6 / 8)
    assert "ran its region 4 of 8 times" in kernel.describe()
    # Step by step: the mask's branch, the on-data branch (never computable) and whether
    # the step fetched the next step's block. Masks 1 0 0 1 1 0 1 0; block indices
    # 0 0 0 3 4 0 6 0, so steps 2 to 6 fetch the next one.
    patterns = {(branches, fetched): weight for branches, fetched, weight in kernel.patterns}
    assert patterns == {
        ((1, None), (0,)): 1,  # step 0
        ((0, None), (0,)): 2,  # steps 1 and 7
        ((0, None), (1,)): 2,  # steps 2 and 5
        ((1, None), (1,)): 3,  # steps 3, 4 and 6
    }


def test_a_kernel_whose_output_is_read_runs_and_still_counts() -> None:
    def then_sum(mask: jax.Array, limit: jax.Array, x: jax.Array) -> jax.Array:
        return masked_sum(mask, limit, x).sum()

    x = jnp.arange(64 * 128, dtype=jnp.float32).reshape(64, 128) / 1e4
    seen = _observe(then_sum, jnp.asarray(MASK), jnp.asarray(LIMIT), x)
    assert seen.kernels[0].points[0].taken == MASK.sum()


def test_a_grid_sized_at_run_time_is_counted_and_has_no_static_floor() -> None:
    def kernel(n_ref, o_ref):  # type: ignore[no-untyped-def]
        o_ref[...] += 1.0

    def dynamic(n: jax.Array) -> jax.Array:
        spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(n[0],),
            in_specs=[],
            out_specs=pl.BlockSpec((8, 128), lambda i, n: (0, 0)),
        )
        return pl.pallas_call(
            kernel, grid_spec=spec, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32)
        )(n)

    (kernel_run,) = _observe(dynamic, jnp.array([5], jnp.int32)).kernels
    assert (kernel_run.steps, kernel_run.dynamic_grid) == (5, True)
    (call,) = program_facts.program_facts(dynamic, [((1,), "int32")]).pallas_calls
    assert call.grid == (-1,)


def _outer_loop(trips: int, *body: tuple[str, str, str], end_region: str = "") -> str:
    """A loop of ``trips`` whose first bundle (2) pops an unknown value and whose bundle 3
    branches forward to region 9 when it is 0, then ``body`` (from bundle 8), then the
    loop's back edge; ``end_region`` labels the back edge's first bundle."""
    return listing(
        ("", "%s1_s0 = smov 0", ""),
        ("LB", "%s2_s0 = sadd.s32 1, %s1_s0  ;;  %s5_s1 = spop %7", "Start region 5"),
        ("", "%p6_p1 = scmp.eq.s32.totalorder %s5_s1, 0", ""),
        *branch_and_delay_slots("%8 = sbr.rel (%p6_p1) target = $region9"),
        *body,
        ("", f"%p3_p0 = scmp.ge.s32.totalorder %s2_s0, {trips}", end_region),
        *branch_and_delay_slots("%4 = sbr.rel (!%p3_p0) target = $region5"),
    )  # fmt: skip


def _counted_listing(trips: int) -> str:
    """A loop of ``trips`` whose body holds a forward branch on a popped (unknown) value
    skipping one bundle (bundle 8), and a fetch predicated on that value (bundle 9)."""
    return _outer_loop(
        trips,
        ("", "%9 = vsyncpa [#allocation1], 1", ""),
        ("", "%10 = dma.hbm_to_vmem [thread:$0]  (!%p6_p1), /*hbm=*/%s1_s3, "
         "/*size_in_granules=*/32, /*vmem=*/%s1_s4, /*dst_syncflagno=*/[#allocation2]",
         "Start region 9"),
    )  # fmt: skip


def _walk_kernel(runs: tuple[observed.KernelRun, ...]) -> walking.Walker:
    program = parsing.parse_program("TLP", _counted_listing(100))
    dump = parsing.Dump({"TLP": program}, {}, mosaic_kernels=frozenset({"TLP"}))
    walker = walking.Walker(dump, bytes_per_cycle=32.0, kernel_runs=runs)
    walker.run()
    return walker


def test_the_walk_runs_a_counted_branchs_region_at_the_runs_rate() -> None:
    run = observed.KernelRun(
        "k", 1, 100, False, (observed.ControlCount("branch", 100, 25),), ((1024.0, 40.0),)
    )
    assumed, counted = _walk_kernel(()), _walk_kernel((run,))
    assert assumed.executions("TLP")[8] == 100  # no counts: the region always runs
    assert counted.executions("TLP")[8] == 25
    assert counted.machine.hbm_bytes == 40 * 1024  # the fetch: at the run's rate
    assert assumed.machine.hbm_bytes == 100 * 1024
    assert any("runs in 25.0% of executions" in n for n in counted.machine.unresolved_loops)
    assert counted.machine.unresolved_branches == 0 < assumed.machine.unresolved_branches


def test_a_steps_branch_and_fetch_come_from_the_same_pattern() -> None:
    # Half the steps compute and fetch, half do neither: never one without the other.
    run = observed.KernelRun(
        "k",
        1,
        100,
        False,
        (observed.ControlCount("branch", 100, 50),),
        ((1024.0, 50.0),),
        (((1,), (1,), 50.0), ((0,), (0,), 50.0)),
    )
    walker = _walk_kernel((run,))
    assert walker.executions("TLP")[8] == pytest.approx(50, abs=1)
    assert walker.machine.hbm_bytes == pytest.approx(50 * 1024, abs=1024)
    ran = [walking._step_pattern(run, step) for step in range(100)]
    assert all(branches[0] == fetches[0] for branches, fetches in ran if branches)


@pytest.mark.parametrize("rate", [0.0, 0.3, 0.5, 1.0])
def test_spreading_a_rate_over_events_hits_it(rate: float) -> None:
    runs = sum(walking._spread(n + 1, rate) > walking._spread(n, rate) for n in range(1000))
    assert runs == pytest.approx(1000 * rate, abs=1)


def test_shapes_only_say_which_kernel_points_were_not_counted() -> None:
    x = jax.ShapeDtypeStruct((64, 128), jnp.float32)
    spec = jax.ShapeDtypeStruct((8,), jnp.int32)
    (kernel,) = _observe(masked_sum, spec, spec, x).kernels
    assert kernel.uncounted and kernel.steps == 0 and not kernel.scalars
    assert "its 2 data-dependent branch(es) and 1 loop(s) are assumed" in kernel.describe()


# -- the Pallas TPU sparse guide's masked matmul, rebuilt -------------------------------------


def test_prefetch_maps_name_the_next_set_block_as_the_guide_does() -> None:
    from asickernels.simulate.tpu_estimate import guide_kernels

    mask, kind, next_i, next_j = guide_kernels.prefetch_maps(np.tril(np.ones((3, 3), np.int32)))
    # The guide scans from the last block back; kinds in order found: diagonal 0, full 1.
    assert kind.tolist() == [[0, 1, 1], [1, 0, 1], [1, 1, 0]]
    assert next_i.tolist() == [[0, 1, 1], [1, 1, 2], [2, 2, 2]]
    assert next_j.tolist() == [[0, 0, 0], [0, 1, 0], [0, 1, 2]]
    assert mask.tolist() == np.tril(np.ones((3, 3))).tolist()


def test_the_masked_matmul_computes_the_masked_product_and_its_counts() -> None:
    from asickernels.simulate.tpu_estimate import guide_kernels

    size, block = 1024, guide_kernels.BLOCK_MN
    maps = [jnp.asarray(a) for a in guide_kernels.prefetch_maps(np.tril(np.ones((2, 2))))]
    kinds = jnp.stack(
        [jnp.tril(jnp.ones((block, block), jnp.int32)), jnp.ones((block, block), jnp.int32)]
    )
    x = jax.random.normal(jax.random.key(0), (size, size), jnp.float32).astype(jnp.bfloat16)
    y = jax.random.normal(jax.random.key(1), (size, size), jnp.float32).astype(jnp.bfloat16)
    with jax.default_device(jax.devices("cpu")[0]), pltpu.force_tpu_interpret_mode():
        got = guide_kernels.masked_matmul(*maps, x, y, kinds)
    mask = jnp.tril(jnp.ones((size, size), jnp.int32))
    want = guide_kernels.masked_reference(mask, x.astype(jnp.float32), y.astype(jnp.float32))
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), rtol=2e-2, atol=0.5)
    (run,) = _observe(guide_kernels.masked_matmul, *guide_kernels.masked_example(2048)).kernels
    # 10 of 16 blocks set, 2 k-steps each; x and y fetched on the computed steps only, the
    # mask's block when its kind changes: rows of kinds 0111 1011 1101 1110, 7 changes.
    assert (run.steps, run.points[0].entries, run.points[0].taken) == (32, 32, 20)
    assert [count for _, count in run.fetches] == [20, 20, 7]


# -- estimates of kernels nobody here wrote, counted from a run (compiles with libtpu) ---------


def _needs_libtpu() -> None:
    from asickernels.simulate import tpu_compile

    if tpu_compile.libtpu_status():
        pytest.skip("needs libtpu")


@pytest.mark.slow
def test_the_masked_matmul_estimate_skips_what_the_mask_skips() -> None:
    from asickernels.simulate.tpu_estimate import estimate_function, guide_kernels

    _needs_libtpu()
    example = guide_kernels.masked_example(4096)
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in example]
    (counted,) = estimate_function(guide_kernels.masked_matmul, *example, generations=("v5e",))
    (assumed,) = estimate_function(guide_kernels.masked_matmul, *shapes, generations=("v5e",))
    # 36 of 64 output blocks computed: well under the all-blocks estimate, above the floor.
    assert counted.device_s < 0.75 * assumed.device_s
    assert counted.floor_s is not None and counted.device_s > counted.floor_s
    # The walk reads the mask from the kernel's SMEM: it decides the branch itself.
    assert any("1 of 1 Pallas kernel(s) counted" in a for a in counted.assumptions)
    assert not any("masked_matmul" in a and "depend on data" in a for a in counted.assumptions)
    assert any("1 data-dependent branch(es)" in a for a in assumed.assumptions)


@pytest.mark.slow
def test_a_grouped_matmul_runs_the_grid_steps_its_group_sizes_make() -> None:
    import importlib  # megablox's package exports a gmm function over its module

    from asickernels.simulate.tpu_estimate import estimate_function

    _needs_libtpu()
    gmm = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm").gmm
    sizes = jnp.asarray([128, 0, 256, 128], jnp.int32)
    lhs = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16)
    rhs = jax.ShapeDtypeStruct((4, 256, 256), jnp.bfloat16)
    (estimate,) = estimate_function(gmm, lhs, rhs, sizes, generations=("v5e",))
    # Its default 128^3 tiles: 2 n-tiles x 4 m-tiles with rows (the empty group is not
    # visited) x 2 k-tiles; the schedule's grid loop runs them plus 2 pipeline trips.
    assert any("16 grid step(s)" in a for a in estimate.assumptions)
    assert any(loop.endswith("18.0 trips each") for loop in estimate.loops)


def test_observe_counts_loops_in_scans_vmapped_loops_and_asickernels_pallas_kernels() -> None:
    """The xla linear_sum_assignment: a fori_loop (a scan) over the rows holding a vmapped
    search loop per row, whose predicate is per image; the pallas_tpu one: a pallas_call
    behind asickernels' lowering primitive."""
    import asickernels

    rng = np.random.default_rng(0)
    cost = rng.uniform(size=(2, 6, 6)).astype(np.float32)
    mask = np.arange(6)[None, :] < np.array([[6], [3]])

    def run(backend: str) -> observed.Observed:
        solve = functools.partial(asickernels.linear_sum_assignment, backend=backend)
        with jax.default_device(jax.devices("cpu")[0]), pltpu.force_tpu_interpret_mode():
            return observed.observe(lambda c, m: solve(c, col_mask=m), [cost, mask])

    (kernel,) = run("pallas_tpu").kernels
    assert kernel.steps == 2
    # Its search and path-flip loops stop on cost values: counted from the body run with
    # its values, per row of each image (2 x 6 entries); rows past the valid ones search
    # nothing, and every row that searches flips a path at least once.
    assert kernel.valued == "values"
    search, flip = kernel.points
    assert (search.kind, flip.kind, search.entries, flip.entries) == ("loop", "loop", 12, 12)
    assert search.empty == flip.empty > 0
    assert search.taken >= flip.taken >= search.entries - search.empty
    seen = run("xla")
    # Per row (the scan's trips are the schedule's to count, not recorded) its search and
    # its path flip; every search of a valid row ends (the batched loop stops), and the
    # busier image decides each count.
    assert len(seen.while_trips) == 2 * 6
    searches = seen.while_trips[0::2]
    assert all(1 <= trips <= 6 for trips in searches)


# -- loops and branches on tensor data: the body run with its values ---------------------------


def _scan_to_negative(x_ref, o_ref) -> None:  # type: ignore[no-untyped-def]
    lane = jax.lax.broadcasted_iota(jnp.int32, (8, 128), 1)

    def not_yet(carry):  # type: ignore[no-untyped-def]
        column = jnp.sum(jnp.where(lane == carry[0], x_ref[...], 0.0))
        return (carry[0] < 128) & (column >= 0)

    # Trips: the first column of the block whose sum is negative (tensor data).
    (trips,) = jax.lax.while_loop(not_yet, lambda carry: (carry[0] + 1,), (jnp.int32(0),))

    @pl.when(x_ref[0, 0] > 0)  # a branch on tensor data
    def _() -> None:
        o_ref[...] = jnp.full((8, 128), trips.astype(jnp.float32))


def scan_to_negative(x: jax.Array) -> jax.Array:
    return pl.pallas_call(
        _scan_to_negative,
        grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)


def _negative_columns() -> np.ndarray:
    x = np.ones((32, 128), np.float32)
    x[0:8, 5] = -1  # block 0: 5 trips
    x[8:16, 40] = -1  # block 1: 40 trips
    x[16:24, 0] = -1  # block 2: no trip (and x[0, 0] < 0: no region)
    x[24, 0] = -3  # block 3: column 0 sums to 4: all 128 trips; no region
    return x


def test_a_loop_and_a_branch_on_tensor_data_are_counted_from_the_body_run_with_values() -> None:
    (kernel,) = _observe(scan_to_negative, _negative_columns()).kernels
    assert kernel.valued == "values"
    loop, branch = kernel.points
    assert (loop.kind, loop.entries, loop.taken, loop.empty, loop.unknown) == ("loop", 4, 173, 1, 0)
    assert (branch.kind, branch.entries, branch.taken, branch.unknown) == ("branch", 4, 2, 0)
    # Per step: the branch ran on steps 0 and 1; each step fetched the next block but the last.
    patterns = {(b, f): w for b, f, w in kernel.patterns}
    assert patterns == {((1,), (1,)): 2, ((0,), (1,)): 1, ((0,), (0,)): 1}
    assert "(1 of 4 entries none)" in kernel.describe()


def test_a_body_it_cannot_run_keeps_the_control_counts_and_says_why() -> None:
    def strided(x_ref, o_ref):  # type: ignore[no-untyped-def]
        @pl.when(jnp.sum(x_ref[pl.ds(0, 4, stride=2), :]) > 0)
        def _() -> None:
            o_ref[...] = x_ref[...]

    def run(x: jax.Array) -> jax.Array:
        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        return pl.pallas_call(
            strided,
            grid=(2,),
            in_specs=[spec],
            out_specs=spec,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        )(x)

    (kernel,) = _observe(run, np.ones((16, 128), np.float32)).kernels
    assert "strided" in kernel.valued
    assert kernel.points[0].unknown == 2 and kernel.points[0].rate is None
    assert "could not run with its values" in kernel.describe()


def test_a_run_past_its_time_limit_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    from asickernels.simulate.tpu_estimate import kernel_values

    monkeypatch.setattr(kernel_values, "MAX_SECONDS", 0.0)
    (kernel,) = _observe(scan_to_negative, _negative_columns()).kernels
    assert kernel.valued.startswith("over 0 s") and kernel.points[0].rate is None


def _guarded_listing(trips: int) -> str:
    """An outer loop of ``trips``; in its body a guard (bundle 3) on a popped value skips
    exactly an inner data-dependent loop (bundles 8 to 14)."""
    return _outer_loop(
        trips,
        ("LB", "%s9_s3 = spop %9", "Start region 7"),
        ("", "%p10_p2 = scmp.lt.s32.totalorder %s9_s3, 5", ""),
        *branch_and_delay_slots("%11 = sbr.rel (%p10_p2) target = $region7"),
        end_region="Start region 9",
    )  # fmt: skip


@pytest.mark.parametrize("sampled", [True, False])
def test_a_loops_guard_skips_the_entries_with_no_trip(
    sampled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not sampled:  # walk every trip: the sampled walk must agree
        monkeypatch.setattr(walking, "PLANNED_SAMPLE_END", 10**9)
    run = observed.KernelRun(
        "k", 1, 100, False, (observed.ControlCount("loop", entries=100, taken=360, empty=40),)
    )
    program = parsing.parse_program("TLP", _guarded_listing(100))
    dump = parsing.Dump({"TLP": program}, {}, mosaic_kernels=frozenset({"TLP"}))
    walker = walking.Walker(dump, bytes_per_cycle=32.0, kernel_runs=(run,))
    cycles = walker.run()
    _, inner = walking._flatten(walker.loops["TLP"])
    assert (inner.entries, inner.iterations) == (60, 360)  # 6 trips per entry with a trip
    # Per outer trip its 13 bundles (the guard's delay slots run either way), plus 7 per
    # inner trip where the guard did not skip the inner loop.
    assert cycles == 1 + 100 * 13 + 360 * 7
    assert any("skips it in 40.0% of entries" in note for note in walker.machine.unresolved_loops)


def test_a_planned_loop_extrapolated_from_sampled_trips_costs_what_walking_every_trip_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    body = listing(
        ("LB", "%s1_s0 = spop %7  ;;  %9 = inlined_call /* %k.1 = custom-call(%x) */", "Start region 3"),
        ("", "%p2_p0 = scmp.lt.s32.totalorder %s1_s0, 5", ""),
        *branch_and_delay_slots("%3 = sbr.rel (%p2_p0) target = $region3"),
    )  # fmt: skip
    callee = listing(("", "", ""), ("", "", ""), ("", "", ""))

    def run() -> walking.Walker:
        programs = {
            name: parsing.parse_program(name, text)
            for name, text in (("TLP", body), ("k.1", callee))
        }
        walker = walking.Walker(
            parsing.Dump(programs, {}), bytes_per_cycle=1.0, loop_trips={"TLP": {0: 50}}
        )
        walker.run()
        return walker

    sampled = run()
    monkeypatch.setattr(walking, "PLANNED_SAMPLE_END", 10**9)
    every = run()
    assert sampled.machine.walked < every.machine.walked
    assert sampled.machine.now == every.machine.now == 50 * (7 + 3)
    assert sampled.stats["k.1"].calls == every.stats["k.1"].calls == 50
    assert sampled.stats["k.1"].cycles == every.stats["k.1"].cycles
    assert sampled.loops["TLP"][0].iterations == 50


def test_a_top_level_guard_skips_a_while_loop_the_run_saw_take_no_trip() -> None:
    program = parsing.parse_program("TLP", _guarded_listing(4))
    dump = parsing.Dump({"TLP": program}, {})
    walker = walking.Walker(dump, bytes_per_cycle=32.0, observed_trips=(0, 3, 0, 2))
    cycles = walker.run()
    _, inner = walking._flatten(walker.loops["TLP"])
    assert (inner.entries, inner.iterations) == (2, 5)
    assert cycles == 1 + 4 * 13 + 5 * 7
    assert walker.observed_trips == []  # every count taken, in order


def _ten_calls() -> parsing.Dump:
    """A top-level program calling ten times one program that waits for a DMA and has a
    branch on a popped (unknown) value, assumed to run its region."""
    top = listing(
        *[("", f"%{n} = inlined_call /* %k.{n} = custom-call(%x) */", "") for n in range(1, 11)]
    )
    callee = listing(
        *dma_then_wait(64),
        ("", "%s6_s1 = spop %7", ""),
        ("", "%p7_p1 = scmp.eq.s32.totalorder %s6_s1, 0", ""),
        *branch_and_delay_slots("%8 = sbr.rel (%p7_p1) target = $region9"),
        ("", "%9 = vsyncpa [#allocation1], 1", "Start region 9"),
    )  # fmt: skip
    programs = {
        "TLP": parsing.parse_program("TLP", top),
        "k.1": parsing.parse_program("k.1", callee),
    }
    return parsing.Dump(programs, {f"k.{n}": "k.1" for n in range(2, 11)})


def test_a_callee_called_at_a_steady_cost_is_charged_not_walked() -> None:
    def run(charge: bool) -> walking.Walker:
        walker = walking.Walker(
            _ten_calls(), bytes_per_cycle=32.0, dma_latency_cycles=50.0, charge_steady_calls=charge
        )
        walker.run()
        return walker

    charged, walked = run(True), run(False)
    assert charged.machine.walked < walked.machine.walked
    assert charged.machine.now == walked.machine.now
    assert charged.machine.totals() == walked.machine.totals()
    assert charged.stats["k.1"].calls == walked.stats["k.1"].calls == 10
    assert charged.executions("k.1") == walked.executions("k.1")
    assert charged.machine.unresolved_branch_sites == walked.machine.unresolved_branch_sites
    assert charged.machine.unresolved_branches == walked.machine.unresolved_branches == 10


def test_an_estimate_charges_steady_calls_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from asickernels.simulate.tpu_estimate import estimate as tpu_cost

    charged = tpu_cost.estimate_dump(_ten_calls(), "v5e")
    # 3 calls walked, 7 charged: the walk stays short, the time is that of ten walked calls.
    monkeypatch.setattr(walking.Walker, "_charge", lambda *_: pytest.fail("charged"))
    monkeypatch.setattr(walking, "STEADY_CALLS", 100)
    walked = tpu_cost.estimate_dump(_ten_calls(), "v5e")
    assert charged.device_s == pytest.approx(walked.device_s, rel=1e-12)
    assert any("k.1 x7" in note for note in charged.assumptions)
    assert not any("charged" in note for note in walked.assumptions)


# -- mixed calls: arrays where they decide, shapes for the rest ---------------------------------


def test_a_wrapper_that_transforms_a_shape_only_operand_still_counts_its_kernel() -> None:
    def wrapped(mask: jax.Array, limit: jax.Array, x: jax.Array) -> jax.Array:
        # XLA work on the big operand before the kernel (shapes only here) and on its
        # output after (its value is not needed to count anything).
        return masked_sum(mask, limit, (x * 2.0).astype(jnp.float32)).sum()

    x = jax.ShapeDtypeStruct((64, 128), jnp.bfloat16)
    seen = _observe(wrapped, jnp.asarray(MASK), jnp.asarray(LIMIT), x)
    (kernel,) = seen.kernels
    assert not kernel.uncounted and kernel.points[0].taken == MASK.sum()
    # Its scalar operands, as the walk reads them: the mask and the limits.
    assert [hlo_type for hlo_type, _ in kernel.scalars[0]] == ["s32[8]", "s32[8]"]
    assert np.frombuffer(kernel.scalars[0][0][1], np.int32).tolist() == MASK.tolist()


def test_a_while_loop_on_shape_only_data_is_not_counted() -> None:
    def search(x: jax.Array, n: jax.Array) -> jax.Array:
        counted = jax.lax.while_loop(lambda i: i < n, lambda i: i + 1, jnp.int32(0))
        on_x = jax.lax.while_loop(
            lambda c: c[1] < x.sum(), lambda c: (c[0] + 1, c[1] + 1.0), (0, 0.0)
        )
        return counted + on_x[0]

    seen = _observe(search, jax.ShapeDtypeStruct((8,), jnp.float32), jnp.int32(3))
    assert seen.while_trips == (3, None)


def test_a_choice_by_platform_is_taken_as_on_tpu_and_counts_the_kernel_inside() -> None:
    def dispatch(mask: jax.Array, limit: jax.Array, x: jax.Array) -> jax.Array:
        return jax.lax.platform_dependent(
            mask, limit, x, tpu=masked_sum, default=lambda mask, limit, x: x[:8] * 0.0
        )

    x = jnp.ones((64, 128), jnp.float32)
    (kernel,) = _observe(dispatch, jnp.asarray(MASK), jnp.asarray(LIMIT), x).kernels
    assert kernel.steps == 8 and kernel.points[0].taken == MASK.sum()


def test_a_kernel_whose_scalars_follow_from_a_shape_only_argument_is_reported_uncounted() -> None:
    spec = jax.ShapeDtypeStruct((8,), jnp.int32)
    x = jax.ShapeDtypeStruct((64, 128), jnp.float32)
    seen = _observe(masked_sum, spec, jnp.asarray(LIMIT), x)
    (kernel,) = seen.kernels
    assert "given as a shape only" in kernel.uncounted and "not counted" in kernel.describe()


# -- the layout of scalar-prefetch arrays in SMEM -----------------------------------------------


def test_memory_words_lay_arrays_out_in_tpu_tiles() -> None:
    from asickernels.simulate.tpu_estimate.scalar import memory_words

    square = np.arange(64, dtype=np.int32).reshape(8, 8)
    words = memory_words("s32[8,8]{1,0:T(8,128)}", square.tobytes())
    assert len(words) == 8 * 128  # one (8, 128) tile, rows padded to 128 words
    assert [words[row * 128 + col] for row, col in [(0, 0), (1, 0), (7, 7)]] == [0, 8, 63]
    bytes_ = np.arange(64, dtype=np.int8).reshape(1, 8, 8)
    packed = memory_words("s8[1,8,8]{2,1,0:T(8,128)(4,1)}", bytes_.tobytes())
    # Four rows of a column share a word, one byte each (splash's mask, read by shifts).
    assert packed[0] == 0x18100800 and packed[128] == 0x38302820 and packed[1] == 0x19110901
    row = np.arange(23, dtype=np.int32)
    assert memory_words("s32[23]{0:T(128)S(1)}", row.tobytes())[:23] == tuple(range(23))
    assert memory_words("s32[]{:T(128)}", np.int32(-3).tobytes()) == (2**32 - 3,)
    assert memory_words("", np.int32([1, 2]).tobytes()) == (1, 2)  # no layout: C order


def test_the_walk_reads_a_kernels_prefetched_array_from_smem() -> None:
    """A kernel copies its operand 1 (s32[4]) to SMEM, loads element 2 and branches on it:
    with the run's scalars the walk decides the branch itself."""
    operand = "inlined_call_operand.vmem [shape: s32[4], index: 1, kind: input, shape index: {}]"
    pointer = "%s3_s3 = sshll.u32 %s1_s1, 4  ;;  %s4_s3 = int_to_ptr.vmem [resolvable:$true] %s3_s3"
    copy = (
        "%5 = dma.vmem_to_smem /*vmem=*/%s4_s3, /*size_in_granules=*/16, /*smem=*/%s2_s2, "
        "/*dst_syncflagno=*/[#allocation3]"
    )
    branch = "%p8_p1 = scmp.eq.s32.totalorder %s7_s6, 0  ;;  %s9_s7 = smov 1"
    text = listing(
        ("", f"%s1_s1 = {operand}  ;;  %s2_s2 = smov [#allocation4]", ""),
        ("", f"{pointer}  ;;  %s6_s5 = smov 2", ""),
        ("", copy, ""),
        ("", "%s7_s6 = sld [smem:[#allocation4 + %s6_s5]]", ""),
        ("", branch, ""),
        *branch_and_delay_slots("%9 = sbr.rel (%p8_p1) target = $region9"),
        ("", "%10 = vsyncpa [#allocation1], 1", ""),
        ("", "%11 = vsyncpa [#allocation1], 1", "Start region 9"),
    )  # fmt: skip

    def walked(third: int) -> walking.Walker:
        scalars = (
            observed.scalar_operand(np.int32(0)),
            observed.scalar_operand(np.array([5, 6, third, 8], np.int32)),
        )
        run = observed.KernelRun("k", 1, 1, False, scalars=(scalars,))
        program = parsing.parse_program("TLP", text)
        dump = parsing.Dump({"TLP": program}, {}, mosaic_kernels=frozenset({"TLP"}))
        walker = walking.Walker(dump, bytes_per_cycle=32.0, kernel_runs=(run,))
        walker.run()
        return walker

    taken, not_taken = walked(0), walked(7)
    assert taken.machine.unresolved_branches == not_taken.machine.unresolved_branches == 0
    assert taken.executions("TLP")[10] == 0 and not_taken.executions("TLP")[10] == 1
