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
from asickernels.torch import xla as _xla  # noqa: F401  (registers ops and XLA kernels)


def _frontend(op: Op) -> Callable[..., Any]:
    """The torch function of ``op``: its JAX signature without ``config``."""
    library_op = getattr(torch.ops.asickernels, op.name)
    signature = op.__signature__.replace(
        parameters=[p for p in op.__signature__.parameters.values() if p.name != "config"]
    )
    positional = op.array_names  # custom ops take tensors positionally, the rest by keyword
    array_names = set(op.array_names)

    def function(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        like = next(v for v in values.values() if isinstance(v, torch.Tensor))
        for name in array_names:
            value = values[name]
            if value is not None and not isinstance(value, torch.Tensor):
                values[name] = torch.as_tensor(value, device=like.device)
        keyword = {n: v for n, v in values.items() if n not in positional}
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
