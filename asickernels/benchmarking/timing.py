"""Honest timing: warm-up, device synchronisation, median and spread over repeats.

Every timed call waits for its result (``jax.block_until_ready``), so asynchronous
dispatch is not mistaken for speed; a TPU's compiled kernels are timed on the device the
same way. The first call (which compiles) is reported apart, never mixed into the samples.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import jax

T = TypeVar("T")


def synchronize(value: T) -> T:
    """Waits until every JAX array in ``value`` is computed (other values pass through)."""
    return jax.block_until_ready(value)


def quantile(samples: Sequence[float], q: float) -> float:
    """The ``q``-quantile of ``samples`` (linear interpolation)."""
    ordered = sorted(samples)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclasses.dataclass(frozen=True)
class Timing:
    """Per-call time statistics in seconds, from wall-clock samples or from a device
    profiler's percentiles (``method`` says which). ``first_call_s`` is the first call
    (compilation included), kept out of the statistics; None when not measured."""

    median_s: float
    min_s: float
    p10_s: float
    p90_s: float
    max_s: float
    repeats: int
    first_call_s: float | None
    method: str

    @classmethod
    def from_samples(cls, samples: Sequence[float], first_call_s: float | None) -> Timing:
        return cls(
            median_s=statistics.median(samples),
            min_s=min(samples),
            p10_s=quantile(samples, 0.1),
            p90_s=quantile(samples, 0.9),
            max_s=max(samples),
            repeats=len(samples),
            first_call_s=first_call_s,
            method="wall clock, block_until_ready",
        )

    @property
    def spread(self) -> float:
        """Half the 10-90 percentile range, relative to the median."""
        return (self.p90_s - self.p10_s) / 2 / self.median_s if self.median_s > 0 else 0.0

    def to_json(self) -> dict[str, float | str | None]:
        return dataclasses.asdict(self)


def timed_call(call: Callable[[], T]) -> tuple[T, float]:
    """Runs ``call`` once, waiting for its result: (result, seconds)."""
    start = time.perf_counter()
    result = synchronize(call())
    return result, time.perf_counter() - start


def round_robin(calls: Mapping[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """``repeats`` wall-clock seconds of each call, by name, taken in turns of one call each
    so that the machine's drift hits every call alike. Nothing is synchronized: a call that
    dispatches asynchronously waits for its own result."""
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            seconds[name].append(time.perf_counter() - start)
    return seconds


def measure(
    call: Callable[[], object],
    *,
    first_call_s: float,
    warmup: int,
    repeats: int,
    min_repeats: int,
    budget_s: float,
) -> Timing:
    """Times ``call`` after ``warmup`` untimed calls.

    The number of timed calls is ``repeats``, lowered to fit ``budget_s`` (judged from the
    last warm-up call) but never below ``min_repeats``.
    """
    (timing,) = measure_alternately(
        [call],
        first_calls_s=[first_call_s],
        warmup=warmup,
        repeats=repeats,
        min_repeats=min_repeats,
        budget_s=budget_s,
    )
    return timing


# Timed calls per turn of measure_alternately.
TURN_CALLS = 5


def measure_alternately(
    calls: Sequence[Callable[[], object]],
    *,
    first_calls_s: Sequence[float],
    warmup: int,
    repeats: int,
    min_repeats: int,
    budget_s: float,
) -> list[Timing]:
    """Times ``calls`` in turns, as :func:`measure` times one: the machine's speed drifts
    (other load, CPU frequency) by more than the difference between calls compared with
    each other, so their samples are taken in turns that see the same drift. A turn is one
    untimed call, which warms the caches the other calls' turns left cold (a call on large
    numpy inputs evicts a device-resident call's data), then :data:`TURN_CALLS` timed ones.
    ``budget_s`` is per call."""
    per_call = list(first_calls_s)
    for _ in range(warmup):
        per_call = [timed_call(call)[1] for call in calls]
    slowest = max(max(per_call), 1e-9)
    count = max(min_repeats, min(repeats, int(budget_s / slowest)))
    samples: list[list[float]] = [[] for _ in calls]
    while len(samples[0]) < count:
        turn = min(TURN_CALLS, count - len(samples[0]))
        for call, taken in zip(calls, samples, strict=True):
            if len(calls) > 1:
                timed_call(call)
            taken += [timed_call(call)[1] for _ in range(turn)]
    return [
        Timing.from_samples(taken, first)
        for taken, first in zip(samples, first_calls_s, strict=True)
    ]
