"""A user's network on a worker: the factory's module built for the env's spaces, its
parameters views of the genome's vector, the built-in action heads on its outputs, and every
mistake a factory can make named before a genome is loaded."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from neuro.policy_spec import ModuleUnavailable, user_policy
from tests.support.user_problem import CONV_FACTORY, MLP_FACTORY, USER_PACKAGES
from worker.inference.policy import build_policy
from worker.inference.user_policy import build_module, load_parameters


@pytest.fixture(autouse=True)
def user_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(USER_PACKAGES))


def _theta(policy, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(policy.num_params).astype(np.float32)


def _outputs(module: torch.nn.Module, observations: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return module(torch.tensor(observations, dtype=torch.float32)).numpy()


def test_discrete_actions_are_the_argmax_of_the_module_on_the_genome() -> None:
    env = gym.make("userpkg:MyEnv-v0")
    policy = build_policy("module", env.observation_space, env.action_space,
                          policy=user_policy(MLP_FACTORY, {"hidden": 8}))  # fmt: skip
    assert policy.inference_engine == "torch" and policy.num_params == 4 * 8 + 8 + 8 * 2 + 2
    assert [name for name, _ in policy.parameter_layout] == ["1.weight", "1.bias", "3.weight",
                                                             "3.bias"]  # fmt: skip
    theta = _theta(policy)
    policy.load_parameters(theta)
    # A module of its own, given the same vector, computes what the policy acts on.
    reference = load_parameters(
        build_module(policy.spec.policy, env.observation_space, env.action_space), theta
    )
    observations = np.random.default_rng(1).standard_normal((64, 4)).astype(np.float32)
    expected = _outputs(reference, observations)
    assert np.array_equal(policy.act_batch(observations), expected.argmax(axis=1))
    assert len(set(policy.act_batch(observations).tolist())) == 2  # both actions are taken
    policy.load_parameters(_theta(policy, seed=2))  # a load is a copy the module sees
    assert not np.array_equal(policy.forward(observations), expected)


def test_box_actions_are_squashed_into_the_bounds() -> None:
    env = gym.make("Pendulum-v1")
    policy = build_policy("module", env.observation_space, env.action_space,
                          policy=user_policy(MLP_FACTORY))  # fmt: skip
    policy.load_parameters(_theta(policy) * 3)
    observations = np.random.default_rng(3).standard_normal((32, 3)).astype(np.float32)
    actions = policy.act_batch(observations)
    assert actions.shape == (32, 1) and actions.dtype == np.float32
    assert np.all(actions >= -2.0) and np.all(actions <= 2.0)
    raw = policy.forward(observations)
    np.testing.assert_allclose(actions, -2.0 + (np.tanh(raw) + 1) * 0.5 * 4.0, rtol=1e-6)


def test_an_image_env_feeds_the_module_float_pixels() -> None:
    env = gym.make("userpkg:Sides-v0")
    policy = build_policy("module", env.observation_space, env.action_space,
                          policy=user_policy(CONV_FACTORY, {"channels": 2}))  # fmt: skip
    theta = _theta(policy)
    policy.load_parameters(theta)
    frames = np.stack([env.reset(seed=s)[0] for s in range(8)])
    assert frames.dtype == np.uint8
    reference = load_parameters(
        build_module(policy.spec.policy, env.observation_space, env.action_space), theta
    )
    np.testing.assert_allclose(policy.forward(frames), _outputs(reference, frames), rtol=1e-6)


class Tied(torch.nn.Module):
    """Two layers sharing one weight: one parameter of the genome."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(4, 4, bias=False)
        self.second = torch.nn.Linear(4, 4, bias=False)
        self.second.weight = self.first.weight
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.second(self.first(x).tanh()).tanh())


def tied(observation_space, action_space) -> torch.nn.Module:
    return Tied()


def test_a_tied_weight_is_one_parameter_and_stays_tied(monkeypatch) -> None:
    monkeypatch.setattr("userpkg.nets.tied", tied, raising=False)
    env = gym.make("CartPole-v1")
    policy = build_policy("module", env.observation_space, env.action_space,
                          policy=user_policy("userpkg.nets:tied"))  # fmt: skip
    assert [name for name, _ in policy.parameter_layout] == ["first.weight", "head.weight",
                                                             "head.bias"]  # fmt: skip
    theta = _theta(policy)
    policy.load_parameters(theta)
    module = policy.forward.module
    assert module.second.weight is module.first.weight
    assert np.array_equal(module.second.weight.numpy().ravel(), theta[:16])


@pytest.mark.parametrize(
    ("factory", "options", "env_id", "named"),
    [
        ("userpkg.nets:not_a_module", {}, "CartPole-v1", "returned a object, not a torch"),
        (MLP_FACTORY, {"hidden": -1}, "CartPole-v1", "failed: RuntimeError"),
        (MLP_FACTORY, {"depth": 2}, "CartPole-v1", "failed: TypeError.*depth"),
        (CONV_FACTORY, {}, "CartPole-v1", "failed: ValueError: not enough values to unpack"),
        (
            "userpkg.nets:make_four_inputs",
            {},
            "Acrobot-v1",
            r"fails on one observation of shape \(6,\)",
        ),
        ("userpkg.nets:make_fixed", {"outputs": 5}, "CartPole-v1", r"returns \(1, 5\)"),
        (MLP_FACTORY, {}, "FrozenLake-v1", "needs a Box observation space"),
    ],
)
def test_a_factory_that_does_not_fit_is_named(
    factory: str, options: dict, env_id: str, named: str
) -> None:
    env = gym.make(env_id)
    with pytest.raises(ValueError, match=named):
        build_policy("module", env.observation_space, env.action_space,
                     policy=user_policy(factory, options))  # fmt: skip


def test_a_module_with_the_wrong_outputs_is_named() -> None:
    env = gym.make("CartPole-v1")
    with pytest.raises(ValueError, match=r"returns \(1, 3\) for one observation.*needs \(1, 2\)"):
        build_module(user_policy("userpkg.nets:make_fixed"), env.observation_space,
                     env.action_space)  # fmt: skip
    acrobot = gym.make("Acrobot-v1")  # three actions: the same factory fits
    build_module(user_policy("userpkg.nets:make_fixed"), acrobot.observation_space,
                 acrobot.action_space)  # fmt: skip


def test_a_missing_package_is_named_and_other_dtypes_are_refused() -> None:
    env = gym.make("CartPole-v1")
    with pytest.raises(ModuleUnavailable, match="cannot import module 'not_installed_pkg'"):
        build_policy("module", env.observation_space, env.action_space,
                     policy=user_policy("not_installed_pkg:make"))  # fmt: skip
    with pytest.raises(ValueError, match="'bfloat16' runs on the deepga, nature, mlp nets"):
        build_policy("module", env.observation_space, env.action_space, inference_dtype="bfloat16",
                     policy=user_policy(MLP_FACTORY))  # fmt: skip
    with pytest.raises(ValueError, match="needs one"):
        build_policy("module", env.observation_space, env.action_space)
    with pytest.raises(ValueError, match="needs one"):
        build_policy("mlp", env.observation_space, env.action_space,
                     policy=user_policy(MLP_FACTORY))  # fmt: skip
