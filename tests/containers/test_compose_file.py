"""compose.yaml read as a file (no Docker engine needed; test_fleet.py runs it): what it hands
each container agrees with what the images expect, a study (by name or a file of this host)
reaches the master as one it accepts, and Compose itself accepts it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

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


_INNERMOST = re.compile(r"\$\{(\w+)(?:(:-|:\+)([^${}]*))?\}")


def interpolate(text: str, variables: dict[str, str]) -> str:
    """Compose's ${NAME}, ${NAME:-default} and ${NAME:+replacement} (empty counts as unset),
    nested ones innermost first, as Compose v2 reads them."""
    while match := _INNERMOST.search(text):
        name, operator, argument = match.groups()
        value = variables.get(name, "")
        if operator == ":-":
            value = value or argument
        elif operator == ":+":
            value = argument if value else ""
        text = text[: match.start()] + value + text[match.end() :]
    return text


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


# A study of two tiny CartPole runs, as a user writes one.
STUDY = """name = "mine"
max_concurrent_runs = 2

[budget]
generations = 2

[[grid]]
envs = ["CartPole-v1"]
seeds = 2
"""


def _study_mount() -> dict:
    (mount,) = [v for v in SERVICES["master"]["volumes"]
                if isinstance(v, dict) and v["target"] == "/etc/neuro/study.toml"]  # fmt: skip
    return mount


def test_a_study_goes_where_the_env_goes(tmp_path: Path) -> None:
    """NEURO_STUDY names a ready study, NEURO_STUDY_FILE mounts a file of this host read-only;
    neither serves one run of NEURO_ENV. The master, configured by the image's and the
    service's environment as the image's entrypoint is, accepts either study."""
    environment, mount = SERVICES["master"]["environment"], _study_mount()
    assert mount["type"] == "bind" and mount["read_only"] is True, mount
    image_env = {k: v for k, v in env_of(final_stage("master")).items() if k.startswith("NEURO_")}
    # The study dir is on the run volume, beside the run dir: a new master on it resumes.
    volume = f"/{image_env['NEURO_RUN_DIR'].split('/')[1]}"
    assert f"run:{volume}" in SERVICES["master"]["volumes"]
    assert environment["NEURO_STUDY_DIR"].startswith(volume + "/")
    assert environment["NEURO_STUDY_DIR"] != image_env["NEURO_RUN_DIR"]
    mine = tmp_path / "mine.toml"
    mine.write_text(STUDY)
    cases = [({}, "", None), ({"NEURO_STUDY": "laptop"}, "laptop", "study laptop: 6 runs"),
             ({"NEURO_STUDY_FILE": str(mine)}, mount["target"],
              "study mine (CONTAINER/etc/neuro/study.toml): 2 runs")]  # fmt: skip
    for variables, study, heading in cases:
        assert interpolate(environment["NEURO_STUDY"], variables) == study, variables
        # The bind mount's source exists (relative to the project dir) whatever is set.
        source = REPO / interpolate(mount["source"], variables)
        assert source.is_file(), source
        if heading is None:
            continue  # one run: the master takes no study
        if "NEURO_STUDY_FILE" in variables:
            assert source == mine
        container = tmp_path / "container" / next(iter(variables)).lower()
        (container / "etc" / "neuro").mkdir(parents=True)
        (container / "etc" / "neuro" / "study.toml").write_bytes(source.read_bytes())
        service_env = {k: interpolate(str(v), variables) for k, v in environment.items()}
        moved = {k: str(container / v.lstrip("/")) if v.startswith("/") else v
                 for k, v in {**image_env, **service_env}.items()}  # fmt: skip
        local = {k: v for k, v in os.environ.items() if not k.startswith("NEURO_")}
        done = subprocess.run([sys.executable, "-m", "master", "--dry-run"], cwd=container,
                              env={**local, **moved, "PYTHONPATH": str(REPO)},
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert heading.replace("CONTAINER", str(container)) in done.stdout, done.stdout
        assert f"study dir {container / 'data' / 'study'}\n" in done.stdout, done.stdout


def test_compose_takes_a_study_file(tmp_path: Path) -> None:
    """`docker compose config` (no engine needed) mounts NEURO_STUDY_FILE and names it."""
    compose = compose_command()
    if compose is None:
        pytest.skip("no Docker Compose v2 on PATH")
    mine = tmp_path / "mine.toml"
    mine.write_text(STUDY)
    done = subprocess.run([*compose, "--file", str(REPO / "compose.yaml"), "config", "--format",
                           "json"], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/local/bin:/usr/bin:/bin",
                               "NEURO_STUDY_FILE": str(mine)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    master = json.loads(done.stdout)["services"]["master"]
    assert master["environment"]["NEURO_STUDY"] == _study_mount()["target"]
    mounts = [v for v in master["volumes"] if v["target"] == _study_mount()["target"]]
    assert [(v["type"], v["source"], v.get("read_only")) for v in mounts] == [
        ("bind", str(mine), True)
    ]


def test_compose_accepts_it() -> None:
    """`docker compose config` (no engine needed) parses and interpolates the file."""
    compose = compose_command()
    if compose is None:
        pytest.skip("no Docker Compose v2 on PATH")
    done = subprocess.run([*compose, "--file", str(REPO / "compose.yaml"), "config", "--quiet"],
                          cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/local/bin:/usr/bin:/bin"})  # fmt: skip
    assert done.returncode == 0, done.stderr
