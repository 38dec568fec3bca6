"""compose.yaml read as a file (no Docker engine needed; test_fleet.py runs it): what it hands
each container agrees with what the images expect, and Compose itself accepts it."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from tests.containers.fleet import compose_command
from tests.containers.images import REPO
from tests.deploy.test_dockerfiles import PYPROJECT, env_of, final_stage

COMPOSE = yaml.safe_load((REPO / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]
SECRET = "/run/secrets/neuro-token"


def default(text: str) -> str:
    """The value of "${NAME:-default}" when NAME is unset."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text)


def test_a_master_and_workers_of_this_checkouts_images() -> None:
    assert set(SERVICES) == {"master", "worker"}
    version = PYPROJECT["project"]["version"]
    for role, service in SERVICES.items():
        assert default(service["image"]) == f"neuro-{role}:{version}"
        assert service["build"] == {**service["build"], "context": ".",
                                    "dockerfile": f"Dockerfile.{role}"}  # fmt: skip
        # Build args pass through from the shell only when set: the Dockerfiles' defaults stand.
        assert all("=" not in arg for arg in service["build"].get("args", [])), service["build"]
        assert "BASE_IMAGE" in service["build"]["args"]
        assert service["restart"] == "on-failure", "a completed run exits 0 and stays done"


def test_the_token_is_a_secret_file_for_both() -> None:
    assert default(COMPOSE["secrets"]["neuro-token"]["file"]) == "./token"
    for service in SERVICES.values():
        assert service["secrets"] == ["neuro-token"]
        assert service["environment"]["NEURO_TOKEN_FILE"] == SECRET
        assert "NEURO_TOKEN" not in service["environment"], "never the token itself"
    # The default token file stays out of git and out of the images' build context.
    assert re.search(r"^/?token$", (REPO / ".gitignore").read_text(), re.M)


def test_the_run_and_the_noise_table_live_on_volumes() -> None:
    master_env, worker_env = env_of(final_stage("master")), env_of(final_stage("worker"))
    master, worker = SERVICES["master"]["volumes"], SERVICES["worker"]["volumes"]
    assert f"run:/{master_env['NEURO_RUN_DIR'].split('/')[1]}" in master, master
    # One noise table on the host: the master's cache and the workers' are the same volume.
    assert f"noise-cache:{master_env['NEURO_CACHE_DIR']}" in master, master
    assert worker == [f"noise-cache:{worker_env['NEURO_CACHE_DIR']}"], worker
    assert set(COMPOSE["volumes"]) == {"run", "noise-cache"}
    # The master image makes that mount point, owned by the user, so that a new volume there
    # starts owned by uid 10001 (Docker copies the image's directory into it).
    owned = [
        ins.args for ins in final_stage("master") if ins.keyword == "RUN" and "chown" in ins.args
    ]
    assert any(master_env["NEURO_CACHE_DIR"] in args for args in owned), owned


def test_workers_wait_for_a_healthy_master_and_reach_it_by_name() -> None:
    master, worker = SERVICES["master"], SERVICES["worker"]
    assert worker["depends_on"] == {"master": {"condition": "service_healthy"}}
    port = env_of(final_stage("master"))["NEURO_PORT"]
    assert worker["environment"]["NEURO_MASTER"] == f"master:{port}"
    # The image's own check, asked sooner: no `test` here overrides it.
    assert "test" not in master["healthcheck"] and "disable" not in master["healthcheck"]
    # Published on loopback by default; NEURO_PORT=0 takes a free host port (the test does).
    (published,) = master["ports"]
    assert default(published) == f"127.0.0.1:8080:{port}"
    assert "${NEURO_PORT:-8080}" in published


def test_stop_grace_periods_cover_a_drain_and_a_checkpoint() -> None:
    from tests.containers.test_fleet import WORKER_STOP_TIMEOUT_S

    assert SERVICES["worker"]["stop_grace_period"] == f"{WORKER_STOP_TIMEOUT_S}s"
    assert int(SERVICES["master"]["stop_grace_period"].rstrip("s")) >= 30


def test_the_readme_runs_this_file() -> None:
    readme = (REPO / "README.md").read_text()
    assert re.search(r"docker compose up .*--scale worker=", readme), "README shows compose up"
    assert "docker compose down" in readme


def test_compose_accepts_it() -> None:
    """`docker compose config` (no engine needed) parses and interpolates the file."""
    compose = compose_command()
    if compose is None:
        pytest.skip("no Docker Compose v2 on PATH")
    done = subprocess.run([*compose, "--file", str(REPO / "compose.yaml"), "config", "--quiet"],
                          cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/local/bin:/usr/bin:/bin"})  # fmt: skip
    assert done.returncode == 0, done.stderr
