"""The batched runner's pipeline on Atari: its two halves take turns (one steps in the
emulator's threads while the other's actions are computed), and every task still scores
exactly as the per-genome worker scores it."""

from __future__ import annotations

from pathlib import Path

import pytest

from neuro.noise import NoiseTableSpec
from tests.support.runners import run_all
from worker.cli import worker_parser, worker_settings
from worker.cli.work import _batched_runner
from worker.evaluation.evaluator import Evaluator
from worker.evaluation.spec import EvaluationSpec
from worker.play.envs import VECTOR
from worker.runners.batched import BatchedRunner
from worker.runners.per_genome import PerGenomeRunner

TABLE = NoiseTableSpec(seed=123, size=2**23)


def _spec(seeds: tuple[int, ...], env_seed: int, episodes: int, steps: int) -> EvaluationSpec:
    return EvaluationSpec(env_id="Frostbite-v4", seeds=seeds, mutation_power=0.002,
                          noise_table=TABLE, architecture="deepga", episodes=episodes,
                          max_episode_steps=steps, env_seed=env_seed)  # fmt: skip


@pytest.mark.slow  # seconds: the batched CPU forward pass is slow
def test_pipelined_batched_runner_scores_every_atari_task_as_the_per_genome_runner(
    noise_cache: Path,
) -> None:
    # Different genomes, seeds, episode counts and caps: tasks end at different steps, so
    # new tasks join each half while the other half's step is in flight.
    specs = {
        f"t{i}": _spec(tuple(range(i, i + 1 + i % 3)), 500 + i, 1 + i % 2, 25 + 15 * (i % 3))
        for i in range(8)
    }
    evaluator = Evaluator(str(noise_cache), atari_backend=VECTOR)
    reference = run_all(PerGenomeRunner(evaluator, 1), specs)
    runner = BatchedRunner(evaluator, 4, "cpu")
    assert runner.pipelined
    pipelined = run_all(runner, specs)
    assert pipelined == reference
    halves = runner._envs._groups["frostbite"]
    assert [half.size for half in halves] == [2, 2] and all(h.pipelined for h in halves)
    assert len({tuple(returns) for returns, _ in reference.values()}) > 1  # genomes differ
    assert not BatchedRunner(evaluator, 4, "cpu", pipelined=False).pipelined


@pytest.mark.parametrize(("argv", "pipelined"), [([], True), (["--no-pipeline"], False)])
def test_the_worker_pipelines_its_batched_slots_unless_told_not_to(
    argv: list[str], pipelined: bool, noise_cache: Path
) -> None:
    parser = worker_parser()
    settings = worker_settings(parser, parser.parse_args(["--device", "cpu", "--envs", "4", *argv]))
    assert settings.pipeline is pipelined
    runner = _batched_runner(settings)(Evaluator(str(noise_cache), atari_backend=VECTOR), 4, None)
    assert runner.pipelined is pipelined
