"""Our kernels' cases for ``asickernels estimate`` (:mod:`asickernels.estimates.tpu_report`):
our Pallas int8 matmul, GIOU and NMS, and our XLA NMS, at the seeds' workloads and at the
shapes users run, and the block-size sweeps, each with its roofline
:class:`~asickernels.simulate.tpu_estimate.roofline.Work` and, for NMS, the loop trips
its data produces. The cases that are not ours (the seeds', the guide's, plain XLA) are in
:mod:`asickernels.simulate.tpu_estimate.cases`.

Every builder returns ``(function, [(shape, dtype), ...])`` for
:func:`asickernels.simulate.tpu_estimate.estimate.compile_with_dumps`, which calls it in a
subprocess.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from asickernels.kernels.nms import greedy_nms
from asickernels.simulate.tpu_compile import Built
from asickernels.simulate.tpu_estimate import roofline
from asickernels.simulate.tpu_estimate import seed_kernels as seeds
from asickernels.simulate.tpu_estimate.cases import make_case
from asickernels.simulate.tpu_estimate.estimate import EstimateTarget

if TYPE_CHECKING:
    import jax

_HERE = __name__

# The shapes users run are the ops' (``INT8_USER_M``, ``INT8_USER_KN``, ``GIOU_USER_PAIRS``,
# ``NMS_USER_N`` in asickernels/kernels/<op>_cases.py); XLA's W8A8 and bfloat16 dots are
# estimated beside ours at fewer M (each is a compile).
W8A8_AND_BF16_M = (1, 128, 2048)
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


def int8_matmul_builder(
    m: int, k: int, n: int, block_m: int = 0, block_n: int = 0, block_k: int = 0
) -> Built:
    """Our int8 matmul (``backend="pallas_tpu"``), with the generation's table blocks or,
    when ``block_m`` is given, these."""
    import asickernels
    from asickernels.backends.pallas_tpu.int8_matmul import Int8MatmulConfig

    config = Int8MatmulConfig(block_m, block_n, block_k) if block_m else None

    def function(x: jax.Array, y: jax.Array) -> jax.Array:
        return asickernels.int8_matmul(x, y, backend="pallas_tpu", config=config)

    return function, [((m, k), "int8"), ((k, n), "int8")]


def giou_builder(pairs: int, backend: str, gradient: bool) -> Built:
    """GIOU on ``pairs`` float32 box pairs on ``backend``: forward, or the gradient of its
    sum with respect to both box arrays (Pallas: the backward kernel)."""
    import jax

    import asickernels

    def forward(a: jax.Array, b: jax.Array) -> jax.Array:
        return asickernels.giou(a, b, backend=backend)

    def function(a: jax.Array, b: jax.Array) -> jax.Array:
        if gradient:
            return jax.grad(lambda x, y: forward(x, y).sum(), argnums=(0, 1))(a, b)
        return forward(a, b)

    return function, [((pairs, 4), "float32")] * 2


def int8_matmul_case(
    blocks: tuple[int, int, int] | None = None,
    size: int = seeds.SEED_MATMUL_SIZE,
    mkn: tuple[int, int, int] | None = None,
) -> EstimateTarget:
    """Our int8 matmul at ``size``^3 (or ``mkn``), table blocks or ``(block_m, block_n,
    block_k)``."""
    m, k, n = mkn or (size, size, size)
    named = "table blocks" if blocks is None else "blocks {}x{}x{}".format(*blocks)
    shape: dict[str, object] = {"m": m, "k": k, "n": n}
    if blocks is not None:
        shape.update(zip(("block_m", "block_n", "block_k"), blocks, strict=True))
    label = f"{m}x{k}x{n}"
    return make_case(
        f"int8 matmul {label} {named}, pallas_tpu",
        f"{_HERE}:int8_matmul_builder",
        shape,
        op="int8_matmul",
        impl="pallas_tpu",
        shape=label,
        work=roofline.matmul(m, k, n, dtype="int8", out_bytes=4),
    )


def giou_case(pairs: int, backend: str, gradient: bool) -> EstimateTarget:
    """GIOU on ``pairs`` float32 box pairs on ``backend``, forward or gradient."""
    op = "giou_grad" if gradient else "giou"
    return make_case(
        f"GIOU {pairs} pairs f32 {'gradient' if gradient else 'forward'}, {backend}",
        f"{_HERE}:giou_builder",
        {"pairs": pairs, "backend": backend, "gradient": gradient},
        op=op,
        impl=backend,
        shape=f"P={pairs}",
        work=roofline.giou(pairs, gradient=gradient),
    )


# -- NMS (its user shapes and tile sweep: asickernels.kernels.nms_cases) ------------------


def nms_builder(
    n: int, max_output_size: int, iou_threshold: float, tile: int = 0, backend: str = "pallas_tpu"
) -> Built:
    """NMS on ``backend`` on one image of ``n`` boxes (ours with this tile, when given)."""
    import asickernels
    from asickernels.backends.pallas_tpu.nms import NmsConfig

    config = NmsConfig(tile) if tile else None

    def function(boxes: Any, scores: Any) -> Any:
        return asickernels.nms(
            boxes,
            scores,
            iou_threshold=iou_threshold,
            max_output_size=max_output_size,
            backend=backend,
            config=config,
        )

    return function, [((n, 4), "float32"), ((n,), "float32")]


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


def _seed_nms_kept(n: int, max_output_size: int) -> int:
    """How many boxes greedy NMS keeps on the seed-style random boxes (capped)."""
    boxes, scores = seeds.seed_nms_inputs(n)
    _, count = greedy_nms(
        boxes[None], scores[None], None, iou_threshold=seeds.SEED_NMS_IOU_THRESHOLD,
        max_output_size=max_output_size, score_threshold=float("-inf"),
    )  # fmt: skip
    return int(count[0])


def _nms_workload(n: int, max_output_size: int, **extra: Any) -> dict[str, Any]:
    return {
        "n": n,
        "max_output_size": max_output_size,
        "iou_threshold": seeds.SEED_NMS_IOU_THRESHOLD,
        **extra,
    }


@functools.cache
def nms_case(
    tile: int, n: int = seeds.SEED_NMS_BOXES, max_output_size: int = seeds.SEED_NMS_OUTPUTS
) -> EstimateTarget:
    """Our NMS on random boxes as the seed draws them, with the loop trips that data
    produces (from the kernel's own model, :func:`~asickernels.backends.pallas_tpu.nms.
    loop_trips`)."""
    from asickernels.backends.pallas_tpu import nms

    boxes, scores = seeds.seed_nms_inputs(n)
    kernel_trips = nms.loop_trips(
        boxes,
        scores,
        tile=tile,
        iou_threshold=seeds.SEED_NMS_IOU_THRESHOLD,
        max_output_size=max_output_size,
    )
    clamped = min(tile, -(-n // 128) * 128)
    padded = -(-n // clamped) * clamped
    gather_loop = padded // nms.gather_chunk(padded, clamped) > 1
    trips = {NMS_PROGRAM: nms_schedule_trips(kernel_trips, gather_loop)}
    return make_case(
        f"NMS N={n} out={max_output_size} tile={tile}, pallas_tpu",
        f"{_HERE}:nms_builder",
        _nms_workload(n, max_output_size, tile=tile),
        trips,
        op="nms",
        impl="pallas_tpu",
        shape=f"N={n} out={max_output_size}",
        work=roofline.nms(n, max_output_size),
    )


# The XLA NMS (backends/xla/nms.py) selects one box per trip of its while loop, the only
# loop of the top-level program whose exit the walk cannot compute.
XLA_NMS_LOOP = 0


@functools.cache
def nms_xla_case(n: int, max_output_size: int = seeds.SEED_NMS_OUTPUTS) -> EstimateTarget:
    """Plain XLA NMS (``backend="xla"``) on the same boxes, one loop trip per kept box."""
    kept = _seed_nms_kept(n, max_output_size)
    return make_case(
        f"NMS N={n} out={max_output_size}, xla",
        f"{_HERE}:nms_builder",
        _nms_workload(n, max_output_size, backend="xla"),
        {"TLP": ((XLA_NMS_LOOP, max(kept, 1)),)},
        op="nms",
        impl="xla",
        shape=f"N={n} out={max_output_size}",
        work=roofline.nms(n, max_output_size),
    )


def default_nms_tile() -> int:
    """The NMS kernel's default tile (every generation runs it)."""
    from asickernels.backends.pallas_tpu.nms import NmsConfig

    return NmsConfig().tile
