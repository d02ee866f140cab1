"""TorchTPU (``torch-tpu`` 0.2.0) without a TPU: every op registered through TorchTPU's public
``torch.tpu.pallas.jax_op`` (:mod:`asickernels.frontends.torch_tpu`), for every op:

* the schema is the ``torch.ops.asickernels`` operator's;
* ``asickernels.torch.<op>`` on a ``tpu`` tensor calls it, traced by ``make_fx`` on fake
  tensors with the declared output shapes and dtypes (the ``tpu`` device does not exist
  without a TPU, so these tests route meta tensors as if they were ``tpu``);
* gradients trace through the ``<op>_backward`` operators;
* the module TorchTPU exports compiles for v5e, v6e and v5p with libtpu (Mosaic, VMEM);
* the same JAX function, run on the CPU (Pallas interpret mode), agrees with the reference.

Runs in the TorchTPU environment (``make test-torch-tpu``); skips where torch_tpu is absent.
Never creates a ``tpu`` tensor: without a TPU that aborts the process.

On a CPU host, Pallas's Mosaic lowering (jax 0.10.2) reads the TPU generation from JAX's
default device (a CPU here: "Unsupported TPU device kind: cpu"), so every trace for TPU runs
under ``jax.default_device`` of a TPU topology device; on a TPU host the default device is the
TPU.
"""

from __future__ import annotations

import gc

import pytest

pytest.importorskip("torch_tpu", reason="TorchTPU is not installed (make test-torch-tpu)")

import jax
import numpy as np
import torch
from frontend_cases import every_argument
from torch.fx.experimental.proxy_tensor import make_fx

import asickernels
import asickernels.torch as akt
from asickernels.estimates import compile_gate
from asickernels.frontends import torch_tpu
from asickernels.kernels import oracle
from asickernels.simulate import tpu_compile
from asickernels.torch import ops

OPS = {op.name: op for op in asickernels.OPS}
DIFFERENTIABLE = [name for name, op in OPS.items() if op.vjp is not None]


@pytest.fixture
def on_tpu_generation():
    """JAX's default device is a v5e topology device while the test runs."""
    with jax.default_device(tpu_compile.topology_device("v5e")):
        yield


@pytest.fixture
def meta_is_tpu(monkeypatch):
    """asickernels.torch routes meta tensors as it routes ``tpu`` tensors."""
    monkeypatch.setattr(akt, "_TPU_DEVICE", "meta")


def split(name: str) -> tuple[dict[str, np.ndarray], dict[str, object]]:
    """``every_argument(name)`` as (arrays, static values) by name; a dtype as TorchTPU hands
    it to the JAX function (a numpy dtype, not a scalar type)."""
    op = OPS[name]
    values = every_argument(name)
    arrays = {n: values.get(n) for n in op.array_names}
    statics = {n: values[n] for n in op.static_names if n in values}
    return arrays, {n: np.dtype(v) if n == "out_dtype" else v for n, v in statics.items()}


def as_tensors(arrays: dict[str, np.ndarray | None], device: str) -> dict[str, torch.Tensor]:
    return {n: torch.as_tensor(a, device=device) for n, a in arrays.items() if a is not None}


def torch_statics(statics: dict[str, object]) -> dict[str, object]:
    """Static values as a torch caller passes them (dtypes as torch dtypes)."""
    return {n: ops.torch_dtype(v) if n == "out_dtype" else v for n, v in statics.items()}


def declared(name: str) -> list[tuple[tuple[int, ...], str]]:
    arrays, statics = split(name)
    plan = OPS[name].plan(arrays, **statics)
    return [(s.shape, f"torch.{s.dtype}") for s in plan.output_list()]


def shapes(value: torch.Tensor | tuple[torch.Tensor, ...]) -> list[tuple[tuple[int, ...], str]]:
    values = value if isinstance(value, tuple) else (value,)
    return [(tuple(v.shape), str(v.dtype)) for v in values]


def arguments(schema: torch.FunctionSchema) -> list[tuple[str, str, bool, object]]:
    return [
        (a.name, str(a.type).replace("SymInt", "int"), a.kwarg_only, a.default_value)
        for a in schema.arguments
    ]


@pytest.mark.parametrize("name", [*OPS, *(f"{n}_backward" for n in DIFFERENTIABLE)])
def test_schema_is_the_torch_operators(name):
    tpu = getattr(torch.ops.asickernels_tpu, name).default._schema
    cpu = getattr(torch.ops.asickernels, name).default._schema
    assert arguments(tpu) == arguments(cpu)
    assert [str(r.type) for r in tpu.returns] == [str(r.type) for r in cpu.returns]
    assert not torch.accelerator.is_available()  # what makes a tpu tensor unsafe here


@pytest.mark.parametrize("name", list(OPS))
def test_make_fx_traces_the_torch_tpu_operator_with_declared_outputs(
    name, meta_is_tpu, on_tpu_generation
):
    arrays, statics = split(name)
    tensors = as_tensors(arrays, "meta")

    def call(*given: torch.Tensor) -> object:
        return getattr(akt, name)(**dict(zip(tensors, given, strict=True)), **statics)

    graph = make_fx(call, tracing_mode="fake")(*tensors.values())
    targets = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    operator = getattr(torch.ops.asickernels_tpu, name).default
    assert operator in targets
    assert getattr(torch.ops.asickernels, name).default not in targets
    (node,) = [n for n in graph.graph.nodes if n.target is operator]
    assert shapes(node.meta["val"]) == declared(name)


def test_other_devices_keep_the_torch_operators():
    boxes = torch.zeros(3, 4, device="meta")
    graph = make_fx(lambda a, b: akt.giou(a, b), tracing_mode="fake")(boxes, boxes)
    targets = [n.target for n in graph.graph.nodes]
    assert torch.ops.asickernels.giou.default in targets
    assert torch.ops.asickernels_tpu.giou.default not in targets


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_gradients_trace_through_the_backward_operator(name, meta_is_tpu, on_tpu_generation):
    op = OPS[name]
    arrays, statics = split(name)
    tensors = as_tensors(arrays, "meta")

    def loss_gradients(*given: torch.Tensor) -> tuple[torch.Tensor, ...]:
        inputs = dict(zip(tensors, given, strict=True))
        wrt = [inputs[n].requires_grad_() for n in op.differentiable]
        out = getattr(akt, name)(**inputs, **statics)
        return torch.autograd.grad(out.sum(), wrt)

    graph = make_fx(loss_gradients, tracing_mode="fake")(*tensors.values())
    backward = getattr(torch.ops.asickernels_tpu, f"{name}_backward").default
    (node,) = [n for n in graph.graph.nodes if n.target is backward]
    grads = node.meta["val"] if isinstance(node.meta["val"], tuple) else (node.meta["val"],)
    assert [tuple(g.shape) for g in grads] == [tuple(tensors[n].shape) for n in op.differentiable]
    outputs = next(n for n in graph.graph.nodes if n.op == "output").args[0]
    assert [tuple(o.meta["val"].shape) for o in outputs] == [g.shape for g in grads]


def exported(function, arrays, statics, generation):
    """``function`` exported for TPU as TorchTPU exports it (``jax.export`` of ``jax.jit``,
    custom-call checks off: torch_tpu/_internal/pallas/pallas.py, JaxCallable), lowered for
    ``generation``; with the argument specs on one of its devices."""
    device = tpu_compile.topology_device(generation)
    sharding = jax.sharding.SingleDeviceSharding(device)
    specs = [
        None if a is None else jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype)
        for a in arrays
    ]
    with jax.default_device(device):
        module = jax.export.export(
            jax.jit(function, static_argnames=[*statics, "backend"]),
            platforms=["tpu"],
            disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("ALL")],
        )(*specs, **statics)
    placed = [None if s is None else s.update(sharding=sharding) for s in specs]
    return module, placed


@pytest.mark.parametrize("generation", compile_gate.GATE_GENERATIONS)
@pytest.mark.parametrize("name", list(OPS))
def test_exported_module_compiles_for_tpu(name, generation):
    """The module TorchTPU hands its runtime, compiled by libtpu: Mosaic kernels where the
    op's TPU backend is Pallas; an error (Mosaic, VMEM) fails the test."""
    op = OPS[name]
    arrays, statics = split(name)
    module, placed = exported(torch_tpu.forward_function(op), arrays.values(), statics, generation)
    with jax.default_device(tpu_compile.topology_device(generation)):
        values = {**arrays, **statics, "backend": None}
        pallas = torch_tpu.tpu_backend(op, values) == "pallas_tpu"
    assert ("tpu_custom_call" in module.mlir_module()) == pallas
    assert [(a.shape, f"torch.{a.dtype}") for a in module.out_avals] == declared(name)
    compiled = jax.jit(module.call).lower(*placed).compile()
    assert compiled.memory_analysis() is not None


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_exported_backward_compiles_for_tpu(name):
    op = OPS[name]
    arrays, statics = split(name)
    (out_shape, _), *_ = declared(name)
    cotangent = np.ones(out_shape, np.float32)
    module, placed = exported(
        torch_tpu.backward_function(op), [cotangent, *arrays.values()], statics, "v5e"
    )
    jax.jit(module.call).lower(*placed).compile()


@pytest.mark.parametrize("name", list(OPS))
def test_the_registered_function_agrees_with_the_reference(name):
    """The function the operator exports, run on the CPU: Pallas kernels in interpret mode."""
    arrays, statics = split(name)
    got = jax.jit(torch_tpu.forward_function(OPS[name]), static_argnames=list(statics))(
        **arrays, **statics
    )
    oracle.assert_agrees(OPS[name], got, oracle.expected(OPS[name], arrays, statics))


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_the_registered_backward_is_the_torch_gradient(name):
    """The backward function, on the CPU in interpret mode, against autograd of the CPU torch
    operator (itself held to the reference in test_torch_frontend.py)."""
    op = OPS[name]
    arrays, statics = split(name)
    tensors = as_tensors(arrays, "cpu")
    for n in op.differentiable:
        tensors[n].requires_grad_()
    out = getattr(akt, name)(**tensors, **torch_statics(statics))
    cotangent = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
    want = torch.autograd.grad(out, [tensors[n] for n in op.differentiable], cotangent)
    function = jax.jit(torch_tpu.backward_function(op), static_argnames=list(statics))
    got = function(cotangent.numpy(), **arrays, **statics)
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=2e-4, atol=2e-5)


def test_int8_matmul_takes_a_torch_out_dtype(on_tpu_generation):
    arrays, _ = split("int8_matmul")
    tensors = as_tensors(arrays, "meta")
    out = torch_tpu.OPERATORS["int8_matmul"](*tensors.values(), out_dtype=torch.bfloat16)
    assert (tuple(out.shape), out.dtype) == ((8, 2), torch.bfloat16)


def test_a_bad_argument_is_refused_naming_it(on_tpu_generation):
    boxes = torch.empty(5, 3, device="meta")
    with pytest.raises(ValueError, match="boxes1"):
        torch_tpu.OPERATORS["giou"](boxes, boxes)


# SPMD: the batch-partitioned ops over a 4-chip v5e slice (v5e:2x2), batch split 4 ways.
MESH_TOPOLOGY = "v5e:2x2"


@pytest.fixture(scope="module")
def mesh():
    from jax.experimental import topologies

    tpu_compile.topology_device("v5e")  # sets the environment libtpu needs here
    devices = topologies.get_topology_desc(platform="tpu", topology_name=MESH_TOPOLOGY).devices
    return jax.sharding.Mesh(np.array(devices), ("batch",))


BATCHED = [op.name for op in asickernels.OPS if op.partition == "batch"]


@pytest.mark.parametrize("name", BATCHED)
def test_sharded_operator_takes_and_returns_local_shards(name, mesh):
    """Each rank passes its shard (here one of 4 along the leading dim) and gets its shard
    of each output: the declared outputs of the global batch, split 4 ways."""
    op = OPS[name]
    spec = jax.sharding.PartitionSpec("batch")
    operator = torch_tpu.sharded(op, mesh, spec, name=f"{name}_over_batch")
    arrays, statics = split(name)
    batch = {n: np.broadcast_to(a, (8, *np.shape(a))) for n, a in arrays.items() if a is not None}
    local = [
        torch.empty((2, *a.shape[1:]), dtype=ops.torch_dtype(a.dtype), device="meta")
        for a in batch.values()
    ]
    with jax.default_device(mesh.devices.flat[0]):
        out = operator(*local, **torch_statics(statics))
    plan = op.plan(batch, **statics)
    want = [((s.shape[0] // 4, *s.shape[1:]), f"torch.{s.dtype}") for s in plan.output_list()]
    assert shapes(out) == want


@pytest.mark.parametrize("name", ["giou", "nms"])
def test_sharded_module_compiles_for_a_multi_chip_slice(name, mesh):
    """The sharded function exported as TorchTPU exports it, compiled by libtpu for the
    4-chip slice: one Mosaic kernel per shard inside shard_map, no collectives needed."""
    op = OPS[name]
    spec = jax.sharding.PartitionSpec("batch")
    arrays, statics = split(name)
    sharding = jax.sharding.NamedSharding(mesh, spec)
    specs = [
        jax.ShapeDtypeStruct((8, *np.shape(a)), np.asarray(a).dtype, sharding=sharding)
        for a in arrays.values()
    ]
    with jax.default_device(mesh.devices.flat[0]):
        module = jax.export.export(
            jax.jit(torch_tpu.sharded_function(op, mesh, spec), static_argnames=list(statics)),
            platforms=["tpu"],
            disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("ALL")],
        )(*specs, **statics)
    assert module.nr_devices == 4
    assert "tpu_custom_call" in module.mlir_module()
    compiled = jax.jit(module.call).lower(*specs).compile()
    assert compiled.memory_analysis() is not None


LOSSES = [op.name for op in asickernels.OPS if op.partition == "loss"]
P = jax.sharding.PartitionSpec


def loss_arguments(name: str, reduction: str) -> tuple[dict[str, np.ndarray], dict[str, object]]:
    """A loss's arguments with a global batch of 8 images (every_argument's 5 boxes each)."""
    values = every_argument(name, batch=(8,))
    arrays = {n: values[n] for n in OPS[name].array_names}
    return arrays, {"reduction": reduction}


@pytest.mark.parametrize(
    "name, reduction",
    [("giou_loss", r) for r in ("none", "sum", "mean")] + [(n, "mean") for n in LOSSES[1:]],
)
def test_sharded_loss_takes_local_shards_and_returns_the_whole_reduction(name, reduction, mesh):
    """Each rank passes its 2 of the 8 images; ``"none"`` returns its shard of the per-box
    losses, ``"sum"``/``"mean"`` the scalar of the global batch."""
    op = OPS[name]
    operator = torch_tpu.sharded(op, mesh, P("batch"), name=f"{name}_over_batch")
    arrays, statics = loss_arguments(name, reduction)
    local = [
        torch.empty((2, *a.shape[1:]), dtype=ops.torch_dtype(a.dtype), device="meta")
        for a in arrays.values()
    ]
    with jax.default_device(mesh.devices.flat[0]):
        out = operator(*local, **statics)
    assert tuple(out.shape) == ((2, 5) if reduction == "none" else ())


@pytest.fixture(scope="module")
def square_mesh(mesh):
    """The 4-chip slice as 2 x 2: rows and columns."""
    return jax.sharding.Mesh(mesh.devices.reshape(2, 2), ("rows", "cols"))


# x [8, 7] @ y [7, 2]: K = 7 splits no way, so K is split on an [8, 8] @ [8, 2] variant.
MATMUL_LAYOUTS = [
    ({"m_axis": "rows", "n_axis": "cols"}, (8, 7)),
    ({"m_axis": "rows", "k_axis": "cols"}, (8, 8)),
    ({"k_axis": "rows", "n_axis": "cols"}, (8, 8)),
]


def matmul_arguments(x_shape: tuple[int, int]) -> tuple[dict[str, np.ndarray], dict[str, object]]:
    arrays, statics = split("int8_matmul")
    rng = np.random.default_rng(5)
    k = x_shape[1]
    x = rng.integers(-128, 128, x_shape, dtype=np.int8)
    y = rng.integers(-128, 128, (k, arrays["y"].shape[1]), dtype=np.int8)
    return {**arrays, "x": x, "y": y}, statics


@pytest.mark.parametrize("axes, x_shape", MATMUL_LAYOUTS)
def test_sharded_int8_matmul_takes_and_returns_local_blocks(axes, x_shape, square_mesh):
    """Each rank passes its block of x and y and the whole scales, and gets its block of
    the ``[M, N]`` result, sharded (m_axis, n_axis)."""
    operator = torch_tpu.sharded(
        OPS["int8_matmul"], square_mesh, name=f"int8_matmul_over_{'_'.join(axes)}", **axes
    )
    arrays, statics = matmul_arguments(x_shape)
    m, k = x_shape
    n = arrays["y"].shape[1]
    local_m, local_k, local_n = (  # each mesh axis splits 2 ways
        size // (2 if f"{d}_axis" in axes else 1) for d, size in (("m", m), ("k", k), ("n", n))
    )
    local = [
        torch.empty((local_m, local_k), dtype=torch.int8, device="meta"),
        torch.empty((local_k, local_n), dtype=torch.int8, device="meta"),
        torch.empty(arrays["x_scale"].shape, device="meta"),
        torch.empty(arrays["y_scale"].shape, device="meta"),
    ]
    with jax.default_device(square_mesh.devices.flat[0]):
        out = operator(*local, **torch_statics(statics))
    assert (tuple(out.shape), out.dtype) == ((local_m, local_n), torch.float32)


def exported_over(function, mesh, arrays, partition, statics):
    """``function`` exported for the slice as TorchTPU exports it, the global arrays placed
    as ``partition`` says."""
    specs = [
        jax.ShapeDtypeStruct(
            np.shape(a), np.asarray(a).dtype, sharding=jax.sharding.NamedSharding(mesh, s)
        )
        for a, s in zip(arrays, partition, strict=True)
    ]
    with jax.default_device(mesh.devices.flat[0]):
        module = jax.export.export(
            jax.jit(function, static_argnames=list(statics)),
            platforms=["tpu"],
            disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("ALL")],
        )(*specs, **statics)
    return module, specs


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_sharded_loss_compiles_for_a_multi_chip_slice(reduction, mesh):
    """The loss across the 4 chips: Mosaic kernels per shard, the reduction all-reduced and
    replicated; ``"none"`` stays sharded."""
    op = OPS["giou_loss"]
    arrays, statics = loss_arguments("giou_loss", reduction)
    inputs, _ = torch_tpu.partition_specs(op, {"batch_spec": P("batch")})
    function = torch_tpu.sharded_function(op, mesh, P("batch"))
    module, specs = exported_over(function, mesh, arrays.values(), inputs, statics)
    assert module.nr_devices == 4
    assert "tpu_custom_call" in module.mlir_module()
    compiled = jax.jit(module.call).lower(*specs).compile()
    sharding = compiled.output_shardings
    assert sharding.is_fully_replicated == (reduction != "none")
    assert ("all-reduce" in compiled.as_text()) == (reduction != "none")


def test_sharded_int8_matmul_compiles_for_a_multi_chip_slice(square_mesh):
    """K split over rows: Mosaic matmuls per block, an exact int32 all-reduce over K."""
    op = OPS["int8_matmul"]
    axes = {"m_axis": None, "k_axis": "rows", "n_axis": "cols"}
    arrays, statics = matmul_arguments((8, 8))
    inputs, _ = torch_tpu.partition_specs(op, axes)
    function = torch_tpu.sharded_function(op, square_mesh, **axes)
    module, specs = exported_over(function, square_mesh, arrays.values(), inputs, statics)
    assert "tpu_custom_call" in module.mlir_module()
    compiled = jax.jit(module.call).lower(*specs).compile()
    sharding = compiled.output_shardings
    assert sharding.spec == P(None, "cols")
    assert "all-reduce" in compiled.as_text()


@pytest.fixture(scope="module")
def host_mesh():
    """8 CPU devices (tests/conftest.py) as 4 x 2."""
    devices = jax.devices("cpu")
    if len(devices) < 8:
        pytest.skip("needs 8 host devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    return jax.sharding.Mesh(np.array(devices[:8]).reshape(4, 2), ("batch", "model"))


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("name", LOSSES)
def test_sharded_loss_agrees_with_the_reference(name, reduction, host_mesh):
    """The registered sharded function on 4 CPU devices (Pallas interpret mode per shard)."""
    arrays, statics = loss_arguments(name, reduction)
    function = torch_tpu.sharded_function(OPS[name], host_mesh, P("batch"))
    got = jax.jit(function, static_argnames=list(statics))(**arrays, **statics)
    oracle.assert_agrees(OPS[name], got, oracle.expected(OPS[name], arrays, statics))


@pytest.mark.parametrize("axes, x_shape", MATMUL_LAYOUTS)
def test_sharded_int8_matmul_agrees_with_the_reference(axes, x_shape, host_mesh):
    """On 4 x 2 CPU devices, the result sharded (m_axis, n_axis)."""
    mesh_axes = {"rows": "batch", "cols": "model"}
    layout = {key: mesh_axes[axis] for key, axis in axes.items()}
    arrays, statics = matmul_arguments(x_shape)
    function = torch_tpu.sharded_function(OPS["int8_matmul"], host_mesh, **layout)
    got = jax.jit(function, static_argnames=list(statics))(**arrays, **statics)
    want = jax.sharding.NamedSharding(host_mesh, P(layout.get("m_axis"), layout.get("n_axis")))
    assert got.sharding.is_equivalent_to(want, got.ndim)
    oracle.assert_agrees(
        asickernels.int8_matmul, got, oracle.expected(asickernels.int8_matmul, arrays, statics)
    )


SHARDED_DIFFERENTIABLE = [
    (name, reduction)
    for name in DIFFERENTIABLE
    if OPS[name].partition != "none"
    for reduction in (("none", "sum", "mean") if OPS[name].partition == "loss" else (None,))
]


def sharded_arguments(name: str, reduction: str | None):
    """A differentiable sharded op's global arguments: a batch of 8."""
    if reduction is not None:
        return loss_arguments(name, reduction)
    return dict(every_argument(name, batch=(8,))), {}


@pytest.mark.parametrize("name, reduction", SHARDED_DIFFERENTIABLE)
def test_sharded_gradients_trace_through_the_sharded_backward_operator(name, reduction, mesh):
    """Each rank gets the gradients of its shards, from the ``_backward`` operator over
    the mesh."""
    op = OPS[name]
    operator = torch_tpu.sharded(op, mesh, P("batch"), name=f"{name}_grad_over_batch")
    arrays, statics = sharded_arguments(name, reduction)
    local = {
        n: torch.empty((2, *a.shape[1:]), dtype=ops.torch_dtype(a.dtype), device="meta")
        for n, a in arrays.items()
    }

    def loss_gradients(*given: torch.Tensor) -> tuple[torch.Tensor, ...]:
        inputs = dict(zip(local, given, strict=True))
        wrt = [inputs[n].requires_grad_() for n in op.differentiable]
        return torch.autograd.grad(operator(*inputs.values(), **statics).sum(), wrt)

    with jax.default_device(mesh.devices.flat[0]):
        graph = make_fx(loss_gradients, tracing_mode="fake")(*local.values())
    gc.collect()  # a replaced registration's library, collected, drops torch.ops' cached op
    backward = getattr(torch.ops.asickernels_tpu, f"{name}_grad_over_batch_backward").default
    assert backward in [n.target for n in graph.graph.nodes]
    outputs = next(n for n in graph.graph.nodes if n.op == "output").args[0]
    assert [tuple(o.meta["val"].shape) for o in outputs] == [
        tuple(local[n].shape) for n in op.differentiable
    ]


def test_sharded_backward_compiles_for_a_multi_chip_slice(mesh):
    op = OPS["giou_loss"]
    arrays, statics = loss_arguments("giou_loss", "mean")
    inputs, outputs = torch_tpu.partition_specs(op, {"batch_spec": P("batch")})
    function = torch_tpu.sharded_backward_function(op, mesh, P("batch"))
    given = [np.ones(arrays["preds"].shape[:-1], np.float32), *arrays.values()]
    module, specs = exported_over(function, mesh, given, [*outputs, *inputs], statics)
    assert "tpu_custom_call" in module.mlir_module()
    jax.jit(module.call).lower(*specs).compile()


@pytest.mark.parametrize("name, reduction", SHARDED_DIFFERENTIABLE)
def test_sharded_backward_is_the_unsharded_backward(name, reduction, host_mesh):
    """On 4 CPU devices, against the unsharded backward function (itself held to the CPU
    operator's autograd above); a reduced loss's cotangent broadcast over the boxes."""
    op = OPS[name]
    arrays, statics = sharded_arguments(name, reduction)
    (out_shape, _), *_ = [(s.shape, s.dtype) for s in op.plan(arrays, **statics).output_list()]
    cotangent = np.linspace(-1, 1, int(np.prod(out_shape)), dtype=np.float32).reshape(out_shape)
    unsharded_cotangent = cotangent
    sharded = torch_tpu.sharded_backward_function(op, host_mesh, P("batch"))
    if reduction is not None:
        cotangent = np.broadcast_to(cotangent, arrays["preds"].shape[:-1])
    got = jax.jit(sharded, static_argnames=list(statics))(cotangent, **arrays, **statics)
    want = jax.jit(torch_tpu.backward_function(op), static_argnames=list(statics))(
        unsharded_cotangent, **arrays, **statics
    )
    got, want = (g if isinstance(g, tuple) else (g,) for g in (got, want))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=1e-6)


def test_registering_a_name_again_returns_its_operator_or_is_refused(mesh):
    """The same op, mesh and partition: the operator registered first. Anything else under
    a taken name is refused (jax_op would silently replace the earlier operator)."""
    giou = torch_tpu.sharded(OPS["giou"], mesh, P("batch"), name="giou_registered_twice")
    again = torch_tpu.sharded(OPS["giou"], mesh, P("batch"), name="giou_registered_twice")
    assert again is giou
    with pytest.raises(ValueError, match="name: asickernels_tpu::giou_registered_twice is"):
        torch_tpu.sharded(OPS["diou"], mesh, P("batch"), name="giou_registered_twice")
    with pytest.raises(ValueError, match="already registered over another op, mesh or"):
        torch_tpu.sharded(OPS["giou"], mesh, P(None), name="giou_registered_twice")
    for taken in ("giou", "giou_loss_backward", "giou_registered_twice_backward"):
        with pytest.raises(ValueError, match=f"asickernels_tpu::{taken} is already an"):
            torch_tpu.sharded(OPS["giou"], mesh, P("batch"), name=taken)


def test_ops_without_a_partition_rule_are_refused_over_a_mesh(mesh):
    with pytest.raises(ValueError, match="roi_align has no partition rule"):
        torch_tpu.sharded(OPS["roi_align"], mesh, P("batch"), name="roi_align_over_batch")


@pytest.mark.parametrize(
    "name, partition, match",
    [
        ("int8_matmul", {"batch_spec": P("batch")}, "batch_spec: int8_matmul is split by m_axis"),
        ("giou", {}, "batch_spec: giou is split along its batch dims"),
        ("giou_loss", {"batch_spec": P("batch"), "m_axis": "batch"}, "batch_spec: giou_loss"),
        ("giou", {"batch_spec": P(("batch", "model"))}, "splits a dim over several mesh axes"),
    ],
)
def test_a_partition_that_does_not_fit_the_rule_is_refused_naming_it(name, partition, match, mesh):
    with pytest.raises(ValueError, match=match):
        torch_tpu.sharded(OPS[name], mesh, name=f"{name}_refused", **partition)
