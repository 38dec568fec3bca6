"""Master capacity: results per second the real master handles on one core, next to a bare
gRPC server of the same call shape (the transport's ceiling), measured in the same run.

    python -m bench.master_capacity [--seconds S] [--clients C] [--batch B ...] \\
        [--json bench/results/master-capacity-<machine>-<date>.json]

Servers run pinned to core 0, simulated workers on the other cores. A simulated worker is a real
gRPC client on loopback that loops Lease(max_tasks=B) -> Report(B valid results) and plays no
episode, so the master is the only thing between one result and the next.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import multiprocessing as mp
import os
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from bench.common import (
    cpu_seconds,
    pin_to_cores,
    provenance,
    raise_file_limit,
    write_json,
)
from neuro.v1 import evolution_pb2 as pb

CURRENT = pb.PROTOCOL_VERSION_CURRENT
ACCEPTED = pb.RESULT_DISPOSITION_ACCEPTED
DUPLICATE = pb.RESULT_DISPOSITION_DUPLICATE
SERVICE = "neuro.v1.Evolution"
SERVER_CORE = 0
CALL_S = 10.0
START_S = 60.0
# Each simulated worker gets its own TCP connection, as separate worker machines would.
CLIENT_OPTIONS = [("grpc.use_local_subchannel_pool", 1)]
SERVERS = {
    "master": "the real master: GA, fleet, lease table, service, run dir",
    "echo": "grpc.aio, same methods and messages, canned answers: the transport's ceiling",
    "echo-sync": "the same echo on a threaded sync grpc.server",
    "echo-stream": "one bidirectional stream per worker, B results in, B tasks out (no such "
    "rpc exists yet: what streaming would buy)",
}


@dataclasses.dataclass(frozen=True)
class Settings:
    seconds: float
    warmup: float
    clients: int
    client_procs: int
    population: int
    elite_candidates: int
    elite_episodes: int
    echo_seeds: int
    max_idle_s: float
    """A worker that gets no task sleeps the master's retry_after_ms, at most this long."""
    server_option: tuple[tuple[str, Any], ...]
    """gRPC arguments for every server, e.g. ("grpc.so_reuseport", 0)."""
    attached: int = 0
    """Idle workers whose presence (Attach) the master watches meanwhile, each on its own
    connection: what a fleet of that size costs the master beside the measured traffic."""


def measure_window(clients, warmup: float, seconds: float, grace_s: float, label: str) -> list:
    """Waits for every client process to be ready, gives them one measured window and
    returns what each sends back; RuntimeError naming `label` if one hangs."""
    for _, client_conn in clients:
        if not client_conn.poll(START_S):
            raise RuntimeError(f"simulated workers did not start within {START_S:.0f}s")
        client_conn.recv()
    # One window for every client process: the machine's monotonic clock is shared.
    start = time.monotonic() + warmup
    window = (start, start + seconds)
    for _, client_conn in clients:
        client_conn.send(window)
    tallies = []
    for _, client_conn in clients:
        if client_conn.poll(window[1] - time.monotonic() + grace_s):
            tallies.append(client_conn.recv())
    if len(tallies) != len(clients):
        raise RuntimeError(f"{label}: {len(clients) - len(tallies)} client process(es) hung")
    return tallies


async def _serve_until_told(conn, port: int) -> None:
    """Tells the parent the port, then serves until the parent writes to the pipe."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(conn.fileno(), stop.set)
    conn.send(("ready", port))
    await stop.wait()
    loop.remove_reader(conn.fileno())
    conn.recv()


def master_process(conn, settings: Settings) -> None:
    pin_to_cores({SERVER_CORE})
    raise_file_limit()
    from master.config import inspect_env_id, preset
    from master.run.start import start_master

    async def main() -> None:
        config = preset(
            inspect_env_id("CartPole-v1"),
            population_size=settings.population,
            truncation=min(20, settings.population),
            elite_candidates=settings.elite_candidates,
            elite_episodes=settings.elite_episodes,
            generations=10**9,
        )
        # Reported scores stay below CartPole's threshold anyway; no target at all says so.
        config = dataclasses.replace(config, target_score=None)
        with tempfile.TemporaryDirectory(prefix="master-capacity-") as run_dir:
            master = await start_master(
                config, Path(run_dir), out=None, options=settings.server_option
            )
            training = asyncio.ensure_future(master.trainer.run())
            try:
                await _serve_until_told(conn, master.port)
            finally:
                training.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await training
                await master.stop(0)
            trainer = master.trainer
            generations = trainer.algorithm.generation
            conn.send(("done", {"generations": generations, "frames": trainer.frames}))

    asyncio.run(main())


def canned_task(index: int, seeds: int) -> pb.Task:
    """A task shaped like the real master's for CartPole, with a genome of `seeds` seeds."""
    return pb.Task(
        task_id=f"g{seeds}/o/{index}/0",
        run_id="0123456789ab",
        genome=pb.Genome(
            seeds=[2_000_000_000 + i for i in range(seeds)],
            mutation_power=0.05,
            noise_table=pb.NoiseTableSpec(seed=123, size=2**24),
        ),
        env=pb.EnvSpec(env_id="CartPole-v1"),
        policy=pb.PolicySpec(architecture="mlp", hidden_sizes=[64, 64]),
        episodes=1,
        env_seed=0x1234_5678_9ABC_DEF,
        lease_seconds=60.0,
    )


def echo_process(conn, settings: Settings, kind: str) -> None:
    pin_to_cores({SERVER_CORE})
    tasks = [canned_task(i, settings.echo_seeds) for i in range(256)]

    sync = kind == "echo-sync"

    def lease(request: pb.LeaseRequest) -> pb.LeaseResponse:
        return pb.LeaseResponse(tasks=tasks[: request.max_tasks], run_id="0123456789ab")

    def report(request: pb.ReportRequest) -> pb.ReportResponse:
        acks = [pb.TaskAck(task_id=r.task_id, disposition=ACCEPTED) for r in request.results]
        return pb.ReportResponse(acks=acks)

    async def work(requests, context):
        async for request in requests:
            yield pb.LeaseResponse(tasks=tasks[: len(request.results)], run_id="0123456789ab")

    def unary(answer, request_type, response_type):
        async def on_loop(request, context):
            return answer(request)

        handler = (lambda request, context: answer(request)) if sync else on_loop
        return grpc.unary_unary_rpc_method_handler(
            handler, request_type.FromString, response_type.SerializeToString
        )

    methods = {
        "Lease": unary(lease, pb.LeaseRequest, pb.LeaseResponse),
        "Report": unary(report, pb.ReportRequest, pb.ReportResponse),
        "Work": grpc.stream_stream_rpc_method_handler(
            work, pb.ReportRequest.FromString, pb.LeaseResponse.SerializeToString
        ),
    }
    handlers = (grpc.method_handlers_generic_handler(SERVICE, methods),)
    options = list(settings.server_option)
    if sync:
        pool = ThreadPoolExecutor(max_workers=max(4, settings.clients))
        server = grpc.server(pool, handlers=handlers, options=options)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        conn.send(("ready", port))
        conn.recv()
        server.stop(0).wait(CALL_S)
        conn.send(("done", {}))
        return

    async def main() -> None:
        server = grpc.aio.server(handlers=handlers, options=options)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            await _serve_until_told(conn, port)
        finally:
            await server.stop(0)
        conn.send(("done", {}))

    asyncio.run(main())


def result_for(task: pb.Task) -> pb.TaskResult:
    """A valid result: one finite return and a frame count per episode, below any target."""
    frames = 10 + task.env_seed % 200
    return pb.TaskResult(
        task_id=task.task_id,
        run_id=task.run_id,
        episode_returns=[float(task.genome.seeds[-1] % 400)] * task.episodes,
        episode_frames=[frames] * task.episodes,
        frames=frames * task.episodes,
    )


def rpc(channel, method: str, request_type, response_type, kind: str = "unary_unary"):
    """A callable for one method of the service on `channel` (kind: gRPC's call shape)."""
    return getattr(channel, kind)(
        f"/{SERVICE}/{method}",
        request_serializer=request_type.SerializeToString,
        response_deserializer=response_type.FromString,
    )


async def _worker(port: int, name: str, batch: int, window, tally, settings: Settings) -> None:
    """One simulated worker: Lease -> Report until the window closes."""
    start, end = window
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=CLIENT_OPTIONS) as channel:
        lease_call = rpc(channel, "Lease", pb.LeaseRequest, pb.LeaseResponse)
        report_call = rpc(channel, "Report", pb.ReportRequest, pb.ReportResponse)
        ask = pb.LeaseRequest(protocol_version=CURRENT, worker_id=name, max_tasks=batch)
        while (began := time.monotonic()) < end:
            reply = await lease_call(ask, timeout=CALL_S)
            inside = start <= began
            if inside:
                tally["lease_s"].append(time.monotonic() - began)
            if reply.run_complete:
                return
            if not reply.tasks:
                tally["empty_leases"] += inside
                await asyncio.sleep(min(reply.retry_after_ms / 1000, settings.max_idle_s))
                continue
            if inside:
                tally["task_bytes"] += sum(t.ByteSize() for t in reply.tasks)
                tally["tasks"] += len(reply.tasks)
            results = [result_for(t) for t in reply.tasks]
            request = pb.ReportRequest(protocol_version=CURRENT, worker_id=name, results=results)
            acks = (await report_call(request, timeout=CALL_S)).acks
            if start <= time.monotonic() <= end:
                accepted = sum(a.disposition == ACCEPTED for a in acks)
                # A backup copy's loser: the master counted the task's other copy.
                duplicates = sum(a.disposition == DUPLICATE for a in acks)
                tally["accepted"] += accepted
                tally["duplicates"] += duplicates
                tally["not_accepted"] += len(acks) - accepted - duplicates


async def _stream_worker(port: int, name: str, batch: int, window, tally, settings) -> None:
    """One simulated worker on a stream: each message out carries B results, each answer B tasks."""
    start, end = window
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=CLIENT_OPTIONS) as channel:
        work = rpc(channel, "Work", pb.ReportRequest, pb.LeaseResponse, "stream_stream")
        call = work(timeout=end - time.monotonic() + CALL_S)
        first = [pb.TaskResult(task_id="none")] * batch  # the echo answers one task per result
        await call.write(pb.ReportRequest(protocol_version=CURRENT, worker_id=name, results=first))
        while (began := time.monotonic()) < end:
            reply = await call.read()
            results = [result_for(t) for t in reply.tasks]
            request = pb.ReportRequest(protocol_version=CURRENT, worker_id=name, results=results)
            await call.write(request)
            if start <= began:
                tally["lease_s"].append(time.monotonic() - began)
                tally["accepted"] += len(results)
                tally["tasks"] += len(reply.tasks)
                tally["task_bytes"] += sum(t.ByteSize() for t in reply.tasks)
        await call.done_writing()
        call.cancel()


def clients_process(
    conn, port: int, server_pid: int, names, batch: int, kind: str, settings, attached: int
):
    """Simulated workers on the other cores; sends back counts, latencies and CPU use."""
    cores = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()
    pin_to_cores((cores - {SERVER_CORE}) or cores)
    tally: dict[str, Any] = dict.fromkeys(
        ("accepted", "duplicates", "not_accepted", "empty_leases", "tasks", "task_bytes"), 0
    )
    tally["lease_s"] = []
    loop_worker = _stream_worker if kind == "echo-stream" else _worker

    async def cpu_at(moment: float) -> tuple[float, float]:
        await asyncio.sleep(max(0.0, moment - time.monotonic()))
        return cpu_seconds(server_pid), time.process_time()

    async def main() -> None:
        present = _Presence(port, f"idle-{names[0]}", attached)
        await present.open()  # before the window: the master watches them all the while
        conn.send("ready")
        window = await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        workers = [loop_worker(port, name, batch, window, tally, settings) for name in names]
        marks = asyncio.gather(cpu_at(window[0]), cpu_at(window[1]))
        budget = window[1] - time.monotonic() + 2 * CALL_S
        *_, (before, after) = await asyncio.wait_for(asyncio.gather(*workers, marks), budget)
        tally["server_cpu_s"] = after[0] - before[0]
        tally["client_cpu_s"] = after[1] - before[1]
        tally.update(await present.close())

    raise_file_limit()
    asyncio.run(main())
    conn.send(tally)


class _Presence:
    """`count` idle workers, each holding an Attach call open on a connection of its own and,
    like a worker, opening a new one (after a jittered backoff) when one ends: gRPC cancels
    calls that arrive in a burst beyond what the server has asked for (C-core's pending-call
    limit), which thousands of workers connecting at once hit."""

    def __init__(self, port: int, prefix: str, count: int) -> None:
        self._port, self._prefix, self._count = port, prefix, count
        self._channels: list[Any] = []
        self._calls: list[Any] = [None] * count
        self._slots: list[asyncio.Task] = []
        self._watched = 0
        self._all_watched = asyncio.Event()
        self.ended: list[tuple[str, float]] = []
        """(status code, seconds after opening) of each call that ended before close()."""

    async def open(self) -> None:
        for i in range(self._count):
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{self._port}", options=CLIENT_OPTIONS)
            self._channels.append(channel)
            self._slots.append(asyncio.create_task(self._hold(i, channel)))
        if self._count:
            await asyncio.wait_for(self._all_watched.wait(), START_S)

    async def _hold(self, index: int, channel) -> None:
        attach = rpc(channel, "Attach", pb.AttachRequest, pb.AttachUpdate, "unary_stream")
        request = pb.AttachRequest(protocol_version=CURRENT, worker_id=f"{self._prefix}-{index}")
        backoff, first = 0.1, True
        while True:
            opened = time.monotonic()
            call = self._calls[index] = attach(request)
            with contextlib.suppress(grpc.RpcError):
                await call.initial_metadata()  # sent once the master watches this worker
            if first and not call.done():
                first = False
                self._watched += 1
                if self._watched == self._count:
                    self._all_watched.set()
            code = await call.code()  # returns once the call ends
            self.ended.append((code.name, round(time.monotonic() - opened, 1)))
            await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
            backoff = min(backoff * 2, 5.0)

    async def close(self) -> dict[str, Any]:
        """Closes every call: how many were open, and how many had ended and were reopened."""
        for slot in self._slots:
            slot.cancel()
        still = sum(call is not None and not call.done() for call in self._calls)
        for call in self._calls:
            if call is not None:
                call.cancel()
        await asyncio.gather(*(channel.close() for channel in self._channels))
        ages = sorted(age for _, age in self.ended)
        return {
            "attached": still,
            "attach_ended": dict(collections.Counter(code for code, _ in self.ended)),
            "attach_ended_after_s": [ages[0], ages[len(ages) // 2], ages[-1]] if ages else [],
        }


def start_process(target, *args) -> tuple[mp.Process, Any]:
    """Starts target(conn, *args) in a spawned daemon process; the process and our end of the
    pipe."""
    parent, child = mp.Pipe()
    process = mp.get_context("spawn").Process(target=target, args=(child, *args), daemon=True)
    process.start()
    return process, parent


def finish_process(process: mp.Process, conn) -> dict[str, Any]:
    """Tells a process started by start_process to stop; the details it sends back, if any."""
    details: dict[str, Any] = {}
    with contextlib.suppress(BrokenPipeError, EOFError, OSError):
        conn.send("stop")
        if conn.poll(CALL_S):
            details = conn.recv()[1]
    process.join(CALL_S)
    if process.is_alive():
        process.kill()
        process.join()
    return details


def measure(server: str, batch: int, settings: Settings) -> dict[str, Any]:
    """One server, one batch size: results/s accepted over the window, lease latency, CPU."""
    if server == "master":
        process, conn = start_process(master_process, settings)
    else:
        process, conn = start_process(echo_process, settings, server)
    clients = []
    try:
        if not conn.poll(START_S):
            raise RuntimeError(f"{server} did not start within {START_S:.0f}s")
        _, port = conn.recv()
        names = [f"sim-{i}" for i in range(settings.clients)]
        for i in range(settings.client_procs):
            group = names[i :: settings.client_procs]
            # The master's idle fleet, spread over the client processes (the echo has none).
            attached = len(range(i, settings.attached, settings.client_procs))
            attached = attached if server == "master" else 0
            args = (port, process.pid, group, batch, server, settings, attached)
            clients.append(start_process(clients_process, *args))
        tallies = measure_window(clients, settings.warmup, settings.seconds, 4 * CALL_S, server)
    finally:
        for client, _ in clients:
            client.join(CALL_S)
            if client.is_alive():
                client.kill()
        details = finish_process(process, conn)
    return _summary(server, batch, settings, tallies, details)


def _summary(server, batch, settings, tallies, details) -> dict[str, Any]:
    lease_ms = sorted(1000 * s for t in tallies for s in t["lease_s"])
    accepted = sum(t["accepted"] for t in tallies)
    tasks = sum(t["tasks"] for t in tallies)

    def pct(q: float) -> float | None:
        at = min(len(lease_ms) - 1, int(q * len(lease_ms)))
        return round(lease_ms[at], 3) if lease_ms else None

    return {
        "server": server,
        "batch": batch,
        "results_per_s": round(accepted / settings.seconds, 1),
        "accepted": accepted,
        "not_accepted": sum(t["not_accepted"] for t in tallies),
        "duplicates": sum(t["duplicates"] for t in tallies),
        "empty_leases": sum(t["empty_leases"] for t in tallies),
        "lease_calls": len(lease_ms),
        "lease_p50_ms": pct(0.5),
        "lease_p99_ms": pct(0.99),
        "lease_mean_ms": round(statistics.fmean(lease_ms), 3) if lease_ms else None,
        "task_bytes_mean": round(sum(t["task_bytes"] for t in tallies) / max(tasks, 1), 1),
        "server_cpu_per_wall": round(tallies[0]["server_cpu_s"] / settings.seconds, 3),
        "attached": sum(t.get("attached", 0) for t in tallies),
        # Attach calls that ended (and were reopened) before the window closed, by status code.
        "attach_ended": dict(
            sum(
                (collections.Counter(t.get("attach_ended", {})) for t in tallies),
                collections.Counter(),
            )
        ),
        "attach_ended_after_s": [
            t["attach_ended_after_s"] for t in tallies if t.get("attach_ended_after_s")
        ],
        "client_cpu_per_wall": round(sum(t["client_cpu_s"] for t in tallies) / settings.seconds, 3),
        **details,
    }


def _option(text: str) -> tuple[str, Any]:
    key, _, value = text.partition("=")
    return key, int(value) if value.lstrip("-").isdigit() else value


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--seconds", type=float, default=5.0, help="measured window per cell")
    add("--warmup", type=float, default=1.0, help="unmeasured lead-in per cell")
    add("--clients", type=int, default=32, help="simulated workers")
    add("--client-procs", type=int, default=1, help="processes they run in")
    add("--batch", type=int, nargs="+", default=[1, 8, 64, 256], help="max_tasks per Lease")
    add("--population", type=int, default=1000, help="GA population (the paper's: 1000)")
    add("--elite-candidates", type=int, default=10)
    add("--elite-episodes", type=int, default=30)
    add("--echo-seeds", type=int, default=20, help="genome length of the echo's tasks")
    add("--max-idle-s", type=float, default=0.05, help="cap on a worker's wait for work")
    add("--server-option", type=_option, action="append", default=[], metavar="KEY=VALUE")
    add("--also", nargs="*", default=[], choices=["echo-sync", "echo-stream"])
    add(
        "--attached",
        type=int,
        default=0,
        help="idle workers whose presence (Attach) the master watches meanwhile",
    )
    add("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(Settings)}
    settings = Settings(**{**values, "server_option": tuple(args.server_option)})
    servers = ["master", "echo", *args.also]
    cells = []
    for batch in args.batch:
        for server in servers:
            cells.append(measure(server, batch, settings))
            print(_cell_line(cells[-1]), file=sys.stderr, flush=True)
    rows = [_row(batch, cells) for batch in args.batch]
    report = {
        **provenance(__file__, argv),
        "servers": {s: SERVERS[s] for s in servers},
        "settings": dataclasses.asdict(settings),
        "cpu_count": os.cpu_count(),
        "grpc_version": grpc.__version__,
        "python": sys.version.split()[0],
        "rows": rows,
        "cells": cells,
    }
    print(_table(rows, servers))
    if args.json:
        write_json(args.json, report)
    return report


def _row(batch: int, cells: list[dict[str, Any]]) -> dict[str, Any]:
    by_server = {c["server"]: c for c in cells if c["batch"] == batch}
    master, echo = by_server["master"], by_server["echo"]
    row = {
        "batch": batch,
        "master_results_per_s": master["results_per_s"],
        "echo_results_per_s": echo["results_per_s"],
        "master_over_echo": round(master["results_per_s"] / max(echo["results_per_s"], 1), 3),
        "master_lease_p99_ms": master["lease_p99_ms"],
        "echo_lease_p99_ms": echo["lease_p99_ms"],
        "master_cpu_per_wall": master["server_cpu_per_wall"],
        "clients_cpu_per_wall": master["client_cpu_per_wall"],
    }
    for name in ("echo-sync", "echo-stream"):
        if name in by_server:
            row[f"{name.replace('-', '_')}_results_per_s"] = by_server[name]["results_per_s"]
    return row


def _cell_line(cell: dict[str, Any]) -> str:
    return (
        f"{cell['server']:>11} B={cell['batch']:<3} {cell['results_per_s']:>10,.0f} results/s  "
        f"lease p50 {cell['lease_p50_ms']} p99 {cell['lease_p99_ms']} ms  "
        f"server cpu/wall {cell['server_cpu_per_wall']:.2f}  "
        f"clients cpu/wall {cell['client_cpu_per_wall']:.2f}"
        + (f"  attached {cell['attached']}" if cell["attached"] else "")
        + (f" ended {cell['attach_ended']}" if cell["attach_ended"] else "")
    )


def _table(rows: list[dict[str, Any]], servers: list[str]) -> str:
    extra = [s for s in servers if s.startswith("echo-")]
    head = "    B  master results/s  echo results/s  master/echo  master p99 ms  master cpu/wall"
    lines = [head + "".join(f"  {s:>11}" for s in extra)]
    for r in rows:
        line = (
            f"{r['batch']:>5}  {r['master_results_per_s']:>16,.0f}"
            f"  {r['echo_results_per_s']:>14,.0f}  {r['master_over_echo']:>11.2f}"
            f"  {r['master_lease_p99_ms']!s:>13}  {r['master_cpu_per_wall']:>15.2f}"
        )
        for s in extra:
            line += f"  {r[s.replace('-', '_') + '_results_per_s']:>11,.0f}"
        lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
