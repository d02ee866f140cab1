"""PyTorch frontend: the asickernels ops on torch tensors, as ``torch.ops.asickernels.*``.

Importing this module registers one ``torch.library`` operator per op declaration (with
fake implementations, so they trace under ``torch.compile``, and autograd for the
differentiable ops; :mod:`asickernels.torch.ops`) and their torch_xla kernels
(:mod:`asickernels.torch.xla`). The functions below take the arguments of the JAX API in
:mod:`asickernels` (``out_dtype`` as a torch dtype; Python numbers where an array is
expected become tensors) and return what it returns, as torch tensors on the inputs'
device. CPU tensors run the JAX API's own path (selection policy included); torch_xla
tensors run the JAX/Pallas kernels inside the torch_xla graph through ``call_jax``.

``import asickernels`` never imports torch; ``import asickernels.torch`` needs it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

try:
    import torch
except ImportError as error:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "asickernels.torch needs PyTorch: pip install torch (and torch_xla for XLA tensors)"
    ) from error

import asickernels
from asickernels.kernels.declaration import Op
from asickernels.torch import ops
from asickernels.torch import xla as _xla  # noqa: F401  (registers ops and XLA kernels)


def _plain_eager_cpu(tensors: list[torch.Tensor]) -> bool:
    """Whether a call may go straight to the CPU implementation instead of through the
    dispatcher: CPU tensors of the plain type, nothing to record for autograd, and no
    torch.compile trace or functorch transform watching (those need the operator)."""
    return (
        all(type(t) is torch.Tensor and t.device.type == "cpu" for t in tensors)
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
        and not torch.compiler.is_compiling()
        and not torch._C._are_functorch_transforms_active()
    )


def _frontend(op: Op) -> Callable[..., Any]:
    """The torch function of ``op``: its JAX signature without ``config``. A plain eager
    call on CPU tensors runs the operator's CPU implementation directly (the dispatcher
    costs tens of microseconds, as much as a small NMS); anything else goes through
    ``torch.ops.asickernels.<op>``."""
    library_op = getattr(torch.ops.asickernels, op.name)
    signature = op.__signature__.replace(
        parameters=[p for p in op.__signature__.parameters.values() if p.name != "config"]
    )
    positional = op.array_names  # custom ops take tensors positionally, the rest by keyword
    array_names = set(op.array_names)

    def function(*args: Any, **kwargs: Any) -> Any:
        values = None if "config" in kwargs else op._fast_bind(args, kwargs)
        if values is None:  # let inspect say what is wrong
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            values = dict(bound.arguments)
        values.pop("config", None)
        like = next(v for v in values.values() if isinstance(v, torch.Tensor))
        for name in array_names:
            value = values[name]
            if value is not None and not isinstance(value, torch.Tensor):
                values[name] = torch.as_tensor(value, device=like.device)
        keyword = {n: v for n, v in values.items() if n not in positional}
        tensors = [values[n] for n in positional if values[n] is not None]
        if _plain_eager_cpu(tensors):
            arrays = {n: values[n] for n in positional}
            statics = {
                p.name: ops.torch_value(p, values[p.name]) for p in op.params if p.kind == "static"
            }
            return ops.run_on_cpu(op, arrays, statics, values["backend"])
        return library_op(*(values[n] for n in positional), **keyword)

    function.__name__ = function.__qualname__ = op.name
    function.__doc__ = op.__doc__
    function.__signature__ = signature  # type: ignore[attr-defined]
    function.__module__ = __name__
    return function


_FUNCTIONS = {op.name: _frontend(op) for op in asickernels.OPS}
globals().update(_FUNCTIONS)
__all__ = sorted(_FUNCTIONS)


def __getattr__(name: str) -> Any:  # for type checkers: the generated functions
    raise AttributeError(name)


del inspect
