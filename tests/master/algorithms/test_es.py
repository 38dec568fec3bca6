"""The ES core: centered ranks, a gradient that points downhill, shared noise, state round trip."""

from __future__ import annotations

import hashlib
import math
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

from master.algorithms.es import (
    ESConfig,
    ESState,
    EvolutionStrategy,
    centered_ranks,
    gradient_estimate,
    perturbation_noise,
)
from neuro.layout import init_scale, parameter_layout
from neuro.noise import NoiseTableSpec, generate_into

TABLE_SPEC = NoiseTableSpec(seed=7, size=2**16)


@pytest.fixture(scope="module")
def table() -> np.ndarray:
    out = np.empty(TABLE_SPEC.size, np.float32)
    generate_into(TABLE_SPEC, out)
    return out


@pytest.mark.parametrize(
    "values",
    [
        [3.0, 1.0, 2.0],
        [5.0, 5.0, 5.0, 5.0],
        [1.0, 2.0, 2.0, 9.0, -4.0],
        [0.0, 0.0],
        [7.0] * 3 + [1.0],
    ],
)
def test_centered_ranks_lie_in_half_range_sum_to_zero_and_share_ties(values) -> None:
    ranks = centered_ranks(values)
    assert ranks.min() >= -0.5 and ranks.max() <= 0.5
    assert abs(ranks.sum()) < 1e-12
    for i, a in enumerate(values):
        for j, b in enumerate(values):
            if a == b:
                assert ranks[i] == ranks[j]
            elif a < b:
                assert ranks[i] < ranks[j]


def test_centered_ranks_of_distinct_values_span_the_range() -> None:
    assert centered_ranks([10.0, -3.0, 4.0]).tolist() == [0.5, -0.5, 0.0]
    assert centered_ranks([1.0]).tolist() == [0.0]


def test_gradient_estimate_on_a_quadratic_points_downhill(table: np.ndarray) -> None:
    n, sigma = 50, 0.05
    rng = np.random.default_rng(0)
    theta, target = rng.normal(size=n), rng.normal(size=n)
    indices = rng.integers(2**32, size=200).tolist()
    weights = []
    for index in indices:
        eps = perturbation_noise(table, index, n).astype(np.float64)
        # Fitness is -||x - target||^2; ascending it goes downhill on the quadratic.
        plus = -np.sum((theta + sigma * eps - target) ** 2)
        minus = -np.sum((theta - sigma * eps - target) ** 2)
        weights.append(plus - minus)
    grad = gradient_estimate(table, indices, weights, n, sigma)
    downhill = -2 * (theta - target)  # minus the gradient of the loss ||theta - target||^2
    cosine = grad @ downhill / (np.linalg.norm(grad) * np.linalg.norm(downhill))
    assert cosine > 0.5


def test_es_climbs_a_quadratic_with_ranked_returns(table: np.ndarray) -> None:
    n, target = 20, np.linspace(-1, 1, 20)
    es = EvolutionStrategy(
        ESConfig(pairs=20, sigma=0.05, learning_rate=0.05, weight_decay=0.0, eval_episodes=1),
        table, np.zeros(n, np.float32),
    )  # fmt: skip

    def fitness(x: np.ndarray) -> float:
        return float(-np.sum((x - target) ** 2))

    start = fitness(es.state.theta)
    for _ in range(60):
        returns = {}
        for request in es.ask():
            p = request.genome
            x = es.state.theta + p.sign * np.float32(0.05) * es.noise(p.noise_index)
            returns[request.key] = [fitness(x)] * request.episodes
        summary = es.tell(returns)
        assert summary.theta_rank is not None and 0 <= summary.theta_rank <= 40
    assert fitness(es.state.theta) > 0.2 * start  # the loss fell by more than 80%


def test_master_and_worker_noise_agree_bit_for_bit(table: np.ndarray) -> None:
    from worker.evaluation.parameters import perturbed_parameters

    n = 4610
    theta = np.arange(n, dtype=np.float32) / n
    es = EvolutionStrategy(ESConfig(pairs=2, sigma=0.1), table, theta)
    for index in (0, 1, 12345, 2**32 - 1):
        master_eps = es.noise(index)
        for sign in (1, -1):
            worker = perturbed_parameters(theta, table, index, sign, 0.1)
            expected = theta + np.float32(sign) * (np.float32(0.1) * master_eps)
            assert worker.tobytes() == expected.tobytes()
        assert perturbed_parameters(theta, table, index, 0, 0.1).tobytes() == theta.tobytes()


def test_state_round_trips_through_dict_and_arrays(table: np.ndarray) -> None:
    config = ESConfig(pairs=3, sigma=0.1, eval_episodes=2, seed=4)
    es = EvolutionStrategy(config, table, np.ones(30, np.float32))
    returns = {r.key: [float(i)] * r.episodes for i, r in enumerate(es.ask())}
    es.tell(returns)
    state = ESState.from_dict(es.state.to_dict(), es.state.arrays())
    again = EvolutionStrategy(config, table, state=state)
    assert [r.key for r in again.ask()] == [r.key for r in es.ask()]
    assert [r.genome for r in again.ask()] == [r.genome for r in es.ask()]
    returns = {r.key: [float(i % 4)] * r.episodes for i, r in enumerate(es.ask())}
    a, b = es.tell(returns), again.tell(returns)
    assert np.array_equal(es.state.theta, again.state.theta) and a.theta_rank == b.theta_rank
    assert math.isclose(a.elite_score, b.elite_score)


def test_failed_halves_drop_their_pair_and_rank_is_counted(table: np.ndarray) -> None:
    es = EvolutionStrategy(ESConfig(pairs=2, eval_episodes=1), table, np.zeros(10, np.float32))
    keys = [r.key for r in es.ask()]
    summary = es.tell(dict(zip(keys, [[1.0], [math.nan], [3.0], [2.0], [2.5]], strict=True)))
    assert summary.failed == 1 and summary.theta_rank == 1 and summary.elite_score == 2.5


def test_layout_matches_the_torch_policies() -> None:
    from worker.inference.policy import build_policy

    cases = [("mlp", gym.spaces.Box(-1, 1, (4,)), 2, (64, 64)),
             ("deepga", gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), 6, ()),
             ("nature", gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), 18, ())]  # fmt: skip
    for architecture, observations, actions, hidden in cases:
        policy = build_policy(architecture, observations, gym.spaces.Discrete(actions), hidden)
        layout = parameter_layout(architecture, observations.shape, actions, hidden)
        assert layout == policy.parameter_layout
        assert np.array_equal(init_scale(layout), policy.init_scale())


def test_the_es_master_modules_do_not_import_torch() -> None:
    code = ("import sys, master.algorithms.es, master.run.start, master.cli, neuro.layout, "
            "neuro.noise; sys.exit('torch' in sys.modules)")  # fmt: skip
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


class _ChunkStub:
    """Answers FetchParameters with the given chunks, as the master's stream would."""

    def __init__(self, chunks: list) -> None:
        self.chunks = chunks

    def FetchParameters(self, request, timeout=None):  # the gRPC method's name
        return iter(self.chunks)


def _chunks(theta: np.ndarray, version: int, size: int) -> list:
    from neuro.v1 import evolution_pb2 as pb

    data = theta.astype("<f4").tobytes()
    digest = hashlib.sha256(data).hexdigest()
    return [
        pb.ParametersChunk(
            version=version,
            offset=start,
            data=data[start : start + size],
            total_bytes=len(data),
            sha256=digest,
        )
        for start in range(0, len(data), size)
    ]


def test_fetched_parameters_are_reassembled_and_checked() -> None:
    from worker.client.link import fetch_parameters

    theta = np.arange(1000, dtype=np.float32) / 7
    chunks = _chunks(theta, 3, 512)
    digest = chunks[0].sha256
    fetched = fetch_parameters(_ChunkStub(chunks), "w", 3, digest)
    assert np.array_equal(fetched, theta)
    damaged = [type(chunk)() for chunk in chunks]
    for copy, chunk in zip(damaged, chunks, strict=True):
        copy.CopyFrom(chunk)
    damaged[1].data = b"\0" * len(chunks[1].data)  # a bit flipped on the way
    with pytest.raises(ValueError, match="version 3 arrived incomplete or altered"):
        fetch_parameters(_ChunkStub(damaged), "w", 3, digest)
    with pytest.raises(ValueError, match="version 3 arrived incomplete or altered"):
        fetch_parameters(_ChunkStub(chunks[:-1]), "w", 3, digest)
    with pytest.raises(ValueError, match="out of order"):
        fetch_parameters(_ChunkStub([chunks[1], chunks[0]]), "w", 3, digest)
