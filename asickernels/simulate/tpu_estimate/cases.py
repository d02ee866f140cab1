"""Estimate cases that are not ours: the seed-equivalent kernels, the Pallas guide's blocked
matmul, plain XLA matmuls and a memory-bound fixture (our kernels' cases:
:mod:`asickernels.estimates.tpu_cases`). Each case carries its roofline
:class:`~.roofline.Work`.

Every builder returns ``(function, [(shape, dtype), ...])`` for
:func:`asickernels.simulate.tpu_estimate.estimate.compile_with_dumps`, which calls it in a subprocess.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

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
