"""A loaded genome as a torch module: its network, its observation normaliser and the greedy
action head neuro-eval plays (neuro.load_policy's return value)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch import nn

from neuro.observation_stats import CLIP
from worker.inference.actions import actions_from_outputs
from worker.inference.policy import Policy


class PolicyModule(nn.Module):
    """`module(observations)`: the network's (batch, outputs) float32 outputs for observations
    as the env gives them (the normaliser applied first where the genome has one);
    `module.act(observations)`: the greedy actions; `module.network`: the bare network, whose
    state_dict is the genome's parameters in their layout."""

    observation_mean: torch.Tensor | None
    observation_std: torch.Tensor | None

    def __init__(
        self,
        network: nn.Module,
        observation_shape: tuple[int, ...],
        action_space: Any,
        observation_norm: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        super().__init__()
        self.network = network
        self.observation_shape = tuple(observation_shape)
        self.action_space = action_space
        """The gymnasium space act() maps the outputs into."""
        mean, std = observation_norm if observation_norm is not None else (None, None)
        self.register_buffer("observation_mean", _tensor(mean))
        self.register_buffer("observation_std", _tensor(std))

    @classmethod
    def of(cls, policy: Policy) -> PolicyModule:
        """A copy of a policy built on the torch engine: its float32 network, normaliser and
        action space; ValueError where its engine holds no torch module."""
        network = getattr(policy.forward, "module", None)
        if not isinstance(network, nn.Module):
            raise ValueError(f"{policy!r} holds no torch module: build it on the torch engine")
        module = cls(copy.deepcopy(network), policy.observation_shape, policy.action_space,
                     policy.observation_norm)  # fmt: skip
        return module.eval()

    def forward(self, observations: torch.Tensor | np.ndarray) -> torch.Tensor:
        """(batch, outputs) float32 outputs of a batch of observations."""
        x = torch.as_tensor(observations)
        if self.observation_mean is not None and self.observation_std is not None:
            # neuro.observation_stats.normalise, in the same float32 operations.
            flat = x.to(torch.float32).reshape(len(x), -1)
            normalised = (flat - self.observation_mean) / self.observation_std
            x = torch.clamp(normalised, -CLIP, CLIP).reshape(x.shape)
        return self.network(x)

    @torch.no_grad()
    def act(self, observations: torch.Tensor | np.ndarray) -> Any:
        """Greedy actions of a batch of observations (argmax, or the tanh-squashed box), as
        neuro-eval plays them; one observation of the env's shape gives one action."""
        x = np.asarray(observations)
        single = x.shape == self.observation_shape
        outputs = self(x[None] if single else x).to(torch.float32).numpy()
        actions = actions_from_outputs(outputs, self.action_space)
        if not single:
            return actions
        return actions[0].item() if actions[0].ndim == 0 else actions[0]


def _tensor(array: np.ndarray | None) -> torch.Tensor | None:
    return None if array is None else torch.from_numpy(np.array(array, dtype=np.float32))
