"""neuro.train from a Python process, as a user's script calls it: real local workers, Ctrl-C
(SIGINT) mid-run, the same call again resuming to the budget, a fleet's worker joining the
master's address; then neuro.load_policy acting as neuro-eval does."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from neuro.envs.make import make_env
from tests.support.processes import REPO, free_port, spawn_worker, stop_processes, worker_env
from worker import evaluate_policy
from worker.offline.loading import load_genome, load_policy
from worker.play.rollout import run_episode

pytestmark = pytest.mark.slow

GENERATIONS = 12
SCRIPT = """
import json, sys
import neuro

run_dir, generations, settings = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
try:
    result = neuro.train("CartPole-v1", budget=generations, run_dir=run_dir, **settings)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
print(json.dumps({"generations": result.generations, "best_score": result.best_score,
                  "best_genome": str(result.best_genome_path),
                  "indexes": [record["generation"] for record in result.metrics]}))
"""
SETTINGS = {"workers": 2, "population": 30, "elite_candidates": 2, "elite_episodes": 2,
            "target_score": None}  # fmt: skip


def train_process(run_dir: Path, generations: int, **settings) -> subprocess.Popen:
    command = [sys.executable, "-c", SCRIPT, str(run_dir), str(generations),
               json.dumps({**SETTINGS, **settings})]  # fmt: skip
    return subprocess.Popen(command, env=worker_env(), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def metrics_lines(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return path.read_text().count("\n") if path.is_file() else 0


def test_ctrl_c_leaves_a_run_that_the_same_call_resumes(tmp_path: Path, noise_cache) -> None:
    run_dir = tmp_path / "run"
    process = train_process(run_dir, GENERATIONS)
    deadline = time.monotonic() + 180
    while metrics_lines(run_dir) < 2 and process.poll() is None:
        assert time.monotonic() < deadline, "no generation within 180 s"
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)  # Ctrl-C: KeyboardInterrupt in the calling thread
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, err[-3000:]
    assert out.splitlines() == ["interrupted"]
    assert f"{run_dir} is resumable: train again with run_dir='{run_dir}'" in err
    stopped_at = metrics_lines(run_dir)
    assert 2 <= stopped_at < GENERATIONS, "the run was not stopped mid-way"
    assert (run_dir / "checkpoint.json").is_file() and not (run_dir / ".lock").exists()

    resumed = train_process(run_dir, GENERATIONS)
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    assert f"neuro.train: resuming {run_dir} at generation" in err
    result = json.loads(out.splitlines()[-1])
    assert result["generations"] == GENERATIONS
    assert result["indexes"] == list(range(GENERATIONS))  # every generation once, in order
    assert result["best_score"] is not None and result["best_score"] > 0
    best = Path(result["best_genome"])
    assert best == run_dir / "best_genome.json"

    # A changed setting is refused by name, and the run dir is left as it was.
    changed = train_process(run_dir, GENERATIONS, population=31)
    _, err = changed.communicate(timeout=120)
    assert changed.returncode == 1 and "not ['population_size']" in err
    assert metrics_lines(run_dir) == GENERATIONS

    # The best genome as a torch module acts as neuro-eval's policy, and plays its scores.
    module, policy = load_policy(best), load_genome(best).policy
    handle = make_env("CartPole-v1")
    try:
        seen: list[np.ndarray] = []

        def act(observation: np.ndarray) -> int:
            seen.append(observation)
            return module.act(observation)

        returns = [run_episode(act, handle, seed=9).total_reward]
        returns += [run_episode(act, handle).total_reward for _ in range(2)]
    finally:
        handle.env.close()
    assert returns == evaluate_policy(best, episodes=3, env_seed=9)
    observations = np.stack(seen)
    assert np.array_equal(module.act(observations), policy.act_batch(observations))


FLEET_SCRIPT = """
import json, sys
import neuro

result = neuro.train("CartPole-v1", budget=2, master=sys.argv[1], run_dir=sys.argv[2],
                     progress=False, population=8, elite_candidates=2, elite_episodes=2,
                     target_score=None)
print(json.dumps({"generations": result.generations}))
"""


def test_a_fleet_worker_joins_the_masters_address(tmp_path: Path, noise_cache) -> None:
    port = free_port()
    command = [sys.executable, "-c", FLEET_SCRIPT, f"127.0.0.1:{port}", str(tmp_path / "run")]
    training = subprocess.Popen(command, env=worker_env(), cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
    worker = spawn_worker(port, "fleet-0")
    try:
        out, err = training.communicate(timeout=180)
        left = worker.wait(30)
    finally:
        stop_processes([worker, training])
    assert training.returncode == 0, err[-3000:]
    assert json.loads(out.splitlines()[-1]) == {"generations": 2}
    assert left == 0  # told the run is complete, it left on its own


NOTEBOOK_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])  # as a notebook makes a folder's package importable
import neuro

result = neuro.train("userpkg:MyEnv-v0", policy="userpkg.nets:make_policy", budget=2,
                     workers=1, run_dir=sys.argv[2], progress=False, population=8,
                     elite_candidates=2, elite_episodes=2, target_score=None,
                     policy_options={"hidden": 8})
print(json.dumps({"generations": result.generations}))
"""


def test_local_workers_import_a_package_this_process_found_on_sys_path(
    tmp_path: Path, noise_cache
) -> None:
    """The user's package is on this process's sys.path only, not on PYTHONPATH: the local
    workers get its folder (a worker that cannot import it would refuse every task)."""
    from tests.support.user_problem import USER_PACKAGES

    command = [sys.executable, "-c", NOTEBOOK_SCRIPT, str(USER_PACKAGES), str(tmp_path / "run")]
    done = subprocess.run(command, env=worker_env(), cwd=tmp_path, capture_output=True,
                          text=True, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"generations": 2}
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["policy_factory"] == "userpkg.nets:make_policy"
    assert config["policy_options"] == {"hidden": 8}


IN_A_LOOP_SCRIPT = """
import asyncio, json, sys
import neuro

async def cell():
    # As a notebook runs a cell: on the thread whose event loop is running.
    return neuro.train("CartPole-v1", budget=1, workers=1, run_dir=sys.argv[1], population=6,
                       elite_candidates=1, elite_episodes=1, target_score=None)

result = asyncio.run(cell())
print(json.dumps({"generations": result.generations}))
"""


def test_train_runs_where_an_event_loop_is_already_running(tmp_path: Path, noise_cache) -> None:
    command = [sys.executable, "-c", IN_A_LOOP_SCRIPT, str(tmp_path / "run")]
    done = subprocess.run(command, env=worker_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"generations": 1}
    assert "CartPole-v1: 100%" in done.stderr  # the progress bar, on stderr
