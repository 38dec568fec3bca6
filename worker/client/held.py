"""What a worker holds, shared by its two threads under one Condition, and which of it to run.

The link thread (link.py) fills the inbox and empties the outbox; the main thread
(worker_client.py) moves tasks from the inbox to running and their results to the outbox. Every
field is read and written with `wake` held, and whoever changes one wakes the other thread.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from neuro.wire import MAX_TASKS_PER_LEASE
from worker.client.wire import LeasedTask

if TYPE_CHECKING:
    from neuro.v1.evolution_pb2 import TaskResult

MAX_UNSUPPORTED_ENVS = 16
"""Env ids a lease request names as unbuildable here, the most recent ones."""


@dataclass
class HeldTasks:
    """The tasks a worker holds, from lease to report, and the run's end as it has heard it."""

    slots: int
    """Episodes (per-genome) or env slots (batched) the runner plays at once."""
    prefetch: int
    """Tasks held beyond those that can run now, so no round trip idles a slot."""
    batched: bool
    """The runner plays tasks of different genomes together (worker.runners.batched)."""
    wake: threading.Condition = field(default_factory=threading.Condition)
    inbox: deque[LeasedTask] = field(default_factory=deque)
    """Leased, not started."""
    running: dict[str, LeasedTask] = field(default_factory=dict)
    outbox: list[TaskResult] = field(default_factory=list)
    """Finished, not yet reported."""
    cancelled: list[str] = field(default_factory=list)
    """Running tasks the master dropped, for the main thread to abandon."""
    abandoned: list[str] = field(default_factory=list)
    """Dropped on stop, for the link thread to hand back."""
    run_complete: bool = False
    fatal: str | None = None
    """Why the worker must stop (a refused token, an env no task of this run can run on)."""
    unsupported_envs: dict[str, None] = field(default_factory=dict)
    """Env ids that failed to build here, oldest first (a dict: an ordered set)."""
    refusal: tuple[str, str] | None = None
    """(run id, why): every task of that run is refused here, since a module it needs cannot
    be imported; lease requests say so, and its tasks are handed back, not failed."""

    def room(self) -> int:
        """How many more tasks to lease: the slots that can run now plus `prefetch` waiting."""
        if self.run_complete or self.fatal:
            return 0
        held = [*self.inbox, *self.running.values()]
        # Lease wide only while everything held is several episodes of one genome (an elite's
        # re-evaluation); hoarding tasks of many genomes would run them one after another and
        # leave other workers idle at the end of the phase.
        re_evaluation = len(held) > 1 and len({t.genome_key for t in held}) == 1
        width = self.slots if re_evaluation or self.batched else 1
        return min(width + self.prefetch - len(held), MAX_TASKS_PER_LEASE)

    def take_startable(self, free: int) -> list[LeasedTask]:
        """Moves the tasks to start now from the inbox to running: with slots busy, only more
        episodes of a running genome.

        Episodes of one genome share a batched forward pass; episodes of different genomes
        would each stream their own weights and slow every step (measured: 1.2 -> 1.6 ms per
        forward of the 4M network with 8 genomes in flight), so those wait their turn.
        """
        inbox, running = self.inbox, self.running
        if self.batched:  # one forward pass covers every slot, whatever its genome
            starting = [inbox.popleft() for _ in range(min(free, len(inbox)))]
            for task in starting:
                running[task.task_id] = task
            return starting
        genomes = {t.genome_key for t in running.values()}
        starting = []
        for task in list(inbox):
            if len(starting) == free:
                break
            key = task.genome_key
            if not genomes:
                genomes.add(key)
            if key in genomes:
                inbox.remove(task)
                running[task.task_id] = task
                starting.append(task)
        return starting

    def held_tasks(self) -> list[LeasedTask]:
        """Every task leased and not reported: waiting or running."""
        return [*self.inbox, *self.running.values()]

    def idle(self) -> bool:
        with self.wake:
            return not self.inbox and not self.running

    def fail(self, reason: str) -> None:
        """Stops the worker: it hands back what it holds and exits with `reason`."""
        with self.wake:
            self.fatal = reason
            self.wake.notify_all()

    def refuse(self, run_id: str, reason: str) -> None:
        """Refuses every task of `run_id`: those held and not playing go to `abandoned`, for the
        link thread to hand back, and lease requests carry the refusal from now on."""
        with self.wake:
            self.refusal = (run_id, reason)
            for task in [t for t in self.inbox if t.run_id == run_id]:
                self.inbox.remove(task)
                self.abandoned.append(task.task_id)
            self.wake.notify_all()

    def refuses(self, run_id: str) -> bool:
        with self.wake:
            return self.refusal is not None and self.refusal[0] == run_id

    def give_back(self, task_id: str) -> None:
        """A task taken to start that will not run here: handed back by the link thread."""
        with self.wake:
            if self.running.pop(task_id, None) is not None:
                self.abandoned.append(task_id)
            self.wake.notify_all()

    def note_unsupported(self, env_id: str) -> None:
        """Remembers an env that failed to build here; the next lease asks for other runs'."""
        with self.wake:
            unsupported = self.unsupported_envs
            unsupported.pop(env_id, None)
            unsupported[env_id] = None
            while len(unsupported) > MAX_UNSUPPORTED_ENVS:
                del unsupported[next(iter(unsupported))]
