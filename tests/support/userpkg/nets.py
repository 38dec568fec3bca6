"""Policy factories, as a user writes them: spaces (and options) in, an nn.Module out."""

from __future__ import annotations

import math

import gymnasium as gym
from torch import nn


def _outputs(action_space: gym.Space) -> int:
    if isinstance(action_space, gym.spaces.Discrete):
        return int(action_space.n)
    return math.prod(action_space.shape)


def make_policy(
    observation_space: gym.Space, action_space: gym.Space, hidden: int = 16
) -> nn.Module:
    """A small tanh MLP over the flattened observation."""
    inputs = math.prod(observation_space.shape)
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(inputs, hidden),
        nn.Tanh(),
        nn.Linear(hidden, _outputs(action_space)),
    )


class Scaled(nn.Module):
    """Pixels 0-255 -> 0-1, the preprocessing a pixel network keeps inside itself."""

    def forward(self, x):
        return x / 255.0


def make_conv_policy(
    observation_space: gym.Space, action_space: gym.Space, channels: int = 4
) -> nn.Module:
    """One 3x3 convolution and a linear head, for (C, H, W) image observations."""
    depth, height, width = observation_space.shape
    return nn.Sequential(
        Scaled(),
        nn.Conv2d(depth, channels, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(channels * height * width, _outputs(action_space)),
    )


def not_a_module(observation_space: gym.Space, action_space: gym.Space) -> object:
    """A factory that forgets to return a module."""
    return object()


def make_fixed(
    observation_space: gym.Space, action_space: gym.Space, outputs: int = 3
) -> nn.Module:
    """A factory that ignores the action space: right for some envs only."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(observation_space.shape), outputs))


def make_four_inputs(observation_space: gym.Space, action_space: gym.Space) -> nn.Module:
    """A factory that ignores the observation space: its forward fails on other shapes."""
    return nn.Linear(4, _outputs(action_space))
