"""The generation facts the estimate takes from libtpu's own cost model (clocks, the share of
HBM bandwidth a copy gets), re-derived from the installed libtpu: if a libtpu changes them,
this says so (asickernels/tpu_generations.py cites how each was read)."""

from __future__ import annotations

import pytest

from asickernels import tpu_generations
from asickernels.simulate import tpu_compile

CHECKED = ("v5e", "v6e", "v5p", "v7x")


def _optimal_seconds(function: object, shape: tuple[int, int], generation: str) -> float:
    import jax
    import jax.numpy as jnp

    device = tpu_compile.topology_device(generation)
    spec = jax.ShapeDtypeStruct(
        shape, jnp.float32, sharding=jax.sharding.SingleDeviceSharding(device)
    )
    compiled = jax.jit(function).lower(spec).compile()  # type: ignore[arg-type]
    return float(compiled.cost_analysis()["optimal_seconds"])


@pytest.mark.slow
@pytest.mark.parametrize("generation", CHECKED)
def test_clock_and_hbm_share_are_libtpus(generation: str) -> None:
    import jax.numpy as jnp

    if tpu_compile.libtpu_status():
        pytest.skip("needs libtpu")
    facts = tpu_generations.get(generation)
    # A copy-bound fusion: 64 MiB read and written.
    copy_s = _optimal_seconds(lambda a: a * 1.5 + 0.25, (8192, 2048), generation)
    device_bandwidth = facts.per_device(facts.hbm_bytes_per_s)
    assert 2 * 8192 * 2048 * 4 / copy_s == pytest.approx(
        device_bandwidth * facts.hbm_efficiency, rel=0.01
    )

    def transcendentals(a: object) -> object:
        for _ in range(80):
            a = jnp.tanh(a) * 1.01 + 0.01
        return a

    # Transcendental-bound: one vreg (8 x 128) per cycle of each TensorCore's EUP.
    vregs = 80 * 4096 * 1024 / 1024
    eup_s = _optimal_seconds(transcendentals, (4096, 1024), generation)
    per_cycle = vregs / eup_s / facts.cores_per_device / facts.clock_hz
    if generation == "v5p":  # libtpu's v5p rate says 1.5 GHz; its datasheet peak, 1.75
        assert per_cycle == pytest.approx(1.5 / 1.75, rel=0.01)
    else:
        assert per_cycle == pytest.approx(1.0, rel=0.01)


def test_rates_are_per_device_and_the_walk_moves_dmas_at_the_share_a_copy_gets() -> None:
    from asickernels.simulate.tpu_estimate import estimate as cost
    from asickernels.simulate.tpu_estimate import program_facts

    v7x, v5p, v5e = (tpu_generations.get(g) for g in ("v7x", "v5p", "v5e"))
    # A v7x device is one of the chip's two TensorCores; a v5p device is the whole chip.
    assert (v7x.cores_per_device, v5p.cores_per_device) == (1, 2)
    floor = program_facts.Floor(hbm_bytes=7380e9)
    assert floor.seconds("v7x") == pytest.approx(2.0)
    assert floor.seconds("v5p") == pytest.approx(7380 / 2765)
    # The walk: one core's share of its device, at the share libtpu charges a copy.
    assert cost.hbm_bytes_per_cycle("v5e") == pytest.approx(819e9 * 0.90 / 1.5e9)
    assert cost.hbm_bytes_per_cycle("v5p") == pytest.approx(2765e9 * 0.85 / 2 / 1.75e9)
    assert cost.hbm_bytes_per_cycle("v7x") == pytest.approx(7380e9 / 2 / 1.9e9)
    assert v5e.vpu_f32_ops_per_s == 4 * 1024 * 1.5e9
