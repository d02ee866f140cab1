"""``nki.benchmark`` and ``nki.profile`` without a Neuron device.

On a device these decorators compile a kernel, run it with ``neuron-bench`` / ``neuron-profile``
and report latency (general/nki/api/nki/__init__.py at aws-neuron-sdk 0521004c, ``benchmark``
and ``profile``; the 2.27+ ``nki`` reference keeps only ``jit`` and ``simulate``). Here they
run the kernel once in the simulator, so kernels and test files that benchmark run unchanged,
and say plainly that no device time was measured: a :class:`NoDeviceTimeWarning` on every call
and ``benchmark_result.device_time_measured`` is False.

``benchmark`` reports a model estimate instead: the cost model
(:mod:`asickernels.simulate.nki.estimate`) schedules the run's instruction trace, and every
latency percentile is that one estimate (``nc_latency.estimated`` is True;
``benchmark_result.estimate`` has the bound engine and each engine's busy share).

Inputs may be arrays or placeholders (``nt.tensor[[8192, 4096], nl.bfloat16]``, which the SDK
accepts because it never uses the values: "the output c tensor is undefined"), in both API
generations (the current one's ``nt.tensor[shape]`` annotation needs the dtype added to be
run). With placeholders only the run is trace-only: shapes and dtypes matter and every value
reads as zero; the legacy API computes no values, the current one skips its matmuls and runs
its element-wise instructions on the zeros, so large shapes estimate quickly.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from asickernels.simulate.nki import runtime
from asickernels.simulate.nki.estimate import Estimate, estimate
from asickernels.simulate.nki.tensor import nki_dtype
from asickernels.simulate.nki.trace import Instruction

__all__ = [
    "BenchmarkResult",
    "Benchmarked",
    "Latency",
    "NoDeviceTimeWarning",
    "Profiled",
    "decorators",
]

# benchmark's docstring: "Available percentiles: [0, 1, 10, 25, 50, 90, 99, 100]".
PERCENTILES = (0, 1, 10, 25, 50, 90, 99, 100)
NO_DEVICE = "no Neuron device: the kernel ran in the CPU simulator and no device time was measured"
ESTIMATED = (
    "latencies are a cost-model estimate from the simulator's instruction trace, not a "
    "measurement (asickernels.simulate.nki.estimate)"
)


class NoDeviceTimeWarning(UserWarning):
    """A benchmark or profile ran in the simulator: it measured no device time."""


class Latency:
    """``benchmark_result.nc_latency``: latency statistics in microseconds, measured
    ``samples_us`` or one model ``estimate_us`` (then every percentile is the estimate)."""

    def __init__(
        self,
        samples_us: Sequence[float] = (),
        estimate_us: float | None = None,
        band_us: tuple[float, float] | None = None,
        calibrated: bool = True,
    ) -> None:
        self.samples_us = [float(s) for s in samples_us]
        self.estimate_us = estimate_us
        # (low, high) us the estimate may be off within: Estimate.band_us
        self.band_us = band_us
        # False: no measured latency calibrates the generation (a wider band)
        self.calibrated = calibrated

    @property
    def measured(self) -> bool:
        return bool(self.samples_us)

    @property
    def estimated(self) -> bool:
        return not self.samples_us and self.estimate_us is not None

    def get_latency_percentile(self, percentile: int) -> float:
        """The ``percentile``-th latency in microseconds (one of 0, 1, 10, 25, 50, 90, 99,
        100); the estimate when one was modelled instead; NaN when neither exists."""
        if isinstance(percentile, bool) or percentile not in PERCENTILES:
            raise ValueError(f"percentile must be one of {list(PERCENTILES)}, got {percentile!r}")
        if self.samples_us:
            return float(np.percentile(self.samples_us, percentile))
        return math.nan if self.estimate_us is None else float(self.estimate_us)

    def __repr__(self) -> str:
        if self.measured:
            return f"Latency({len(self.samples_us)} samples)"
        if self.estimated:
            band = "" if self.band_us is None else (
                f", band {self.band_us[0]:.3f}-{self.band_us[1]:.3f} us")  # fmt: skip
            calibration = "" if self.calibrated else ", uncalibrated generation"
            return f"Latency(estimate {self.estimate_us:.3f} us{band}{calibration}, not measured)"
        return "Latency(none)"


class BenchmarkResult:
    """What one benchmarked call reports: ``nc_latency`` (a model estimate here, never a
    measurement), ``device_time_measured`` (False), ``note`` (why), ``estimate`` (the
    :class:`~asickernels.simulate.nki.estimate.Estimate`: bound engine, busy shares; the
    slowest logical core's) and the simulator's ``counters`` of the run."""

    def __init__(
        self,
        counters: dict[str, float],
        estimated: Estimate | None = None,
        note: str = NO_DEVICE,
        trace: tuple[int, list[Instruction]] | None = None,
    ) -> None:
        self.nc_latency = (
            Latency()
            if estimated is None
            else Latency(
                estimate_us=estimated.latency_us,
                band_us=estimated.band_us,
                calibrated=estimated.calibrated,
            )
        )
        self.device_time_measured = False
        self.estimate = estimated
        self.note = note if estimated is None else f"{note}; {ESTIMATED}: {estimated.describe()}"
        self.counters = counters
        self._trace = trace  # (NeuronCore version, instructions) of the estimated core

    def write_chrome_trace(self, path: str) -> None:
        """Writes the estimated engine timeline as Chrome/Perfetto trace JSON (open it in
        ui.perfetto.dev or chrome://tracing); modelled, not a profile."""
        if self._trace is None:
            raise ValueError("this benchmark result has no instruction trace to lay out")
        version, instructions = self._trace
        estimate(instructions, version, timeline=True).write_chrome_trace(path)

    def __repr__(self) -> str:
        return f"BenchmarkResult({self.note})"


def _is_placeholder(value: Any) -> bool:
    shape = getattr(value, "shape", None)
    return not isinstance(value, np.ndarray) and isinstance(shape, (tuple, list))


def _placeholder_or_value(value: Any) -> Any:
    """A ``nt.tensor[shape, dtype]`` placeholder as a zero array; anything else unchanged."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if isinstance(value, np.ndarray) or shape is None or not isinstance(shape, (tuple, list)):
        return value
    if dtype is None:
        raise TypeError(f"placeholder {value!r} needs a dtype to be simulated")
    return np.zeros(tuple(int(s) for s in shape), nki_dtype(dtype))


class _Decorated:
    """A kernel wrapped for benchmarking or profiling; ``wrapped[grid]`` keeps the wrapping."""

    def __init__(self, kernel: Any, options: dict[str, Any]) -> None:
        self.kernel = kernel
        self.options = options
        self.__name__ = getattr(kernel, "__name__", type(self).__name__)
        self.__doc__ = getattr(kernel, "__doc__", None)

    def __getitem__(self, grid: Any) -> Any:
        return type(self)(self.kernel[grid], self.options)

    def _simulate(
        self, what: str, args: tuple[Any, ...], kwargs: dict[str, Any], note: str = NO_DEVICE
    ) -> Any:
        warnings.warn(f"nki.{what}: {note}", NoDeviceTimeWarning, stacklevel=3)
        values = (*args, *kwargs.values())
        tensors = [v for v in values if isinstance(v, np.ndarray) or _is_placeholder(v)]
        trace_only = bool(tensors) and all(_is_placeholder(v) for v in tensors)
        args = tuple(_placeholder_or_value(a) for a in args)
        kwargs = {k: _placeholder_or_value(v) for k, v in kwargs.items()}
        with runtime.recording(trace_only):
            return self.kernel(*args, **kwargs)


class Benchmarked(_Decorated):
    """A kernel under ``nki.benchmark``: each call runs it once in the simulator and sets
    ``benchmark_result`` (an estimate, no device time; see the module docstring)."""

    benchmark_result: BenchmarkResult | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = self._simulate("benchmark", args, kwargs, f"{NO_DEVICE}; {ESTIMATED}")
        traces = runtime.last_traces()
        estimates = [estimate(trace, version) for version, trace in traces]
        if not estimates:  # nothing ran
            self.benchmark_result = BenchmarkResult(runtime.last_counters())
            return result
        slowest = max(range(len(estimates)), key=lambda i: estimates[i].latency_us)
        self.benchmark_result = BenchmarkResult(
            runtime.last_counters(), estimates[slowest], trace=traces[slowest]
        )
        return result


class Profiled(_Decorated):
    """A kernel under ``nki.profile``: each call runs it once in the simulator; no profile
    artifacts (NEFF, NTFF, JSON summaries) are written, as nothing ran on a device."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self._simulate("profile", args, kwargs)


def make_benchmark(
    decorate: Callable[[Callable[..., Any]], Any],
    kernel: Any = None,
    warmup: int = 10,
    iters: int = 100,
    save_neff_name: str | None = None,
    save_trace_name: str | None = None,
    additional_compile_opt: str | None = None,
) -> Any:
    """``benchmark`` of one API generation (``decorate``: its ``jit``), used as
    ``benchmark(kernel, ...)``, ``@benchmark(...)`` or ``@benchmark``."""
    for name, count in (("warmup", warmup), ("iters", iters)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"nki.benchmark: {name} must be a non-negative int, got {count!r}")
    if iters < 1:
        raise ValueError("nki.benchmark: iters must be at least 1")
    options = {
        "warmup": warmup,
        "iters": iters,
        "save_neff_name": save_neff_name,
        "save_trace_name": save_trace_name,
        "additional_compile_opt": additional_compile_opt,
    }
    return _decorator(Benchmarked, decorate, options, kernel)


def make_profile(
    decorate: Callable[[Callable[..., Any]], Any],
    func: Any = None,
    working_directory: str | None = None,
    save_neff_name: str = "file.neff",
    save_trace_name: str = "profile.ntff",
    additional_compile_opt: str | None = None,
    overwrite: bool = False,
    profile_nth: int = 1,
) -> Any:
    """``profile`` of one API generation: ``working_directory`` "must be specified and must
    also be an absolute path" (the docstring); ``profile_nth`` >= 1."""
    if working_directory is None or not os.path.isabs(str(working_directory)):
        raise ValueError(
            f"nki.profile: working_directory must be an absolute path, got {working_directory!r}"
        )
    if isinstance(profile_nth, bool) or not isinstance(profile_nth, int) or profile_nth < 1:
        raise ValueError(f"nki.profile: profile_nth must be an int >= 1, got {profile_nth!r}")
    options = {
        "working_directory": working_directory,
        "save_neff_name": save_neff_name,
        "save_trace_name": save_trace_name,
        "additional_compile_opt": additional_compile_opt,
        "overwrite": overwrite,
        "profile_nth": profile_nth,
    }
    return _decorator(Profiled, decorate, options, func)


def _decorator(
    wrapper: Callable[[Any, dict[str, Any]], Any],
    decorate: Callable[[Callable[..., Any]], Any],
    options: dict[str, Any],
    function: Any,
) -> Any:
    """``wrapper(kernel, options)`` of ``function`` (``decorate`` makes it a kernel unless it
    is one), or the decorator that makes it when ``function`` is None."""

    def wrap(function: Any) -> Any:
        if not callable(function):
            raise TypeError(f"nki.benchmark/profile decorate a kernel function, got {function!r}")
        kernel = function if hasattr(function, "__getitem__") else decorate(function)
        return wrapper(kernel, options)

    return wrap if function is None else wrap(function)


def decorators(decorate: Callable[[Callable[..., Any]], Any]) -> tuple[Any, Any]:
    """``(benchmark, profile)`` of the API generation whose ``jit`` is ``decorate``."""

    def benchmark(kernel: Any = None, **options: Any) -> Any:
        """``nki.benchmark(kernel=None, warmup=10, iters=100, save_neff_name=None,
        save_trace_name=None, additional_compile_opt=None)``: without a device, runs the
        kernel in the simulator and measures no device time
        (:mod:`asickernels.simulate.nki.benchmarking`)."""
        return make_benchmark(decorate, kernel, **options)

    def profile(func: Any = None, **options: Any) -> Any:
        """``nki.profile(func=None, working_directory=..., save_neff_name='file.neff',
        save_trace_name='profile.ntff', additional_compile_opt=None, overwrite=False,
        profile_nth=1)``: without a device, runs the kernel in the simulator."""
        return make_profile(decorate, func, **options)

    return benchmark, profile
