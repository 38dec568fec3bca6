"""Two genomes' episodes in one forward pass on a CPU worker: their convolutions grouped.

A batch-1 forward pass of the Atari net runs with the caches cold (the emulator and the dense
layer's weight stream evict them), where each oneDNN convolution costs a fixed ~30 us besides
its arithmetic. Two episodes of different genomes (offspring, most of a run) share that cost
when their three convolutions run as one grouped convolution each (groups=2, the two
genomes' kernels stacked); each genome's dense layers then read its own weights as before.
Measured on the CI-size machine, stepping Frostbite in int8 on both cores: 1.17 -> 1.04 ms
per agent step and genome (docs/performance.md).

The grouped convolution computes each group as the single one does: the pair's logits are
each genome's own, bit for bit (tests/test_paired.py), so pairing never changes an episode.
Only int8 policies pair (worker.client leases two offspring at once for them): their dense
weights (4 MB) leave room in the cache for two; float32's 16 MB do not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from worker.policies import Policy, actions_from_outputs

__all__ = ["PAIRED_DTYPES", "PairedForward", "pairable"]

PAIRED_DTYPES = ("int8",)
"""Inference dtypes whose offspring a worker plays two at a time."""


def pairable(policy: Policy) -> bool:
    """Whether the policy's pass can be grouped with another's: a bound Atari pass whose
    dense layer takes channels-last features, in a paired dtype, with no normaliser."""
    bound = policy.bound
    net = policy._inference_module
    return (
        bound is not None
        and policy.inference_dtype in PAIRED_DTYPES
        and policy.observation_norm is None
        and bool(getattr(net, "fc_input_nhwc", False))
    )


class PairedForward:
    """The rollout's batch group (worker.rollout.Actor) of a runner's pairable policies.

    act_rows gets every ready row of every such policy: exactly two rows of two different
    genomes run as one grouped pass; anything else runs as before, one batched pass per
    genome (an elite's re-evaluation episodes share theirs).
    """

    def __init__(self) -> None:
        self._pair: tuple[Any, Any] | None = None
        """The two bound passes the packed weights below were made from."""
        self._layers: list[tuple[Any, ...]] = []
        self._extra_pads: list[tuple[int, int, int, int] | None] = []
        self._dtype = torch.bfloat16

    def act_rows(self, actors: Sequence[Policy], observations: np.ndarray) -> np.ndarray:
        if len(actors) == 2 and actors[0] is not actors[1]:
            return self._act_pair(actors[0], actors[1], observations)
        return _act_each(actors, observations)

    def _act_pair(self, first: Policy, second: Policy, observations: np.ndarray) -> np.ndarray:
        out = self.pair_logits(first, second, observations).numpy()
        return actions_from_outputs(out, first.action_space)

    def pair_logits(self, first: Policy, second: Policy, observations: np.ndarray) -> torch.Tensor:
        """(2, n_actions) float32 logits: row 0 first's of observations[0], row 1 second's."""
        passes = (first.bound, second.bound)
        if self._pair is None or any(a is not b for a, b in zip(passes, self._pair, strict=True)):
            self._pack(first, second)
            self._pair = passes
        observations = np.ascontiguousarray(observations)
        stacked = torch.from_numpy(observations).view(1, -1, *observations.shape[2:])
        conv = torch.ops.mkldnn._convolution_pointwise.default
        with torch.inference_mode():
            x = torch.empty(stacked.shape, dtype=self._dtype, memory_format=torch.channels_last)
            x.copy_(stacked)
            for extra, arguments in zip(self._extra_pads, self._layers, strict=True):
                x = conv(x if extra is None else F.pad(x, extra), *arguments)
            # (1, 2C, H, W) channels-last is (H, W, 2, C) in memory: each genome's features
            # in (H, W, C) order, the dense layers' column order.
            _, channels, height, width = x.shape
            features = x.permute(0, 2, 3, 1).reshape(height, width, 2, channels // 2)
            features = features.permute(2, 0, 1, 3).reshape(2, -1)
            dense_dtype = torch.float32 if first.inference_dtype == "int8" else self._dtype
            features = features.to(dense_dtype)
            logits = [
                policy.bound.dense(features[row : row + 1])  # type: ignore[union-attr]
                for row, policy in enumerate((first, second))
            ]
            return torch.cat(logits)

    def _pack(self, first: Policy, second: Policy) -> None:
        """Stacks the two genomes' (already scaled, rounded) conv weights into grouped ones."""
        nets = (first._inference_module, second._inference_module)
        layers = []
        with torch.inference_mode():
            for name in ("conv1", "conv2", "conv3"):
                one, two = (getattr(net, name) for net in nets)
                weight = torch.cat([one.weight, two.weight]).contiguous(
                    memory_format=torch.channels_last
                )
                bias = torch.cat([one.bias, two.bias])
                channels, height, width = one.input_size
                packed = torch._C._nn.mkldnn_reorder_conv2d_weight(
                    weight.to_mkldnn(), list(one.padding), list(one.stride),
                    list(one.dilation), 2, [1, 2 * channels, height, width],
                )  # fmt: skip
                layers.append((packed, bias, list(one.padding), list(one.stride),
                               list(one.dilation), 2, "relu", [None], ""))  # fmt: skip
        self._layers = layers
        self._extra_pads = list(nets[0]._extra_pads)
        self._dtype = nets[0].conv1.weight.dtype


def _act_each(actors: Sequence[Policy], observations: np.ndarray) -> np.ndarray:
    """One batched pass per distinct actor over its rows; actions in row order."""
    rows: dict[int, list[int]] = {}
    by_id: dict[int, Policy] = {}
    for row, actor in enumerate(actors):
        rows.setdefault(id(actor), []).append(row)
        by_id[id(actor)] = actor
    if len(rows) == 1:
        return actors[0].act_batch(observations)
    actions: list[Any] = [None] * len(actors)
    for key, indices in rows.items():
        for row, action in zip(indices, by_id[key].act_batch(observations[indices]), strict=True):
            actions[row] = action
    return np.asarray(actions)
