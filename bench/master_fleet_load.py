"""The master under a whole fleet's traffic: N simulated workers that hold a presence call,
lease, heartbeat and report as worker/client/ does, each "playing" episodes whose lengths are
drawn from real Frostbite play, against the real master (population 1000, elite 10 x 30)
pinned to one core. Prints the calls a second by kind, the master's CPU per wall second and
the busiest client process's (near 1.0: the simulated fleet, not the master, set the pace), the
results accepted, generations done and the lease latency over the window.

    python -m bench.master_fleet_load --workers 10000 --client-procs 12 --seconds 60 \\
        --json bench/results/master-fleet-load-<machine>-<date>.json

A simulated worker: one connection; an Attach call held open (reopened after a jittered
backoff if it ends); at most one task running and one prefetched (it asks for 2 when it holds
none, 1 when it holds one); a task takes its episode's steps x --step-ms; every quarter lease
it heartbeats what it holds and drops what the master says is done elsewhere; after an empty
lease it waits the master's retry_after_ms (kept in 0.05-60 s, as the worker does). A dropped
running task is abandoned at once. Episode lengths: bench/results/frostbite-episode-steps.json.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import json
import random
import time
from pathlib import Path
from typing import Any

import grpc

from bench import master_capacity as mc
from bench.common import (
    EPISODE_STEPS,
    cpu_seconds,
    pin_to_cores,
    provenance,
    raise_file_limit,
    write_json,
)
from neuro.v1 import evolution_pb2 as pb

RETRY_RANGE_S = (0.05, 60.0)
HEARTBEAT_RANGE_S = (0.5, 300.0)


@dataclasses.dataclass(frozen=True)
class Load:
    workers: int
    client_procs: int
    seconds: float
    warmup: float
    step_ms: float
    seed: int


def _steps(kind: str) -> list[int]:
    recorded = json.loads(EPISODE_STEPS.read_text())
    return [int(s) for s in recorded[kind]["steps"]]


class _Tally:
    def __init__(self) -> None:
        self.calls: collections.Counter = collections.Counter()
        self.acks: collections.Counter = collections.Counter()
        self.lease_s: list[float] = []
        self.presence_reopened = 0


async def _fleet_worker(port: int, name: str, window, tally: _Tally, steps, load: Load) -> bool:
    """Runs until the window closes; whether its presence call was open at the end."""
    start, end = window
    rng = random.Random(f"{load.seed}-{name}")
    step_s = load.step_ms / 1000.0
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=mc.CLIENT_OPTIONS)
    call = lambda method, req, resp, kind="unary_unary": mc.rpc(channel, method, req, resp, kind)  # noqa: E731
    lease = call("Lease", pb.LeaseRequest, pb.LeaseResponse)
    report = call("Report", pb.ReportRequest, pb.ReportResponse)
    heartbeat = call("Heartbeat", pb.HeartbeatRequest, pb.HeartbeatResponse)
    attach = call("Attach", pb.AttachRequest, pb.AttachUpdate, "unary_stream")
    common = {"protocol_version": mc.CURRENT, "worker_id": name}
    presence = attach(pb.AttachRequest(**common))
    queue: collections.deque = collections.deque()
    next_lease = 0.0
    beat_s = HEARTBEAT_RANGE_S[0]
    inside = lambda: start <= time.monotonic() <= end  # noqa: E731

    def count(kind: str) -> None:
        if inside():
            tally.calls[kind] += 1

    try:
        while (now := time.monotonic()) < end:
            if presence.done():
                tally.presence_reopened += 1
                await asyncio.sleep(rng.uniform(0.05, 0.1))
                presence = attach(pb.AttachRequest(**common))
            if len(queue) < 2 and now >= next_lease:
                began = time.monotonic()
                reply = await lease(pb.LeaseRequest(**common, max_tasks=2 - len(queue)),
                                    timeout=mc.CALL_S)  # fmt: skip
                count("lease" if reply.tasks else "empty lease")
                if inside():
                    tally.lease_s.append(time.monotonic() - began)
                if reply.run_complete:
                    break
                if reply.tasks:
                    queue.extend(reply.tasks)
                    beat_s = min(max(reply.tasks[0].lease_seconds / 4, HEARTBEAT_RANGE_S[0]),
                                 HEARTBEAT_RANGE_S[1])  # fmt: skip
                else:
                    low, high = RETRY_RANGE_S
                    next_lease = now + min(max(reply.retry_after_ms / 1000, low), high)
            if not queue:
                await asyncio.sleep(max(0.0, min(next_lease, end) - time.monotonic()))
                continue
            task = queue[0]
            pool = steps["elite" if "/e/" in task.task_id else "offspring"]
            done_at = time.monotonic() + rng.choice(pool) * step_s * task.episodes
            dropped = False
            while not dropped and (now := time.monotonic()) < min(done_at, end):
                await asyncio.sleep(max(0.0, min(done_at, now + beat_s, end) - now))
                if time.monotonic() < min(done_at, end):
                    held = [t.task_id for t in queue]
                    answer = await heartbeat(pb.HeartbeatRequest(**common, task_ids=held),
                                             timeout=mc.CALL_S)  # fmt: skip
                    count("heartbeat")
                    gone = set(answer.dropped_task_ids)
                    dropped = task.task_id in gone
                    queue = collections.deque(t for t in queue if t.task_id not in gone)
            if dropped:
                continue
            if time.monotonic() >= end:
                break
            queue.popleft()
            request = pb.ReportRequest(**common, results=[mc.result_for(task)])
            acks = (await report(request, timeout=mc.CALL_S)).acks
            count("report")
            if inside():
                tally.acks.update(pb.ResultDisposition.Name(a.disposition) for a in acks)
        return not presence.done()
    finally:
        presence.cancel()
        await channel.close()


async def _status(port: int) -> tuple[int, int]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        status = mc.rpc(channel, "Status", pb.StatusRequest, pb.StatusResponse)
        answer = await status(pb.StatusRequest(), timeout=mc.CALL_S)
        return answer.generation, answer.evaluations


def clients_process(conn, port: int, server_pid: int, names: list[str], load: Load, first: bool):
    """Simulated workers on the other cores; sends back counts, latencies and CPU use."""
    import os

    cores = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()
    pin_to_cores((cores - {mc.SERVER_CORE}) or cores)
    raise_file_limit()
    steps = {kind: _steps(kind) for kind in ("offspring", "elite")}
    tally = _Tally()
    conn.send("ready")
    window = conn.recv()

    async def marks() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for label, moment in (("start", window[0]), ("end", window[1])):
            await asyncio.sleep(max(0.0, moment - time.monotonic()))
            out[f"server_cpu_{label}"] = cpu_seconds(server_pid)
            out[f"client_cpu_{label}"] = cpu_seconds(os.getpid())
            if first:
                out[f"status_{label}"] = await _status(port)
        return out

    async def main() -> dict[str, Any]:
        workers = [_fleet_worker(port, name, window, tally, steps, load) for name in names]
        *present, figures = await asyncio.gather(*workers, marks())
        figures["present_at_end"] = sum(present)
        return figures

    figures = asyncio.run(main())
    conn.send({"calls": dict(tally.calls), "acks": dict(tally.acks), "lease_s": tally.lease_s,
               "presence_reopened": tally.presence_reopened, **figures})  # fmt: skip


def measure(load: Load) -> dict[str, Any]:
    settings = mc.Settings(seconds=load.seconds, warmup=load.warmup, clients=load.workers,
                           client_procs=load.client_procs, population=1000,
                           elite_candidates=10, elite_episodes=30, echo_seeds=0,
                           max_idle_s=60.0, server_option=())  # fmt: skip
    process, conn = mc.start_process(mc.master_process, settings)
    clients = []
    try:
        if not conn.poll(mc.START_S):
            raise RuntimeError(f"the master did not start within {mc.START_S:.0f}s")
        _, port = conn.recv()
        names = [f"fleet-{i}" for i in range(load.workers)]
        for i in range(load.client_procs):
            args = (port, process.pid, names[i :: load.client_procs], load, i == 0)
            clients.append(mc.start_process(clients_process, *args))
        tallies = mc.measure_window(clients, load.warmup, load.seconds, 6 * mc.CALL_S, "master")
    finally:
        for client, _ in clients:
            client.join(mc.CALL_S)
            if client.is_alive():
                client.kill()
        mc.finish_process(process, conn)
    return _summary(load, tallies)


def _summary(load: Load, tallies: list[dict[str, Any]]) -> dict[str, Any]:
    calls = sum((collections.Counter(t["calls"]) for t in tallies), collections.Counter())
    acks = sum((collections.Counter(t["acks"]) for t in tallies), collections.Counter())
    lease_ms = sorted(1000 * s for t in tallies for s in t["lease_s"])
    first = tallies[0]
    (gen0, evals0), (gen1, evals1) = first["status_start"], first["status_end"]

    def pct(q: float) -> float | None:
        return (
            round(lease_ms[min(len(lease_ms) - 1, int(q * len(lease_ms)))], 2) if lease_ms else None
        )

    per_s = {kind: round(n / load.seconds, 1) for kind, n in sorted(calls.items())}
    return {
        "workers": load.workers,
        "calls_per_s": per_s,
        "all_calls_per_s": round(sum(calls.values()) / load.seconds, 1),
        "acks": dict(acks),
        "results_per_s": round(acks["RESULT_DISPOSITION_ACCEPTED"] / load.seconds, 1),
        "evaluations_recorded": evals1 - evals0,
        "generations": gen1 - gen0,
        "server_cpu_per_wall": round(
            (first["server_cpu_end"] - first["server_cpu_start"]) / load.seconds, 3
        ),
        # Near 1.0 per client process means the simulated fleet, not the master, set the pace.
        "client_cpu_per_wall": round(
            max(t["client_cpu_end"] - t["client_cpu_start"] for t in tallies) / load.seconds, 3
        ),
        "lease_p50_ms": pct(0.5),
        "lease_p99_ms": pct(0.99),
        "present_at_end": sum(t["present_at_end"] for t in tallies),
        "presence_reopened": sum(t["presence_reopened"] for t in tallies),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--workers", type=int, nargs="+", default=[1000, 10000], help="fleet sizes")
    add("--client-procs", type=int, default=4, help="processes the workers run in")
    add("--seconds", type=float, default=60.0, help="measured window per fleet size")
    add("--warmup", type=float, default=15.0, help="unmeasured lead-in (the fleet attaches)")
    add("--step-ms", type=float, default=1.03, help="a worker's time per agent step")
    add("--seed", type=int, default=0)
    add("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    rows = []
    for workers in args.workers:
        load = Load(workers, args.client_procs, args.seconds, args.warmup, args.step_ms, args.seed)
        row = measure(load)
        rows.append(row)
        print(
            f"{workers:>6} workers  {row['all_calls_per_s']:>8,.0f} calls/s "
            f"({', '.join(f'{k} {v:,.0f}' for k, v in row['calls_per_s'].items())})  "
            f"{row['results_per_s']:,.0f} results/s  {row['generations']} generations  "
            f"master cpu/wall {row['server_cpu_per_wall']:.2f}  "
            f"busiest client process cpu/wall {row['client_cpu_per_wall']:.2f}  "
            f"lease p99 {row['lease_p99_ms']} ms  present {row['present_at_end']}",
            flush=True,
        )
    result = {**provenance(__file__, argv), "settings": vars(args) | {"json": None}, "rows": rows}
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
