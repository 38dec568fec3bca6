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
    second = save_sidecar(tmp_path, 2, np.ones(3))
    save_checkpoint(tmp_path, {"n": 2, "sidecar": second})
    (tmp_path / second["file"]).write_bytes(b"not an array")
    assert load_checkpoint(tmp_path)["n"] == 1
    # The next save (same generation as the checkpoint resumed from) keeps that one as previous.
    save_checkpoint(tmp_path, {"n": 3, "sidecar": save_sidecar(tmp_path, 1, np.zeros(3))})
    assert json.loads((tmp_path / PREVIOUS).read_text())["payload"]["n"] == 1
    assert load_checkpoint(tmp_path)["n"] == 3
    assert len(list(tmp_path.glob("checkpoint.corrupt-*.json"))) == 1


def test_each_checkpoint_names_its_own_state_file_and_no_save_changes_another_s(
    tmp_path: Path,
) -> None:
    # As the trainer saves: a generation's checkpoint, then (periodically, or on exit) more of
    # the same generation, one of them after a tell() that changed the arrays but failed.
    first = save_sidecar(tmp_path, 3, np.zeros(3, np.float32))
    save_checkpoint(tmp_path, {"n": 1, "sidecar": first})
    second = save_sidecar(tmp_path, 3, np.zeros(3, np.float32))
    save_checkpoint(tmp_path, {"n": 2, "sidecar": second})
    assert first["file"] != second["file"] and first["file"].startswith("es_state-3-")
    # Damage to the newest state file leaves the previous checkpoint whole.
    (tmp_path / second["file"]).write_bytes(b"")
    assert load_checkpoint(tmp_path)["n"] == 1
    third = save_sidecar(tmp_path, 3, np.ones(3, np.float32))
    save_checkpoint(tmp_path, {"n": 3, "sidecar": third})
    assert load_checkpoint(tmp_path)["n"] == 3
    (tmp_path / CURRENT).write_text("{")
    assert load_checkpoint(tmp_path)["n"] == 1  # its state file was never written again
    # Only the files the two checkpoints name are kept.
    assert sorted(p.name for p in tmp_path.glob("es_state-*.npy")) == sorted(
        [first["file"], third["file"]]
    )


def test_saves_within_a_generation_alternate_between_two_files_and_write_no_more(
    tmp_path: Path,
) -> None:
    arrays = np.arange(3, dtype=np.float32)
    names = []
    for n in range(4):  # periodic checkpoints of one generation: the same arrays each time
        record = save_sidecar(tmp_path, 5, arrays)
        save_checkpoint(tmp_path, {"n": n, "sidecar": record})
        names.append(record["file"])
        if n == 1:
            written = {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("es_state-*.npy")}
    assert names[0] == names[2] != names[1] == names[3]
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("es_state-*.npy")} == written
    with open(tmp_path / names[3], "r+b") as f:
        f.truncate(10)
    assert load_checkpoint(tmp_path)["n"] == 2
    # The damaged file is never named again: the next save writes a new one.
    record = save_sidecar(tmp_path, 5, arrays)
    assert record["file"] not in names
    save_checkpoint(tmp_path, {"n": 4, "sidecar": record})
    assert load_checkpoint(tmp_path)["n"] == 4
    assert json.loads((tmp_path / PREVIOUS).read_text())["payload"]["n"] == 2


def test_a_checkpoint_holding_sums_no_normaliser_can_use_is_refused(tmp_path: Path) -> None:
    good = {"count": 10.0, "sum": [1.0, 2.0], "sum_of_squares": [1.0, 4.0]}
    poisoned = {"count": 1.0, "sum": [1e45, 0.0], "sum_of_squares": [1e90, 0.0]}
    save_checkpoint(tmp_path, {"algorithm": {"name": "es", "state": {"observations": good}}})
    save_checkpoint(tmp_path, {"algorithm": {"name": "es", "state": {"observations": poisoned}}})
    assert load_checkpoint(tmp_path)["algorithm"]["state"]["observations"] == good
    # A running phase's results are held to the same.
    extras = {"v3/p/0+/0": {"observations": {**good, "sum_of_squares": [1.7e308, 4.0]}}}
    save_checkpoint(tmp_path, {"phase_extras": extras})
    with pytest.raises(CheckpointError, match=r"task v3/p/0\+/0's observation sums are unusable"):
        load_checkpoint(tmp_path)


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
    first = state_file(run_dir / CURRENT)
    kept = (run_dir / first).read_bytes()
    done = neuro_master("--run-dir", str(run_dir), "--generations", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    # As a master killed after generation 2's checkpoint leaves it: the previous one names
    # generation 1's state, which is kept beside generation 2's.
    (run_dir / PREVIOUS).write_bytes(after_one)
    (run_dir / first).write_bytes(kept)
    second = state_file(run_dir / CURRENT)
    assert second.startswith("es_state-2-") and first.startswith("es_state-1-")
    backup = tmp_path / "backup"
    shutil.copytree(run_dir, backup)
    (run_dir / second).write_bytes(b"\x93NUMPY garbage")
    done = neuro_master("--run-dir", str(run_dir), "--generations", "3")
    assert done.returncode == 0, done.stderr[-3000:]
    assert second in done.stderr  # the refusal is logged, naming the file
    assert [r["generation"] for r in read_metrics(run_dir / "metrics.jsonl")] == [0, 1, 2]
    # Nothing usable: exit 2 naming each checkpoint and its state file, no traceback.
    (backup / second).unlink()
    (backup / first).write_bytes(b"")
    done = neuro_master("--run-dir", str(backup), "--generations", "3")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    for text in (str(backup / CURRENT), second, "missing", str(backup / PREVIOUS), first):
        assert text in done.stderr, text


def state_file(checkpoint: Path) -> str:
    """The name of the state file (the .npy sidecar) a checkpoint file names."""
    return json.loads(checkpoint.read_text())["payload"]["sidecar"]["file"]


NOVELTY = {
    "ns-es": ("--algo", "ns-es", "--pairs", "2", "--eval-episodes", "1", "--meta-population",
              "2", "--no-target"),
    "ga-ns": ("--algo", "ga-ns", *GA, "--archive-probability", "0.5"),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", sorted(NOVELTY))
def test_a_truncated_newest_state_file_leaves_the_previous_checkpoint_usable(
    tmp_path: Path, noise_cache: Path, algorithm: str
) -> None:
    """The run's last two checkpoints (its last generation's and the one written on exit)
    hold the same state; each names its own file, so damage to the newest leaves the other."""
    run_dir = tmp_path / "run"
    done = neuro_master("--run-dir", str(run_dir), "--generations", "3", *NOVELTY[algorithm])
    assert done.returncode == 0, done.stderr[-3000:]
    newest, previous = state_file(run_dir / CURRENT), state_file(run_dir / PREVIOUS)
    kept = (run_dir / previous).read_bytes() if (run_dir / previous).is_file() else None
    with open(run_dir / newest, "r+b") as f:
        f.truncate(f.seek(0, os.SEEK_END) // 2)
    done = neuro_master("--run-dir", str(run_dir), "--generations", "4")
    assert done.returncode == 0, done.stderr[-3000:]
    assert newest in done.stderr and "resuming from the previous checkpoint" in done.stderr
    assert newest != previous
    assert [r["generation"] for r in read_metrics(run_dir / "metrics.jsonl")] == [0, 1, 2, 3]
    # The resumed run wrote new state files and never touched the one it resumed from.
    assert not (run_dir / previous).exists() or (run_dir / previous).read_bytes() == kept
    assert load_checkpoint(run_dir)["algorithm"]["state"]["generation"] == 4
