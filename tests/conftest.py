"""Shared fixtures: a per-session noise table cache, and real worker processes.

The other shared pieces live in their own modules and are re-exported here:

- tests/harness.py: `live_master`, THE way a test starts an in-process master on loopback
  (always stopped, its training task cancelled, its channels closed).
- tests/tiny.py: THE tiny CartPole settings: `tiny_cartpole()` / `TINY_GA` in process,
  `TINY_CARTPOLE_ARGS` / `LOCAL_CARTPOLE_ARGS` for `python -m master`, `long_elite_tasks()`
  for a run whose elite tasks last long enough to catch a worker mid-task.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import LiveMaster, live_master
from tests.tiny import (
    CARTPOLE,
    LOCAL_CARTPOLE_ARGS,
    LONG_ELITE_TASKS,
    TINY_CARTPOLE_ARGS,
    TINY_GA,
    long_elite_tasks,
    tiny_cartpole,
)

__all__ = [
    "CARTPOLE",
    "LOCAL_CARTPOLE_ARGS",
    "LONG_ELITE_TASKS",
    "REPO",
    "TINY_CARTPOLE_ARGS",
    "TINY_GA",
    "LiveMaster",
    "aws_test_env",
    "free_port",
    "live_master",
    "long_elite_tasks",
    "spawn_worker",
    "stop_processes",
    "tiny_cartpole",
    "worker_env",
]

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def noise_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One noise-table cache for the session, shared by every worker process it starts."""
    path = tmp_path_factory.mktemp("noise-cache")
    # The host-shared parent store too, so test runs never share state through /dev/shm.
    dirs = {"NEURO_CACHE_DIR": path, "NEURO_SHARED_DIR": tmp_path_factory.mktemp("shared")}
    previous = {name: os.environ.get(name) for name in dirs}
    os.environ.update({name: str(value) for name, value in dirs.items()})
    yield path
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def free_port() -> int:
    """A loopback port nothing listens on right now (for a master started later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def spawn_worker(
    port: int, worker_id: str, *extra: str, env: dict[str, str] | None = None, **popen: Any
) -> subprocess.Popen:
    """A real `python -m worker` process pointed at a master on loopback.

    `env` adds variables to the worker's environment; `popen` goes to subprocess.Popen
    (e.g. stdout/stderr to capture its log).
    """
    command = [sys.executable, "-m", "worker", "--master", f"127.0.0.1:{port}",
               "--worker-id", worker_id, "--give-up-after", "20", *extra]  # fmt: skip
    return subprocess.Popen(command, env={**worker_env(), **(env or {})}, cwd=REPO, **popen)


def stop_processes(processes: list[subprocess.Popen], timeout: float = 10.0) -> None:
    for p in processes:
        if p.poll() is None:
            p.terminate()
    for p in processes:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.fixture
def aws_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A moto server on loopback; boto3 in this process and in children talks only to it."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    # moto keeps its state in this process across servers: each test starts from none.
    reset = urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")
    urllib.request.urlopen(reset, timeout=10).close()
    for name, value in aws_test_env(endpoint).items():
        monkeypatch.setenv(name, value)
    yield endpoint
    server.stop()


def aws_test_env(endpoint: str) -> dict[str, str]:
    """Fake credentials and a loopback endpoint; never the instance metadata service."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }
