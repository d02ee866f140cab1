"""Two Pallas TPU kernels written here in the idioms production kernels use, to judge the
estimate on them (:mod:`.observed`, :mod:`.walk`); written here, not copied:

* :func:`grouped_matmul`, a grouped matmul in the style of megablox
  (``jax.experimental.pallas.ops.tpu.megablox``): the rows of ``lhs`` fall into groups,
  group ``g`` multiplies ``rhs[g]``. The grid's middle dimension is the number of active
  row tiles, computed from the group sizes at run time; the index maps and the store mask
  read metadata (group offsets, each grid row's group and row tile) prefetched to SMEM. A
  row tile two groups share is visited once per group, consecutively, so its output block
  stays in VMEM between the visits.
* :func:`causal_attention`, a causal flash attention in the style of splash attention
  (``jax.experimental.pallas.ops.tpu.splash_attention``): the kernel skips the key blocks
  above the diagonal by ``pl.when`` on a prefetched block mask, and the key/value index
  maps name, for a skipped block, the last block computed, so the pipeline fetches
  nothing new for it. The mask data are numpy constants of the program, as splash builds
  them.

:func:`checked_grouped_matmul` wraps the grouped matmul as op libraries do: it validates
its group sizes by value on the host, so it can only be traced with them as values.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

NEG_INF = -1e30


# -- grouped matmul --------------------------------------------------------------------------


def group_metadata(group_sizes: Any, m: int, tm: int) -> tuple[tuple[Any, Any, Any], Any]:
    """((group offsets [groups + 1], group of each grid row [tiles + groups - 1], row tile
    of each grid row [same]), number of grid rows) for row tiles of ``tm``: a group visits
    every row tile it has rows in; an empty group visits none."""
    import jax.numpy as jnp

    groups = group_sizes.shape[0]
    tiles = m // tm
    ends = jnp.cumsum(group_sizes)
    offsets = jnp.concatenate([jnp.zeros(1, jnp.int32), ends]).astype(jnp.int32)
    starts = offsets[:-1]
    first_tile = starts // tm
    last_tile = (ends - 1) // tm
    visits = jnp.where(group_sizes > 0, last_tile - first_tile + 1, 0).astype(jnp.int32)
    rows = tiles + groups - 1
    group_of_row = jnp.repeat(jnp.arange(groups, dtype=jnp.int32), visits, total_repeat_length=rows)
    first_row = jnp.cumsum(visits) - visits  # the grid row of each group's first visit
    row = jnp.arange(rows, dtype=jnp.int32)
    tile_of_row = first_tile[group_of_row] + row - first_row[group_of_row]
    return (offsets, group_of_row, tile_of_row.astype(jnp.int32)), jnp.sum(visits)


def _grouped_kernel(
    offsets, group_of_row, tile_of_row, lhs_ref, rhs_ref, out_ref, acc_ref, *, tm, tk_steps
) -> None:  # type: ignore[no-untyped-def]
    import jax
    import jax.numpy as jnp

    from asickernels.pallas_home import pl

    row, k = pl.program_id(1), pl.program_id(2)

    @pl.when(k == 0)
    def _() -> None:
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(lhs_ref[...], rhs_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == tk_steps - 1)
    def _() -> None:  # only this group's rows of the tile; another group's stay
        group = group_of_row[row]
        rows = tile_of_row[row] * tm + jax.lax.broadcasted_iota(jnp.int32, acc_ref.shape, 0)
        mine = (rows >= offsets[group]) & (rows < offsets[group + 1])
        out_ref[...] = jnp.where(mine, acc_ref[...], out_ref[...].astype(jnp.float32)).astype(
            out_ref.dtype
        )


@functools.partial(__import__("jax").jit, static_argnames=("tiling",))
def grouped_matmul(
    lhs: Any, rhs: Any, group_sizes: Any, tiling: tuple[int, int, int] = (128, 128, 128)
) -> Any:
    """``lhs[offsets[g]:offsets[g + 1]] @ rhs[g]`` for each group ``g`` (rows past the
    groups are 0). ``lhs`` [m, k], ``rhs`` [groups, k, n], ``group_sizes`` [groups] int32
    summing to at most m; tiles (tm, tk, tn) divide (m, k, n). Output [m, n] in lhs's
    dtype."""
    import jax
    import jax.numpy as jnp

    from asickernels.pallas_home import pl, pltpu

    (m, k), n = lhs.shape, rhs.shape[2]
    tm, tk, tn = tiling
    if m % tm or k % tk or n % tn:
        raise ValueError(f"tiling {tiling} must divide (m, k, n) = {(m, k, n)}")
    metadata, active = group_metadata(group_sizes, m, tm)
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3,
        grid=(n // tn, active, k // tk),
        in_specs=[
            pl.BlockSpec((tm, tk), lambda j, r, kk, off, grp, til: (til[r], kk)),
            pl.BlockSpec((None, tk, tn), lambda j, r, kk, off, grp, til: (grp[r], kk, j)),
        ],
        out_specs=pl.BlockSpec((tm, tn), lambda j, r, kk, off, grp, til: (til[r], j)),
        scratch_shapes=[pltpu.VMEM((tm, tn), jnp.float32)],
    )
    out = pl.pallas_call(
        functools.partial(_grouped_kernel, tm=tm, tk_steps=k // tk),
        grid_spec=spec,
        out_shape=jax.ShapeDtypeStruct((m, n), lhs.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary")
        ),
        name="grouped_matmul",
    )(*metadata, lhs, rhs)
    rows = jnp.arange(m)[:, None]
    return jnp.where(rows < metadata[0][-1], out, jnp.zeros_like(out))


def checked_grouped_matmul(lhs: Any, rhs: Any, group_sizes: Any) -> Any:
    """:func:`grouped_matmul` behind an op wrapper's checks on the host: the group sizes
    must be non-negative and sum to at most ``lhs``'s rows (ValueError otherwise)."""
    sizes = np.asarray(group_sizes)
    if (sizes < 0).any() or sizes.sum() > lhs.shape[0]:
        raise ValueError(f"group sizes {sizes.tolist()} do not fit {lhs.shape[0]} rows")
    return grouped_matmul(lhs, rhs, group_sizes)


def grouped_matmul_reference(lhs: Any, rhs: Any, group_sizes: Any) -> np.ndarray:
    """The grouped product in float64 numpy."""
    lhs, rhs = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    out = np.zeros((lhs.shape[0], rhs.shape[2]))
    start = 0
    for group, size in enumerate(np.asarray(group_sizes)):
        out[start : start + size] = lhs[start : start + size] @ rhs[group]
        start += size
    return out


# -- causal attention ------------------------------------------------------------------------


def causal_block_mask(q_blocks: int, kv_blocks: int, bq: int, bkv: int) -> tuple[Any, Any]:
    """(per (q block, kv block): 0 above the diagonal, skipped; 1 crossing it, masked; 2
    below it, whole; the kv block each step fetches: its own where computed, else the
    last one computed before it in its row, so a skipped step fetches nothing new)."""
    kind = np.zeros((q_blocks, kv_blocks), np.int32)
    fetch = np.zeros((q_blocks, kv_blocks), np.int32)
    for i in range(q_blocks):
        last = 0
        for j in range(kv_blocks):
            first_q, last_q = i * bq, (i + 1) * bq - 1
            first_kv, last_kv = j * bkv, (j + 1) * bkv - 1
            kind[i, j] = 0 if first_kv > last_q else 2 if last_kv <= first_q else 1
            last = j if kind[i, j] else last
            fetch[i, j] = last
    return kind, fetch


def _attention_kernel(
    kind_ref, fetch_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, bq, bkv, scale
) -> None:  # type: ignore[no-untyped-def]
    import jax
    import jax.numpy as jnp

    from asickernels.pallas_home import pl

    i, j = pl.program_id(1), pl.program_id(2)
    kind = kind_ref[i, j]

    @pl.when(j == 0)
    def _() -> None:
        m_ref[...] = jnp.full_like(m_ref, NEG_INF)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(kind != 0)  # the blocks above the diagonal: no compute
    def _() -> None:
        s = jax.lax.dot_general(
            q_ref[...], k_ref[...], (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
        )
        s = s * scale
        rows = i * bq + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
        cols = fetch_ref[i, j] * bkv + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where((kind == 2) | (cols <= rows), s, NEG_INF)
        m_prev = m_ref[...]
        m_next = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
        p = jnp.exp(s - m_next)
        alpha = jnp.exp(m_prev - m_next)
        l_ref[...] = alpha * l_ref[...] + p.sum(axis=1, keepdims=True)
        acc_ref[...] = alpha * acc_ref[...] + jnp.dot(
            p.astype(v_ref.dtype), v_ref[...], preferred_element_type=jnp.float32
        )
        m_ref[...] = m_next

    @pl.when(j == pl.num_programs(2) - 1)
    def _() -> None:
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


@functools.partial(__import__("jax").jit, static_argnames=("block_q", "block_kv"))
def causal_attention(q: Any, k: Any, v: Any, block_q: int = 512, block_kv: int = 512) -> Any:
    """Causal softmax attention ``softmax(q k^T / sqrt(d) + causal mask) v`` per head:
    ``q``, ``k``, ``v`` [heads, seq, d] (d a multiple of 128, seq of both blocks)."""
    import jax
    import jax.numpy as jnp

    from asickernels.pallas_home import pl, pltpu

    heads, seq, d = q.shape
    if seq % block_q or seq % block_kv:
        raise ValueError(f"blocks ({block_q}, {block_kv}) must divide the sequence ({seq})")
    kind, fetch = causal_block_mask(seq // block_q, seq // block_kv, block_q, block_kv)
    kv_spec = pl.BlockSpec((None, block_kv, d), lambda h, i, j, kind, fetch: (h, fetch[i, j], 0))
    q_spec = pl.BlockSpec((None, block_q, d), lambda h, i, j, kind, fetch: (h, i, 0))
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(heads, seq // block_q, seq // block_kv),
        in_specs=[q_spec, kv_spec, kv_spec],
        out_specs=q_spec,
        scratch_shapes=[
            pltpu.VMEM((block_q, 1), jnp.float32),
            pltpu.VMEM((block_q, 1), jnp.float32),
            pltpu.VMEM((block_q, d), jnp.float32),
        ],
    )
    kernel = functools.partial(_attention_kernel, bq=block_q, bkv=block_kv, scale=d**-0.5)
    return pl.pallas_call(
        kernel,
        grid_spec=spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")
        ),
        name="causal_attention",
    )(jnp.asarray(kind), jnp.asarray(fetch), q, k, v)


def causal_attention_reference(q: Any, k: Any, v: Any) -> np.ndarray:
    """Causal attention in float64 numpy."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def splash_causal(q: Any, k: Any, v: Any, block: int = 512) -> Any:
    """jax's own splash attention (``jax.experimental.pallas.ops.tpu.splash_attention``,
    public API), forward, with a causal mask and square blocks of ``block``, on [heads,
    seq, d]."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    heads, seq, _ = q.shape
    mask = splash.MultiHeadMask([splash.CausalMask((seq, seq)) for _ in range(heads)])
    sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block)
    return splash.make_splash_mha(mask, head_shards=1, q_seq_shards=1, block_sizes=sizes)(q, k, v)
