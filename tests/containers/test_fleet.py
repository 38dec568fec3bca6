"""Both images built and run as compose.yaml runs them: a master and three workers train
CartPole while one worker is SIGKILLed, one is stopped and the master is restarted; the run
still completes with every evaluation counted once. `make test-containers`; DEVELOPERS.md."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.containers.fleet import Fleet, FleetError, docker, wait_for
from tests.containers.images import BuildSettings, build_images
from tests.system.test_integration import check_metrics_add_up

pytestmark = [pytest.mark.containers, pytest.mark.timeout(2400)]

USER = "10001"
WORKERS = 3
GENERATIONS = 6
# Generations of ~10 s on three workers: the kill, the stop and the restart land mid-run.
POPULATION = 1000
ELITE_CANDIDATES, ELITE_EPISODES = 2, 5
MASTER_ARGS = ["--no-target", "--generations", str(GENERATIONS), "--population", str(POPULATION),
               "--elite-candidates", str(ELITE_CANDIDATES), "--elite-episodes",
               str(ELITE_EPISODES), "--seed", "1"]  # fmt: skip
# compose.yaml's stop_grace_period for workers: `docker stop` sends SIGKILL after it.
WORKER_STOP_TIMEOUT_S = 30


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Both images, built from this checkout (cached layers make a rebuild quick)."""
    settings = BuildSettings.from_env(tag="test")
    log = tmp_path_factory.mktemp("build") / "build.log"
    seconds = build_images(settings, log=log)
    print(f"images built in {seconds['master']:.0f} s + {seconds['worker']:.0f} s")
    return {role: settings.image(role) for role in ("master", "worker")}


@pytest.fixture
def fleet(images: dict[str, str], tmp_path: Path) -> Iterator[Fleet]:
    """compose.yaml as a project of its own, with a test token and a short CartPole run; its
    containers, network and volumes go at the end, whatever happened."""
    token = tmp_path / "token"
    token.write_text(uuid.uuid4().hex + "\n")
    token.chmod(0o644)  # Compose bind-mounts it: uid 10001 reads it in the containers
    override = tmp_path / "compose.test.yaml"
    override.write_text(json.dumps({"services": {"master": {"command": MASTER_ARGS}}}))
    variables = {
        "NEURO_ENV": "CartPole-v1",
        "NEURO_TOKEN_FILE": str(token),
        "NEURO_PORT": "0",  # a free host port: never one a developer's master holds
        "NEURO_MASTER_IMAGE": images["master"],
        "NEURO_WORKER_IMAGE": images["worker"],
    }
    project = f"neuro-test-{uuid.uuid4().hex[:8]}"
    fleet = Fleet(project, [Path("compose.yaml").resolve(), override], variables)
    try:
        yield fleet
    finally:
        fleet.save_logs(tmp_path / "logs")
        fleet.down()
    label = f"label=com.docker.compose.project={project}"
    left = docker("ps", "--all", "--quiet", "--filter", label)
    assert not left.strip(), f"containers left behind: {left}"


def metrics(fleet: Fleet, master: str) -> list[dict]:
    """metrics.jsonl in the run volume, read through the running master."""
    # Absent until generation 0 ends; `docker exec` fails if the master is not running.
    text = fleet.exec(master, "sh", "-c", "cat /data/run/metrics.jsonl 2>/dev/null || true")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def health(fleet: Fleet, container: str) -> str:
    return fleet.state(container).get("Health", {}).get("Status", "none")


def leases_held(fleet: Fleet, master: str, worker: str) -> int:
    """How many tasks the worker in container `worker` holds, as the master's status says."""
    hostname = fleet.inspect(worker)["Config"]["Hostname"]
    status = json.loads(fleet.exec(master, "neuro-master", "status", "--json"))
    held = [w["tasks_leased"] for w in status["worker_status"]
            if w["worker_id"].startswith(f"{hostname}-")]  # fmt: skip
    return sum(held)


def process_user(fleet: Fleet, container: str) -> str:
    """The real uid of the container's PID 1 (the neuro-master or neuro-worker process)."""
    status = fleet.exec(container, "cat", "/proc/1/status")
    return re.search(r"^Uid:\s+(\d+)", status, re.M)[1]


def test_a_compose_fleet_survives_a_kill_a_stop_and_a_master_restart(fleet: Fleet) -> None:
    started = time.monotonic()
    # `up` returns once the master's health check has passed and the workers have started.
    fleet.compose("up", "--detach", "--no-build", "--scale", f"worker={WORKERS}", timeout=300)
    (master,) = fleet.containers("master")
    workers = fleet.containers("worker")
    assert len(workers) == WORKERS, workers
    assert health(fleet, master) == "healthy"
    for container in (master, *workers):
        assert process_user(fleet, container) == USER, container
        assert fleet.exec(container, "id", "-u").strip() == USER
    killed, stopped, _ = workers

    wait_for("generation 0 in metrics.jsonl", lambda: metrics(fleet, master), 300)
    # Each while it holds leases, so that both the lapse and the hand-back have tasks to move.
    wait_for("a lease on the worker to kill", lambda: leases_held(fleet, master, killed), 120, 0.2)
    docker("kill", "--signal", "KILL", killed)
    wait_for("a lease on the worker to stop", lambda: leases_held(fleet, master, stopped), 120, 0.2)
    before_stop = time.monotonic()
    docker("stop", stopped, timeout=WORKER_STOP_TIMEOUT_S + 30)
    stop_s = time.monotonic() - before_stop
    state = fleet.state(stopped)
    assert state["ExitCode"] == 0 and not state["OOMKilled"], state
    assert stop_s < WORKER_STOP_TIMEOUT_S, f"docker stop took {stop_s:.1f} s (SIGKILL at 30 s)"
    handed = re.findall(r"handed back (\d+) task", fleet.logs(stopped))
    assert handed and int(handed[-1]) >= 1, fleet.logs(stopped)[-3000:]

    # The master, restarted mid-run, resumes from its volume instead of starting over.
    done_before = len(metrics(fleet, master))
    docker("restart", master, timeout=180)
    wait_for("the restarted master healthy", lambda: health(fleet, master) == "healthy", 180)
    log = fleet.logs(master)
    resumed = re.findall(r"resuming /data/run at generation (\d+)", log)
    assert resumed, log[-3000:]
    # Its stop ended the workers' presence calls itself, none cut off with a traceback.
    assert "Traceback" not in log, log[-3000:]
    # At the generation it was in: the one after the last in metrics.jsonl, or that one's
    # successor if it ended while the master stopped.
    assert done_before >= 1 and int(resumed[-1]) in (done_before, done_before + 1), (
        resumed, done_before)  # fmt: skip

    # The run completes: the master exits 0, and so does every worker still running.
    wait_for("the master to finish the run",
             lambda: fleet.state(master)["Status"] == "exited", 900, 2)  # fmt: skip
    assert fleet.state(master)["ExitCode"] == 0, fleet.logs(master)[-3000:]
    for container in fleet.containers("worker"):
        if container == killed and fleet.state(container)["ExitCode"] == 137:
            continue  # not restarted after the SIGKILL
        wait_for(f"worker {container} to leave",
                 lambda c=container: fleet.state(c)["Status"] == "exited", 120)  # fmt: skip
        assert fleet.state(container)["ExitCode"] == 0, fleet.logs(container)[-3000:]

    records = read_run_metrics(fleet)
    assert [r["generation"] for r in records] == list(range(GENERATIONS))
    check_metrics_add_up(records, POPULATION + ELITE_CANDIDATES * ELITE_EPISODES)
    assert sum(r["leases_reissued"] for r in records) >= 1, "the SIGKILLed worker's tasks"
    assert all(r["failed_evaluations"] == 0 for r in records)
    print(f"fleet run: {time.monotonic() - started:.0f} s; docker stop of a worker {stop_s:.1f} s")


def read_run_metrics(fleet: Fleet) -> list[dict]:
    """metrics.jsonl from the run volume once the master has left, and the files' owner."""
    run = "/data/run"
    script = f"stat -c %u {run}/metrics.jsonl {run}/checkpoint.json && cat {run}/metrics.jsonl"
    image = fleet.inspect(fleet.containers("master")[0])["Config"]["Image"]
    out = docker("run", "--rm", "--volume", f"{fleet.volume('run')}:/data", "--entrypoint", "sh",
                 image, "-c", script)  # fmt: skip
    lines = out.splitlines()
    owners, body = lines[:2], lines[2:]
    if owners != [USER, USER]:
        raise FleetError(f"run files owned by {owners}, not uid {USER}")
    return [json.loads(line) for line in body if line.strip()]
