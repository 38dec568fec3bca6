"""Chaos: workers SIGKILLed and replaced every few seconds, the master SIGKILLed twice.

The run must finish its generations with every one scored exactly N + K*E times, and a
consistent elite chain, whatever was killed when. It runs GA-NS, the GA whose parents are chosen
by novelty: the GA's every path plus behaviours on the wire and an archive in the checkpoint,
which must come through the crashes whole. Everything runs on loopback; the kill loop
is bounded in count and in time.
"""

from __future__ import annotations

import itertools
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from master.observe.status import StatusError, fetch_status
from master.run.checkpoint import load_checkpoint, load_sidecar
from master.run.rundir import read_elite_seeds, read_metrics
from tests.support.processes import REPO, free_port, spawn_worker, stop_processes, worker_env

pytestmark = pytest.mark.slow

N, K, E, GENERATIONS = 60, 3, 10, 8
DEADLINE_S = 240
ROUND_S = 2.0
MAX_WORKER_KILLS = 30


def start_master(port: int, run_dir: Path, log: Path) -> subprocess.Popen:
    command = [sys.executable, "-c", "import sys; from master.cli import main; sys.exit(main())",
               "--env", "CartPole-v1", "--algo", "ga-ns", "--archive-probability", "0.1",
               "--port", str(port), "--run-dir", str(run_dir),
               "--generations", str(GENERATIONS), "--no-target", "--population", str(N),
               "--truncation", "5", "--elite-candidates", str(K), "--elite-episodes", str(E),
               "--lease-seconds", "2", "--checkpoint-seconds", "0.5", "--seed", "9",
               # More attempts than kills: no task can be retired (NaN) by the kills alone.
               "--max-task-attempts", str(MAX_WORKER_KILLS + 1),
               "--quiet"]  # fmt: skip
    return subprocess.Popen(command, env=worker_env(), cwd=REPO, stdout=log.open("ab"),
                            stderr=subprocess.STDOUT)  # fmt: skip


def lease_holders(port: int) -> set[str]:
    """Ids of the workers holding leases now; none while the master is down."""
    try:
        status = fetch_status(f"127.0.0.1:{port}", timeout=2.0)
    except StatusError:
        return set()
    return {w.worker_id for w in status.worker_status if w.tasks_leased > 0}


def holders_within(port: int, ids: list[str], seconds: float) -> list[int]:
    """Indices in `ids` of workers seen holding leases, polling for up to `seconds`.

    Workers hold leases only while a phase runs (CartPole tasks take milliseconds, and the
    master spends much of the run restarting), so one look every round would mostly miss.
    """
    # The round passes first, so kills stay at least a round apart.
    time.sleep(seconds)
    deadline = time.monotonic() + seconds / 2
    while True:
        holding = lease_holders(port)
        victims = [i for i, name in enumerate(ids) if name in holding]
        if victims or time.monotonic() >= deadline:
            return victims
        time.sleep(0.05)


def generations_done(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(read_metrics(path)) if path.exists() else 0


def test_the_run_survives_killed_workers_and_two_master_crashes(
    tmp_path: Path, noise_cache: Path
) -> None:
    rng = random.Random(4)
    port, run_dir, log = free_port(), tmp_path / "run", tmp_path / "master.log"
    master = start_master(port, run_dir, log)
    names = (f"w{i}" for i in itertools.count())
    ids = [next(names) for _ in range(4)]
    workers = [spawn_worker(port, name, "--give-up-after", "60") for name in ids]
    master_kills = worker_kills = 0
    started = time.monotonic()
    try:
        while master.poll() is None or master_kills < 2:
            assert time.monotonic() - started < DEADLINE_S, log.read_text()[-3000:]
            # Every ~2 s, the first moment (within 1 s) some worker holds leases.
            victims = holders_within(port, ids, ROUND_S)
            if master.poll() is not None:
                assert master.returncode == 0, log.read_text()[-3000:]
                break
            done = generations_done(run_dir)
            # The master dies once early and once late in the run, mid-generation.
            if master_kills < 2 and done >= (2 if master_kills == 0 else 5):
                master.send_signal(signal.SIGKILL)
                master.wait(10)
                master_kills += 1
                master = start_master(port, run_dir, log)
            # Victims hold leases right now (the master's Status says so): a worker still
            # importing torch on a loaded machine holds none, and killing it would test nothing.
            if worker_kills < MAX_WORKER_KILLS and victims:
                victim = rng.choice(victims)
                workers[victim].send_signal(signal.SIGKILL)
                workers[victim].wait(10)
                ids[victim] = next(names)
                workers[victim] = spawn_worker(port, ids[victim], "--give-up-after", "60")
                worker_kills += 1
        assert master.wait(DEADLINE_S - (time.monotonic() - started)) == 0, log.read_text()[-3000:]
    finally:
        stop_processes([master, *workers])
    assert master_kills == 2 and worker_kills >= 3
    assert log.read_text().count("resuming") == 2
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["generation"] for r in records] == list(range(GENERATIONS))
    frames = evaluations = 0
    for record in records:
        # Exactly N + K*E evaluations each: none lost with a killed worker, none counted twice
        # across a master restart.
        assert record["generation_evaluations"] == N + K * E
        assert record["failed_evaluations"] == 0
        frames += record["generation_frames"]
        evaluations += record["generation_evaluations"]
        assert (record["frames"], record["evaluations"]) == (frames, evaluations)
    assert sum(r["leases_reissued"] for r in records) > 0
    # Each line names its elite by sha256; the seed lists are in the run dir's genomes/.
    chain = [(record["generation"], read_elite_seeds(run_dir, record)) for record in records]
    for (_, previous), (generation, seeds) in itertools.pairwise(chain):
        # A new elite is a child made this generation: one mutation on a parent of the last.
        # (Parents can be short: a carried elite is a parent too.)
        assert seeds == previous or 2 <= len(seeds) <= generation + 1
    # The archive only grew (far below its capacity), and the last checkpoint holds all of it.
    sizes = [record["archive_size"] for record in records]
    assert sizes == sorted(sizes) and sizes[-1] > 0
    payload = load_checkpoint(run_dir)
    behaviours = load_sidecar(run_dir, payload["sidecar"])
    assert behaviours.shape == (sizes[-1], 4) and np.isfinite(behaviours).all()


def test_sigterm_checkpoints_the_master_and_the_same_command_finishes_the_run(
    tmp_path: Path, noise_cache: Path
) -> None:
    port, run_dir, log = free_port(), tmp_path / "run", tmp_path / "master.log"
    master = start_master(port, run_dir, log)
    workers = [spawn_worker(port, f"w{i}", "--give-up-after", "60") for i in range(2)]
    try:
        deadline = time.monotonic() + 60
        while generations_done(run_dir) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        master.send_signal(signal.SIGTERM)
        assert master.wait(30) == 128 + signal.SIGTERM  # stopped with its run unfinished
        payload = load_checkpoint(run_dir)
        assert payload is not None and payload["algorithm"]["state"]["generation"] >= 2
        # The workers were not told the run is over: they wait and serve the restarted master.
        assert all(w.poll() is None for w in workers)
        master = start_master(port, run_dir, log)
        assert master.wait(120) == 0, log.read_text()[-3000:]
        assert log.read_text().count("resuming") == 1
    finally:
        stop_processes([master, *workers])
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["generation"] for r in records] == list(range(GENERATIONS))
    assert all(r["generation_evaluations"] == N + K * E for r in records)
