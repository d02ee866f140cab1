"""The ``torch.ops.asickernels`` operators, generated from the op declarations.

For every :class:`~asickernels.kernels.declaration.Op` in :data:`asickernels.OPS` this
defines ``asickernels::<name>`` with a schema built from the op's parameters, a CPU kernel,
a fake (meta) kernel from the op's own output plan, and, for differentiable ops, a
companion ``asickernels::<name>_backward`` operator and autograd. The torch_xla kernels are
added by :mod:`asickernels.torch.xla` from the same declarations.

CPU tensors run the op exactly as the JAX API does (validation, selection policy, dtypes):
the tensors are handed over as numpy views without a copy, and host backends answer in
numpy, so nothing passes through JAX dispatch when it does not have to. float64 stays
float64 (``torch.autograd.gradcheck`` works).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeAlias

import jax
import ml_dtypes
import numpy as np
import torch

import asickernels
from asickernels.kernels.declaration import REQUIRED, Op, Param, Spec

# What an operator returns: one tensor, or a tuple of them (as its schema says).
Outputs: TypeAlias = torch.Tensor | tuple[torch.Tensor, ...]
Gradients: TypeAlias = tuple[torch.Tensor | None, ...]


class CustomOp(Protocol):
    """What this package uses of an operator made by ``torch.library.custom_op``."""

    def __call__(self, *args: torch.Tensor | None, **kwargs: object) -> Outputs: ...

    def register_fake(self, fn: Callable[..., Outputs], /) -> object: ...

    def register_kernel(
        self, device_types: str, /
    ) -> Callable[[Callable[..., Outputs]], object]: ...

    def register_autograd(
        self, backward: Callable[..., Gradients], /, *, setup_context: Callable[..., None]
    ) -> None: ...


# A table, not a conversion through tensors: fake (meta) kernels run under FakeTensorMode.
_DTYPES = {
    torch.bool: np.dtype(np.bool_),
    torch.int8: np.dtype(np.int8),
    torch.uint8: np.dtype(np.uint8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.float16: np.dtype(np.float16),
    torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
}
_TORCH_DTYPES = {v: k for k, v in _DTYPES.items()}


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy (or ml_dtypes) dtype of a torch dtype."""
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise TypeError(f"asickernels has no use for {dtype} tensors") from None


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    return _TORCH_DTYPES[np.dtype(dtype)]


def to_host(tensor: torch.Tensor | None) -> np.ndarray | None:
    """A CPU tensor as a numpy view (bfloat16 through its bits), without a copy."""
    if tensor is None:
        return None
    tensor = tensor.detach()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def to_torch(array: np.ndarray | jax.Array) -> torch.Tensor:
    if isinstance(array, jax.Array):
        if array.dtype == ml_dtypes.bfloat16:
            return torch.from_numpy(np.asarray(array).view(np.int16)).view(torch.bfloat16)
        return torch.from_dlpack(array)
    array = np.asarray(array)
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array)


def spec_of(tensor: torch.Tensor | None) -> Spec | None:
    return None if tensor is None else Spec(tuple(tensor.shape), numpy_dtype(tensor.dtype))


# Schemas ------------------------------------------------------------------------------------


def _default_text(value: object) -> str:
    if value is None:
        return "None"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def _param_text(param: Param) -> str:
    text = f"{param.torch_type} {param.name}"
    if param.default is not REQUIRED:
        text += f"={_default_text(param.default)}"
    return text


def schema(op: Op, params: tuple[Param, ...] | None = None, outputs: int | None = None) -> str:
    """The ``torch.library`` schema of ``op``: its arrays as positional tensors (custom ops
    take no keyword-only tensors), then its static values and ``str? backend=None`` as
    keyword-only arguments."""
    params = op.params if params is None else params
    positional = [_param_text(p) for p in params if p.kind == "array"]
    keyword = [_param_text(p) for p in params if p.kind != "array"] + ["str? backend=None"]
    count = len(op.outputs) if outputs is None else outputs
    returns = "Tensor" if count == 1 else "(" + ", ".join(["Tensor"] * count) + ")"
    return "(" + ", ".join([*positional, "*", *keyword]) + f") -> {returns}"


def named_tensors(
    op: Op, tensors: tuple[torch.Tensor | None, ...]
) -> dict[str, torch.Tensor | None]:
    """An operator's tensors (its positional arguments) by the op's array names, None for
    those left out (the dispatcher passes no trailing argument given its default). The
    dispatcher lets None through for a required tensor: refused here.

    Raises:
      TypeError: a required tensor is None.
    """
    named = dict.fromkeys(op.array_names) | dict(zip(op.array_names, tensors, strict=False))
    for p in op.params:
        if p.torch_type == "Tensor" and named[p.name] is None:
            raise TypeError(f"{p.name} must be a tensor, got None")
    return named


def jax_statics(op: Op, given: Mapping[str, object]) -> dict[str, object]:
    """An operator's static arguments (its keyword arguments but ``backend``) as the JAX op
    takes them: all of them (the dispatcher passes only those given, so the others get their
    declared defaults), torch dtypes as numpy dtypes."""
    statics = op.static_defaults | dict(given)
    return {n: numpy_dtype(v) if isinstance(v, torch.dtype) else v for n, v in statics.items()}


# The operators' kernels take their arguments as the schema passes them, ``(*tensors,
# backend=None, **statics)`` (a backward operator's: the cotangent first); each is
# registered with its ``op`` bound (``functools.partial``).


def run_on_cpu(
    op: Op, *tensors: torch.Tensor | None, backend: str | None = None, **statics: object
) -> Outputs:
    """``op`` on CPU tensors as the JAX API runs it (validation, selection policy, dtypes),
    on numpy views of the tensors, straight on the chosen backend's host implementation
    where it has one (:meth:`Eager.executor <asickernels.kernels.eager.Eager.executor>`);
    returns torch tensors."""
    arrays = op.prepared({n: to_host(t) for n, t in named_tensors(op, tensors).items()})
    plan = op.plan(arrays, **jax_statics(op, statics))
    chosen = op.choose(plan, backend, arrays)
    if op.check_values is not None:
        op.check_values(**arrays)
    names = tuple(n for n, a in arrays.items() if a is not None)
    out = op.eager.executor(chosen, plan, None, names, "always")(*[arrays[n] for n in names])
    return tuple(map(to_torch, out)) if isinstance(out, tuple) else to_torch(out)


def fake_outputs(
    op: Op, *tensors: torch.Tensor | None, backend: str | None = None, **statics: object
) -> Outputs:
    """Empty tensors of ``op``'s output shapes and dtypes, from its own plan."""
    specs = {n: spec_of(t) for n, t in named_tensors(op, tensors).items()}
    plan = op.plan(specs, **jax_statics(op, statics))
    like = next(t for t in tensors if t is not None)
    outs = tuple(like.new_empty(s.shape, dtype=torch_dtype(s.dtype)) for s in plan.output_list())
    return outs if not isinstance(plan.outputs, Spec) else outs[0]


def run_vjp_on_cpu(
    op: Op,
    cotangent: torch.Tensor,
    *tensors: torch.Tensor | None,
    backend: str | None = None,
    **statics: object,
) -> Outputs:
    """The gradients of ``op``'s differentiable arrays (:attr:`Op.vjp`) on CPU tensors."""
    assert op.vjp is not None
    arrays = {n: to_host(t) for n, t in named_tensors(op, tensors).items()}
    grads = op.vjp(arrays, jax_statics(op, statics), backend, to_host(cotangent))
    return single_or_tuple(tuple(to_torch(g) for g in grads))


def fake_vjp(
    op: Op,
    cotangent: torch.Tensor,
    *tensors: torch.Tensor | None,
    backend: str | None = None,
    **statics: object,
) -> Outputs:
    named = named_tensors(op, tensors)
    wide = any(t is not None and t.dtype == torch.float64 for t in tensors)
    dtype = torch.float64 if wide else torch.float32
    inputs = [named[n] for n in op.differentiable]  # required arrays: never None
    grads = tuple(t.new_empty(t.shape, dtype=dtype) for t in inputs if t is not None)
    return single_or_tuple(grads)


# Registration -------------------------------------------------------------------------------


def single_or_tuple(grads: tuple[torch.Tensor, ...]) -> Outputs:
    """A backward operator's result as its schema returns it: a tensor for one gradient."""
    return grads[0] if len(grads) == 1 else grads


def define(
    name: str, text: str, cpu: Callable[..., Outputs], fake: Callable[..., Outputs]
) -> CustomOp:
    """``asickernels::<name>`` with schema ``text``, its CPU kernel and its fake kernel."""
    library_op = torch.library.custom_op(f"asickernels::{name}", mutates_args=(), schema=text)(cpu)
    library_op.register_fake(fake)
    return library_op


def backward_params(op: Op) -> tuple[Param, ...]:
    """The backward operator's parameters: the cotangent, then the op's (a required tensor
    cannot follow the optional ones)."""
    return (Param("cotangent", "array", "Tensor", positional=True), *op.params)


def register(op: Op) -> tuple[CustomOp, CustomOp | None]:
    """Defines ``asickernels::<op.name>`` (and its backward operator and autograd for a
    differentiable op); returns the two ``torch.library`` custom ops."""
    bound = functools.partial
    forward = define(op.name, schema(op), bound(run_on_cpu, op), bound(fake_outputs, op))
    if op.vjp is None:
        return forward, None
    backward = define(
        f"{op.name}_backward",
        schema(op, backward_params(op), outputs=len(op.differentiable)),
        bound(run_vjp_on_cpu, op),
        bound(fake_vjp, op),
    )
    register_autograd(op, forward, backward)
    return forward, backward


def register_autograd(op: Op, forward: CustomOp, backward: Callable[..., Outputs]) -> None:
    """Autograd for ``forward``, an operator of ``op``'s schema (:func:`schema`): the
    gradients of its differentiable arrays come from ``backward``, an operator of the
    schema of :func:`backward_params` (cast back to each input's dtype); the other
    inputs get None."""

    def setup_context(
        ctx: Any,  # torch's autograd context, given attributes here
        inputs: tuple[torch.Tensor | None, ...],
        keyword_only_inputs: dict[str, object],
        output: Outputs,
    ) -> None:
        ctx.keywords = keyword_only_inputs
        ctx.save_for_backward(*inputs)

    def grad(ctx: Any, cotangent: torch.Tensor) -> Gradients:
        inputs = ctx.saved_tensors
        computed = backward(cotangent, *inputs, **ctx.keywords)
        if isinstance(computed, torch.Tensor):  # one differentiable input
            computed = (computed,)
        grads = dict(zip(op.differentiable, computed, strict=True))
        results = []
        for name, given in zip(op.array_names, inputs, strict=True):
            g = grads.get(name)
            results.append(None if g is None else g.to(given.dtype))
        return tuple(results)

    forward.register_autograd(grad, setup_context=setup_context)


OPERATORS: dict[str, tuple[CustomOp, CustomOp | None]] = {
    op.name: register(op) for op in asickernels.OPS
}
