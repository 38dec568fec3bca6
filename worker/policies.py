"""Policy networks whose parameters all live in one flat float32 buffer.

The genome contract: a flat parameter vector is laid out in module registration order, layer by
layer, weight then bias (see Policy.parameter_layout). Conv weights are (out, in, kh, kw) and
linear weights are (out, in), both row-major, as torch stores them.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from neuro.layout import (
    ARCHITECTURES,
    ATARI_CONVS,
    ATARI_HIDDEN,
    ATARI_SHAPE,
    DEFAULT_MLP_HIDDEN,
    HIDDEN_STD,
    INFERENCE_DTYPES,
    OUTPUT_STD,
    check_parameter_count,
    parameter_count,
    parameter_layout,
)
from neuro.observation_stats import normalise

__all__ = [
    "ARCHITECTURES",
    "ATARI_SHAPE",
    "DEFAULT_MLP_HIDDEN",
    "INFERENCE_DTYPES",
    "Policy",
    "build_policy",
]

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _dtype(layer: nn.Module) -> torch.dtype:
    """The dtype a layer computes in: its weights' (float32 input for a quantised layer)."""
    weight = layer.weight
    return weight.dtype if isinstance(weight, torch.Tensor) else torch.float32


def _same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow SAME padding (before, after); the odd pixel goes after."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


class _AtariNet(nn.Module):
    """Conv 32 8x8/4, conv 64 4x4/2, conv 64 3x3/1, dense 512, dense n_actions, ReLU."""

    def __init__(self, n_actions: int, same_padding: bool) -> None:
        super().__init__()
        channels, size = ATARI_SHAPE[0], ATARI_SHAPE[1]
        self.pads: list[tuple[int, int, int, int]] = []
        convs = []
        for out_channels, kernel, stride in ATARI_CONVS:
            if same_padding:
                before, after = _same_padding(size, kernel, stride)
                size = -(-size // stride)
            else:
                before = after = 0
                size = (size - kernel) // stride + 1
            # F.pad order is (left, right, top, bottom); the grid is square.
            self.pads.append((before, after, before, after))
            convs.append(nn.Conv2d(channels, out_channels, kernel, stride))
            channels = out_channels
        self.conv1, self.conv2, self.conv3 = convs
        self.conv_output_shape = (channels, size, size)
        self.fc = nn.Linear(channels * size * size, ATARI_HIDDEN)
        self.out = nn.Linear(ATARI_HIDDEN, n_actions)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Each layer runs in its weights' dtype; for float32 every .to() is a no-op.
        x = x.to(torch.float32) / 255.0
        for conv, pad in zip((self.conv1, self.conv2, self.conv3), self.pads, strict=True):
            if any(pad):
                x = F.pad(x, pad)
            x = F.relu(conv(x.to(_dtype(conv))))
        x = F.relu(self.fc(x.flatten(1).to(_dtype(self.fc))))
        return self.out(x.to(_dtype(self.out)))


class _MLP(nn.Module):
    """Fully connected network with tanh hidden activations."""

    def __init__(self, in_features: int, hidden_sizes: Sequence[int], out_features: int) -> None:
        super().__init__()
        sizes = [in_features, *hidden_sizes]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(sizes))
        self.out = nn.Linear(sizes[-1], out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.float32).flatten(1)
        for layer in self.hidden:
            x = torch.tanh(layer(x.to(_dtype(layer))))
        return self.out(x.to(_dtype(self.out)))


def _fan_in(weight: torch.Tensor) -> int:
    return math.prod(weight.shape[1:])


class Policy:
    """A network plus its action head, with parameters in one contiguous float32 buffer.

    `inference_dtype` "bfloat16" runs the forward pass on a bfloat16 copy of every layer but the
    output layer, refreshed by load_parameters; the float32 buffer (what genomes decode to)
    is unchanged. The output layer stays float32: it is ~0.2% of the weights, and bfloat16
    logits (8 mantissa bits) would tie often and argmax breaks ties by index.
    """

    def __init__(
        self,
        module: nn.Module,
        observation_shape: tuple[int, ...],
        action_space: Any,
        inference_dtype: str = "float32",
    ):
        if inference_dtype not in INFERENCE_DTYPES:
            raise ValueError(
                f"inference dtype {inference_dtype!r} is not one of {', '.join(INFERENCE_DTYPES)}"
            )
        self.inference_dtype = inference_dtype
        self.observation_norm: tuple[np.ndarray, np.ndarray] | None = None
        """(mean, std): observations are fed as clip((x - mean) / std, +-5) (ES runs)."""
        self.module = module.eval()
        self.observation_shape = observation_shape
        self.action_space = action_space
        named = list(module.named_parameters())
        self.parameter_layout: list[tuple[str, tuple[int, ...]]] = [
            (name, tuple(p.shape)) for name, p in named
        ]
        self.num_params: int = sum(p.numel() for _, p in named)
        self._output_layer = named[-1][0].rsplit(".", 1)[0]
        # Every nn.Parameter becomes a view into this array, so loading is a single np.copyto.
        self._flat = np.zeros(self.num_params, dtype=np.float32)
        buffer = torch.from_numpy(self._flat)
        offset = 0
        for name, p in named:
            owner, attr = self._owner(name)
            view = buffer[offset : offset + p.numel()].view(p.shape)
            setattr(owner, attr, nn.Parameter(view, requires_grad=False))
            offset += p.numel()
        if isinstance(action_space, gym.spaces.Box):
            self._low = action_space.low.astype(np.float32)
            self._high = action_space.high.astype(np.float32)
        # The module the forward pass runs, and (float32 view, reduced copy) pairs to refresh.
        self._inference_module: nn.Module = self.module
        self._reduced: list[tuple[torch.Tensor, torch.Tensor]] = []
        if inference_dtype != "float32":
            self._inference_module = copy.deepcopy(self.module)
            for layer_name, layer in self._inference_module.named_children():
                if layer_name != self._output_layer:
                    layer.to(_TORCH_DTYPES[inference_dtype])
            # The float32 output layer is shared, so its parameters stay views of the buffer.
            output_layer = self.module.get_submodule(self._output_layer)
            setattr(self._inference_module, self._output_layer, output_layer)
            reduced = dict(self._inference_module.named_parameters())
            self._reduced = [
                (p, reduced[name])
                for name, p in self.module.named_parameters()
                if reduced[name].dtype != torch.float32
            ]

    def _owner(self, name: str) -> tuple[nn.Module, str]:
        path, _, attr = name.rpartition(".")
        return self.module.get_submodule(path), attr

    @property
    def flat_parameters(self) -> np.ndarray:
        """Read-only view of the parameter buffer."""
        view = self._flat.view()
        view.flags.writeable = False
        return view

    def init_scale(self) -> np.ndarray:
        """Per-parameter init scale: std / sqrt(fan_in) for weights, 0 for biases."""
        scale = np.zeros(self.num_params, dtype=np.float32)
        offset = 0
        for name, p in self.module.named_parameters():
            n = p.numel()
            if name.endswith(".weight"):
                layer = name.rsplit(".", 1)[0]
                std = OUTPUT_STD if layer == self._output_layer else HIDDEN_STD
                scale[offset : offset + n] = np.float32(std / math.sqrt(_fan_in(p)))
            offset += n
        return scale

    def load_parameters(self, flat: np.ndarray) -> None:
        """Copy a float32 vector of length num_params into the network."""
        if not isinstance(flat, np.ndarray) or flat.dtype != np.float32:
            raise ValueError(
                f"parameters must be a float32 ndarray, got {getattr(flat, 'dtype', type(flat))}"
            )
        if flat.shape != (self.num_params,):
            raise ValueError(f"parameters have shape {flat.shape}, expected ({self.num_params},)")
        np.copyto(self._flat, flat)
        with torch.no_grad():
            for source, target in self._reduced:
                target.copy_(source)  # rounds to nearest even

    def act(self, observation: np.ndarray) -> int | np.ndarray:
        """Action for one observation: int for Discrete, array for Box."""
        action = self.act_batch(np.asarray(observation)[None])[0]
        if isinstance(self.action_space, gym.spaces.Discrete):
            return int(action)
        return action

    def act_batch(self, observations: np.ndarray) -> np.ndarray:
        """Actions for a batch of observations (leading axis is the batch)."""
        obs = np.asarray(observations)
        if obs.shape[1:] != self.observation_shape:
            raise ValueError(
                f"observation batch shape {obs.shape} does not match {self.observation_shape}"
            )
        if self.observation_norm is not None:
            mean, std = self.observation_norm
            obs = normalise(obs, mean, std).reshape(obs.shape)
        if not (obs.flags.writeable and obs.flags.c_contiguous):
            # torch.from_numpy warns on read-only arrays (e.g. replay of a memmap).
            obs = np.array(obs, order="C")
        with torch.inference_mode():
            out = self._inference_module(torch.from_numpy(obs)).float().numpy()
        space = self.action_space
        if isinstance(space, gym.spaces.Discrete):
            # np.argmax picks the lowest index on ties.
            return np.argmax(out, axis=1).astype(np.int64) + int(space.start)
        squashed = (np.tanh(out) + 1.0) * 0.5
        actions = self._low.ravel() + squashed * (self._high - self._low).ravel()
        return actions.reshape(len(obs), *space.shape).astype(space.dtype)


def _box_dim(space: gym.spaces.Box) -> int:
    return math.prod(space.shape)


def build_policy(
    architecture: str,
    observation_space: Any,
    action_space: Any,
    hidden_sizes: Sequence[int] = (),
    inference_dtype: str = "float32",
) -> Policy:
    """Build the named network for these spaces with zeroed parameters."""
    if architecture not in ARCHITECTURES:
        raise ValueError(
            f"unknown architecture {architecture!r}; valid: {', '.join(ARCHITECTURES)}"
        )
    obs_shape = tuple(getattr(observation_space, "shape", None) or ())
    if isinstance(action_space, gym.spaces.Discrete):
        n_out = int(action_space.n)
    elif isinstance(action_space, gym.spaces.Box) and architecture == "mlp":
        if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
            raise ValueError(f"Box action space needs finite bounds, got {action_space}")
        n_out = _box_dim(action_space)
    else:
        raise ValueError(f"unsupported action space {action_space} for {architecture!r}")

    if architecture == "mlp":
        if not isinstance(observation_space, gym.spaces.Box):
            raise ValueError(f"mlp needs a Box observation space, got {observation_space}")
        hidden = tuple(hidden_sizes) or DEFAULT_MLP_HIDDEN
        if any(int(h) < 1 for h in hidden):
            raise ValueError(f"hidden sizes must be >= 1, got {hidden}")
        # Counted before anything is allocated: sizes from a master must not take 64 GiB.
        check_parameter_count(parameter_count(parameter_layout("mlp", obs_shape, n_out, hidden)))
        # The meta device skips allocation and default init; Policy installs real parameters.
        with torch.device("meta"):
            module: nn.Module = _MLP(_box_dim(observation_space), [int(h) for h in hidden], n_out)
    else:
        if obs_shape != ATARI_SHAPE:
            raise ValueError(
                f"{architecture!r} needs observation shape {ATARI_SHAPE}, got {obs_shape}"
            )
        if hidden_sizes:
            raise ValueError(
                f"{architecture!r} has fixed layers; hidden_sizes {hidden_sizes} given"
            )
        check_parameter_count(parameter_count(parameter_layout(architecture, obs_shape, n_out)))
        with torch.device("meta"):
            module = _AtariNet(n_out, same_padding=architecture == "deepga")
    return Policy(module, obs_shape, action_space, inference_dtype)
