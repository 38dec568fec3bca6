"""A stopping master ends its workers' presence calls itself, within its grace, instead of
having gRPC cut them at the end of it: each cut call was logged as an unhandled CancelledError
with a traceback, at every SIGTERM (`docker stop`, `docker compose down`) of a master with
workers attached."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
import pytest

from neuro.v1 import evolution_pb2 as pb
from tests.support.harness import live_master
from tests.support.tiny import tiny_cartpole

GRACE_S = 5.0


async def _stop_with_workers_attached(tmp_path, workers: int) -> tuple[list, float]:
    async with live_master(tiny_cartpole(), tmp_path / "run", train=False) as live:
        stub = live.stub()
        version = pb.PROTOCOL_VERSION_CURRENT
        calls = [stub.Attach(pb.AttachRequest(protocol_version=version, worker_id=f"w{i}"))
                 for i in range(workers)]  # fmt: skip
        await asyncio.wait_for(asyncio.gather(*(c.initial_metadata() for c in calls)), 10)
        assert live.trainer.fleet.workers_attached() == workers
        started = time.monotonic()
        await live.master.stop(GRACE_S)
        codes = [await asyncio.wait_for(c.code(), GRACE_S + 5) for c in calls]
        return codes, time.monotonic() - started


def test_a_stopping_master_ends_presence_calls_within_its_grace(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    codes, took = asyncio.run(_stop_with_workers_attached(tmp_path, workers=3))
    # Ended by the master (OK: the worker calls again, and finds it gone or back), not cut.
    assert codes == [grpc.StatusCode.OK] * 3, codes
    assert took < GRACE_S, f"the stop waited out its grace ({took:.1f} s)"
    unhandled = [r for r in caplog.records if "not handled" in r.getMessage()]
    assert not unhandled, [r.getMessage() for r in unhandled]
