"""The policy network: a factory that takes the env's spaces (and options) and returns a torch
module. neuro evolves its parameters, in named_parameters() order, as the genome's vector."""

from __future__ import annotations

import math

import gymnasium as gym
import torch
from torch import nn


class Policy(nn.Module):
    """Two tanh layers over the flattened observation, one output per action."""

    def __init__(self, inputs: int, outputs: int, hidden: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(inputs, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh()
        )
        self.head = nn.Linear(hidden, outputs)

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(observations.flatten(1)))


def make_policy(
    observation_space: gym.Space, action_space: gym.Space, hidden: int = 32
) -> nn.Module:
    """The network for these spaces: --policy mypkg.nets:make_policy (--policy-option
    hidden=64 to widen it)."""
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"make_policy plays Discrete actions, not {action_space}")
    return Policy(math.prod(observation_space.shape), int(action_space.n), hidden)
