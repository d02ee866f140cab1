"""``check`` and ``bench``: every op on every backend (and peer), against the reference.

Backends come from the registry (``registry.backends_for``), so a backend registered later
joins without a change here; a backend that cannot run here, or fails to import, becomes a
``missing`` or ``error`` row and never stops the run.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Collection
from typing import Any, Literal

import numpy as np

from asickernels.benchmarking.device import DeviceTimer
from asickernels.benchmarking.peers import PEER_BACKENDS, PEERS
from asickernels.benchmarking.progress import Progress
from asickernels.benchmarking.timing import Timing, measure, measure_alternately, timed_call
from asickernels.benchmarking.workloads import (
    WORKLOADS,
    DefaultMode,
    NotApplicable,
    Prepared,
    prepare_backend,
    prepare_default,
)
from asickernels.kernels import registry
from asickernels.kernels.cases import Case, Comparison, Size, Workload
from asickernels.kernels.registry import Availability

Role = Literal["ours", "peer", "reference"]
# "n/a": the backend refuses the case by design (workloads.NotApplicable), not a failure.
Status = Literal["ok", "fail", "error", "missing", "skipped", "n/a"]


@dataclasses.dataclass(frozen=True)
class Contender:
    """A registered backend or a peer, as one row of a table."""

    name: str
    role: Role
    availability: Availability
    prepare: Callable[[Case], Prepared]
    counters: Callable[[], dict[str, float]] | None = None
    device_timer: DeviceTimer | None = None

    @property
    def mode(self) -> str:
        return self.availability.mode

    def missing_detail(self) -> str:
        hint = (
            f" (install: {self.availability.install_hint})"
            if self.availability.install_hint
            else ""
        )
        return self.availability.detail + hint


# A checked call not yet timed, and its first call's seconds.
Pending = tuple[Callable[[], object], float]

# What a user gets with backend=None: the same public call jitted (inputs on the device, and
# the bench's numpy inputs as they are) and called eagerly on those numpy inputs, as the
# README's examples do.
DEFAULT_ROWS: dict[str, DefaultMode] = {
    "default": "jit",
    "default-jit-numpy": "jit-numpy",
    "default-eager": "eager",
}


def implementation_names() -> list[str]:
    """Every registered backend, the default-backend rows and every peer: the values
    ``--backends`` accepts."""
    return registry.backend_names() + list(DEFAULT_ROWS) + list(PEERS)


def checked_names() -> list[str]:
    """The backends ``check`` compares with the reference: every registered one but the
    reference, and the default-backend rows (peers are compared and timed by ``bench``)."""
    return [name for name in registry.backend_names() if name != "reference"] + list(DEFAULT_ROWS)


def role_of(name: str) -> Role:
    if name == "reference":
        return "reference"
    return "peer" if name in PEER_BACKENDS or name in PEERS else "ours"


def availability_of(name: str) -> Availability:
    if name in DEFAULT_ROWS:
        return Availability("native", "backend=None: the selection policy's choice")
    return PEERS[name].probe() if name in PEERS else registry.availability(name)


def ops_of(name: str) -> list[str]:
    """The ops (of :data:`WORKLOADS`) that backend or peer ``name`` implements."""
    if name in PEERS:
        return [op for op, spec in WORKLOADS.items() if spec.op in PEERS[name].builders]
    if name in DEFAULT_ROWS:
        return list(WORKLOADS)
    return [op for op, spec in WORKLOADS.items() if name in spec.backends()]


def contenders(
    op: Workload, selected: Collection[str] | None = None, *, peers: bool = True
) -> list[Contender]:
    """``op``'s backends in registration order, then the peers that implement it."""
    found = []
    for name in op.backends():
        if selected is not None and name not in selected:
            continue
        backend = registry.backend(name)
        found.append(
            Contender(
                name,
                role_of(name),
                registry.availability(name),
                functools.partial(prepare_backend, op, name),
                backend.counters,
                backend.device_timer,
            )
        )
    for name, mode in DEFAULT_ROWS.items():
        if selected is None or name in selected:
            prepare = functools.partial(prepare_default, op, mode)
            found.append(Contender(name, "ours", availability_of(name), prepare))
    for peer in PEERS.values() if peers else ():
        if op.op in peer.builders and (selected is None or peer.name in selected):
            found.append(Contender(peer.name, "peer", peer.probe(), peer.builders[op.op]))
    return found


def _error_text(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= 160 else text[:157] + "..."


def _run_and_compare(
    op: Workload, contender: Contender, case: Case, expected: Callable[[], Any]
) -> tuple[Prepared, float, Comparison]:
    """Prepares and runs ``case`` once, and compares the result with the reference."""
    prepared = contender.prepare(case)
    out, seconds = timed_call(prepared.call)
    return prepared, seconds, op.compare(prepared.canonical(out), expected())


# -- check ---------------------------------------------------------------------------------


@dataclasses.dataclass
class CheckRow:
    op: str
    case: str
    implementation: str
    mode: str
    status: Status  # ok, fail, error, missing or n/a
    max_error: float | None = None
    tolerance: float | None = None
    detail: str = ""


def check_plan(
    ops: Collection[str], selected: Collection[str] | None
) -> list[tuple[Workload, list[Contender]]]:
    """The backends ``check`` tests per op: all but the reference they are compared with."""
    return [
        (
            WORKLOADS[name],
            [
                c
                for c in contenders(WORKLOADS[name], selected, peers=False)
                if c.role != "reference"
            ],
        )
        for name in ops
    ]


def check(
    ops: Collection[str],
    selected: Collection[str] | None = None,
    *,
    seed: int = 0,
    quick: bool = False,
    progress: Progress | None = None,
) -> list[CheckRow]:
    """Every backend of every op in ``ops`` on the op's random and edge cases (with
    ``quick``, only the op's ``quick_cases``)."""
    rows = []
    plan = []
    for op, backends in check_plan(ops, selected):
        cases = op.check_cases(np.random.default_rng(seed))
        plan.append((op, [c for c in cases if c.name in op.quick_cases or not quick], backends))
    if progress:
        progress.start(sum(len(cases) * len(backends) for _, cases, backends in plan))
    for op, cases, backends in plan:
        expected = [functools.cache(functools.partial(op.expected, case)) for case in cases]
        for contender in backends:
            if contender.mode == "missing":
                rows.append(
                    CheckRow(
                        op.name,
                        "*",
                        contender.name,
                        "missing",
                        "missing",
                        detail=contender.missing_detail(),
                    )
                )
                continue
            for case, want in zip(cases, expected, strict=True):
                if progress:
                    progress.step(f"check {op.name} {case.name} on {contender.name}")
                row = CheckRow(op.name, case.name, contender.name, contender.mode, "ok")
                try:
                    _, _, comparison = _run_and_compare(op, contender, case, want)
                except NotApplicable as reason:
                    row.status, row.detail = "n/a", str(reason)
                except Exception as error:
                    row.status, row.detail = "error", _error_text(error)
                else:
                    row.max_error, row.tolerance = comparison.max_error, comparison.tolerance
                    row.status = "ok" if comparison.passed else "fail"
                rows.append(row)
    return rows


# -- bench ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BenchSettings:
    """What ``bench`` runs and how long it may take.

    ``sizes``: op name -> sizes (the ops to run). ``selected``: backend/peer names, or None
    for all. Each row: ``warmup`` untimed calls after the first (compiling) call, then
    ``repeats`` timed calls cut to fit ``budget_s`` but at least ``min_repeats``. A size
    whose per-call time, extrapolated from the same implementation at a smaller size, would
    exceed ``max_call_s`` is skipped (stated in the row) unless ``force``.
    """

    sizes: dict[str, list[Size]]
    selected: frozenset[str] | None = None
    warmup: int = 1
    repeats: int = 20
    min_repeats: int = 3
    budget_s: float = 2.0
    max_call_s: float = 10.0
    force: bool = False
    seed: int = 0


@dataclasses.dataclass
class BenchRow:
    op: str
    size: str
    params: dict[str, Any]
    implementation: str
    role: Role
    mode: str
    status: Status
    detail: str = ""
    max_error: float | None = None
    tolerance: float | None = None
    checked: str | None = None
    timing: Timing | None = None
    ratio_to_fastest_peer: float | None = None
    counters: dict[str, float] = dataclasses.field(default_factory=dict)


def bench_plan(settings: BenchSettings) -> list[tuple[Workload, list[Size], list[Contender]]]:
    return [
        (
            WORKLOADS[name],
            sorted(sizes, key=WORKLOADS[name].work),
            contenders(WORKLOADS[name], settings.selected),
        )
        for name, sizes in settings.sizes.items()
    ]


def bench(settings: BenchSettings, progress: Progress | None = None) -> list[BenchRow]:
    """Checks, then times, every contender of every op at every size."""
    rows: list[BenchRow] = []
    plan = bench_plan(settings)
    if progress:
        progress.start(sum(len(sizes) * len(group) for _, sizes, group in plan))
    for op, sizes, group in plan:
        history: dict[str, tuple[float, float]] = {}  # contender -> (work, seconds per call)
        for size in sizes:
            case = op.bench_case(size, np.random.default_rng(settings.seed))
            expected = functools.cache(functools.partial(op.expected, case))
            size_rows, alternate = [], []
            for contender in group:
                if progress:
                    progress.step(f"bench {op.name} {size.label} on {contender.name}")
                # The default rows' ratio is the eager target: they are timed together.
                together = contender.name in DEFAULT_ROWS
                row, pending = _bench_one(
                    op, size, case, expected, contender, history, settings, timed=not together
                )
                size_rows.append(row)
                if pending is not None:
                    alternate.append((row, pending))
            _time_alternately(alternate, op.work(size), history, settings)
            _set_ratios(size_rows)
            rows += size_rows
    return rows


def _time_alternately(
    pending: list[tuple[BenchRow, Pending]],
    work: float,
    history: dict[str, tuple[float, float]],
    settings: BenchSettings,
) -> None:
    """Times the checked ``pending`` calls call by call in turn (see
    :func:`~asickernels.benchmarking.timing.measure_alternately`)."""
    if not pending:
        return
    timings = measure_alternately(
        [call for _, (call, _) in pending],
        first_calls_s=[first for _, (_, first) in pending],
        warmup=settings.warmup,
        repeats=settings.repeats,
        min_repeats=settings.min_repeats,
        budget_s=settings.budget_s,
    )
    for (row, _), timing in zip(pending, timings, strict=True):
        row.timing = timing
        history[row.implementation] = (work, timing.median_s)


def _smallest_default(op: Workload) -> Size:
    return min((op.parse_size(s) for s in op.default_sizes), key=op.work)


def _calibrate(op: Workload, contender: Contender, settings: BenchSettings) -> tuple[float, float]:
    """(work, seconds per call) at the op's smallest default size, to judge a larger one."""
    size = _smallest_default(op)
    prepared = contender.prepare(op.bench_case(size, np.random.default_rng(settings.seed)))
    timed_call(prepared.call)  # compiles
    return op.work(size), timed_call(prepared.call)[1]


def _too_slow(
    op: Workload,
    size: Size,
    contender: Contender,
    history: dict[str, tuple[float, float]],
    settings: BenchSettings,
) -> str | None:
    """Why ``size`` is skipped for ``contender``, or None to run it."""
    if settings.force:
        return None
    if contender.name not in history:
        if op.work(size) <= op.work(_smallest_default(op)):
            return None
        history[contender.name] = _calibrate(op, contender, settings)
    work, seconds = history[contender.name]
    estimate = seconds * op.work(size) / work
    if estimate <= settings.max_call_s:
        return None
    return f"~{estimate:.2g} s/call (extrapolated) > --max-call-seconds {settings.max_call_s:g}"


def _bench_one(
    op: Workload,
    size: Size,
    case: Case,
    expected: Callable[[], Any],
    contender: Contender,
    history: dict[str, tuple[float, float]],
    settings: BenchSettings,
    *,
    timed: bool = True,
) -> tuple[BenchRow, Pending | None]:
    """Checks ``contender`` at ``size`` and times it; with ``timed=False`` the checked call
    is returned untimed (with its first call's seconds), for the caller to time."""
    row = BenchRow(
        op.name, size.label, size.params, contender.name, contender.role, contender.mode, "ok"
    )
    if contender.mode == "missing":
        row.status, row.detail = "missing", contender.missing_detail()
        return row, None
    try:
        reason = _too_slow(op, size, contender, history, settings)
        if reason:
            row.status, row.detail = "skipped", reason
            return row, None
        prepared, first_call_s, comparison = _run_and_compare(op, contender, case, expected)
        row.max_error, row.tolerance, row.checked = (
            comparison.max_error,
            comparison.tolerance,
            comparison.checked,
        )
        history[contender.name] = (op.work(size), first_call_s)
        if not comparison.passed:
            row.status, row.detail = "fail", "wrong result: not timed"
            return row, None
        if not timed:
            return row, (prepared.call, first_call_s)
        if contender.device_timer is not None and contender.mode == "native":
            row.timing = contender.device_timer(op.name, case, settings.warmup, settings.repeats)
        else:
            row.timing = measure(
                prepared.call,
                first_call_s=first_call_s,
                warmup=settings.warmup,
                repeats=settings.repeats,
                min_repeats=settings.min_repeats,
                budget_s=settings.budget_s,
            )
        history[contender.name] = (op.work(size), row.timing.median_s)
    except NotApplicable as reason:
        row.status, row.detail, row.timing = "n/a", str(reason), None
        return row, None
    except Exception as error:
        row.status, row.detail, row.timing = "error", _error_text(error), None
        return row, None
    if contender.counters is not None:
        try:
            row.counters = dict(contender.counters())
        except Exception as error:  # counters are extra information: keep the timing
            row.detail = f"counters unavailable: {_error_text(error)}"
    return row, None


def _set_ratios(rows: list[BenchRow]) -> None:
    peer_times = [r.timing.median_s for r in rows if r.role == "peer" and r.timing is not None]
    if not peer_times:
        return
    fastest = min(peer_times)
    for row in rows:
        if row.timing is not None and fastest > 0:
            row.ratio_to_fastest_peer = row.timing.median_s / fastest
