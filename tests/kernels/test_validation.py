"""Bad inputs raise clear errors before any kernel runs; empty inputs give correctly shaped
outputs; backends are reported; inputs are never modified."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from conftest import require

import asickernels
from asickernels.kernels import case_tables, registry
from asickernels.kernels.declaration import REQUIRED

BOXES = np.array([[0, 0, 2, 2], [1, 1, 3, 4], [5, 5, 6, 9]], np.float32)
SCORES = np.array([0.9, 0.8, 0.7], np.float32)
NMS_ARGS = {"iou_threshold": 0.5, "max_output_size": 2}
X8 = np.arange(-6, 6, dtype=np.int8).reshape(3, 4)
Y8 = np.arange(-4, 4, dtype=np.int8).reshape(4, 2)


@pytest.fixture
def no_kernel_runs(monkeypatch):
    """Backend lookup still fails as it would (unknown backend, unsupported op), but any
    kernel that gets called fails the test: validation must happen before kernels run."""
    real_implementation = registry.implementation

    def guarded(op, name, **kwargs):
        real_implementation(op, name, **kwargs)

        def forbidden(*args, **kwargs):
            raise AssertionError(f"the {op!r} kernel of backend {name!r} ran")

        return forbidden

    monkeypatch.setattr(registry, "implementation", guarded)


@pytest.fixture
def fake_backend(monkeypatch):
    """Registers a backend for the duration of a test: ``fake_backend(name, mode, ops)``."""

    def add(name, mode, ops):
        backend = registry.Backend(
            name=name,
            array_kind="jax",
            probe=lambda: registry.Availability(
                mode, f"{name} probe says {mode}", "pip install it"
            ),
        )
        monkeypatch.setitem(registry._BACKENDS, name, backend)
        for op in ops:
            kernel = registry.implementation(op, "xla")
            entry = registry.Implementation(kernel, registry.Support())
            monkeypatch.setitem(registry._IMPLEMENTATIONS, (op, name), entry)
        monkeypatch.setitem(registry._AVAILABILITY, name, backend.probe())
        return name

    return add


def _giou(**overrides):
    args = {"boxes1": BOXES, "boxes2": BOXES} | overrides
    return asickernels.giou(args.pop("boxes1"), args.pop("boxes2"), **args)


def _nms(**overrides):
    args = {"boxes": BOXES, "scores": SCORES} | NMS_ARGS | overrides
    return asickernels.nms(args.pop("boxes"), args.pop("scores"), **args)


def _batched_nms(**overrides):
    args = {"boxes": BOXES, "scores": SCORES, "idxs": np.array([0, 1, 0])} | NMS_ARGS | overrides
    return asickernels.batched_nms(args.pop("boxes"), args.pop("scores"), args.pop("idxs"), **args)


def _matmul(**overrides):
    args = {"x": X8, "y": Y8} | overrides
    return asickernels.int8_matmul(args.pop("x"), args.pop("y"), **args)


# (call, expected exception, message fragment)
BAD_INPUTS = {
    # GIOU, GIOU gradient and loss.
    "giou_last_dim_3": (
        lambda: _giou(boxes1=BOXES[:, :3], boxes2=BOXES[:, :3]),
        ValueError,
        "[..., 4]",
    ),
    "giou_scalar_boxes": (
        lambda: _giou(boxes1=np.float32(1), boxes2=np.float32(1)),
        ValueError,
        "[..., 4]",
    ),
    "giou_shapes_differ": (lambda: _giou(boxes2=BOXES[:2]), ValueError, "same shape"),
    "giou_int_boxes": (lambda: _giou(boxes1=BOXES.astype(np.int32)), TypeError, "floating"),
    "giou_bool_boxes": (lambda: _giou(boxes2=BOXES > 1), TypeError, "floating"),
    "giou_not_an_array": (lambda: _giou(boxes1="boxes"), TypeError, "boxes1"),
    "giou_vjp_cotangent_shape": (
        lambda: asickernels.giou_vjp(BOXES, BOXES, np.ones(4, np.float32)),
        ValueError,
        "cotangent must have shape (3,)",
    ),
    "giou_vjp_int_cotangent": (
        lambda: asickernels.giou_vjp(BOXES, BOXES, np.ones(3, np.int32)),
        TypeError,
        "cotangent",
    ),
    "giou_loss_bad_reduction": (
        lambda: asickernels.giou_loss(BOXES, BOXES, reduction="average"),
        ValueError,
        "reduction",
    ),
    "giou_loss_mask_shape": (
        lambda: asickernels.giou_loss(BOXES, BOXES, mask=np.ones((3, 1), bool)),
        ValueError,
        "mask must have shape (3,)",
    ),
    "giou_loss_mask_dtype": (
        lambda: asickernels.giou_loss(BOXES, BOXES, mask=np.array(["a", "b", "c"])),
        TypeError,
        "mask",
    ),
    "giou_loss_last_dim": (
        lambda: asickernels.giou_loss(BOXES[:, :2], BOXES[:, :2]),
        ValueError,
        "[..., 4]",
    ),
    # NMS and batched NMS.
    "nms_last_dim_5": (lambda: _nms(boxes=np.zeros((3, 5), np.float32)), ValueError, "[..., 4]"),
    "nms_1d_boxes": (lambda: _nms(boxes=BOXES[0], scores=SCORES[0]), ValueError, "at least 2 dims"),
    "nms_scores_shape": (lambda: _nms(scores=SCORES[:2]), ValueError, "scores must have shape"),
    "nms_int_boxes": (
        lambda: _nms(boxes=BOXES.astype(np.int64)),
        TypeError,
        "boxes must be a floating",
    ),
    "nms_int_scores": (
        lambda: _nms(scores=np.array([3, 2, 1])),
        TypeError,
        "scores must be a floating",
    ),
    "nms_negative_max_output_size": (
        lambda: _nms(max_output_size=-1),
        ValueError,
        r"must be in [0, 2147483647]",
    ),
    "nms_huge_max_output_size": (
        lambda: _nms(max_output_size=2**40),
        ValueError,
        r"must be in [0, 2147483647]",
    ),
    "nms_float_max_output_size": (lambda: _nms(max_output_size=2.0), TypeError, "max_output_size"),
    "nms_bool_max_output_size": (lambda: _nms(max_output_size=True), TypeError, "max_output_size"),
    "nms_iou_threshold_above_1": (
        lambda: _nms(iou_threshold=1.5),
        ValueError,
        "iou_threshold must be in",
    ),
    "nms_iou_threshold_negative": (
        lambda: _nms(iou_threshold=-0.1),
        ValueError,
        "iou_threshold must be in",
    ),
    "nms_iou_threshold_nan": (lambda: _nms(iou_threshold=math.nan), ValueError, "iou_threshold"),
    "nms_iou_threshold_string": (lambda: _nms(iou_threshold="0.5"), TypeError, "iou_threshold"),
    "nms_iou_threshold_none": (lambda: _nms(iou_threshold=None), TypeError, "iou_threshold"),
    "nms_score_threshold_nan": (
        lambda: _nms(score_threshold=math.nan),
        ValueError,
        "score_threshold",
    ),
    "batched_nms_float_idxs": (
        lambda: _batched_nms(idxs=np.array([0.0, 1.0, 0.0])),
        TypeError,
        "idxs must be an integer",
    ),
    "batched_nms_idxs_shape": (
        lambda: _batched_nms(idxs=np.array([0, 1])),
        ValueError,
        "idxs must have",
    ),
    "batched_nms_threshold_above_1": (
        lambda: _batched_nms(iou_threshold=2.0),
        ValueError,
        "iou_threshold",
    ),
    # int8 matmul.
    "matmul_float_x": (lambda: _matmul(x=X8.astype(np.float32)), TypeError, "x must be int8"),
    "matmul_int32_y": (lambda: _matmul(y=Y8.astype(np.int32)), TypeError, "y must be int8"),
    "matmul_uint8_x": (lambda: _matmul(x=X8.astype(np.uint8)), TypeError, "x must be int8"),
    "matmul_1d_x": (lambda: _matmul(x=X8[0]), ValueError, "x must be 2-D"),
    "matmul_3d_y": (lambda: _matmul(y=Y8[None]), ValueError, "y must be 2-D"),
    "matmul_k_mismatch": (lambda: _matmul(y=Y8[:3]), ValueError, "disagree on K"),
    "matmul_x_scale_length": (
        lambda: _matmul(x_scale=np.ones(4, np.float32)),
        ValueError,
        "x_scale",
    ),
    "matmul_y_scale_2d": (
        lambda: _matmul(y_scale=np.ones((2, 1), np.float32)),
        ValueError,
        "y_scale",
    ),
    "matmul_int_scale": (lambda: _matmul(x_scale=np.ones(3, np.int32)), TypeError, "x_scale"),
    "matmul_out_int8": (lambda: _matmul(out_dtype=np.int8), TypeError, "out_dtype"),
    "matmul_out_int32_with_scales": (
        lambda: _matmul(x_scale=np.float32(2), out_dtype=np.int32),
        TypeError,
        "with scales",
    ),
    "matmul_out_not_a_dtype": (lambda: _matmul(out_dtype="bogus"), TypeError, "bogus"),
    "matmul_k_beyond_int32_bound": (
        lambda: _matmul(
            x=np.ones((1, asickernels.INT8_MATMUL_MAX_K + 1), np.int8),
            y=np.ones((asickernels.INT8_MATMUL_MAX_K + 1, 1), np.int8),
        ),
        ValueError,
        f"exceeds {asickernels.INT8_MATMUL_MAX_K}",
    ),
    # quantize_int8.
    "quantize_axis_too_large": (
        lambda: asickernels.quantize_int8(np.ones((2, 3), np.float32), axis=2),
        ValueError,
        "out of range",
    ),
    "quantize_axis_too_negative": (
        lambda: asickernels.quantize_int8(np.ones((2, 3), np.float32), axis=-3),
        ValueError,
        "axis must be >= -2",
    ),
    "quantize_float_axis": (
        lambda: asickernels.quantize_int8(np.ones((2, 3), np.float32), axis=1.0),
        TypeError,
        "axis",
    ),
    "quantize_int_input": (
        lambda: asickernels.quantize_int8(np.ones((2, 3), np.int32)),
        TypeError,
        "floating",
    ),
    # Backends.
    "unknown_backend_giou": (
        lambda: _giou(backend="tpu_v9"),
        ValueError,
        "unknown backend 'tpu_v9'",
    ),
    "unknown_backend_nms": (lambda: _nms(backend="tpu_v9"), ValueError, "unknown backend 'tpu_v9'"),
    "unknown_backend_matmul": (
        lambda: _matmul(backend="tpu_v9"),
        ValueError,
        "unknown backend 'tpu_v9'",
    ),
    "unknown_backend_giou_vjp": (
        lambda: asickernels.giou_vjp(BOXES, BOXES, SCORES, backend="tpu_v9"),
        ValueError,
        "known backends",
    ),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_raises_clear_error_before_any_kernel(name, no_kernel_runs):
    call, error, fragment = BAD_INPUTS[name]
    with pytest.raises(error) as raised:
        call()
    assert fragment in str(raised.value), f"message {str(raised.value)!r} lacks {fragment!r}"


def test_nms_error_names_the_box_shape():
    with pytest.raises(ValueError, match=r"got \(3, 5\)"):
        _nms(boxes=np.zeros((3, 5), np.float32))


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda t: _nms(iou_threshold=t), id="nms_iou_threshold"),
        pytest.param(lambda t: _nms(score_threshold=t), id="nms_score_threshold"),
        pytest.param(lambda t: _batched_nms(iou_threshold=t), id="batched_nms_iou_threshold"),
        pytest.param(lambda t: _nms(max_output_size=t.astype(jnp.int32)), id="max_output_size"),
    ],
)
def test_traced_static_arguments_are_refused_under_jit(call, no_kernel_runs):
    with pytest.raises(TypeError, match="static Python"):
        jax.jit(call)(jnp.float32(0.5))


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda b, s: asickernels.giou(b, b, backend="reference"), id="giou"),
        pytest.param(
            lambda b, s: asickernels.giou_vjp(b, b, s, backend="reference"), id="giou_vjp"
        ),
        pytest.param(lambda b, s: asickernels.giou_loss(b, b, backend="reference"), id="giou_loss"),
        pytest.param(lambda b, s: asickernels.nms(b, s, backend="reference", **NMS_ARGS), id="nms"),
        pytest.param(
            lambda b, s: asickernels.batched_nms(
                b, s, jnp.zeros(3, jnp.int32), backend="reference", **NMS_ARGS
            ),
            id="batched_nms",
        ),
        pytest.param(
            lambda b, s: asickernels.int8_matmul(X8, Y8, x_scale=s, backend="reference"),
            id="int8_matmul",
        ),
    ],
)
@pytest.mark.parametrize("transform", [jax.jit, jax.vmap], ids=["jit", "vmap"])
def test_host_backend_under_a_jax_transform_is_a_clear_type_error(call, transform, no_kernel_runs):
    args = (BOXES, SCORES)
    if transform is jax.vmap:  # vmap maps a leading axis: add one of size 1
        args = (BOXES[None], SCORES[None])
    with pytest.raises(TypeError, match=r"runs on host numpy arrays.*jit/vmap/grad"):
        transform(call)(*args)


@pytest.mark.parametrize(
    "call, error, fragment",
    [
        pytest.param(
            lambda b: asickernels.giou(b[:, :3], b[:, :3]),
            ValueError,
            "[..., 4]",
            id="giou_last_dim",
        ),
        pytest.param(
            lambda b: asickernels.giou(b, b[:2]), ValueError, "same shape", id="giou_shapes"
        ),
        pytest.param(
            lambda b: asickernels.nms(b, b[:, 0], iou_threshold=1.1, max_output_size=2),
            ValueError,
            "iou_threshold",
            id="nms_threshold",
        ),
        pytest.param(
            lambda b: asickernels.nms(b, b, **NMS_ARGS),
            ValueError,
            "scores must have shape",
            id="nms_scores",
        ),
    ],
)
def test_validation_is_the_same_under_jit(call, error, fragment, no_kernel_runs):
    with pytest.raises(error) as raised:
        jax.jit(call)(BOXES)
    assert fragment in str(raised.value)


def test_backend_without_the_op_is_refused(fake_backend, no_kernel_runs):
    name = fake_backend("giou_only", "native", [asickernels.giou])
    with pytest.raises(ValueError, match=r"backend 'giou_only' does not implement 'nms'.*'xla'"):
        _nms(backend=name)
    with pytest.raises(ValueError, match="does not implement 'int8_matmul'"):
        _matmul(backend=name)


def test_missing_backend_says_why_and_how_to_fix_it(fake_backend, no_kernel_runs):
    name = fake_backend("absent_chip", "missing", [asickernels.giou, asickernels.nms])
    with pytest.raises(
        asickernels.BackendUnavailableError, match=r"absent_chip probe says missing.*pip install it"
    ):
        _giou(backend=name)
    with pytest.raises(asickernels.BackendUnavailableError, match="cannot run here"):
        _nms(backend=name)


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(
            lambda: _nms(boxes=BOXES[:0], scores=SCORES[:0], backend="tpu_v9"), id="nms_n0"
        ),
        pytest.param(lambda: _nms(max_output_size=0, backend="tpu_v9"), id="nms_max_output_0"),
        pytest.param(lambda: _matmul(x=X8[:0], backend="tpu_v9"), id="matmul_m0"),
    ],
)
def test_unknown_backend_is_refused_on_empty_inputs_too(call, no_kernel_runs):
    with pytest.raises(ValueError, match="unknown backend"):
        call()


# Empty inputs: the op layer answers without calling a kernel (whose conventions need sizes
# >= 1), on host and JAX backends alike.
EMPTY_BACKENDS = [None, "reference", "xla"]


@pytest.mark.parametrize("backend", EMPTY_BACKENDS)
@pytest.mark.parametrize("shape", [(0,), (2, 0), (0, 3)], ids=str)
def test_giou_ops_on_empty_inputs(backend, shape, no_kernel_runs):
    boxes = np.zeros((*shape, 4), np.float32)
    got = asickernels.giou(boxes, boxes, backend=backend)
    assert got.shape == shape and got.dtype == jnp.float32
    d1, d2 = asickernels.giou_vjp(boxes, boxes, np.zeros(shape, np.float32), backend=backend)
    assert d1.shape == d2.shape == boxes.shape and d1.dtype == d2.dtype == jnp.float32
    loss = asickernels.giou_loss(boxes, boxes, reduction="none", backend=backend)
    assert loss.shape == shape
    for reduction in ("sum", "mean"):
        total = asickernels.giou_loss(
            boxes, boxes, mask=np.ones(shape, bool), reduction=reduction, backend=backend
        )
        assert total.shape == () and float(total) == 0.0


@pytest.mark.parametrize("backend", EMPTY_BACKENDS)
@pytest.mark.parametrize(
    "batch, n, max_output_size",
    [((), 0, 5), ((2, 3), 0, 4), ((0,), 6, 3), ((2, 0), 6, 3), ((2,), 3, 0), ((), 0, 0)],
    ids=str,
)
def test_nms_on_empty_inputs(backend, batch, n, max_output_size, no_kernel_runs):
    boxes = np.zeros((*batch, n, 4), np.float32)
    scores = np.zeros((*batch, n), np.float32)
    idxs = np.zeros((*batch, n), np.int32)
    args = {"iou_threshold": 0.5, "max_output_size": max_output_size, "backend": backend}
    for indices, num_valid in (
        asickernels.nms(boxes, scores, **args),
        asickernels.batched_nms(boxes, scores, idxs, **args),
    ):
        assert indices.shape == (*batch, max_output_size) and indices.dtype == jnp.int32
        assert num_valid.shape == batch and num_valid.dtype == jnp.int32
        assert np.all(np.asarray(indices) == -1) and np.all(np.asarray(num_valid) == 0)


@pytest.mark.parametrize("backend", EMPTY_BACKENDS)
@pytest.mark.parametrize("m, k, n", [(0, 4, 3), (3, 0, 2), (2, 4, 0), (0, 0, 0)], ids=str)
def test_int8_matmul_on_empty_inputs(backend, m, k, n, no_kernel_runs):
    x, y = np.ones((m, k), np.int8), np.ones((k, n), np.int8)
    exact = asickernels.int8_matmul(x, y, backend=backend)
    assert exact.shape == (m, n) and exact.dtype == jnp.int32
    scaled = asickernels.int8_matmul(
        x,
        y,
        x_scale=np.ones(m, np.float32),
        y_scale=np.float32(2),
        out_dtype=ml_dtypes.bfloat16,
        backend=backend,
    )
    assert scaled.shape == (m, n) and scaled.dtype == jnp.bfloat16
    # An empty sum is 0: K = 0 gives zeros, not garbage.
    assert np.all(np.asarray(exact) == 0) and np.all(np.asarray(scaled, np.float32) == 0)


@pytest.mark.parametrize(
    "shape, axis, scale_shape", [((0, 3), 1, (3,)), ((0, 3), 0, (0,)), ((0,), None, ())], ids=str
)
def test_quantize_int8_on_empty_inputs(shape, axis, scale_shape):
    q, scale = asickernels.quantize_int8(np.zeros(shape, np.float32), axis=axis)
    assert q.shape == shape and q.dtype == jnp.int8
    assert scale.shape == scale_shape and scale.dtype == jnp.float32


def test_available_backends_reports_every_registered_backend():
    reported = asickernels.available_backends()
    assert list(reported) == registry.backend_names()
    assert {"reference", "xla", "pallas_tpu", "pallas_tpu_interpret"} <= set(reported)
    for name, status in reported.items():
        assert isinstance(status, asickernels.Availability), name
        assert status.mode in ("native", "simulated", "missing"), name
        assert status.detail, f"{name} gives no detail"
    assert reported["reference"].mode == "native" and reported["xla"].mode == "native"


# Host backends receive the caller's numpy arrays without a copy (JAX backends get copies).
HOST_BACKENDS = [n for n in registry.backend_names() if registry.backend(n).array_kind == "numpy"]


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_inputs_are_never_modified(backend):
    require(backend)
    rng = np.random.default_rng(0)
    xy = rng.uniform(0, 10, (2, 5, 2)).astype(np.float32)
    inputs = {
        "boxes": np.concatenate([xy, xy + rng.uniform(0, 5, xy.shape).astype(np.float32)], -1),
        "scores": rng.uniform(size=(2, 5)).astype(np.float32),
        "mask": rng.uniform(size=(2, 5)) < 0.5,
        "idxs": rng.integers(0, 2, (2, 5)).astype(np.int32),
        "x": rng.integers(-128, 128, (3, 7), dtype=np.int8),
        "y": rng.integers(-128, 128, (7, 4), dtype=np.int8),
        "x_scale": rng.uniform(size=3).astype(np.float32),
        "y_scale": rng.uniform(size=4).astype(np.float32),
    }
    inputs["other"] = inputs["boxes"][:, ::-1].copy()
    before = {name: array.copy() for name, array in inputs.items()}
    boxes, other, scores = inputs["boxes"], inputs["other"], inputs["scores"]
    nms_args = {"iou_threshold": 0.3, "max_output_size": 4, "backend": backend}
    calls = {
        asickernels.giou: [
            lambda: asickernels.giou(boxes, other, backend=backend),
            lambda: asickernels.giou_loss(boxes, other, mask=inputs["mask"], backend=backend),
        ],
        asickernels.giou_vjp: [lambda: asickernels.giou_vjp(boxes, other, scores, backend=backend)],
        asickernels.nms: [
            lambda: asickernels.nms(boxes, scores, **nms_args),
            lambda: asickernels.batched_nms(boxes, scores, inputs["idxs"], **nms_args),
        ],
        asickernels.int8_matmul: [
            lambda: asickernels.int8_matmul(inputs["x"], inputs["y"], backend=backend),
            lambda: asickernels.int8_matmul(
                inputs["x"],
                inputs["y"],
                x_scale=inputs["x_scale"],
                y_scale=inputs["y_scale"],
                backend=backend,
            ),
        ],
    }
    ran = 0
    for op, op_calls in calls.items():
        if backend in registry.backends_for(op):
            for call in op_calls:
                call()
                ran += 1
    asickernels.quantize_int8(boxes, axis=1)
    assert ran, f"{backend} implements none of the ops"

    for name, array in inputs.items():
        np.testing.assert_array_equal(array, before[name], err_msg=f"{name} was modified")


# Every public argument of every op --------------------------------------------------------

# Valid arguments of every op in asickernels.OPS, every optional one given off its default
# (each op's cases module's examples).
VALID_ARGUMENTS = case_tables.examples()
# Values that are no array: None (refused where the array is required), a plain object, a
# string, a ragged list.
NOT_ARRAYS = {"None": None, "object": object(), "string": "boxes", "ragged": [[1.0, 2.0], [3.0]]}


def _call(op, arguments):
    positional = [n for n in op.array_names if n in op.positional]
    return op(
        *(arguments[n] for n in positional),
        **{n: v for n, v in arguments.items() if n not in positional},
    )


def test_every_op_has_valid_arguments_here():
    assert set(VALID_ARGUMENTS) == {op.name for op in asickernels.OPS}
    for op in asickernels.OPS:
        _call(op, VALID_ARGUMENTS[op.name])
        given = VALID_ARGUMENTS[op.name]
        assert set(given) == {p.name for p in op.params}, op.name
        for p in op.params:  # every optional argument given, off its default
            if p.default is not REQUIRED:
                off = given[p.name] is not None if p.kind == "array" else given[p.name] != p.default
                assert off, f"{op.name}: {p.name} is its default"
        for p in op.params:  # every static declares values its check refuses
            assert p.kind != "static" or p.bad, f"{op.name}: {p.name} declares no bad values"


def _not_array_arguments():
    """(op, param, value) for every array param of every op and every value of
    :data:`NOT_ARRAYS`, but None for an optional array (its default)."""
    return [
        pytest.param(op, p, value, id=f"{op.name}-{p.name}-{label}")
        for op in asickernels.OPS
        for p in op.params
        if p.kind == "array"
        for label, value in NOT_ARRAYS.items()
        if not (value is None and p.default is None)
    ]


@pytest.mark.parametrize(("op", "param", "value"), _not_array_arguments())
def test_an_array_argument_that_is_no_array_is_refused_by_name(op, param, value, no_kernel_runs):
    arguments = VALID_ARGUMENTS[op.name] | {param.name: value}
    with pytest.raises((TypeError, ValueError), match=rf"\b{param.name}\b"):
        _call(op, arguments)


def _static_values():
    """(op, name, value) for every bad value each static parameter declares
    (:attr:`~asickernels.kernels.declaration.Param.bad`)."""
    return [
        pytest.param(op, p.name, value, id=f"{op.name}-{p.name}-{value!r}")
        for op in asickernels.OPS
        for p in op.params
        if p.kind == "static"
        for value in p.bad
    ]


@pytest.mark.parametrize(("op", "name", "value"), _static_values())
def test_a_bad_static_argument_is_refused_by_name(op, name, value, no_kernel_runs):
    with pytest.raises((TypeError, ValueError), match=rf"\b{name}\b"):
        _call(op, VALID_ARGUMENTS[op.name] | {name: value})


@pytest.mark.parametrize("value", [3, "tpu_v9", object()], ids=["int", "unknown", "object"])
@pytest.mark.parametrize("op", asickernels.OPS, ids=lambda op: op.name)
def test_a_bad_backend_is_refused_by_name(op, value, no_kernel_runs):
    with pytest.raises((TypeError, ValueError), match="backend"):
        _call(op, VALID_ARGUMENTS[op.name] | {"backend": value})


@pytest.mark.parametrize("op", asickernels.OPS, ids=lambda op: op.name)
def test_a_config_the_backend_does_not_take_is_refused_by_name(op):
    """The first backend of the op's preference that has no tuning config refuses one; ops
    without a kernel take none either."""
    backend = {}
    if op.kernel is not None:
        untuned = [
            name
            for name in op.kernel.preference
            if registry.has_kernel(op.kernel, name)
            and registry.support(op.kernel, name).config is None
        ]
        backend = {"backend": untuned[0]}
    with pytest.raises((TypeError, ValueError), match="config"):
        _call(op, VALID_ARGUMENTS[op.name] | backend | {"config": {"block": 8}})
