"""The engines' pseudo random number generators: per compute lane, XORWOW state that
``nisa.rand_set_state`` writes, ``nisa.rand_get_state`` reads back and ``nisa.set_rng_seed``
seeds, and that ``nisa.rng``/``rand2``/``dropout`` draw from (nki.isa.rand_set_state,
rand_get_state, set_rng_seed, nki/api/nki/isa/__init__.py@81ce03a, NKI 0.6).

The reference names XORWOW and its state sizes (6 words per lane on GpSimd, 24 on the Vector
engine) but not how outputs map to state, so the bits here are not the device's: what holds
is what the reference promises, the same state giving the same numbers, and a state read
back being the state that continues the sequence. The 6 words are Marsaglia's xorwow
(x, y, z, w, v, d), as in cuRAND; the Vector engine's 24 are four such generators drawn in
turn. Unseeded engines start from a fixed state derived from seed 0.
"""

from __future__ import annotations

import numpy as np

from asickernels.simulate.nki import runtime

WORDS = {"gpsimd": 6, "vector": 24}
_WEYL = np.uint32(362437)


def seeded(seed: int, engine: str) -> np.ndarray:
    """The lane states ``[128, words]`` (uint32, no all-zero xorshift part) from ``seed``."""
    return np.random.default_rng([seed & 0xFFFFFFFF, WORDS[engine]]).integers(
        1, 2**32, (runtime.PMAX, WORDS[engine]), dtype=np.uint32
    )


def states(run: runtime.Run, engine: str) -> np.ndarray:
    """``engine``'s lane states in ``run`` (created from seed 0 on first use), writable."""
    if engine not in run.rng_states:
        run.rng_states[engine] = seeded(0, engine)
    return np.asarray(run.rng_states[engine])


def seed_all(run: runtime.Run, seed: int) -> None:
    """Re-seeds every engine's generators from ``seed`` (``nl.random_seed``)."""
    for engine in WORDS:
        run.rng_states[engine] = seeded(seed, engine)


def _xorwow(state: np.ndarray, count: int) -> np.ndarray:
    """``count`` outputs of each generator ``state[g]`` (``[G, 6]``, advanced in place)."""
    x, y, z, w, v, d = (state[:, i].copy() for i in range(6))
    out = np.empty((state.shape[0], count), np.uint32)
    for k in range(count):
        t = x ^ (x >> np.uint32(2))
        x, y, z, w = y, z, w, v
        v = (v ^ (v << np.uint32(4))) ^ (t ^ (t << np.uint32(1)))
        d = d + _WEYL
        out[:, k] = v + d
    state[...] = np.stack([x, y, z, w, v, d], axis=1)
    return out


def bits(run: runtime.Run, engine: str, shape: tuple[int, ...]) -> np.ndarray:
    """32 random bits per element of a tile of ``shape`` (``[P, ...]``): lane ``p`` draws
    its partition's elements in order from its generators (taken in turn)."""
    lanes, count = shape[0], int(np.prod(shape[1:], dtype=np.int64))
    generators = WORDS[engine] // 6
    lane_states = states(run, engine)[:lanes].reshape(lanes * generators, 6)
    drawn = _xorwow(lane_states, -(-count // generators))  # advances the run's states
    per_lane = drawn.reshape(lanes, generators, -1).transpose(0, 2, 1).reshape(lanes, -1)
    return per_lane[:, :count].reshape(shape)


def uniform(run: runtime.Run, engine: str, shape: tuple[int, ...]) -> np.ndarray:
    """Uniform float64 values in [0, 1) from :func:`bits`."""
    return bits(run, engine, shape).astype(np.float64) / 2.0**32
