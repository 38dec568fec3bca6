"""Builds and runs the master: gRPC server, health service, fleet, trainer, local workers."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from master.algorithms.es import ESState, EvolutionStrategy
from master.algorithms.ga import GAState, GeneticAlgorithm
from master.config import RunConfig
from master.fleet.auth import TokenInterceptor
from master.fleet.scheduler import Fleet, FleetSettings
from master.fleet.service import (
    MAX_REQUEST_BYTES,
    EvolutionService,
    ParameterStore,
    TaskTemplate,
    add_to_server,
)
from master.observe.progress import ProgressObserver, notice_stream
from master.observe.tensorboard import TensorBoardObserver
from master.run.checkpoint import load_sidecar
from master.run.local_workers import LocalWorkers
from master.run.rundir import GenerationRecord, RunDirectory
from master.run.s3_mirror import FINAL_SYNC_TIMEOUT_S, MirrorLoop, RunDirMirror, status_document
from master.run.trainer import Budget, Observer, Trainer
from neuro.v1 import evolution_pb2 as pb
from neuro.wire import SERVICE_NAME

log = logging.getLogger(__name__)
SHUTDOWN_GRACE_S = 5.0


@dataclass
class Master:
    """A running master: its server, the port it bound and the trainer it serves."""

    server: grpc.aio.Server
    port: int
    trainer: Trainer
    health: health.aio.HealthServicer

    async def stop(self, grace: float = SHUTDOWN_GRACE_S) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


def resume_config(payload: dict[str, Any], **budget: Any) -> RunConfig:
    """The checkpointed run's settings; only the budget (generations, frames, target) may change."""
    unknown = set(budget) - {"generations", "frames", "target_score"}
    if unknown:
        raise ValueError(f"a resumed run keeps its settings; cannot change {sorted(unknown)}")
    return dataclasses.replace(RunConfig.from_dict(payload["config"]), **budget)


def build_es(config: RunConfig, run_dir: Path, resume: dict[str, Any] | None) -> EvolutionStrategy:
    """The ES of a run: theta initialised like a GA genome's first seed, or resumed."""
    import numpy as np

    from neuro.decode import decode_genome
    from neuro.envs.make import make_env
    from neuro.layout import init_scale, parameter_layout
    from neuro.noise import NoiseTableSpec, load_noise_table

    assert config.es is not None
    table = load_noise_table(NoiseTableSpec(config.noise_table_seed, config.noise_table_size))
    if resume is not None:
        arrays = load_sidecar(run_dir, resume["sidecar"])
        return EvolutionStrategy(config.es, table, state=ESState.from_dict(resume["ga"], arrays))
    # The master builds the env once, only to learn its spaces (no torch here).
    env = make_env(config.env_id, config.atari_dynamics).env
    try:
        space = env.action_space
        outputs = int(space.n) if hasattr(space, "n") else int(np.prod(space.shape))
        layout = parameter_layout(
            config.architecture, env.observation_space.shape, outputs, config.hidden_sizes
        )
    finally:
        env.close()
    seed = int(np.random.default_rng(config.es.seed).integers(2**32))
    theta = decode_genome(table, init_scale(layout), config.es.sigma, [seed])
    return EvolutionStrategy(config.es, table, theta)


def task_template(config: RunConfig, parameters: ParameterStore | None = None) -> TaskTemplate:
    dynamics = {
        "paper": pb.ATARI_DYNAMICS_PAPER,
        "registered": pb.ATARI_DYNAMICS_REGISTERED,
    }[config.atari_dynamics]
    return TaskTemplate(
        run_id=config.run_id,
        env=pb.EnvSpec(env_id=config.env_id, atari_dynamics=dynamics if config.atari else 0),
        policy=pb.PolicySpec(architecture=config.architecture, hidden_sizes=config.hidden_sizes),
        noise_table=pb.NoiseTableSpec(seed=config.noise_table_seed, size=config.noise_table_size),
        mutation_power=config.es.sigma if config.es is not None else config.ga.mutation_power,
        max_episode_steps=config.max_episode_steps,
        lease_seconds=config.lease_seconds,
        parameters=parameters,
    )


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
) -> Master:
    """Binds the server (port 0 picks a free one) and prepares the trainer; does not train.

    `options` are gRPC channel arguments for the server (e.g. ("grpc.so_reuseport", 0)).
    `resume` is a checkpoint payload (see resume_config): the run continues where it stopped.
    `token`: every call but the health check must carry it (master.fleet.auth). `tls`: (certificate
    chain, private key) PEM; the port then speaks only TLS.
    """
    fleet = Fleet(
        FleetSettings(
            run_id=config.run_id,
            run_seed=config.seed,
            lease_seconds=config.lease_seconds,
            max_attempts=config.max_task_attempts,
            episodes_per_task=config.episodes_per_task,
        )
    )
    directory = RunDirectory(run_dir)
    directory.write_config(config.to_dict())
    algorithm: GeneticAlgorithm | EvolutionStrategy
    parameters = None
    if config.es is not None:
        algorithm = build_es(config, directory.path, resume)
        parameters = ParameterStore(algorithm.parameters)
        document = config.parameters_document
    else:
        state = GAState.from_dict(resume["ga"]) if resume is not None else None
        algorithm = GeneticAlgorithm(config.ga, state)
        document = config.genome_document
    if resume is not None:
        directory.truncate_metrics(algorithm.generation)
    observers: list[Observer] = [TensorBoardObserver(directory.path / "tensorboard")]
    if out is not None:
        observers.append(ProgressObserver(out))
    trainer = Trainer(
        algorithm,
        fleet,
        Budget(config.generations, config.frames, config.target_score),
        directory,
        document,
        config.env_id,
        observers=observers,
        config=config.to_dict(),
        checkpoint_seconds=checkpoint_seconds,
        resume=resume,
    )
    interceptors = [TokenInterceptor(token)] if token is not None else None
    # An explicit cap (gRPC's default): a bigger message gets RESOURCE_EXHAUSTED.
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", MAX_REQUEST_BYTES), *options],
        interceptors=interceptors,
    )
    # Not the generated add_EvolutionServicer_to_server: unparsable bytes get INVALID_ARGUMENT.
    service = EvolutionService(fleet, task_template(config, parameters), trainer.status)
    add_to_server(service, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if tls is not None:
        certificate, key = tls
        credentials = grpc.ssl_server_credentials([(key, certificate)])
        bound = server.add_secure_port(f"{host}:{port}", credentials)
    else:
        bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"could not listen on {host}:{port}")
    await server.start()
    for name in (SERVICE_NAME, ""):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return Master(server, bound, trainer, health_servicer)


async def run_master(
    config: RunConfig,
    run_dir: Path,
    host: str,
    port: int,
    local_workers: int = 0,
    worker_args: tuple[str, ...] = (),
    out: TextIO | None = sys.stdout,
    resume: dict[str, Any] | None = None,
    checkpoint_seconds: float = 30.0,
    token: str | None = None,
    tls: tuple[bytes, bytes] | None = None,
    mirror: RunDirMirror | None = None,
    s3_sync_seconds: float = 60.0,
    metrics_host: str = "127.0.0.1",
    metrics_port: int | None = None,
) -> list[GenerationRecord]:
    """Serves and trains until the budget is spent or SIGINT/SIGTERM arrives.

    On a signal the run is checkpointed, not completed: starting again on the same run dir
    continues it, and remote workers wait for the master meanwhile. With a `mirror`, the run
    dir and a status.json go to S3 after each checkpoint, every `s3_sync_seconds` and once
    at the end, in the background. With a `metrics_port`, Prometheus /metrics is served on
    metrics_host:metrics_port (master.observe.prometheus).
    """
    master = await start_master(
        config,
        run_dir,
        host,
        port,
        out,
        resume=resume,
        checkpoint_seconds=checkpoint_seconds,
        token=token,
        tls=tls,
    )
    metrics = None
    if metrics_port is not None:
        from master.observe.prometheus import start_metrics_server

        try:
            metrics = start_metrics_server(master.trainer, metrics_host, metrics_port)
        except OSError:
            await master.stop(0)
            raise
        if out is not None:
            print(f"neuro master: metrics at {metrics.url}", file=notice_stream(out), flush=True)
    syncer = None
    if mirror is not None:
        trainer = master.trainer
        syncer = MirrorLoop(
            mirror, run_dir, lambda: status_document(trainer.status()), s3_sync_seconds
        )
        trainer.after_checkpoint = syncer.request
        syncer.start()
    connect_host = "127.0.0.1" if host in ("0.0.0.0", "::", "[::]") else host
    workers = LocalWorkers(f"{connect_host}:{master.port}", local_workers, worker_args, token)
    if out is not None:
        print(
            f"neuro master: run {config.run_id} on {config.env_id}, port {master.port}, "
            f"run dir {run_dir}",
            file=notice_stream(out),
            flush=True,
        )
    training = asyncio.ensure_future(master.trainer.run())
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, training.cancel)
    try:
        workers.start()
        watchdog = asyncio.ensure_future(workers.watch(training))
        try:
            return await training
        except asyncio.CancelledError:
            if out is not None:
                print("neuro master: stopping", file=notice_stream(out), flush=True)
            return master.trainer.records
        finally:
            watchdog.cancel()
    finally:
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
