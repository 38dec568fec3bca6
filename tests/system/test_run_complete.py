"""A finished run tells its remote workers so before the master stops, and they exit 0.

A real master (run_master, as `neuro-master` runs it) on loopback and a real remote worker
process started with --give-up-after 0, which would otherwise retry a vanished master forever.
The worker is frozen (SIGSTOP) while the test, as a second worker, finishes the run, so the
worker cannot be calling at the moment the run completes: it hears of it only if the master is
still answering when it wakes.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest

from master.config import inspect_env_id, preset
from master.run.start import RunOptions, ServeOptions, run_master
from neuro.v1 import evolution_pb2 as pb
from neuro.v1 import evolution_pb2_grpc as pb_grpc
from tests.support.processes import free_port, spawn_worker, stop_processes

pytestmark = pytest.mark.slow

CURRENT = pb.PROTOCOL_VERSION_CURRENT
CALL_S = 5.0
LEASE_S = 8.0
GRACE_S = LEASE_S / 4 + 10.0
"""How long the master keeps answering after the run: a heartbeat interval, plus backoff."""
CONFIG = {"generations": 1, "population_size": 4, "truncation": 2, "elite_candidates": 1,
          "elite_episodes": 1, "target_score": None, "lease_seconds": LEASE_S}  # fmt: skip


async def _statuses(stub: pb_grpc.EvolutionStub, until, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not until(await stub.Status(pb.StatusRequest(), timeout=CALL_S)):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def _finish_the_run(stub: pb_grpc.EvolutionStub, held: list[pb.Task], serving) -> bool:
    """Reports what it holds, then leases and reports until told the run is complete.

    Returns whether it was told (False: the master stopped answering first).
    """
    request = pb.LeaseRequest(protocol_version=CURRENT, worker_id="finisher", max_tasks=256)
    while not serving.done():
        results = [
            pb.TaskResult(task_id=t.task_id, run_id=t.run_id, episode_returns=[1.0] * t.episodes,
                          episode_frames=[10] * t.episodes, frames=10 * t.episodes)
            for t in held
        ]  # fmt: skip
        try:
            if results:
                report = pb.ReportRequest(
                    protocol_version=CURRENT, worker_id="finisher", results=results
                )
                await stub.Report(report, timeout=CALL_S)
            response = await stub.Lease(request, timeout=CALL_S)
        except grpc.aio.AioRpcError:
            return False
        if response.run_complete:
            return True
        held = list(response.tasks)
        if not held:
            await asyncio.sleep(response.retry_after_ms / 1000)
    return False


async def _scenario(tmp_path: Path) -> dict:
    port = free_port()
    config = preset(inspect_env_id("CartPole-v1"), **CONFIG)
    serving = asyncio.ensure_future(
        run_master(config, tmp_path / "run", ServeOptions(port=port), RunOptions(out=None))
    )
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.EvolutionStub(channel)
    worker: subprocess.Popen | None = None
    try:
        # Take the whole first phase, so the remote worker finds nothing to do but ask.
        request = pb.LeaseRequest(protocol_version=CURRENT, worker_id="finisher", max_tasks=256)
        while not (held := list((await stub.Lease(request, timeout=CALL_S)).tasks)):
            await asyncio.sleep(0.02)
        worker = spawn_worker(port, "remote", "--give-up-after", "0")

        def remote_listed(s: pb.StatusResponse) -> bool:
            return any(w.worker_id == "remote" for w in s.worker_status)

        await _statuses(stub, remote_listed, 60, "the remote worker to call in")
        worker.send_signal(signal.SIGSTOP)
        told = await _finish_the_run(stub, held, serving)
        completed = time.monotonic()
        worker.send_signal(signal.SIGCONT)
        while worker.poll() is None and time.monotonic() - completed < GRACE_S + 10:
            await asyncio.sleep(0.05)
        left_after = time.monotonic() - completed
        records = await asyncio.wait_for(serving, GRACE_S + 30)
        return {"told": told, "exit": worker.poll(), "left_after": left_after,
                "records": records}  # fmt: skip
    finally:
        if worker is not None:
            with contextlib.suppress(ProcessLookupError):
                worker.send_signal(signal.SIGCONT)
            stop_processes([worker])
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await serving
        await channel.close()


def test_a_remote_worker_hears_that_the_run_is_complete_and_exits_0(
    tmp_path: Path, noise_cache: Path
) -> None:
    outcome = asyncio.run(asyncio.wait_for(_scenario(tmp_path), 180))
    assert outcome["told"], "the master stopped before telling the finisher"
    assert outcome["exit"] == 0, f"the remote worker did not leave: {outcome}"
    assert outcome["left_after"] <= GRACE_S
    assert [r.generation for r in outcome["records"]] == [0]
