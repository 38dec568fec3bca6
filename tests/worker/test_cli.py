"""neuro-worker's names say what they choose: --atari-backend picks what plays Atari (the old
--atari-engine still works), and a joining worker says what it will run, true for any env."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from worker.cli import worker_parser, worker_settings
from worker.cli.settings import WorkerSettings
from worker.client import WorkerClient
from worker.evaluation.evaluator import Evaluator


@pytest.fixture(autouse=True)
def _no_backend_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEURO_ATARI_BACKEND", raising=False)
    monkeypatch.delenv("NEURO_ATARI_ENGINE", raising=False)


def _settings(*argv: str) -> WorkerSettings:
    parser = worker_parser()
    return worker_settings(parser, parser.parse_args(["--master", "127.0.0.1:1", *argv]))


def test_the_atari_backend_flag_and_its_env_var_choose_what_plays_atari(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _settings().atari_backend == "vector"
    assert _settings("--atari-backend", "gym").atari_backend == "gym"
    monkeypatch.setenv("NEURO_ATARI_BACKEND", "gym")
    assert _settings().atari_backend == "gym"
    assert "--atari-backend" in worker_parser().format_help()


def test_the_old_flag_and_env_var_still_work_and_the_flag_says_it_is_deprecated(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _settings("--atari-engine", "gym").atari_backend == "gym"
    assert "--atari-engine is deprecated; use --atari-backend" in capsys.readouterr().err
    assert "--atari-engine" not in worker_parser().format_help()  # hidden
    monkeypatch.setenv("NEURO_ATARI_ENGINE", "gym")
    assert _settings().atari_backend == "gym"
    monkeypatch.setenv("NEURO_ATARI_BACKEND", "vector")  # the new name wins
    assert _settings().atari_backend == "vector"


def test_a_backend_it_does_not_have_is_refused_naming_the_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (["--atari-backend", "emulator"], ["--atari-engine", "emulator"]):
        with pytest.raises(SystemExit) as exited:
            _settings(*argv)
        assert exited.value.code == 2
        assert "--atari-backend (or NEURO_ATARI_BACKEND) must be one of" in capsys.readouterr().err


def test_the_stats_file_names_the_atari_backend(tmp_path: Path) -> None:
    evaluator = Evaluator(str(tmp_path), atari_backend="vector")
    stats = WorkerClient("127.0.0.1:1", "w", evaluator).stats()
    assert stats["atari_backend"] == "vector" and "atari_engine" not in stats
    assert stats["inference_engine"] == evaluator.inference_engine


def test_a_joining_worker_says_what_it_will_run_true_for_any_env(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The join line names the runner and the engine the worker prefers, not an Atari net: a
    CartPole worker runs none. (Which engine each kind of policy got is logged when its first
    policy is built.)"""
    from worker.cli import work

    ran = []
    monkeypatch.setattr(WorkerClient, "run", lambda self: ran.append(self) or 0)
    monkeypatch.setattr(work.signal, "signal", lambda *args: None)  # the test's own handlers stay
    caplog.set_level(logging.INFO)
    settings = _settings("--device", "cpu", "--shared-cache-mb", "0", "--slots", "3")
    assert work.run_worker(settings) == 0 and ran
    (joined,) = [r.getMessage() for r in caplog.records if "joining master" in r.getMessage()]
    assert "Atari net" not in joined
    engine = settings.inference_engine
    assert f"per-genome runner, 3 slots, inference engine {engine} preferred" in joined
    batched = _settings("--device", "cpu", "--envs", "4")
    assert work._runs_on(batched) == "batched runner, 4 env slots on cpu"
