"""neuro-worker's work: join the master and work until done or signalled, or, given several
devices, run and supervise one worker process per device (worker/fanout.py)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from neuro.allocator import allocator_advice, tcmalloc_installed, this_process_allocator
from neuro.cpus import format_cpu_list
from worker.cli.pinning import allowed_cpus, pin_to_cpus
from worker.cli.settings import WorkerSettings

if TYPE_CHECKING:
    from worker.client import WorkerClient
    from worker.runners.batched import BatchedRunner
    from worker.spot import SpotNoticeWatcher


def run_worker(settings: WorkerSettings) -> int:
    """Joins the master and works until done or signalled; returns the exit code."""
    _configure_logging(settings)
    if settings.cpus is not None:
        # Before the client starts its threads (gRPC, the emulators'): they inherit it.
        pin_to_cpus(settings.cpus)
    client = _build_client(settings)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: client.stop())
    allocator = this_process_allocator()
    logging.info(
        "worker %s joining master %s (%s, %s, %s malloc; %s)", client.worker_id, settings.master,
        "TLS" if settings.root_certificates else "plaintext",
        "token" if settings.token else "no token", allocator, _runs_on(settings),
    )  # fmt: skip
    if settings.cpus is not None:
        plural = "s" if len(settings.cpus) > 1 else ""
        logging.info("worker %s pinned to CPU%s %s", client.worker_id, plural,
                     format_cpu_list(settings.cpus))  # fmt: skip
    advice = allocator_advice(allocator, os.environ, tcmalloc_installed())
    if advice is not None:
        logging.info("worker %s: %s", client.worker_id, advice)
    watcher = _watch_spot_notices(settings, client.stop)
    try:
        code = client.run()
    finally:
        if watcher is not None:
            watcher.stop()
    if watcher is not None and watcher.notice is not None:
        logging.warning(
            "worker %s left on a spot interruption notice (%s at %s)",
            client.worker_id, watcher.notice.action, watcher.notice.time,
        )  # fmt: skip
    logging.info("worker %s done: %s", client.worker_id, client.counters)
    if settings.stats_file:
        client.write_stats()
    return code


def run_fanout(settings: WorkerSettings, argv: list[str]) -> int:
    """Runs one worker process per share (worker/fanout.py) until all have exited."""
    from worker.fanout import Fanout

    _configure_logging(settings)
    fanout = Fanout(argv, settings.shares, _worker_id(settings), settings.stats_file)
    logging.info("worker %s: %d devices (%s), one worker process each", fanout.worker_id,
                 len(settings.shares), ", ".join(s.device for s in settings.shares))  # fmt: skip
    code = fanout.run()
    logging.info("worker %s done: %s", fanout.worker_id, fanout.codes)
    return code


def _configure_logging(settings: WorkerSettings) -> None:
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s worker %(message)s"
    )


def _runs_on(settings: WorkerSettings) -> str:
    """What the worker will run, true for any env: the runner, and the inference engine it
    prefers (each kind of policy's actual engine is logged when its first policy is built)."""
    if settings.envs:
        return f"batched runner, {settings.envs} env slots on {settings.device}"
    return (
        f"per-genome runner, {settings.slots} slots, "
        f"inference engine {settings.inference_engine} preferred"
    )


def _build_client(settings: WorkerSettings) -> WorkerClient:
    # torch and the client load here, after the flags are checked: a bad flag fails fast.
    import torch

    from neuro.shared_store import SharedVectorStore
    from worker.client import WorkerClient
    from worker.evaluation.evaluator import Evaluator

    torch.set_num_threads(settings.torch_threads)
    if settings.device.startswith("cuda:"):
        # Before anything touches CUDA: what runs on the "current" device (a synchronize, a
        # tensor made on "cuda") then runs on this GPU, and no context is made on GPU 0.
        torch.cuda.set_device(settings.device)
    shared = (
        SharedVectorStore(budget_bytes=settings.shared_cache_mb * 2**20)
        if settings.shared_cache_mb
        else None
    )
    return WorkerClient(
        settings.master,
        _worker_id(settings),
        Evaluator(
            settings.noise_cache,
            settings.decode_cache_mb * 2**20,
            shared,
            atari_backend=settings.atari_backend,
            inference_engine=settings.inference_engine,
        ),
        prefetch=settings.prefetch,
        give_up_after_s=settings.give_up_after,
        slots=settings.envs or settings.slots,
        stats_path=settings.stats_file,
        token=settings.token,
        root_certificates=settings.root_certificates,
        runner_factory=_batched_runner(settings) if settings.envs else None,
    )


def _worker_id(settings: WorkerSettings) -> str:
    """--worker-id, else hostname-pid-random."""
    return settings.worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _batched_runner(settings: WorkerSettings) -> Callable[..., BatchedRunner]:
    """Builds the batched runner in the main thread: `envs` slots on the device, the C++
    vector env stepping them with one thread per CPU this worker may use (on a CPU device,
    one thread unless it was pinned to several)."""
    from worker.runners.batched import BatchedRunner

    cpus = len(settings.cpus or allowed_cpus())
    several = settings.device != "cpu" or (settings.cpus is not None and len(settings.cpus) > 1)
    threads = max(1, min(settings.envs, cpus)) if several else 1

    def build(evaluator: Any, capacity: int, timers: Any) -> BatchedRunner:
        return BatchedRunner(evaluator, capacity, settings.device, timers, threads,
                             pipelined=settings.pipeline)  # fmt: skip

    return build


def _watch_spot_notices(
    settings: WorkerSettings, stop: Callable[[], None]
) -> SpotNoticeWatcher | None:
    """Starts polling for a spot interruption notice, which drains like SIGTERM."""
    if settings.spot_endpoint is None:
        return None
    from worker.spot import SpotNoticeWatcher

    watcher = SpotNoticeWatcher(stop, settings.spot_endpoint, settings.spot_poll_seconds)
    logging.info("watching for spot interruption notices at %s every %gs",
                 watcher.endpoint, watcher.poll_seconds)  # fmt: skip
    watcher.start()
    return watcher
