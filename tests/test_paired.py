"""Two int8 genomes in one forward pass (worker.paired): each gets its own logits, bit for bit."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch

import worker.policies as policies_module
from neuro.noise import NoiseTableSpec
from neuro.v1 import evolution_pb2 as pb
from worker.client import _genomes_at_once
from worker.evaluator import EvaluationSpec, Evaluator
from worker.paired import PairedForward, pairable
from worker.policies import build_policy
from worker.slots import SlotRunner

ATARI_OBS = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
needs_fused = pytest.mark.skipif(
    not policies_module._FUSED_CONV, reason="this torch has no oneDNN fused convolutions"
)


def _loaded(architecture: str, seed: int, dtype: str = "int8"):
    policy = build_policy(architecture, ATARI_OBS, gym.spaces.Discrete(18), inference_dtype=dtype)
    rng = np.random.default_rng(seed)
    theta = rng.standard_normal(policy.num_params) * policy.init_scale() * 20
    policy.load_parameters(theta.astype(np.float32))
    return policy


@needs_fused
@pytest.mark.parametrize("architecture", ["deepga", "nature"])
def test_a_pair_computes_each_genomes_own_logits_bit_for_bit(architecture):
    first, second = _loaded(architecture, 1), _loaded(architecture, 2)
    assert pairable(first) and pairable(second)
    paired = PairedForward()
    rng = np.random.default_rng(3)
    for step in range(3):
        if step == 2:  # a new genome in one of the two: the grouped weights follow
            second.load_parameters(_loaded(architecture, 4).flat_parameters)
        obs = rng.integers(0, 256, (2, *ATARI_OBS.shape), dtype=np.uint8)
        with torch.inference_mode():
            alone = torch.cat([first._forward(torch.from_numpy(obs[:1])),
                               second._forward(torch.from_numpy(obs[1:]))])  # fmt: skip
        together = paired.pair_logits(first, second, obs)
        assert torch.equal(together, alone), step
        assert not torch.equal(together[0], together[1])
        actions = paired.act_rows([first, second], obs)
        assert list(actions) == [first.act_batch(obs[:1])[0], second.act_batch(obs[1:])[0]]
    # Swapped, the pair is re-packed in the new order.
    obs = rng.integers(0, 256, (2, *ATARI_OBS.shape), dtype=np.uint8)
    swapped = paired.pair_logits(second, first, obs)
    with torch.inference_mode():
        assert torch.equal(swapped[0], second._forward(torch.from_numpy(obs[:1]))[0])


def test_other_mixes_run_one_batched_pass_per_genome():
    first, second = _loaded("deepga", 1), _loaded("deepga", 2)
    obs = np.random.default_rng(5).integers(0, 256, (3, *ATARI_OBS.shape), dtype=np.uint8)
    actions = PairedForward().act_rows([first, second, first], obs)
    expected = [first.act_batch(obs[[0, 2]]), second.act_batch(obs[[1]])]
    assert list(actions) == [expected[0][0], expected[1][0], expected[0][1]]


def test_only_int8_atari_policies_pair():
    assert not pairable(_loaded("deepga", 1, "float32"))
    assert not pairable(_loaded("deepga", 1, "bfloat16"))
    mlp = build_policy("mlp", gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2),
                       inference_dtype="int8")  # fmt: skip
    assert not pairable(mlp)
    task = pb.Task()
    assert _genomes_at_once(task) == 1  # float32 (a master from before the field)
    task.policy.inference_dtype = "int8"
    assert _genomes_at_once(task) == 2


@needs_fused
@pytest.mark.slow  # seconds of emulation
def test_two_int8_offspring_play_in_one_pass_and_score_as_alone(tmp_path):
    table = NoiseTableSpec(seed=123, size=2**23)
    base = EvaluationSpec(env_id="Frostbite-v4", seeds=(17, 4), mutation_power=0.002,
                          noise_table=table, architecture="deepga", inference_dtype="int8",
                          episodes=1, max_episode_steps=120, env_seed=1)  # fmt: skip
    specs = {"a": base, "b": dataclasses.replace(base, seeds=(17, 9), env_seed=2)}
    runner = SlotRunner(Evaluator(str(tmp_path), atari_engine="vector"), 2)
    for task_id, spec in specs.items():
        runner.start(task_id, task_id, spec)
    results = {}
    while runner.busy:
        for task_id, _, evaluation in runner.step():
            results[task_id] = evaluation
    timers = runner.timers
    # One forward call per step for both genomes (bar each reset's FIRE step, played alone).
    assert timers.forward_calls < 0.6 * timers.steps
    for task_id, spec in specs.items():
        alone = Evaluator(str(tmp_path), atari_engine="vector").evaluate(spec)
        assert results[task_id] == alone, task_id
