"""Hundreds of simulated workers against one master on loopback: no lease is lost.

The workers are asyncio tasks in this process, sharing a few channels. Each leases 1-4 tasks
and reports them at once; some die holding their tasks, whose leases lapse and are handed to
others. Every task must be recorded exactly once. Lease latency and throughput are reported,
not asserted: they depend on the machine.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest

from neuro.v1 import evolution_pb2 as pb
from neuro.v1 import evolution_pb2_grpc as pb_grpc
from tests.support.harness import live_master
from tests.support.tiny import tiny_cartpole

CURRENT = pb.PROTOCOL_VERSION_CURRENT
ACCEPTED, DUPLICATE = pb.RESULT_DISPOSITION_ACCEPTED, pb.RESULT_DISPOSITION_DUPLICATE
WORKERS = 300
CHANNELS = 4
MAX_DEATHS = 30
DEATH_CHANCE = 0.05
GENERATIONS, POPULATION, CANDIDATES, EPISODES = 2, 600, 10, 3
PER_GENERATION = POPULATION + CANDIDATES * EPISODES
LEASE_S = 1.0
CALL_S = 10.0
RUN_S = 60.0
# More attempts than workers can die, so a task that keeps landing on dying workers is still
# scored rather than recorded as failed.
CONFIG = {"generations": GENERATIONS, "population_size": POPULATION, "truncation": 20,
          "elite_candidates": CANDIDATES, "elite_episodes": EPISODES, "lease_seconds": LEASE_S,
          "max_task_attempts": MAX_DEATHS * 4 + 1}  # fmt: skip


@dataclass
class Tally:
    """What the simulated workers saw, over all of them."""

    lease_s: list[float] = field(default_factory=list)
    accepted: Counter = field(default_factory=Counter)
    duplicates: int = 0
    frames: int = 0
    deaths: int = 0
    abandoned: set[str] = field(default_factory=set)
    """Tasks that a worker died holding."""


def results_for(tasks) -> list[pb.TaskResult]:
    return [
        pb.TaskResult(task_id=t.task_id, run_id=t.run_id,
                      episode_returns=[float(t.genome.seeds[-1] % 100)] * t.episodes,
                      episode_frames=[10 + t.genome.seeds[-1] % 7] * t.episodes,
                      frames=(10 + t.genome.seeds[-1] % 7) * t.episodes)
        for t in tasks
    ]  # fmt: skip


async def simulated_worker(stub, name: str, rng: random.Random, tally: Tally) -> None:
    """Lease -> report until the run completes, or until it dies holding its tasks."""
    while True:
        request = pb.LeaseRequest(
            protocol_version=CURRENT, worker_id=name, max_tasks=rng.randint(1, 4)
        )
        started = time.perf_counter()
        response = await stub.Lease(request, timeout=CALL_S)
        tally.lease_s.append(time.perf_counter() - started)
        if response.run_complete:
            return
        if not response.tasks:
            await asyncio.sleep(response.retry_after_ms / 1000 * rng.uniform(0.5, 1.5))
            continue
        if tally.deaths < MAX_DEATHS and rng.random() < DEATH_CHANCE:
            tally.deaths += 1
            tally.abandoned.update(t.task_id for t in response.tasks)
            return
        results = results_for(response.tasks)
        report = pb.ReportRequest(protocol_version=CURRENT, worker_id=name, results=results)
        acks = (await stub.Report(report, timeout=CALL_S)).acks
        for result, ack in zip(results, acks, strict=True):
            assert ack.task_id == result.task_id and ack.disposition in (ACCEPTED, DUPLICATE)
            if ack.disposition == ACCEPTED:
                tally.accepted[ack.task_id] += 1
                tally.frames += result.frames
            else:
                tally.duplicates += 1


def all_task_ids() -> set[str]:
    ids = set()
    for g in range(GENERATIONS):
        ids |= {f"g{g}/o/{i}/0" for i in range(POPULATION)}
        ids |= {f"g{g}/e/{c}/{e}" for c in range(CANDIDATES) for e in range(EPISODES)}
    return ids


@pytest.mark.slow
def test_hundreds_of_workers_lose_no_lease(tmp_path, record_property, capsys):
    async def main():
        async with live_master(tiny_cartpole(**CONFIG), tmp_path / "run") as live:
            training = live.training
            options = [("grpc.use_local_subchannel_pool", 1)]
            channels = [live.channel(options) for _ in range(CHANNELS)]
            tally = Tally()
            started = time.perf_counter()
            workers = [
                asyncio.ensure_future(
                    simulated_worker(
                        pb_grpc.EvolutionStub(channels[i % CHANNELS]),
                        f"sim-{i}",
                        random.Random(i),
                        tally,
                    )
                )
                for i in range(WORKERS)
            ]
            finished = []
            training.add_done_callback(lambda _: finished.append(time.perf_counter()))
            try:
                # Workers leave once they see the run complete; a worker that fails ends the wait.
                done, running = await asyncio.wait(
                    [training, *workers], timeout=RUN_S, return_when=asyncio.FIRST_EXCEPTION
                )
                for task in done:
                    task.result()
                assert not running, f"{len(running)} of the run and its workers still going"
                records, wall_s = training.result(), finished[0] - started
                status = await pb_grpc.EvolutionStub(channels[0]).Status(
                    pb.StatusRequest(), timeout=CALL_S
                )
            finally:
                for worker in workers:
                    worker.cancel()
                await asyncio.gather(*workers, return_exceptions=True)
        return records, status, tally, wall_s

    records, status, tally, wall_s = asyncio.run(main())

    assert [r.generation for r in records] == list(range(GENERATIONS))
    assert [r.generation_evaluations for r in records] == [PER_GENERATION] * GENERATIONS
    assert [r.evaluations for r in records] == [
        PER_GENERATION * (g + 1) for g in range(GENERATIONS)
    ]
    assert [r.failed_evaluations for r in records] == [0] * GENERATIONS
    # Every task recorded exactly once, and the frames of exactly those reports counted.
    assert set(tally.accepted) == all_task_ids()
    assert set(tally.accepted.values()) == {1}
    assert records[-1].frames == status.frames == tally.frames
    assert status.run_complete and (status.tasks_pending, status.tasks_leased) == (0, 0)
    assert status.evaluations == PER_GENERATION * GENERATIONS
    # A task a worker died holding comes back only when its lease lapses.
    reissued = sum(r.leases_reissued for r in records)
    # A task a worker died holding was leased again once its lease lapsed, or its backup copy
    # (leased to an idle worker at the phase's end) was recorded first.
    won = sum(r.backup_wins for r in records)
    assert status.leases_reissued == reissued
    assert reissued + won >= len(tally.abandoned) > 0

    p50, p99 = (statistics.quantiles(tally.lease_s, n=100)[i] * 1000 for i in (49, 98))
    # Lapsed leases hold each phase up for LEASE_S, so this is not the master's capacity.
    results_per_s = len(tally.accepted) / wall_s
    figures = {
        "workers": WORKERS,
        "leases": len(tally.lease_s),
        "lease_p50_ms": round(p50, 2),
        "lease_p99_ms": round(p99, 2),
        "results_per_s": round(results_per_s, 1),
        "deaths": tally.deaths,
        "reissued": reissued,
        "duplicates": tally.duplicates,
        "wall_s": round(wall_s, 2),
    }
    for name, value in figures.items():
        record_property(name, value)
    with capsys.disabled():
        print("\nload: " + ", ".join(f"{name} {value}" for name, value in figures.items()))
