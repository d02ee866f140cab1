"""What every op's cases module (``kernels/<op>_cases.py``, beside its declaration) fills in,
and the input generators they share. Each op's cases module is the one place that lists
what exercises the op:

* its conformance cases (random, edge and adversarial; every backend runs them against the
  float64 reference in ``tests/kernels/test_conformance.py``);
* its :class:`Workload`\\ s: what ``asickernels check`` and ``bench`` run (sizes, inputs,
  what a result is compared with), built from those conformance cases;
* its :class:`CompileShape`\\ s: the shapes the TPU compile gate compiles its Pallas kernel
  at (:data:`asickernels.estimates.compile_gate.BENCHMARK_SHAPES`);
* its :class:`NkiEstimate`\\ s: the bench size the NKI estimate rows simulate
  (:data:`asickernels.estimates.nki_estimates.KERNELS`);
* its ``examples(batch)``: for each of its ops, valid arguments by parameter name that give every
  parameter, the optional ones off their defaults, with shapes and values distinct enough
  that an argument passed to the wrong parameter shows, and ``batch`` leading dims where the
  op has batch dims. Every frontend's tests call every function with them, and the
  validation tests spoil them one argument at a time.

:mod:`asickernels.kernels.case_tables` gathers them; nothing here imports the consumers.
Every case is deterministic (fixed seeds).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias, TypeVar

import numpy as np

from asickernels.kernels import oracle, registry
from asickernels.kernels.declaration import Op
from asickernels.simulate.tpu_compile import ArgSpec

# Sizes chosen to divide by none of the block sizes (8, 128, 512) and to straddle them.
RAGGED_SIZES = (1, 7, 130, 257)

Canonical: TypeAlias = np.ndarray | tuple[np.ndarray, ...]  # an op's outputs, as numpy


# -- input generators ------------------------------------------------------------------------


def random_boxes(
    rng: np.random.Generator, shape: tuple[int, ...], scale: float = 10.0
) -> np.ndarray:
    """float32 boxes ``shape + (4,)``: corners uniform in ``[-scale, scale)``, sides in
    ``[0, scale)`` (some nearly empty)."""
    xy = rng.uniform(-scale, scale, shape + (2,))
    wh = rng.uniform(0.0, scale, shape + (2,))
    return np.concatenate([xy, xy + wh], axis=-1).astype(np.float32)


def grid_boxes(
    rng: np.random.Generator, shape: tuple[int, ...], span: int = 40, size: int = 16
) -> np.ndarray:
    """float32 boxes ``shape + (4,)`` on the integer grid: corners in ``[0, span)``, sides
    in ``[0, size)``, so that equal boxes, shared edges and zero sizes occur."""
    xy = rng.integers(0, span, shape + (2,))
    wh = rng.integers(0, size, shape + (2,))
    return np.concatenate([xy, xy + wh], axis=-1).astype(np.float32)


def bench_boxes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Benchmark boxes: ``shape + (4,)`` float32, corners and sides up to 256."""
    return random_boxes(rng, shape, scale=256.0)


def jittered(rng: np.random.Generator, boxes: np.ndarray, amount: float = 0.2) -> np.ndarray:
    """Boxes moved by up to ``amount`` of their size: predictions near their targets."""
    wh = np.concatenate([boxes[..., 2:] - boxes[..., :2]] * 2, axis=-1)
    return (boxes + rng.uniform(-amount, amount, boxes.shape) * wh).astype(boxes.dtype)


def batched(array: np.ndarray, batch: tuple[int, ...]) -> np.ndarray:
    """``array`` repeated over leading ``batch`` dims (a copy)."""
    return np.broadcast_to(array, batch + array.shape).copy()


CaseT = TypeVar("CaseT")


def checked(cases: list[CaseT]) -> list[CaseT]:
    """The conformance suite's cases, less its slow tier (what ``check`` runs)."""
    return [case for case in cases if not getattr(case, "slow", False)]


# -- check and bench workloads ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Size:
    """One benchmark size of a workload: ``label`` for tables, ``params`` for JSON and inputs."""

    label: str
    params: dict[str, Any]


@dataclasses.dataclass
class Case:
    """The inputs of one call: ``arrays`` in the op's positional order, ``static`` keyword
    arguments."""

    name: str
    arrays: tuple[np.ndarray, ...]
    static: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Comparison:
    max_error: float
    tolerance: float
    passed: bool
    checked: str = "all"  # what part of the output was compared


def oracle_comparison(op: Op, got: Canonical, expected: oracle.Outputs) -> Comparison:
    """The oracle's verdict (:mod:`asickernels.kernels.oracle`): error in units of the op's
    tolerance (1 or less passes); for exact ops, the number of differing elements."""
    verdict = oracle.compare(op, got, expected)
    limit = 0.0 if verdict.tolerance == oracle.EXACT else 1.0
    return Comparison(verdict.error, limit, verdict.passed)


class Workload:
    """A public op as ``check`` and ``bench`` run it (:mod:`asickernels.benchmarking`); each
    op's cases module fills in the op-specific parts."""

    op: Op  # the public op it runs (``asickernels.<op.name>``)
    size_syntax: str  # for --help and errors
    default_sizes: tuple[str, ...]
    quick_cases: frozenset[str]  # the check cases `run` uses (each shape compiles anew)
    quick_sizes: tuple[str, ...]  # the sizes `run` times

    @property
    def name(self) -> str:
        return self.op.name

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
        return self.op.reference(*case.arrays, **case.static)

    def compare(self, got: Canonical, expected: Any) -> Comparison:
        """By default the oracle's verdict (:func:`oracle_comparison`)."""
        return oracle_comparison(self.op, got, expected)

    def backends(self) -> list[str]:
        """The backends that implement the op's kernel."""
        assert self.op.kernel is not None
        return registry.backends_for(self.op.kernel)


def pairs_size(text: str) -> Size:
    """``P`` or ``AxB`` paired boxes (the element-wise box metrics' size syntax)."""
    match = re.fullmatch(r"(\d+)(?:x(\d+))?", text)
    if not match or int(match[1]) < 1 or int(match[2] or 1) < 1:
        raise ValueError(f"expected P or AxB pairs (e.g. 1024x256), got {text!r}")
    shape = (int(match[1]), int(match[2])) if match[2] else (int(match[1]),)
    return Size("x".join(map(str, shape)) + " pairs", {"shape": list(shape)})


# -- the simulators' and compilers' shapes ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CompileShape:
    """One shape the TPU compile gate compiles an op's Pallas kernel at: the public op
    ``op`` on arrays of ``args`` (given as its first array parameters, in order) with
    ``static`` keyword arguments, or, with ``gradient``, the gradient of its sum with
    respect to the arrays at those positions. ``kernel`` and ``shape`` label the gate's
    table."""

    kernel: str
    shape: str
    op: str
    args: tuple[ArgSpec, ...]
    static: Mapping[str, object] = dataclasses.field(default_factory=dict)
    gradient: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Work:
    """What an op must move and compute on one NeuronCore at one size, whatever the kernel:
    ``hbm_bytes`` (inputs read once, outputs written once) and ``ops`` on ``engine``
    (``"tensor"``: multiply-adds counted as 2; ``"vector"``: float32 elementwise). Operation
    counts take each min/max/add/sub/mul/div of the op's formula once (``+ eps`` and
    transcendental functions not counted), so they are lower bounds. Its roofline on a
    NeuronCore generation: :func:`asickernels.estimates.nki_estimates.roofline_us`."""

    hbm_bytes: float
    ops: float = 0.0
    engine: str = "vector"


def paired_work(
    ops_per_pair: int, in_bytes: int = 32, out_bytes: int = 4
) -> Callable[[Size], Work]:
    """The work of a paired-boxes op: ``[..., 4]`` float32 x2 in (``in_bytes`` per pair),
    ``out_bytes`` per pair out, ``ops_per_pair`` operations per pair."""

    def work(size: Size) -> Work:
        pairs = math.prod(size.params["shape"])
        return Work(pairs * (in_bytes + out_bytes), pairs * ops_per_pair)

    return work


@dataclasses.dataclass(frozen=True)
class NkiEstimate:
    """The NKI estimate row of workload ``op``: run once at ``size`` (its bench size
    syntax) in the NKI simulator; ``why`` that size; ``work`` what the op must move and
    compute at a size (its roofline beside the estimate)."""

    op: str
    size: str
    why: str
    work: Callable[[Size], Work]
