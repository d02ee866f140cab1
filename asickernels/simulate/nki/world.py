"""The physical NeuronCores of one simulated launch and how they meet.

A launch runs ``ranks`` ranks (``nki.multi_rank_simulate``'s ``world_size``; 1 for a plain
kernel call), each on ``lnc`` physical cores (the LNC degree, ``kernel[2]``), every core a
thread running the same kernel. Cores wait for each other only in a *meeting*: a
collective (``nki.collectives``), an exchange between the two cores of a rank
(``nki.lnc.sendrecv``) or a barrier (``nki.lnc.core_barrier``). Each participant posts its
call under one key; when all have posted, every one reads all the calls, which must agree.

What a device would do silently or never finish, the simulator reports at once, naming the
cores and their calls: participants that disagree (another collective, other sizes), and
the moment every core still running waits in a meeting that cannot complete (a deadlock,
or a core that finished the kernel without arriving). No timeouts: a waiting core is woken
by every change, so the check is exact.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Hashable, Sequence
from typing import Any

from asickernels.simulate.nki import errors, runtime

Core = tuple[int, int]  # (rank, physical core of the rank, i.e. nl.program_id())


@dataclasses.dataclass(frozen=True)
class Call:
    """One participant's side of a meeting: ``detail`` describes it in errors, ``signature``
    is what every participant must agree on, ``payload`` the data it contributes."""

    detail: str
    signature: Hashable
    payload: Any = None


class PeerFailed(Exception):
    """This core stopped waiting because another core of the launch failed (the launcher
    reports that core's error instead)."""


@dataclasses.dataclass
class _Meeting:
    what: str  # e.g. "all_reduce #0 of rank-list [0, 1]"
    participants: tuple[Core, ...]
    calls: dict[Core, Call] = dataclasses.field(default_factory=dict)
    readers: int = 0

    @property
    def complete(self) -> bool:
        return len(self.calls) == len(self.participants)


class World:
    """Every core of one launch: ``ranks`` ranks of ``lnc`` cores, each rank its own HBM
    (:class:`~asickernels.simulate.nki.runtime.Launch`)."""

    def __init__(self, ranks: int, lnc: int) -> None:
        self.ranks = ranks
        self.lnc = lnc
        self.launches = [runtime.Launch(lnc, rank, self) for rank in range(ranks)]
        self._changed = threading.Condition()
        self._meetings: dict[Hashable, _Meeting] = {}
        self._waiting: dict[Core, Hashable] = {}  # core -> key of the meeting it waits in
        self._stopped: dict[Core, str] = {}  # core -> "finished the kernel" / "failed"
        self._failure: BaseException | None = None

    @staticmethod
    def of(run: runtime.Run) -> World:
        """The world ``run`` belongs to; a run started outside a launch (the legacy API, a
        bare ``runtime.start_run``) is a world of its own."""
        launch = run.launch
        if launch.world is None:
            world = World(1, launch.cores)
            world.launches = [launch]
            launch.world = world
        world = launch.world
        assert isinstance(world, World)
        return world

    def name(self, core: Core) -> str:
        rank, program = core
        rank_part = f"rank {rank}" if self.ranks > 1 else ""
        core_part = f"core {program}" if self.lnc > 1 else ""
        return " ".join(p for p in (rank_part, core_part) if p) or "the core"

    def meet(
        self, core: Core, key: Hashable, what: str, participants: Sequence[Core], call: Call
    ) -> dict[Core, Call]:
        """Posts ``call`` as ``core``'s side of the meeting ``key`` (described by ``what``)
        among ``participants`` and waits for all of theirs; returns every participant's call.
        Raises :class:`~asickernels.simulate.nki.errors.CollectiveMismatch` when the calls
        disagree, :class:`~asickernels.simulate.nki.errors.CollectiveDeadlock` when no core
        can proceed, :class:`PeerFailed` when another core failed."""
        participants = tuple(participants)
        with self._changed:
            if self._failure is not None:
                raise PeerFailed
            meeting = self._meetings.setdefault(key, _Meeting(what, participants))
            if meeting.participants != participants:
                raise errors.CollectiveMismatch(
                    f"{self.name(core)} joins {what} with participants "
                    f"{self._names(participants)}, where "
                    f"{self._names(tuple(meeting.calls))} joined it with "
                    f"{self._names(meeting.participants)}"
                )
            meeting.calls[core] = call
            self._waiting[core] = key
            self._changed.notify_all()
            try:
                while not meeting.complete:
                    if self._failure is not None:
                        raise PeerFailed
                    if self._all_stuck():
                        self._fail_locked(errors.CollectiveDeadlock(self._deadlock_report()))
                        raise self._failure  # type: ignore[misc]
                    self._changed.wait()
            finally:
                del self._waiting[core]
            meeting.readers += 1
            if meeting.readers == len(participants):
                del self._meetings[key]
            calls = dict(meeting.calls)
        self._check_agreement(meeting.what, calls)
        return calls

    def finish(self, core: Core) -> None:
        """``core`` returned from the kernel."""
        with self._changed:
            self._stopped[core] = "finished the kernel"
            self._changed.notify_all()

    def fail(self, core: Core, error: BaseException) -> None:
        """``core`` raised ``error``: the waiting cores stop (:class:`PeerFailed`)."""
        with self._changed:
            self._stopped[core] = "failed"
            if not isinstance(error, PeerFailed):
                self._fail_locked(error)
            self._changed.notify_all()

    def _fail_locked(self, error: BaseException) -> None:
        if self._failure is None:
            self._failure = error
        self._changed.notify_all()

    def _all_stuck(self) -> bool:
        """Every core still running waits in a meeting that is not complete."""
        running = [
            (rank, program)
            for rank in range(self.ranks)
            for program in range(self.lnc)
            if (rank, program) not in self._stopped
        ]
        return all(
            core in self._waiting and not self._meetings[self._waiting[core]].complete
            for core in running
        )

    def _deadlock_report(self) -> str:
        lines = []
        for core, key in sorted(self._waiting.items()):
            meeting = self._meetings[key]
            missing = [p for p in meeting.participants if p not in meeting.calls]
            whereabouts = "; ".join(
                f"{self.name(p)}, which {self._whereabouts(p)}" for p in missing
            )
            lines.append(
                f"{self.name(core)} waits in {meeting.what}, {meeting.calls[core].detail}, "
                f"for {whereabouts}"
            )
        return "no core can proceed: " + " | ".join(lines)

    def _whereabouts(self, core: Core) -> str:
        if core in self._stopped:
            return f"{self._stopped[core]} without reaching it"
        return f"waits in {self._meetings[self._waiting[core]].what}"

    def _check_agreement(self, what: str, calls: dict[Core, Call]) -> None:
        if len({call.signature for call in calls.values()}) > 1:
            listed = "; ".join(f"{self.name(core)}: {call.detail}" for core, call in calls.items())
            raise errors.CollectiveMismatch(f"the participants of {what} disagree: {listed}")

    def _names(self, cores: tuple[Core, ...]) -> str:
        return "[" + ", ".join(self.name(core) for core in cores) + "]"
