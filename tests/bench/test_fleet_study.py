"""bench/study_sim.py and bench/fleet_study.py: many runs on one simulated fleet through the
master's real lease tables and fair-share picker, in virtual time (the figures depend on the
seeds only, so nothing here depends on this machine's speed)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from bench.study_sim import Pools, RunPlan, Shape, StudyFigures, StudySimulation
from tests.support.bench import run_bench

SHAPE = Shape(population=30, elite_candidates=3, elite_episodes=5, test_episodes=5)
POOLS = {
    "short": Pools(np.array([40, 60, 80, 400]), np.array([50, 70])),
    "long": Pools(np.array([200, 300, 900]), np.array([250, 260])),
}


def study(workers: int, cap: int, overlap: bool, runs: int = 4, frames: int = 60_000,
          seed: int = 0) -> StudyFigures:  # fmt: skip
    plans = [RunPlan(f"r{i}", "short" if i % 2 else "long", frames) for i in range(runs)]
    sim = StudySimulation(workers, plans, POOLS, SHAPE, step_ms=1.0, overlap=overlap,
                          max_concurrent=cap, seed=seed)  # fmt: skip
    return sim.run()


@pytest.mark.parametrize("overlap", [False, True])
def test_every_run_spends_its_budget_and_ends_with_its_test(overlap: bool) -> None:
    figures = study(12, 2, overlap)
    assert sorted(run["name"] for run in figures.runs) == ["r0", "r1", "r2", "r3"]
    tasks = 0
    for run in figures.runs:
        # The budget is checked at a generation's end: spent by the last, not by the one before.
        per_generation = run["frames"] / run["generations"]
        assert run["frames"] >= 60_000 > run["frames"] - per_generation
        assert len(run["generation_ends"]) == run["generations"]
        assert (
            run["start_s"] < run["generation_ends"][0] and run["generation_ends"][-1] < run["end_s"]
        )
        tasks += run["generations"] * (30 + 3 * 5) + 5
    # Every task of every phase recorded exactly once (the simulation checks each phase).
    assert figures.tasks == tasks
    assert 0 < figures.utilisation <= figures.busy <= 1.0
    assert figures.wall_s == max(run["end_s"] for run in figures.runs)


def test_the_cap_holds_and_the_queue_starts_a_run_as_one_ends() -> None:
    figures = study(12, 2, True, runs=5)
    spans = sorted((run["start_s"], run["end_s"]) for run in figures.runs)
    for start, _ in spans:
        assert sum(1 for s, e in spans if s <= start < e) <= 2
    ends = {run["end_s"] for run in figures.runs}
    late = [start for start, _ in spans if start > 0]
    assert len(late) == 3 and all(start in ends for start in late)


def test_one_at_a_time_runs_never_overlap_and_a_study_ends_sooner() -> None:
    alone = study(40, 1, False)
    spans = sorted((run["start_s"], run["end_s"]) for run in alone.runs)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))
    together = study(40, 4, False)
    # Virtual time, fixed seeds: on a fleet too big for one run, four at once fill it better.
    assert together.utilisation > alone.utilisation
    assert together.wall_s < alone.wall_s


def test_the_overlap_leases_the_next_offspring_during_the_elite_phase() -> None:
    barrier = study(40, 1, False, runs=1, frames=600_000)
    overlap = study(40, 1, True, runs=1, frames=600_000)
    assert barrier.runs[0]["generations"] >= 4
    assert overlap.runs[0]["generations"] == barrier.runs[0]["generations"]
    # The same work in less time: generation g+1's offspring fill generation g's elite tail.
    assert overlap.wall_s < barrier.wall_s


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="workers 0, max_concurrent 1, 1 runs"):
        StudySimulation(0, [RunPlan("r", "short", 1)], POOLS, SHAPE, step_ms=1.0,
                        overlap=False, max_concurrent=1, seed=0)  # fmt: skip


TINY_STUDY = """name = "tiny"
max_concurrent_runs = 2
test_episodes = 5
[settings]
population_size = 30
truncation = 5
elite_candidates = 3
elite_episodes = 5
[budget]
frames = 3_000_000
no_target = true
[[grid]]
envs = ["Frostbite-v4", "Pong-v4"]
seeds = 2
"""


@pytest.mark.slow
def test_the_table_and_the_utilisation_commands_at_a_tiny_size(tmp_path: Path) -> None:
    file = tmp_path / "tiny.toml"
    file.write_text(TINY_STUDY)
    table = run_bench("fleet_study.py", "table", "--study", str(file), "--workers", "10", "40",
                      "--caps", "2", "4", "--scale", "2", out=tmp_path / "t.json")  # fmt: skip
    assert table["command"].startswith("python -m bench.fleet_study table --study")
    assert table["step_cost"]["core_hours_per_1b_frames"] == 52.81
    # Frostbite has measured random-start lengths; Pong falls back to Frostbite's recorded ones.
    lengths = table["episode_lengths"]["per_env"]
    assert lengths["Frostbite-v4"]["file"] == "paper-games-episode-steps.json"
    assert lengths["Pong-v4"]["file"] == "frostbite-episode-steps.json"
    rows = {(r["workers"], r["mode"], r["cap"]): r for r in table["runs"]}
    modes = [("one-at-a-time", 1), ("one-at-a-time-overlap", 1), ("study", 2), ("study", 4)]
    assert set(rows) == {(w, mode, cap) for w in (10, 40) for mode, cap in modes}
    for (_, mode, _), row in rows.items():
        assert 0 < row["utilisation"] <= row["busy"] <= 1
        assert row["wall_hours"] >= row["ideal_hours"] > 0
        # One run at a time plays each game's first seed; the study plays all four runs.
        assert row["runs_simulated"] == (4 if mode == "study" else 2)
    assert set(table["overlap_gain_one_at_a_time"]) == {"10", "40"}
    util = run_bench("fleet_study.py", "utilisation", "--study", str(file), "--workers", "10",
                     "40", "--runs", "1", "2", "--generations", "2",
                     out=tmp_path / "u.json")  # fmt: skip
    assert util["workers"] == [10, 40] and util["runs_at_once"] == [1, 2]
    assert all(0 < u <= 1 for row in util["utilisation"] for u in row)
    assert len(util["one_run_barrier"]) == 2


def test_interleaved_queues_the_runs_seed_by_seed() -> None:
    from bench.fleet_study import interleaved

    runs = [RunPlan(f"{env}{seed}", env, 1) for env in "ab" for seed in range(3)]
    runs.append(RunPlan("c0", "c", 1))
    assert [run.name for run in interleaved(runs)] == ["a0", "b0", "c0", "a1", "b1", "a2", "b2"]


@pytest.mark.slow
def test_the_picker_command_times_a_lease_call_per_runs_served(tmp_path: Path) -> None:
    result = run_bench("fleet_study.py", "picker", "--runs", "1", "3", out=tmp_path / "p.json")
    assert [row["runs"] for row in result["picker"]] == [1, 3]
    assert all(row["us_per_lease_call"] > 0 for row in result["picker"])
    assert result["machine"]["cpus"] >= 1
