"""A fleet's presence calls against a real master: a burst of thousands is watched whole, and a
worker told over its presence call that the run is over holds up nobody's exit."""

from __future__ import annotations

import asyncio
import resource

import grpc

from neuro.v1 import evolution_pb2 as pb
from neuro.v1 import evolution_pb2_grpc as pb_grpc
from tests.support.harness import live_master
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
        channels = [grpc.aio.insecure_channel(f"127.0.0.1:{live.port}") for _ in range(count)]
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
            fleet.run_complete = True
            update = await asyncio.wait_for(call.read(), 10)
            assert update.run_complete
            # The worker may leave now without another call; the master's linger (which
            # waits for workers seen lately and not yet told) must not wait for it.
            try:
                await asyncio.wait_for(fleet.linger(poll_s=0.01), 2.0)
            except TimeoutError:
                return False
            return True


def test_a_worker_told_over_its_presence_call_is_not_waited_for(tmp_path):
    assert asyncio.run(_told_over_presence(tmp_path)), "linger waited for a worker already told"
