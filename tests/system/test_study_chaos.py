"""Chaos on a study: workers SIGKILLed and replaced every few seconds, the master SIGKILLed twice
mid-study and started again with the same command each time.

Every run must complete, each generation of each run scored exactly its N + K*E (ES: 2P + E)
times, none lost with a killed worker and none counted twice across a master's restart, and
each run's final test written once. Everything runs on loopback; the kill loop is bounded in
count and in time.
"""

from __future__ import annotations

import itertools
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from master.observe.status import StatusError, fetch_status
from master.run.rundir import read_metrics
from master.study.file import parse_study
from master.study.studydir import StudyDir
from neuro.runfiles import FINAL_TEST
from tests.support.processes import REPO, free_port, spawn_worker, stop_processes, worker_env

pytestmark = pytest.mark.slow

GENERATIONS = 8
MAX_WORKER_KILLS = 12
STUDY = f"""
name = "chaos"
max_concurrent_runs = 2
test_episodes = 5

[settings]
lease_seconds = 2.0
# More attempts than kills: no task can be retired (NaN) by the kills alone.
max_task_attempts = {MAX_WORKER_KILLS + 1}

[budget]
no_target = true
generations = {GENERATIONS}

[[grid]]
envs = ["CartPole-v1"]
seeds = [1, 2]
settings = {{ population_size = 30, truncation = 4, elite_candidates = 3, elite_episodes = 5 }}

[[run]]
env = "CartPole-v1"
seed = 3
name = "cartpole-es"
settings = {{ algorithm = "es", pairs = 10, eval_episodes = 5 }}
"""
DEADLINE_S = 300
ROUND_S = 1.0


def start_master(port: int, study_file: Path, study_dir: Path, log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "master", "--study", str(study_file), "--study-dir",
               str(study_dir), "--port", str(port), "--checkpoint-seconds", "0.5",
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


def generations_done(study_dir: Path) -> int:
    """Generations every run has finished, together."""
    return sum(len(read_metrics(path)) for path in study_dir.glob("runs/*/metrics.jsonl"))


def test_a_study_survives_killed_workers_and_two_master_crashes(
    tmp_path: Path, noise_cache: Path
) -> None:
    rng = random.Random(7)
    study_file, study_dir = tmp_path / "chaos.toml", tmp_path / "study"
    study_file.write_text(STUDY)
    port, log = free_port(), tmp_path / "master.log"
    master = start_master(port, study_file, study_dir, log)
    names = (f"w{i}" for i in itertools.count())
    ids = [next(names) for _ in range(3)]
    workers = [spawn_worker(port, name, "--give-up-after", "60") for name in ids]
    master_kills = worker_kills = 0
    started = time.monotonic()
    try:
        while master.poll() is None or master_kills < 2:
            assert time.monotonic() - started < DEADLINE_S, log.read_text()[-3000:]
            time.sleep(ROUND_S)
            victims = [i for i, name in enumerate(ids) if name in lease_holders(port)]
            if master.poll() is not None:
                assert master.returncode == 0, log.read_text()[-3000:]
                break
            done = generations_done(study_dir)
            # The master dies once early and once late in the study, mid-generation.
            if master_kills < 2 and done >= (3 if master_kills == 0 else 10):
                master.send_signal(signal.SIGKILL)
                master.wait(10)
                master_kills += 1
                master = start_master(port, study_file, study_dir, log)
                continue  # the victims held leases of the master just killed
            # A victim holds leases right now: killing a worker still starting tests nothing.
            if worker_kills < MAX_WORKER_KILLS and victims:
                victim = rng.choice(victims)
                workers[victim].send_signal(signal.SIGKILL)
                workers[victim].wait(10)
                ids[victim] = next(names)
                workers[victim] = spawn_worker(port, ids[victim], "--give-up-after", "60")
                worker_kills += 1
        remaining = DEADLINE_S - (time.monotonic() - started)
        assert master.wait(remaining) == 0, log.read_text()[-3000:]
    finally:
        stop_processes([master, *workers])
    assert master_kills == 2 and worker_kills >= 3
    # Each restart found a run part done and resumed it from its checkpoint.
    assert log.read_text().count("resumes from its checkpoint") >= 2
    study = parse_study(STUDY, str(study_file))
    directory = StudyDir(study_dir)
    assert directory.states() == {run.name: "complete" for run in study.runs}
    reissued = 0
    for run in study.runs:
        run_dir = directory.run_dir(run.name)
        records = read_metrics(run_dir / "metrics.jsonl")
        assert [r["generation"] for r in records] == list(range(GENERATIONS)), run.name
        per_generation = run.config.evaluations_per_generation
        frames = evaluations = 0
        for record in records:
            # Exactly its evaluations each: none lost with a killed worker, none counted twice
            # across a master restart.
            assert record["generation_evaluations"] == per_generation, run.name
            assert record["failed_evaluations"] == 0
            frames += record["generation_frames"]
            evaluations += record["generation_evaluations"]
            assert (record["frames"], record["evaluations"]) == (frames, evaluations)
            reissued += record["leases_reissued"]
        test = json.loads((run_dir / FINAL_TEST).read_text())
        assert test["episodes"] == 5 and len(test["scores"]) == 5
    assert reissued > 0  # the kills cost leases, which were handed out again
