"""deploy/slurm/ on a real one-node Slurm cluster (make slurm-up starts one if none answers).

A run trains across the allocation's cores and ends cleanly, over TLS unless NEURO_TLS=0; a
run stopped mid-way (scancel --signal=TERM, or the time-limit warning) and requeued resumes
without losing a generation; a study, given as a file or by name, reaches the job's master with
the run dir as its study dir, and a study that cannot run is refused before it is queued.
Under CI=true a cluster that cannot be started fails the tests; elsewhere they skip, saying why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import REPO

SLURM = REPO / "deploy" / "slurm"
SUBMIT = SLURM / "neuro-slurm"
# Small CartPole runs: a few seconds per generation on 2 cores.
TINY = ["--env", "CartPole-v1", "--population", "20", "--elite-candidates", "2",
        "--elite-episodes", "2", "--generations", "3", "--no-target"]  # fmt: skip
LONGER = ["--env", "CartPole-v1", "--population", "100", "--elite-candidates", "2",
          "--elite-episodes", "2", "--generations", "10", "--no-target",
          "--checkpoint-seconds", "2"]  # fmt: skip

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _slurm_answers() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        done = subprocess.run(["sinfo", "--noheader", "--format=%T"], capture_output=True,
                              text=True, timeout=20)  # fmt: skip
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0 and any(s.startswith(("idle", "mix", "alloc"))
                                        for s in done.stdout.split())  # fmt: skip


@pytest.fixture(scope="module")
def cluster() -> int:
    """A Slurm cluster that answers; returns the CPUs of its first node."""
    if not _slurm_answers():
        why = ""
        if os.geteuid() != 0:
            why = "no Slurm cluster answers sinfo and make slurm-up needs root"
        else:
            done = subprocess.run(["make", "slurm-up"], cwd=REPO, capture_output=True, text=True,
                                  timeout=480)  # fmt: skip
            if done.returncode != 0 or not _slurm_answers():
                why = f"make slurm-up failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        if why:
            if os.environ.get("CI", "").lower() in ("true", "1"):
                pytest.fail(why)
            pytest.skip(why)
    cpus = subprocess.run(["sinfo", "--noheader", "--format=%c"], capture_output=True, text=True,
                          check=True).stdout.split()  # fmt: skip
    return int(cpus[0].rstrip("+"))


@pytest.fixture
def jobs() -> Iterator[list[str]]:
    """Job ids to cancel at the end, whatever happened."""
    ids: list[str] = []
    yield ids
    for job in ids:
        subprocess.run(["scancel", job], capture_output=True)


def _submit(run_dir: Path, ntasks: int, master_args: list[str], jobs: list[str],
            cwd: Path | None = None, **extra_env: str) -> str:  # fmt: skip
    # The caller's NEURO_TLS and NEURO_STUDY never leak in: a test says what it runs.
    env = {k: v for k, v in os.environ.items() if k not in ("NEURO_TLS", "NEURO_STUDY")}
    env |= {"NEURO_VENV": sys.prefix, "OMP_NUM_THREADS": "1", **extra_env}
    done = subprocess.run([str(SUBMIT), str(run_dir), f"--ntasks={ntasks}", "--parsable",
                           "--", *master_args],
                          env=env, cwd=cwd, capture_output=True, text=True, check=True)  # fmt: skip
    job = done.stdout.strip().split(";")[0]
    jobs.append(job)
    return job


def _job(job: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "--oneliner", job], capture_output=True,
                         text=True).stdout  # fmt: skip
    return dict(field.split("=", 1) for field in out.split() if "=" in field)


def _wait_state(job: str, states: set[str], timeout: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = _job(job)
        if info.get("JobState") in states:
            return info
        time.sleep(1)
    raise AssertionError(f"job {job} not in {states} within {timeout}s: {_job(job)}")


def _generations(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["generation"] for line in path.read_text().splitlines() if line]


def _wait_generations(run_dir: Path, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(_generations(run_dir)) < count:
        assert time.monotonic() < deadline, f"fewer than {count} generations in {timeout}s"
        time.sleep(0.5)


def _log(run_dir: Path, job: str) -> str:
    return (run_dir / "slurm" / f"job-{job}.out").read_text()


def _start_now(job: str) -> None:
    """Slurm holds a requeued job back for about two minutes (its BeginTime): lift that.

    Not at once: slurmd refuses to launch a batch job whose credential was issued in the same
    second as the revocation of the killed run's ("Job credential revoked"; seen under load),
    and the job then ends FAILED without running. Two seconds after the requeue clear it."""
    _wait_state(job, {"PENDING", "RUNNING", "COMPLETED"}, 60)
    time.sleep(2)
    subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], capture_output=True)


@pytest.mark.parametrize("tls", [None, "0"], ids=["tls-by-default", "plaintext"])
def test_run_trains_on_every_allocated_core(
    cluster: int, tmp_path: Path, jobs: list[str], noise_cache: Path, tls: str | None
) -> None:
    ntasks = min(cluster, 8)
    run_dir = tmp_path / "run"
    job = _submit(run_dir, ntasks, TINY, jobs, **({} if tls is None else {"NEURO_TLS": tls}))
    info = _wait_state(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}, 240)
    log = _log(run_dir, job)
    assert info["JobState"] == "COMPLETED", log
    assert info["ExitCode"] == "0:0", log
    assert _generations(run_dir) == [0, 1, 2]
    progress = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert progress and progress[-1]["workers"] == ntasks, log
    # TLS unless told otherwise: the master served TLS only, and every worker joined over it.
    transport = "plaintext" if tls == "0" else "TLS"
    assert f"({transport}), {ntasks} workers" in log, log
    workers = sorted((run_dir / "slurm").glob(f"worker-{job}-*.log"))
    assert len(workers) == ntasks
    for path in workers:
        assert f"({transport}, token, " in path.read_text(), path.read_text()
    token = run_dir / "slurm" / "token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert token.read_text().strip() not in log
    # The certificate and its key served that start only.
    assert not list((run_dir / "slurm").glob("tls-*")), sorted((run_dir / "slurm").iterdir())
    assert "PRIVATE KEY" not in log


def test_bad_tls_settings_are_refused(cluster: int, tmp_path: Path, jobs: list[str]) -> None:
    env = {**os.environ, "NEURO_VENV": sys.prefix, "NEURO_TLS": "yes"}
    done = subprocess.run([str(SUBMIT), str(tmp_path / "run"), "--parsable", "--", *TINY],
                          env=env, capture_output=True, text=True)  # fmt: skip
    if done.stdout.strip():  # submitted after all: cancelled at the end
        jobs.append(done.stdout.strip().split(";")[0])
    assert done.returncode == 2 and not done.stdout, done.stdout
    assert "NEURO_TLS must be 1 (TLS, the default) or 0 (plaintext), got 'yes'" in done.stderr
    # The script makes the certificate: one given to the master is refused, by name.
    run_dir = tmp_path / "given"
    job = _submit(run_dir, 1, [*TINY, "--tls-cert", "c.pem"], jobs)
    info = _wait_state(job, {"COMPLETED", "FAILED", "CANCELLED"}, 120)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "2:0", info
    assert "--tls-cert is set by the script (NEURO_TLS); leave it out" in _log(run_dir, job)


def test_cancelled_job_resumes_when_requeued(cluster: int, tmp_path: Path, jobs: list[str],
                                             noise_cache: Path) -> None:  # fmt: skip
    run_dir = tmp_path / "run"
    job = _submit(run_dir, min(cluster, 8), LONGER, jobs)
    _wait_generations(run_dir, 2, 180)
    subprocess.run(["scancel", "--signal=TERM", job], check=True)
    info = _wait_state(job, {"COMPLETED", "FAILED", "CANCELLED"}, 120)
    stopped_at = len(_generations(run_dir))
    assert stopped_at < 10, "the run ended before it was cancelled"
    assert "neuro master: stopping" in _log(run_dir, job)

    subprocess.run(["scontrol", "requeue", job], check=True)
    _start_now(job)
    info = _wait_state(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, 240)
    log = _log(run_dir, job)
    assert info["JobState"] == "COMPLETED", log
    assert f"resuming {run_dir.resolve()} at generation {stopped_at}" in log, log
    assert _generations(run_dir) == list(range(10)), log


def test_time_limit_warning_requeues(cluster: int, tmp_path: Path, jobs: list[str],
                                    noise_cache: Path) -> None:  # fmt: skip
    """USR1 is what #SBATCH --signal=B:USR1@120 sends before the time limit."""
    run_dir = tmp_path / "run"
    job = _submit(run_dir, min(cluster, 8), LONGER, jobs)
    _wait_generations(run_dir, 2, 180)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True)
    _wait_state(job, {"PENDING"}, 120)  # it requeued itself
    stopped_at = len(_generations(run_dir))
    assert stopped_at < 10, "the run ended before the signal"
    assert "requeueing job" in _log(run_dir, job)
    _start_now(job)
    info = _wait_state(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, 240)
    log = _log(run_dir, job)
    assert info["JobState"] == "COMPLETED", log
    assert int(info["Restarts"]) >= 1
    assert f"at generation {stopped_at}" in log, log
    assert _generations(run_dir) == list(range(10)), log


# A study of two tiny CartPole runs, as a user writes one.
TINY_STUDY = """name = "tiny"
max_concurrent_runs = 2
test_episodes = 2

[settings]
population_size = 20
elite_candidates = 2
elite_episodes = 2

[budget]
generations = 2
no_target = true

[[grid]]
envs = ["CartPole-v1"]
seeds = 2
"""


@pytest.mark.parametrize("given", ["file", "name"])
def test_a_study_reaches_the_master_of_the_job(
    cluster: int, tmp_path: Path, jobs: list[str], given: str
) -> None:
    """`--study FILE|NAME --dry-run`: the job's master reads the study (a file by the path the
    wrapper made absolute, from the job's node) and takes the run dir as its study dir."""
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "tiny.toml").write_text(TINY_STUDY)
    study, heading = (("tiny.toml", f"study tiny ({inputs.resolve() / 'tiny.toml'}): 2 runs")
                      if given == "file" else ("laptop", "study laptop: 6 runs"))  # fmt: skip
    run_dir = tmp_path / "study"
    # Submitted from the file's folder by a relative path, as a user in that folder would.
    job = _submit(run_dir, 1, ["--study", study, "--dry-run"], jobs, cwd=inputs)
    info = _wait_state(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}, 120)
    log = _log(run_dir, job)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", log
    assert f"0 workers, study dir {run_dir.resolve()}" in log, log
    assert f"{heading}, at most " in log and f"study dir {run_dir.resolve()}\n" in log, log
    names = ["cartpole-v1-s0", "cartpole-v1-s1"] if given == "file" else ["frostbite-v4-s0"]
    for name in names:
        assert re.search(rf"^{name} .* queued$", log, re.M), log
    # A check writes no study dir and leaves no arguments for a resubmission to reuse.
    assert sorted(p.name for p in run_dir.iterdir()) == ["slurm"]
    assert not (run_dir / "slurm" / "master-args").exists()


def test_a_study_that_cannot_run_is_refused_before_it_is_queued(
    cluster: int, tmp_path: Path, jobs: list[str]
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NEURO_STUDY"} | {"NEURO_VENV": sys.prefix}
    bad = tmp_path / "bad.toml"
    bad.write_text(TINY_STUDY.replace('"CartPole-v1"', '"NoSuchEnv-v0"'))
    refusals = {
        "paper-v2": "no study file 'paper-v2', and no ready study of that name (laptop, paper)",
        str(tmp_path / "missing.toml"): f"no study file '{tmp_path / 'missing.toml'}'",
        str(bad): "run nosuchenv-v0-s0 ([[grid]] 1): unknown env id 'NoSuchEnv-v0'",
    }
    for study, message in refusals.items():
        run_dir = tmp_path / "study"
        done = subprocess.run([str(SUBMIT), str(run_dir), "--parsable", "--", "--study", study],
                              env=env, capture_output=True, text=True)  # fmt: skip
        if done.stdout.strip():  # submitted after all: cancelled at the end
            jobs.append(done.stdout.strip().split(";")[0])
        assert done.returncode == 2 and not done.stdout, (study, done.stdout, done.stderr)
        assert done.stderr.startswith("neuro-slurm: the study cannot run: "), done.stderr
        assert message in done.stderr, (study, done.stderr)
        assert not (run_dir / "slurm" / "master-args").exists()
    # The script gives the master its study dir: one among the arguments is refused, by name.
    run_dir = tmp_path / "given"
    job = _submit(run_dir, 1, ["--study", "laptop", "--study-dir", "elsewhere"], jobs)
    info = _wait_state(job, {"COMPLETED", "FAILED", "CANCELLED"}, 120)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "2:0", info
    assert "--study-dir is set by the script (NEURO_RUN_DIR, NEURO_PORT); leave it out" in _log(
        run_dir, job
    )
