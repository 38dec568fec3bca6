"""Builds and runs the master: gRPC server, health service, fleet, trainer, local workers."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import math
import signal
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from master.config import RunConfig
from master.fleet.auth import BoundedHealthServicer, TokenInterceptor, connection_options
from master.fleet.fleet import Fleet
from master.fleet.service import (
    MAX_REQUEST_BYTES,
    PRESENCE_OPTIONS,
    EvolutionService,
    add_to_server,
)
from master.observe.events import GenerationRecord, Observer
from master.observe.progress import ProgressObserver, is_terminal, notice_stream
from master.run.local_workers import LOG_FILE as LOCAL_WORKERS_LOG
from master.run.local_workers import LocalWorkers
from master.run.run_setup import build_run, resume_config
from master.run.s3_mirror import FINAL_SYNC_TIMEOUT_S, MirrorLoop, RunDirMirror, status_document
from master.run.trainer import Trainer

__all__ = ["Master", "RunOptions", "RunStopped", "ServeOptions", "resume_config", "run_master",
           "start_master"]  # fmt: skip
from neuro.wire import SERVICE_NAME

if TYPE_CHECKING:
    from master.observe.prometheus import MetricsServer

log = logging.getLogger(__name__)
SHUTDOWN_GRACE_S = 5.0
DEFAULT_FILE_LIMIT = 1024
"""The open-file limit assumed where the OS does not say."""


@dataclass
class Master:
    """A running master: its server, the port it bound and the trainer it serves."""

    server: grpc.aio.Server
    port: int
    trainer: Trainer
    health: health.aio.HealthServicer

    @property
    def fleet(self) -> Fleet:
        fleet = self.trainer.fleet
        assert isinstance(fleet, Fleet), "a single run's trainer has the fleet to itself"
        return fleet

    async def stop(self, grace: float = SHUTDOWN_GRACE_S) -> None:
        await stop_server(self.server, self.health, self.fleet, grace)


async def stop_server(
    server: grpc.aio.Server, health: health.aio.HealthServicer, fleet: Fleet, grace: float
) -> None:
    """Says NOT_SERVING, ends the presence calls and stops the server within `grace`."""
    await health.enter_graceful_shutdown()
    # Presence calls never end on their own: ended here they finish within the grace;
    # cut by server.stop at its end, gRPC logs each as an unhandled CancelledError.
    fleet.close_presence()
    await server.stop(grace)


class Serving(Protocol):
    """A running master as its shutdown sees it: a single run's (Master) or a study's."""

    @property
    def fleet(self) -> Fleet: ...
    async def stop(self, grace: float = SHUTDOWN_GRACE_S) -> None: ...


class RunStopped(RuntimeError):
    """The run stopped before its budget was spent (a signal, or every local worker exited);
    its run dir holds the checkpoint it resumes from. `exit_code`: what neuro-master exits
    with (128 + the signal's number, as a shell reports a signalled process; 1 otherwise)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class ServeOptions:
    """Where the master listens, and what a caller must bring (token, TLS)."""

    host: str = "127.0.0.1"
    port: int = 0
    """0 picks a free one."""
    token: str | None = None
    """Every call but the health check must carry it (master.fleet.auth)."""
    tls: tuple[bytes, bytes] | None = None
    """(certificate chain, private key) PEM; the port then speaks only TLS."""


@dataclass(frozen=True)
class RunOptions:
    """What runs beside the server: local workers, progress, checkpoints, S3 mirror, metrics."""

    local_workers: int = 0
    worker_args: tuple[str, ...] = ()
    worker_cpus: tuple[int, ...] = ()
    """The CPU each local worker is pinned to (--cpu); () leaves them to the scheduler."""
    out: TextIO | None = sys.stdout
    """Progress and notices go here; None: silent."""
    checkpoint_seconds: float = 30.0
    mirror: RunDirMirror | None = None
    """Set: the run dir and a status.json go to S3 (after each checkpoint, periodically, at end)."""
    s3_sync_seconds: float = 60.0
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None
    """Set: Prometheus /metrics is served on metrics_host:metrics_port."""
    overlap: bool = False
    """Play the next phase's requests the algorithm already knows while a phase runs (the
    same results; neuro-master's default, --no-overlap)."""
    test_episodes: int = 0
    """The best elite's fresh episodes once the budget is spent (final_test.json); 0: none."""

    def __post_init__(self) -> None:
        # 0 or less: a checkpoint-and-fsync (or sync) busy loop; NaN: never.
        for name in ("checkpoint_seconds", "s3_sync_seconds"):
            value = getattr(self, name)
            if not 0 < value < math.inf:
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {value}")


async def start_master(
    config: RunConfig,
    run_dir: Path,
    host: str = "127.0.0.1",
    port: int = 0,
    out: TextIO | None = sys.stdout,
    options: Sequence[tuple[str, Any]] = (),
    resume: dict[str, Any] | None = None,
    checkpoint_seconds: float = 30.0,
    token: str | None = None,
    tls: tuple[bytes, bytes] | None = None,
    overlap: bool = False,
    test_episodes: int = 0,
) -> Master:
    """Binds the server (port 0 picks a free one) and prepares the trainer; does not train.

    `options` are gRPC channel arguments for the server (e.g. ("grpc.max_concurrent_streams", 8)).
    `resume` is a checkpoint payload (see resume_config): the run continues where it stopped.
    `token`: every call but the health check must carry it (master.fleet.auth). `tls`: (certificate
    chain, private key) PEM; the port then speaks only TLS. `overlap` and `test_episodes`: see
    RunOptions.
    """
    if port != 0 and port_in_use(host, port):
        # Before the trainer: a second master on a busy port leaves its run dir as it was.
        raise OSError(f"could not listen on {host}:{port}: {IN_USE}")
    file_limit = raise_open_file_limit()
    built = build_run(config, run_dir, Fleet, _observers(config, out), resume,
                      checkpoint_seconds, overlap, test_episodes)  # fmt: skip
    server = serving_server(options, file_limit, token)
    # Not the generated add_EvolutionServicer_to_server: unparsable bytes get INVALID_ARGUMENT.
    fleet = built.trainer.fleet
    assert isinstance(fleet, Fleet), "a single run's trainer has the fleet to itself"
    service = EvolutionService(fleet, built.template, built.trainer.snapshot)
    add_to_server(service, server)
    health_servicer = BoundedHealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = bind_port(server, host, port, tls)
    await server.start()
    for name in (SERVICE_NAME, ""):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return Master(server, bound, built.trainer, health_servicer)


def serving_server(
    options: Sequence[tuple[str, Any]], file_limit: int, token: str | None
) -> grpc.aio.Server:
    """The master's gRPC server, not yet bound: its limits and options, and the token check."""
    interceptors = [TokenInterceptor(token)] if token is not None else None
    # An explicit cap (gRPC's default): a bigger message gets RESOURCE_EXHAUSTED. No
    # SO_REUSEPORT (gRPC sets it by default): a second master on this port must fail to bind,
    # not share the port and answer half of this run's workers with its own.
    # One entry per key, the caller's last: gRPC takes the first of duplicated keys.
    # Connections are bounded in number, streams and silence: no client without the token can
    # take the file descriptors the run's own files need (master.fleet.auth).
    server_options = dict([("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
                           ("grpc.so_reuseport", 0), *PRESENCE_OPTIONS,
                           *connection_options(file_limit), *options])  # fmt: skip
    return grpc.aio.server(options=list(server_options.items()), interceptors=interceptors)


def raise_open_file_limit() -> int:
    """Raises this process's soft limit on open files to its hard limit (the common soft limit,
    1,024, is a few hundred connections); the soft limit now."""
    try:
        import resource
    except ImportError:  # not on this OS
        return DEFAULT_FILE_LIMIT
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as error:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, hard, error)
    return soft if soft != resource.RLIM_INFINITY else DEFAULT_FILE_LIMIT * 1024


def _observers(config: RunConfig, out: TextIO | None) -> list[Observer]:
    """Progress lines when there is somewhere to print them."""
    if out is None:
        return []
    progress = ProgressObserver(
        out,
        generations=config.generations,
        frames=config.frames,
        episodes_per_task=config.episodes_per_task,
    )
    return [progress]


def bind_port(
    server: grpc.aio.Server, host: str, port: int, tls: tuple[bytes, bytes] | None
) -> int:
    """Adds the listening port (TLS-only when `tls` is set); the port bound, or OSError saying
    why not (an address in use: another master, or another program, listens there)."""
    address = f"{host}:{port}"
    try:
        if tls is not None:
            certificate, key = tls
            credentials = grpc.ssl_server_credentials([(key, certificate)])
            bound = server.add_secure_port(address, credentials)
        else:
            bound = server.add_insecure_port(address)
    except RuntimeError:  # gRPC's "Failed to bind", which does not say why
        bound = 0
    if bound == 0:
        error = _bind_error(host, port)
        why = IN_USE if error is not None and error.errno == errno.EADDRINUSE else (
            (error.strerror or str(error)) if error is not None else "gRPC refused the address"
        )  # fmt: skip
        raise OSError(f"could not listen on {address}: {why}")
    return bound


IN_USE = ("address already in use: another master (or another program) listens there; stop "
           "it or give another --port")  # fmt: skip


def port_in_use(host: str, port: int) -> bool:
    """Whether another socket listens on host:port (the common case of a failing bind, found
    before the trainer is built: an ES run's noise table may take minutes)."""
    error = _bind_error(host, port)
    return error is not None and error.errno == errno.EADDRINUSE


def _bind_error(host: str, port: int) -> OSError | None:
    """The error binding host:port with a plain socket gives (gRPC's does not say), or None."""
    try:
        addresses = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)  # fmt: skip
    except OSError as error:
        return error
    for family, kind, proto, _, sockaddr in addresses:
        with socket.socket(family, kind, proto) as probe:
            # As gRPC binds: SO_REUSEADDR, so connections in TIME_WAIT are no obstacle.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as error:
                return error
    return None


@dataclass
class Companions:
    """What runs beside a master's server and must be closed with it."""

    workers: LocalWorkers
    metrics: MetricsServer | None = None
    syncer: MirrorLoop | None = None


async def run_master(
    config: RunConfig,
    run_dir: Path,
    serve: ServeOptions,
    options: RunOptions | None = None,
    resume: dict[str, Any] | None = None,
) -> list[GenerationRecord]:
    """Serves and trains until the budget is spent or SIGINT/SIGTERM arrives.

    On a signal the run is checkpointed, not completed: starting again on the same run dir
    continues it, and remote workers wait for the master meanwhile. With a mirror, the run
    dir and a status.json go to S3 after each checkpoint, every s3_sync_seconds and once
    at the end, in the background. With a metrics_port, Prometheus /metrics is served on
    metrics_host:metrics_port (master.observe.prometheus).
    """
    options = options or RunOptions()
    master = await start_master(config, run_dir, serve.host, serve.port, options.out,
                                resume=resume, checkpoint_seconds=options.checkpoint_seconds,
                                token=serve.token, tls=serve.tls, overlap=options.overlap,
                                test_episodes=options.test_episodes)  # fmt: skip
    companions = await _start_companions(master, run_dir, serve, options)
    out = options.out
    if out is not None:
        print(
            f"neuro master: run {config.run_id} on {config.env_id}, port {master.port}, "
            f"run dir {run_dir}",
            file=notice_stream(out),
            flush=True,
        )
        announce_local_workers(companions.workers, out)
    training = asyncio.ensure_future(master.trainer.run())
    signalled = cancel_on_signals(training)
    try:
        companions.workers.start()
        watchdog = asyncio.ensure_future(companions.workers.watch(training))
        try:
            return await training
        except asyncio.CancelledError:
            if out is not None:
                print("neuro master: stopping", file=notice_stream(out), flush=True)
            raise_if_unfinished(signalled, companions.workers)
            return master.trainer.records  # cancelled by the caller, who knows why
        finally:
            watchdog.cancel()
    finally:
        await shut_down(master, companions)


def announce_local_workers(workers: LocalWorkers, out: TextIO) -> None:
    """Says where the local workers' lines go, when they go to a log of their own."""
    if workers.log is not None and workers.count:
        plural = "s" if workers.count != 1 else ""
        print(f"neuro master: {workers.count} local worker{plural}, their log in "
              f"{workers.log}", file=notice_stream(out), flush=True)  # fmt: skip


def cancel_on_signals(serving: asyncio.Future) -> list[int]:
    """Cancels `serving` on SIGINT or SIGTERM; returns the list each signal caught is appended
    to, for raise_if_unfinished to tell a signal's stop from the caller's cancel."""
    loop = asyncio.get_running_loop()
    signalled: list[int] = []

    def stop(signum: int) -> None:
        signalled.append(signum)
        serving.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop, signum)
    return signalled


def raise_if_unfinished(
    signalled: list[int],
    workers: LocalWorkers,
    end: str = "the run's budget was spent",
    resume: str = "its run dir holds the checkpoint: start the master on it again to continue",
) -> None:
    """RunStopped, saying why, where a signal or the local workers' exits stopped the run (or
    the study) before its `end`: scripts and restart policies read the exit status."""
    if workers.all_exited is not None:
        raise RunStopped(f"every local worker exited (codes {workers.all_exited}) before "
                         f"{end}; {resume}")  # fmt: skip
    if signalled:
        name = signal.Signals(signalled[0]).name
        raise RunStopped(f"stopped by {name} before {end}; {resume}",
                         exit_code=128 + signalled[0])  # fmt: skip


async def _start_companions(
    master: Master, run_dir: Path, serve: ServeOptions, options: RunOptions
) -> Companions:
    """Starts the metrics endpoint and S3 mirror, and prepares (not starts) the local workers."""
    metrics = None
    if options.metrics_port is not None:
        from master.observe.prometheus import start_metrics_server

        try:
            metrics = start_metrics_server(
                master.trainer, options.metrics_host, options.metrics_port
            )
        except OSError:
            await master.stop(0)
            raise
        if options.out is not None:
            print(f"neuro master: metrics at {metrics.url}", file=notice_stream(options.out),
                  flush=True)  # fmt: skip
    syncer = None
    if options.mirror is not None:
        trainer = master.trainer
        syncer = MirrorLoop(options.mirror, run_dir, lambda: status_document(trainer.snapshot()),
                            options.s3_sync_seconds)  # fmt: skip
        trainer.observers.append(syncer)  # it syncs after each checkpoint
        syncer.start()
    host = serve.host
    connect_host = "127.0.0.1" if host in ("0.0.0.0", "::", "[::]") else host
    # A live progress bar: the workers' own lines (joining, pinning, allocator advice, each
    # once per worker) would break it, so they go to a file, which one line names.
    out = options.out
    log = run_dir / LOCAL_WORKERS_LOG if out is not None and is_terminal(out) else None
    workers = LocalWorkers(f"{connect_host}:{master.port}", options.local_workers,
                           options.worker_args, serve.token, options.worker_cpus,
                           log)  # fmt: skip
    return Companions(workers, metrics, syncer)


async def shut_down(master: Serving, companions: Companions) -> None:
    """Lets workers learn the run is over, closes the companions, then stops the server."""
    loop = asyncio.get_running_loop()
    workers, metrics, syncer = companions.workers, companions.metrics, companions.syncer
    if master.fleet.run_complete:
        # Remote workers learn that the run is over only by calling: keep answering until
        # they have, for a bounded time (a signal cuts it short).
        lingering = asyncio.ensure_future(master.fleet.linger())
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, lingering.cancel)
        await asyncio.wait([lingering])
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signum)
    if syncer is not None:
        # Bounded: a dead S3 cannot hold up the exit (the run dir has everything anyway).
        await syncer.close(FINAL_SYNC_TIMEOUT_S)
    # Let local workers see run_complete and leave on their own before the server goes.
    await workers.stop(timeout=SHUTDOWN_GRACE_S)
    if metrics is not None:
        await metrics.close()
    await master.stop()
