"""load_policy: a genome as a torch module whose actions are the worker's, whatever the genome
was given as (a file, a run dir, a document)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from master.config import inspect_env_id, preset
from master.run.rundir import RunDirectory
from neuro.genome import Genome
from tests.support.tiny import tiny_cartpole
from tests.support.user_problem import MLP_FACTORY, MY_ENV, USER_PACKAGES
from tests.worker.offline.test_export import TRAINED_GENOME, es_genome, seed_genome
from worker.offline.loading import load_genome, load_policy
from worker.offline.policy_module import PolicyModule


def observations(shape: tuple[int, ...], count: int, scale: float = 1.0) -> np.ndarray:
    return np.random.default_rng(0).normal(0.0, scale, (count, *shape)).astype(np.float32)


def test_module_acts_as_the_worker_policy_and_holds_the_genome(tmp_path: Path, noise_cache) -> None:
    genome = seed_genome(tmp_path, tiny_cartpole(noise_table_size=2**16))
    module = load_policy(genome)
    policy = load_genome(genome).policy
    assert isinstance(module, torch.nn.Module) and not module.training
    state = module.network.state_dict()
    assert list(state) == list(policy.weights)
    for name, tensor in state.items():
        assert np.array_equal(tensor.numpy(), policy.weights[name])
    batch = observations((4,), 500)
    actions = module.act(batch)
    assert np.array_equal(actions, policy.act_batch(batch)) and len(set(actions)) == 2
    assert module.act(batch[0]) == policy.act(batch[0])
    assert np.array_equal(module(batch).numpy(), policy.forward(batch))
    # Its own weights: changing the module leaves another load untouched.
    with torch.no_grad():
        next(module.parameters()).add_(1.0)
    assert np.array_equal(load_policy(genome).act(batch), policy.act_batch(batch))


def test_module_normalises_observations_as_the_es_policy(tmp_path: Path, noise_cache) -> None:
    genome = es_genome(tmp_path, "Pendulum-v1")
    module = load_policy(genome)
    policy = load_genome(genome).policy
    assert policy.observation_norm is not None
    batch = observations((3,), 300, scale=4.0)
    assert np.array_equal(module.act(batch), policy.act_batch(batch))
    bare = PolicyModule(module.network, (3,), policy.action_space)  # without the normaliser
    assert not np.allclose(bare.act(batch), policy.act_batch(batch))


def test_atari_module_takes_frames_as_the_env_gives_them(tmp_path: Path) -> None:
    module = load_policy(TRAINED_GENOME)
    policy = load_genome(TRAINED_GENOME).policy
    frames = np.random.default_rng(1).integers(0, 256, (8, 4, 84, 84), dtype=np.uint8)
    assert module.network.state_dict()["conv1.weight"].shape == (32, 4, 8, 8)
    expected, got = policy.forward(frames), module(frames).numpy()
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


def test_a_run_dir_a_document_and_a_result_load_alike(tmp_path: Path, noise_cache) -> None:
    config = tiny_cartpole(noise_table_size=2**16)
    document = config.genome_document(Genome((8, 9)))
    run_dir = RunDirectory(tmp_path / "run")
    run_dir.save_elite(document, 100.0)

    class Result:
        best_genome_path = run_dir.best_genome_path

    batch = observations((4,), 200)
    expected = load_policy(run_dir.best_genome_path).act(batch)
    for source in (run_dir.path, str(run_dir.path), document, Result()):
        assert np.array_equal(load_policy(source).act(batch), expected)


def test_what_cannot_be_loaded_is_named(tmp_path: Path, noise_cache) -> None:
    with pytest.raises(ValueError, match=r"has no best_genome\.json"):
        load_policy(tmp_path)
    with pytest.raises(TypeError, match="not int"):
        load_policy(7)
    es = es_genome(tmp_path, "CartPole-v1")
    with pytest.raises(ValueError, match=r"relative path 'best_params\.npy': pass the genome"):
        load_policy(json.loads(es.read_text()))
    atari = preset(inspect_env_id("Frostbite-v4"), noise_table_size=2**22)
    with pytest.raises(ValueError, match=r"not a neuro\.genome/1 file"):
        load_policy({**atari.genome_document(Genome((1,))), "format": "other"})


def test_a_users_network_loads_as_its_factory_built_it(
    tmp_path: Path, noise_cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(USER_PACKAGES))
    config = preset(inspect_env_id(MY_ENV), architecture=MLP_FACTORY, noise_table_size=2**16,
                    policy_options='{"hidden": 8}')  # fmt: skip
    genome = seed_genome(tmp_path, config, seeds=(4, 5))
    module, policy = load_policy(genome), load_genome(genome).policy
    assert isinstance(module.network, torch.nn.Sequential)  # what userpkg.nets builds
    assert module.network[1].out_features == 8
    assert list(module.network.state_dict()) == list(policy.weights)
    batch = observations((4,), 400)
    assert np.array_equal(module.act(batch), policy.act_batch(batch))
