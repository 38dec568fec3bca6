"""Workers that refuse a run's tasks (a module the run needs cannot be imported on them), as
the master sees them: no tasks for a refusing worker, its reason in Status, and the run stopped
with that reason once every attached worker refuses, never before; a worker that asks again
without a refusal, or leaves, changes the count."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from master.fleet.phases import RunRefused
from master.observe.status import format_status, status_json
from master.run.checkpoint import load_checkpoint
from neuro.v1 import evolution_pb2 as pb
from tests.support.fleet_calls import CURRENT, lease, lease_some
from tests.support.harness import live_master
from tests.support.tiny import tiny_cartpole

TEST_S = 20.0
WHY = (
    "cannot import module 'userpkg' (env userpkg:MyEnv-v0): ModuleNotFoundError: No module "
    "named 'userpkg'"
)


def refusal(run_id: str, reason: str = WHY) -> pb.RunRefusal:
    return pb.RunRefusal(run_id=run_id, reason=reason)


async def attach(stub, worker: str):
    call = stub.Attach(pb.AttachRequest(protocol_version=CURRENT, worker_id=worker))
    await asyncio.wait_for(call.initial_metadata(), 10)
    return call


async def stopped_by_refusal(live) -> RunRefused:
    """The error the run stopped with (the training task is then done, and left alone)."""
    with pytest.raises(RunRefused) as stopped:
        await asyncio.wait_for(live.training, 10)
    live.training = None
    return stopped.value


async def until(condition, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition did not hold in time")


def run(scenario, tmp_path: Path) -> None:
    async def main():
        async with live_master(tiny_cartpole(), tmp_path / "run") as live:
            await asyncio.wait_for(scenario(live), TEST_S)

    asyncio.run(main())


def test_the_run_stops_with_the_reason_once_every_attached_worker_refuses(tmp_path: Path) -> None:
    async def scenario(live):
        stub = live.stub()
        run_id = live.trainer.config["run_id"]
        calls = [await attach(stub, "w1"), await attach(stub, "w2")]
        held = await lease_some(stub, "w1", max_tasks=2)
        # w1 cannot import the env's module: it hands its tasks back and says why.
        await stub.Release(pb.ReleaseRequest(protocol_version=CURRENT, worker_id="w1",
                                             task_ids=[t.task_id for t in held]))  # fmt: skip
        answer = await lease(stub, "w1", refusal=refusal(run_id))
        assert not answer.tasks and answer.retry_after_ms == 5000
        # Status names the refusing worker and why; the run goes on, w2 has not refused.
        status = await stub.Status(pb.StatusRequest())
        shown = {w.worker_id: w.refusal for w in status.worker_status}
        assert shown == {"w1": WHY, "w2": ""}
        # neuro-master status says so, in its table and its JSON.
        w1_line = next(line for line in format_status(status).splitlines() if line.startswith("w1"))
        assert w1_line.endswith(f"refuses: {WHY}")
        assert {w["worker_id"]: w["refusal"] for w in status_json(status)["worker_status"]} == shown
        await asyncio.sleep(0.2)
        assert not live.training.done()
        assert (await lease(stub, "w2")).tasks  # w2 is leased what w1 handed back
        # w2 refuses too: every attached worker refuses, and the run stops with the reason.
        await lease(stub, "w2", refusal=refusal(run_id))
        error = await stopped_by_refusal(live)
        assert str(error) == f"every attached worker (2) refuses this run's tasks: {WHY}"
        for call in calls:
            call.cancel()

    run(scenario, tmp_path)
    # Nothing of the run is lost: its checkpoint is there, at generation 0, to resume.
    payload = load_checkpoint(tmp_path / "run")
    assert payload is not None and payload["algorithm"]["state"]["generation"] == 0


def test_a_worker_that_asks_again_without_refusing_gets_tasks(tmp_path: Path) -> None:
    async def scenario(live):
        stub = live.stub()
        run_id = live.trainer.config["run_id"]
        calls = [await attach(stub, "w1"), await attach(stub, "w2")]
        await lease(stub, "w1", max_tasks=1, refusal=refusal("another-run"))  # not this run
        assert live.trainer.fleet.refusals() == {}
        await lease(stub, "w1", refusal=refusal(run_id))
        assert live.trainer.fleet.refusals() == {"w1": WHY}
        # Restarted with the module installed, it asks without a refusal: tasks again.
        assert await lease_some(stub, "w1", max_tasks=1)
        assert live.trainer.fleet.refusals() == {}
        await lease(stub, "w2", refusal=refusal(run_id))  # one of two refuses: the run goes on
        await asyncio.sleep(0.2)
        assert not live.training.done()
        for call in calls:
            call.cancel()

    run(scenario, tmp_path)


def test_a_refusal_stops_nothing_while_no_worker_is_attached(tmp_path: Path) -> None:
    async def scenario(live):
        stub = live.stub()
        run_id = live.trainer.config["run_id"]
        answer = await lease(stub, "old", refusal=refusal(run_id))  # never attached
        assert not answer.tasks
        assert live.trainer.fleet.refusals() == {"old": WHY}
        await asyncio.sleep(0.2)
        assert not live.training.done()
        # It asks again without the refusal: withdrawn, and it is leased tasks.
        assert await lease_some(stub, "old")
        assert live.trainer.fleet.refusals() == {}

    run(scenario, tmp_path)


def test_when_the_last_worker_that_would_run_the_tasks_leaves_the_run_stops(
    tmp_path: Path,
) -> None:
    async def scenario(live):
        stub = live.stub()
        run_id = live.trainer.config["run_id"]
        refusing = await attach(stub, "w1")
        running = await attach(stub, "w2")
        await lease(stub, "w1", refusal=refusal(run_id))
        await asyncio.sleep(0.2)
        assert not live.training.done()
        running.cancel()  # w2's process is gone; the one left refuses
        error = await stopped_by_refusal(live)
        assert str(error).startswith("every attached worker (1) refuses this run's tasks: ")
        refusing.cancel()

    run(scenario, tmp_path)
