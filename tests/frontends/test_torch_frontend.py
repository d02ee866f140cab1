"""The PyTorch frontend (``asickernels.torch``): the conformance cases through
``torch.ops.asickernels`` on CPU tensors and on torch_xla tensors, gradients
(``gradcheck`` in float64), fake implementations (``opcheck``, ``torch.compile``), and
agreement with torchvision. Runs in the torch/torch_xla environment
(``make test-torch-xla``); skipped where torch is not installed."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

os.environ.setdefault("PJRT_DEVICE", "CPU")

import ml_dtypes
import numpy as np
import pytest
from frontend_cases import every_argument, parameters

from asickernels.kernels.cases import grid_boxes, random_boxes
from asickernels.kernels.giou_cases import giou_cases
from asickernels.kernels.int8_matmul_cases import matmul_cases
from asickernels.kernels.nms_cases import nms_cases

torch = pytest.importorskip("torch")
try:
    import torch_xla

    # Before any backward pass: the autograd engine counts each device type's devices once,
    # at its first backward, and the XLA runtime reports its devices once initialised.
    torch_xla.device()
except ImportError:
    pass

import asickernels  # noqa: E402
import asickernels.torch as at  # noqa: E402
from asickernels.kernels import oracle  # noqa: E402
from asickernels.kernels.giou import reference_giou_vjp  # noqa: E402
from asickernels.torch import ops  # noqa: E402


def tensor(array: np.ndarray | None, device: str = "cpu"):
    if array is None:
        return None
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(np.array(array, copy=True)).to(device)


def _fast(cases):
    return [pytest.param(c, id=c.name) for c in cases if not getattr(c, "slow", False)]


def _xla_device():
    pytest.importorskip("torch_xla")
    import torch_xla

    return torch_xla.device()


# Each function is its op's -----------------------------------------------------------------


@pytest.mark.parametrize("op", asickernels.OPS, ids=lambda op: op.name)
def test_each_function_has_its_ops_signature_without_config(op):
    function = getattr(at, op.name)
    want = [p for p in parameters(op.__signature__) if p[0] != "config"]
    assert parameters(inspect.signature(function)) == want
    assert function.__module__ == "asickernels.torch" and function.__doc__


def test_the_functions_are_the_ops():
    assert sorted(at.__all__) == sorted(op.name for op in asickernels.OPS)


@pytest.mark.parametrize("op", asickernels.OPS, ids=lambda op: op.name)
def test_each_function_passes_every_argument_to_its_op(op):
    """The torch function, called with every argument (positional ones by position),
    returns what the JAX op returns."""
    values = every_argument(op.name)
    assert set(values) == {p.name for p in op.params}
    positional = [values[p.name] for p in op.params if p.positional]
    keyword = {p.name: values[p.name] for p in op.params if not p.positional}

    def as_torch(value):
        if isinstance(value, np.ndarray):
            return tensor(value)
        return torch.float32 if value is np.float32 else value

    got = getattr(at, op.name)(
        *map(as_torch, positional), **{n: as_torch(v) for n, v in keyword.items()}
    )
    want = op(*positional, **keyword)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert isinstance(g, torch.Tensor) and g.dtype == ops.torch_dtype(w.dtype)
        np.testing.assert_allclose(g.numpy(), np.asarray(w), rtol=1e-5, atol=1e-6)


# The conformance cases ---------------------------------------------------------------------


@pytest.mark.parametrize("case", _fast(giou_cases()))
def test_giou_cases_on_cpu(case):
    b1, b2 = tensor(case.boxes1), tensor(case.boxes2)
    before = (b1.clone(), b2.clone())
    got = at.giou(b1, b2)
    wide = case.boxes1.dtype == np.float64
    assert got.dtype == (torch.float64 if wide else torch.float32)
    assert tuple(got.shape) == case.boxes1.shape[:-1]
    oracle.assert_agrees(asickernels.giou, got.numpy(), _reference_giou(case))
    assert torch.equal(b1, before[0]) and torch.equal(b2, before[1])


def _run_nms(case, device="cpu", backend=None):
    boxes, scores = tensor(case.boxes, device), tensor(case.scores, device)
    options = {**case.kwargs(), "backend": backend}
    if case.categories is None:
        return at.nms(boxes, scores, **options)
    return at.batched_nms(boxes, scores, tensor(case.categories, device), **options)


def _reference_giou(case):
    return oracle.expected(asickernels.giou, {"boxes1": case.boxes1, "boxes2": case.boxes2}, {})


def _reference_nms(case):
    arrays = {"boxes": case.boxes, "scores": case.scores}
    if case.categories is None:
        return oracle.expected(asickernels.nms, arrays, case.kwargs())
    return oracle.expected(
        asickernels.batched_nms, {**arrays, "idxs": case.categories}, case.kwargs()
    )


@pytest.mark.parametrize("case", _fast(nms_cases()))
def test_nms_cases_on_cpu(case):
    indices, num_valid = _run_nms(case)
    want_indices, want_valid = _reference_nms(case)
    assert indices.dtype == torch.int32 and num_valid.dtype == torch.int32
    np.testing.assert_array_equal(indices.numpy(), want_indices)
    np.testing.assert_array_equal(num_valid.numpy(), want_valid)


def _run_matmul(case, device="cpu", backend=None):
    out_dtype = None
    if case.out_dtype is not None:
        out_dtype = torch.bfloat16 if case.out_dtype == ml_dtypes.bfloat16 else torch.float32
    scale = {
        k: tensor(np.asarray(v), device)
        for k in ("x_scale", "y_scale")
        if (v := getattr(case, k)) is not None
    }
    return at.int8_matmul(
        tensor(case.x, device),
        tensor(case.y, device),
        out_dtype=out_dtype,
        backend=backend,
        **scale,
    )


def _reference_matmul(case):
    arrays = {"x": case.x, "y": case.y, "x_scale": case.x_scale, "y_scale": case.y_scale}
    return oracle.expected(asickernels.int8_matmul, arrays, {"out_dtype": case.out_dtype})


def _host(tensor_out):
    if tensor_out.dtype == torch.bfloat16:
        return tensor_out.cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor_out.cpu().numpy()


@pytest.mark.parametrize("case", _fast(matmul_cases()))
def test_int8_matmul_cases_on_cpu(case):
    got = _run_matmul(case)
    want = _reference_matmul(case)
    if want.dtype == np.int32:
        assert got.dtype == torch.int32
    oracle.assert_agrees(asickernels.int8_matmul, _host(got), want)


def test_quantize_int8_matches_the_jax_op():
    import asickernels

    x = np.random.default_rng(0).normal(size=(33, 17)).astype(np.float32)
    for axis in (None, 0, 1, -1):
        q, scale = at.quantize_int8(tensor(x), axis=axis)
        want_q, want_scale = asickernels.quantize_int8(x, axis=axis)
        np.testing.assert_array_equal(q.numpy(), np.asarray(want_q))
        # Jitted, XLA may divide by 127 as a multiply by 1/127: one ulp apart from eager.
        np.testing.assert_allclose(scale.numpy(), np.asarray(want_scale), rtol=2e-7)


def test_invalid_inputs_raise_the_jax_api_errors():
    boxes = torch.zeros(3, 5)
    with pytest.raises(ValueError, match=r"shape \[\.\.\., 4\]"):
        at.giou(boxes, boxes)
    with pytest.raises(ValueError, match=r"shape \[\.\.\., 4\]"):
        at.giou(boxes.double(), boxes.double())  # the float64 path checks the same way
    with pytest.raises(ValueError, match="iou_threshold"):
        at.nms(torch.zeros(4, 4), torch.zeros(4), iou_threshold=1.5, max_output_size=2)
    with pytest.raises(TypeError, match="must be int8"):
        at.int8_matmul(torch.zeros(2, 2), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="mask must have shape"):
        at.giou_loss(torch.zeros(3, 4), torch.zeros(3, 4), mask=torch.ones(4, dtype=torch.bool))


def test_bad_argument_types_raise_type_errors_naming_them():
    boxes = torch.zeros(3, 4)
    with pytest.raises(TypeError, match="boxes1 must be a tensor, got None"):
        at.giou(None, boxes)
    with pytest.raises(TypeError, match="boxes2 must be a tensor, got None"):
        torch.ops.asickernels.giou(boxes.requires_grad_(), None)
    with pytest.raises(TypeError, match="boxes2 must be a tensor or array-like, got str"):
        at.giou(boxes, "boxes")
    with pytest.raises(TypeError, match="argument 'iou_threshold'"):
        at.nms(torch.zeros(4, 4), torch.zeros(4), iou_threshold=None, max_output_size=2)
    with pytest.raises(TypeError, match="argument 'backend'"):
        at.giou(boxes, boxes, backend=3)
    with pytest.raises(TypeError, match="config"):
        at.giou(boxes, boxes, config={})


# Gradients ---------------------------------------------------------------------------------


def _boxes64(seed: int, shape: tuple[int, ...]):
    """float64 boxes with every coordinate distinct, so no max/min sits on a tie (a kink)
    where finite differences are meaningless."""
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 10, shape + (2,))
    boxes = np.concatenate([xy, xy + rng.uniform(0.5, 6, shape + (2,))], -1)
    return torch.from_numpy(boxes).requires_grad_()


def test_giou_gradcheck_float64():
    b1, b2 = _boxes64(0, (2, 3)), _boxes64(1, (2, 3))
    assert torch.autograd.gradcheck(at.giou, (b1, b2))
    assert at.giou(b1, b2).dtype == torch.float64


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_giou_loss_gradcheck_float64(reduction):
    b1, b2 = _boxes64(2, (2, 4)), _boxes64(3, (2, 4))
    mask = torch.tensor([[True, False, True, True], [False, True, True, False]])
    assert torch.autograd.gradcheck(
        lambda p, t: at.giou_loss(p, t, mask=mask, reduction=reduction), (b1, b2)
    )


def test_float64_gradient_is_the_reference_gradient():
    """float64 is differentiated in float64 (to the oracle's float64 tolerance)."""
    b1, b2 = _boxes64(5, (11,)), _boxes64(6, (11,))
    cotangent = torch.from_numpy(np.random.default_rng(7).normal(size=11))
    d1, d2 = torch.autograd.grad(at.giou(b1, b2), (b1, b2), cotangent)
    assert d1.dtype == torch.float64
    arrays = {"boxes1": b1.detach().numpy(), "boxes2": b2.detach().numpy()}
    want = oracle.expected(asickernels.giou_vjp, {**arrays, "cotangent": cotangent.numpy()}, {})
    oracle.assert_agrees(asickernels.giou_vjp, (d1.numpy(), d2.numpy()), want)


@pytest.mark.parametrize("case", _fast([c for c in giou_cases() if c.boxes1.dtype == np.float32]))
def test_float32_gradient_matches_reference(case):
    b1 = tensor(case.boxes1).requires_grad_()
    b2 = tensor(case.boxes2).requires_grad_()
    cotangent = np.random.default_rng(7).normal(size=case.boxes1.shape[:-1]).astype(np.float32)
    if b1.numel():
        at.giou(b1, b2).backward(tensor(cotangent))
    else:
        at.giou(b1, b2).sum().backward()
    want1, want2 = reference_giou_vjp(case.boxes1, case.boxes2, cotangent)
    np.testing.assert_allclose(b1.grad.numpy(), want1, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(b2.grad.numpy(), want2, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_loss_padding_gets_exactly_zero_gradient(dtype):
    rng = np.random.default_rng(8)
    preds = random_boxes(rng, (4, 9))
    targets = random_boxes(rng, (4, 9))
    mask = rng.uniform(size=(4, 9)) < 0.5
    preds[~mask] = np.nan
    p = tensor(preds).to(dtype).requires_grad_()
    t = tensor(targets).to(dtype).requires_grad_()
    loss = at.giou_loss(p, t, mask=tensor(mask))
    want = asickernels.giou_loss.reference(preds, targets, mask=mask)
    np.testing.assert_allclose(loss.item(), want, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5)
    loss.backward()
    assert torch.all(p.grad[tensor(~mask)] == 0) and torch.all(torch.isfinite(p.grad))
    assert torch.all(t.grad[tensor(~mask)] == 0) and p.grad.dtype == dtype


# Fake implementations ----------------------------------------------------------------------


def _opcheck_cases():
    rng = np.random.default_rng(9)
    boxes = tensor(grid_boxes(rng, (2, 30)))
    scores = tensor(rng.permutation(60).reshape(2, 30).astype(np.float32))
    x = tensor(rng.integers(-128, 128, (5, 7), dtype=np.int8))
    y = tensor(rng.integers(-128, 128, (7, 3), dtype=np.int8))
    b1 = tensor(random_boxes(rng, (6,))).requires_grad_()
    b2 = tensor(random_boxes(rng, (6,)))
    nms_options = {"iou_threshold": 0.3, "max_output_size": 8}
    return {
        "giou": (torch.ops.asickernels.giou, (b1, b2), {}),
        "giou_float64": (
            torch.ops.asickernels.giou,
            (b1.detach().double().requires_grad_(), b2.double()),
            {},
        ),
        "giou_loss": (
            torch.ops.asickernels.giou_loss,
            (b1, b2, torch.arange(6) % 2 == 0),
            {"reduction": "mean"},
        ),
        "giou_backward": (
            torch.ops.asickernels.giou_backward,
            (torch.ones(6), b1.detach(), b2),
            {},
        ),
        "nms": (
            torch.ops.asickernels.nms,
            (boxes, scores),
            {**nms_options, "score_threshold": 0.5},
        ),
        "batched_nms": (
            torch.ops.asickernels.batched_nms,
            (boxes, scores, torch.arange(60).reshape(2, 30) % 3),
            nms_options,
        ),
        "int8_matmul": (torch.ops.asickernels.int8_matmul, (x, y), {}),
        "int8_matmul_scaled": (
            torch.ops.asickernels.int8_matmul,
            (x, y, torch.ones(5), torch.tensor(0.5)),
            {"out_dtype": torch.bfloat16},
        ),
        "quantize_int8": (
            torch.ops.asickernels.quantize_int8,
            (tensor(rng.normal(size=(4, 6)).astype(np.float32)),),
            {"axis": 1},
        ),
    }


@pytest.mark.parametrize("name", list(_opcheck_cases()))
def test_opcheck(name):
    op, args, kwargs = _opcheck_cases()[name]
    torch.library.opcheck(op, args, kwargs)


def test_traces_under_torch_compile():
    rng = np.random.default_rng(10)
    preds = tensor(random_boxes(rng, (3, 8))).requires_grad_()
    targets = tensor(random_boxes(rng, (3, 8)))
    boxes = tensor(grid_boxes(rng, (2, 40)))
    scores = tensor(rng.permutation(80).reshape(2, 40).astype(np.float32))

    def step(p, t, b, s):
        loss = at.giou_loss(p, t, reduction="sum") * 2
        indices, num_valid = at.nms(b, s, iou_threshold=0.2, max_output_size=10)
        return loss, indices, num_valid

    compiled = torch.compile(step, fullgraph=True)
    loss, indices, num_valid = compiled(preds, targets, boxes, scores)
    want_loss, want_indices, want_valid = step(preds, targets, boxes, scores)
    torch.testing.assert_close(loss, want_loss)
    assert torch.equal(indices, want_indices) and torch.equal(num_valid, want_valid)
    (grad,) = torch.autograd.grad(loss, preds)
    (want_grad,) = torch.autograd.grad(want_loss, preds)
    torch.testing.assert_close(grad, want_grad)


def test_importing_asickernels_does_not_import_torch():
    code = "import sys, asickernels; asickernels.giou([[0.0, 0, 1, 1]], [[0.0, 0, 1, 1]]); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# torchvision, the peer the ops follow ------------------------------------------------------


def test_giou_equals_one_minus_torchvision_loss():
    ops_tv = pytest.importorskip("torchvision.ops")
    rng = np.random.default_rng(11)
    b1, b2 = tensor(random_boxes(rng, (1024, 256))), tensor(random_boxes(rng, (1024, 256)))
    want = 1 - ops_tv.generalized_box_iou_loss(b1, b2, reduction="none")
    torch.testing.assert_close(at.giou(b1, b2), want, atol=2e-5, rtol=0)


@pytest.mark.parametrize("per_category", [False, True])
def test_nms_equals_torchvision(per_category):
    ops_tv = pytest.importorskip("torchvision.ops")
    rng = np.random.default_rng(12)
    boxes = tensor(grid_boxes(rng, (1024,), span=2000, size=120))
    scores = tensor(rng.permutation(1024).astype(np.float32))  # distinct: no tie order to differ on
    if per_category:
        idxs = tensor(rng.integers(0, 5, 1024))
        want = ops_tv.batched_nms(boxes, scores, idxs, 0.1)[:128]
        indices, num_valid = at.batched_nms(
            boxes, scores, idxs, iou_threshold=0.1, max_output_size=128
        )
    else:
        want = ops_tv.nms(boxes, scores, 0.1)[:128]
        indices, num_valid = at.nms(boxes, scores, iou_threshold=0.1, max_output_size=128)
    assert int(num_valid) == len(want)
    assert torch.equal(indices[: len(want)].long(), want)


# torch_xla tensors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case", _fast([c for c in giou_cases() if c.boxes1.size and c.boxes1.size < 10_000])
)
def test_giou_cases_on_xla(case):
    device = _xla_device()
    got = at.giou(tensor(case.boxes1, device), tensor(case.boxes2, device), backend="xla")
    oracle.assert_agrees(asickernels.giou, got.cpu().numpy(), _reference_giou(case))


@pytest.mark.parametrize("case", _fast([c for c in nms_cases() if c.scores.shape[-1] < 1000]))
def test_nms_cases_on_xla(case):
    device = _xla_device()
    indices, num_valid = _run_nms(case, device, backend="xla")
    want_indices, want_valid = _reference_nms(case)
    np.testing.assert_array_equal(indices.cpu().numpy(), want_indices)
    np.testing.assert_array_equal(num_valid.cpu().numpy(), want_valid)


@pytest.mark.parametrize("case", _fast(matmul_cases()))
def test_int8_matmul_cases_on_xla(case):
    device = _xla_device()
    got = _run_matmul(case, device, backend="xla")
    oracle.assert_agrees(asickernels.int8_matmul, _host(got), _reference_matmul(case))


def test_xla_default_runs_the_simulated_pallas_kernels_and_trains():
    """With no backend, XLA CPU tensors run the Pallas kernels (interpret mode): the loss and
    its gradient (through the Pallas backward kernel) equal the CPU path's."""
    device = _xla_device()
    rng = np.random.default_rng(13)
    preds, targets = random_boxes(rng, (2, 70)), random_boxes(rng, (2, 70))
    mask = rng.uniform(size=(2, 70)) < 0.7
    on_xla = tensor(preds, device).requires_grad_()
    loss = at.giou_loss(on_xla, tensor(targets, device), mask=tensor(mask, device))
    loss.backward()
    on_cpu = tensor(preds).requires_grad_()
    want = at.giou_loss(on_cpu, tensor(targets), mask=tensor(mask))
    want.backward()
    torch.testing.assert_close(loss.cpu(), want, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(on_xla.grad.cpu(), on_cpu.grad, atol=1e-6, rtol=1e-5)
    x = tensor(rng.integers(-128, 128, (40, 300), dtype=np.int8))
    y = tensor(rng.integers(-128, 128, (300, 20), dtype=np.int8))
    assert torch.equal(at.int8_matmul(x.to(device), y.to(device)).cpu(), x.int() @ y.int())
    q, scale = at.quantize_int8(tensor(preds, device), axis=0)
    want_q, want_scale = at.quantize_int8(tensor(preds), axis=0)
    assert torch.equal(q.cpu(), want_q) and torch.equal(scale.cpu(), want_scale)


def test_neuron_devices_run_the_neuron_kernels(monkeypatch):
    """On a Neuron host the selection policy sends XLA tensors to the NKI/GpSimd backends
    (simulated here: the platform and the backends' availability are patched), which run on
    host copies; the results come back to the XLA device."""
    device = _xla_device()
    from asickernels.kernels import policy, registry
    from asickernels.torch import xla

    monkeypatch.setattr(xla, "where_xla_tensors_live", lambda: policy.Where("neuron"))
    monkeypatch.setattr(policy, "_SELECTED", {})
    for name in ("gpsimd", "nki"):
        monkeypatch.setitem(
            registry._AVAILABILITY, name, registry.Availability("native", "patched")
        )
    calls = []
    run_on_cpu = ops.run_on_cpu
    monkeypatch.setattr(
        ops,
        "run_on_cpu",
        lambda op, *t, backend, **s: (
            calls.append(backend) or run_on_cpu(op, *t, backend=backend, **s)
        ),
    )
    neuron_choice = policy.candidates(asickernels.giou, policy.Where("neuron"))[0]
    case = next(c for c in giou_cases() if c.name == "random_130")
    got = at.giou(tensor(case.boxes1, device), tensor(case.boxes2, device))
    assert got.device.type == "xla" and calls == [neuron_choice]
    want = oracle.expected(asickernels.giou, {"boxes1": case.boxes1, "boxes2": case.boxes2}, {})
    oracle.assert_agrees(asickernels.giou, got.cpu().numpy(), want)
    case = next(c for c in nms_cases() if c.name == "categories")
    indices, num_valid = _run_nms(case, device)
    assert calls[-1] == policy.candidates(asickernels.nms, policy.Where("neuron"))[0]
    assert num_valid.device.type == "xla"
    want_indices, want_valid = _reference_nms(case)
    np.testing.assert_array_equal(indices.cpu().numpy(), want_indices)
    np.testing.assert_array_equal(num_valid.cpu().numpy(), want_valid)


def test_xla_float64_keeps_its_dtype():
    device = _xla_device()
    b1, b2 = _boxes64(14, (5,)), _boxes64(15, (5,))
    got = at.giou(b1.detach().to(device), b2.detach().to(device), backend="xla")
    assert got.dtype == torch.float64
    want = oracle.expected(asickernels.giou, {"boxes1": b1.detach(), "boxes2": b2.detach()}, {})
    oracle.assert_agrees(asickernels.giou, got.cpu().numpy(), want)
