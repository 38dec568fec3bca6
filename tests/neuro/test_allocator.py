"""Worker processes run with tcmalloc preloaded where the host has it (neuro.allocator)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from master.run.local_workers import LocalWorkers
from neuro import allocator
from neuro.allocator import (
    TCMALLOC,
    allocator_advice,
    allocator_in_use,
    tcmalloc_installed,
    worker_environment,
)
from tests.support.processes import REPO

REPORT = "from neuro.allocator import allocator_in_use; print(allocator_in_use())"


def _child_allocator(env: dict[str, str]) -> str:
    """What a fresh Python process started with `env` finds mapped into itself."""
    done = subprocess.run(
        [sys.executable, "-c", REPORT], env=env, cwd=REPO, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def _without_preload() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


def test_a_worker_process_runs_with_tcmalloc_exactly_where_the_host_has_it():
    env = worker_environment(_without_preload())
    if tcmalloc_installed():
        assert env["LD_PRELOAD"] == TCMALLOC
        assert _child_allocator(env) == "tcmalloc"
    else:
        assert "LD_PRELOAD" not in env
        assert _child_allocator(env) == "system"


def test_a_preload_already_set_is_kept_and_an_empty_one_opts_out():
    opted_out = worker_environment({**_without_preload(), "LD_PRELOAD": ""})
    assert opted_out["LD_PRELOAD"] == ""
    assert _child_allocator(opted_out) == "system"
    assert worker_environment({"LD_PRELOAD": "libother.so"}) == {"LD_PRELOAD": "libother.so"}


@pytest.mark.parametrize("installed", [True, False])
def test_the_preload_follows_whether_the_library_is_found(monkeypatch, installed):
    monkeypatch.setattr(allocator, "tcmalloc_installed", lambda: installed)
    env = worker_environment({"PATH": "/usr/bin"})
    assert env.get("LD_PRELOAD") == (TCMALLOC if installed else None)
    assert env["PATH"] == "/usr/bin"


def test_the_allocator_is_read_from_the_process_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f10 r-xp 0 08:01 12 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert allocator_in_use(maps) == "system"
    maps.write_text(maps.read_text() + "7f20-7f30 r-xp 0 08:01 13 /usr/lib/libjemalloc.so.2\n")
    assert allocator_in_use(maps) == "jemalloc"
    assert allocator_in_use(tmp_path / "absent") == "system"


def test_local_workers_start_with_the_worker_environment(monkeypatch):
    started = []
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.setattr(allocator, "tcmalloc_installed", lambda: True)
    monkeypatch.setattr("master.run.local_workers._worker_installed", lambda: True)
    monkeypatch.setattr(
        "master.run.local_workers.subprocess.Popen",
        lambda command, env, **output: started.append(env),
    )
    LocalWorkers("127.0.0.1:1", 2).start()
    assert [env["LD_PRELOAD"] for env in started] == [TCMALLOC, TCMALLOC]
    assert all(env["OMP_NUM_THREADS"] for env in started)


def test_a_worker_on_the_system_malloc_is_told_how_to_get_tcmalloc():
    missing = allocator_advice("system", {}, installed=False)
    assert "apt-get install libtcmalloc-minimal4" in missing
    installed = allocator_advice("system", {"PATH": "/usr/bin"}, installed=True)
    assert f"LD_PRELOAD={TCMALLOC}" in installed and "not preloaded" in installed
    # Nothing to say where tcmalloc (or another allocator) runs, or where LD_PRELOAD chose,
    # even an empty one (the way to opt out).
    assert allocator_advice("tcmalloc", {}, installed=True) is None
    assert allocator_advice("jemalloc", {}, installed=False) is None
    assert allocator_advice("system", {"LD_PRELOAD": ""}, installed=True) is None
