"""TorchTPU (``torch-tpu`` 0.2.0), without a TPU: an asickernels Pallas kernel registered
through TorchTPU's public ``torch.tpu.pallas.jax_op``, traced on meta and fake tensors and by
``make_fx`` with the op's declared output shapes and dtypes, and the module TorchTPU exports
for it compiled for v5e, v6e and v5p by libtpu.

Runs in the TorchTPU environment (``make test-torch-tpu``); skips where torch_tpu is absent.
Never creates a ``tpu`` tensor: without a TPU that aborts the process.

On a CPU host, Pallas's Mosaic lowering (jax 0.10.2) reads the TPU generation from JAX's
default device (a CPU here: "Unsupported TPU device kind: cpu"), so every trace runs under
``jax.default_device`` of a TPU topology device; on a TPU host the default device is the TPU.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch_tpu", reason="TorchTPU is not installed (make test-torch-tpu)")

import jax
import jax.numpy as jnp
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import asickernels
from asickernels.kernels.declaration import Spec
from asickernels.simulate import tpu_compile

NAMESPACE = "asickernels_tpu_smoke"
# (boxes shape, dtype): a ragged row count, and batch dims with a half-precision dtype.
CASES = [((1000, 4), torch.float32), ((7, 130, 4), torch.bfloat16)]


def giou_pallas(boxes1: jax.Array, boxes2: jax.Array) -> jax.Array:
    return asickernels.giou(boxes1, boxes2, backend="pallas_tpu")


@pytest.fixture(scope="module")
def giou_op():
    """``giou`` on pallas_tpu, registered once per process (a second registration of the same
    name is an error)."""
    return torch.tpu.pallas.jax_op(f"{NAMESPACE}::giou", giou_pallas)


@pytest.fixture
def on_tpu_generation():
    """JAX's default device is a v5e topology device while the test runs."""
    with jax.default_device(tpu_compile.topology_device("v5e")):
        yield


def declared(shape: tuple[int, ...], dtype: torch.dtype) -> Spec:
    """The output asickernels.giou declares for two boxes arrays of ``shape`` and ``dtype``."""
    box = Spec(shape, jnp.dtype(str(dtype).removeprefix("torch.")))
    out = asickernels.giou.plan({"boxes1": box, "boxes2": box}, {}).outputs
    assert isinstance(out, Spec)
    return out


def test_jax_op_registers_a_torch_library_op(giou_op):
    schema = str(getattr(torch.ops, NAMESPACE).giou.default._schema)
    assert schema == f"{NAMESPACE}::giou(Tensor boxes1, Tensor boxes2) -> Tensor"
    assert not torch.accelerator.is_available()  # what makes a tpu tensor unsafe here


@pytest.mark.parametrize(("shape", "dtype"), CASES)
def test_meta_tensors_get_the_declared_output(giou_op, on_tpu_generation, shape, dtype):
    want = declared(shape, dtype)
    boxes = torch.empty(shape, dtype=dtype, device="meta")
    out = giou_op(boxes, boxes)
    assert out.device.type == "meta"
    assert (tuple(out.shape), str(out.dtype)) == (want.shape, f"torch.{want.dtype}")


@pytest.mark.parametrize(("shape", "dtype"), CASES)
def test_make_fx_traces_one_call_on_fake_tensors(giou_op, on_tpu_generation, shape, dtype):
    def loss(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (1 - giou_op(a, b)).mean()

    boxes = torch.zeros(shape, dtype=dtype)
    graph = make_fx(loss, tracing_mode="fake")(boxes, boxes)
    calls = [n for n in graph.graph.nodes if n.target is getattr(torch.ops, NAMESPACE).giou.default]
    assert len(calls) == 1
    value = calls[0].meta["val"]  # the fake kernel's output
    assert isinstance(value, torch.Tensor)
    want = declared(shape, dtype)
    assert (tuple(value.shape), str(value.dtype)) == (want.shape, f"torch.{want.dtype}")


@pytest.mark.parametrize("generation", tpu_compile.GATE_GENERATIONS)
def test_exported_module_compiles_for_tpu(giou_op, generation):
    """The module TorchTPU hands its runtime: ``jax.export`` of ``jax.jit(fn)`` for the TPU
    platform, custom-call checks off (torch_tpu/_internal/pallas/pallas.py, JaxCallable),
    lowered here for ``generation`` and compiled by libtpu (Mosaic, VMEM limits)."""
    shape, dtype = CASES[0]
    device = tpu_compile.topology_device(generation)
    with jax.default_device(device):
        exported = jax.export.export(
            jax.jit(giou_pallas),
            platforms=["tpu"],
            disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("ALL")],
        )(*[jax.ShapeDtypeStruct(shape, "float32")] * 2)
        fake = giou_op(*[torch.empty(shape, dtype=dtype, device="meta")] * 2)
    assert "tpu_custom_call" in exported.mlir_module()  # a Mosaic kernel, not interpret mode
    (out,) = exported.out_avals
    assert out.shape == tuple(fake.shape)
    sharding = jax.sharding.SingleDeviceSharding(device)
    args = [jax.ShapeDtypeStruct(shape, "float32", sharding=sharding)] * 2
    compiled = jax.jit(exported.call).lower(*args).compile()
    memory = compiled.memory_analysis()
    assert memory is not None and memory.output_size_in_bytes >= 4 * out.size
