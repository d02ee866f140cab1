"""Device timing paths that this CPU machine cannot run (kept small, sharing the CPU path).

* TPU host: nothing special. ``pallas_tpu`` is then ``native``; the harness jits the public
  op with device-resident inputs and times it with ``block_until_ready``
  (:mod:`asickernels.benchmarking.timing`), exactly as on CPU.
* Neuron host: a backend whose :class:`~asickernels.kernels.registry.Backend` carries a
  ``device_timer`` (``(op, case, warmup, iters) -> Timing``) is timed through it when it
  runs natively, instead of by wall clock. The NKI backend's is :func:`time_nki_op`: it runs
  the public op once (the same call as on CPU) and has every kernel that call launches
  timed by :func:`nki_latency`, which reads the SDK's on-device latency percentiles. GpSimd
  ops, called on Neuron XLA tensors through torch-neuronx, keep the wall-clock path.

Neither Neuron path has run here: the SDK is not installable on this machine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from asickernels.benchmarking.timing import Timing
from asickernels.kernels.cases import Case

DeviceTimer = Callable[[str, Case, int, int], Timing]

# Percentiles nki.benchmark reports (it accepts 0, 1, 10, 25, 50, 90, 99 and 100).
_PERCENTILES = (0, 10, 50, 90, 100)


def nki_latency(
    kernel: Callable[..., object],
    args: tuple[object, ...],
    *,
    warmup: int,
    iters: int,
    kwargs: Mapping[str, object] | None = None,
) -> Timing:
    """Device latency of an NKI kernel from ``nki.benchmark`` (Neuron SDK, legacy namespace
    ``neuronxcc.nki``, which has the benchmark decorator).

    The SDK runs the kernel ``warmup + iters`` times on the NeuronCore and reports latency
    percentiles in microseconds; the kernel's outputs are not meaningful (check correctness
    with a normal call first, as the harness does).
    """
    from neuronxcc import nki  # only on a Neuron host

    benchmarked = nki.benchmark(warmup=warmup, iters=iters)(kernel)
    benchmarked(*args, **(kwargs or {}))
    latency = benchmarked.benchmark_result.nc_latency
    seconds = {p: latency.get_latency_percentile(p) * 1e-6 for p in _PERCENTILES}
    return Timing(
        median_s=seconds[50],
        min_s=seconds[0],
        p10_s=seconds[10],
        p90_s=seconds[90],
        max_s=seconds[100],
        repeats=iters,
        first_call_s=None,
        method="nki.benchmark (on-device latency percentiles)",
    )


def time_nki_op(op: str, case: Case, warmup: int, iters: int) -> Timing:
    """The device time of ``asickernels.<op>`` on the ``nki`` backend: the sum, statistic by
    statistic, of ``nki.benchmark``'s latencies of every kernel the call launches."""
    import asickernels
    from asickernels.backends.nki import sdk

    timings: list[Timing] = []

    def observe(
        kernel: Callable[..., object], args: tuple[object, ...], kwargs: dict[str, object]
    ) -> None:
        timings.append(nki_latency(kernel, args, warmup=warmup, iters=iters, kwargs=kwargs))

    with sdk.observing_kernels(observe):
        getattr(asickernels, op)(*case.arrays, backend="nki", **case.static)
    if not timings:
        raise RuntimeError(f"asickernels.{op} launched no NKI kernel")
    return Timing(
        median_s=sum(t.median_s for t in timings),
        min_s=sum(t.min_s for t in timings),
        p10_s=sum(t.p10_s for t in timings),
        p90_s=sum(t.p90_s for t in timings),
        max_s=sum(t.max_s for t in timings),
        repeats=iters,
        first_call_s=None,
        method=f"nki.benchmark (on-device latency percentiles, {len(timings)} kernel launch(es) summed)",
    )
