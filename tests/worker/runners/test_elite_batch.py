"""The elite phase as one batch per genome: a worker holding several episodes of one genome
(an elite candidate's re-evaluation) computes their actions in one forward pass over the
genome's weights. Where the arithmetic is row-independent (int8-static: integer sums) every
episode scores exactly as played alone; in float32 a batch's sums may be ordered differently,
and the actions agree on >= 99.9% of steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from neuro.inference import FLOAT32, INT8_STATIC
from neuro.noise import NoiseTableSpec
from tests.support.runners import run_all
from worker.evaluation.evaluator import Evaluator
from worker.evaluation.spec import EvaluationSpec
from worker.inference.policy import Policy
from worker.play.envs import VECTOR
from worker.runners.per_genome import PerGenomeRunner

TABLE = NoiseTableSpec(seed=123, size=2**23)
EPISODES = 4


def _spec(env_seed: int, dtype: str) -> EvaluationSpec:
    # One elite genome, one task per episode, as the master splits a candidate's episodes.
    return EvaluationSpec(env_id="Frostbite-v4", seeds=(17, 4, 99), mutation_power=0.002,
                          noise_table=TABLE, architecture="deepga", max_episode_steps=100,
                          env_seed=env_seed, inference_dtype=dtype)  # fmt: skip


@pytest.mark.slow  # seconds of emulation
@pytest.mark.parametrize("dtype", [INT8_STATIC, FLOAT32])
def test_an_elites_episodes_in_one_batch_play_as_they_play_alone(
    dtype: str, noise_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    specs = {f"e{i}": _spec(300 + i, dtype) for i in range(EPISODES)}
    evaluator = Evaluator(str(noise_cache), atari_backend=VECTOR)
    alone = run_all(PerGenomeRunner(evaluator, 1), specs)

    # Every batched call's rows, to recompute each row alone under the same loaded policy.
    calls: list[tuple[Policy, np.ndarray, np.ndarray]] = []
    act_batch = Policy.act_batch

    def recording(policy: Policy, observations: np.ndarray) -> np.ndarray:
        actions = act_batch(policy, observations)
        if len(observations) > 1:
            row_alone = np.concatenate([act_batch(policy, row[None]) for row in observations])
            calls.append((policy, actions, row_alone))
        return actions

    monkeypatch.setattr(Policy, "act_batch", recording)
    runner = PerGenomeRunner(evaluator, EPISODES)
    batched = run_all(runner, specs)
    monkeypatch.undo()

    rows = sum(len(actions) for _, actions, _ in calls)
    assert rows > 0.8 * runner.timers.steps  # nearly every step ran in a batch of the genome
    assert runner.timers.forward_calls < runner.timers.steps / 2
    agreeing = sum(int(np.sum(actions == solo)) for _, actions, solo in calls)
    if dtype == INT8_STATIC:
        assert agreeing == rows
        assert batched == alone  # every episode's score and frames
    else:
        assert agreeing >= 0.999 * rows
