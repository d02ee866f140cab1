"""Production kernel idioms in the estimate: grids sized by scalar-prefetched data, blocks
skipped by ``pl.when`` on prefetched masks, revisited output blocks, wrappers that need
their arrays as values (:mod:`asickernels.simulate.tpu_estimate.idiom_kernels`, jax's own
megablox and splash attention); real compiles in the slow tier."""

from __future__ import annotations

import functools
import importlib
import math
import tarfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import DATA

from asickernels.pallas_home import pltpu
from asickernels.simulate import tpu_compile
from asickernels.simulate.tpu_estimate import estimate as cost
from asickernels.simulate.tpu_estimate import idiom_kernels as idioms
from asickernels.simulate.tpu_estimate import observed, parsing, user_function

SIZES = np.array([100, 0, 300, 112], np.int32)  # 512 rows; group 2 spans row tiles 0-3


def _observe(function, *args):  # type: ignore[no-untyped-def]
    with jax.default_device(jax.devices("cpu")[0]), pltpu.force_tpu_interpret_mode():
        return observed.observe(function, list(args))


def _interpret(function, *args):  # type: ignore[no-untyped-def]
    with jax.default_device(jax.devices("cpu")[0]), pltpu.force_tpu_interpret_mode():
        return np.asarray(function(*args), np.float64)


def test_the_grouped_matmul_computes_each_groups_rows_with_its_weights() -> None:
    rng = np.random.default_rng(0)
    lhs = rng.normal(size=(512, 256)).astype(np.float32)
    rhs = rng.normal(size=(4, 256, 256)).astype(np.float32)
    for sizes in (SIZES, np.array([0, 0, 512, 0], np.int32), np.array([64, 64, 0, 0], np.int32)):
        got = _interpret(idioms.grouped_matmul, lhs, rhs, jnp.asarray(sizes))
        np.testing.assert_allclose(
            got, idioms.grouped_matmul_reference(lhs, rhs, sizes), rtol=1e-4, atol=1e-3
        )
    with pytest.raises(ValueError, match="tiling"):
        idioms.grouped_matmul(lhs, rhs, jnp.asarray(SIZES), tiling=(100, 128, 128))


def test_the_causal_attention_matches_the_reference() -> None:
    rng = np.random.default_rng(1)
    q, k, v = (rng.normal(size=(2, 512, 128)).astype(np.float32) for _ in range(3))
    attention = functools.partial(idioms.causal_attention, block_q=128, block_kv=256)
    got = _interpret(attention, q, k, v)
    np.testing.assert_allclose(got, idioms.causal_attention_reference(q, k, v), atol=1e-4)


def test_a_grid_sized_by_group_sizes_is_counted_with_its_scalars_and_step_work() -> None:
    lhs = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16)
    rhs = jax.ShapeDtypeStruct((4, 256, 256), jnp.bfloat16)
    (kernel,) = _observe(idioms.grouped_matmul, lhs, rhs, jnp.asarray(SIZES)).kernels
    # Row tiles visited: group 0 tile 0, group 2 tiles 0-3, group 3 tile 3 (the empty
    # group none): 6 grid rows x 2 column tiles x 2 k tiles.
    assert (kernel.calls, kernel.steps, kernel.dynamic_grid) == (1, 24, True)
    bound, offsets, groups, tiles = (np.frombuffer(data, np.int32) for _, data in kernel.scalars[0])
    assert bound.tolist() == [6] and offsets.tolist() == [0, 100, 100, 400, 512]
    assert groups[:6].tolist() == [0, 2, 2, 2, 2, 3] and tiles[:6].tolist() == [0, 0, 1, 2, 3, 3]
    # Every step multiplies one (128, 128) pair of blocks.
    assert {(ints, others) for ints, others, _, _ in kernel.step_work} == {(0.0, 2 * 128**3)}
    assert sum(weight for *_, weight in kernel.step_work) == 24
    # Each step fetches a new k block of both inputs (32 KiB each); an output block is
    # written when the grid moves to another row tile: 2 x 4 distinct visits, and its
    # group-2 and group-3 visits of tile 3 share one write (the block stays in VMEM).
    moved = sum(nbytes * weight for _, _, nbytes, weight in kernel.step_work)
    block = 128 * 128 * 2
    assert moved + kernel.edge_bytes == 24 * 2 * block + 2 * 4 * block
    floor = kernel.step_floor(197e12 / 1.5e9, 197e12 / 1.5e9, 819e9 / 1.5e9)
    assert floor == pytest.approx(
        (24 * 2 * block + 2 * 4 * block) / (819e9 / 1.5e9), rel=0.02
    )  # memory-bound: (128, 128) blocks bring 64 KiB for 4 MFLOP


def test_causal_blocks_above_the_diagonal_run_no_products_and_fetch_nothing() -> None:
    q = jax.ShapeDtypeStruct((2, 1024, 128), jnp.bfloat16)
    attention = functools.partial(idioms.causal_attention, block_q=256, block_kv=256)
    (kernel,) = _observe(attention, q, q, q).kernels
    assert kernel.steps == 2 * 4 * 4 and kernel.points[0].scalar
    computing = sum(w for _, others, _, w in kernel.step_work if others)
    assert computing == kernel.points[0].taken == 2 * (4 * 5 // 2)  # the lower triangle
    per_block = 2 * (2 * 256 * 256 * 128)  # q k^T and p v
    assert {others for _, others, _, _ in kernel.step_work} == {0.0, per_block}
    # K and V blocks are fetched when the computed block changes: per head 0 | 0 1 | 0 1 2
    # | 0 1 2 3, where row 1 starts on row 0's block.
    kv_fetches = [count for _, count in kernel.fetches[1:]]
    assert kv_fetches == [2 * 9, 2 * 9]


def test_a_wrapper_that_checks_its_arrays_on_the_host_gets_them_as_values() -> None:
    lhs = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16)
    rhs = jax.ShapeDtypeStruct((4, 256, 256), jnp.bfloat16)
    sizes = jnp.asarray(SIZES)
    args, fixed, note = user_function._trace_time_values(
        idioms.checked_grouped_matmul, [lhs, rhs, sizes]
    )
    assert args == [lhs, rhs] and list(fixed) == [2] and "#2 int32[4]" in note
    bound = user_function.with_values(idioms.checked_grouped_matmul, fixed, 3)
    (kernel,) = _observe(bound, *args).kernels
    assert kernel.steps == 24
    # What it checks still refuses bad values, and shapes alone cannot trace it.
    with pytest.raises(ValueError, match="do not fit"):
        idioms.checked_grouped_matmul(lhs, rhs, jnp.asarray([600, 0, 0, 0], jnp.int32))
    with pytest.raises(ValueError, match="cannot be traced with these example arguments"):
        user_function._trace_time_values(
            idioms.checked_grouped_matmul, [lhs, rhs, jax.ShapeDtypeStruct((4,), jnp.int32)]
        )
    plain, none, nothing = user_function._trace_time_values(
        idioms.grouped_matmul, [lhs, rhs, sizes]
    )
    assert plain == [lhs, rhs, sizes] and not none and not nothing


# -- stored compiles: the walk decides what the prefetched data decide -------------------------

DUMPS = DATA / "tpu_dumps"


def _stored(name: str, tmp_path):  # type: ignore[no-untyped-def]
    with tarfile.open(DUMPS / f"{name}.tar.gz") as archive:
        archive.extractall(tmp_path, filter="data")
    return parsing.load_dump(tmp_path)


def test_the_walk_follows_a_grid_sized_at_run_time_from_the_prefetched_metadata(tmp_path) -> None:  # type: ignore[no-untyped-def]
    dump = _stored("grouped_matmul_v5e", tmp_path)
    lhs = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16)
    rhs = jax.ShapeDtypeStruct((4, 256, 256), jnp.bfloat16)
    seen = _observe(idioms.grouped_matmul, lhs, rhs, jnp.asarray(SIZES))
    counted = cost.estimate_dump(dump, "v5e", kernel_runs=seen.kernels)
    blind = cost.estimate_dump(dump, "v5e")
    # The grid loop: its 24 steps and the pipeline's 2 trips, read from the scalar operand.
    (loop,) = [line for line in counted.loops if line.startswith("grouped_matmul.1 loop #0")]
    assert loop.endswith("26.0 trips each")
    assert not any(
        "grouped_matmul.1" in note and ("depend on data" in note or "assumed" in note)
        for note in counted.assumptions
    )
    assert any("grouped_matmul.1 loop #0: data-dependent exit" in n for n in blind.assumptions)
    (kernel,) = seen.kernels
    clock = 1.5e9
    rates = cost.product_ops_per_cycle("v5e")
    floor = kernel.step_floor(*rates, cost.hbm_bytes_per_cycle("v5e")) / clock
    assert counted.kernel_s >= floor * (1 - 1e-9)


def test_the_walk_skips_what_the_prefetched_causal_mask_skips(tmp_path) -> None:  # type: ignore[no-untyped-def]
    dump = _stored("causal_attention_v5e", tmp_path)
    q = jax.ShapeDtypeStruct((2, 1024, 128), jnp.bfloat16)
    attention = functools.partial(idioms.causal_attention, block_q=256, block_kv=256)
    seen = _observe(attention, q, q, q)
    counted = cost.estimate_dump(dump, "v5e", kernel_runs=seen.kernels)
    blind = cost.estimate_dump(dump, "v5e")
    assert any("causal_attention.1: 1 branch(es)" in n for n in blind.assumptions)
    assert not any("causal_attention.1" in n for n in counted.assumptions)
    # 20 of 32 blocks computed: the walk runs the products that often, not every step.
    pushes = blind.utilization["MXU"] * blind.kernel_s
    assert counted.utilization["MXU"] * counted.kernel_s == pytest.approx(
        pushes * 20 / 32, rel=0.05
    )
    # K and V blocks fetched where the computed block changes (18 of 32 steps each), q's
    # 8 and the output's 8, and the two block maps copied to SMEM (at most a (8, 128)
    # tile of words each).
    block = 256 * 128 * 2
    assert 0 < counted.hbm_bytes - (2 * 18 + 8 + 8) * block <= 2 * 8 * 128 * 4
    assert blind.hbm_bytes > counted.hbm_bytes


# -- real compiles (slow) ---------------------------------------------------------------------


def _libtpu() -> None:
    missing = tpu_compile.libtpu_status()
    if missing:
        pytest.skip(missing)


@pytest.mark.slow
def test_jaxs_megablox_gmm_through_estimate_function_runs_its_true_grid_steps() -> None:
    _libtpu()
    gmm = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm").gmm
    sizes = jnp.asarray([1000, 0, 2500, 596], jnp.int32)  # 4096 rows
    lhs = jax.ShapeDtypeStruct((4096, 1024), jnp.bfloat16)
    rhs = jax.ShapeDtypeStruct((4, 1024, 2048), jnp.bfloat16)
    tiled = functools.partial(gmm, tiling=(512, 512, 1024))
    (estimate,) = user_function.estimate_function(tiled, lhs, rhs, sizes, generations=("v5e",))
    # Row tiles of 512 visited: rows 0-999 tiles 0-1, rows 1000-3499 tiles 1-6, rows
    # 3500-4095 tiles 6-7: 10 grid rows x 2 column tiles x 2 k tiles.
    assert any("40 grid step(s)" in a for a in estimate.assumptions)
    (loop,) = [line for line in estimate.loops if line.startswith("gmm") and " loop #0 " in line]
    assert loop.endswith("42.0 trips each")
    assert not any("gmm" in a and "depend on data" in a for a in estimate.assumptions)
    # Its products at the MXU peak: 40 steps of 512 x 512 x 1024.
    mxu_s = 40 * 2 * 512 * 512 * 1024 / 197e12
    assert mxu_s < estimate.kernel_s < 3 * mxu_s


@pytest.mark.slow
@pytest.mark.parametrize("generation", ["v5e", "v6e", "v5p"])
def test_splash_attention_with_causal_skipping_is_never_below_its_steps_floor(
    generation: str,
) -> None:
    _libtpu()
    q = jax.ShapeDtypeStruct((4, 2048, 128), jnp.bfloat16)
    attention = functools.partial(idioms.splash_causal, block=512)
    (estimate,) = user_function.estimate_function(attention, q, q, q, generations=(generation,))
    seen = _observe(attention, q, q, q)
    (kernel,) = seen.kernels
    assert kernel.points and kernel.points[0].taken == 4 * (4 * 5 // 2)
    assert not any("depend on data" in a and "splash" in a for a in estimate.assumptions)
    cores = 2 if generation == "v5p" else 1
    clock = {"v5e": 1.5e9, "v6e": 1.75e9, "v5p": 1.75e9}[generation]
    rates = cost.product_ops_per_cycle(generation)
    floor = kernel.step_floor(*rates, cost.hbm_bytes_per_cycle(generation)) / clock / cores
    assert floor <= estimate.kernel_s <= 6 * floor, estimate.report()
    assert math.isfinite(estimate.device_s)
