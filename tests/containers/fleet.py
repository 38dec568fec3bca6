"""A Compose project of compose.yaml on the local Docker engine, driven as its users drive it:
`docker compose up`, `docker kill`, `docker stop`, `docker restart`, `docker compose down`."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tests.containers.images import REPO

T = TypeVar("T")


class FleetError(AssertionError):
    """A Docker command failed, or a wait ran past its deadline (a test failure)."""


def compose_command() -> list[str] | None:
    """`docker compose` (the v2 plugin) or a v2 `docker-compose` binary; None: neither."""
    candidates = [["docker", "compose"]]
    if shutil.which("docker-compose"):
        candidates.append(["docker-compose"])
    for command in candidates:
        try:
            done = subprocess.run([*command, "version", "--short"], capture_output=True,
                                  text=True, timeout=30)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            continue
        major = done.stdout.strip().lstrip("v").split(".")[0]
        if done.returncode == 0 and major.isdigit() and int(major) >= 2:
            return command
    return None


def engine_problem() -> str | None:
    """Why no container can run here (None: a Docker engine answers)."""
    if shutil.which("docker") is None:
        return "no docker CLI on PATH (DEVELOPERS.md: getting a Docker engine)"
    try:
        done = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                              capture_output=True, text=True, timeout=30)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "the Docker engine did not answer `docker info` within 30 s"
    if done.returncode != 0 or not done.stdout.strip():
        first = (done.stderr.strip().splitlines() or ["no answer"])[0]
        return f"no Docker engine answers `docker info`: {first}"
    if compose_command() is None:
        return "no Docker Compose v2 (`docker compose` or a v2 `docker-compose`) on PATH"
    return None


def docker(*args: str, timeout: float = 120, check: bool = True) -> str:
    """Runs `docker ARGS`; its stdout, or FleetError with its stderr."""
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise FleetError(f"docker {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, every: float = 1.0) -> T:
    """Polls `probe` until it returns something true (a non-empty list, a count above 0)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise FleetError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


class Fleet:
    """One Compose project: compose.yaml plus the test's override file, its own variables."""

    def __init__(self, project: str, files: list[Path], variables: dict[str, str]) -> None:
        self.project = project
        compose = compose_command()
        if compose is None:
            raise FleetError("no Docker Compose v2")
        self._base = [*compose, "--project-name", project, "--project-directory", str(REPO)]
        for path in files:
            self._base += ["--file", str(path)]
        # Only the test's own NEURO_* variables reach the interpolation: a developer's
        # NEURO_PORT or NEURO_ENV must not change what the test runs.
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("NEURO_", "COMPOSE_"))}
        self._env = {**clean, **variables}

    def compose(self, *args: str, timeout: float = 300, check: bool = True) -> str:
        done = subprocess.run([*self._base, *args], capture_output=True, text=True, cwd=REPO,
                              env=self._env, timeout=timeout)  # fmt: skip
        if check and done.returncode != 0:
            raise FleetError(f"compose {' '.join(args)} exited {done.returncode}: "
                             f"{done.stdout[-2000:]}{done.stderr[-3000:]}")  # fmt: skip
        return done.stdout + done.stderr

    def containers(self, service: str) -> list[str]:
        """Ids of the service's containers, running or not, in their replica order."""
        out = self.compose("ps", "--all", "--quiet", service, timeout=60)
        ids = out.split()
        return sorted(ids, key=lambda c: int(self.inspect(c)["Config"]["Labels"].get(
            "com.docker.compose.container-number", "0")))  # fmt: skip

    def inspect(self, container: str) -> dict[str, Any]:
        return json.loads(docker("inspect", container, timeout=60))[0]

    def state(self, container: str) -> dict[str, Any]:
        return self.inspect(container)["State"]

    def logs(self, container: str) -> str:
        done = subprocess.run(["docker", "logs", container], capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        return done.stdout + done.stderr

    def exec(self, container: str, *command: str, timeout: float = 60) -> str:
        return docker("exec", container, *command, timeout=timeout)

    def volume(self, name: str) -> str:
        """The Docker name of one of compose.yaml's volumes in this project."""
        return f"{self.project}_{name}"

    def save_logs(self, directory: Path) -> None:
        """Every container's log, as <container name>.log (never raises)."""
        directory.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FleetError, subprocess.TimeoutExpired):
            for service in ("master", "worker"):
                for container in self.containers(service):
                    name = self.inspect(container)["Name"].lstrip("/")
                    (directory / f"{name}.log").write_text(self.logs(container))

    def down(self) -> None:
        """Removes the project's containers, network and volumes (never raises)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.compose("down", "--volumes", "--remove-orphans", "--timeout", "5",
                         timeout=180, check=False)  # fmt: skip
