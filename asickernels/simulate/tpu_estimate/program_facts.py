"""What a function's jaxpr says before any compiler runs: its Pallas kernels (grid, how the
grid is split over a chip's TensorCores) and the least work it must do (the floor). What a
run on example inputs says is in :mod:`.observed`.

Read from ``jax.make_jaxpr`` (public API), so it works on any jitted function or Pallas
kernel, ours or not, on a machine without a TPU. :mod:`.estimate` writes these facts beside
the compiler's schedule dumps and prints them with the estimate.

The floor counts only work that must happen whatever the data: matrix products
(``dot_general`` at ``2 * batch * M * N * K`` operations; ``ragged_dot`` at ``2 * M * K *
N``, each row meeting one group), inside Pallas kernels once per grid step, inside ``scan``
once per iteration; products under a ``cond`` or a ``while``, or in a kernel whose grid is
sized at run time, count zero (they may not run).
Its bytes are the function's inputs read once and outputs written once.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from asickernels import tpu_generations

ArgSpec = tuple[tuple[int, ...], Any]


@dataclasses.dataclass(frozen=True)
class PallasCall:
    """One ``pallas_call`` (or ``core_map``) of the function."""

    name: str
    grid: tuple[int, ...]  # -1: a dimension sized at run time
    dimension_semantics: tuple[str, ...] | None  # None: not given (all "arbitrary")
    core_map_cores: int | None = None  # a ``core_map`` kernel over this many cores

    def megacore(self, generation: str) -> str:
        """How the kernel uses ``generation``'s TensorCores, in one sentence."""
        facts = tpu_generations.get(generation)
        if facts.cores_per_device == 1:
            return f"{self.name}: one TensorCore per device on {generation}, nothing to split"
        if self.core_map_cores is not None:
            return (
                f"{self.name}: core_map over {self.core_map_cores} core(s); the walk follows "
                "core 0's program (cores assumed to do equal work)"
            )
        semantics = self.dimension_semantics or ("arbitrary",) * len(self.grid)
        split = [
            axis
            for axis, kind in enumerate(semantics)
            if kind in ("parallel", "core_parallel") and axis < len(self.grid)
        ]
        if split and facts.megacore:
            share = (
                f"{math.prod(self.grid)} steps"
                if min(self.grid) >= 0
                else "steps (grid sized at run time)"
            )
            return (
                f"{self.name}: grid {self.grid} split over {facts.cores_per_device} TensorCores "
                f"along parallel axis {split[0]} (dimension_semantics {semantics}); the walk "
                f"follows core 0's share of the {share}"
            )
        return (
            f"{self.name}: grid {self.grid} runs on one of {generation}'s "
            f"{facts.cores_per_device} TensorCores (dimension_semantics {semantics}: no "
            "parallel axis); the other idles"
        )


@dataclasses.dataclass(frozen=True)
class Floor:
    """Work a function must do: matrix-product operations by operand class and HBM bytes."""

    mxu_int8_ops: float = 0.0
    mxu_bf16_ops: float = 0.0
    hbm_bytes: float = 0.0

    def terms(self, generation: str) -> dict[str, float]:
        """Seconds each resource needs at ``generation``'s datasheet rates (per device)."""
        facts = tpu_generations.get(generation)
        int8_rate = facts.per_device(facts.peak_int8_ops_per_s or facts.peak_bf16_ops_per_s)
        bf16_rate = facts.per_device(facts.peak_bf16_ops_per_s)
        return {
            "HBM": self.hbm_bytes / facts.per_device(facts.hbm_bytes_per_s),
            "MXU": self.mxu_int8_ops / int8_rate + self.mxu_bf16_ops / bf16_rate,
        }

    def seconds(self, generation: str) -> float:
        return max(self.terms(generation).values())

    def bound(self, generation: str) -> str:
        """The resource whose term is the floor (``"MXU"`` or ``"HBM"``)."""
        terms = self.terms(generation)
        return max(terms, key=lambda name: terms[name])


@dataclasses.dataclass(frozen=True)
class ProgramFacts:
    pallas_calls: tuple[PallasCall, ...]
    floor: Floor

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProgramFacts:
        calls = tuple(
            PallasCall(
                call["name"],
                tuple(call["grid"]),
                None if call["dimension_semantics"] is None else tuple(call["dimension_semantics"]),
                call["core_map_cores"],
            )
            for call in data["pallas_calls"]
        )
        return cls(calls, Floor(**data["floor"]))


def _is_integer(dtype: Any) -> bool:
    import numpy as np

    return bool(np.issubdtype(np.dtype(dtype), np.integer))


def _nbytes(aval: Any) -> float:
    import numpy as np

    return float(math.prod(aval.shape) * np.dtype(aval.dtype).itemsize)


def dot_ops(eqn: Any) -> tuple[float, bool]:
    """(operations, integer operands) of a ``dot_general`` or ``ragged_dot``."""
    lhs, rhs = (var.aval for var in eqn.invars[:2])
    integer = _is_integer(lhs.dtype) and _is_integer(rhs.dtype)
    if eqn.primitive.name == "dot_general":
        (lhs_contract, _), _ = eqn.params["dimension_numbers"]
        contract = math.prod(lhs.shape[d] for d in lhs_contract)
        out = math.prod(eqn.outvars[0].aval.shape)
        return 2.0 * out * contract, integer
    # ragged_dot(lhs [M, K], rhs [G, K, N]): every row of lhs meets one group.
    m, k = lhs.shape[-2], lhs.shape[-1]
    n = rhs.shape[-1]
    return 2.0 * m * k * n, integer


class _Collector:
    def __init__(self) -> None:
        self.calls: list[PallasCall] = []
        self.int8_ops = 0.0
        self.bf16_ops = 0.0

    def visit(self, jaxpr: Any, weight: float) -> None:
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            if name in ("dot_general", "ragged_dot", "ragged_dot_general"):
                ops, integer = dot_ops(eqn)
                if integer:
                    self.int8_ops += weight * ops
                else:
                    self.bf16_ops += weight * ops
                continue
            if name == "pallas_call":
                grid = tuple(
                    g if isinstance(g, int) else -1 for g in eqn.params["grid_mapping"].grid
                )
                params = eqn.params.get("compiler_params")
                if isinstance(params, Mapping):  # older jax: {"mosaic_tpu": ...}
                    params = params.get("mosaic_tpu") or params.get("mosaic")
                semantics = getattr(params, "dimension_semantics", None)
                if isinstance(params, Mapping):
                    semantics = params.get("dimension_semantics")
                self.calls.append(
                    PallasCall(
                        str(eqn.params.get("name") or f"pallas_call #{len(self.calls)}"),
                        grid,
                        None if semantics is None else tuple(str(s).lower() for s in semantics),
                    )
                )
                steps = math.prod(grid or (1,)) if min(grid, default=0) >= 0 else 0
                self.visit(eqn.params["jaxpr"], weight * steps)
                continue
            if name == "core_map":
                mesh = eqn.params.get("mesh")
                cores = int(math.prod(getattr(mesh, "shape", {}).values() or (1,)))
                self.calls.append(PallasCall("core_map", (), None, cores))
            if name in ("cond", "while"):
                continue  # may not run: the floor counts nothing under it
            inner = weight * eqn.params["length"] if name == "scan" else weight
            for sub in jaxprs_in_params(eqn.params):
                self.visit(sub, inner)


def program_facts(function: Callable[..., Any], arg_specs: Sequence[ArgSpec]) -> ProgramFacts:
    """The Pallas kernels and floor of ``function`` at arguments of ``arg_specs`` ((shape,
    dtype) pairs), from its jaxpr (nothing runs or compiles)."""
    import jax

    args = [jax.ShapeDtypeStruct(tuple(shape), dtype) for shape, dtype in arg_specs]
    closed = jax.make_jaxpr(function)(*args)
    collector = _Collector()
    collector.visit(closed.jaxpr, 1.0)
    moved = sum(_nbytes(v.aval) for v in closed.jaxpr.invars) + sum(
        _nbytes(v.aval) for v in closed.jaxpr.outvars if hasattr(v, "aval")
    )
    floor = Floor(collector.int8_ops, collector.bf16_ops, moved)
    return ProgramFacts(tuple(collector.calls), floor)


def jaxprs_in_params(params: Mapping[str, Any]) -> Iterator[Any]:
    """The jaxprs among an equation's parameters, as ``jax.extend.core.jaxprs_in_params``
    gives them (jax 0.7.1, the oldest supported, lacks it)."""
    import jax.extend as jex

    for value in params.values():
        for item in value if isinstance(value, tuple | list) else (value,):
            if isinstance(item, jex.core.ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, jex.core.Jaxpr):
                yield item
