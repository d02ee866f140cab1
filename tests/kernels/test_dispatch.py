"""The op declarations and the selection policy: eager calls validated once per signature
and run through one jitted function, exact dtypes with x64 scoped to the call, one policy
with visible fallbacks, and bad inputs refused before any kernel runs."""

from __future__ import annotations

import inspect
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import asickernels
from asickernels.kernels import oracle, policy, registry
from asickernels.kernels.cases import grid_boxes, random_boxes
from asickernels.kernels.eager import host_empty, x64_scope


def _x64_enabled() -> bool:
    return bool(jax.config.jax_enable_x64)


def test_every_op_has_the_declared_signature():
    for op in asickernels.OPS:
        names = list(inspect.signature(op).parameters)
        assert names[: len(op.params)] == [p.name for p in op.params]
        assert names[-2:] == ["backend", "config"]
        assert op.__doc__ and "[" in op.__doc__  # docstrings give shapes


def test_eager_calls_validate_once_per_signature(monkeypatch):
    rng = np.random.default_rng(0)
    boxes, other = random_boxes(rng, (64,)), random_boxes(rng, (64,))
    op = asickernels.giou
    checks = []

    def counted(boxes1, boxes2):
        checks.append(boxes1.shape)
        return check(boxes1, boxes2)

    check = op.check
    monkeypatch.setattr(op, "check", counted)
    monkeypatch.setattr(op.eager, "_calls", {})
    monkeypatch.setattr(op.eager, "_executors", {})
    first = asickernels.giou(boxes, other, backend="xla")
    second = asickernels.giou(boxes + 1, other, backend="xla")
    assert checks == [(64, 4)] and len(op.eager._executors) == 1
    asickernels.giou(random_boxes(rng, (65,)), random_boxes(rng, (65,)), backend="xla")
    assert checks == [(64, 4), (65, 4)]  # keyed by backend, statics, shapes and dtypes
    asickernels.giou(jnp.asarray(boxes), other, backend="xla")  # a JAX array: its own key
    assert len(checks) == 3
    jitted = jax.jit(lambda a, b: asickernels.giou(a, b, backend="xla"))(boxes, other)
    np.testing.assert_array_equal(np.asarray(first), np.asarray(jitted))
    assert not np.array_equal(np.asarray(first), np.asarray(second))


def test_a_cached_signature_still_runs_inside_jit_vmap_and_grad():
    rng = np.random.default_rng(4)
    boxes1, boxes2 = random_boxes(rng, (8,)), random_boxes(rng, (8,))
    eager = np.asarray(asickernels.giou(boxes1, boxes2))
    eager = np.asarray(asickernels.giou(boxes1, boxes2))  # the cached signature
    np.testing.assert_array_equal(np.asarray(jax.jit(asickernels.giou)(boxes1, boxes2)), eager)
    np.testing.assert_array_equal(np.asarray(jax.vmap(asickernels.giou)(boxes1, boxes2)), eager)
    grad = jax.grad(lambda b: asickernels.giou(b, boxes2).sum())(boxes1)
    d_boxes1, _ = asickernels.giou_vjp(boxes1, boxes2, np.ones(8, np.float32))
    np.testing.assert_allclose(np.asarray(grad), np.asarray(d_boxes1), rtol=1e-5, atol=1e-6)


def test_a_cached_signature_still_checks_values_every_call():
    x = np.array([1.0, 2.0], np.float32)
    for _ in range(2):
        asickernels.quantize_int8(x)
    with pytest.raises(ValueError, match="NaN or infinite"):
        asickernels.quantize_int8(np.array([1.0, np.nan], np.float32))


def test_empty_inputs_give_filled_outputs_every_call():
    boxes = np.zeros((2, 0, 4), np.float32)
    for _ in range(2):
        indices, num_valid = asickernels.nms(
            boxes, np.zeros((2, 0), np.float32), iou_threshold=0.5, max_output_size=3
        )
        assert isinstance(indices, jax.Array)
        assert np.asarray(indices).tolist() == [[-1] * 3] * 2
        assert np.asarray(num_valid).tolist() == [0, 0]


def test_an_executor_that_always_uses_the_host_returns_the_host_twins_numpy_outputs():
    rng = np.random.default_rng(5)
    arrays = {"boxes1": random_boxes(rng, (5,)), "boxes2": random_boxes(rng, (5,))}
    op = asickernels.giou
    plan = op.plan(arrays)
    host = op.eager.executor("cpu", plan, None, tuple(arrays), "always")(*arrays.values())
    assert type(host) is np.ndarray
    device = op.eager.run("cpu", plan, None, arrays)
    assert isinstance(device, jax.Array)
    np.testing.assert_array_equal(host, np.asarray(device))


def _misaligned(array: np.ndarray) -> np.ndarray:
    """A copy of ``array`` whose data is not 64-byte aligned (XLA copies such inputs)."""
    raw = np.empty(array.size + 1, array.dtype)
    start = 0 if raw.ctypes.data % 64 else 1
    out = raw[start : start + array.size].reshape(array.shape)
    out[...] = array
    assert out.ctypes.data % 64
    return out


def test_eager_numpy_inputs_xla_would_copy_go_to_the_host_twin(monkeypatch):
    """Repeated eager calls of one signature: large numpy inputs XLA would copy go to the
    host twin, aligned ones to the jitted function, decided per call."""
    registry.check_runs_here(asickernels.giou, "cpu")
    host_calls = []
    twin = registry.implementation(asickernels.giou, "cpu", host=True)

    def counted(*args, **kwargs):
        host_calls.append(args[0].shape)
        return twin(*args, **kwargs)

    monkeypatch.setitem(registry._LOADED, (asickernels.giou, "cpu", True), counted)
    rng = np.random.default_rng(0)
    boxes1, boxes2 = random_boxes(rng, (1 << 15,)), random_boxes(rng, (1 << 15,))  # 512 KiB each
    want = oracle.expected(asickernels.giou, {"boxes1": boxes1, "boxes2": boxes2}, {})
    aligned = [host_empty(b.shape, b.dtype) for b in (boxes1, boxes2)]
    for copy, b in zip(aligned, (boxes1, boxes2), strict=True):
        copy[...] = b
    misaligned = [_misaligned(b) for b in (boxes1, boxes2)]
    for inputs, host in [(aligned, 0), (misaligned, 2), (aligned, 0), (misaligned, 2)]:
        host_calls.clear()
        for _ in range(2):
            oracle.assert_agrees(asickernels.giou, asickernels.giou(*inputs), want)
        assert len(host_calls) == host


def test_eager_numpy_inputs_of_a_compute_bound_kernel_stay_compiled(monkeypatch):
    """int8_matmul does O(M K N) work on O(M K + K N) bytes: XLA's copy of unaligned numpy
    inputs does not dominate it, so they stay on the jitted function."""
    registry.check_runs_here(asickernels.int8_matmul, "cpu")

    def forbidden(*args, **kwargs):
        raise AssertionError("the host twin ran")

    monkeypatch.setitem(registry._LOADED, (asickernels.int8_matmul, "cpu", True), forbidden)
    rng = np.random.default_rng(6)
    x = _misaligned(rng.integers(-128, 128, (512, 512), dtype=np.int8))  # 256 KiB each
    y = _misaligned(rng.integers(-128, 128, (512, 512), dtype=np.int8))
    for _ in range(2):
        got = asickernels.int8_matmul(x, y, backend="cpu")
    np.testing.assert_array_equal(np.asarray(got), x.astype(np.int32) @ y.astype(np.int32))


def test_repeated_calls_replay_the_route_of_their_own_signature():
    """Arrays by position or by name, optional ones given, None or left out, statics by
    name: each signature keeps its own route, and a replayed call gives what a first call
    gives."""
    rng = np.random.default_rng(1)
    preds, targets = random_boxes(rng, (33,)), random_boxes(rng, (33,))
    mask = rng.random(33) > 0.3
    arrays = {"preds": preds, "targets": targets, "mask": mask}
    calls = [
        lambda: asickernels.giou_loss(preds, targets, mask=mask, reduction="sum"),
        lambda: asickernels.giou_loss(preds, targets, mask=None, reduction="sum"),
        lambda: asickernels.giou_loss(preds, targets=targets, mask=mask, reduction="sum"),
        lambda: asickernels.giou_loss(preds, targets, reduction="mean"),
    ]
    given = [arrays, {**arrays, "mask": None}, arrays, {**arrays, "mask": None}]
    reductions = ["sum", "sum", "sum", "mean"]
    for _ in range(3):
        for call, inputs, reduction in zip(calls, given, reductions, strict=True):
            want = oracle.expected(asickernels.giou_loss, inputs, {"reduction": reduction})
            oracle.assert_agrees(asickernels.giou_loss, call(), want)


@pytest.mark.parametrize("bad", [True, 1.0])
def test_a_replayed_signature_still_refuses_a_bool_or_float_count(bad):
    """True == 1 == 1.0: a static value's type is part of the route key, so a call replaying
    max_output_size=1's route is still validated."""
    boxes = grid_boxes(np.random.default_rng(2), (3,))
    scores = np.array([0.9, 0.8, 0.7], np.float32)
    for _ in range(2):
        asickernels.nms(boxes, scores, iou_threshold=0.5, max_output_size=1)
    with pytest.raises(TypeError, match="max_output_size"):
        asickernels.nms(boxes, scores, iou_threshold=0.5, max_output_size=bad)


def test_float64_is_decided_in_float64_and_x64_is_left_as_it_was():
    assert not _x64_enabled()
    near = np.array([[0, 0, 1, 1], [0, 0, 0.5 + 5e-10, 1]], np.float64)
    indices, num_valid = asickernels.nms(
        near, np.array([0.9, 0.8]), iou_threshold=0.5, max_output_size=2
    )
    assert int(num_valid) == 1 and np.asarray(indices).tolist() == [0, -1]
    got = asickernels.giou(near, near[::-1])
    assert got.dtype == np.float64
    assert not _x64_enabled()
    # float32 boxes at the same place are both kept: IoU rounds to exactly 0.5.
    _, kept = asickernels.nms(
        near.astype(np.float32), np.array([0.9, 0.8], np.float32), iou_threshold=0.5,
        max_output_size=2,
    )  # fmt: skip
    assert int(kept) == 2


def test_category_ids_keep_their_identity_beyond_int32():
    boxes = np.tile(np.array([[0, 0, 4, 4]], np.float32), (3, 1))
    scores = np.array([0.9, 0.8, 0.7], np.float32)
    for backend in ("xla", "reference"):
        _, kept = asickernels.batched_nms(
            boxes, scores, np.array([0, 2**32, 2**32]), iou_threshold=0.5, max_output_size=3,
            backend=backend,
        )  # fmt: skip
        assert int(kept) == 2  # 0 and 2**32 differ; the two 2**32 boxes suppress each other


def test_dense_ranks_under_jit_with_x64():
    from asickernels.kernels.nms import dense_ranks

    ids = np.array([[5, -3, 5], [2**40, -3, 7]], np.int64)
    with x64_scope(True):
        ranks = np.asarray(jax.jit(lambda i: dense_ranks(jnp, i))(ids))
    host = dense_ranks(np, ids)
    np.testing.assert_array_equal(ranks, host)
    assert ranks.dtype == np.int32
    assert (ranks[0, 0] == ranks[0, 2]) and len(np.unique(ranks)) == len(np.unique(ids))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda: asickernels.nms(
                np.zeros((3, 4), np.float32),
                np.zeros(3, np.float32),
                iou_threshold=0.5,
                max_output_size=2**40,
            ),
            ValueError,
            r"max_output_size must be in \[0, 2147483647\]",
        ),
        (
            lambda: asickernels.quantize_int8(np.array([1.0, np.nan], np.float32)),
            ValueError,
            "NaN or infinite",
        ),
        (
            lambda: asickernels.quantize_int8(np.array([1.0, np.inf], np.float32), axis=0),
            ValueError,
            "NaN or infinite",
        ),
        (
            lambda: asickernels.giou(np.zeros((2, 4)), np.zeros((2, 4)), backend="pallas_tpu"),
            TypeError,
            "float64",
        ),
        (
            lambda: asickernels.giou(np.zeros((2, 4), np.float32), np.zeros((2, 4), np.float32), 3),
            TypeError,
            "giou",
        ),
        (
            lambda: asickernels.quantize_int8(np.zeros(3, np.float32), backend="xla"),
            TypeError,
            "takes no backend",
        ),
        (
            lambda: jax.jit(lambda b: asickernels.giou(b, b, backend="reference"))(
                np.zeros((2, 4), np.float32)
            ),
            TypeError,
            "cannot be traced",
        ),
    ],
)
def test_bad_inputs_are_refused_before_any_kernel(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_quantize_under_jit_gives_non_finite_channels_a_nan_scale():
    x = np.array([[1.0, 2.0], [np.nan, 1.0]], np.float32)
    q, scale = jax.jit(lambda v: asickernels.quantize_int8(v, axis=0))(x)
    assert np.isfinite(np.asarray(scale)[0]) and np.isnan(np.asarray(scale)[1])
    assert np.asarray(q)[1].tolist() == [0, 0]


def test_a_native_backend_passed_over_for_the_generation_warns(monkeypatch):
    """The Pallas int8 kernel has no v4 build: the policy runs XLA there and says so; asked
    for by name it is refused with the reason (no backend falls back inside itself)."""
    monkeypatch.setitem(
        registry._AVAILABILITY, "pallas_tpu", registry.Availability("native", "patched")
    )
    monkeypatch.setattr(policy, "_WARNED", set())
    monkeypatch.setattr(policy, "_SELECTED", {})
    on_v4 = policy.Where("tpu", "v4")
    with pytest.warns(UserWarning, match="no int8_matmul kernel for TPU v4"):
        assert policy.select(asickernels.int8_matmul, None, on_v4, None) == "xla"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert (
            policy.select(asickernels.int8_matmul, None, policy.Where("tpu", "v5e"), None)
            == "pallas_tpu"
        )
    with pytest.raises(TypeError, match="no int8_matmul kernel for TPU v4"):
        policy.select(asickernels.int8_matmul, "pallas_tpu", on_v4, None)
    table = policy.describe(asickernels.OPS, "tpu", "v4", assume_native=True)
    assert table["int8_matmul"]["int8"] == "xla (falls back from pallas_tpu)"


def test_cpu_default_runs_natively_here():
    where = policy.where_arrays_live([np.zeros(3)])
    assert where.platform == "cpu"
    chosen = policy.select(asickernels.nms, None, where, "float32")
    assert registry.availability(chosen).mode == "native"
    assert chosen == policy.candidates(asickernels.nms, where)[0]


def test_a_backend_whose_kernels_cannot_be_imported_is_missing_not_fatal(monkeypatch, tmp_path):
    """A kernel module with a missing dependency makes its backend ``missing``, saying why;
    the library and the other backends carry on."""
    package = tmp_path / "broken_backend"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "giou.py").write_text("import a_dependency_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for table in ("_BACKENDS", "_AVAILABILITY", "_IMPORTED"):
        monkeypatch.setattr(registry, table, dict(getattr(registry, table)))
    probe = lambda: registry.Availability("native", "its probe passes")  # noqa: E731
    registry.register_backend(
        registry.Backend("broken", "jax", probe, "test", ("cpu",), package="broken_backend")
    )
    status = registry.availability("broken")
    assert status.mode == "missing" and "a_dependency_that_is_not_installed" in status.detail
    boxes = np.zeros((2, 4), np.float32)
    with pytest.raises(asickernels.BackendUnavailableError, match="not_installed"):
        asickernels.giou(boxes, boxes, backend="broken")
    assert "broken" not in registry.backends_for(asickernels.giou)
    assert asickernels.giou(boxes, boxes).shape == (2,)


def test_oracle_agrees_with_every_public_op_on_the_default_backend():
    rng = np.random.default_rng(3)
    boxes1, boxes2 = random_boxes(rng, (3, 17)), random_boxes(rng, (3, 17))
    grid, scores = grid_boxes(rng, (2, 40)), rng.permutation(80).reshape(2, 40) / 80.0
    x = rng.integers(-128, 128, (9, 33), dtype=np.int8)
    y = rng.integers(-128, 128, (33, 5), dtype=np.int8)
    calls = [
        (asickernels.giou, {"boxes1": boxes1, "boxes2": boxes2}, {}),
        (
            asickernels.giou_loss,
            {"preds": boxes1, "targets": boxes2, "mask": None},
            {"reduction": "sum"},
        ),
        (
            asickernels.nms,
            {"boxes": grid, "scores": scores.astype(np.float32)},
            {"iou_threshold": 0.3, "max_output_size": 9, "score_threshold": None},
        ),
        (
            asickernels.int8_matmul,
            {"x": x, "y": y, "x_scale": None, "y_scale": None},
            {"out_dtype": None},
        ),
    ]
    for op, arrays, statics in calls:
        got = op(**{k: v for k, v in arrays.items() if v is not None}, **statics)
        oracle.assert_agrees(op, got, oracle.expected(op, arrays, statics))
    with pytest.raises(AssertionError, match="disagrees"):
        oracle.assert_agrees(asickernels.giou, np.zeros(3, np.float32), np.full(3, 1e-3))


def test_repeated_eager_calls_keep_wide_category_ids_apart():
    """The second call of a signature takes the remembered route: it must still rank 64-bit
    ids (0 and 2**32 are different categories) rather than truncate them."""
    boxes = np.tile(np.array([[0, 0, 4, 4]], np.float32), (2, 1))
    scores = np.array([0.9, 0.8], np.float32)
    ids = np.array([0, 2**32])
    for _ in range(3):
        _, kept = asickernels.batched_nms(
            boxes, scores, ids, iou_threshold=0.5, max_output_size=2, backend="xla"
        )
        assert int(kept) == 2


def test_a_config_is_checked_against_the_type_the_backend_declares():
    """One check for every backend: the type its implementation declares, or none."""
    from asickernels.backends.pallas_tpu.giou import GiouConfig
    from asickernels.backends.pallas_tpu.nms import NmsConfig

    boxes = random_boxes(np.random.default_rng(3), (9,))
    want = asickernels.giou(boxes, boxes, backend="xla")
    tuned = asickernels.giou(boxes, boxes, backend="pallas_tpu_interpret", config=GiouConfig(16))
    np.testing.assert_allclose(np.asarray(tuned), np.asarray(want), rtol=1e-5, atol=1e-6)
    assert registry.support(asickernels.giou_vjp, "pallas_tpu").config is GiouConfig  # its vjp too
    with pytest.raises(
        TypeError, match="config: backend 'pallas_tpu_interpret' takes a GiouConfig"
    ):
        asickernels.giou(boxes, boxes, backend="pallas_tpu_interpret", config=NmsConfig())
    for name in ("xla", "cpu"):  # XLA refuses one instead of ignoring it
        with pytest.raises(TypeError, match=f"config: backend '{name}' takes no config"):
            asickernels.giou(boxes, boxes, backend=name, config=GiouConfig())
    jitted = jax.jit(lambda b: asickernels.giou(b, b, backend="xla", config=GiouConfig()))
    with pytest.raises(TypeError, match="config"):
        jitted(boxes)
