"""All decoders of a worker share one byte budget; the number of decoders kept is bounded."""

from __future__ import annotations

import dataclasses
import itertools

import gymnasium as gym
import numpy as np
import pytest

from neuro.decode import GenomeDecoder, decode_genome
from neuro.noise import NoiseTableSpec, load_noise_table
from worker.evaluation.decoders import MAX_DECODERS
from worker.evaluation.evaluator import Evaluator
from worker.evaluation.spec import EvaluationSpec
from worker.inference.policy import Policy, build_policy

OBS, ACTIONS = gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2)
TABLE = NoiseTableSpec(seed=123, size=2**16)
SPEC = EvaluationSpec(
    env_id="CartPole-v1", seeds=(1,), mutation_power=0.01, noise_table=TABLE, architecture="mlp"
)


def _held_bytes(decoders: list[GenomeDecoder]) -> int:
    return sum(len(d) * d.num_params * 4 for d in decoders)


@pytest.fixture(scope="module")
def policies() -> dict[tuple[int, ...], Policy]:
    return {hidden: build_policy("mlp", OBS, ACTIONS, hidden) for hidden in [(8,), (16,), (32, 8)]}


def test_many_sigmas_and_shapes_never_hold_more_than_the_budget_in_total(tmp_path, policies):
    largest = max(p.num_params for p in policies.values()) * 4
    budget = 6 * largest
    evaluator = Evaluator(noise_cache_dir=str(tmp_path), decode_cache_bytes=budget)
    created: list[GenomeDecoder] = []
    sigmas = [0.001 * (i + 1) for i in range(12)]
    for sigma, (hidden, policy) in itertools.product(sigmas, policies.items()):
        spec = dataclasses.replace(SPEC, mutation_power=sigma, hidden_sizes=hidden)
        decoder = evaluator.decoders.decoder(spec, policy.spec)
        if decoder not in created:
            created.append(decoder)
        for parent, child in itertools.product(range(3), range(3)):
            theta = decoder.decode([parent, 100 + child])
            expected = decode_genome(
                decoder.table, policy.init_scale(), sigma, [parent, 100 + child]
            )
            assert theta.tobytes() == expected.tobytes()
            assert _held_bytes(created) <= budget
    assert len(created) == len(sigmas) * len(policies)
    assert len(evaluator.decoders) <= MAX_DECODERS


def test_decoders_sharing_a_budget_take_room_from_the_least_recently_used_one_first(tmp_path):
    from neuro.decode import CacheBudget

    table = load_noise_table(NoiseTableSpec(seed=123, size=2**16), tmp_path)
    scale = np.full(1000, np.float32(0.1))
    budget = CacheBudget(4 * scale.nbytes)
    old, new = (GenomeDecoder(table, scale, s, budget=budget) for s in (0.01, 0.02))
    for seed in [*range(4), *range(4)]:  # the hits leave [0] least and [3] most recently used
        old.decode([seed])
    assert len(old) == 4
    new.decode([7])
    new.decode([8])
    assert len(old) == 2 and len(new) == 2
    assert [0] not in old and [1] not in old  # the old decoder's least recently used went
    assert budget.used_bytes == 4 * scale.nbytes <= budget.limit_bytes
    # With only its own entries left, a decoder evicts its own least recently used.
    for seed in range(20, 26):
        new.decode([seed])
    assert len(old) == 0 and len(new) == 4 and budget.used_bytes <= budget.limit_bytes
