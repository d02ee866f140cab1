"""Kernels of the ``torch.ops.asickernels`` operators for torch_xla tensors (device "xla").

The public JAX op is handed to ``torch_xla.core.xla_builder.call_jax``, which traces it to
HLO once per shape and static arguments and splices it into the lazy torch_xla graph: on a
TPU the Pallas kernels are compiled by Mosaic as part of the torch_xla program; on CPU
PJRT the same path runs them simulated (Pallas interpret mode). On Neuron devices
(torch-neuronx) the NKI and GpSimd kernels run instead; they take host arrays (and move
them to the NeuronCore themselves), as does any host backend asked for by name. torch_xla
is imported only when an XLA tensor reaches one of these kernels.
"""

from __future__ import annotations

from typing import Any

import jax
import torch

import asickernels
from asickernels.kernels import registry
from asickernels.torch import ops

# Where no TPU compiles them, the TPU kernels run in Pallas interpret mode on the XLA CPU
# device, so a CPU run of a torch_xla program checks the very kernels a TPU run uses.
SIMULATED_BACKEND = "pallas_tpu"
# The kernel an op runs, where the op's name is not the kernel's.
_KERNEL_OF = {"giou_vjp": "giou", "giou_loss": "giou", "batched_nms": "nms"}


# On Neuron devices (torch-neuronx), the NKI and GpSimd kernels: host-array backends that
# move their inputs to the NeuronCore themselves. Per op the faster one on inf2 in the seed
# measurements (GpSimd GIOU 0.061 ms vs NKI 0.211 ms), NKI where only NKI has the kernel.
NEURON_BACKENDS = {
    "giou": "gpsimd",
    "giou_loss": "gpsimd",
    "giou_vjp": "nki",
    "nms": "gpsimd",
    "batched_nms": "gpsimd",
    "int8_matmul": "nki",
}


def default_backend(op: str) -> str | None:
    """The backend for ``op`` on this process's XLA devices when the caller gives none."""
    import torch_xla.runtime as xr

    kind = xr.device_type()
    if kind == "NEURON":
        return NEURON_BACKENDS[op]
    if kind == "CPU" and SIMULATED_BACKEND in registry.backends_for(_KERNEL_OF.get(op, op)):
        return SIMULATED_BACKEND
    return None  # the registry's choice for the platform JAX sees (Pallas on a TPU)


def call(op: str, *tensors: torch.Tensor | None, **kwargs: Any) -> Any:
    """``asickernels.<op>`` on XLA tensors: through ``call_jax`` into the torch_xla graph, or
    for the Neuron kernels (host-array backends) through host arrays."""
    import torch_xla.runtime as xr
    from torch_xla.core import xla_builder

    if "backend" in kwargs and kwargs["backend"] is None:
        kwargs["backend"] = default_backend(op)
    # float64 is computed in float32 on devices (as the JAX API does) but keeps the dtype
    # that the fake implementation promises.
    wide = any(t is not None and t.dtype == torch.float64 for t in tensors)
    if wide:
        tensors = tuple(None if t is None else t.to(torch.float32) for t in tensors)
    backend = kwargs.get("backend")
    if xr.device_type() == "NEURON" or (
        backend is not None and registry.backend(backend).array_kind == "numpy"
    ):
        device = next(t.device for t in tensors if t is not None)
        on_host = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        result = ops.run_on_cpu(op, *(None if t is None else t.cpu() for t in tensors), **on_host)
        result = jax.tree.map(lambda r: r.to(device), result)
    else:
        result = xla_builder.call_jax(getattr(asickernels, op), tensors, kwargs)
    if wide and op.startswith("giou"):
        return jax.tree.map(lambda r: r.to(torch.float64), result)
    return result


@ops.giou.register_kernel("xla")
def _giou(boxes1: torch.Tensor, boxes2: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    return call("giou", boxes1, boxes2, backend=backend)


@ops.giou_backward.register_kernel("xla")
def _giou_backward(
    boxes1: torch.Tensor, boxes2: torch.Tensor, grad: torch.Tensor, backend: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    return call("giou_vjp", boxes1, boxes2, grad, backend=backend)


@ops.giou_loss.register_kernel("xla")
def _giou_loss(
    preds: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor | None = None,
    reduction: str = "mean",
    backend: str | None = None,
) -> torch.Tensor:
    return call("giou_loss", preds, targets, mask=mask, reduction=reduction, backend=backend)


@ops.nms.register_kernel("xla")
def _nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return call(
        "nms", boxes, scores, iou_threshold=iou_threshold, max_output_size=max_output_size,
        score_threshold=score_threshold, backend=backend,
    )  # fmt: skip


@ops.batched_nms.register_kernel("xla")
def _batched_nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    idxs: torch.Tensor,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return call(
        "batched_nms", boxes, scores, idxs.to(torch.int32), iou_threshold=iou_threshold,
        max_output_size=max_output_size, score_threshold=score_threshold, backend=backend,
    )  # fmt: skip


@ops.int8_matmul.register_kernel("xla")
def _int8_matmul(
    x: torch.Tensor,
    y: torch.Tensor,
    x_scale: torch.Tensor | None = None,
    y_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    return call(
        "int8_matmul", x, y, x_scale=x_scale, y_scale=y_scale,
        out_dtype=None if out_dtype is None else ops.numpy_dtype(out_dtype), backend=backend,
    )  # fmt: skip


@ops.quantize_int8.register_kernel("xla")
def _quantize_int8(x: torch.Tensor, axis: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return call("quantize_int8", x, axis=axis)
