"""The policy networks as torch modules: the paper's Atari nets and the MLP.

A module's parameters in registration order are the genome's layout (neuro/layout.py); the
engine makes each one a view of the policy's flat float32 vector.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from neuro.layout import ATARI_CONVS, ATARI_HIDDEN, ATARI_SHAPE, atari_conv_pads, parameter_layout
from worker.inference.engines.torch_cpu.layers import layer_dtype


class MLP(nn.Module):
    """Fully connected network with tanh hidden activations."""

    def __init__(self, in_features: int, hidden_sizes: Sequence[int], out_features: int) -> None:
        super().__init__()
        sizes = [in_features, *hidden_sizes]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(sizes))
        self.out = nn.Linear(sizes[-1], out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.float32).flatten(1)
        for layer in self.hidden:
            x = torch.tanh(layer(x.to(layer_dtype(layer))))
        return self.out(x.to(layer_dtype(self.out)))


class AtariNet(nn.Module):
    """Conv 32 8x8/4, conv 64 4x4/2, conv 64 3x3/1, dense 512, dense n_actions, ReLU."""

    def __init__(self, n_actions: int, architecture: str) -> None:
        super().__init__()
        channels = ATARI_SHAPE[0]
        # F.pad order is (left, right, top, bottom); the grid is square.
        self.pads = atari_conv_pads(architecture)
        """Each conv layer's SAME (deepga) or no (nature) padding."""
        # The symmetric part of each padding is the conv's own (one op less per layer);
        # only deepga's conv2 (1 before, 2 after) keeps an explicit F.pad of the odd pixel.
        self._extra_pads: list[tuple[int, int, int, int] | None] = []
        convs = []
        size = ATARI_SHAPE[1]
        self.conv_input_sizes: list[tuple[int, int, int]] = []
        """(channels, height, width) each conv layer sees, its odd padding pixel included."""
        for (out_channels, kernel, stride), (before, after, _, _) in zip(
            ATARI_CONVS, self.pads, strict=True
        ):
            convs.append(nn.Conv2d(channels, out_channels, kernel, stride, padding=before))
            extra = after - before
            self._extra_pads.append((0, extra, 0, extra) if extra else None)
            self.conv_input_sizes.append((channels, size + extra, size + extra))
            size = (size + before + after - kernel) // stride + 1
            channels = out_channels
        self.conv1, self.conv2, self.conv3 = convs
        fc_inputs = parameter_layout(architecture, ATARI_SHAPE, n_actions)[-4][1][1]
        size = math.isqrt(fc_inputs // channels)
        self.conv_output_shape = (channels, size, size)
        self.fc = nn.Linear(fc_inputs, ATARI_HIDDEN)
        self.out = nn.Linear(ATARI_HIDDEN, n_actions)
        self.raw_input = False
        """True in Policy's inference copy: conv1's weights there carry the input's 1/255, so
        the observation goes in as it is, converted by a single copy."""
        self.fc_input_nhwc = False
        """True where the dense layer's columns are in (height, width, channel) order (its
        int8 and bfloat16 copies): the channels-last conv output then flattens as a view."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Each layer runs in its weights' dtype (the convolutions share one); a cast happens
        # only where the dtype changes. Channels-last: oneDNN's batch-1 convolutions of this
        # net took 0.30 instead of 0.35 ms in float32 and 0.21 instead of 0.26 ms in bfloat16
        # (one core of the CI-size machine), with channels-last weights (see Policy).
        conv_dtype = layer_dtype(self.conv1)
        if self.raw_input:
            # Every op of a step runs with caches cold (the emulator and the dense layer's
            # weights evict them), so each op saved counts: see Policy.
            x = torch.empty(x.shape, dtype=conv_dtype, memory_format=torch.channels_last).copy_(x)
        else:
            x = (x.to(torch.float32) / 255.0).contiguous(memory_format=torch.channels_last)
            if conv_dtype != x.dtype:
                x = x.to(conv_dtype)
        for conv, extra in zip((self.conv1, self.conv2, self.conv3), self._extra_pads, strict=True):
            if extra is not None:
                x = F.pad(x, extra)
            x = conv(x) if getattr(conv, "fused_relu", False) else F.relu(conv(x), inplace=True)
        x = x.permute(0, 2, 3, 1).flatten(1) if self.fc_input_nhwc else x.flatten(1)
        for layer in (self.fc, self.out):
            dtype = layer_dtype(layer)
            if dtype != x.dtype:
                x = x.to(dtype)
            x = layer(x)
            if layer is self.fc and not getattr(layer, "fused_relu", False):
                x = F.relu(x, inplace=True)
        return x
