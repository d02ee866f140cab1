"""The JAX SPMD wrappers on 8 host devices (tests/conftest.py) against the unsharded ops,
the TPU pod-slice plan, and the 2-process run (slow)."""

from __future__ import annotations

import argparse
import inspect
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from frontend_cases import SHARDED_OPS, every_argument, parameters, sharded_signature
from jax.sharding import Mesh, PartitionSpec

import asickernels
from asickernels.frontends import jax_spmd, spmd_plan
from asickernels.kernels.cases import grid_boxes, random_boxes

P = PartitionSpec
BACKEND = "xla"  # the per-shard kernel; Pallas (interpret mode) is covered by a slow test


@pytest.fixture(scope="module")
def meshes() -> dict[str, Mesh]:
    devices = jax.devices()
    if len(devices) < 8:
        pytest.skip("needs 8 host devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    return {
        "1d": Mesh(np.array(devices[:8]), ("data",)),
        "2d": Mesh(np.array(devices[:8]).reshape(2, 4), ("data", "model")),
    }


def _pairs(shape: tuple[int, ...], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return random_boxes(rng, shape), random_boxes(rng, shape)


@pytest.mark.parametrize(
    ("mesh_name", "spec"),
    [
        ("1d", P("data")),
        ("2d", P("data", "model")),
        ("2d", P(("data", "model"))),
        ("2d", P(None, "model")),
    ],
)
def test_giou_equals_unsharded(meshes, mesh_name, spec):
    b1, b2 = _pairs((8, 12, 3))
    got = jax_spmd.giou(b1, b2, mesh=meshes[mesh_name], batch_spec=spec, backend=BACKEND)
    # Within float32 rounding: the shards and the whole are compiled (and fused) apart.
    np.testing.assert_allclose(
        np.asarray(got), np.asarray(asickernels.giou(b1, b2, backend=BACKEND)), rtol=0, atol=3e-7
    )
    assert got.sharding.spec == spec


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("spec", [P("data"), P(("data", "model"))])
def test_giou_loss_and_gradient_equal_unsharded(meshes, reduction, spec):
    """Padding holds NaN; the mean is over the valid boxes of the whole global batch."""
    preds, targets = _pairs((8, 20), seed=1)
    mask = np.random.default_rng(2).uniform(size=(8, 20)) < 0.5
    mask[0] = False  # a shard (or more) with no valid box at all
    preds[~mask] = np.nan

    def sharded(p):
        out = jax_spmd.giou_loss(
            p,
            targets,
            mesh=meshes["2d"],
            batch_spec=spec,
            mask=mask,
            reduction=reduction,
            backend=BACKEND,
        )
        return out.sum()

    def unsharded(p):
        return asickernels.giou_loss(
            p, targets, mask=mask, reduction=reduction, backend=BACKEND
        ).sum()

    value, grad = jax.jit(jax.value_and_grad(sharded))(preds)
    want_value, want_grad = jax.value_and_grad(unsharded)(preds)
    np.testing.assert_allclose(float(value), float(want_value), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want_grad), rtol=1e-5, atol=1e-7)
    assert np.all(np.asarray(grad)[~mask] == 0)


def test_giou_loss_mean_without_valid_boxes_is_zero(meshes):
    boxes = np.full((8, 4, 4), np.nan, np.float32)
    got = jax_spmd.giou_loss(
        boxes,
        boxes,
        mesh=meshes["1d"],
        batch_spec=P("data"),
        mask=np.zeros((8, 4), bool),
        backend=BACKEND,
    )
    assert float(got) == 0.0


def test_nms_and_batched_nms_equal_unsharded(meshes):
    rng = np.random.default_rng(3)
    boxes = grid_boxes(rng, (2, 4, 90))
    scores = (rng.integers(0, 10, (2, 4, 90)) / 10).astype(np.float32)  # many ties
    categories = rng.integers(0, 3, (2, 4, 90))
    options = {"iou_threshold": 0.3, "max_output_size": 20, "backend": BACKEND}
    spec = P("data", ("model",))
    got = jax_spmd.nms(boxes, scores, mesh=meshes["2d"], batch_spec=spec, **options)
    want = asickernels.nms(boxes, scores, **options)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    got = jax_spmd.batched_nms(
        boxes, scores, categories, mesh=meshes["2d"], batch_spec=spec, **options
    )
    want = asickernels.batched_nms(boxes, scores, categories, **options)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize(
    "axes",
    [
        {"m_axis": "data", "n_axis": "model"},
        {"m_axis": "data", "k_axis": "model"},
        {"k_axis": ("data", "model")},
        {"n_axis": "data", "k_axis": "model"},
    ],
)
def test_int8_matmul_is_exact(meshes, axes):
    rng = np.random.default_rng(4)
    x = np.full((16, 4096), -128, np.int8)  # the extreme partial products
    x[8:] = rng.integers(-128, 128, (8, 4096), dtype=np.int8)
    y = np.full((4096, 8), -128, np.int8)
    got = jax_spmd.int8_matmul(x, y, mesh=meshes["2d"], backend=BACKEND, **axes)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(got), x.astype(np.int64) @ y.astype(np.int64))


@pytest.mark.parametrize("k_axis", [None, "model"])
def test_int8_matmul_scales(meshes, k_axis):
    rng = np.random.default_rng(5)
    x = rng.integers(-128, 128, (16, 64), dtype=np.int8)
    y = rng.integers(-128, 128, (64, 8), dtype=np.int8)
    x_scale = rng.uniform(0.01, 0.1, 16).astype(np.float32)
    options = {"x_scale": x_scale, "y_scale": 0.5, "out_dtype": jax.numpy.bfloat16}
    got = jax_spmd.int8_matmul(
        x, y, mesh=meshes["2d"], m_axis="data", k_axis=k_axis, backend=BACKEND, **options
    )
    want = asickernels.int8_matmul(x, y, backend=BACKEND, **options)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def test_bad_inputs_raise_clear_errors(meshes):
    b1, b2 = _pairs((6, 3))
    with pytest.raises(ValueError, match="cannot be split evenly 8 ways"):
        jax_spmd.giou(b1, b2, mesh=meshes["1d"], batch_spec=P("data"))
    with pytest.raises(ValueError, match="not in the mesh"):
        jax_spmd.giou(b1, b2, mesh=meshes["1d"], batch_spec=P("batch"))
    with pytest.raises(ValueError, match="may be sharded"):
        jax_spmd.nms(
            b1,
            b2[..., 0],
            mesh=meshes["1d"],
            batch_spec=P(None, "data"),
            iou_threshold=0.5,
            max_output_size=2,
        )
    with pytest.raises(ValueError, match=r"shape \[\.\.\., 4\]"):  # the op's own validation
        jax_spmd.giou(b1[..., :3], b2[..., :3], mesh=meshes["1d"], batch_spec=P())
    with pytest.raises(ValueError, match="int32 psum"):
        k = 131072  # INT8_MATMUL_MAX_K + 1, divisible by the 8 devices
        x = jax.ShapeDtypeStruct((8, k), np.int8)
        y = jax.ShapeDtypeStruct((k, 8), np.int8)
        jax.eval_shape(
            lambda a, b: jax_spmd.int8_matmul(a, b, mesh=meshes["1d"], k_axis="data", x_scale=1.0),
            x,
            y,
        )


@pytest.mark.slow
def test_pallas_kernels_per_shard(meshes):
    """The Pallas kernels (interpret mode here) inside shard_map, for GIOU and the matmul."""
    b1, b2 = _pairs((8, 130))
    got = jax_spmd.giou(b1, b2, mesh=meshes["1d"], batch_spec=P("data"), backend="pallas_tpu")
    np.testing.assert_allclose(np.asarray(got), np.asarray(asickernels.giou(b1, b2)), atol=2e-5)
    rng = np.random.default_rng(6)
    x = rng.integers(-128, 128, (16, 256), dtype=np.int8)
    y = rng.integers(-128, 128, (256, 8), dtype=np.int8)
    got = jax_spmd.int8_matmul(
        x, y, mesh=meshes["2d"], m_axis="data", k_axis="model", backend="pallas_tpu"
    )
    np.testing.assert_array_equal(np.asarray(got), x.astype(np.int32) @ y.astype(np.int32))


# Each wrapper is its op's, over a mesh.


def test_the_wrappers_are_the_ops():
    assert sorted(jax_spmd.__all__) == sorted(op.name for op in SHARDED_OPS)


@pytest.mark.parametrize("op", SHARDED_OPS, ids=lambda op: op.name)
def test_each_wrapper_has_its_ops_signature(op):
    wrapper = getattr(jax_spmd, op.name)
    assert parameters(inspect.signature(wrapper)) == sharded_signature(op, op.__signature__)
    assert wrapper.__module__ == jax_spmd.__name__ and wrapper.__doc__


@pytest.mark.parametrize("op", SHARDED_OPS, ids=lambda op: op.name)
def test_each_wrapper_passes_every_argument_to_its_op(meshes, op):
    """Every argument given, the arrays split 8 ways: what the unsharded op returns."""
    values = every_argument(op.name, batch=(8,))
    partition = {"m_axis": "data"} if op.partition == "matmul" else {"batch_spec": P("data")}
    got = getattr(jax_spmd, op.name)(**values, mesh=meshes["1d"], backend=BACKEND, **partition)
    want = op(**values, backend=BACKEND)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)


def test_collectives_parsed_from_hlo():
    hlo = """
  %p = f32[8]{0} parameter(0)
  %ar = s32[4096,8192]{1,0:T(8,128)} all-reduce(%x), channel_id=1, replica_groups={{0,1}}
  %t = (f32[]{:T(128)}, f32[]{:T(128)}) all-reduce(%a, %b), channel_id=2
  %g = f32[] get-tuple-element(%all-reduce.4), index=1
  %ags = (f32[4]{0}, f32[16]{0}) all-gather-start(%y), dimensions={0}
  %agd = f32[16]{0} all-gather-done(%ags)
"""
    assert spmd_plan.collectives_in(hlo) == (
        spmd_plan.Collective("all-reduce", "s32[4096,8192]"),
        spmd_plan.Collective("all-reduce", "(f32[], f32[])"),
        spmd_plan.Collective("all-gather", "(f32[4], f32[16])"),
    )


def test_spmd_plan_cli_is_registered():
    parser = argparse.ArgumentParser()
    spmd_plan.register_cli(parser.add_subparsers())
    args = parser.parse_args(["spmd-plan", "--topology", "v5e:2x2", "--backend", "xla"])
    assert args.handler is not None and args.topology == ["v5e:2x2"] and args.backend == "xla"


def test_spmd_plan_cli_names_an_unknown_topology_without_a_traceback(capsys):
    pytest.importorskip("libtpu")
    from asickernels import cli

    assert cli.main(["spmd-plan", "--topology", "v9:2x2"]) == 2
    err = capsys.readouterr().err
    assert "topology 'v9:2x2' is not a TPU topology" in err and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["pallas_tpu", "xla"])
def test_spmd_plan_compiles_for_a_v5e_slice(backend):
    """libtpu compiles every sharded program for a 2x2 v5e slice (no TPU needed)."""
    pytest.importorskip("libtpu")
    result = spmd_plan.spmd_plan("v5e:2x2", backend=backend)
    assert result.num_devices == 4
    programs = {p.name: p for p in result.programs}
    assert not programs["giou"].collectives and not programs["int8_matmul_mn"].collectives
    k_sharded = programs["int8_matmul_k"].collectives
    assert [c.op for c in k_sharded] == ["all-reduce"] and k_sharded[0].shape.startswith(
        "s32[4096,8192]"
    )
    assert any(c.op == "all-reduce" for c in programs["giou_loss_grad"].collectives)
    # Per device: a quarter of the 4096x256 pairs' two float32 box arrays, and so on.
    assert programs["giou"].memory["argument"] == 2 * 1024 * 256 * 4 * 4
    assert programs["int8_matmul_k"].memory["output"] == 4096 * 8192 * 4
    assert "all-reduce s32[4096,8192]" in spmd_plan.format_plan(result)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_with_cpu_collectives():
    """2 processes x 4 CPU devices joined by jax.distributed.initialize on localhost."""
    worker = Path(__file__).with_name("spmd_multiprocess_worker.py")
    port = str(_free_port())
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), str(i), "2", port],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for i in range(2)
    ]  # fmt: skip
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=400)[0])
    finally:
        for proc in procs:
            proc.kill()
    for i, (proc, out) in enumerate(zip(procs, outputs, strict=True)):
        assert proc.returncode == 0 and f"process {i}: ok" in out, out[-3000:]
