"""Who asks for work: each worker's share of a phase's tasks, and how long an idle one waits.

The workers that asked for work lately (not those that only watch or report) and the tasks
they ask for together are counted at most once a second; the count sets the lease table's
share per worker and spreads the polls of a big fleet's idle workers over time. Pure
bookkeeping: time comes in as an argument.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import KeysView

from master.fleet.roster import WORKER_SEEN_WINDOW_S

IDLE_POLLS_PER_S = 1000.0
"""Empty Lease calls a whole fleet makes per second, about: a worker that got nothing waits
longer the bigger the fleet (10,000 workers: 10 s each, jittered), so that idle workers at a
phase's end do not swamp the master's one core, while enough of them still call each second
that new tasks and backup copies go out at once."""
FLEET_SIZE_REFRESH_S = 1.0
"""How often the fleet's size (for each worker's share of a phase's tasks) is counted again."""


class LeasePacing:
    """The workers asking for work in the last WORKER_SEEN_WINDOW_S seconds, counted."""

    def __init__(self, retry_after_ms: int, max_askers: int) -> None:
        self._base_ms = retry_after_ms
        self._max_askers = max_askers
        self._askers: OrderedDict[str, tuple[float, int]] = OrderedDict()
        """When each worker last asked for work and for how many tasks, most recent last (at
        most max_askers)."""
        self._counted_at, self._count, self._slots = -float("inf"), 0, 0
        self._jitter = random.Random()

    def asked(self, worker_id: str, max_tasks: int, now: float) -> int:
        """Notes a worker's lease call; returns how many tasks the askers ask for together."""
        self._askers[worker_id] = (now, max_tasks)
        self._askers.move_to_end(worker_id)
        if len(self._askers) > self._max_askers:
            self._askers.popitem(last=False)
        if now - self._counted_at >= FLEET_SIZE_REFRESH_S or now < self._counted_at:
            self._counted_at, horizon = now, now - WORKER_SEEN_WINDOW_S
            while self._askers and next(iter(self._askers.values()))[0] < horizon:
                self._askers.popitem(last=False)
            self._count = len(self._askers)
            self._slots = sum(slots for _, slots in self._askers.values())
        return self._slots

    def askers(self) -> KeysView[str]:
        """The workers that asked for work lately (a live view, oldest first)."""
        return self._askers.keys()

    def forget(self, worker_id: str) -> None:
        """This worker is gone or held off: it no longer counts as one that can take work."""
        self._askers.pop(worker_id, None)

    def retry_after_ms(self) -> int:
        """How long a worker that got no task waits before it asks again."""
        base = self._base_ms
        spread = self._count * 1000.0 / IDLE_POLLS_PER_S
        if spread <= base:
            return base
        # Jittered: the fleet's polls spread evenly over time, not in waves.
        return int(spread * self._jitter.uniform(0.5, 1.5))
