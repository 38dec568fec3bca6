"""Falling back to the previous checkpoint never loses it; a bad checkpoint or ES state stops
the master at start with a clear message instead of a traceback later."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from master.run.checkpoint import (
    CURRENT,
    PREVIOUS,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
    save_sidecar,
)
from master.run.rundir import read_metrics
from tests.support.processes import REPO, worker_env


def crash_before_the_new_checkpoint_lands(monkeypatch: pytest.MonkeyPatch) -> None:
    """Makes the rename that puts a freshly written checkpoint in place fail, like a power cut."""
    replace = os.replace

    def failing(source: str | os.PathLike, target: str | os.PathLike) -> None:
        if Path(source).name.startswith(".checkpoint."):
            raise OSError("simulated crash before the new checkpoint is renamed into place")
        replace(source, target)

    monkeypatch.setattr(os, "replace", failing)


def test_a_save_after_falling_back_keeps_the_good_previous_and_the_bad_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_checkpoint(tmp_path, {"n": 1})
    save_checkpoint(tmp_path, {"n": 2})
    current = tmp_path / CURRENT
    damaged = current.read_text()[:40]
    current.write_text(damaged)
    assert load_checkpoint(tmp_path) == {"n": 1}
    with monkeypatch.context() as patch:
        crash_before_the_new_checkpoint_lands(patch)
        with pytest.raises(OSError, match="simulated crash"):
            save_checkpoint(tmp_path, {"n": 3})
    # The crash between the two renames left the good previous checkpoint in place.
    assert load_checkpoint(tmp_path) == {"n": 1}
    save_checkpoint(tmp_path, {"n": 3})
    assert load_checkpoint(tmp_path) == {"n": 3}
    assert json.loads((tmp_path / PREVIOUS).read_text())["payload"] == {"n": 1}
    # The bad file is moved aside, not destroyed.
    (aside,) = tmp_path.glob("checkpoint.corrupt-*.json")
    assert aside.read_text() == damaged
    assert not list(tmp_path.glob(".checkpoint.*"))


def test_a_checkpoint_whose_es_state_is_bad_never_replaces_the_previous_one(
    tmp_path: Path,
) -> None:
    save_checkpoint(tmp_path, {"n": 1, "sidecar": save_sidecar(tmp_path, 1, np.zeros(3))})
    save_checkpoint(tmp_path, {"n": 2, "sidecar": save_sidecar(tmp_path, 2, np.ones(3))})
    (tmp_path / "es_state-2.npy").write_bytes(b"not an array")
    assert load_checkpoint(tmp_path)["n"] == 1
    # The next save (same generation as the checkpoint resumed from) keeps that one as previous.
    save_checkpoint(tmp_path, {"n": 3, "sidecar": save_sidecar(tmp_path, 1, np.zeros(3))})
    assert json.loads((tmp_path / PREVIOUS).read_text())["payload"]["n"] == 1
    assert load_checkpoint(tmp_path)["n"] == 3
    assert len(list(tmp_path.glob("checkpoint.corrupt-*.json"))) == 1


@pytest.mark.parametrize("name", [CURRENT, PREVIOUS])
def test_a_directory_at_a_checkpoint_path_is_refused_naming_it(tmp_path: Path, name: str) -> None:
    save_checkpoint(tmp_path, {"n": 1})
    save_checkpoint(tmp_path, {"n": 2})
    (tmp_path / name).unlink()
    (tmp_path / name).mkdir()
    with pytest.raises(CheckpointError, match=rf"{tmp_path / name}.*not a regular file"):
        load_checkpoint(tmp_path)


def neuro_master(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "master", "--env", "CartPole-v1", "--local-workers", "1",
               "--port", "0", "--quiet", *args]  # fmt: skip
    return subprocess.run(command, env=worker_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


GA = ("--population", "10", "--elite-candidates", "2", "--elite-episodes", "2", "--no-target")
ES = ("--algo", "es", "--pairs", "2", "--eval-episodes", "1", "--no-target")


@pytest.mark.slow
def test_a_directory_at_checkpoint_json_stops_the_master_at_start(
    tmp_path: Path, noise_cache: Path
) -> None:
    run_dir = tmp_path / "run"
    done = neuro_master("--run-dir", str(run_dir), "--generations", "1", *GA)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir / CURRENT).unlink()
    (run_dir / CURRENT).mkdir()
    done = neuro_master("--run-dir", str(run_dir), "--generations", "2", *GA)
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"{run_dir / CURRENT}: not a regular file" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_bad_es_state_file_resumes_from_the_previous_checkpoint_or_says_what_is_wrong(
    tmp_path: Path, noise_cache: Path
) -> None:
    run_dir = tmp_path / "run"
    done = neuro_master("--run-dir", str(run_dir), "--generations", "1", *ES)
    assert done.returncode == 0, done.stderr[-3000:]
    after_one = (run_dir / CURRENT).read_bytes()
    done = neuro_master("--run-dir", str(run_dir), "--generations", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    # As a master killed after generation 2's checkpoint leaves it: the previous one names
    # generation 1's state, which is kept beside generation 2's.
    (run_dir / PREVIOUS).write_bytes(after_one)
    backup = tmp_path / "backup"
    shutil.copytree(run_dir, backup)
    (run_dir / "es_state-2.npy").write_bytes(b"\x93NUMPY garbage")
    done = neuro_master("--run-dir", str(run_dir), "--generations", "3")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "es_state-2.npy" in done.stderr  # the refusal is logged, naming the file
    assert [r["generation"] for r in read_metrics(run_dir / "metrics.jsonl")] == [0, 1, 2]
    # Nothing usable: exit 2 naming each checkpoint and its state file, no traceback.
    (backup / "es_state-2.npy").unlink()
    (backup / "es_state-1.npy").write_bytes(b"")
    done = neuro_master("--run-dir", str(backup), "--generations", "3")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    for text in (str(backup / CURRENT), "es_state-2.npy", "missing", str(backup / PREVIOUS),
                 "es_state-1.npy"):  # fmt: skip
        assert text in done.stderr, text
