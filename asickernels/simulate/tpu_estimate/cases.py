"""What ``asickernels estimate`` compiles: the seed-equivalent kernels, our Pallas kernels
and plain XLA side by side at the seeds' workloads and at the shapes users run, and the
block-size sweeps. Each case carries its roofline :class:`~.roofline.Work`.

Every builder returns ``(function, [(shape, dtype), ...])`` for
:func:`asickernels.simulate.tpu_estimate.estimate.compile_with_dumps`, which calls it in a subprocess.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from asickernels.kernels.nms import greedy_nms
from asickernels.simulate.tpu_compile import Built
from asickernels.simulate.tpu_estimate import roofline
from asickernels.simulate.tpu_estimate import seed_kernels as seeds
from asickernels.simulate.tpu_estimate.estimate import EstimateTarget

if TYPE_CHECKING:
    import jax

_HERE = __name__
_SEEDS = seeds.__name__


def make_case(
    name: str,
    builder: str,
    kwargs: Mapping[str, object],
    loop_trips: Mapping[str, tuple[tuple[int, int], ...]] | None = None,
    *,
    op: str = "",
    impl: str = "",
    shape: str = "",
    work: roofline.Work | None = None,
) -> EstimateTarget:
    """An :class:`EstimateTarget` of ``builder`` (``"module:function"``) called with
    ``kwargs``, whose loops named in ``loop_trips`` run that many trips."""
    return EstimateTarget(
        name,
        builder,
        tuple(sorted(kwargs.items())),
        tuple(sorted((loop_trips or {}).items())),
        op=op,
        impl=impl,
        shape=shape,
        work=work,
    )


_SEED_NMS_SHAPE = f"N={seeds.SEED_NMS_BOXES} out={seeds.SEED_NMS_OUTPUTS}"
_SEED_NMS_WORK = roofline.nms(seeds.SEED_NMS_BOXES, seeds.SEED_NMS_OUTPUTS)
SEED_NMS_PALLAS = make_case(
    "seed NMS, Pallas", f"{_SEEDS}:nms_case", {"variant": "pallas"},
    op="nms", impl="seed", shape=_SEED_NMS_SHAPE, work=_SEED_NMS_WORK,
)  # fmt: skip
SEED_NMS_JAX = make_case(
    "seed NMS, jitted JAX", f"{_SEEDS}:nms_case", {"variant": "jax"},
    op="nms", impl="seed", shape=_SEED_NMS_SHAPE, work=_SEED_NMS_WORK,
)  # fmt: skip


def seed_matmul_case(dtype: str, size: int = seeds.SEED_MATMUL_SIZE) -> EstimateTarget:
    """The seed's Pallas matmul (blocks 512x1024x1024) at ``size``^3 in ``dtype``."""
    short = "int8" if dtype == "int8" else "bf16"
    out_bytes = 4 if dtype == "int8" else 2
    return make_case(
        f"seed matmul {short} {size}^3",
        f"{_SEEDS}:matmul_case",
        {"dtype": dtype} if size == seeds.SEED_MATMUL_SIZE else {"dtype": dtype, "size": size},
        op="int8_matmul" if dtype == "int8" else "bf16_matmul",
        impl="seed",
        shape=f"{size}x{size}x{size}",
        work=roofline.matmul(size, size, size, dtype=dtype, out_bytes=out_bytes),
    )


SEED_MATMUL_BF16 = seed_matmul_case("bfloat16")
SEED_MATMUL_INT8 = seed_matmul_case("int8")
SEED_CASES = (SEED_NMS_PALLAS, SEED_NMS_JAX, SEED_MATMUL_BF16, SEED_MATMUL_INT8)


def seed_int8_matmul_case(size: int) -> EstimateTarget:
    """The seed's int8 Pallas matmul (blocks 512x1024x1024) at ``size``^3."""
    return seed_matmul_case("int8", size)


GIOU_PAIRS = 1024 * 256  # the seeds' GIOU workload
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


# -- our kernels ----------------------------------------------------------------------------


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


def xla_matmul_builder(m: int, k: int, n: int, variant: str) -> Built:
    """Plain XLA: ``"int8"`` (int8 dot, int32 result), ``"w8a8"`` (the int8 dot then
    per-row x per-column dequantization to bfloat16) or ``"bf16"`` (a bfloat16 dot)."""
    import jax
    import jax.numpy as jnp

    def int8_dot(x: jax.Array, y: jax.Array) -> jax.Array:
        return jax.lax.dot(x, y, preferred_element_type=jnp.int32)

    if variant == "int8":
        return int8_dot, [((m, k), "int8"), ((k, n), "int8")]
    if variant == "w8a8":

        def w8a8(x: jax.Array, y: jax.Array, x_scale: jax.Array, y_scale: jax.Array) -> jax.Array:
            product = int8_dot(x, y).astype(jnp.float32)
            return (product * x_scale[:, None] * y_scale[None, :]).astype(jnp.bfloat16)

        args = [((m, k), "int8"), ((k, n), "int8"), ((m,), "float32"), ((n,), "float32")]
        return w8a8, args
    if variant == "bf16":
        return jnp.dot, [((m, k), "bfloat16"), ((k, n), "bfloat16")]
    raise ValueError(f"variant must be 'int8', 'w8a8' or 'bf16', got {variant!r}")


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


def stream_builder(rows: int, cols: int, block_rows: int) -> Built:
    """A trivial memory-bound Pallas kernel (``x * 2 + 1`` over row blocks): the estimate
    must come out near its bytes over the HBM bandwidth. A fixture for the tests."""
    import jax

    from asickernels.pallas_home import pl

    def kernel(x_ref: Any, out_ref: Any) -> None:
        out_ref[...] = x_ref[...] * 2.0 + 1.0

    def function(x: jax.Array) -> jax.Array:
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


def stream_case(rows: int = 1024, cols: int = 512, block_rows: int = 256) -> EstimateTarget:
    workload = {"rows": rows, "cols": cols, "block_rows": block_rows}
    return make_case(
        f"stream {rows}x{cols} f32",
        f"{_HERE}:stream_builder",
        workload,
        op="stream",
        impl="pallas_tpu",
        shape=f"{rows}x{cols}",
        work=roofline.Work(2 * rows * cols * 4),
    )


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


_XLA_MATMUL = {  # variant -> (op, dtype, output bytes, scales)
    "int8": ("int8_matmul", "int8", 4, False),
    "w8a8": ("w8a8_matmul", "int8", 2, True),
    "bf16": ("bf16_matmul", "bfloat16", 2, False),
}


def xla_matmul_case(m: int, k: int, n: int, variant: str) -> EstimateTarget:
    """Plain XLA matmul at ``[m, k] @ [k, n]``; see :func:`xla_matmul_builder`."""
    op, dtype, out_bytes, scales = _XLA_MATMUL[variant]
    label = f"{m}x{k}x{n}"
    return make_case(
        f"{op.replace('_', ' ')} {label}, xla",
        f"{_HERE}:xla_matmul_builder",
        {"m": m, "k": k, "n": n, "variant": variant},
        op=op,
        impl="xla",
        shape=label,
        work=roofline.matmul(m, k, n, dtype=dtype, out_bytes=out_bytes, scales=scales),
    )


def blocked_matmul_builder(m: int, k: int, n: int, bm: int, bk: int, bn: int) -> Built:
    """The Pallas guide's blocked bf16 matmul (:func:`.seed_kernels.matmul_pallas`) at
    ``[m, k] @ [k, n]`` with blocks ``bm x bk x bn``."""
    function = functools.partial(seeds.matmul_pallas, bm=bm, bk=bk, bn=bn)
    return function, [((m, k), "bfloat16"), ((k, n), "bfloat16")]


def blocked_matmul_case(
    m: int, k: int, n: int, blocks: tuple[int, int, int] = (16, 1024, 1024)
) -> EstimateTarget:
    """:func:`blocked_matmul_builder`; at few rows (the default blocks take 16), HBM-bound:
    the weights stream once."""
    bm, bk, bn = blocks
    return make_case(
        f"blocked Pallas matmul bf16 {m}x{k}x{n}, blocks {bm}x{bk}x{bn}",
        f"{_HERE}:blocked_matmul_builder",
        {"m": m, "k": k, "n": n, "bm": bm, "bk": bk, "bn": bn},
        op="bf16_matmul",
        impl="pallas_tpu",
        shape=f"{m}x{k}x{n}",
        work=roofline.matmul(m, k, n, dtype="bfloat16", out_bytes=2),
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
