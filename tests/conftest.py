"""Fixtures shared by the whole suite, and the one hook that marks the GPU tests.

The shared helpers are modules of tests/support/ (imported by name, never from here):
processes.py (REPO, worker processes, a free port), harness.py (`live_master`, THE way a test
starts an in-process master), tiny.py (THE tiny CartPole settings), aws.py, bench.py,
fleet_calls.py (a test as the worker, on the wire), goldens.py (the decode goldens).
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.aws import aws_test_env


def runs_on_cuda(item: pytest.Item) -> bool:
    """A test runs on a CUDA device when its name ends "_on_cuda" or its `device` parameter
    (or the `case` it is given) is "cuda"."""
    if getattr(item, "originalname", item.name).endswith("_on_cuda"):
        return True
    params = getattr(getattr(item, "callspec", None), "params", {})
    return params.get("device") == "cuda" or getattr(params.get("case"), "device", None) == "cuda"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks `gpu` every test that runs on a CUDA device, and skips those, saying why, where
    torch sees none: `make test-gpu` (pytest -m gpu) runs just them on a GPU host."""
    gpu = [item for item in items if runs_on_cuda(item)]
    if not gpu:
        return
    import torch  # only where GPU tests were collected

    skip = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA device")
    for item in gpu:
        item.add_marker(pytest.mark.gpu)
        if skip is not None:
            item.add_marker(skip)


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
