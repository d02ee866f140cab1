"""GIOU forward and backward Pallas kernels.

Layout: the kernels read boxes ``[P, 4]`` as ``boxes.T``, a ``[4, P]`` view. On a TPU that
view costs nothing: XLA keeps a ``[P, 4]`` float32 array in HBM as tiles of 4 coordinates x
128 boxes (layout ``{0,1:T(4,128)}``), which is byte for byte ``[4, P]`` row-major, so the
transpose is a bitcast and each kernel reads the caller's array directly. Each grid step
takes ``block`` boxes (a multiple of 1024, or all of them), computes on coordinate rows in
chunks of at most :data:`CHUNK` lanes, and writes ``[P]`` (the gradient: ``[4, P]``,
transposed back for free the same way). The grid is "parallel"; the last block may be
partial (Pallas masks its writes).

The backward kernel differentiates the same elementwise body (``jax.vjp`` inside the
kernel), so forward and gradient can never disagree on the formula.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from asickernels.backends.pallas_tpu import BACKEND, lowering
from asickernels.backends.xla.giou import giou_from_planes
from asickernels.kernels import public as ops
from asickernels.pallas_home import pl

LANES = 128
CHUNK = 4096  # lanes computed at a time: keeps the temporaries small


@dataclasses.dataclass(frozen=True)
class GiouConfig:
    """GIOU kernels (and the paired DIoU/CIoU ones): each grid step handles ``block_rows``
    x 128 box pairs."""

    block_rows: int = 256

    def __post_init__(self) -> None:
        if self.block_rows <= 0 or self.block_rows % 16:
            raise ValueError(f"block_rows must be a positive multiple of 16, got {self.block_rows}")


def _chunks(block: int) -> tuple[int, int]:
    """(chunk lanes, chunks per block)."""
    chunk = CHUNK if block % CHUNK == 0 else block
    return chunk, block // chunk


def _forward_kernel(b1_ref: Any, b2_ref: Any, out_ref: Any) -> None:
    # b*_ref: [4, block] input dtype; out_ref: [block] float32.
    chunk, count = _chunks(out_ref.shape[0])

    def step(c: jax.Array, carry: None) -> None:
        lanes = pl.ds(pl.multiple_of(c * chunk, chunk), chunk)
        coords = [
            ref[i : i + 1, lanes].astype(jnp.float32) for ref in (b1_ref, b2_ref) for i in range(4)
        ]
        out_ref[lanes] = giou_from_planes(*coords).reshape(chunk)

    lax.fori_loop(0, count, step, None)


def _backward_kernel(b1_ref: Any, b2_ref: Any, g_ref: Any, d1_ref: Any, d2_ref: Any) -> None:
    # g_ref: [block] float32; d*_ref: [4, block] float32 gradients of the boxes.
    chunk, count = _chunks(g_ref.shape[0])

    def step(c: jax.Array, carry: None) -> None:
        lanes = pl.ds(pl.multiple_of(c * chunk, chunk), chunk)
        coords = [
            ref[i : i + 1, lanes].astype(jnp.float32) for ref in (b1_ref, b2_ref) for i in range(4)
        ]
        _, pullback = jax.vjp(giou_from_planes, *coords)
        grads = pullback(g_ref[lanes].reshape(1, chunk))
        for i in range(4):
            d1_ref[i : i + 1, lanes] = grads[i]
            d2_ref[i : i + 1, lanes] = grads[4 + i]

    lax.fori_loop(0, count, step, None)


def _block(count: int, config: GiouConfig) -> int:
    """Boxes per grid step: ``block_rows`` x 128 (a multiple of 1024), or all of them."""
    block = config.block_rows * LANES
    return count if count <= block else block


def _compiler_params(block: int, itemsize: int, target: lowering.Target, *, backward: bool) -> Any:
    """Mosaic parameters of the forward or backward kernel's 1-D grid of ``block`` boxes a
    step, sized by the VMEM its blocks and temporaries take."""
    boxes = 8 * block * max(itemsize, 4)  # [4, block] pads to 8 sublanes
    row = 8 * block * 4 if backward else block * 4
    chunk = _chunks(block)[0]
    temporaries = 64 * 8 * chunk * 4  # coordinate rows and their intermediates
    if backward:  # 2 box blocks + g in, 2 gradient blocks out, all double-buffered
        vmem = 2 * (2 * boxes + row + 2 * 8 * block * 4) + temporaries
    else:
        vmem = 2 * (2 * boxes + row) + temporaries
    return lowering.compiler_params(("parallel",), vmem, target.generation)


def _forward(
    config: GiouConfig | None, target: lowering.Target
) -> Callable[[jax.Array, jax.Array], jax.Array]:
    cfg = config or GiouConfig()

    def forward(boxes1: jax.Array, boxes2: jax.Array) -> jax.Array:
        count = boxes1.shape[0]
        block = _block(count, cfg)
        boxes_spec = pl.BlockSpec((4, block), lambda i: (0, i))
        call = pl.pallas_call(
            _forward_kernel,
            out_shape=jax.ShapeDtypeStruct((count,), jnp.float32),
            grid=(pl.cdiv(count, block),),
            in_specs=[boxes_spec, boxes_spec],
            out_specs=pl.BlockSpec((block,), lambda i: (i,)),
            compiler_params=_compiler_params(block, boxes1.dtype.itemsize, target, backward=False),
            interpret=target.interpret,
            name="giou_forward",
        )
        return call(boxes1.T, boxes2.T)  # type: ignore[no-any-return]

    return forward


def _backward(
    config: GiouConfig | None, target: lowering.Target
) -> Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]:
    cfg = config or GiouConfig()

    def backward(boxes1: jax.Array, boxes2: jax.Array, g: jax.Array) -> tuple[jax.Array, jax.Array]:
        count = boxes1.shape[0]
        block = _block(count, cfg)
        boxes_spec = pl.BlockSpec((4, block), lambda i: (0, i))
        grad_shape = jax.ShapeDtypeStruct((4, count), jnp.float32)
        call = pl.pallas_call(
            _backward_kernel,
            out_shape=(grad_shape, grad_shape),
            grid=(pl.cdiv(count, block),),
            in_specs=[boxes_spec, boxes_spec, pl.BlockSpec((block,), lambda i: (i,))],
            out_specs=(boxes_spec, boxes_spec),
            compiler_params=_compiler_params(block, boxes1.dtype.itemsize, target, backward=True),
            interpret=target.interpret,
            name="giou_backward",
        )
        d1, d2 = call(boxes1.T, boxes2.T, g.astype(jnp.float32))
        return d1.T.astype(boxes1.dtype), d2.T.astype(boxes2.dtype)

    return backward


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _giou(
    boxes1: jax.Array,
    boxes2: jax.Array,
    config: GiouConfig | None,
    mode: lowering.InterpretMode,
) -> jax.Array:
    return lowering.run(lowering.Build(_forward, (config,)), mode, boxes1, boxes2)  # type: ignore[no-any-return]


def _giou_fwd(
    boxes1: jax.Array,
    boxes2: jax.Array,
    config: GiouConfig | None,
    mode: lowering.InterpretMode,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return _giou(boxes1, boxes2, config, mode), (boxes1, boxes2)


def _giou_bwd(
    config: GiouConfig | None,
    mode: lowering.InterpretMode,
    residuals: tuple[jax.Array, jax.Array],
    g: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    boxes1, boxes2 = residuals
    return lowering.run(lowering.Build(_backward, (config,)), mode, boxes1, boxes2, g)  # type: ignore[no-any-return]


_giou.defvjp(_giou_fwd, _giou_bwd)


@BACKEND.implements(ops.giou, config=GiouConfig, vjp=ops.giou_vjp)
def giou(
    boxes1: jax.Array,
    boxes2: jax.Array,
    *,
    config: GiouConfig | None = None,
    mode: lowering.InterpretMode = None,
) -> jax.Array:
    """``[P, 4]`` x2 (float32 or bfloat16; others are cast to float32) -> ``[P]`` float32."""
    if boxes1.dtype not in (jnp.float32, jnp.bfloat16):
        boxes1, boxes2 = boxes1.astype(jnp.float32), boxes2.astype(jnp.float32)
    return _giou(boxes1, boxes2, config, mode)
