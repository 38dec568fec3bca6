"""A policy's flat parameter layout, network constants and init scale, without torch."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

ATARI_SHAPE = (4, 84, 84)
DEFAULT_MLP_HIDDEN = (64, 64)
ATARI_CONVS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
"""(out_channels, kernel, stride) of the three conv layers shared by both Atari networks."""
ATARI_HIDDEN = 512
HIDDEN_STD = 1.0
"""Init std of hidden weights, divided by sqrt(fan_in)."""
OUTPUT_STD = 0.1
"""Init std of the output layer's weights, divided by sqrt(fan_in)."""
MAX_PARAMS = 2**27
"""Largest network a worker builds: 512 MiB of float32 (the paper's Atari network has 4M)."""

Layout = list[tuple[str, tuple[int, ...]]]


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow SAME padding (before, after) of one axis; the odd pixel goes after."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def atari_conv_pads(architecture: str) -> list[tuple[int, int, int, int]]:
    """F.pad arguments (left, right, top, bottom) of the three Atari conv layers: SAME for
    deepga, none for nature."""
    size = ATARI_SHAPE[1]
    pads = []
    for _, kernel, stride in ATARI_CONVS:
        if architecture == "deepga":
            before, after = same_padding(size, kernel, stride)
            size = -(-size // stride)
        else:
            before = after = 0
            size = (size - kernel) // stride + 1
        pads.append((before, after, before, after))
    return pads


def parameter_layout(
    architecture: str, observation_shape: Sequence[int], n_outputs: int,
    hidden_sizes: Sequence[int] = (),
) -> Layout:  # fmt: skip
    """(name, shape) of every parameter, in the order Policy.parameter_layout lists them."""
    if architecture == "mlp":
        sizes = [math.prod(observation_shape), *(tuple(hidden_sizes) or DEFAULT_MLP_HIDDEN)]
        layout: Layout = []
        for i in range(len(sizes) - 1):
            layout += [(f"hidden.{i}.weight", (sizes[i + 1], sizes[i])),
                       (f"hidden.{i}.bias", (sizes[i + 1],))]  # fmt: skip
        return [*layout, ("out.weight", (n_outputs, sizes[-1])), ("out.bias", (n_outputs,))]
    if architecture not in ("deepga", "nature"):
        raise ValueError(f"unknown architecture {architecture!r}")
    channels, size = ATARI_SHAPE[0], ATARI_SHAPE[1]
    layout = []
    for i, (out_channels, kernel, stride) in enumerate(ATARI_CONVS, start=1):
        # deepga pads SAME (TensorFlow's), nature pads nothing.
        size = -(-size // stride) if architecture == "deepga" else (size - kernel) // stride + 1
        layout += [(f"conv{i}.weight", (out_channels, channels, kernel, kernel)),
                   (f"conv{i}.bias", (out_channels,))]  # fmt: skip
        channels = out_channels
    return [*layout, ("fc.weight", (ATARI_HIDDEN, channels * size * size)),
            ("fc.bias", (ATARI_HIDDEN,)), ("out.weight", (n_outputs, ATARI_HIDDEN)),
            ("out.bias", (n_outputs,))]  # fmt: skip


def parameter_count(layout: Layout) -> int:
    """Number of parameters in a layout."""
    return sum(math.prod(shape) for _, shape in layout)


def check_parameter_count(num_params: int, table_size: int | None = None) -> int:
    """`num_params` if within MAX_PARAMS and the noise table; ValueError naming both otherwise."""
    if num_params > MAX_PARAMS:
        raise ValueError(
            f"the network has {num_params} parameters, more than the limit of {MAX_PARAMS}"
        )
    if table_size is not None and num_params > table_size:
        raise ValueError(
            f"the network has {num_params} parameters, more than the noise table's "
            f"{table_size} values"
        )
    return num_params


def init_scale(layout: Layout) -> np.ndarray:
    """Per-parameter init scale: std / sqrt(fan_in) for weights, 0 for biases."""
    parts = []
    for name, shape in layout:
        n = math.prod(shape)
        if name.endswith(".weight"):
            std = OUTPUT_STD if name.startswith("out.") else HIDDEN_STD
            parts.append(np.full(n, np.float32(std / math.sqrt(math.prod(shape[1:]))), np.float32))
        else:
            parts.append(np.zeros(n, np.float32))
    return np.concatenate(parts)
