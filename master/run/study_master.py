"""Serves a study: one gRPC server, one Fleet and the StudyRunner on it, with the companions a
single run's master has (local workers, /metrics) and its signals and exit statuses."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from master.fleet.auth import BoundedHealthServicer
from master.fleet.fleet import Fleet
from master.fleet.service import EvolutionService, add_to_server
from master.observe.events import RunState
from master.observe.progress import is_terminal, notice_stream
from master.run.local_workers import LOG_FILE as LOCAL_WORKERS_LOG
from master.run.local_workers import LocalWorkers
from master.run.start import (
    IN_USE,
    SHUTDOWN_GRACE_S,
    Companions,
    RunOptions,
    ServeOptions,
    announce_local_workers,
    bind_port,
    cancel_on_signals,
    port_in_use,
    raise_if_unfinished,
    raise_open_file_limit,
    serving_server,
    shut_down,
    stop_server,
)
from master.run.study import StudyOptions, StudyRunner, StudyRunPlan, StudyStates
from master.run.study_mirror import StudyMirror
from neuro.wire import SERVICE_NAME

STUDY_END = "every run of the study was complete"
STUDY_RESUME = "its study dir holds every run's checkpoint: the same command resumes the study"


@dataclass
class StudyMaster:
    """A master serving a study: its server, the port it bound, the fleet and the runner."""

    server: grpc.aio.Server
    port: int
    fleet: Fleet
    runner: StudyRunner
    health: health.aio.HealthServicer

    async def stop(self, grace: float = SHUTDOWN_GRACE_S) -> None:
        await stop_server(self.server, self.health, self.fleet, grace)


@dataclass(frozen=True)
class StudyServing:
    """The study to serve: its name, its runs in the file's order, where their states go, and
    how many are served at once."""

    name: str
    plans: Sequence[StudyRunPlan]
    states: StudyStates
    max_concurrent: int
    study_dir: Path
    mirror: StudyMirror | None = None
    """Set: the study dir goes to S3 (master.run.study_mirror)."""


async def start_study(study: StudyServing, serve: ServeOptions, options: RunOptions) -> StudyMaster:
    """Binds the server (port 0 picks a free one) and prepares the runner; serves no run yet."""
    if serve.port != 0 and port_in_use(serve.host, serve.port):
        raise OSError(f"could not listen on {serve.host}:{serve.port}: {IN_USE}")
    file_limit = raise_open_file_limit()
    lease_seconds = max(plan.config.lease_seconds for plan in study.plans)
    fleet = Fleet(lease_seconds=lease_seconds)
    runner: StudyRunner | None = None

    def figures() -> object:
        assert runner is not None
        return runner.snapshot(workers=False)

    service = EvolutionService(fleet, None, figures)  # type: ignore[arg-type]
    study_options = StudyOptions(options.checkpoint_seconds, options.overlap, mirror=study.mirror,
                                 s3_sync_seconds=options.s3_sync_seconds)  # fmt: skip
    runner = StudyRunner(study.name, study.plans, fleet, service, study.states,
                         study.max_concurrent, study_options)  # fmt: skip
    server = serving_server((), file_limit, serve.token)
    add_to_server(service, server)
    health_servicer = BoundedHealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = bind_port(server, serve.host, serve.port, serve.tls)
    await server.start()
    for name in (SERVICE_NAME, ""):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return StudyMaster(server, bound, fleet, runner, health_servicer)


async def run_study(
    study: StudyServing, serve: ServeOptions, options: RunOptions | None = None
) -> dict[str, RunState]:
    """Serves the study until every run is complete or failed, or SIGINT/SIGTERM arrives;
    returns each run's state.

    On a signal every run served is checkpointed, and the same command resumes the study
    (start.RunStopped says so, with the exit status a single run's master has). The live
    view of the runs goes to options.out (master.observe.study_progress), /metrics beside it
    with options.metrics_port.
    """
    from master.observe.study_progress import StudyProgress

    options = options or RunOptions()
    master = await start_study(study, serve, options)
    runner = master.runner
    out = options.out
    progress = StudyProgress(runner, out, quiet=True) if out is None else StudyProgress(runner, out)
    runner.options.watcher = progress
    companions = await _start_companions(master, study.study_dir, serve, options)
    if study.mirror is not None:
        study.mirror.put_study_files()
    if out is not None:
        notice = notice_stream(out)
        print(f"neuro master: study {study.name}, {len(study.plans)} runs, at most "
              f"{study.max_concurrent} at once, port {master.port}, study dir "
              f"{study.study_dir}", file=notice, flush=True)  # fmt: skip
        announce_local_workers(companions.workers, out)
    serving = asyncio.ensure_future(runner.run())
    signalled = cancel_on_signals(serving)
    try:
        companions.workers.start()
        watchdog = asyncio.ensure_future(companions.workers.watch(serving))
        try:
            return await serving
        except asyncio.CancelledError:
            if out is not None and progress.interactive:
                progress.notice("neuro master: stopping")  # above the live table, not over it
            elif out is not None:
                print("neuro master: stopping", file=notice_stream(out), flush=True)
            raise_if_unfinished(signalled, companions.workers, STUDY_END, STUDY_RESUME)
            raise
        finally:
            watchdog.cancel()
    finally:
        try:
            await shut_down(master, companions)
        finally:
            progress.close()


async def _start_companions(
    master: StudyMaster, study_dir: Path, serve: ServeOptions, options: RunOptions
) -> Companions:
    """Starts /metrics (the study's runs beside the fleet's figures) and prepares (not starts)
    the local workers, whose lines go to the study dir's local-workers.log under a live view."""
    metrics = None
    if options.metrics_port is not None:
        from master.observe.prometheus import start_metrics_server

        try:
            metrics = start_metrics_server(master.runner, options.metrics_host,
                                           options.metrics_port, study=master.runner)  # fmt: skip
        except OSError:
            await master.stop(0)
            raise
        if options.out is not None:
            print(f"neuro master: metrics at {metrics.url}", file=notice_stream(options.out),
                  flush=True)  # fmt: skip
    host = serve.host
    connect_host = "127.0.0.1" if host in ("0.0.0.0", "::", "[::]") else host
    out = options.out
    log = study_dir / LOCAL_WORKERS_LOG if out is not None and is_terminal(out) else None
    workers = LocalWorkers(f"{connect_host}:{master.port}", options.local_workers,
                           options.worker_args, serve.token, options.worker_cpus,
                           log)  # fmt: skip
    return Companions(workers, metrics)
