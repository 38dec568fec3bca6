"""U individuals' convolutions as one batched matrix product (unfold + bmm), not a grouped conv.

The same function as F.conv2d(x, weight, bias, stride=s, groups=U) for x (m, U*C, H, W) and
U kernels stacked along the output channels, computed as each individual's im2col matrix times
its own kernel matrix in one torch.baddbmm over the U individuals. cuDNN's grouped convolutions
were measured slow in reduced precision on an H100, where a batched GEMM runs on the tensor
cores in any dtype; bench/forward_variants.py measures both. Outputs agree with the grouped
convolution to float32 rounding (tests/worker/inference/test_grouped_unfold.py); the batched
runner keeps the grouped one unless a measurement says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

__all__ = ["Convolution", "grouped_conv2d_unfold"]

Convolution = Callable[..., torch.Tensor]
"""Called as F.conv2d(x, weight, bias, stride=stride, groups=groups)."""


def grouped_conv2d_unfold(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, stride: int = 1, groups: int = 1
) -> torch.Tensor:
    """F.conv2d(x, weight, bias, stride=stride, groups=groups) with no padding, as one bmm.

    x (m, U*C, H, W) with U = groups; weight (U*O, C, kh, kw); bias (U*O,). Returns
    (m, U*O, H', W'), laid out as the grouped convolution's output.
    """
    rows, channels, height, width = x.shape
    kernels, per_group, kh, kw = weight.shape
    if channels != groups * per_group or kernels % groups:
        raise ValueError(
            f"input of {channels} channels and {kernels} kernels of {per_group} channels do not "
            f"split into {groups} groups"
        )
    out_channels = kernels // groups
    out_h, out_w = (height - kh) // stride + 1, (width - kw) // stride + 1
    # (m*U, C*kh*kw, L): one im2col matrix per row and individual.
    cols = F.unfold(x.reshape(rows * groups, per_group, height, width), (kh, kw), stride=stride)
    patch, positions = cols.shape[1:]
    # (U, C*kh*kw, m*L): an individual's rows side by side, so its kernel is read once. With one
    # row per individual (m = 1, the common case) this is a view.
    cols = cols.view(rows, groups, patch, positions).permute(1, 2, 0, 3)
    cols = cols.reshape(groups, patch, rows * positions)
    out = torch.baddbmm(
        bias.reshape(groups, out_channels, 1), weight.reshape(groups, out_channels, patch), cols
    )
    out = out.view(groups, out_channels, rows, positions).permute(2, 0, 1, 3)
    return out.reshape(rows, groups * out_channels, out_h, out_w)
