"""Workers' presence calls (service.Attach): who is attached, and when every call is to end.

A worker holds one Attach call open while it runs; the call ending (its process killed, its
host or network lost) is how the master learns at once that the worker is gone, instead of
when its leases lapse. Pure bookkeeping: the gRPC edge holds the calls themselves.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import KeysView

MAX_ATTACHED = 20_000
"""Workers whose presence (service.Attach) is watched at once; more are refused and fall back
on their leases lapsing."""


class Presence:
    """The live presence call of each attached worker (the newest, if it reconnected)."""

    def __init__(self, max_attached: int = MAX_ATTACHED) -> None:
        self.max_attached = max_attached
        self._attached: dict[str, int] = {}
        """worker id -> the token of its live Attach call."""
        self._tokens = itertools.count(1)
        self._closed = asyncio.Event()

    def __len__(self) -> int:
        return len(self._attached)

    def workers(self) -> KeysView[str]:
        """The ids of the workers attached now (a live view: sized and searched in O(1))."""
        return self._attached.keys()

    def attach(self, worker_id: str) -> int | None:
        """A worker's presence call opened: a token for detach(), None if too many are open."""
        if worker_id not in self._attached and len(self._attached) >= self.max_attached:
            return None
        token = self._attached[worker_id] = next(self._tokens)
        return token

    def detach(self, worker_id: str, token: int) -> bool:
        """A worker's presence call ended; True if it was the worker's live one (the worker is
        then gone), False if a newer call of the same worker replaced it."""
        if self._attached.get(worker_id) != token:
            return False
        del self._attached[worker_id]
        return True

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self) -> None:
        """The master is stopping: every presence call is to end now."""
        self._closed.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()
