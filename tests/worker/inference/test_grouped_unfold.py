"""Convolutions as unfold + one batched matmul: the grouped convolution's outputs, to rounding."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from worker.inference.engines.torch_grouped.grouped import CONVOLUTIONS, BatchedPolicies
from worker.inference.engines.torch_grouped.unfold import grouped_conv2d_unfold
from worker.inference.policy import build_policy

ATARI_OBS = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
# Repeated rows of one slot out of order (m = 3 rows each, a gap inside the range), one row per
# slot in order (m = 1: the unfolded columns are a view), and two slots far apart (gathered).
SLOT_PATTERNS = [[3, 0, 3, 1, 3, 0], [0, 1, 2, 3, 4], [4, 0, 4]]


@pytest.mark.parametrize(
    ("rows", "groups", "channels", "out_channels", "kernel", "stride", "size"),
    [
        (1, 3, 4, 8, 8, 4, 21),  # conv1's shape (deepga pads 84 -> 88 first), smaller
        (2, 4, 32, 64, 4, 2, 12),  # conv2's
        (3, 2, 64, 64, 3, 1, 9),  # conv3's, several rows per individual
        (1, 1, 5, 7, 3, 2, 10),  # one group, odd sizes, a stride that leaves a remainder
    ],
)
def test_unfold_computes_the_grouped_convolution(
    rows: int, groups: int, channels: int, out_channels: int, kernel: int, stride: int, size: int
) -> None:
    generator = torch.Generator().manual_seed(rows * 100 + groups)
    x = torch.rand((rows, groups * channels, size, size), generator=generator)
    weight = torch.randn((groups * out_channels, channels, kernel, kernel), generator=generator)
    bias = torch.randn(groups * out_channels, generator=generator)
    expected = F.conv2d(x, weight, bias, stride=stride, groups=groups)
    got = grouped_conv2d_unfold(x, weight, bias, stride=stride, groups=groups)
    assert got.shape == expected.shape and got.dtype == torch.float32
    # float32 rounding: the sums run in another order (GEMM blocks, not direct convolution).
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    # Each individual saw only its own channels: one group's kernels zeroed zero its outputs.
    weight[:out_channels] = 0
    bias[:out_channels] = 0
    alone = grouped_conv2d_unfold(x, weight, bias, stride=stride, groups=groups)
    assert torch.count_nonzero(alone[:, :out_channels]) == 0
    if groups > 1:
        assert torch.count_nonzero(alone[:, out_channels:]) > 0


def test_unfold_refuses_channels_that_do_not_split_into_the_groups() -> None:
    x, weight = torch.zeros((1, 6, 5, 5)), torch.zeros((8, 4, 3, 3))
    with pytest.raises(ValueError, match="6 channels and 8 kernels of 4 channels"):
        grouped_conv2d_unfold(x, weight, torch.zeros(8), groups=2)


@pytest.mark.parametrize("architecture", ["deepga", "nature"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_batched_policies_with_unfolded_convolutions_match_the_grouped_ones(
    architecture: str, device: str
) -> None:
    policy = build_policy(architecture, ATARI_OBS, gym.spaces.Discrete(18),
                          inference_engine="torch")  # fmt: skip
    engines = {name: BatchedPolicies(policy.spec, 5, device, convolution=name)
               for name in CONVOLUTIONS}  # fmt: skip
    assert engines["unfold"].convolution == "unfold"
    rng = np.random.default_rng(7)
    scale = policy.init_scale()
    for slot in range(5):
        # Init-scale weights plus a few mutations' noise, so the biases are not all zero.
        flat = scale * rng.standard_normal(policy.num_params, dtype=np.float32)
        flat += np.float32(0.01) * rng.standard_normal(policy.num_params, dtype=np.float32)
        for engine in engines.values():
            engine.load(slot, flat)
    for slots in SLOT_PATTERNS:
        obs = rng.integers(0, 256, (len(slots), *ATARI_OBS.shape), dtype=np.uint8)
        grouped, unfolded = (engines[name](slots, obs) for name in ("grouped", "unfold"))
        assert unfolded.shape == grouped.shape == (len(slots), 18)
        np.testing.assert_allclose(unfolded, grouped, rtol=1e-4, atol=1e-5)
        # Not one individual's outputs for every row: the slots' weights differ.
        assert len({row.tobytes() for row in grouped}) > 1


def test_an_unknown_convolution_is_refused_by_name() -> None:
    policy = build_policy("deepga", ATARI_OBS, gym.spaces.Discrete(18), inference_engine="torch")
    with pytest.raises(ValueError, match="'winograd'"):
        BatchedPolicies(policy.spec, 2, "cpu", convolution="winograd")
