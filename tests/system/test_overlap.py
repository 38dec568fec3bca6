"""The GA's exact overlap: the same seed with and without it gives the same run, bit for bit.

A real master on loopback and two real worker processes, twice: once with a barrier between
phases, once playing each generation's next offspring while its elite phase runs. Every
metrics line's scores, counts and elite, and every genome file, are the same; the overlap run
did play tasks ahead (else the comparison would prove nothing), and its final test wrote
final_test.json without adding to the budget's frames.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest

from master.config import inspect_env_id, preset
from master.fleet.fleet import Fleet
from master.run.rundir import read_metrics
from master.run.start import start_master
from neuro.runfiles import FINAL_TEST, FINAL_TEST_FORMAT, seeds_sha256
from tests.support.processes import spawn_worker, stop_processes

pytestmark = pytest.mark.slow

GENERATIONS = 5
SETTINGS = {"generations": GENERATIONS, "population_size": 12, "truncation": 3,
            "elite_candidates": 3, "elite_episodes": 8, "target_score": None,
            "seed": 11}  # fmt: skip
SAME = ("generation", "frames", "evaluations", "score_mean", "score_max", "elite_score",
        "elite_sha256", "elite_length", "generation_evaluations", "generation_frames",
        "failed_evaluations")  # fmt: skip
"""The fields of a metrics line that the run's results decide (not its timing)."""
TEST_EPISODES = 5
RUN_S = 240.0


def _train(run_dir: Path, overlap: bool) -> int:
    """Trains the run on two worker processes; returns the tasks played ahead."""
    config = preset(inspect_env_id("CartPole-v1"), **SETTINGS)

    async def main() -> int:
        master = await start_master(config, run_dir, out=None, overlap=overlap,
                                    test_episodes=TEST_EPISODES if overlap else 0)  # fmt: skip
        workers = [spawn_worker(master.port, f"{run_dir.name}-{i}") for i in range(2)]
        try:
            await asyncio.wait_for(master.trainer.run(), RUN_S)
        finally:
            stop_processes(workers)
            await master.stop(0)
        fleet = master.trainer.fleet
        assert isinstance(fleet, Fleet)
        return fleet._phases.played_ahead

    return asyncio.run(main())


def test_the_overlap_plays_the_same_run_as_the_barrier(tmp_path: Path, noise_cache: Path) -> None:
    barrier, overlap = tmp_path / "barrier", tmp_path / "overlap"
    assert _train(barrier, overlap=False) == 0
    # Generations 1 to 3 play their successors' offspring ahead (generation 0 has no elite to
    # carry yet, the last one no successor).
    assert _train(overlap, overlap=True) > 0
    lines = {path: read_metrics(path / "metrics.jsonl") for path in (barrier, overlap)}
    assert len(lines[barrier]) == GENERATIONS
    for plain, ahead in zip(lines[barrier], lines[overlap], strict=True):
        assert {k: plain[k] for k in SAME} == {k: ahead[k] for k in SAME}
        assert plain["worker_s"] > 0 and ahead["worker_s"] > 0
    genomes = {path: {p.name: p.read_bytes() for p in (path / "genomes").iterdir()}
               for path in (barrier, overlap)}  # fmt: skip
    assert genomes[barrier] == genomes[overlap] and len(genomes[barrier]) >= 1
    for name in ("best_genome.json", "elite_genome.json"):
        assert (barrier / name).read_bytes() == (overlap / name).read_bytes()
    # The final test: the best elite's fresh episodes, outside the budget's frames.
    assert not (barrier / FINAL_TEST).exists()
    test = json.loads((overlap / FINAL_TEST).read_text())
    best = json.loads((overlap / "best_genome.json").read_text())
    assert test["format"] == FINAL_TEST_FORMAT and test["episodes"] == TEST_EPISODES
    assert test["genome_sha256"] == seeds_sha256(best["seeds"])
    scores = test["scores"]
    assert len(scores) == TEST_EPISODES and all(math.isfinite(s) for s in scores)
    assert test["mean"] == pytest.approx(sum(scores) / TEST_EPISODES)
    assert test["frames"] >= TEST_EPISODES  # CartPole: a frame per step
    assert lines[overlap][-1]["frames"] == lines[barrier][-1]["frames"]
