"""Real processes for tests: the repository root, a free loopback port, the environment a
worker process gets, a `python -m worker` process, and a bounded stop."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


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
