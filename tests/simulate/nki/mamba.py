"""The Mamba selective scan both NKI generations' corpus kernels (``mamba_nki_kernels.py``)
compute, and their inputs."""

from __future__ import annotations

import numpy as np


def mamba_inputs(
    rng: np.random.Generator,
    delta_range: tuple[float, float],
    a_range: tuple[float, float],
    shape: tuple[int, int, int, int] = (1, 128, 1024, 2),
) -> tuple[np.ndarray, ...]:
    """float32 ``(delta, u, a, b, c)`` for ``shape = (batch, channels, seq_len, states)``:
    ``delta`` uniform in ``delta_range``, ``a`` minus uniform in ``a_range``, the rest
    standard normal (drawn in that order)."""
    batch, channels, seq_len, states = shape
    delta = rng.uniform(*delta_range, (batch, channels, seq_len)).astype(np.float32)
    u = rng.standard_normal((batch, channels, seq_len)).astype(np.float32)
    a = -rng.uniform(*a_range, (channels, states)).astype(np.float32)
    b = rng.standard_normal((batch, states, seq_len)).astype(np.float32)
    c = rng.standard_normal((batch, states, seq_len)).astype(np.float32)
    return delta, u, a, b, c


def selective_scan(
    delta: np.ndarray, u: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray
) -> np.ndarray:
    """float64 ``[batch, channels, seq_len]``: per state s, h_t = exp(delta_t * A[:, s]) *
    h_{t-1} + delta_t * u_t * B[s, t]; y_t = sum over states of h_t * C[s, t]."""
    out = np.zeros_like(delta, dtype=np.float64)
    for s in range(a.shape[1]):
        decay = np.exp(delta * a[None, :, s, None])
        drive = delta * u * b[:, None, s, :]
        state = np.zeros(delta.shape[:2])
        for t in range(delta.shape[2]):
            state = decay[..., t] * state + drive[..., t]
            out[..., t] += state * c[:, None, s, t]
    return out
