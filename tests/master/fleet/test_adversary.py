"""An adversary holding the valid token cannot score, fail, steal or free anyone's task.

Honest worker processes train a small CartPole run on a real master on loopback, while an
in-process client with the token sends well-formed but foreign, repeated and guessed
messages: results for guessed task ids with impossible scores, errors for others' tasks (five
copies each), heartbeats and releases of every guessed id, every batch twice, and reports for
another run. Every generation must still record exactly N + K*E evaluations, none failed, and
no recorded score may be one the adversary sent. The adversary's loop is bounded in calls
and in time.

A second adversary holds leases beside the honest workers, as a worker may: its observation
sums that poison the normaliser together or alone, or outweigh the run, are refused and the
task handed back; its far-away behaviours are accepted (they are its leases' results) and
still choose no parent by cancelling the others' novelty.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from pathlib import Path

import grpc
import numpy as np
import pytest

from master.config import inspect_env_id, preset
from master.run.checkpoint import load_checkpoint
from master.run.rundir import read_metrics
from neuro.observation_stats import INITIAL_COUNT, ObservationStats
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
FORGED_SCORES = (1e15, 123.5)
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
        foreign = [pb.TaskResult(task_id=t, run_id="another-run", episode_returns=[1e15],
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


# -- a lease holder's statistics and behaviours (issue 34) -------------------------------------

PENDULUM_CONFIG = {"algorithm": "es", "observation_norm": True, "pairs": 3, "eval_episodes": 1,
                   "hidden_sizes": (8,), "noise_table_size": 2**16, "generations": 3,
                   "target_score": None, "lease_seconds": 4.0, "seed": 5}  # fmt: skip


def poisoned_sums(task: pb.Task, attack: int) -> pb.TaskResult:
    """Sums each finite, that overflow together, poison the normaliser, or outweigh the run."""
    count, total, squares, frames = [
        (1.0, 0.0, 1.7e308, 1),  # two of these overflowed the phase's sum
        (1.0, 1e45, 1e90, 1),  # a mean and std of inf for every later version
        (4e9, 4e9, 8e9, 2**32 - 1),  # a count only the worker's own frames vouched for
    ][attack % 3]
    result = pb.TaskResult(task_id=task.task_id, run_id=task.run_id,
                           episode_returns=[-1.0] * task.episodes,
                           episode_frames=[frames] * task.episodes,
                           frames=frames * task.episodes)  # fmt: skip
    result.observation_sums.CopyFrom(
        pb.ObservationSums(count=count, sum=[total] * 3, sum_of_squares=[squares] * 3)
    )
    return result


HELD_PER_PHASE = 2
"""Tasks the holding adversary takes per phase: honest workers play the rest."""


async def holding_adversary(stub, training, tally: Counter, attack) -> None:
    """Leases one task at a time beside the honest workers (at most HELD_PER_PHASE a phase)
    and reports `attack(task, n)` for it: a refused report is handed back (Release), so
    honest workers run the task."""
    deadline = time.monotonic() + RUN_S
    common = {"protocol_version": CURRENT, "worker_id": "mallory"}
    held: Counter = Counter()
    for _ in range(MAX_ROUNDS):
        if training.done() or time.monotonic() > deadline:
            return
        status = await stub.Status(pb.StatusRequest(), timeout=CALL_S, metadata=AUTH)
        phase = (status.generation, status.phase)
        if held[phase] >= HELD_PER_PHASE:
            await asyncio.sleep(0.02)
            continue
        lease = pb.LeaseRequest(**common, max_tasks=1)
        tasks = list((await stub.Lease(lease, timeout=CALL_S, metadata=AUTH)).tasks)
        if not tasks:
            await asyncio.sleep(0.02)
            continue
        # Attacks in turn, by the tasks it got (not the rounds: most find nothing to lease).
        attempt = held.total()
        held[phase] += 1
        request = pb.ReportRequest(**common, results=[attack(tasks[0], attempt)])
        try:
            acks = (await stub.Report(request, timeout=CALL_S, metadata=AUTH)).acks
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
            tally[f"refused {attempt % 3}"] += 1
            release = pb.ReleaseRequest(**common, task_ids=[tasks[0].task_id])
            await stub.Release(release, timeout=CALL_S, metadata=AUTH)
            continue
        tally.update(pb.ResultDisposition.Name(ack.disposition) for ack in acks)
        tally["behaviours"] += 1


async def _run_with_a_holder(config, run_dir: Path, attack, wrap=None) -> tuple[list, Counter]:
    async with live_master(config, run_dir, token=TOKEN, train=False) as live:
        if wrap is not None:
            wrap(live.trainer.algorithm)
        training = live.start_training()
        workers = [spawn_worker(live.port, f"honest-{i}", env={"NEURO_TOKEN": TOKEN})
                   for i in range(2)]  # fmt: skip
        tally: Counter = Counter()
        try:
            attack_task = asyncio.ensure_future(
                holding_adversary(live.stub(), training, tally, attack)
            )
            done, _ = await asyncio.wait([training, attack_task], timeout=RUN_S + 30,
                                         return_when=asyncio.FIRST_EXCEPTION)  # fmt: skip
            for task in done:
                task.result()
            records = await asyncio.wait_for(training, RUN_S)
            await asyncio.wait_for(attack_task, CALL_S * 3)
            return records, tally
        finally:
            stop_processes(workers)


def test_a_lease_holder_cannot_poison_the_observation_statistics(
    tmp_path: Path, noise_cache: Path
) -> None:
    config = preset(inspect_env_id("Pendulum-v1"), **PENDULUM_CONFIG)
    _, tally = asyncio.run(_run_with_a_holder(config, tmp_path / "run", poisoned_sums))
    assert all(tally[f"refused {n}"] >= 1 for n in range(3)), tally
    assert tally["RESULT_DISPOSITION_ACCEPTED"] == 0, tally
    lines = read_metrics(tmp_path / "run/metrics.jsonl")
    assert [line["generation"] for line in lines] == list(range(3))
    for line in lines:
        assert line["failed_evaluations"] == 0
        # Pendulum feeds one observation per frame: only the honest workers' were counted.
        assert line["observation_count"] == pytest.approx(INITIAL_COUNT + line["frames"])
    state = load_checkpoint(tmp_path / "run")["algorithm"]["state"]
    mean, std = ObservationStats.from_json(state["observations"]).normaliser()
    assert np.isfinite(mean).all() and np.isfinite(std).all() and (std > 0).all()


POISON_BC = 1e12


def extreme_behaviour(task: pb.Task, attack: int) -> pb.TaskResult:
    """A whole result of a leased task, with a far-away but finite BC: accepted, as any holder's."""
    episodes, size = task.episodes, task.behaviour_size
    return pb.TaskResult(task_id=task.task_id, run_id=task.run_id,
                         episode_returns=[1.0] * episodes, episode_frames=[1] * episodes,
                         frames=episodes, behaviours=[POISON_BC] * (episodes * size))  # fmt: skip


def parents_by_true_novelty(tell_checks: list):
    """Wraps GA-NS's tell: after each offspring phase, its parents must be the most novel by
    direct distances (the poisoner may be one: it is truly far away; the rest by novelty)."""

    def wrap(algorithm) -> None:
        original = algorithm.tell

        def tell(returns, behaviours=None, observation_stats=None):
            offspring = algorithm.state.phase == "offspring"
            requests, archive = algorithm.ask(), algorithm.archive.behaviours.copy()
            summary = original(returns, behaviours, observation_stats)
            if offspring:
                bcs = np.concatenate([behaviours[r.key][:1] for r in requests]).astype(np.float64)
                reference = np.concatenate([archive, bcs]) if len(archive) else bcs
                values = []
                for i, row in enumerate(bcs):
                    distances = sorted(float(np.linalg.norm(row - other))
                                       for j, other in enumerate(reference)
                                       if j != len(archive) + i)  # fmt: skip
                    values.append(float(np.mean(distances[: algorithm.novelty_config.k])))
                order = sorted(range(len(bcs)), key=lambda i: -values[i])
                expected = [requests[i].genome for i in order[: algorithm.config.truncation]]
                tell_checks.append((algorithm.state.parents == expected, values))
            return summary

        algorithm.tell = tell

    return wrap


def test_one_extreme_behaviour_does_not_choose_the_parents(
    tmp_path: Path, noise_cache: Path
) -> None:
    config = tiny_cartpole(algorithm="ga-ns", k=3, archive_probability=0.2, **CONFIG)
    checks: list = []
    records, tally = asyncio.run(
        _run_with_a_holder(
            config, tmp_path / "run", extreme_behaviour, parents_by_true_novelty(checks)
        )
    )
    assert tally["RESULT_DISPOSITION_ACCEPTED"] >= 1, tally  # the poisoner's results counted
    assert [r.generation for r in records] == list(range(GENERATIONS))
    assert len(checks) == GENERATIONS
    assert all(ok for ok, _ in checks), checks
    # The poisoner's far-away BCs were among the offspring measured, and honest ones too.
    assert any(max(values) > POISON_BC / 10 for _, values in checks), checks
    assert all(min(values) < POISON_BC / 10 for _, values in checks), checks
    assert all(r.extra["novelty_mean"] is not None and r.extra["novelty_mean"] > 0
               for r in records)  # fmt: skip
