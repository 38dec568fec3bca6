"""The run's end as workers hear it: the flag they are answered, and the master's linger.

Remote workers learn that a run is complete only by calling (or over their presence call), so
after the run the master keeps answering for a bounded while, until every worker seen lately
has been told. Who has been told is master.fleet.roster's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from master.fleet.roster import WorkerRoster

RUN_COMPLETE_GRACE_S = 10.0
"""After the run, how long past a worker's heartbeat interval the master keeps answering, so
that busy or backing-off workers still hear the run is complete (worker.client paces
heartbeats at a quarter lease, at most 300 s, and backs off at most 5 s)."""


class RunCompletion:
    """Whether the run is complete, and the wait for its workers to hear it."""

    def __init__(
        self, roster: WorkerRoster, lease_seconds: float, clock: Callable[[], float]
    ) -> None:
        self._roster = roster
        self._lease_seconds = lease_seconds
        self._clock = clock
        self._complete = False
        self._completed = asyncio.Event()

    @property
    def complete(self) -> bool:
        return self._complete

    def mark(self) -> None:
        """The run is complete: from now on every worker that calls is told so."""
        self._complete = True
        self._completed.set()

    async def wait(self) -> None:
        """Returns once the run is complete."""
        await self._completed.wait()

    def told(self, worker_id: str) -> None:
        """This worker was answered that the run is complete."""
        self._roster.told_complete(worker_id)

    @property
    def grace_s(self) -> float:
        """How long after the run the master keeps answering, for workers to hear it is over."""
        heartbeat_s = min(self._lease_seconds / 4, 300.0)
        return heartbeat_s + RUN_COMPLETE_GRACE_S

    async def linger(self, poll_s: float = 0.05) -> None:
        """Returns when every worker seen lately has been told the run is complete.

        Remote workers learn it only by calling, and one whose master is gone retries forever
        (--give-up-after 0). A worker silent for grace_s is taken to be gone; the wait never
        exceeds grace_s.
        """
        grace = self.grace_s
        deadline = self._clock() + grace
        while self._clock() < deadline and self._roster.untold(self._clock(), grace):
            await asyncio.sleep(poll_s)
