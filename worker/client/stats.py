"""What a worker says about itself: its counters, and the stats file (--stats-file) that holds
them with the time breakdown, replaced every few seconds."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuro.allocator import this_process_allocator
from worker.play.rollout import StepTimers

log = logging.getLogger(__name__)


@dataclass
class WorkerCounters:
    tasks_done: int = 0
    tasks_failed: int = 0
    tasks_dropped: int = 0
    frames: int = 0
    reconnects: int = 0


def worker_stats(
    worker_id: str, slots: int, evaluator: Any, counters: WorkerCounters, timers: StepTimers
) -> dict:
    """Counters and the time breakdown so far, and what this worker runs on."""
    return {"worker_id": worker_id, "slots": slots, "time": time.monotonic(),
            "atari_backend": getattr(evaluator, "atari_backend", "gym"),
            "inference_engine": getattr(evaluator, "inference_engine", "torch"),
            # What each kind of policy ran on ("deepga/int8-static": "onnxruntime").
            "inference_engines": dict(getattr(evaluator, "engines_used", {})),
            "allocator": this_process_allocator(),
            **counters.__dict__, **timers.as_dict()}  # fmt: skip


class StatsFile:
    """A JSON file of a worker's stats, replaced atomically: a reader never sees half of it."""

    def __init__(self, path: str, worker_id: str) -> None:
        self.path = Path(path)
        self.worker_id = worker_id
        self._failing = False
        """The last write failed (its warning is given): the next failure is quiet."""

    def write(self, stats: dict) -> bool:
        """Replaces the file with `stats`; False (and a warning) if the disk refuses: the stats
        are a report, never a reason to stop working."""
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            tmp.write_text(json.dumps(stats, indent=2))
            os.replace(tmp, self.path)
        except OSError as error:
            # Once per outage, not every 5 s while a disk stays full.
            report = log.debug if self._failing else log.warning
            report("worker %s: cannot write stats file %s: %s", self.worker_id, self.path,
                   error.strerror or error)  # fmt: skip
            self._failing = True
            return False
        self._failing = False
        return True
