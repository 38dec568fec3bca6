"""bench/study_local.py at a tiny size: a real study on two local workers, at once and one
run after another, with the figures it records."""

from __future__ import annotations

from pathlib import Path

from tests.support.bench import run_bench


def test_a_tiny_study_at_once_and_one_after_another(tmp_path: Path, noise_cache: Path) -> None:
    document = run_bench("study_local.py", "--runs", "2", "--generations", "2", "--population",
                         "6", "--truncation", "2", "--elite-episodes", "2", "--test-episodes", "1",
                         out=tmp_path / "study.json")  # fmt: skip
    assert document["command"].startswith("python -m bench.study_local --runs 2")
    assert document["same_results"] is True and document["workers"] == 2
    for way, concurrent in (("study", 2), ("one_after_another", 1)):
        figures = document[way]
        assert figures["max_concurrent_runs"] == concurrent
        assert sorted(figures["runs"]) == ["cartpole-v1-s0", "cartpole-v1-s1"]
        assert 0 < figures["utilisation"] <= 1 and figures["cpu_s"] > 0
        total = sum(r["worker_s"] for r in figures["runs"].values())
        assert abs(figures["worker_s"] - total) <= 0.01  # rounded to hundredths
    assert document["speedup"] > 0
