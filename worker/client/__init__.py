"""The worker's link with its master: lease tasks, run them, report, hand back on stop.

The parts, each one job: wire.py (a leased Task -> plain values, once; an evaluation -> a
TaskResult), held.py (what the worker holds, under one Condition, and which of it starts
next), link.py (the link thread's calls), presence.py (the Attach call), stats.py (counters and
the stats file); worker_client.py composes them and plays the episodes on the main thread.
"""

from __future__ import annotations

from worker.client.stats import WorkerCounters
from worker.client.worker_client import WorkerClient

__all__ = ["WorkerClient", "WorkerCounters"]
