"""What ``asickernels estimate`` compiles: the seed-equivalent kernels, our Pallas kernels at
the seeds' workloads, and the block-size sweeps.

Every builder returns ``(function, [(shape, dtype), ...])`` for
:func:`asickernels.simulate.tpu_estimate.estimate.compile_with_dumps`, which calls it in a subprocess.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from asickernels.simulate.tpu_estimate import seed_kernels as seeds
from asickernels.simulate.tpu_estimate.estimate import Case

Built = tuple[Callable[..., Any], list[tuple[tuple[int, ...], Any]]]

_HERE = __name__
_SEEDS = seeds.__name__


def _case(
    name: str,
    builder: str,
    kwargs: dict[str, Any],
    loop_trips: Mapping[str, tuple[tuple[int, Any], ...]] | None = None,
) -> Case:
    return Case(
        name, builder, tuple(sorted(kwargs.items())), tuple(sorted((loop_trips or {}).items()))
    )


SEED_NMS_PALLAS = _case("seed NMS, Pallas", f"{_SEEDS}:nms_case", {"variant": "pallas"})
SEED_NMS_JAX = _case("seed NMS, jitted JAX", f"{_SEEDS}:nms_case", {"variant": "jax"})
SEED_MATMUL_BF16 = _case("seed matmul bf16 8192^3", f"{_SEEDS}:matmul_case", {"dtype": "bfloat16"})
SEED_MATMUL_INT8 = _case("seed matmul int8 8192^3", f"{_SEEDS}:matmul_case", {"dtype": "int8"})
SEED_CASES = (SEED_NMS_PALLAS, SEED_NMS_JAX, SEED_MATMUL_BF16, SEED_MATMUL_INT8)


def seed_int8_matmul_case(size: int) -> Case:
    """The seed's int8 Pallas matmul (blocks 512x1024x1024) at ``size``^3."""
    if size == seeds.SEED_MATMUL_SIZE:
        return SEED_MATMUL_INT8
    return _case(
        f"seed matmul int8 {size}^3", f"{_SEEDS}:matmul_case", {"dtype": "int8", "size": size}
    )


GIOU_PAIRS = 1024 * 256  # the seeds' GIOU workload
INT8_MATMUL_SWEEP = (  # (block_m, block_n, block_k)
    (256, 512, 1024),
    (512, 512, 1024),
    (512, 1024, 1024),
    (1024, 1024, 1024),
    (512, 1024, 2048),
    (1024, 1024, 2048),
    (1024, 2048, 1024),
    (1024, 2048, 2048),
)
INT8_MATMUL_SWEEP_SIZES = (seeds.SEED_MATMUL_SIZE, 2048)
NMS_TILE_SWEEP = (128, 256, 512, 1024)


# -- our kernels ----------------------------------------------------------------------------


def int8_matmul_builder(
    m: int, k: int, n: int, block_m: int = 0, block_n: int = 0, block_k: int = 0
) -> Built:
    """Our int8 matmul (``backend="pallas_tpu"``), with the generation's table blocks or,
    when ``block_m`` is given, these."""
    import asickernels
    from asickernels.backends.pallas_tpu import tuning

    config = tuning.Int8MatmulConfig(block_m, block_n, block_k) if block_m else None

    def function(x: Any, y: Any) -> Any:
        return asickernels.int8_matmul(x, y, backend="pallas_tpu", config=config)

    return function, [((m, k), "int8"), ((k, n), "int8")]


def nms_builder(n: int, max_output_size: int, iou_threshold: float, tile: int) -> Built:
    """Our NMS (``backend="pallas_tpu"``) on one image of ``n`` boxes with this tile."""
    import asickernels
    from asickernels.backends.pallas_tpu import tuning

    config = tuning.NmsConfig(tile)

    def function(boxes: Any, scores: Any) -> Any:
        return asickernels.nms(
            boxes,
            scores,
            iou_threshold=iou_threshold,
            max_output_size=max_output_size,
            backend="pallas_tpu",
            config=config,
        )

    return function, [((n, 4), "float32"), ((n,), "float32")]


def giou_builder(pairs: int, backend: str, gradient: bool) -> Built:
    """GIOU on ``pairs`` float32 box pairs on ``backend``: forward, or the gradient of its
    sum with respect to both box arrays (Pallas: the backward kernel)."""
    import jax

    import asickernels

    def forward(a: Any, b: Any) -> Any:
        return asickernels.giou(a, b, backend=backend)

    def function(a: Any, b: Any) -> Any:
        if gradient:
            return jax.grad(lambda x, y: forward(x, y).sum(), argnums=(0, 1))(a, b)
        return forward(a, b)

    return function, [((pairs, 4), "float32")] * 2


def stream_builder(rows: int, cols: int, block_rows: int) -> Built:
    """A trivial memory-bound Pallas kernel (``x * 2 + 1`` over row blocks): the estimate
    must come out near its bytes over the HBM bandwidth. A fixture for the tests."""
    import jax
    from jax.experimental import pallas as pl

    def kernel(x_ref: Any, out_ref: Any) -> None:
        out_ref[...] = x_ref[...] * 2.0 + 1.0

    def function(x: Any) -> Any:
        block = pl.BlockSpec((block_rows, cols), lambda i: (i, 0))
        return pl.pallas_call(
            kernel,
            grid=(rows // block_rows,),
            in_specs=[block],
            out_specs=block,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            interpret=False,
        )(x)

    return function, [((rows, cols), "float32")]


def stream_case(rows: int = 1024, cols: int = 512, block_rows: int = 256) -> Case:
    workload = {"rows": rows, "cols": cols, "block_rows": block_rows}
    return _case(f"stream {rows}x{cols} f32", f"{_HERE}:stream_builder", workload)


# Loop numbers (preorder in the kernel's schedule) of the tiled NMS kernel's loops whose
# exit the walk cannot compute: #0 over tiles, #1 over the earlier tiles (t trips for tile t;
# its bound is carried through the data-dependent loop), #2 the fixed-point passes. The
# one-hot gather's loop over column chunks has a static trip count, so the walk counts it;
# when it has more than one trip it is a loop of its own, numbered before the cross loop.
NMS_PROGRAM = "nms_tiled"


def nms_schedule_trips(trips: Any, gather_loop: bool) -> tuple[tuple[int, Any], ...]:
    """:class:`~asickernels.backends.pallas_tpu.nms.LoopTrips` -> the walk's
    ``(loop number, trips)`` pairs for the kernel's program."""
    shift = 1 if gather_loop else 0
    return (
        (0, trips.tiles),
        (1 + shift, trips.cross[1:] or (1,)),  # entered for tiles 1, 2, ...
        (2 + shift, trips.passes),
    )


@functools.cache
def nms_case(
    tile: int, n: int = seeds.SEED_NMS_BOXES, max_output_size: int = seeds.SEED_NMS_OUTPUTS
) -> Case:
    """Our NMS at the seed's workload (random boxes as the seed draws them), with the loop
    trips that data produces."""
    from asickernels.backends.pallas_tpu import nms

    boxes, scores = seeds.seed_nms_inputs(n)
    kernel_trips = nms.loop_trips(
        boxes,
        scores,
        tile=tile,
        iou_threshold=seeds.SEED_NMS_IOU_THRESHOLD,
        max_output_size=max_output_size,
    )
    padded = -(-n // tile) * tile
    gather_loop = padded // nms.gather_chunk(padded, tile) > 1
    trips = {NMS_PROGRAM: nms_schedule_trips(kernel_trips, gather_loop)}
    workload = {
        "n": n,
        "max_output_size": max_output_size,
        "iou_threshold": seeds.SEED_NMS_IOU_THRESHOLD,
        "tile": tile,
    }
    return _case(
        f"NMS N={n} out={max_output_size} tile={tile}", f"{_HERE}:nms_builder", workload, trips
    )


def int8_matmul_case(
    blocks: tuple[int, int, int] | None = None, size: int = seeds.SEED_MATMUL_SIZE
) -> Case:
    """Our int8 matmul at ``size``^3, table blocks or ``(block_m, block_n, block_k)``."""
    named = "table blocks" if blocks is None else "blocks {}x{}x{}".format(*blocks)
    shape: dict[str, Any] = {"m": size, "k": size, "n": size}
    if blocks is not None:
        shape.update(zip(("block_m", "block_n", "block_k"), blocks, strict=True))
    return _case(f"int8 matmul {size}^3 {named}", f"{_HERE}:int8_matmul_builder", shape)


# Ours and plain XLA side by side: on TPU v5e the seed found jitted JAX slightly faster
# than its Pallas GIOU; `backend=None` picks Pallas on TPUs, so this should say otherwise.
GIOU_CASES = tuple(
    _case(
        f"GIOU {GIOU_PAIRS} pairs f32 {'gradient' if gradient else 'forward'}, {backend}",
        f"{_HERE}:giou_builder",
        {"pairs": GIOU_PAIRS, "backend": backend, "gradient": gradient},
    )
    for gradient in (False, True)
    for backend in ("pallas_tpu", "xla")
)


def table_nms_tile(generation: str) -> int:
    """The NMS tile of the per-generation table in ``backends/pallas_tpu/tuning.py``."""
    from asickernels.backends.pallas_tpu import tuning

    return tuning.NMS_CONFIGS.get(generation, tuning.NmsConfig()).tile
