"""What a client without the token can make a master hold: Health.Watch streams bounded in
number, connections bounded so that the run's own files always get a descriptor, and the
master's soft open-file limit raised to its hard one."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from master.fleet.auth import MAX_HEALTH_WATCHES, MAX_SERVICE_NAME, connection_options
from tests.support.harness import live_master
from tests.support.processes import REPO, free_port, worker_env
from tests.support.tiny import tiny_cartpole

TOKEN = "unauthenticated-bounds-token-9e14"
CALL_S = 5.0


def test_health_watch_streams_are_bounded_and_the_master_keeps_serving(tmp_path):
    async def main() -> None:
        async with live_master(tiny_cartpole(), tmp_path / "run", token=TOKEN) as live:
            channels = [live.channel([("grpc.use_local_subchannel_pool", 1)]) for _ in range(2)]
            stubs = [health_pb2_grpc.HealthStub(channel) for channel in channels]
            calls = [stubs[i % 2].Watch(health_pb2.HealthCheckRequest())
                     for i in range(MAX_HEALTH_WATCHES + 8)]  # fmt: skip

            async def first(call) -> object:
                try:
                    async for update in call:
                        return update.status
                except grpc.aio.AioRpcError as error:
                    return error.code()

            outcomes = await asyncio.wait_for(asyncio.gather(*map(first, calls)), 30)
            serving = health_pb2.HealthCheckResponse.SERVING
            assert outcomes.count(serving) == MAX_HEALTH_WATCHES
            assert outcomes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 8
            refused = next(c for c, o in zip(calls, outcomes, strict=True) if o != serving)
            assert "Health.Check" in await refused.details()
            # Probes still answer, and a stream ended makes room for another.
            check = await stubs[0].Check(health_pb2.HealthCheckRequest(), timeout=CALL_S)
            assert check.status == serving
            next(c for c, o in zip(calls, outcomes, strict=True) if o == serving).cancel()
            await asyncio.sleep(0.2)
            assert await first(stubs[1].Watch(health_pb2.HealthCheckRequest())) == serving
            with pytest.raises(grpc.aio.AioRpcError) as refusal:
                long_name = health_pb2.HealthCheckRequest(service="s" * (MAX_SERVICE_NAME + 1))
                await stubs[0].Check(long_name, timeout=CALL_S)
            assert refusal.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            for call in calls:
                call.cancel()

    asyncio.run(main())


def test_connections_leave_descriptors_for_the_runs_files():
    for limit in (128, 1024, 1_048_576):
        [cap] = [v for k, v in connection_options(limit) if k.endswith("incoming_connections")]
        assert 0 < cap <= limit - 64


def limited(soft: int, hard: int):
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return set_limit


def test_idle_connections_without_a_token_cannot_take_the_descriptors_checkpoints_need(
    tmp_path: Path,
):
    """The issue's reproduction: with a soft limit of 128, 130 idle TCP connections without a
    token exhausted the master's descriptors; checkpoint.json stopped changing, and the master
    died at the next generation's end with `Too many open files`."""
    port, run_dir = free_port(), tmp_path / "run"
    command = [sys.executable, "-m", "master", "--env", "CartPole-v1", "--port", str(port),
               "--run-dir", str(run_dir), "--quiet", "--checkpoint-seconds", "0.2"]  # fmt: skip
    master = subprocess.Popen(
        command, env={**worker_env(), "NEURO_TOKEN": TOKEN}, cwd=REPO, stderr=subprocess.PIPE,
        text=True, preexec_fn=limited(128, 192),
    )  # fmt: skip
    sockets: list[socket.socket] = []
    try:
        checkpoint = run_dir / "checkpoint.json"
        deadline = time.monotonic() + 60
        while not checkpoint.exists():
            assert master.poll() is None and time.monotonic() < deadline, "no checkpoint"
            time.sleep(0.1)
        # Raised to the hard limit at start.
        limits = Path(f"/proc/{master.pid}/limits").read_text()
        [row] = [line for line in limits.splitlines() if line.startswith("Max open files")]
        assert row.split()[3:5] == ["192", "192"], row
        for _ in range(130):
            connection = socket.socket()
            connection.settimeout(2.0)
            try:
                connection.connect(("127.0.0.1", port))
            except OSError:
                connection.close()
                continue
            sockets.append(connection)
        # Checkpoints go on being written while the connections are held.
        seen = set()
        deadline = time.monotonic() + 20
        while len(seen) < 5 and time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError):  # between the two renames of a save
                seen.add(checkpoint.stat().st_mtime_ns)
            time.sleep(0.1)
        assert len(seen) >= 5, "checkpoint.json stopped changing"
        assert master.poll() is None
    finally:
        for connection in sockets:
            connection.close()
        master.terminate()
        _, err = master.communicate(timeout=30)
    assert "Too many open files" not in err and "checkpoint not written" not in err, err
