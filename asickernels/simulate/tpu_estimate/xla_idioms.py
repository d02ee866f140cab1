"""Two plain-XLA programs in the idioms production code uses, to judge the estimate on XLA's
own loops (the Pallas ones are in :mod:`.idiom_kernels`); written here, not copied:

* :func:`grouped_matmul`: ``jax.lax.ragged_dot``, rows of ``x`` in groups of run-time
  sizes, group ``g`` times ``w[g]``. libtpu compiles it to two kernels of its own: one
  computes, from the group sizes, the row tiles each group visits; the other's grid runs
  over those tiles, so its trips follow from the sizes' values.
* :func:`chunked_attention`: attention of every query over a long key sequence, a
  ``lax.fori_loop`` over key chunks with an online softmax (running maximum and sum), as
  memory-bound XLA attention is written when the full score matrix does not fit. Its loop
  calls a few large fusions per chunk: a program too long to walk bundle by bundle.

Each ``*_case`` returns ``(function, [(shape, dtype), ...])`` for
:class:`~.estimate.EstimateTarget`.
"""

from __future__ import annotations

import functools
from typing import Any

from asickernels.simulate.tpu_compile import Built


def grouped_matmul(x: Any, w: Any, group_sizes: Any) -> Any:
    """``x [m, k] @ w[g] [k, n]`` for the rows of each group (``group_sizes [groups]``,
    summing to at most ``m``): ``jax.lax.ragged_dot``."""
    import jax

    return jax.lax.ragged_dot(x, w, group_sizes)


def grouped_matmul_case(m: int, k: int, n: int, groups: int) -> Built:
    return grouped_matmul, [
        ((m, k), "bfloat16"),
        ((groups, k, n), "bfloat16"),
        ((groups,), "int32"),
    ]


def chunked_attention(q: Any, k: Any, v: Any, *, chunk: int) -> Any:
    """Softmax attention of ``q [heads, queries, d]`` over ``k, v [heads, keys, d]`` (no
    mask), in a ``fori_loop`` over key chunks of ``chunk`` (dividing the keys) keeping each
    query's running maximum, sum and weighted values in float32."""
    import jax
    import jax.numpy as jnp

    def step(index: Any, carry: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
        top, total, acc = carry
        keys = jax.lax.dynamic_slice_in_dim(k, index * chunk, chunk, axis=1)
        values = jax.lax.dynamic_slice_in_dim(v, index * chunk, chunk, axis=1)
        scores = jnp.einsum("hqd,hkd->hqk", q, keys, preferred_element_type=jnp.float32)
        new_top = jnp.maximum(top, scores.max(-1))
        weights = jnp.exp(scores - new_top[..., None])
        scale = jnp.exp(top - new_top)
        acc = acc * scale[..., None] + jnp.einsum(
            "hqk,hkd->hqd", weights.astype(v.dtype), values, preferred_element_type=jnp.float32
        )
        return new_top, total * scale + weights.sum(-1), acc

    heads, queries, depth = q.shape
    start = (
        jnp.full((heads, queries), -jnp.inf, jnp.float32),
        jnp.zeros((heads, queries), jnp.float32),
        jnp.zeros((heads, queries, depth), jnp.float32),
    )
    _, total, acc = jax.lax.fori_loop(0, k.shape[1] // chunk, step, start)
    return (acc / total[..., None]).astype(q.dtype)


def chunked_attention_case(heads: int, queries: int, keys: int, depth: int, chunk: int) -> Built:
    q = ((heads, queries, depth), "bfloat16")
    kv = ((heads, keys, depth), "bfloat16")
    return functools.partial(chunked_attention, chunk=chunk), [q, kv, kv]
