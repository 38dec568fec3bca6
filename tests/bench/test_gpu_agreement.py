"""bench/gpu_agreement.py: the batched path's greedy actions and scores against the per-genome
float32 path, along the per-genome path's own Frostbite trajectories.

The same check runs on a CPU here (the batched CPU engine against a CPU worker's) and on a
CUDA device on a GPU host (make test-gpu), TF32 off: >= 99.9% of steps agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.gpu_agreement import (
    TARGET,
    Settings,
    _Actor,
    _Comparison,
    make_genomes,
    measure_agreement,
)
from tests.support.bench import run_bench
from tests.support.processes import REPO

GENOME = REPO / "bench" / "results" / "frostbite-best-genome.json"
# A CPU here plays a few short episodes; a GPU host the 16 genomes x 5 episodes.
SIZES = {"cpu": {"genomes": 4, "episodes": 2, "max_episode_steps": 60},
         "cuda": {"genomes": 16, "episodes": 5, "max_episode_steps": 300}}  # fmt: skip


def check_agreement(report: dict[str, Any], genomes: int, episodes: int, max_steps: int) -> None:
    """What every agreement run must show, on any device."""
    steps, scores = report["steps"], report["scores"]
    assert steps["complete"] and scores["complete"]
    assert steps["compared"] == sum(g["steps"] for g in steps["per_genome"]) > 0
    assert steps["compared"] <= genomes * episodes * max_steps
    assert all(g["steps"] > 0 for g in steps["per_genome"])
    assert steps["agreement"] >= TARGET, steps["disagreements"]
    assert report["meets_target"]
    assert scores["episodes_compared"] == genomes * episodes
    # Same seeds and the same actions on every step must give the same scores (else the
    # emulator is not deterministic and the score comparison says nothing).
    assert scores["every_step_agreeing_scores_equal"]
    assert scores["genomes_agreeing_on_every_step"]
    assert steps["cpu_engine"] != steps["batched_engine"] == "torch-grouped"


def test_genomes_are_drawn_as_a_run_draws_them() -> None:
    genomes = make_genomes(16, 3, seed=5)
    assert genomes == make_genomes(16, 3, seed=5) != make_genomes(16, 3, seed=6)
    assert len(set(genomes)) == 16 and all(len(g) == 4 for g in genomes)
    assert all(0 <= s < 2**32 for g in genomes for s in g)


class _FixedPolicy:
    def __init__(self, outputs: np.ndarray) -> None:
        self.outputs = outputs

    def forward(self, observations: np.ndarray) -> np.ndarray:
        return self.outputs[None]


def test_a_disagreement_is_counted_with_how_near_a_tie_it_was() -> None:
    from concurrent.futures import ThreadPoolExecutor

    import gymnasium as gym

    cpu = [np.array([0.0, 1.0, 0.5], np.float32), np.array([2.0, 0.0, 1.9], np.float32)]
    device = np.stack([cpu[0], np.array([2.0, 0.0, 2.1], np.float32)])  # row 1 flips to 2

    def batched(slots: list[int], observations: np.ndarray) -> np.ndarray:
        assert slots == [0, 1] and len(observations) == 2
        return device

    with ThreadPoolExecutor(2) as pool:
        group = _Comparison(batched, gym.spaces.Discrete(3), pool)
        actors = [_Actor(group, slot, _FixedPolicy(cpu[slot])) for slot in (0, 1)]
        played = group.act_rows(actors, np.zeros((2, 4), np.float32))
    assert played.tolist() == [1, 0]  # the per-genome path's actions are the ones played
    assert group.steps == {0: 1, 1: 1} and group.agreeing == {0: 1}
    assert [group.played[slot].tolist() for slot in (0, 1)] == [[0, 1, 0], [1, 0, 0]]
    (flip,) = group.disagreements
    assert flip["genome"] == 1 and (flip["cpu_action"], flip["batched_action"]) == (0, 2)
    assert flip["cpu_margin"] == pytest.approx(0.1, abs=1e-6)
    assert group.max_output_difference == pytest.approx(0.2, abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_batched_path_plays_as_the_per_genome_path(device: str, noise_cache: Path) -> None:
    size = SIZES[device]
    settings = Settings(device=device, noise_table_size=2**23, **size)
    report = measure_agreement(settings)
    check_agreement(report, size["genomes"], size["episodes"], size["max_episode_steps"])
    # The genomes are different policies: not one game played G times.
    played = [tuple(g["actions_played"]) for g in report["steps"]["per_genome"]]
    assert len(set(played)) > 1
    if device == "cuda":
        assert report["machine"]["tf32"] == {"matmul": False, "cudnn": False}


@pytest.mark.slow
def test_the_agreement_command_replays_a_trained_genome(tmp_path: Path, noise_cache: Path) -> None:
    report = run_bench("gpu_agreement.py", "--device", "cpu", "--genomes", "2", "--episodes",
                       "1", "--max-episode-steps", "40", "--noise-table-size", str(2**23),
                       "--genome", str(GENOME), "--replay-episodes", "1",
                       "--replay-max-steps", "150", out=tmp_path / "a.json")  # fmt: skip
    check_agreement(report, 2, 1, 40)
    replay = report["replay"]
    assert replay["complete"] and replay["episodes"] == 1 and replay["max_episode_steps"] == 150
    assert replay["equal"] and replay["cpu"] == replay["batched"] and len(replay["cpu"]) == 1
    # The trained genome scores in 150 steps (random play: about nothing that soon).
    assert replay["cpu"][0] > 0


@pytest.mark.slow
def test_a_time_limit_reports_what_was_played(noise_cache: Path) -> None:
    # 2 x 5,000 steps of a CPU's batched pass (tens of ms each) do not fit in 2 s.
    settings = Settings(genomes=2, episodes=1, max_episode_steps=5000, time_limit_s=2.0,
                        noise_table_size=2**23)  # fmt: skip
    report = measure_agreement(settings)
    steps, scores = report["steps"], report["scores"]
    assert not steps["complete"] and not scores["complete"]
    assert 0 < steps["compared"] < 2 * 5000 and steps["agreement"] is not None
    # A short episode may end inside the limit on a fast machine; not both of them.
    assert scores["episodes_compared"] < 2
    assert (scores["equal_fraction"] is None) == (scores["episodes_compared"] == 0)
