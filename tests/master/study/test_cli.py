"""neuro-master --study: a study file checked before anything starts, and its runs listed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from master.cli import main
from master.study.file import load_study
from master.study.studydir import StudyDir
from neuro.runfiles import CONFIG
from tests.support.processes import worker_env

BAD = """
name = "bad"
[budget]
generations = 3
[[grid]]
envs = ["CartPole-v1"]
seeds = 2
settings = { truncation = 500 }
"""


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test in a directory of its own, without the study's environment variables."""
    monkeypatch.chdir(tmp_path)
    for variable in ("NEURO_STUDY", "NEURO_STUDY_DIR", "NEURO_ENV", "NEURO_RUN_DIR"):
        monkeypatch.delenv(variable, raising=False)


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The usage error (exit 2) neuro-master gives for `argv`."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_dry_run_lists_a_ready_studys_runs_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--study", "laptop", "--dry-run"]) == 0
    out = capsys.readouterr().out
    study = load_study("laptop")
    assert out.splitlines()[0].startswith(
        f"study laptop: {len(study.runs)} runs, at most {study.max_concurrent_runs} at once, "
        "study dir studies/laptop"
    )
    for run in study.runs:
        line = next(line for line in out.splitlines() if line.startswith(run.name + " "))
        assert run.env in line and line.endswith("queued")
    assert "2,500,000 frames" in out
    assert list(tmp_path.iterdir()) == []


def test_a_bad_study_file_is_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "bad.toml").write_text(BAD)
    for argv in (["--study", "bad.toml"], ["--study", "bad.toml", "--dry-run"]):
        err = refused(argv, capsys)
        assert "study bad.toml: run cartpole-v1-s0 ([[grid]] 1): truncation must be in [0, " in err
        assert "got 500" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.toml"]


def test_a_study_dir_the_file_no_longer_fits_is_refused_naming_the_run_and_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = BAD.replace("truncation = 500", "truncation = 5")
    (tmp_path / "good.toml").write_text(good)
    directory = StudyDir(tmp_path / "there")
    study = load_study("good.toml")
    directory.open(study)
    run_dir = directory.run_dir("cartpole-v1-s1")
    run_dir.mkdir(parents=True)
    (run_dir / CONFIG).write_text(json.dumps(study.run("cartpole-v1-s1").config.to_dict()))
    assert main(["--study", "good.toml", "--study-dir", "there", "--dry-run"]) == 0
    assert "cartpole-v1-s1" in capsys.readouterr().out
    (tmp_path / "good.toml").write_text(good.replace("truncation = 5", "truncation = 6"))
    err = refused(["--study", "good.toml", "--study-dir", "there", "--dry-run"], capsys)
    assert "run cartpole-v1-s1 started with truncation = 5; the file now gives 6" in err


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--population", "30"], "--population"),
        (["--env", "CartPole-v1"], "--env"),
        (["--run-dir", "somewhere"], "--run-dir"),
        (["--algo", "es"], "--algo"),
        (["--no-target"], "--no-target"),
        (["--frames", "1000"], "--frames"),
    ],
)
def test_a_flag_that_would_set_a_runs_settings_is_refused_beside_a_study(
    flags: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(["--study", "laptop", "--dry-run", *flags], capsys)
    assert f"error: {named}: a study's runs take their envs, settings and run dirs" in err


def test_the_environment_may_name_the_study(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # As a container sets it; NEURO_ENV and NEURO_RUN_DIR beside it are no flags given.
    monkeypatch.setenv("NEURO_STUDY", "laptop")
    monkeypatch.setenv("NEURO_STUDY_DIR", "elsewhere")
    monkeypatch.setenv("NEURO_ENV", "CartPole-v1")
    monkeypatch.setenv("NEURO_RUN_DIR", "/data/run")
    assert main(["--dry-run"]) == 0
    assert "study dir elsewhere" in capsys.readouterr().out


def test_dry_run_goes_with_a_study_and_a_run_still_needs_its_env(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert "--dry-run goes with --study" in refused(["--dry-run"], capsys)
    assert "the following arguments are required: --env (or --study)" in refused([], capsys)


SMALL = """
name = "small"
max_concurrent_runs = 2
test_episodes = 2
[budget]
no_target = true
generations = 2
[[grid]]
envs = ["CartPole-v1", "neuro/Memorize-K10-v0"]
seeds = [5]
settings = { population_size = 6, truncation = 2, elite_candidates = 2, elite_episodes = 2 }
"""


def test_the_command_serves_a_study_to_its_end_and_the_same_command_again_finds_it_done(
    tmp_path: Path, noise_cache: Path
) -> None:
    (tmp_path / "small.toml").write_text(SMALL)
    command = [sys.executable, "-m", "master", "--study", "small.toml", "--local-workers", "2",
               "--port", "0"]  # fmt: skip
    for _ in range(2):
        done = subprocess.run(command, cwd=tmp_path, env=worker_env(), capture_output=True,
                              text=True, timeout=300, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        directory = StudyDir(tmp_path / "studies" / "small")
        assert directory.states() == {"cartpole-v1-s5": "complete",
                                      "neuro-memorize-k10-v0-s5": "complete"}  # fmt: skip
    # Piped, the progress is JSON lines: each run's generations and states, named.
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert {line["run"] for line in lines} == {"cartpole-v1-s5", "neuro-memorize-k10-v0-s5"}


def test_the_command_lists_the_paper_study(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "master", "--study", "paper", "--dry-run"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "study paper: 65 runs, at most 65 at once, study dir studies/paper"
    assert lines[2].split() == ["amidar-v4-s0", "Amidar-v4", "0", "1,000,000,000", "frames",
                                "30", "ep", "queued"]  # fmt: skip
    assert len(lines) == 2 + 65
