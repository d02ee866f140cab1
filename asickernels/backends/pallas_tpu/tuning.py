"""TPU generations, per-generation block sizes, and how a Pallas call runs (compiled or
interpreted).

Block sizes come from tables per generation, checked with the real compiler by the compile
gate (``asickernels compile``) and tuned with the schedule estimate (``asickernels
estimate``). Callers override them by passing a config object as ``config=``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import inspect
from collections.abc import Callable, Iterator
from typing import Any, Literal, TypeVar

GENERATIONS = ("v4", "v5e", "v5p", "v6e", "v7x")
DEFAULT_GENERATION = "v5e"
# Generations whose MXU has no int8 x int8 path (int8 matmul falls back to XLA there).
NO_INT8_MXU = frozenset({"v4", "v7x"})
# Physical VMEM per TensorCore, bytes.
VMEM_BYTES = {"v4": 16 << 20, "v5e": 128 << 20, "v5p": 64 << 20, "v6e": 128 << 20, "v7x": 64 << 20}
# Default scoped-VMEM limit Mosaic grants a kernel unless vmem_limit_bytes raises it.
DEFAULT_SCOPED_VMEM_BYTES = 16 << 20

InterpretMode = Literal["tpu_interpret"] | None
GridSemantics = Literal["parallel", "arbitrary"]

_target: contextvars.ContextVar[str | None] = contextvars.ContextVar("tpu_target", default=None)
_vmem_requests: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "vmem_requests", default=None
)


@contextlib.contextmanager
def compile_for(generation: str) -> Iterator[None]:
    """Within this block, Pallas kernels are built for a real TPU of ``generation`` (Mosaic,
    not interpret mode), with that generation's block sizes, whatever device JAX runs on.
    Used to compile for TPU topologies from a CPU machine."""
    if generation not in GENERATIONS:
        raise ValueError(f"unknown TPU generation {generation!r}; known: {GENERATIONS}")
    token = _target.set(generation)
    try:
        yield
    finally:
        _target.reset(token)


def generation_of(device_kind: str) -> str:
    """``jax.Device.device_kind`` -> generation name (``"TPU v5 lite"`` -> ``"v5e"``)."""
    kind = device_kind.lower().replace("tpu", "").strip()
    if kind.startswith(("v5 lite", "v5e", "v5litepod")):
        return "v5e"
    if kind.startswith(("v6 lite", "v6e", "v6")):
        return "v6e"
    if kind.startswith(("v5p", "v5")):
        return "v5p"
    if kind.startswith(("7", "v7")):
        return "v7x"
    if kind.startswith("v4"):
        return "v4"
    raise ValueError(f"unrecognised TPU device kind {device_kind!r}")


def target_generation() -> str | None:
    """The generation kernels are being built for: :func:`compile_for`'s, else the default
    device's when JAX runs on a TPU, else None (no TPU: interpret mode)."""
    generation = _target.get()
    if generation is not None:
        return generation
    import jax

    if jax.default_backend() == "tpu":
        return generation_of(jax.devices()[0].device_kind)
    return None


def interpret_param(mode: InterpretMode) -> Any:
    """The ``interpret=`` argument for ``pallas_call``: False when building for a TPU, TPU
    interpret mode with race detection for ``"tpu_interpret"``, else generic interpret."""
    if mode == "tpu_interpret":
        from jax.experimental.pallas import tpu as pltpu

        # Two simulated TensorCores (as on v4/v5p megacore chips): "parallel" grid axes are
        # split between them, so a kernel that wrongly claims independence shows up as a race.
        # The option's name changed after jax 0.7 (num_cores_per_device -> num_cores_or_threads).
        options = inspect.signature(pltpu.InterpretParams).parameters
        cores = (
            "num_cores_or_threads" if "num_cores_or_threads" in options else "num_cores_per_device"
        )
        return pltpu.InterpretParams(detect_races=True, **{cores: 2})  # type: ignore[arg-type]
    return target_generation() is None


def check_no_races(mode: InterpretMode) -> None:
    """After an eager TPU-interpret run, raises if the interpreter saw a data race."""
    if mode != "tpu_interpret":
        return
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as state

    races = getattr(state, "races", None)
    if races is not None and races.races_found:
        raise RuntimeError("TPU interpret mode detected a data race in a Pallas kernel")


@contextlib.contextmanager
def record_vmem() -> Iterator[list[int]]:
    """Collects the VMEM bytes each Pallas kernel traced in this block needs for its blocks
    and scratch (double buffering included), as computed from its BlockSpecs."""
    requests: list[int] = []
    token = _vmem_requests.set(requests)
    try:
        yield requests
    finally:
        _vmem_requests.reset(token)


def compiler_params(semantics: tuple[GridSemantics, ...], vmem_bytes: int) -> Any:
    """Mosaic parameters; raises the scoped-VMEM limit only when the blocks need it."""
    from jax.experimental.pallas import tpu as pltpu

    requests = _vmem_requests.get()
    if requests is not None:
        requests.append(vmem_bytes)
    limit = None
    if vmem_bytes > DEFAULT_SCOPED_VMEM_BYTES * 3 // 4:
        limit = min(int(vmem_bytes * 1.25) + (1 << 20), 100 << 20)
    return pltpu.CompilerParams(dimension_semantics=semantics, vmem_limit_bytes=limit)


def tpu_interpret_traceable() -> bool:
    """Whether TPU interpret mode works under ``jit``/``vmap``/``grad`` with this JAX: before
    0.8 its ordered callbacks fail to lower inside transformations (``KeyError:
    OrderedIOEffect``)."""
    import jax

    return tuple(int(part) for part in jax.__version__.split(".")[:2]) >= (0, 8)


def batchable(kernel_call: Callable[..., Any], mode: InterpretMode) -> Callable[..., Any]:
    """``kernel_call`` (a ``pallas_call``), made safe to ``vmap`` in every mode.

    Mosaic and the generic interpreter batch a ``pallas_call`` by adding a grid dimension;
    TPU interpret mode then rejects the grid semantics (one fewer than grid dimensions), so
    there a vmapped call runs once per batch element instead. With a JAX too old to trace
    TPU interpret mode at all, a traced call is refused with the reason."""
    if mode != "tpu_interpret":
        return kernel_call
    import jax

    if tpu_interpret_traceable():
        return jax.custom_batching.sequential_vmap(kernel_call)

    def eager_only(*args: Any) -> Any:
        if any(isinstance(arg, jax.core.Tracer) for arg in args):
            raise NotImplementedError(
                f"TPU interpret mode cannot run under jit/vmap/grad with jax {jax.__version__} "
                "(fixed in newer JAX); call it eagerly, or use backend='pallas_tpu'"
            )
        return kernel_call(*args)

    return eager_only


@dataclasses.dataclass(frozen=True)
class GiouConfig:
    """GIOU kernels: each grid step handles ``block_rows`` x 128 box pairs."""

    block_rows: int = 256

    def __post_init__(self) -> None:
        if self.block_rows <= 0 or self.block_rows % 16:
            raise ValueError(f"block_rows must be a positive multiple of 16, got {self.block_rows}")


@dataclasses.dataclass(frozen=True)
class Int8MatmulConfig:
    """int8 matmul blocks: ``block_m`` a multiple of 32 (int8 sublane tiling), ``block_n``
    and ``block_k`` multiples of 128 (lanes). K is the last, sequential grid axis."""

    block_m: int = 512
    block_n: int = 512
    block_k: int = 1024

    def __post_init__(self) -> None:
        if self.block_m <= 0 or self.block_m % 32:
            raise ValueError(f"block_m must be a positive multiple of 32, got {self.block_m}")
        for name in ("block_n", "block_k"):
            value = getattr(self, name)
            if value <= 0 or value % 128:
                raise ValueError(f"{name} must be a positive multiple of 128, got {value}")


@dataclasses.dataclass(frozen=True)
class NmsConfig:
    """Tiled NMS: boxes are decided ``tile`` at a time (a multiple of 128)."""

    tile: int = 256

    def __post_init__(self) -> None:
        if self.tile <= 0 or self.tile % 128:
            raise ValueError(f"tile must be a positive multiple of 128, got {self.tile}")


GIOU_CONFIGS = {gen: GiouConfig() for gen in GENERATIONS}
# `asickernels estimate --tune`: tile 256 is best or within 3% on v5e, v6e and v5p.
# Chosen with `asickernels estimate --tune` (compiler-schedule estimates at 8192^3 and 2048^3;
# benchmarks/results/tpu_estimates.md): larger K blocks amortise the accumulator traffic.
INT8_MATMUL_CONFIGS = {
    "v5e": Int8MatmulConfig(1024, 1024, 2048),
    "v5p": Int8MatmulConfig(1024, 1024, 2048),
    "v6e": Int8MatmulConfig(1024, 2048, 2048),
}
NMS_CONFIGS = {gen: NmsConfig() for gen in GENERATIONS}

Config = TypeVar("Config")


def config_for(table: dict[str, Config], default: Config, override: Any, kind: type) -> Config:
    """``override`` when given (checked to be a ``kind``), else the target generation's entry."""
    if override is not None:
        if not isinstance(override, kind):
            raise TypeError(f"config must be a {kind.__name__}, got {type(override).__name__}")
        return override  # type: ignore[no-any-return,return-value]
    return table.get(target_generation() or DEFAULT_GENERATION, default)
