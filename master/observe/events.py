"""What the training loop tells its observers: a generation's record, a snapshot, the events.

The loop (master.run.trainer) speaks these plain types; progress, TensorBoard, Prometheus,
status.json and the gRPC Status call read them, and only the gRPC edge (master.fleet.service)
turns a snapshot into protobuf. They live here, below master.run, so that observers never
import the loop they watch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from master.fleet.roster import WorkerStats
from neuro.runfiles import seeds_sha256


@dataclass(frozen=True)
class GenerationRecord:
    """One line of metrics.jsonl: at most 730 bytes for the GA (ES: 840; GA-NS: 890; NS-ES:
    1040), whatever the generation.

    The elite's seed list grows by a seed a generation, so the line names it by sha256 and
    length (elite_sha256, elite_length); the list is in the run dir's genomes/<sha256>.json.
    The bound is the line with every counter at 2**63 - 1 and every figure at the longest
    float JSON writes (a CartPole run's lines are about 340 bytes); the ES's theta_rank,
    population and grad_norm add at most 110 bytes.
    """

    generation: int
    frames: int
    """Cumulative emulator frames, training and elite re-evaluation episodes alike."""
    evaluations: int
    """Cumulative episodes recorded."""
    wall_s: float
    score_mean: float
    score_max: float
    elite_score: float
    elite_seeds: list[int]
    """In memory only: the line carries elite_sha256 and elite_length instead."""
    generation_evaluations: int
    generation_frames: int
    failed_evaluations: int
    leases_reissued: int
    tail_s: float = 0.0
    """Seconds from each phase's last fresh lease (of a task never leased before, or handed
    out again) to its end, summed over the generation's phases: the time it waited on its
    slowest tasks."""
    backup_tasks: int = 0
    """Backup copies of in-flight tasks leased to idle workers at the phases' ends."""
    backup_wins: int = 0
    """Tasks whose recorded result came from their backup copy."""
    workers_lost: int = 0
    """Workers whose connection closed while they held leases, which were ended at once."""
    worker_s: float = 0.0
    """Cumulative seconds workers spent on the run's accepted results (each as the worker
    measured it, bounded by its lease's age), across restarts: the run's worker-seconds."""
    extra: dict[str, Any] = field(default_factory=dict)
    """The algorithm's own figures (ES: theta_rank, ...), written beside the common ones."""

    @property
    def elite_sha256(self) -> str | None:
        """The name of the elite's genome file (genomes/<sha256>.json); None without an elite."""
        return seeds_sha256(self.elite_seeds) if self.elite_seeds else None

    def to_json(self) -> str:
        """The metrics.jsonl line (no newline)."""
        fields: dict[str, Any] = {}
        for name, value in self.__dict__.items():
            if name == "elite_seeds":
                fields.update(elite_sha256=self.elite_sha256, elite_length=len(value))
            elif name != "extra":
                fields[name] = value
        return json.dumps({k: _finite_or_none(v) for k, v in {**fields, **self.extra}.items()})


@dataclass(frozen=True)
class RunSnapshot:
    """Where a run stands at one moment: what Status, /metrics, status.json and progress show."""

    run_id: str
    env_id: str
    generation: int
    """Generations completed."""
    phase: str
    frames: int
    evaluations: int
    elite_score: float
    """NaN before the first elite, or when the last one could not be scored."""
    elite_seeds: tuple[int, ...]
    """The elite genome's seeds; empty when there is none (or the algorithm has no genome)."""
    tasks_pending: int
    tasks_leased: int
    tasks_done: int
    workers: int
    """Workers that called in the last minute."""
    leases_reissued: int
    run_complete: bool
    wall_s: float
    """Seconds trained, across restarts."""
    last_record: GenerationRecord | None = None
    worker_status: tuple[WorkerStats, ...] = ()
    """Per-worker figures; empty unless the snapshot was taken with the worker table."""
    worker_s: float = 0.0
    """Seconds workers spent on the run's accepted results so far, across restarts."""


RunState = Literal["queued", "running", "complete", "failed"]
QUEUED: RunState = "queued"
RUNNING: RunState = "running"
COMPLETE: RunState = "complete"
FAILED: RunState = "failed"
RUN_STATES: tuple[RunState, ...] = (QUEUED, RUNNING, COMPLETE, FAILED)
"""A study's run states, as study.json (master.study.studydir), the live view and Status
name them."""
"""A study's run: waiting its turn, being served, its budget spent and tested, or stopped by an
error (study.json records the same words)."""


@dataclass(frozen=True)
class RunView:
    """One run of a study as its watchers see it: who it is, its state, where it stands."""

    name: str
    env_id: str
    seed: int
    label: str
    state: RunState
    snapshot: RunSnapshot | None
    """Where the run stands; None until it started (in this master process)."""
    error: str = ""
    """Why a failed run failed; empty otherwise."""


class StudyView(Protocol):
    """What the watchers of a study read: each run, and how busy the fleet is.

    Read on the event loop, whenever a watcher redraws or is asked; each call answers as of now.
    """

    def runs(self) -> tuple[RunView, ...]:
        """Every run of the study, in the study file's order."""
        ...

    def utilisation(self) -> float | None:
        """The fleet's busy fraction (worker-seconds / (workers x wall)) over a recent window;
        None when unknown (no worker yet, or too little time to tell)."""
        ...


class Observer:
    """Told what the run does; each method runs on the event loop and must return at once."""

    def started(self, snapshot: Callable[[], RunSnapshot]) -> None:
        """The run starts training (or resumes); `snapshot()` reads where it stands, at any time."""

    def generation(self, record: GenerationRecord, workers: int) -> None:
        """A generation is over, and its metrics line and checkpoint are on disk."""

    def checkpointed(self) -> None:
        """A checkpoint is on disk: after a generation, periodically, or at the end."""

    def stopped(self) -> None:
        """The run stopped training: budget spent, cancelled or failed."""


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
