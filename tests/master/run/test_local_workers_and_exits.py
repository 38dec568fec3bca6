"""Local workers are what the master placed, whatever the master's environment says; a run
that did not complete exits non-zero (a signal's 128 + its number, or 1), a complete one 0;
--local-workers is bounded."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from master.run.local_workers import (
    MAX_LOCAL_WORKERS_PER_CPU,
    WORKER_SETTINGS_ENV,
    count_problem,
    local_worker_environment,
)
from tests.support.processes import REPO, free_port, worker_env
from tests.support.tiny import LOCAL_CARTPOLE_ARGS, TINY_CARTPOLE_ARGS

MASTER = [sys.executable, "-m", "master"]


def test_a_local_worker_takes_none_of_the_workers_settings_from_the_masters_environment():
    master = {name: "4" for name in WORKER_SETTINGS_ENV} | {
        "NEURO_CACHE_DIR": "/var/cache/x", "NEURO_LOG_LEVEL": "DEBUG", "PATH": "/bin",
    }  # fmt: skip
    env = local_worker_environment(master, token="t0ken")
    assert not set(WORKER_SETTINGS_ENV) & set(env), env
    assert env["NEURO_TOKEN"] == "t0ken" and env["OMP_NUM_THREADS"] == "1"
    assert (env["NEURO_CACHE_DIR"], env["NEURO_LOG_LEVEL"], env["PATH"]) == (
        "/var/cache/x", "DEBUG", "/bin",
    )  # fmt: skip
    assert "NEURO_TOKEN" not in local_worker_environment({"PATH": "/bin"}, token=None)


def test_local_workers_are_bounded_by_the_cpus():
    assert count_problem(0, cpus=4) is None
    assert count_problem(MAX_LOCAL_WORKERS_PER_CPU * 4, cpus=4) is None
    for count in (-1, MAX_LOCAL_WORKERS_PER_CPU * 4 + 1, 8000):
        problem = count_problem(count, cpus=4)
        assert problem is not None and f"got {count}" in problem
        assert f"[0, {MAX_LOCAL_WORKERS_PER_CPU * 4}]" in problem


def test_thousands_of_local_workers_are_refused_before_anything_starts(tmp_path: Path):
    run_dir = tmp_path / "run"
    done = subprocess.run([*MASTER, *TINY_CARTPOLE_ARGS, "--local-workers", "8000",
                           "--run-dir", str(run_dir)], env=worker_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "--local-workers must be in [0, " in done.stderr, done.stderr
    assert not run_dir.exists()


def test_a_masters_neuro_envs_does_not_make_its_local_worker_a_batched_one(tmp_path: Path):
    """The issue's reproduction: NEURO_ENVS=4 in the master's environment ran a batched local
    worker, unlike the placement the master logged."""
    env = {**worker_env(), "NEURO_ENVS": "4", "NEURO_SLOTS": "3"}
    done = subprocess.run([*MASTER, *LOCAL_CARTPOLE_ARGS, "--generations", "1", "--population",
                           "6", "--run-dir", str(tmp_path / "run"), "--quiet"], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    [joining] = [line for line in done.stderr.splitlines() if "joining master" in line]
    assert "per-genome runner, 16 slots" in joining, joining


def test_a_run_whose_local_workers_all_exit_exits_non_zero(tmp_path: Path):
    done = subprocess.run([*MASTER, *LOCAL_CARTPOLE_ARGS, "--worker-arg=--no-such-flag",
                           "--run-dir", str(tmp_path / "run"), "--quiet"], env=worker_env(),
                          cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    assert "every local worker exited (codes [2]) before the run's budget was spent" in (
        done.stderr
    )
    assert "start the master on it again to continue" in done.stderr


def test_sigterm_before_the_run_is_complete_exits_with_the_signals_status(tmp_path: Path):
    port, run_dir = free_port(), tmp_path / "run"
    # A checkpoint within a second of serving (the default waits 30 s for the first).
    master = subprocess.Popen([*MASTER, *TINY_CARTPOLE_ARGS, "--port", str(port), "--run-dir",
                               str(run_dir), "--quiet", "--checkpoint-seconds", "1"],
                              env=worker_env(), cwd=REPO, stderr=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (run_dir / "checkpoint.json").exists():  # serving, and no worker comes
            assert master.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        master.terminate()
        _, err = master.communicate(timeout=60)
    finally:
        if master.poll() is None:
            master.kill()
            master.wait()
    assert master.returncode == 128 + 15, err[-3000:]
    assert "stopped by SIGTERM before the run's budget was spent" in err
