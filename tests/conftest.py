"""Shared fixtures: a per-session noise table cache, and real worker processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def noise_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One noise-table cache for the session, shared by every worker process it starts."""
    path = tmp_path_factory.mktemp("noise-cache")
    previous = os.environ.get("NEURO_CACHE_DIR")
    os.environ["NEURO_CACHE_DIR"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("NEURO_CACHE_DIR", None)
    else:
        os.environ["NEURO_CACHE_DIR"] = previous


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
