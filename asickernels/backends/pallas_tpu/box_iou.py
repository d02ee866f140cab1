"""Pairwise IoU/GIOU and paired DIoU/CIoU Pallas kernels.

Pairwise (``[B, N, 4]`` x ``[B, M, 4]`` -> ``[B, N, M]``): the grid walks ``(B, N / block_n,
M / block_m)`` output tiles, all independent ("parallel"). A tile holds ``block_n`` boxes of
``boxes1`` on sublanes (a ``[block_n, 4]`` block whose columns are ``[block_n, 1]``
coordinate vectors) against ``block_m`` boxes of ``boxes2`` on the 128 lanes (coordinate
planes ``[4, block_m]``), so every vector op of the body is a full ``[block_n, block_m]``
tile. N and M are zero-padded to whole tiles. Gradients of the pairwise ops are XLA's (the
``custom_vjp`` differentiates :func:`asickernels.backends.xla.box_iou.pairwise`).

Paired (``[P, 4]`` x2 -> ``[P]``): boxes become coordinate planes ``[4, R, 128]`` (boxes on
lanes), zero-padded to whole blocks of ``block_rows`` x 128 (GIOU's block table); the
backward kernel differentiates the same body inside the kernel, with CIoU's ``alpha`` held
constant.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from asickernels.backends.pallas_tpu import BACKEND, lowering
from asickernels.backends.pallas_tpu.giou import GiouConfig
from asickernels.backends.xla import box_iou as xla_box_iou
from asickernels.backends.xla.box_iou import metric_from_planes
from asickernels.kernels import public as ops
from asickernels.pallas_home import pl

LANES = 128
SUBLANES = 8


@dataclasses.dataclass(frozen=True)
class PairwiseConfig:
    """Pairwise output tiles of ``block_n`` (a multiple of 8) x ``block_m`` (a multiple of
    128) pairs."""

    block_n: int = 128
    block_m: int = 512

    def __post_init__(self) -> None:
        if self.block_n <= 0 or self.block_n % SUBLANES:
            raise ValueError(f"block_n must be a positive multiple of 8, got {self.block_n}")
        if self.block_m <= 0 or self.block_m % LANES:
            raise ValueError(f"block_m must be a positive multiple of 128, got {self.block_m}")


# Pairwise -----------------------------------------------------------------------------------


def _pairwise_kernel(metric: str, b1_ref: Any, b2_ref: Any, out_ref: Any) -> None:
    # b1_ref: [block_n, 4]; b2_ref: [4, block_m]; out_ref: [block_n, block_m] float32.
    rows = [b1_ref[:, i : i + 1] for i in range(4)]
    columns = [b2_ref[i : i + 1, :] for i in range(4)]
    out_ref[...] = metric_from_planes(metric, *rows, *columns)


def _round_up(value: int, multiple: int) -> int:
    return pl.cdiv(value, multiple) * multiple


def _pairwise_vmem_bytes(block_n: int, block_m: int) -> int:
    # Double-buffered blocks: boxes1 lane-padded to 128, boxes2 sublane-padded to 8, output.
    return 2 * 4 * (block_n * LANES + SUBLANES * block_m + block_n * block_m)


def _pairwise_forward(
    metric: str, config: PairwiseConfig, target: lowering.Target
) -> Callable[[jax.Array, jax.Array], jax.Array]:
    def forward(boxes1: jax.Array, boxes2: jax.Array) -> jax.Array:
        batch, n, m = boxes1.shape[0], boxes1.shape[1], boxes2.shape[1]
        block_n = min(config.block_n, _round_up(n, SUBLANES))
        block_m = min(config.block_m, _round_up(m, LANES))
        rows, columns = _round_up(n, block_n), _round_up(m, block_m)
        b1 = jnp.pad(boxes1, ((0, 0), (0, rows - n), (0, 0)))
        b2 = jnp.pad(jnp.swapaxes(boxes2, 1, 2), ((0, 0), (0, 0), (0, columns - m)))
        call = pl.pallas_call(
            functools.partial(_pairwise_kernel, metric),
            out_shape=jax.ShapeDtypeStruct((batch, rows, columns), jnp.float32),
            grid=(batch, rows // block_n, columns // block_m),
            in_specs=[
                pl.BlockSpec((None, block_n, 4), lambda b, i, j: (b, i, 0)),
                pl.BlockSpec((None, 4, block_m), lambda b, i, j: (b, 0, j)),
            ],
            out_specs=pl.BlockSpec((None, block_n, block_m), lambda b, i, j: (b, i, j)),
            compiler_params=lowering.compiler_params(
                ("parallel", "parallel", "parallel"),
                _pairwise_vmem_bytes(block_n, block_m),
                target.generation,
            ),
            interpret=target.interpret,
            name=f"{metric}_pairwise",
        )
        return call(b1, b2)[:, :n, :m]

    return forward


def _run_pairwise(
    metric: str,
    boxes1: jax.Array,
    boxes2: jax.Array,
    *,
    config: PairwiseConfig | None = None,
    mode: lowering.InterpretMode = None,
) -> jax.Array:
    """``[B, N, 4]`` x ``[B, M, 4]`` (any float dtype; computed in float32) -> ``[B, N, M]``
    float32."""
    boxes1, boxes2 = boxes1.astype(jnp.float32), boxes2.astype(jnp.float32)
    return _box_kernel(True, metric, boxes1, boxes2, config or PairwiseConfig(), mode)


box_iou = BACKEND.implements(ops.box_iou, config=PairwiseConfig)(
    functools.partial(_run_pairwise, "iou")
)
generalized_box_iou = BACKEND.implements(ops.generalized_box_iou, config=PairwiseConfig)(
    functools.partial(_run_pairwise, "giou")
)


# Paired -------------------------------------------------------------------------------------


def _paired_forward_kernel(metric: str, b1_ref: Any, b2_ref: Any, out_ref: Any) -> None:
    # b*_ref: [4, block_rows, 128] input dtype; out_ref: [block_rows, 128] float32.
    coords = [ref[i].astype(jnp.float32) for ref in (b1_ref, b2_ref) for i in range(4)]
    out_ref[...] = metric_from_planes(metric, *coords)


def _paired_backward_kernel(
    metric: str, b1_ref: Any, b2_ref: Any, g_ref: Any, d1_ref: Any, d2_ref: Any
) -> None:
    coords = [ref[i].astype(jnp.float32) for ref in (b1_ref, b2_ref) for i in range(4)]
    _, pullback = jax.vjp(functools.partial(metric_from_planes, metric), *coords)
    grads = pullback(g_ref[...])
    for i in range(4):
        d1_ref[i] = grads[i]
        d2_ref[i] = grads[4 + i]


def _paired_layout(count: int, dtype: Any, block_rows: int) -> tuple[int, int]:
    """(block rows, padded rows) for ``count`` pairs: whole blocks of ``block_rows`` x 128,
    shrunk to the native sublane tiling of ``dtype`` (16 rows for bfloat16) for small P."""
    sublanes = SUBLANES if dtype == jnp.float32 else 2 * SUBLANES
    rows_needed = pl.cdiv(count, LANES)
    block = min(block_rows, _round_up(rows_needed, sublanes))
    return block, _round_up(rows_needed, block)


def _to_planes(boxes: jax.Array, rows: int) -> jax.Array:
    padded = jnp.pad(boxes.T, ((0, 0), (0, rows * LANES - boxes.shape[0])))
    return padded.reshape(4, rows, LANES)


def _paired_vmem_bytes(block_rows: int, itemsize: int, backward: bool) -> int:
    plane_block = 4 * block_rows * LANES
    row_block = block_rows * LANES * 4
    if backward:  # 2 planes in + g in, 2 gradient planes out (float32), double-buffered
        return 2 * (2 * plane_block * itemsize + row_block + 2 * plane_block * 4)
    return 2 * (2 * plane_block * itemsize + row_block)


def _paired_call(
    metric: str, config: GiouConfig | None, backward: bool, target: lowering.Target
) -> Callable[..., Any]:
    """The forward (``boxes1, boxes2 -> [P]``) or backward (``boxes1, boxes2, g -> (d1,
    d2)``) kernel of ``metric`` on GIOU's layout and block table."""
    cfg = config or GiouConfig()

    def call(boxes1: jax.Array, boxes2: jax.Array, *g: jax.Array) -> Any:
        count = boxes1.shape[0]
        block_rows, rows = _paired_layout(count, boxes1.dtype, cfg.block_rows)
        planes_spec = pl.BlockSpec((4, block_rows, LANES), lambda i: (0, i, 0))
        rows_spec = pl.BlockSpec((block_rows, LANES), lambda i: (i, 0))
        grad_shape = jax.ShapeDtypeStruct((4, rows, LANES), jnp.float32)
        kernel = _paired_backward_kernel if backward else _paired_forward_kernel
        pallas = pl.pallas_call(
            functools.partial(kernel, metric),
            out_shape=(grad_shape, grad_shape)
            if backward
            else jax.ShapeDtypeStruct((rows, LANES), jnp.float32),
            grid=(rows // block_rows,),
            in_specs=[planes_spec, planes_spec] + ([rows_spec] if backward else []),
            out_specs=(planes_spec, planes_spec) if backward else rows_spec,
            compiler_params=lowering.compiler_params(
                ("parallel",),
                _paired_vmem_bytes(block_rows, boxes1.dtype.itemsize, backward),
                target.generation,
            ),
            interpret=target.interpret,
            name=f"{metric}_{'backward' if backward else 'forward'}",
        )
        planes = [_to_planes(boxes1, rows), _to_planes(boxes2, rows)]
        if not backward:
            return pallas(*planes).reshape(-1)[:count]
        g_rows = jnp.pad(g[0].astype(jnp.float32), (0, rows * LANES - count)).reshape(rows, LANES)
        d1, d2 = pallas(*planes, g_rows)
        return tuple(
            d.reshape(4, -1)[:, :count].T.astype(b.dtype) for d, b in ((d1, boxes1), (d2, boxes2))
        )

    return call


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 4, 5))
def _box_kernel(
    pairwise: bool,
    metric: str,
    boxes1: jax.Array,
    boxes2: jax.Array,
    config: Any,
    mode: lowering.InterpretMode,
) -> jax.Array:
    """The pairwise or paired forward kernel, with its gradient."""
    if pairwise:
        build = lowering.Build(_pairwise_forward, (metric, config))
    else:
        build = lowering.Build(_paired_call, (metric, config, False))
    return lowering.run(build, mode, boxes1, boxes2)  # type: ignore[no-any-return]


def _box_kernel_fwd(
    pairwise: bool,
    metric: str,
    boxes1: jax.Array,
    boxes2: jax.Array,
    config: Any,
    mode: lowering.InterpretMode,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return _box_kernel(pairwise, metric, boxes1, boxes2, config, mode), (boxes1, boxes2)


def _box_kernel_bwd(
    pairwise: bool,
    metric: str,
    config: Any,
    mode: lowering.InterpretMode,
    residuals: tuple[jax.Array, jax.Array],
    g: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    if pairwise:  # XLA's gradient (module docstring)
        _, pullback = jax.vjp(functools.partial(xla_box_iou.pairwise, metric), *residuals)
        return pullback(g)  # type: ignore[no-any-return]
    build = lowering.Build(_paired_call, (metric, config, True))
    return lowering.run(build, mode, *residuals, g)  # type: ignore[no-any-return]


_box_kernel.defvjp(_box_kernel_fwd, _box_kernel_bwd)


def _run_paired(
    metric: str,
    boxes1: jax.Array,
    boxes2: jax.Array,
    *,
    config: GiouConfig | None = None,
    mode: lowering.InterpretMode = None,
) -> jax.Array:
    """``[P, 4]`` x2 (float32 or bfloat16; others are cast to float32) -> ``[P]`` float32."""
    if boxes1.dtype not in (jnp.float32, jnp.bfloat16) or boxes1.dtype != boxes2.dtype:
        boxes1, boxes2 = boxes1.astype(jnp.float32), boxes2.astype(jnp.float32)
    return _box_kernel(False, metric, boxes1, boxes2, config, mode)


diou = BACKEND.implements(ops.diou, config=GiouConfig, vjp=ops.diou_vjp)(
    functools.partial(_run_paired, "diou")
)
ciou = BACKEND.implements(ops.ciou, config=GiouConfig, vjp=ops.ciou_vjp)(
    functools.partial(_run_paired, "ciou")
)
