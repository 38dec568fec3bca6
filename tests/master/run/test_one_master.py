"""One master per port and per run dir: a second `neuro-master` on either exits, naming it.

Real master processes on loopback: a second one on a busy port must not share it (gRPC sets
SO_REUSEPORT by default, and two masters on one port each answer part of the fleet), and a
second one on a run dir in use must not interleave its metrics and checkpoints with the first.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from master.observe.status import StatusError, fetch_status
from tests.support.processes import REPO, free_port, stop_processes, worker_env
from tests.support.tiny import TINY_CARTPOLE_ARGS

START_TIMEOUT_S = 60.0
"""A master starts in a few seconds; a loaded machine may take longer."""
EXIT_TIMEOUT_S = 30.0
"""How long a refused master may take to start up, see the conflict and exit."""


def spawn_master(port: int, run_dir: Path, *extra: str) -> subprocess.Popen:
    """A `python -m master` process serving a tiny CartPole GA on loopback (no workers)."""
    command = [sys.executable, "-m", "master", *TINY_CARTPOLE_ARGS, "--population", "6",
               "--truncation", "2", "--generations", "50", "--port", str(port), "--run-dir",
               str(run_dir), "--checkpoint-seconds", "0.5", "--quiet", *extra]  # fmt: skip
    return subprocess.Popen(command, env=worker_env(), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def serving_run_id(master: subprocess.Popen, port: int) -> str:
    """The run id a master answers Status with, once it answers (bounded wait)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if master.poll() is not None:
            pytest.fail(f"master exited {master.returncode}: {master.communicate()[1][-2000:]}")
        try:
            return fetch_status(f"127.0.0.1:{port}", timeout=2.0).run_id
        except StatusError:
            if time.monotonic() > deadline:
                pytest.fail(f"no master answered on port {port} within {START_TIMEOUT_S} s")
            time.sleep(0.2)


def refused(master: subprocess.Popen) -> tuple[int, str]:
    """(exit status, stderr) of a master expected to exit on its own; fails if it keeps going."""
    try:
        _, err = master.communicate(timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the second master still runs after {EXIT_TIMEOUT_S} s: it was not refused")
    return master.returncode, err


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not path.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"{path} did not appear within {START_TIMEOUT_S} s")
        time.sleep(0.1)


def test_a_second_master_on_a_busy_port_exits_and_the_first_keeps_serving(tmp_path: Path) -> None:
    port = free_port()
    first = spawn_master(port, tmp_path / "first")
    processes = [first]
    try:
        run_id = serving_run_id(first, port)
        second = spawn_master(port, tmp_path / "second")
        processes.append(second)
        code, err = refused(second)
        assert code != 0
        assert f"could not listen on 127.0.0.1:{port}: address already in use" in err, err
        assert "Traceback" not in err
        # Refused before its trainer was built: its run dir holds no run.
        assert not (tmp_path / "second" / "config.json").exists()
        # Every new connection reaches the first master (two on one port split them).
        for _ in range(8):
            assert fetch_status(f"127.0.0.1:{port}", timeout=5.0).run_id == run_id
        assert first.poll() is None
    finally:
        stop_processes(processes)


def test_a_second_master_on_a_run_dir_in_use_exits_and_a_crashed_holder_leaves_no_lock(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    port = free_port()
    first = spawn_master(port, run_dir)
    processes = [first]
    try:
        run_id = serving_run_id(first, port)
        wait_for(run_dir / "checkpoint.json")
        config = (run_dir / "config.json").read_bytes()
        second = spawn_master(free_port(), run_dir)
        processes.append(second)
        code, err = refused(second)
        assert code != 0 and "Traceback" not in err
        assert f"run dir {run_dir} is in use by another master (pid {first.pid} on " in err, err
        assert (run_dir / "config.json").read_bytes() == config
        assert fetch_status(f"127.0.0.1:{port}", timeout=5.0).run_id == run_id

        # A master killed outright holds nothing: the next one takes the run dir and resumes.
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        third_port = free_port()
        third = spawn_master(third_port, run_dir)
        processes.append(third)
        assert serving_run_id(third, third_port) == run_id
        assert json.loads((run_dir / "config.json").read_text())["run_id"] == run_id
        third.send_signal(signal.SIGTERM)
        third.communicate(timeout=30)
        assert third.returncode == 128 + signal.SIGTERM  # stopped with its run unfinished
        assert not (run_dir / ".master.lock").exists()  # a master that stops cleans up
    finally:
        stop_processes(processes)


def test_the_run_dir_lock_is_exclusive_names_its_holder_and_ends_with_its_block(
    tmp_path: Path,
) -> None:
    import os
    import re

    from master.run.rundir import LOCK_FILE, RunDirInUse, run_dir_lock

    run_dir = tmp_path / "new" / "run"
    message = (rf"run dir {re.escape(str(run_dir))} is in use by another master "
               rf"\(pid {os.getpid()} on [^)]+\): stop it first")  # fmt: skip
    with run_dir_lock(run_dir):
        assert (run_dir / LOCK_FILE).is_file()
        with pytest.raises(RunDirInUse, match=message), run_dir_lock(run_dir):
            pass
    # Released with its block; the run dir it made goes too, since nothing was written there.
    assert not run_dir.exists()
    with run_dir_lock(run_dir):
        (run_dir / "config.json").write_text("{}")
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.json"]
    # A crashed holder leaves its file behind, but no lock.
    (run_dir / LOCK_FILE).write_text("pid 1 on elsewhere\n")
    with run_dir_lock(run_dir):
        assert (run_dir / LOCK_FILE).read_text() != "pid 1 on elsewhere\n"
