"""A fleet's presence calls against a real master: a burst of thousands is watched whole, and a
worker told over its presence call that the run is over holds up nobody's exit."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import sys
import time

import grpc

from master.fleet.service import PRESENCE_OPTIONS
from neuro.v1 import evolution_pb2 as pb
from neuro.v1 import evolution_pb2_grpc as pb_grpc
from tests.support.harness import live_master
from tests.support.processes import worker_env
from tests.support.tiny import tiny_cartpole

BURST = 3000
"""Well past gRPC's default pending-call limits (1,000 soft, 3,000 hard): without the master's
own limits, hundreds of these calls are cancelled before the master sees them."""


def _room_for(connections: int) -> int:
    """Raises this process's open-file limit for `connections` sockets at both ends; returns
    how many fit (the hard limit may be lower on some machines)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * connections + 512
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return min(connections, (wanted - 512) // 2)


def _request(index: int) -> pb.AttachRequest:
    return pb.AttachRequest(protocol_version=pb.PROTOCOL_VERSION_CURRENT, worker_id=f"w{index}")


async def _burst(tmp_path, count: int) -> tuple[int, int, int]:
    async with live_master(tiny_cartpole(), tmp_path / "run", train=False) as live:
        fleet = live.trainer.fleet
        # One connection each, as workers have: not channels sharing one connection.
        options = [("grpc.use_local_subchannel_pool", 1)]
        channels = [grpc.aio.insecure_channel(live.address, options=options) for _ in range(count)]
        try:
            calls = [pb_grpc.EvolutionStub(channel).Attach(_request(i))
                     for i, channel in enumerate(channels)]  # fmt: skip
            # The master sends initial metadata once it watches a worker; a cancelled call
            # ends instead.
            await asyncio.wait_for(
                asyncio.gather(*(c.initial_metadata() for c in calls), return_exceptions=True),
                120,
            )
            await asyncio.sleep(0.5)
            ended = sum(c.done() for c in calls)
            attached = fleet.workers_attached()
            for call in calls:
                call.cancel()
            for _ in range(200):  # the master notices each closed call (bounded: 20 s)
                if fleet.workers_attached() == 0:
                    break
                await asyncio.sleep(0.1)
            return ended, attached, fleet.workers_attached()
        finally:
            await asyncio.gather(*(channel.close() for channel in channels))


def test_a_fleet_that_attaches_at_once_is_watched_whole_and_let_go_whole(tmp_path):
    count = _room_for(BURST)
    ended, attached, left = asyncio.run(_burst(tmp_path, count))
    assert (ended, attached) == (0, count)  # not one call cancelled, every worker watched
    assert left == 0  # each closed call ends that worker's presence


async def _told_over_presence(tmp_path) -> bool:
    async with live_master(tiny_cartpole(), tmp_path / "run", train=False) as live:
        fleet = live.trainer.fleet
        async with grpc.aio.insecure_channel(f"127.0.0.1:{live.port}") as channel:
            call = pb_grpc.EvolutionStub(channel).Attach(_request(0))
            await asyncio.wait_for(call.initial_metadata(), 10)
            fleet.complete_run()
            update = await asyncio.wait_for(call.read(), 10)
            assert update.run_complete
            # Heard, so the worker leaves without another call, hanging up; the master's
            # linger (which waits for workers seen lately and not yet told) must not wait.
            call.cancel()
            try:
                await asyncio.wait_for(fleet.linger(poll_s=0.01), 2.0)
            except TimeoutError:
                return False
            return True


def test_a_worker_told_over_its_presence_call_is_not_waited_for(tmp_path):
    assert asyncio.run(_told_over_presence(tmp_path)), "linger waited for a worker already told"


FAST_PINGS = tuple((key, 1000 if key.endswith("_ms") else value) for key, value in PRESENCE_OPTIONS)
"""The master's presence options with every time in them set to one second (10 s in
production): a few seconds show many pings, and an unanswered one ends the call in about 2 s."""

BUSY_WORKER = """
import ctypes, sys, threading, time
import grpc
from neuro.v1 import evolution_pb2 as pb, evolution_pb2_grpc as pb_grpc

channel = grpc.insecure_channel(sys.argv[1])
call = pb_grpc.EvolutionStub(channel).Attach(
    pb.AttachRequest(protocol_version=pb.PROTOCOL_VERSION_CURRENT, worker_id="busy"))
threading.Thread(target=lambda: [None for _ in call], daemon=True).start()  # as the worker
call.initial_metadata()
print("busy", flush=True)
# The GIL held 3 s in one C call (ctypes.PyDLL does not release it), then 3 s of CPU spin.
ctypes.PyDLL(None).sleep(3)
spin_until = time.monotonic() + 3
while time.monotonic() < spin_until:
    sum(range(10**6))
print("open" if not call.done() else "ended", flush=True)
sys.stdin.readline()
"""


async def _busy_then_stopped(tmp_path) -> tuple[str, int, float]:
    """(what the busy worker saw of its call, the fewest workers attached while it was busy,
    seconds until a SIGSTOPped worker was taken for gone)"""
    async with live_master(tiny_cartpole(), tmp_path / "run", train=False,
                           options=FAST_PINGS) as live:  # fmt: skip
        fleet = live.trainer.fleet
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", BUSY_WORKER, f"127.0.0.1:{live.port}",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=worker_env(),
        )  # fmt: skip
        try:
            assert await asyncio.wait_for(child.stdout.readline(), 60) == b"busy\n"
            fewest = fleet.workers_attached()
            verdict = asyncio.ensure_future(child.stdout.readline())
            while not verdict.done():
                fewest = min(fewest, fleet.workers_attached())
                await asyncio.wait([verdict], timeout=0.05)
            seen = (await verdict).decode().strip()
            os.kill(child.pid, signal.SIGSTOP)  # a vanished host: nothing answers the pings
            stopped = time.monotonic()
            for _ in range(400):  # bounded: 20 s
                if fleet.workers_attached() == 0:
                    break
                await asyncio.sleep(0.05)
            return seen, fewest, time.monotonic() - stopped
        finally:
            child.kill()
            await child.wait()


def test_a_busy_worker_is_not_taken_for_gone_and_an_unanswering_one_is(tmp_path):
    """gRPC's C threads answer the master's pings: a worker whose Python is stalled (the GIL
    held, the CPU spun) stays attached; one that answers nothing (SIGSTOP) is dropped soon."""
    seen, fewest, gone_after_s = asyncio.run(_busy_then_stopped(tmp_path))
    assert (seen, fewest) == ("open", 1)
    assert gone_after_s < 10
