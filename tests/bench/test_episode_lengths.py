"""bench/episode_lengths.py end to end at a tiny size: random-start episodes of real games under
the worker's vector protocol, each cut at the cap, the same lengths for the same seed."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.episode_lengths import PAPER_GAMES
from tests.support.bench import run_bench

pytestmark = pytest.mark.slow


def test_paper_games_are_the_thirteen_of_the_paper_study() -> None:
    from master.study.file import load_study

    study = load_study("paper")
    assert len(PAPER_GAMES) == 13 and set(PAPER_GAMES) == {run.env for run in study.runs}


def test_episode_lengths_are_played_whole_cut_at_the_cap_and_repeatable(tmp_path: Path) -> None:
    args = ("--envs", "Frostbite-v4", "Asterix-v4", "--episodes", "3", "--lanes", "2",
            "--processes", "1")  # fmt: skip
    whole = run_bench("episode_lengths.py", *args, out=tmp_path / "whole.json")
    again = run_bench("episode_lengths.py", *args, out=tmp_path / "again.json")
    cut = run_bench("episode_lengths.py", *args, "--max-episode-steps", "50",
                    out=tmp_path / "cut.json")  # fmt: skip
    assert whole["command"].startswith("python -m bench.episode_lengths --envs Frostbite-v4")
    for env in ("Frostbite-v4", "Asterix-v4"):
        game = whole["games"][env]
        # Random play loses every life well before the 5,000-step cap in both games.
        assert len(game["steps"]) == len(game["returns"]) == game["episodes"] == 3
        assert all(50 < steps < 5000 for steps in game["steps"]) and game["at_cap"] == 0
        assert game["mean"] == pytest.approx(sum(game["steps"]) / 3, abs=0.05)
        # The episode's env seed and the actions' seed fix the episode.
        assert again["games"][env]["steps"] == game["steps"]
        assert cut["games"][env]["steps"] == [50, 50, 50] and cut["games"][env]["at_cap"] == 3


def test_a_count_below_one_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="--episodes must be >= 1, got 0"):
        run_bench("episode_lengths.py", "--episodes", "0", out=tmp_path / "x.json")
