"""What ``check`` and ``bench`` run: one :class:`Op` per public function, with its sizes,
its inputs (random, edge and adversarial), how a registry backend is called, and how a
result is compared with the float64 reference.

Every backend is called through the public API (``asickernels.giou(..., backend=name)``),
``jax.jit``-compiled for JAX backends with inputs already on the device (in JAX's x64
mode for float64 cases), so a row times what a user gets. A case a backend refuses by
design (float64 on a float32-only backend) raises :class:`NotApplicable` instead of
running. Results are compared in a canonical numpy form:

* ``giou``, ``giou_vjp``: error = the oracle's (:mod:`asickernels.testing.oracle`) worst
  ``|got - want| / (atol + rtol |want|)``: 1 or less passes.
* ``nms`` / ``batched_nms``: ``(indices [..., max_output_size], num_valid [...])``;
  error = number of entries that differ (0 to pass).
* ``int8_matmul``: ``[M, N]``; error = max absolute difference (exact int32 wanted),
  or max relative difference for dequantized (float) results.
* ``roi_align``, ``roi_pool``: ``[K, C, PH, PW]``; the oracle's verdict (RoIPool: the number
  of differing elements, 0 to pass).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeAlias, TypeVar

import jax
import ml_dtypes
import numpy as np

import asickernels
from asickernels import reference
from asickernels.kernels import giou as giou_ops
from asickernels.kernels import registry
from asickernels.kernels.declaration import x64_scope
from asickernels.testing import cases as shared_cases
from asickernels.testing import oracle

Canonical: TypeAlias = np.ndarray | tuple[np.ndarray, ...]  # an op's outputs, as numpy


@dataclasses.dataclass(frozen=True)
class Size:
    """One benchmark size of an op: ``label`` for tables, ``params`` for JSON and inputs."""

    label: str
    params: dict[str, Any]


@dataclasses.dataclass
class Case:
    """Inputs of one run: ``arrays`` in the op's positional order, ``static`` keyword args."""

    name: str
    arrays: tuple[np.ndarray, ...]
    static: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A ready-to-time call (inputs already converted and placed) and the conversion of its
    output to the op's canonical numpy form (kept out of the timed region)."""

    call: Callable[[], object]
    canonical: Callable[[Any], Canonical]  # takes what ``call`` returns (library-specific)


@dataclasses.dataclass(frozen=True)
class Comparison:
    max_error: float
    tolerance: float
    passed: bool
    checked: str = "all"  # what part of the output was compared


class NotApplicable(Exception):
    """A backend refuses this case by design (the message says why): ``check`` reports it
    as not applicable, not as a failure."""


def oracle_comparison(name: str, got: Canonical, expected: oracle.Outputs) -> Comparison:
    """The oracle's verdict (:mod:`asickernels.testing.oracle`): error in units of the op's
    tolerance (1 or less passes); for exact ops, the number of differing elements."""
    verdict = oracle.compare(name, got, expected)
    limit = 0.0 if verdict.tolerance == oracle.EXACT else 1.0
    return Comparison(verdict.error, limit, verdict.passed)


def _to_numpy(out: object) -> Canonical:
    if isinstance(out, tuple):
        return tuple(np.asarray(o) for o in out)
    return np.asarray(out)


# How the default-backend rows call the public op (see Op.prepare_default).
DefaultMode = Literal["jit", "jit-numpy", "eager"]


class Op:
    """An op as ``check`` and ``bench`` see it; subclasses fill in the op-specific parts."""

    name: str  # also the name of its public function in ``asickernels``
    registry_op: str  # the registry op whose backends run it
    size_syntax: str  # for --help and errors
    default_sizes: tuple[str, ...]
    error_unit: str
    quick_cases: frozenset[str]  # the check cases `run` uses (each shape compiles anew)
    quick_sizes: tuple[str, ...]  # the sizes `run` times

    def parse_size(self, text: str) -> Size:
        raise NotImplementedError

    def work(self, size: Size) -> float:
        """Units of work, to extrapolate run time from a smaller size."""
        raise NotImplementedError

    def bench_case(self, size: Size, rng: np.random.Generator) -> Case:
        raise NotImplementedError

    def check_cases(self, rng: np.random.Generator) -> list[Case]:
        raise NotImplementedError

    def expected(self, case: Case) -> Any:
        """What :meth:`compare` checks a result against: by default the op's float64
        reference (its declaration's) on the case's arrays and statics."""
        return oracle.op_named(self.name).reference(*case.arrays, **case.static)

    def compare(self, got: Canonical, expected: Any) -> Comparison:
        """By default the oracle's verdict (:func:`oracle_comparison`)."""
        return oracle_comparison(self.name, got, expected)

    def backends(self) -> list[str]:
        return registry.backends_for(self.registry_op)

    def prepare_backend(self, backend: str, case: Case) -> Prepared:
        """The public op on ``backend``: jitted with device-resident inputs for JAX backends,
        called eagerly on host arrays for host backends.

        Raises :class:`NotApplicable` for a call the backend refuses by design: a float64
        case on a backend registered to compute in float32 only, or a JAX backend this JAX
        cannot trace (``Backend.traceable``)."""
        chosen = registry.backend(backend)
        if chosen.traceable is not None and not chosen.traceable():
            raise NotApplicable(
                f"{backend} cannot run under jax.jit with jax {jax.__version__} "
                "(it runs eagerly only with this JAX)"
            )
        computes, wanted = registry.support(self.registry_op, backend).dtypes, _float_dtype(case)
        if wanted not in computes:
            raise NotApplicable(
                f"{backend} computes {self.registry_op} in {'/'.join(sorted(computes))} only; "
                f"this case is {wanted}"
            )
        public = getattr(asickernels, self.name)
        function: Callable[..., object] = functools.partial(public, backend=backend, **case.static)
        if chosen.array_kind != "jax":
            return Prepared(lambda: function(*case.arrays), _to_numpy)
        return _jitted(function, case, on_device=True)

    def prepare_default(self, mode: DefaultMode, case: Case) -> Prepared:
        """The public op with ``backend=None``: eagerly on the case's numpy arrays (what a
        user's first call looks like, ``"eager"``), or under ``jax.jit`` with the inputs
        on the device (``"jit"``) or given as the same numpy arrays (``"jit-numpy"``: what
        JAX itself spends taking numpy arguments, which an eager call cannot avoid)."""
        public = getattr(asickernels, self.name)
        function: Callable[..., object] = functools.partial(public, **case.static)
        if mode == "eager":
            return Prepared(lambda: function(*case.arrays), _to_numpy)
        return _jitted(function, case, on_device=mode == "jit")


def _float_dtype(case: Case) -> str:
    """The dtype the case's float inputs are computed in: float64 if any is float64."""
    return "float64" if any(a.dtype == np.float64 for a in case.arrays) else "float32"


def _jitted(function: Callable[..., object], case: Case, *, on_device: bool) -> Prepared:
    """``function`` under ``jax.jit`` on the case's arrays (placed on the device first if
    ``on_device``); in JAX's x64 mode when an input is 64-bit, so that float64 stays
    float64 (without it ``device_put`` and ``jit`` canonicalize to float32)."""
    jitted = jax.jit(function)
    wide = any(a.dtype.itemsize == 8 for a in case.arrays)
    with x64_scope(wide):
        arrays = tuple(map(jax.device_put, case.arrays)) if on_device else case.arrays
    if not wide:
        return Prepared(lambda: jitted(*arrays), _to_numpy)

    def call() -> object:
        with x64_scope(True):
            return jitted(*arrays)

    return Prepared(call, _to_numpy)


# -- boxes ---------------------------------------------------------------------------------


def random_boxes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Benchmark boxes: ``shape + (4,)`` float32, corners and sides up to 256."""
    return shared_cases.random_boxes(rng, shape, scale=256.0)


def jittered(rng: np.random.Generator, boxes: np.ndarray, amount: float = 0.2) -> np.ndarray:
    """Boxes moved by up to ``amount`` of their size: predictions near their targets."""
    wh = np.concatenate([boxes[..., 2:] - boxes[..., :2]] * 2, axis=-1)
    return (boxes + rng.uniform(-amount, amount, boxes.shape) * wh).astype(boxes.dtype)


def _pairs_size(text: str) -> Size:
    match = re.fullmatch(r"(\d+)(?:x(\d+))?", text)
    if not match or int(match[1]) < 1 or int(match[2] or 1) < 1:
        raise ValueError(f"expected P or AxB pairs (e.g. 1024x256), got {text!r}")
    shape = (int(match[1]), int(match[2])) if match[2] else (int(match[1]),)
    return Size("x".join(map(str, shape)) + " pairs", {"shape": list(shape)})


CaseT = TypeVar("CaseT")


def checked(cases: list[CaseT]) -> list[CaseT]:
    """The conformance suite's cases, less its slow tier."""
    return [case for case in cases if not getattr(case, "slow", False)]


class GiouOp(Op):
    name = "giou"
    registry_op = "giou"
    size_syntax = "P or AxB box pairs"
    default_sizes: tuple[str, ...] = ("64x64", "1024x256")
    error_unit = "x tol"
    quick_cases = frozenset({"random_130", "adversarial"})
    quick_sizes = default_sizes

    def parse_size(self, text: str) -> Size:
        return _pairs_size(text)

    def work(self, size: Size) -> float:
        return float(math.prod(size.params["shape"]))

    def bench_case(self, size: Size, rng: np.random.Generator) -> Case:
        boxes = random_boxes(rng, tuple(size.params["shape"]))
        return Case(size.label, (boxes, jittered(rng, boxes)))

    def check_cases(self, rng: np.random.Generator) -> list[Case]:
        return [Case(c.name, (c.boxes1, c.boxes2)) for c in checked(shared_cases.giou_cases())]


class GiouVjpOp(GiouOp):
    """The GIOU backward pass: gradients of ``sum(cotangent * giou)``, at GIOU's sizes."""

    name = "giou_vjp"

    def backends(self) -> list[str]:
        return giou_ops.differentiable_backends()

    def _with_cotangent(
        self, name: str, a: np.ndarray, b: np.ndarray, rng: np.random.Generator
    ) -> Case:
        cotangent = rng.normal(size=a.shape[:-1]).astype(np.float32)
        return Case(name, (a, b, cotangent))

    def bench_case(self, size: Size, rng: np.random.Generator) -> Case:
        boxes = random_boxes(rng, tuple(size.params["shape"]))
        return self._with_cotangent(size.label, boxes, jittered(rng, boxes), rng)

    def check_cases(self, rng: np.random.Generator) -> list[Case]:
        return [
            self._with_cotangent(c.name, c.boxes1, c.boxes2, rng)
            for c in checked(shared_cases.giou_cases())
            if c.boxes1.dtype != ml_dtypes.bfloat16
        ]


class BoxMetricOp(GiouOp):
    """DIoU or CIoU of paired boxes, at GIOU's sizes and on GIOU's cases."""

    def __init__(self, name: str) -> None:
        self.name = self.registry_op = name


class PairwiseOp(Op):
    """An IoU matrix (``box_iou``, ``generalized_box_iou``): ``[N, 4]`` x ``[M, 4]`` ->
    ``[N, M]``; sizes ``NxM`` (DETR's matching: 300 queries x 100 targets)."""

    size_syntax = "NxM boxes"
    default_sizes: tuple[str, ...] = ("300x100", "1024x1024")
    error_unit = "x tol"
    quick_cases = frozenset({"random_7x130", "adversarial_all_pairs"})
    quick_sizes = default_sizes

    def __init__(self, name: str) -> None:
        self.name = self.registry_op = name

    def parse_size(self, text: str) -> Size:
        match = re.fullmatch(r"(\d+)x(\d+)", text)
        if not match or int(match[1]) < 1 or int(match[2]) < 1:
            raise ValueError(f"expected NxM boxes (e.g. 300x100), got {text!r}")
        n, m = int(match[1]), int(match[2])
        return Size(f"{n}x{m} boxes", {"n": n, "m": m})

    def work(self, size: Size) -> float:
        return float(size.params["n"] * size.params["m"])

    def bench_case(self, size: Size, rng: np.random.Generator) -> Case:
        n, m = size.params["n"], size.params["m"]
        return Case(size.label, (random_boxes(rng, (n,)), random_boxes(rng, (m,))))

    def check_cases(self, rng: np.random.Generator) -> list[Case]:
        return [Case(c.name, (c.boxes1, c.boxes2)) for c in shared_cases.pairwise_cases()]


# -- int8 matmul ---------------------------------------------------------------------------

# Beyond this many multiply-adds the whole-output float64 check costs more than the kernel:
# compare a sample of rows instead (every element of those rows, exactly).
_FULL_CHECK_MACS = 2048**3
_SAMPLED_ROWS = 128


class Int8MatmulOp(Op):
    name = "int8_matmul"
    registry_op = "int8_matmul"
    size_syntax = "S (S x S x S) or MxKxN"
    default_sizes: tuple[str, ...] = ("256", "512", "1024", "2048", "4096", "8192")
    error_unit = "abs (int32) / rel (scaled)"
    quick_cases = frozenset({"7x130x257", "scales_rows_cols"})
    quick_sizes = default_sizes[:4]

    def parse_size(self, text: str) -> Size:
        match = re.fullmatch(r"(\d+)(?:x(\d+)x(\d+))?", text)
        if not match:
            raise ValueError(f"expected S or MxKxN (e.g. 1024 or 512x4096x256), got {text!r}")
        m, k, n = (
            (int(match[1]),) * 3 if not match[2] else (int(match[1]), int(match[2]), int(match[3]))
        )
        if min(m, k, n) < 1 or k > asickernels.INT8_MATMUL_MAX_K:
            raise ValueError(
                f"M, K, N must be >= 1 and K <= {asickernels.INT8_MATMUL_MAX_K}, got {text!r}"
            )
        label = f"{m}^3" if m == k == n else f"{m}x{k}x{n}"
        return Size(label, {"m": m, "k": k, "n": n})

    def work(self, size: Size) -> float:
        return float(size.params["m"] * size.params["k"] * size.params["n"])

    @staticmethod
    def _int8(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
        return rng.integers(-128, 128, shape, dtype=np.int8)

    def bench_case(self, size: Size, rng: np.random.Generator) -> Case:
        m, k, n = size.params["m"], size.params["k"], size.params["n"]
        return Case(size.label, (self._int8(rng, (m, k)), self._int8(rng, (k, n))))

    def check_cases(self, rng: np.random.Generator) -> list[Case]:
        return [
            Case(c.name, (c.x, c.y), {k: v for k, v in c.kwargs().items() if v is not None})
            for c in checked(shared_cases.matmul_cases())
        ]

    def expected(self, case: Case) -> tuple[np.ndarray | None, np.ndarray, np.dtype | None]:
        """``(rows, want, out_dtype)``: the sampled rows (None: all), their float64 or exact
        int32 product, and the result's dtype for scaled products (None: int32)."""
        x, y = case.arrays
        rows = None
        if x.shape[0] * x.shape[1] * y.shape[1] > _FULL_CHECK_MACS:
            rows = np.unique(np.random.default_rng(0).integers(0, x.shape[0], _SAMPLED_ROWS))
        scaled = any(
            case.static.get(key) is not None for key in ("x_scale", "y_scale", "out_dtype")
        )
        if not scaled:
            want = reference.int8_matmul(x if rows is None else x[rows], y)
            return rows, want, None
        m, n = x.shape[0], y.shape[1]
        scales = [
            np.broadcast_to(np.float32(1) if scale is None else scale, (size,))
            for scale, size in ((case.static.get("x_scale"), m), (case.static.get("y_scale"), n))
        ]
        if rows is not None:
            x, scales[0] = x[rows], scales[0][rows]
        want = reference.int8_matmul(
            x, y, x_scale=scales[0], y_scale=scales[1], out_dtype=np.float64
        )
        return rows, want, np.dtype(case.static.get("out_dtype") or np.float32)

    def compare(
        self, got: Canonical, expected: tuple[np.ndarray | None, np.ndarray, np.dtype | None]
    ) -> Comparison:
        if not isinstance(got, np.ndarray):
            raise TypeError(f"int8_matmul has one output, got {type(got).__name__}")
        rows, want, out_dtype = expected
        sample = got if rows is None else got[rows]
        checked = "all" if rows is None else f"{len(rows)} sampled rows of {got.shape[0]}"
        if out_dtype is None:
            error = float(np.max(np.abs(sample.astype(np.float64) - want), initial=0.0))
            return Comparison(error, 0.0, error == 0.0, checked)
        relative = np.abs(sample.astype(np.float64) - want) / np.maximum(np.abs(want), 1e-30)
        error = float(np.max(relative, initial=0.0))
        tolerance = oracle.tolerance(self.name, out_dtype).rtol
        return Comparison(error, tolerance, error <= tolerance, checked)


# -- RoI pooling ---------------------------------------------------------------------------

# Detection's RoI heads (Faster/Mask R-CNN): a stride-16 map of an 800 x 1088 image.
_ROI_MAP = (2, 256, 50, 68)
_ROI_STRIDE = 16


class RoiPoolingOp(Op):
    """RoIAlign or RoIPool of ``K`` RoIs on a feature map ``[N, C, H, W]`` (by default
    2x256x50x68, stride 16) into 7x7 bins, RoIAlign as detection runs it
    (``sampling_ratio=2, aligned=True``); sizes ``K[:NxCxHxW]``. RoIs are proposals in
    image coordinates (sides 16 to 512 pixels, clipped to the image), sorted by image as
    torchvision's poolers pass them."""

    size_syntax = "K[:NxCxHxW] RoIs on a feature map (default 2x256x50x68), 7x7 bins"
    quick_cases = frozenset({"random_f32"})

    def __init__(
        self,
        name: str,
        statics_of: Callable[[shared_cases.RoiCase], Mapping[str, object]],
        bench_statics: dict[str, Any],
        default_sizes: tuple[str, ...],
        quick_sizes: tuple[str, ...],
        error_unit: str,
    ) -> None:
        self.name = self.registry_op = name
        self.statics_of = statics_of  # a conformance case's statics for this op
        self.bench_statics = bench_statics
        self.default_sizes = default_sizes
        self.quick_sizes = quick_sizes
        self.error_unit = error_unit

    def parse_size(self, text: str) -> Size:
        match = re.fullmatch(r"(\d+)(?::(\d+)x(\d+)x(\d+)x(\d+))?", text)
        shape = tuple(int(side) for side in match.groups()[1:]) if match and match[2] else _ROI_MAP
        if not match or int(match[1]) < 1 or min(shape) < 1:
            raise ValueError(f"expected K[:NxCxHxW] (e.g. 1000:2x256x50x68), got {text!r}")
        k = int(match[1])
        return Size(f"K={k} {'x'.join(map(str, shape))}", {"k": k, "input_shape": list(shape)})

    def work(self, size: Size) -> float:
        return float(size.params["k"] * size.params["input_shape"][1])

    def bench_case(self, size: Size, rng: np.random.Generator) -> Case:
        n, channels, height, width = size.params["input_shape"]
        k = size.params["k"]
        image = np.array([width, height], np.float64) * _ROI_STRIDE
        corner = rng.uniform(0.0, image, (k, 2))
        far = np.minimum(corner + rng.uniform(16.0, 512.0, (k, 2)), image - 1)
        index = np.sort(rng.integers(0, n, (k, 1)), axis=0)
        rois = np.concatenate([index, corner, far], axis=1).astype(np.float32)
        features = rng.standard_normal((n, channels, height, width), np.float32)
        return Case(size.label, (features, rois), dict(self.bench_statics))

    def check_cases(self, rng: np.random.Generator) -> list[Case]:
        return [
            Case(c.name, (c.input, c.rois), dict(self.statics_of(c)))
            for c in shared_cases.roi_cases()
        ]


OPS: dict[str, Op] = {
    op.name: op
    for op in (
        GiouOp(),
        GiouVjpOp(),
        Int8MatmulOp(),
        PairwiseOp("box_iou"),
        PairwiseOp("generalized_box_iou"),
        BoxMetricOp("diou"),
        BoxMetricOp("ciou"),
        # K=8: the size the simulators (nki, TPU interpret mode) are timed at; larger sizes
        # are skipped for them by extrapolation.
        RoiPoolingOp(
            "roi_align",
            shared_cases.RoiCase.align_statics,
            {
                "output_size": (7, 7),
                "spatial_scale": 1 / _ROI_STRIDE,
                "sampling_ratio": 2,
                "aligned": True,
            },
            ("8", "100", "1000"),
            ("8", "100"),
            "x tol",
        ),
        RoiPoolingOp(
            "roi_pool",
            shared_cases.RoiCase.pool_statics,
            {"output_size": (7, 7), "spatial_scale": 1 / _ROI_STRIDE},
            ("100", "1000"),
            ("100",),
            "mismatches",
        ),
    )
}


def register(*ops: Op) -> None:
    """Adds ops whose workloads are declared with the op (``asickernels/kernels/<op>_cases.py``)."""
    OPS.update((op.name, op) for op in ops)


# Imported last: it registers its workloads here (importing it first works as well).
from asickernels.kernels import nms_cases  # noqa: E402, F401
