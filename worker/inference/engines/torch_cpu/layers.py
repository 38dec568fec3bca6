"""The torch layers of the reduced-precision passes, and what this CPU's torch can pack.

int8 dense layers on fbgemm (`Int8Linear`), convolutions on weights pre-packed for oneDNN with
the ReLU fused (`FusedConv2dReLU`), and bfloat16 values where a CPU cannot pack bfloat16
weights. passes.py assembles them into a network's inference copy; bound.py binds its pass
into one function.
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from worker.inference.quantise import INT8_LEVELS, quantise_rows

log = logging.getLogger(__name__)

CONV_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.bfloat16}
"""What the convolutions compute in, per inference dtype (int8 convolutions would need fixed
activation ranges, which a genome does not carry)."""


def layer_dtype(layer: nn.Module) -> torch.dtype:
    """The dtype a layer takes its input in: its weights' (float32 for an int8 layer)."""
    weight = getattr(layer, "weight", None)
    return weight.dtype if isinstance(weight, torch.Tensor) else torch.float32


def copy_into(
    target: torch.Tensor,
    source: torch.Tensor,
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> None:
    """target <- transform(source), rounded once (nearest even) to target's dtype and format."""
    target.copy_(transform(source) if transform is not None else source)


def unchanged(weight: torch.Tensor) -> torch.Tensor:
    return weight


def nhwc_columns(weight: torch.Tensor, shape: tuple[int, int, int]) -> torch.Tensor:
    """A dense weight over a (channels, height, width) input with its columns re-ordered to
    (height, width, channels): the order of a channels-last conv output, flattened."""
    channels, height, width = shape
    columns = weight.view(len(weight), channels, height, width).permute(0, 2, 3, 1)
    return columns.reshape(len(weight), -1)


def scaled_to_unit_input(weight: torch.Tensor) -> torch.Tensor:
    """conv1's weights for observations in [0, 255]: conv(x / 255, w) = conv(x, w / 255)."""
    return weight / 255.0


class Int8Linear(nn.Module):
    """A dense layer with int8 weights: one float32 scale per output unit, symmetric.

    scale = max|w_row| / 127 and q = round-half-even(w x (1 / scale)), by the one quantiser
    (worker/inference/quantise.py). Each call quantises its input to uint8 over the input's own
    range (fbgemm's dynamic quantisation), sums in int32 and returns float32. `reduce_range`
    keeps activations to 7 bits so that AVX2 CPUs, whose int8 dot products pass through
    saturating int16 sums, compute the same numbers as AVX-512 ones.
    """

    def __init__(self, in_features: int, out_features: int, relu: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.fused_relu = relu
        """Whether a call returns ReLU(x W^T + b) (fbgemm applies it to the float output)."""
        self._kernel = (
            torch.ops.quantized.linear_relu_dynamic if relu else torch.ops.quantized.linear_dynamic
        )
        self._packed: Any = None

    @property
    def weight_bytes(self) -> int:
        """Bytes one call reads: int8 weights, float32 scales and bias."""
        return self.in_features * self.out_features + 8 * self.out_features

    def pack(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        """Quantises float32 (out, in) weights and packs them with the float32 bias."""
        quantised = int8_rows(weight)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # see int8_rows
            self._packed = torch.ops.quantized.linear_prepack(quantised, bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        if len(x) == 1:
            return self._kernel(x, self._packed, True)
        # Row by row: the input's quantisation range is the whole call's, so a batched call
        # would make an episode's actions depend on which others shared its batch.
        return torch.cat([self._kernel(row, self._packed, True) for row in x.split(1)])


def int8_rows(weight: torch.Tensor) -> torch.Tensor:
    """float32 (out, in) weights as a per-row qint8 tensor: quantise_rows's integers and
    scales, the same the onnxruntime engine computes with."""
    integers, scale = quantise_rows(weight.detach().numpy(), INT8_LEVELS)
    with warnings.catch_warnings():
        # torch marks its quantised tensor types deprecated; the fbgemm kernels they feed
        # are the fastest int8 dense layer it ships (bench/inference_dtype.py).
        warnings.simplefilter("ignore")
        return torch._make_per_channel_quantized_tensor(
            torch.from_numpy(integers),
            torch.from_numpy(scale).double(),
            torch.zeros(len(scale), dtype=torch.long),
            0,
        )


def _fused_conv_works(dtype: torch.dtype) -> bool:
    """Whether this torch and CPU run oneDNN's convolution with a fused ReLU on pre-packed
    weights of `dtype` (bfloat16 packing needs AVX-512 or AVX-NE-CONVERT; AVX2 CPUs refuse)."""
    try:
        with torch.inference_mode():
            weight = torch.ones(1, 1, 1, 1, dtype=dtype)
            packed = torch._C._nn.mkldnn_reorder_conv2d_weight(
                weight.contiguous(memory_format=torch.channels_last).to_mkldnn(),
                [0, 0], [1, 1], [1, 1], 1, [1, 1, 1, 1],
            )  # fmt: skip
            x = torch.full((1, 1, 1, 1), -1.0, dtype=dtype)
            out = torch.ops.mkldnn._convolution_pointwise(
                x.contiguous(memory_format=torch.channels_last), packed,
                torch.zeros(1, dtype=dtype), [0, 0], [1, 1], [1, 1], 1, "relu", [None], "",
            )  # fmt: skip
        return bool(out.item() == 0.0)
    except Exception:  # a build without oneDNN (or these ops), or a CPU without the dtype
        return False


FUSED_CONV_DTYPES = frozenset(
    dtype for dtype in (torch.float32, torch.bfloat16) if _fused_conv_works(dtype)
)
"""The dtypes whose convolutions run as FusedConv2dReLU on this machine."""


def bfloat16_convolutions_emulated() -> bool:
    """Whether bfloat16 convolutions run as float32 ones on bfloat16 values here (AVX2: oneDNN
    packs float32 convolutions but not bfloat16 ones; see FusedConv2dReLU.output_dtype)."""
    return torch.bfloat16 not in FUSED_CONV_DTYPES and torch.float32 in FUSED_CONV_DTYPES


@functools.cache
def warn_if_bfloat16_is_slow() -> None:
    """Once per process: a CPU that cannot pack bfloat16 convolutions (AVX2 without AVX-512)
    has no bfloat16 arithmetic either, and computes the bfloat16 dense layer several times
    slower than the float32 one (1.16 against 0.32 ms a batch-1 pass on one Zen 3 core)."""
    if torch.bfloat16 not in FUSED_CONV_DTYPES:
        log.warning(
            "inference dtype bfloat16 on a CPU without bfloat16 instructions (torch sees %s): "
            "its dense layer runs slower than float32's here; int8 is the faster choice",
            torch.backends.cpu.get_cpu_capability(),
        )


def bfloat16_values(tensor: torch.Tensor) -> torch.Tensor:
    """tensor rounded (nearest even) to bfloat16 and back: bfloat16's values, float32's dtype."""
    return tensor.to(torch.bfloat16).to(tensor.dtype)


class FusedConv2dReLU(nn.Conv2d):
    """ReLU(conv(x)) in one oneDNN call, on weights re-packed into oneDNN's own layout.

    A plain conv re-orders its weights into that layout on every call; packing them once
    per genome load took the three batch-1 convolutions of the Atari net from 0.20 to
    0.14 ms in bfloat16 and 0.24 to 0.17 ms in float32 (one core of the CI-size machine).
    Results are bit-equal to conv2d + relu in bfloat16 and differ at rounding level in
    float32 (oneDNN may pick another algorithm), the same for every worker. `input_size` is
    the (channels, height, width) the layer sees; other batch sizes give the same rows.
    """

    fused_relu = True

    def __init__(
        self,
        *args: Any,
        input_size: tuple[int, int, int],
        output_dtype: torch.dtype | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.input_size = input_size
        self.output_dtype = output_dtype
        """bfloat16 where the layer stands in for a bfloat16 one on a CPU that cannot pack
        bfloat16 weights: its float32 weights hold bfloat16 values and its output is rounded
        to bfloat16. Products of bfloat16 values are exact in float32 and oneDNN sums
        bfloat16 convolutions in float32, so the outputs are a bfloat16 layer's up to the
        order of the sums. That order can move a rounding to bfloat16 by one step, and so,
        rarely, a greedy action: on AVX2, actions agree with float32's as often as on AVX-512
        (bench/results/inference-dtype-epyc-avx2-2core-2026-11-26.json), but not step for step
        with an AVX-512 worker's."""
        self._packed: Any = None

    def pack(self) -> None:
        """Re-packs the (channels-last) weight; run after every change to it."""
        self._packed = torch._C._nn.mkldnn_reorder_conv2d_weight(
            self.weight.to_mkldnn(), list(self.padding), list(self.stride),
            list(self.dilation), self.groups, [1, *self.input_size],
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.weight.dtype:
            x = x.to(self.weight.dtype)
        x = torch.ops.mkldnn._convolution_pointwise(
            x, self._packed, self.bias, list(self.padding), list(self.stride),
            list(self.dilation), self.groups, "relu", [None], "",
        )  # fmt: skip
        return x if self.output_dtype is None else x.to(self.output_dtype)
