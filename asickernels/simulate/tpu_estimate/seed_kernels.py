"""Kernels built the way the seed articles built theirs, to calibrate the schedule estimate.

The seeds report the only TPU timings we have (TPU v5e): a Pallas NMS over 1024 boxes with
128 outputs (0.139 ms) and the same algorithm as a jitted JAX function (0.416 ms), and an int8
Pallas matmul at 8192^3 that ran 71% faster than the bf16 one. These functions reproduce
those designs (written here, not copied) so :mod:`.estimate` can compile
them with the real TPU compiler and compare its estimate with the seeds' figures:

* NMS: an ``N x N`` "IoU above threshold" mask and a copy without the diagonal, both held
  whole in VMEM; one grid step per output; the arg-max is a plain max over scores that carry
  their box index in the low digits (exact while ``N**2 < 2**24``).
* Matmul: the Pallas tutorial's blocked matmul (grid ``(M/bm, N/bn, K/bk)``, K last and
  sequential, an accumulator in VMEM scratch), in bf16 with an f32 accumulator or in int8
  with an int32 accumulator.

They are calibration fixtures, not library kernels: they keep the seeds' restrictions (sizes
divisible by the blocks, no padding, the seed NMS output convention) on purpose.

Each ``*_case`` function returns ``(function, argument shapes)`` for
:func:`.estimate.compile_with_dumps`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

ArgShapes = list[tuple[tuple[int, ...], str]]

# The seeds' figures, measured by their author on TPU v5e (milliseconds per call).
SEED_NMS_PALLAS_MS = 0.139
SEED_NMS_JAX_MS = 0.416
SEED_INT8_OVER_BF16_SPEEDUP = 1.71  # "int8 ... 71% faster" than bf16, same blocks, 8192^3
SEED_NMS_BOXES = 1024
SEED_NMS_OUTPUTS = 128
SEED_NMS_IOU_THRESHOLD = 0.1
SEED_MATMUL_SIZE = 8192
SEED_MATMUL_BLOCKS = (512, 1024, 1024)  # (bm, bk, bn)


def _overlap_masks(boxes: jax.Array, iou_threshold: float) -> tuple[jax.Array, jax.Array]:
    """``[N, 4]`` boxes -> (``iou > threshold`` as int32 ``[N, N]``, the same without its
    diagonal). Both NMS variants below start from these two masks."""
    x1, y1, x2, y2 = (boxes[:, c].astype(jnp.float32) for c in range(4))
    area = (x2 - x1) * (y2 - y1)
    width = jnp.maximum(jnp.minimum(x2[:, None], x2[None, :]) - jnp.maximum(x1[:, None], x1), 0)
    height = jnp.maximum(jnp.minimum(y2[:, None], y2[None, :]) - jnp.maximum(y1[:, None], y1), 0)
    inter = width * height
    iou = inter / jnp.maximum(area[:, None] + area[None, :] - inter, 1e-5)
    overlaps = (iou > iou_threshold).astype(jnp.int32)
    off_diagonal = 1 - jnp.eye(boxes.shape[0], dtype=jnp.int32)
    return overlaps, overlaps * off_diagonal


def nms_jax(boxes: jax.Array, scores: jax.Array, *, max_output_size: int) -> jax.Array:
    """The seed's jitted-JAX NMS design: ``[N, 4]``, ``[N]`` -> ``[N]`` float32 scores,
    zeroed for suppressed boxes (the seed's output convention)."""
    overlaps, others = _overlap_masks(boxes, SEED_NMS_IOU_THRESHOLD)
    shifted = scores - jnp.min(scores) + 1e-5  # every live score > 0

    def select(_: Any, state: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        remaining, kept = state
        best = jnp.argmax(remaining)
        live = remaining[best] > 0
        remaining = jnp.where((overlaps[best] > 0) & live, 0.0, remaining)
        kept = jnp.where((others[best] > 0) & live, 0.0, kept)
        return remaining, kept

    _, kept = jax.lax.fori_loop(0, max_output_size, select, (shifted, shifted))
    return kept


def _nms_step_kernel(
    keys_ref: Any,
    overlaps_ref: Any,
    others_ref: Any,
    out_ref: Any,
    kept_ref: Any,
    remaining_ref: Any,
    *,
    n_boxes: int,
) -> None:
    """One greedy selection per grid step; state lives in VMEM scratch across steps."""
    from asickernels.pallas_home import pl

    step = pl.program_id(0)

    @pl.when(step == 0)
    def _start() -> None:
        kept_ref[...] = keys_ref[...]
        remaining_ref[...] = keys_ref[...]

    remaining = remaining_ref[...]
    # Keys are rank * N + index, so the largest key names the best box (no argmax needed).
    best = jnp.max(remaining).astype(jnp.int32) % n_boxes
    live = jnp.max(remaining) > 0
    hit = overlaps_ref[pl.ds(best, 1), :] > 0
    remaining_ref[...] = jnp.where(hit & live, 0.0, remaining)
    hit_others = others_ref[pl.ds(best, 1), :] > 0
    kept_ref[...] = jnp.where(hit_others & live, 0.0, kept_ref[...])

    @pl.when(step == pl.num_programs(0) - 1)
    def _finish() -> None:
        out_ref[...] = kept_ref[...]


def nms_pallas(
    boxes: jax.Array, scores: jax.Array, *, max_output_size: int, interpret: bool = False
) -> jax.Array:
    """The seed's Pallas NMS design: masks and rank keys in XLA, then ``max_output_size``
    grid steps of one selection each. ``[N, 4]``, ``[N]`` -> ``[1, N]`` float32 keys, zeroed
    for suppressed boxes."""
    from asickernels.pallas_home import pl, pltpu

    n_boxes = scores.shape[0]
    overlaps, others = _overlap_masks(boxes, SEED_NMS_IOU_THRESHOLD)
    order = jnp.argsort(-scores)
    ranks = jnp.arange(n_boxes - 1, -1, -1, dtype=jnp.int32) * n_boxes + order
    keys = jnp.zeros(n_boxes, jnp.float32).at[order].set(ranks.astype(jnp.float32))[None, :]
    whole = functools.partial(pl.BlockSpec, index_map=lambda step: (0, 0))
    return pl.pallas_call(
        functools.partial(_nms_step_kernel, n_boxes=n_boxes),
        grid=(max_output_size,),
        in_specs=[whole((1, n_boxes)), whole((n_boxes, n_boxes)), whole((n_boxes, n_boxes))],
        out_specs=whole((1, n_boxes)),
        out_shape=jax.ShapeDtypeStruct((1, n_boxes), jnp.float32),
        scratch_shapes=[pltpu.VMEM((1, n_boxes), jnp.float32)] * 2,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
        interpret=interpret,
    )(keys, overlaps, others)


def _matmul_block_kernel(x_ref: Any, y_ref: Any, out_ref: Any, acc_ref: Any) -> None:
    from asickernels.pallas_home import pl

    k = pl.program_id(2)

    @pl.when(k == 0)
    def _zero() -> None:
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=acc_ref.dtype)

    @pl.when(k == pl.num_programs(2) - 1)
    def _store() -> None:
        out_ref[...] = acc_ref[...].astype(out_ref.dtype)


def matmul_pallas(
    x: jax.Array, y: jax.Array, *, bm: int, bk: int, bn: int, interpret: bool = False
) -> jax.Array:
    """The Pallas tutorial's blocked matmul as the seed ran it: bf16 -> bf16 (f32
    accumulator) or int8 -> int32 (int32 accumulator). Sizes must divide by the blocks."""
    from asickernels.pallas_home import pl, pltpu

    (m, k), n = x.shape, y.shape[1]
    integer = x.dtype == jnp.int8
    acc_dtype = jnp.int32 if integer else jnp.float32
    out_dtype = jnp.int32 if integer else x.dtype
    return pl.pallas_call(
        _matmul_block_kernel,
        grid=(m // bm, n // bn, k // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, s: (i, s)),
            pl.BlockSpec((bk, bn), lambda i, j, s: (s, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, s: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), acc_dtype)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")
        ),
        interpret=interpret,
    )(x, y)


def nms_case(
    variant: str, n_boxes: int = SEED_NMS_BOXES, max_output_size: int = SEED_NMS_OUTPUTS
) -> tuple[Callable[..., Any], ArgShapes]:
    """``variant`` ``"pallas"`` or ``"jax"``: the function and its ``[N, 4]``, ``[N]`` inputs."""
    functions = {"pallas": nms_pallas, "jax": nms_jax}
    if variant not in functions:
        raise ValueError(f"variant must be one of {sorted(functions)}, got {variant!r}")
    function = functools.partial(functions[variant], max_output_size=max_output_size)
    return function, [((n_boxes, 4), "float32"), ((n_boxes,), "float32")]


def matmul_case(
    dtype: str, size: int = SEED_MATMUL_SIZE, blocks: tuple[int, int, int] = SEED_MATMUL_BLOCKS
) -> tuple[Callable[..., Any], ArgShapes]:
    """The seed matmul at ``size``^3 in ``dtype`` (``"bfloat16"`` or ``"int8"``)."""
    if dtype not in ("bfloat16", "int8"):
        raise ValueError(f"dtype must be 'bfloat16' or 'int8', got {dtype!r}")
    bm, bk, bn = blocks
    if size % bm or size % bk or size % bn:
        raise ValueError(f"size {size} must divide by the blocks {blocks} (a seed restriction)")
    function = functools.partial(matmul_pallas, bm=bm, bk=bk, bn=bn)
    return function, [((size, size), dtype), ((size, size), dtype)]


def seed_nms_inputs(n_boxes: int = SEED_NMS_BOXES, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random boxes and scores like the seed's benchmark (integer corners in a 1024 image)."""
    rng = np.random.default_rng(seed)
    top_left = rng.integers(0, 1023, size=(n_boxes, 2))
    bottom_right = np.clip(top_left + rng.integers(1, 1024, size=(n_boxes, 2)), 0, 1023)
    boxes = np.concatenate([top_left, bottom_right], axis=1).astype(np.float32)
    return boxes, rng.uniform(size=n_boxes).astype(np.float32)
