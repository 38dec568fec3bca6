"""A user's own problem end to end, through the commands as users run them: an env named
`userpkg:MyEnv-v0` (and a small image env) and a network from `--policy
userpkg.nets:make_policy`, trained by a real master and two real worker processes (GA, ES and
a novelty search), replayed by neuro-eval; and workers without the user's package, refused
by name, the run stopped with that error and resumed once workers have the package."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from master.run.rundir import read_metrics
from tests.support.processes import REPO, free_port, spawn_worker, stop_processes
from tests.support.user_problem import (
    CONV_FACTORY,
    MLP_FACTORY,
    MY_ENV,
    SIDES,
    env_with_user_packages,
    env_without_user_packages,
)

pytestmark = pytest.mark.slow

RUN_S = 240.0


def _master(port: int, run_dir: Path, *flags: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "master", "--port", str(port), "--run-dir", str(run_dir),
               "--no-target", "--quiet", *flags]  # fmt: skip
    return subprocess.Popen(command, env=env_with_user_packages(), cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def _workers(port: int, with_package: bool, tag: str) -> list[subprocess.Popen]:
    env = env_with_user_packages() if with_package else env_without_user_packages()
    # They may start well before the master listens (it imports torch to build the network
    # once): they wait for it as long as the test does.
    return [spawn_worker(port, f"{tag}{i}", "--give-up-after", str(RUN_S),
                         env={"PYTHONPATH": env["PYTHONPATH"]}, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
            for i in range(2)]  # fmt: skip


def _train(run_dir: Path, *flags: str) -> tuple[subprocess.CompletedProcess, str]:
    """A master and two workers that have the package, to the end of the run: the master's
    result and the workers' logs. A worker that joins after a tiny run ended never hears of
    it: both are stopped once the master is done."""
    port = free_port()
    master = _master(port, run_dir, *flags)
    workers = _workers(port, with_package=True, tag="w")
    try:
        out, err = master.communicate(timeout=RUN_S)
    finally:
        stop_processes([master, *workers])
    logs = "".join(worker.stderr.read() for worker in workers)
    return subprocess.CompletedProcess(master.args, master.returncode, out, err), logs


@pytest.mark.parametrize(
    ("algorithm", "env_id", "factory", "options", "settings"),
    [
        ("ga", MY_ENV, MLP_FACTORY, {"hidden": 8},
         ("--population", "8", "--elite-candidates", "2", "--elite-episodes", "2")),
        ("es", SIDES, CONV_FACTORY, {"channels": 2}, ("--pairs", "4", "--eval-episodes", "2")),
        ("nsr-es", MY_ENV, MLP_FACTORY, {}, ("--pairs", "3", "--eval-episodes", "2",
                                             "--meta-population", "2")),
    ],
)  # fmt: skip
def test_a_users_env_and_network_train_on_a_master_and_two_workers(
    tmp_path: Path, noise_cache: Path, algorithm: str, env_id: str, factory: str,
    options: dict, settings: tuple[str, ...],
) -> None:  # fmt: skip
    run_dir = tmp_path / "run"
    done, logs = _train(
        run_dir, "--env", env_id, "--algo", algorithm, "--policy", factory,
        "--policy-options", json.dumps(options), "--generations", "2",
        "--noise-table-size", str(2**18), *settings,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # The workers built the user's network, said which engine runs it and why, failed nothing.
    assert f"{factory} float32 policies run on torch (onnxruntime serves only" in logs
    assert "Traceback" not in logs and "could not start" not in logs
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["generation"] for r in records] == [0, 1]
    assert all(r["failed_evaluations"] == 0 and r["evaluations"] > 0 for r in records)
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["env_id"], config["architecture"]) == (env_id, "module")
    assert config["policy_factory"] == factory and config.get("policy_options", {}) == options
    best = json.loads((run_dir / "best_genome.json").read_text())
    assert best["policy"] == {"factory": factory, "options": options}
    # neuro-eval rebuilds the network from the genome file, where the package is importable.
    replay = subprocess.run([sys.executable, "-c", "from worker.cli import eval_main; "
                             "raise SystemExit(eval_main())", str(run_dir), "--episodes", "2"],
                            env=env_with_user_packages(), cwd=REPO, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert replay.returncode == 0, replay.stderr[-2000:]
    assert re.search(r"mean -?\d+\.\d+ std \d+\.\d+ .* over 2 episodes", replay.stdout)


def test_workers_without_the_users_package_stop_the_run_by_name_and_it_resumes(
    tmp_path: Path, noise_cache: Path
) -> None:
    run_dir = tmp_path / "run"
    flags = ("--env", MY_ENV, "--policy", MLP_FACTORY, "--generations", "2", "--population",
             "8", "--elite-candidates", "2", "--elite-episodes", "2")  # fmt: skip
    port = free_port()
    master = _master(port, run_dir, *flags)
    workers = _workers(port, with_package=False, tag="bare")
    try:
        _, err = master.communicate(timeout=RUN_S)
        assert master.returncode == 1, err[-3000:]
        # Stopped with the workers' own error, naming the module, instead of leasing forever.
        assert re.search(
            r"neuro-master: every attached worker \([12]\) refuses this run's tasks: cannot "
            r"import module 'userpkg' \(env userpkg:MyEnv-v0\): ModuleNotFoundError", err
        ), err[-3000:]  # fmt: skip
        assert "worker 'bare0' refuses this run's tasks" in err or "'bare1'" in err
        # The workers said so too, and are still there, waiting for a master.
        assert all(worker.poll() is None for worker in workers)
    finally:
        stop_processes([master, *workers])
    logs = "".join(worker.stderr.read() for worker in workers)
    assert "refuses the tasks of run" in logs and "cannot import module 'userpkg'" in logs
    # Nothing of the run is lost: the same command, with workers that have the package, resumes.
    assert (run_dir / "checkpoint.json").is_file() and (run_dir / "config.json").is_file()
    done, logs = _train(run_dir, *flags)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming {run_dir} at generation 0" in done.stderr + done.stdout
    assert "refuses" not in logs and "Traceback" not in logs
    assert [r["generation"] for r in read_metrics(run_dir / "metrics.jsonl")] == [0, 1]
