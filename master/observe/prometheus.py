"""Prometheus /metrics for a running master: the run's snapshot, read at scrape time.

A master serving a study adds a series per run, labelled run="<name>" (neuro_study_run_*), the
runs counted by state and the fleet's utilisation, beside the fleet-wide figures; a single
run's metrics are the same names as ever, without them.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple, Protocol, TypeVar
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)

from master.observe.events import RUN_STATES, RunSnapshot, RunView, StudyView

SCRAPE_TIMEOUT_S = 5.0
"""How long a scrape waits for the event loop; a loop stuck longer fails the scrape."""
STOP_TIMEOUT_S = 5.0


class Snapshots(Protocol):
    """What can say where the run stands: master.run.trainer.Trainer is one. A protocol, so
    that this room, below the loop's, imports nothing of it, not even for annotations."""

    def snapshot(self, workers: bool = False) -> RunSnapshot:
        """Where the run stands; `workers`: with the per-worker table."""
        ...


class StudyReading(NamedTuple):
    """A study's runs and the fleet's utilisation, read together at one scrape."""

    runs: tuple[RunView, ...]
    utilisation: float | None


Read = TypeVar("Read")


def snapshot_on_loop(
    loop: asyncio.AbstractEventLoop, read: Callable[[], Read]
) -> Callable[[], Read]:
    """A reader for other threads that runs `read` on `loop` and waits for it.

    The fleet and trainer are only ever changed on the loop, and reading them from another
    thread could see a table half-updated (or a dict changing size mid-iteration). Running the
    read on the loop gives a consistent picture as of the scrape, costs nothing while nobody
    scrapes (unlike a copy refreshed every second), and a loop that stops answering shows up
    as failed scrapes rather than as figures that look fine but no longer move.
    """

    async def on_loop() -> Read:
        return read()

    def read_from_thread() -> Read:
        future = asyncio.run_coroutine_threadsafe(on_loop(), loop)
        try:
            return future.result(SCRAPE_TIMEOUT_S)
        except TimeoutError:
            future.cancel()
            raise TimeoutError(
                f"the master's event loop did not answer within {SCRAPE_TIMEOUT_S:g} s"
            ) from None

    return read_from_thread


class StatusCollector:
    """Turns each scrape's RunSnapshot (worker table included) into metric families neuro_*,
    and a study's runs, where there is one, into neuro_study_* and neuro_fleet_utilisation."""

    def __init__(
        self,
        snapshot: Callable[[], RunSnapshot],
        study: Callable[[], StudyReading] | None = None,
    ) -> None:
        self._snapshot = snapshot
        self._study = study

    def describe(self) -> list[Metric]:
        # Nothing up front: the registry would otherwise call collect() while registering,
        # on the loop thread, which then waits on itself.
        return []

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        yield InfoMetricFamily(
            "neuro_run", "The run this master serves.", value={"run_id": s.run_id, "env": s.env_id}
        )
        yield _gauge("neuro_generation", "Generations completed.", s.generation)
        yield CounterMetricFamily(
            "neuro_frames", "Emulator frames of recorded evaluations.", value=s.frames
        )
        yield CounterMetricFamily("neuro_evaluations", "Episodes recorded.", value=s.evaluations)
        yield _gauge(
            "neuro_elite_score",
            "The elite's mean over its re-evaluation episodes (NaN before the first).",
            s.elite_score,
        )
        record = s.last_record
        if record is not None:
            yield _gauge(
                "neuro_score_max", "Best training score of the last generation.", record.score_max
            )
            yield _gauge(
                "neuro_score_mean",
                "Mean training score of the last generation.",
                record.score_mean,
            )
        yield _gauge(
            "neuro_workers_connected", "Workers that called in the last minute.", s.workers
        )
        yield _gauge("neuro_tasks_pending", "Tasks of this phase waiting.", s.tasks_pending)
        yield _gauge("neuro_tasks_leased", "Tasks of this phase out on lease.", s.tasks_leased)
        yield _gauge("neuro_tasks_done", "Tasks of this phase recorded.", s.tasks_done)
        yield CounterMetricFamily(
            "neuro_leases_reissued", "Lapsed leases handed out again.", value=s.leases_reissued
        )
        yield _gauge("neuro_run_complete", "1 once the budget is spent.", int(s.run_complete))
        # One series per worker the master still remembers: forgotten workers (silent for
        # FORGET_WORKER_AFTER_S) simply stop appearing, which bounds the label cardinality.
        per_worker = (
            ("tasks_leased", "Tasks this worker holds leases on."),
            ("frames_per_second", "Accepted frames per second over the last minute."),
            ("seconds_since_contact", "Seconds since this worker last called."),
            ("tasks_failed", "Tasks this worker reported failed."),
            ("held_off_s", "Seconds this worker is still given no task for, having failed "
             "every task it got lately (0: it is given tasks)."),
        )  # fmt: skip
        for field, documentation in per_worker:
            family = GaugeMetricFamily(f"neuro_worker_{field}", documentation, labels=["worker"])
            for worker in s.worker_status:
                family.add_metric([worker.worker_id], getattr(worker, field))
            yield family
        if self._study is not None:
            yield from study_families(*self._study())


def study_families(runs: Sequence[RunView], utilisation: float | None) -> Iterator[Metric]:
    """A study's metric families: the fleet's utilisation, the runs by state, a series per run.

    Only runs that started in this master process have figures (a snapshot); every run has
    its info and its state. A study has at most 1,000 runs, which bounds the label values.
    """
    yield _gauge(
        "neuro_fleet_utilisation",
        "The fleet's busy fraction over a recent window: worker-seconds on tasks over workers "
        "x wall time (NaN when unknown).",
        math.nan if utilisation is None else utilisation,
    )
    counts = GaugeMetricFamily("neuro_study_runs", "The study's runs in each state.",
                               labels=["state"])  # fmt: skip
    for state in RUN_STATES:
        counts.add_metric([state], sum(run.state == state for run in runs))
    yield counts
    info = InfoMetricFamily("neuro_study_run", "A run of the study.",
                            labels=["run", "env", "seed", "label"])  # fmt: skip
    states = GaugeMetricFamily("neuro_study_run_state", "1 for the state the run is in, else 0.",
                               labels=["run", "state"])  # fmt: skip
    for run in runs:
        info.add_metric([run.name, run.env_id, str(run.seed), run.label], {})
        for state in RUN_STATES:
            states.add_metric([run.name, state], int(run.state == state))
    yield info
    yield states
    served = [(run.name, run.snapshot) for run in runs if run.snapshot is not None]
    per_run = (
        ("generation", "Generations completed.", lambda s: s.generation),
        ("elite_score", "The elite's mean over its re-evaluation episodes (NaN before the "
         "first).", lambda s: s.elite_score),
    )  # fmt: skip
    for field, documentation, value in per_run:
        family = GaugeMetricFamily(f"neuro_study_run_{field}", documentation, labels=["run"])
        for name, snapshot in served:
            family.add_metric([name], value(snapshot))
        yield family
    frames = CounterMetricFamily("neuro_study_run_frames", "Emulator frames of the run's "
                                 "recorded evaluations.", labels=["run"])  # fmt: skip
    for name, snapshot in served:
        frames.add_metric([name], snapshot.frames)
    yield frames
    mean = GaugeMetricFamily("neuro_study_run_score_mean",
                             "Mean training score of the run's last generation.",
                             labels=["run"])  # fmt: skip
    for name, snapshot in served:
        if snapshot.last_record is not None:
            mean.add_metric([name], snapshot.last_record.score_mean)
    yield mean


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


class MetricsServer:
    """An HTTP thread serving /metrics from a private registry."""

    def __init__(self, server: WSGIServer, thread: threading.Thread, host: str) -> None:
        self._server = server
        self._thread = thread
        self.host = host
        self.port: int = server.server_port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    async def close(self) -> None:
        """Stops serving; waits (bounded) off the loop, so a scrape in flight can finish."""

        def stop() -> None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(STOP_TIMEOUT_S)

        await asyncio.to_thread(stop)


def start_metrics_server(
    trainer: Snapshots, host: str, port: int, study: StudyView | None = None
) -> MetricsServer:
    """Serves the trainer's figures on http://host:port/metrics; call it on the trainer's loop.

    `study`: a study's runs, served beside them. OSError, naming the address, if it cannot
    listen there. Port 0 picks a free one.
    """
    loop = asyncio.get_running_loop()
    read = snapshot_on_loop(loop, lambda: trainer.snapshot(workers=True))
    read_study = None
    if study is not None:
        read_study = snapshot_on_loop(loop, lambda: StudyReading(study.runs(), study.utilisation()))
    # A registry of its own: several masters (tests) can serve side by side, and the
    # process-wide default metrics (GC, process) stay out of the run's figures.
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(read, read_study))
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as error:
        reason = error.strerror or str(error)
        raise OSError(f"could not serve metrics on {host}:{port}: {reason}") from None
    return MetricsServer(server, thread, host)
