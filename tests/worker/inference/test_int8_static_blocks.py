"""int8-static's ONNX layout: conv1's input cut into blocks of its stride (space-to-depth)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from neuro.layout import ATARI_CONVS, atari_conv_pads
from worker.inference.engines.onnx_runtime.int8_static_graph import ObservationBlocks

SHAPE = (4, 84, 84)
KERNEL, STRIDE = ATARI_CONVS[0][1], ATARI_CONVS[0][2]


def naive_blocks(observation: np.ndarray, stride: int, pad: tuple[int, int, int, int]):
    """Block (a, b), channel i*C*s + c*s + j = padded pixel (c, a*s+i, b*s+j), by loops."""
    left, right, top, bottom = pad
    padded = np.pad(observation, ((0, 0), (top, bottom), (left, right)))
    channels, height, width = padded.shape
    out = np.zeros((height // stride, width // stride, stride * channels * stride), np.uint8)
    for a in range(height // stride):
        for b in range(width // stride):
            for i in range(stride):
                for c in range(channels):
                    for j in range(stride):
                        out[a, b, i * channels * stride + c * stride + j] = padded[
                            c, a * stride + i, b * stride + j
                        ]
    return out


@pytest.mark.parametrize("architecture", ["deepga", "nature"])
def test_blocks_are_the_padded_pixels_in_their_documented_places(architecture):
    pad = atari_conv_pads(architecture)[0]
    blocks = ObservationBlocks(SHAPE, KERNEL, STRIDE, pad)
    observations = np.random.default_rng(0).integers(0, 256, (3, *SHAPE), dtype=np.uint8)
    expected = np.stack([naive_blocks(o, STRIDE, pad) for o in observations])
    assert blocks.shape == expected.shape[1:]
    assert np.array_equal(blocks(observations), expected)  # a batch
    out = np.full((1, *blocks.shape), 7, np.uint8)
    for observation, want in zip(observations, expected, strict=True):  # one by one, twice
        assert blocks(observation[None], out=out) is out
        assert np.array_equal(out[0], want)
        assert np.array_equal(blocks(observation[None]), want[None])


@pytest.mark.parametrize("architecture", ["deepga", "nature"])
def test_conv1_over_the_blocks_is_conv1_over_the_padded_observation(architecture):
    pad = atari_conv_pads(architecture)[0]
    blocks = ObservationBlocks(SHAPE, KERNEL, STRIDE, pad)
    rng = np.random.default_rng(1)
    observations = rng.integers(0, 256, (2, *SHAPE), dtype=np.uint8)
    weight = rng.integers(-63, 64, (32, SHAPE[0], KERNEL, KERNEL)).astype(np.int8)
    # Integers below 2**24 in float64: both convolutions are exact.
    direct = F.conv2d(F.pad(torch.from_numpy(observations).double(), pad),
                      torch.from_numpy(weight).double(), stride=STRIDE)  # fmt: skip
    cut = torch.from_numpy(blocks(observations)).double().permute(0, 3, 1, 2)
    over_blocks = F.conv2d(cut, torch.from_numpy(blocks.weights(weight)).double())
    assert over_blocks.shape == direct.shape
    assert torch.equal(over_blocks, direct)


def test_what_does_not_cut_into_blocks_is_refused_by_name():
    with pytest.raises(ValueError, match="kernel 6, stride 4"):
        ObservationBlocks(SHAPE, 6, 4, (0, 0, 0, 0))
    with pytest.raises(ValueError, match="padded 86x86"):
        ObservationBlocks(SHAPE, 8, 4, (1, 1, 1, 1))
    with pytest.raises(ValueError, match="stride 3"):
        ObservationBlocks((4, 84, 84), 6, 3, (0, 0, 0, 0))
    blocks = ObservationBlocks(SHAPE, KERNEL, STRIDE, (2, 2, 2, 2))
    with pytest.raises(ValueError, match=r"observations of shape \(4, 84, 80\), expected"):
        blocks(np.zeros((1, 4, 84, 80), np.uint8))
