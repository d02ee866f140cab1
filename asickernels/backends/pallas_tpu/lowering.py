"""How a Pallas call runs: compiled by Mosaic, in Pallas interpret mode, or in TPU interpret
mode.

A kernel is written as ``build(target) -> function`` and called through :func:`run`. The
target is decided when JAX *lowers* the computation, not when it traces it: lowered for a
TPU (a TPU host, or a TPU topology device from ``jax.experimental.topologies`` on any host)
it is Mosaic for that generation (its block sizes and VMEM); lowered for anything else, Pallas
interpret mode. So ``jax.jit(f).lower(args on a TPU device).compile()`` builds Mosaic
kernels with no context manager, and the same ``f`` on CPU interprets them.

Limits: the generation comes from the lowering's XLA client (its devices' ``device_kind``);
a lowering for the TPU platform without a TPU client (``jax.export(...,
platforms=("tpu", ...))`` on a CPU host) builds for
:data:`asickernels.tpu_generations.DEFAULT`. Eager calls jit one primitive per (kernel,
static arguments), cached.

Each kernel's block sizes are a config dataclass beside the kernel (its defaults; callers
pass their own as ``config=``); tuned per-generation blocks, where there are any, are data in
:mod:`asickernels.backends.pallas_tpu.tuned_block_sizes`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any, Literal

import jax
import jax.extend
from jax.interpreters import batching, mlir

from asickernels import tpu_generations as generations

InterpretMode = Literal["tpu_interpret"] | None
GridSemantics = Literal["parallel", "arbitrary"]

_vmem_requests: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "vmem_requests", default=None
)


@dataclasses.dataclass(frozen=True)
class Target:
    """What a kernel is being built for: ``generation`` picks tuned blocks and VMEM
    limits; ``interpret`` is ``pallas_call``'s ``interpret=`` (False: Mosaic)."""

    generation: str
    interpret: Any

    @property
    def mosaic(self) -> bool:
        return self.interpret is False


@dataclasses.dataclass(frozen=True)
class Build:
    """``make(*static, target)``: a kernel's builder with its static arguments, compared by
    value so that equal calls share one compiled function."""

    make: Callable[..., Callable[..., Any]]
    static: tuple[Any, ...] = ()

    def __call__(self, target: Target) -> Callable[..., Any]:
        return self.make(*self.static, target)


def run(build: Build, mode: InterpretMode, *args: Any) -> Any:
    """``build(target)(*args)``, with the target decided where it can be known.

    For ``mode="tpu_interpret"`` that is now: TPU interpret mode, for the default generation.
    Otherwise the choice is made when the computation is *lowered* (see :func:`lowered_for`):
    Mosaic for the TPU generation being lowered for, else Pallas interpret mode.
    The built function's outputs may be any pytree of arrays."""
    if mode == "tpu_interpret":
        out = batchable(build(Target(generations.DEFAULT, tpu_interpret_params())), mode)(*args)
        if not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(out)):
            check_no_races(mode)
        return out
    tree = jax.tree.structure(jax.eval_shape(build(Target(generations.DEFAULT, True)), *args))
    flat = _by_platform_p.bind(*args, build=_FlatBuild(build))
    return jax.tree.unflatten(tree, flat)


@dataclasses.dataclass(frozen=True)
class _FlatBuild:
    """``build`` with flat list outputs (what a primitive returns)."""

    build: Build
    batch_dims: tuple[int | None, ...] | None = None

    def __call__(self, target: Target) -> Callable[..., list[Any]]:
        function = self.build(target)
        if self.batch_dims is not None:
            function = jax.vmap(function, in_axes=self.batch_dims)
        return lambda *args: jax.tree.leaves(function(*args))

    def interpreted(self) -> Callable[..., list[Any]]:
        """Built for Pallas interpret mode at the default generation: what abstract
        evaluation and lowerings off TPU run, and what the TPU estimator walks
        (:mod:`asickernels.simulate.tpu_estimate.observed`, which sees only this primitive's
        ``build`` parameter)."""
        return self(Target(generations.DEFAULT, True))


# A Pallas call whose Mosaic-or-interpret choice (and generation) is made at lowering:
# JAX exposes no device at trace time (tracers carry an abstract mesh without devices), but a
# lowering rule sees the platform it lowers for and the client it lowers with, whose devices
# name the TPU generation (a compile-only topology client or the TPU host's own).
_by_platform_p = jax.extend.core.Primitive("asickernels_pallas_by_platform")
_by_platform_p.multiple_results = True


def _abstract_eval(*avals: Any, build: _FlatBuild) -> list[Any]:
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]
    outs = jax.eval_shape(build.interpreted(), *specs)
    return [jax.core.ShapedArray(o.shape, o.dtype) for o in outs]


@functools.cache
def _eager(build: _FlatBuild) -> Callable[..., Any]:
    return jax.jit(lambda *args: _by_platform_p.bind(*args, build=build))


def _batch(args: Any, dims: Any, *, build: _FlatBuild) -> tuple[list[Any], list[int]]:
    batched = dataclasses.replace(build, batch_dims=tuple(dims))
    outs = _by_platform_p.bind(*args, build=batched)
    return outs, [0] * len(outs)


def lowered_for(backend: Any) -> Target:
    """The target for a lowering on the TPU platform with ``backend`` (the lowering's XLA
    client): that client's TPU generation, else (e.g. ``jax.export`` for several platforms
    from a CPU host) :data:`generations.DEFAULT`."""
    devices = backend.devices() if backend is not None else []
    generation = generations.generation_of(devices[0]) if devices else None
    return Target(generation or generations.DEFAULT, False)


def _lower_tpu(ctx: Any, *args: Any, build: _FlatBuild) -> Any:
    backend = ctx.module_context.backend
    target = lowered_for(backend)
    lower = mlir.lower_fun(build(target), multiple_results=True)
    device = backend.devices()[0] if backend is not None and backend.devices() else None
    if device is None or device.platform != "tpu" or not jax.sharding.get_abstract_mesh().empty:
        # Inside shard_map (or any mesh context) the abstract mesh already names the chips.
        return lower(ctx, *args)
    # JAX's Mosaic lowering asks the abstract mesh (else the default device, which is the
    # CPU when compiling for a topology) which chip it targets: tell it.
    chip = jax.sharding.AbstractDevice(
        device_kind=device.device_kind,
        num_cores=getattr(device, "num_cores", None),
        platform="tpu",
    )
    mesh = jax.sharding.AbstractMesh((1,), ("asickernels_chip",), abstract_device=chip)
    with jax.sharding.use_abstract_mesh(mesh):
        return lower(ctx, *args)


def _lower_elsewhere(ctx: Any, *args: Any, build: _FlatBuild) -> Any:
    return mlir.lower_fun(build.interpreted(), multiple_results=True)(ctx, *args)


_by_platform_p.def_impl(lambda *args, build: _eager(build)(*args))
_by_platform_p.def_abstract_eval(_abstract_eval)
batching.primitive_batchers[_by_platform_p] = _batch
mlir.register_lowering(_by_platform_p, _lower_elsewhere)
mlir.register_lowering(_by_platform_p, _lower_tpu, platform="tpu")


def tpu_interpret_params() -> Any:
    """TPU interpret mode with race detection and two simulated TensorCores (as on v4/v5p
    megacore chips): "parallel" grid axes are split between them, so a kernel that wrongly
    claims independence shows up as a race."""
    from asickernels.pallas_home import pltpu

    # The option's name changed after jax 0.7 (num_cores_per_device -> num_cores_or_threads).
    options = inspect.signature(pltpu.InterpretParams).parameters
    cores = "num_cores_or_threads" if "num_cores_or_threads" in options else "num_cores_per_device"
    params: dict[str, Any] = {cores: 2}
    # jax 0.12 raises inside the interpreter's callback by default (an opaque XLA error); "warn"
    # records the race as older versions do, and check_no_races raises after the run.
    if "on_race" in options:
        params["on_race"] = "warn"
    return pltpu.InterpretParams(detect_races=True, **params)


def check_no_races(mode: InterpretMode) -> None:
    """After an eager TPU-interpret run, raises if the interpreter saw a data race."""
    if mode != "tpu_interpret":
        return
    # JAX has no public accessor for the race detector's findings (its own tests read this
    # state); it moved in jax 0.8.
    import importlib

    try:  # jax >= 0.8
        state = importlib.import_module("jax._src.pallas.mosaic.interpret.interpret_pallas_call")
    except ImportError:  # jax 0.7: interpret is a module
        state = importlib.import_module("jax._src.pallas.mosaic.interpret")
    races = state.races
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


def compiler_params(
    semantics: tuple[GridSemantics, ...], vmem_bytes: int, generation: str = generations.DEFAULT
) -> Any:
    """Mosaic parameters; raises the scoped-VMEM limit only when the blocks need it, up to
    what ``generation``'s VMEM allows."""
    from asickernels.pallas_home import pltpu

    requests = _vmem_requests.get()
    if requests is not None:
        requests.append(vmem_bytes)
    facts = generations.get(generation)
    limit = None
    if vmem_bytes > facts.default_scoped_vmem_bytes * 3 // 4:
        limit = min(int(vmem_bytes * 1.25) + (1 << 20), facts.max_vmem_limit_bytes)
    return pltpu.CompilerParams(dimension_semantics=semantics, vmem_limit_bytes=limit)


def tpu_interpret_traceable() -> bool:
    """Whether TPU interpret mode works under ``jit``/``vmap``/``grad`` with this JAX: before
    0.8 its ordered callbacks fail to lower inside transformations (``KeyError:
    OrderedIOEffect``)."""
    return tuple(int(part) for part in jax.__version__.split(".")[:2]) >= (0, 8)


def batchable(kernel_call: Callable[..., Any], mode: InterpretMode) -> Callable[..., Any]:
    """``kernel_call`` (a ``pallas_call``), made safe to ``vmap`` in every mode.

    Mosaic and the generic interpreter batch a ``pallas_call`` by adding a grid dimension;
    TPU interpret mode then rejects the grid semantics (one fewer than grid dimensions), so
    there a vmapped call runs once per batch element instead. With a JAX too old to trace
    TPU interpret mode at all, a traced call is refused with the reason."""
    if mode != "tpu_interpret":
        return kernel_call
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
