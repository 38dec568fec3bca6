"""The Atari net and the torch machinery of its reduced-precision passes.

`AtariNet` is the paper's network (its parameters in registration order are the genome's
layout, neuro/layout.py). The rest is how a `Policy` (worker/policies.py) runs it on torch
in each inference dtype: int8 dense layers on fbgemm (`Int8Linear`), convolutions on weights
pre-packed for oneDNN with the ReLU fused (`FusedConv2dReLU`), bfloat16 values where a CPU
cannot pack bfloat16 weights, and the whole pass bound into one function (`bound_forward`).
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from neuro.layout import ATARI_CONVS, ATARI_HIDDEN, ATARI_SHAPE, atari_conv_pads, parameter_layout

log = logging.getLogger(__name__)

CONV_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.bfloat16}
"""What the convolutions compute in, per inference dtype (int8 convolutions would need fixed
activation ranges, which a genome does not carry)."""
_MIN_INT8_SCALE = 1e-12
"""Floor of an int8 row's scale, so an all-zero row quantises to zeros instead of 0/0."""


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

    scale = max|w_row| / 127 and q = round-half-even(w / scale). Each call quantises its input
    to uint8 over the input's own range (fbgemm's dynamic quantisation), sums in int32 and
    returns float32. `reduce_range` keeps activations to 7 bits so that AVX2 CPUs, whose int8
    dot products pass through saturating int16 sums, compute the same numbers as AVX-512 ones.
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
        quantised, _ = int8_rows(weight)
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


def int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 (out, in) weights as a per-row qint8 tensor, and the float32 row scales: the
    torch engine's int8 dense layer (int8_rows_numpy gives the onnxruntime engine the same
    integers and scales)."""
    scale = weight.abs().amax(dim=1).clamp_min(_MIN_INT8_SCALE * 127) / 127
    zero_points = torch.zeros(len(scale), dtype=torch.long)
    with warnings.catch_warnings():
        # torch marks its quantised tensor types deprecated; the fbgemm kernels they feed
        # are the fastest int8 dense layer it ships (bench/inference_dtype.py).
        warnings.simplefilter("ignore")
        quantised = torch.quantize_per_channel(weight, scale.double(), zero_points, 0, torch.qint8)
    return quantised, scale


def int8_rows_numpy(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8_rows's integers and scales computed in numpy, ~4x faster (the onnxruntime
    engine's per-load quantisation): the same float32 operations, and the same rounding of
    w x (1 / scale) to the nearest even, so the same integers (tests/test_onnx_forward.py)."""
    scale = np.maximum(np.abs(weight).max(axis=1), np.float32(_MIN_INT8_SCALE * 127))
    scale = scale / np.float32(127)
    levels = np.multiply(weight, (np.float32(1) / scale)[:, None])
    np.rint(levels, out=levels)
    np.clip(levels, -128, 127, out=levels)
    return levels.astype(np.int8), scale


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
        (bench/results/inference-dtype-avx2.json), but not step for step with an AVX-512
        worker's."""
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


def _channels_last(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, memory_format=torch.channels_last)


def bound_forward(net: AtariNet) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """net's forward pass as one function over its current weights, the ops pre-resolved.

    The same ops in the same order as net.forward (tests/test_policies.py holds them bit-equal),
    without the module machinery between them. A worker's step runs with its caches cold (the
    emulator and the dense layer's weight stream evict them), where every Python attribute
    look-up, module call and argument list costs several times what it does warm: on one core
    of the CI-size machine, stepping Frostbite, an int8 pass took ~0.45 ms this way against
    ~0.55 ms through the modules. For one observation (every offspring step), each copy
    between the layers goes into a buffer kept for the load instead of a new tensor: a
    cold-cache allocation costs more than the copy (on one core of an AVX2 CPU stepping
    Frostbite, an int8 pass 0.86-0.89 -> 0.77-0.81 ms), so one policy's pass is not run by
    two threads at once (a worker steps its episodes in one). Rebuilt after every load (it
    binds the packed weights); None where net is not the inference copy with oneDNN's fused
    convolutions.
    """
    convs = (net.conv1, net.conv2, net.conv3)
    if not net.raw_input or not all(isinstance(conv, FusedConv2dReLU) for conv in convs):
        return None
    conv = torch.ops.mkldnn._convolution_pointwise.default
    pad = F.pad
    channels_last = torch.channels_last
    conv_dtype = layer_dtype(net.conv1)
    rounded = net.conv1.output_dtype  # bfloat16 where it is emulated in float32
    (a1, a2, a3) = (
        (c._packed, c.bias, list(c.padding), list(c.stride), list(c.dilation), c.groups,
         "relu", [None], "")
        for c in convs
    )  # fmt: skip
    (pad1, pad2, pad3) = net._extra_pads
    fc, out = net.fc, net.out
    fc_dtype = layer_dtype(fc)
    nhwc = net.fc_input_nhwc
    out_weight, out_bias = out.weight, out.bias
    linear, relu = F.linear, F.relu
    int8 = isinstance(fc, Int8Linear)
    int8_kernel, int8_packed = (fc._kernel, fc._packed) if int8 else (None, None)
    fc_weight, fc_bias = (None, None) if int8 else (fc.weight, fc.bias)
    one = _SingleObservationBuffers(net, conv_dtype, rounded, fc_dtype)
    x_in, round3, fc_in, fc_in_flat = one.x_in, one.round3, one.fc_in, one.fc_in_flat
    (round1, into2, padded2), (round2, into3, padded3) = one.into

    def forward(x: torch.Tensor) -> torch.Tensor:
        if len(x) == 1:
            # The same ops on the same values as below, copying into the load's buffers;
            # unrolled like the rest of the pass (a loop over the layers is more Python per
            # step, which runs with the caches cold).
            x = conv(x_in.copy_(x), *a1)
            if round1 is not None:
                x = round1.copy_(x)
            if into2 is not None:
                into2.copy_(x)
                x = padded2
            x = conv(x, *a2)
            if round2 is not None:
                x = round2.copy_(x)
            if into3 is not None:
                into3.copy_(x)
                x = padded3
            x = conv(x, *a3)
            if round3 is not None:
                x = round3.copy_(x)
            if fc_in is not None:
                fc_in.copy_(x)
                x = fc_in_flat
            else:
                x = x.permute(0, 2, 3, 1).flatten(1) if nhwc else x.flatten(1)
        else:
            x = torch.empty(x.shape, dtype=conv_dtype, memory_format=channels_last).copy_(x)
            x = conv(x if pad1 is None else pad(x, pad1), *a1)
            if rounded is not None:
                x = x.to(rounded).to(conv_dtype)
            x = conv(x if pad2 is None else pad(x, pad2), *a2)
            if rounded is not None:
                x = x.to(rounded).to(conv_dtype)
            x = conv(x if pad3 is None else pad(x, pad3), *a3)
            if rounded is not None:
                x = x.to(rounded)
            x = x.permute(0, 2, 3, 1).flatten(1) if nhwc else x.flatten(1)
            if x.dtype != fc_dtype:
                x = x.to(fc_dtype)
        if int8:
            x = int8_kernel(x, int8_packed, True) if len(x) == 1 else fc.forward(x)
        else:
            x = relu(linear(x, fc_weight, fc_bias), inplace=True)
        if x.dtype != torch.float32:
            x = x.float()
        return linear(x, out_weight, out_bias)

    return forward


class _SingleObservationBuffers:
    """Where bound_forward's pass over one observation copies between its layers.

    `x_in`: the observation in the convolutions' dtype. `into[i]`, for the input of conv i+2:
    (bfloat16 buffer the previous output is rounded through, or None; the view the result
    goes to inside the padded input, or None where the layer pads nothing extra; the padded
    input, its border zeros written once). `round3`: conv3's output rounded to bfloat16.
    `fc_in`: the dense layer's input in its dtype and column order, or None where conv3's
    output is already that; `fc_in_flat`, its flat (1, features) view.
    """

    def __init__(
        self,
        net: AtariNet,
        conv_dtype: torch.dtype,
        rounded: torch.dtype | None,
        fc_dtype: torch.dtype,
    ) -> None:
        sizes = net.conv_input_sizes
        self.x_in = _channels_last((1, *sizes[0]), conv_dtype)
        self.into: list[tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]] = []
        for layer, extra in zip((1, 2), net._extra_pads[1:], strict=True):
            channels, height, width = sizes[layer]
            if extra is not None:  # (0, right, 0, bottom): the odd pixel after, see AtariNet
                height, width = height - extra[3], width - extra[1]
            unpadded = (1, channels, height, width)
            rounding = _channels_last(unpadded, rounded) if rounded is not None else None
            if extra is None:
                target = _channels_last(unpadded, conv_dtype) if rounded is not None else None
                self.into.append((rounding, target, target))
            else:
                padded = _channels_last((1, *sizes[layer]), conv_dtype).zero_()
                self.into.append((rounding, padded[:, :, :height, :width], padded))
        output = (1, *net.conv_output_shape)
        self.round3 = _channels_last(output, rounded) if rounded is not None else None
        last_dtype = rounded or conv_dtype
        self.fc_in: torch.Tensor | None = None
        if net.fc_input_nhwc:
            if last_dtype != fc_dtype:
                self.fc_in = _channels_last(output, fc_dtype)
            self.fc_in_flat = (
                None if self.fc_in is None else self.fc_in.permute(0, 2, 3, 1).flatten(1)
            )
        else:  # columns in (channel, height, width) order: flattening copies
            self.fc_in = torch.empty(output, dtype=fc_dtype)
            self.fc_in_flat = self.fc_in.flatten(1)
