"""An adversary holding the valid token cannot score, fail, steal or free anyone's task.

Honest worker processes train a small CartPole run on a real master on loopback, while an
in-process client with the token sends well-formed but foreign, repeated and guessed
messages: results for guessed task ids with impossible scores, errors for others' tasks (five
copies each), heartbeats and releases of every guessed id, every batch twice, and reports for
another run. Every generation must still record exactly N + K*E evaluations, none failed, and
no recorded score may be one the adversary sent. The adversary's loop is bounded in calls
and in time.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from pathlib import Path

import pytest

from master.run.rundir import read_metrics
from neuro.v1 import evolution_pb2 as pb
from neuro.v1 import evolution_pb2_grpc as pb_grpc
from neuro.wire import bearer_metadata
from tests.support.harness import live_master
from tests.support.processes import spawn_worker, stop_processes
from tests.support.tiny import tiny_cartpole

pytestmark = pytest.mark.slow

TOKEN = "adversary-test-token-3b7e1d"
AUTH = bearer_metadata(TOKEN)
CURRENT = pb.PROTOCOL_VERSION_CURRENT
N, K, E, GENERATIONS = 16, 2, 3, 3
CARTPOLE_MAX = 500.0
FORGED_SCORES = (1e300, 123.5)
"""What the adversary reports: impossible for CartPole (above 500, or not a whole number)."""
MAX_ROUNDS = 2000
RUN_S = 150.0
CALL_S = 5.0
CONFIG = {"generations": GENERATIONS, "population_size": N, "truncation": 4,
          "elite_candidates": K, "elite_episodes": E, "target_score": None,
          "lease_seconds": 4.0, "seed": 11}  # fmt: skip


def guessed_ids(generation: int) -> list[str]:
    """Every task id of a generation, as the id scheme makes them easy to guess."""
    ids = [f"g{generation}/o/{i}/0" for i in range(N)]
    return ids + [f"g{generation}/e/{c}/{e}" for c in range(K) for e in range(E)]


async def adversary(stub: pb_grpc.EvolutionStub, run_id: str, training, tally: Counter) -> None:
    """Foreign, repeated and guessed messages until the run ends (bounded)."""
    rng = random.Random(5)
    deadline = time.monotonic() + RUN_S
    common = {"protocol_version": CURRENT, "worker_id": "mallory"}
    for _ in range(MAX_ROUNDS):
        if training.done() or time.monotonic() > deadline:
            return
        tally["rounds"] += 1
        status = await stub.Status(pb.StatusRequest(), timeout=CALL_S, metadata=AUTH)
        ids = guessed_ids(status.generation) + guessed_ids(status.generation + 1)
        picked = rng.sample(ids, 8)
        forged = [
            pb.TaskResult(task_id=t, run_id=run_id, episode_returns=[rng.choice(FORGED_SCORES)],
                          episode_frames=[1], frames=1)
            for t in picked
        ]  # fmt: skip
        failures = [pb.TaskResult(task_id=t, run_id=run_id, error="forged failure") for t in picked]
        foreign = [pb.TaskResult(task_id=t, run_id="another-run", episode_returns=[1e300],
                                 episode_frames=[1], frames=1) for t in picked]  # fmt: skip
        for batch in (forged, forged, failures * 5, failures * 5, foreign):
            request = pb.ReportRequest(**common, results=batch)
            acks = (await stub.Report(request, timeout=CALL_S, metadata=AUTH)).acks
            tally.update(pb.ResultDisposition.Name(ack.disposition) for ack in acks)
        beat = pb.HeartbeatRequest(**common, task_ids=ids)
        dropped = (await stub.Heartbeat(beat, timeout=CALL_S, metadata=AUTH)).dropped_task_ids
        tally["heartbeats_kept"] += len(ids) - len(dropped)
        release = pb.ReleaseRequest(**common, task_ids=ids)
        tally["released"] += (await stub.Release(release, timeout=CALL_S, metadata=AUTH)).released
        await asyncio.sleep(rng.uniform(0.0, 0.02))


async def _run(tmp_path: Path) -> tuple[list, Counter, list[int | None]]:
    config = tiny_cartpole(**CONFIG)
    async with live_master(config, tmp_path / "run", token=TOKEN) as live:
        training = live.training
        env = {"NEURO_TOKEN": TOKEN}
        workers = [spawn_worker(live.port, f"honest-{i}", env=env) for i in range(2)]
        tally: Counter = Counter()
        try:
            attack = asyncio.ensure_future(adversary(live.stub(), config.run_id, training, tally))
            done, _ = await asyncio.wait([training, attack], timeout=RUN_S + 30,
                                         return_when=asyncio.FIRST_EXCEPTION)  # fmt: skip
            for task in done:
                task.result()  # an adversary's call that failed, or the run, fails the test
            records = await asyncio.wait_for(training, RUN_S)
            await asyncio.wait_for(attack, CALL_S * 3)
            # The master still serves: the honest workers hear that the run is over and leave.
            deadline = time.monotonic() + 30
            while any(w.poll() is None for w in workers) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return records, tally, [w.poll() for w in workers]
        finally:
            stop_processes(workers)


def test_an_adversary_with_the_token_changes_no_result(tmp_path: Path, noise_cache: Path) -> None:
    records, tally, exit_codes = asyncio.run(_run(tmp_path))
    assert tally["rounds"] >= 5, f"the run ended before the adversary got going: {tally}"
    assert tally["RESULT_DISPOSITION_ACCEPTED"] == 0, tally
    assert tally["heartbeats_kept"] == 0 and tally["released"] == 0, tally
    assert exit_codes == [0, 0]
    assert [r.generation for r in records] == list(range(GENERATIONS))
    lines = read_metrics(tmp_path / "run/metrics.jsonl")
    assert [line["generation"] for line in lines] == list(range(GENERATIONS))
    frames = evaluations = 0
    for line in lines:
        # Exactly N + K*E evaluations each, none of them failed by a forged error.
        assert line["generation_evaluations"] == N + K * E
        assert line["failed_evaluations"] == 0
        frames += line["generation_frames"]
        evaluations += line["generation_evaluations"]
        assert (line["frames"], line["evaluations"]) == (frames, evaluations)
        # CartPole pays 1 a step for at most 500 steps: a forged score cannot hide.
        assert line["score_max"] <= CARTPOLE_MAX and line["score_max"] == int(line["score_max"])
        assert line["elite_score"] <= CARTPOLE_MAX
        assert line["score_mean"] <= CARTPOLE_MAX
