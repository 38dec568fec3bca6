"""The learning study's analysis: the exact rank test, the equal-cost point and the decision
rule applied to result files (the training runs themselves take hours: bench/learning_parity.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from bench.learning_parity import equal_cost_point, mann_whitney_p, markdown_table, run_report


@pytest.mark.parametrize(
    ("a", "b", "p"),
    [
        ([1, 2, 3], [4, 5, 6], 2 / 20),  # the two most extreme of C(6,3) = 20 splits
        ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10], 2 / 252),
        ([1, 1], [1, 1], 1.0),  # all tied: every split is as extreme
        ([1, 3, 5], [2, 4, 6], 14 / 20),  # |rank sum - 10.5| >= 1.5 in 14 of 20 splits
    ],
)
def test_the_rank_test_is_exact(a, b, p):
    assert mann_whitney_p(a, b) == pytest.approx(p)
    assert mann_whitney_p(b, a) == pytest.approx(p)  # two-sided


@pytest.mark.parametrize(
    ("ratio", "point"), [(1.56, "x1.5"), (1.94, "x1.75"), (1.0, "x1"), (0.8, "x1"), (3.0, "x2")]
)
def test_the_candidate_is_never_credited_with_frames_it_did_not_pay_for(ratio, point):
    assert equal_cost_point(ratio) == point


def _write_runs(
    out: Path, float32: list[float], int8_at_cost: list[float], game: str = "Frostbite-v4"
) -> None:
    """Result files as `run` writes them: each run's replay means at its points."""
    out.mkdir(exist_ok=True)
    stem = game.removesuffix("-v4").lower()
    for seed, score in enumerate(float32, 1):
        run = {"game": game, "seed": seed, "dtype": "float32", "metrics": [],
               "replays": {"final": {"scores": {"float32": [score - 10, score + 10]}}}}  # fmt: skip
        (out / f"{stem}-float32-seed{seed}.json").write_text(json.dumps(run))
    for seed, score in enumerate(int8_at_cost, 1):
        scores = lambda s: {"scores": {"int8-static": [s, s]}}  # noqa: E731
        run = {"game": game, "seed": seed, "dtype": "int8-static", "metrics": [],
               "replays": {"x1": scores(score / 2), "x1.5": scores(score),
                           "final": scores(10 * score)}}  # fmt: skip
        (out / f"{stem}-int8-static-seed{seed}.json").write_text(json.dumps(run))


def _seaquest_as_good(out: Path) -> None:
    _write_runs(out, [500, 600, 700], [550, 650, 600], game="Seaquest-v4")


def _report(out: Path) -> dict:
    return run_report(
        argparse.Namespace(out=out, cost_ratio=1.56, json=None, markdown=None, plot=None)
    )


def test_the_rule_passes_a_candidate_as_good_at_equal_cost(tmp_path):
    _write_runs(tmp_path / "r", float32=[1000, 1100, 1200, 900, 1050],
                int8_at_cost=[1000, 1150, 1100, 950, 1080])  # fmt: skip
    _seaquest_as_good(tmp_path / "r")
    report = _report(tmp_path / "r")
    cost = report["games"]["Frostbite-v4"]["int8-static"]["equal_cost"]
    assert report["equal_cost_point"] == "x1.5" and cost["median"] == 1080
    assert cost["passes"] and report["missing_runs"] == [] and report["decision"] is True
    # At equal frames the same runs score half as much: reported beside, not deciding.
    frames = report["games"]["Frostbite-v4"]["int8-static"]["equal_frames"]
    assert frames["median"] == 540 and not frames["passes"]


def test_the_rule_fails_a_candidate_that_learns_worse_at_equal_cost(tmp_path):
    _write_runs(tmp_path / "r", float32=[1000, 1500, 2000, 1200, 1800],
                int8_at_cost=[200, 250, 300, 260, 240])  # fmt: skip
    _seaquest_as_good(tmp_path / "r")
    report = _report(tmp_path / "r")
    cost = report["games"]["Frostbite-v4"]["int8-static"]["equal_cost"]
    assert cost["median_gap_below_float32"] == 1500 - 250
    assert cost["mann_whitney_p"] < 0.05 and not cost["passes"]
    assert report["games"]["Seaquest-v4"]["int8-static"]["equal_cost"]["passes"]
    assert report["decision"] is False  # every game must pass


def test_no_decision_while_a_planned_run_is_missing(tmp_path):
    _write_runs(tmp_path / "r", float32=[1000, 1100, 1200, 900, 1050],
                int8_at_cost=[1000, 1150, 1100, 950])  # fmt: skip
    report = _report(tmp_path / "r")
    assert report["games"]["Frostbite-v4"]["int8-static"]["equal_cost"]["passes"]
    assert report["decision"] is None
    assert report["missing_runs"] == ["frostbite-int8-static-seed5"] + [
        f"seaquest-{dtype}-seed{seed}" for seed in (1, 2, 3) for dtype in ("float32", "int8-static")
    ]


def test_the_table_gives_each_seed_at_equal_frames_equal_cost_and_final(tmp_path):
    _write_runs(tmp_path / "r", float32=[1000, 1100], int8_at_cost=[900])
    runs = [json.loads(p.read_text()) for p in sorted((tmp_path / "r").glob("*.json"))]
    lines = markdown_table(runs, 1.56).splitlines()
    assert "equal cost (x1.5)" in lines[0]
    assert lines[2:] == ["| Frostbite-v4 | 1 | 1,000 | 450 | 900 | 9,000 |",
                         "| Frostbite-v4 | 2 | 1,100 |  |  |  |"]  # fmt: skip
