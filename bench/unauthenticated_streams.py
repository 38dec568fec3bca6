"""What clients without a token can make a master hold: Health.Watch streams (the health
service is open by design, for orchestrators) on a few connections. Starts a real master
(`python -m master`, CartPole, a token, no workers) and measures its resident memory before and
after opening --streams Watch streams over --connections connections, and how the streams
ended: held open ("open"), refused by the master's bound (RESOURCE_EXHAUSTED), or refused by
HTTP/2 because a connection opened more at once than its limit of concurrent streams, before
the client had heard the limit (UNAVAILABLE: REFUSED_STREAM).

    python -m bench.unauthenticated_streams --streams 10000 --connections 4 \
        --json bench/results/unauthenticated-streams-<machine>-<date>.json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.common import provenance, raise_file_limit, write_json

SETTLE_S = 3.0
OPEN_S = 120.0


def resident_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def start_master(port: int, run_dir: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "master", "--env", "CartPole-v1", "--port", str(port),
               "--run-dir", str(run_dir), "--quiet", "--checkpoint-seconds", "3600"]  # fmt: skip
    environment = {**os.environ, "NEURO_TOKEN": "bench-unauthenticated-streams-token"}
    return subprocess.Popen(command, env=environment, stderr=subprocess.DEVNULL)


async def serving(address: str, deadline_s: float = 60.0) -> None:
    deadline = time.monotonic() + deadline_s
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                return
            except grpc.aio.AioRpcError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)


async def open_streams(
    address: str, streams: int, connections: int, pid: int
) -> tuple[dict[str, int], float]:
    """Opens the streams; once each is open or refused (or OPEN_S passed), how they stand, by
    outcome, and the master's resident memory then."""
    channels = [grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(connections)]  # fmt: skip
    outcomes: collections.Counter[str] = collections.Counter()
    calls = []

    async def watch(index: int) -> None:
        stub = health_pb2_grpc.HealthStub(channels[index % connections])
        call = stub.Watch(health_pb2.HealthCheckRequest())
        calls.append(call)
        try:
            async for _ in call:
                outcomes["open"] += 1  # its first update: the master holds it
                break
            await call.code()  # held open until it ends
        except grpc.aio.AioRpcError as error:
            outcomes[error.code().name] += 1
        except asyncio.CancelledError:
            pass

    tasks = [asyncio.ensure_future(watch(i)) for i in range(streams)]
    deadline = time.monotonic() + OPEN_S
    while sum(outcomes.values()) < streams and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    await asyncio.sleep(SETTLE_S)
    return_value = dict(outcomes), resident_mb(pid)
    for call in calls:
        call.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.gather(*(channel.close() for channel in channels))
    return return_value


async def measure(args: argparse.Namespace) -> dict:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as run_dir:
        master = start_master(port, Path(run_dir) / "run")
        try:
            await serving(address)
            await asyncio.sleep(1.0)
            before = resident_mb(master.pid)
            outcomes, during = await open_streams(
                address, args.streams, args.connections, master.pid
            )
            alive = master.poll() is None
        finally:
            master.terminate()
            master.wait(30)
    return {
        **provenance(__file__, None),
        "streams": args.streams,
        "connections": args.connections,
        "resident_mb_before": round(before, 1),
        "resident_mb_with_streams": round(during, 1),
        "resident_mb_added": round(during - before, 1),
        "outcomes": outcomes,
        "master_alive": alive,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--json", help="also write the result to this file")
    args = parser.parse_args()
    raise_file_limit()
    result = asyncio.run(measure(args))
    print(json.dumps(result, indent=2))
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
