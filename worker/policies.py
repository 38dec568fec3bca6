"""Policy networks whose parameters all live in one flat float32 buffer.

The genome contract: a flat parameter vector is laid out in module registration order, layer by
layer, weight then bias (see Policy.parameter_layout). Conv weights are (out, in, kh, kw) and
linear weights are (out, in), both row-major, as torch stores them.
"""

from __future__ import annotations

import copy
import functools
import itertools
import logging
import math
import warnings
from collections.abc import Callable, Sequence
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
    atari_conv_pads,
    check_parameter_count,
    parameter_count,
    parameter_layout,
)
from neuro.observation_stats import normalise
from worker.onnx_forward import (
    ENGINE_DTYPES,
    ONNXRUNTIME,
    TORCH,
    AtariWeights,
    OnnxAtariForward,
    check_inference_engine,
    default_inference_engine,
)
from worker.static_int8 import STATIC_INT8, StaticInt8Forward, StaticInt8Pass

__all__ = [
    "ARCHITECTURES",
    "ATARI_SHAPE",
    "DEFAULT_MLP_HIDDEN",
    "INFERENCE_DTYPES",
    "Policy",
    "build_policy",
]

log = logging.getLogger(__name__)

_CONV_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.bfloat16}
"""What the convolutions compute in, per inference dtype (int8 convolutions would need fixed
activation ranges, which a genome does not carry)."""
_MIN_INT8_SCALE = 1e-12
"""Floor of an int8 row's scale, so an all-zero row quantises to zeros instead of 0/0."""


def _dtype(layer: nn.Module) -> torch.dtype:
    """The dtype a layer takes its input in: its weights' (float32 for an int8 layer)."""
    weight = getattr(layer, "weight", None)
    return weight.dtype if isinstance(weight, torch.Tensor) else torch.float32


def _copy_into(
    target: torch.Tensor,
    source: torch.Tensor,
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> None:
    """target <- transform(source), rounded once (nearest even) to target's dtype and format."""
    target.copy_(transform(source) if transform is not None else source)


def _unchanged(weight: torch.Tensor) -> torch.Tensor:
    return weight


def _nhwc_columns(weight: torch.Tensor, shape: tuple[int, int, int]) -> torch.Tensor:
    """A dense weight over a (channels, height, width) input with its columns re-ordered to
    (height, width, channels): the order of a channels-last conv output, flattened."""
    channels, height, width = shape
    columns = weight.view(len(weight), channels, height, width).permute(0, 2, 3, 1)
    return columns.reshape(len(weight), -1)


def _scaled_to_unit_input(weight: torch.Tensor) -> torch.Tensor:
    """conv1's weights for observations in [0, 255]: conv(x / 255, w) = conv(x, w / 255)."""
    return weight / 255.0


class _Int8Linear(nn.Module):
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
        quantised, _ = _int8_rows(weight)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # see _int8_rows
            self._packed = torch.ops.quantized.linear_prepack(quantised, bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        if len(x) == 1:
            return self._kernel(x, self._packed, True)
        # Row by row: the input's quantisation range is the whole call's, so a batched call
        # would make an episode's actions depend on which others shared its batch.
        return torch.cat([self._kernel(row, self._packed, True) for row in x.split(1)])


def _int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 (out, in) weights as a per-row qint8 tensor, and the float32 row scales: the
    torch engine's int8 dense layer (_int8_rows_numpy gives the onnxruntime engine the same
    integers and scales)."""
    scale = weight.abs().amax(dim=1).clamp_min(_MIN_INT8_SCALE * 127) / 127
    zero_points = torch.zeros(len(scale), dtype=torch.long)
    with warnings.catch_warnings():
        # torch marks its quantised tensor types deprecated; the fbgemm kernels they feed
        # are the fastest int8 dense layer it ships (bench/inference_dtype.py).
        warnings.simplefilter("ignore")
        quantised = torch.quantize_per_channel(weight, scale.double(), zero_points, 0, torch.qint8)
    return quantised, scale


def _int8_rows_numpy(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """_int8_rows's integers and scales computed in numpy, ~4x faster (the onnxruntime
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


_FUSED_CONV_DTYPES = frozenset(
    dtype for dtype in (torch.float32, torch.bfloat16) if _fused_conv_works(dtype)
)
"""The dtypes whose convolutions run as _FusedConv2dReLU on this machine."""


def _bfloat16_convolutions_emulated() -> bool:
    """Whether bfloat16 convolutions run as float32 ones on bfloat16 values here (AVX2: oneDNN
    packs float32 convolutions but not bfloat16 ones; see _FusedConv2dReLU.output_dtype)."""
    return torch.bfloat16 not in _FUSED_CONV_DTYPES and torch.float32 in _FUSED_CONV_DTYPES


@functools.cache
def _warn_if_bfloat16_is_slow() -> None:
    """Once per process: a CPU that cannot pack bfloat16 convolutions (AVX2 without AVX-512)
    has no bfloat16 arithmetic either, and computes the bfloat16 dense layer several times
    slower than the float32 one (1.16 against 0.32 ms a batch-1 pass on one Zen 3 core)."""
    if torch.bfloat16 not in _FUSED_CONV_DTYPES:
        log.warning(
            "inference dtype bfloat16 on a CPU without bfloat16 instructions (torch sees %s): "
            "its dense layer runs slower than float32's here; int8 is the faster choice",
            torch.backends.cpu.get_cpu_capability(),
        )


def _bfloat16_values(tensor: torch.Tensor) -> torch.Tensor:
    """tensor rounded (nearest even) to bfloat16 and back: bfloat16's values, float32's dtype."""
    return tensor.to(torch.bfloat16).to(tensor.dtype)


class _FusedConv2dReLU(nn.Conv2d):
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


class _AtariNet(nn.Module):
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
        conv_dtype = _dtype(self.conv1)
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
            dtype = _dtype(layer)
            if dtype != x.dtype:
                x = x.to(dtype)
            x = layer(x)
            if layer is self.fc and not getattr(layer, "fused_relu", False):
                x = F.relu(x, inplace=True)
        return x


def _channels_last(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, memory_format=torch.channels_last)


def _bound_forward(net: _AtariNet) -> Callable[[torch.Tensor], torch.Tensor] | None:
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
    if not net.raw_input or not all(isinstance(conv, _FusedConv2dReLU) for conv in convs):
        return None
    conv = torch.ops.mkldnn._convolution_pointwise.default
    pad = F.pad
    channels_last = torch.channels_last
    conv_dtype = _dtype(net.conv1)
    rounded = net.conv1.output_dtype  # bfloat16 where it is emulated in float32
    (a1, a2, a3) = (
        (c._packed, c.bias, list(c.padding), list(c.stride), list(c.dilation), c.groups,
         "relu", [None], "")
        for c in convs
    )  # fmt: skip
    (pad1, pad2, pad3) = net._extra_pads
    fc, out = net.fc, net.out
    fc_dtype = _dtype(fc)
    nhwc = net.fc_input_nhwc
    out_weight, out_bias = out.weight, out.bias
    linear, relu = F.linear, F.relu
    int8 = isinstance(fc, _Int8Linear)
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
    """Where _bound_forward's pass over one observation copies between its layers.

    `x_in`: the observation in the convolutions' dtype. `into[i]`, for the input of conv i+2:
    (bfloat16 buffer the previous output is rounded through, or None; the view the result
    goes to inside the padded input, or None where the layer pads nothing extra; the padded
    input, its border zeros written once). `round3`: conv3's output rounded to bfloat16.
    `fc_in`: the dense layer's input in its dtype and column order, or None where conv3's
    output is already that; `fc_in_flat`, its flat (1, features) view.
    """

    def __init__(
        self,
        net: _AtariNet,
        conv_dtype: torch.dtype,
        rounded: torch.dtype | None,
        fc_dtype: torch.dtype,
    ) -> None:
        sizes = net.conv_input_sizes
        self.x_in = _channels_last((1, *sizes[0]), conv_dtype)
        self.into: list[tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]] = []
        for layer, extra in zip((1, 2), net._extra_pads[1:], strict=True):
            channels, height, width = sizes[layer]
            if extra is not None:  # (0, right, 0, bottom): the odd pixel after, see _AtariNet
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

    `inference_dtype` (after the exact float32 decode, so a genome is the same policy for
    every worker of a run): "float32" computes in float32; "bfloat16" runs every layer but the
    output layer on bfloat16 copies; "int8" runs the hidden dense layers with int8 weights
    (_Int8Linear) and the convolutions on bfloat16 copies; "int8-static" runs the Atari net in
    integers end to end, calibrated per genome (worker/static_int8.py). The copies are refreshed by
    load_parameters; the float32 buffer (what genomes decode to) is unchanged. The output layer
    stays float32 in every dtype: it is ~0.2% of the weights, and bfloat16 logits (8 mantissa
    bits) would tie often, and argmax breaks ties by index. Convolutions run on channels-last
    copies of their weights in every dtype.

    `inference_engine` "onnxruntime" runs the Atari net's float32 and int8 passes on ONNX
    Runtime (worker/onnx_forward.py: the same numbers up to the order of sums, faster on a
    CPU); other nets and dtypes, and "torch", run on torch. `inference_engine` then says
    which one this policy runs.
    """

    def __init__(
        self,
        module: nn.Module,
        observation_shape: tuple[int, ...],
        action_space: Any,
        inference_dtype: str = "float32",
        inference_engine: str = TORCH,
        calibration: np.ndarray | None = None,
    ):
        if inference_dtype not in INFERENCE_DTYPES:
            raise ValueError(
                f"inference dtype {inference_dtype!r} is not one of {', '.join(INFERENCE_DTYPES)}"
            )
        check_inference_engine(inference_engine)
        self.inference_dtype = inference_dtype
        if inference_dtype == "bfloat16":
            _warn_if_bfloat16_is_slow()
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
        # What load_parameters runs after the copy, to bring the inference copies up to date.
        self._refresh: list[Callable[[], None]] = []
        self._onnx: OnnxAtariForward | None = None
        self._static: StaticInt8Forward | None = None
        if inference_dtype == STATIC_INT8:
            self._static = _static_int8_forward(module, observation_shape, inference_engine,
                                                calibration)  # fmt: skip
        elif (
            inference_engine == ONNXRUNTIME
            and isinstance(module, _AtariNet)
            and inference_dtype in ENGINE_DTYPES
        ):
            self._onnx = OnnxAtariForward(
                inference_dtype,
                [stride for _, _, stride in ATARI_CONVS],
                module.pads,
                observation_shape,
            )
        static_onnx = self._static is not None and self._static.engine == ONNXRUNTIME
        onnx = self._onnx is not None or static_onnx
        self.inference_engine = ONNXRUNTIME if onnx else TORCH
        # An onnxruntime or int8-static policy keeps no torch copies: its pass holds its own.
        self._inference_module: nn.Module = (
            self.module
            if self._onnx is not None or self._static is not None
            else self._build_inference_module()
        )
        self._forward: Callable[[torch.Tensor], torch.Tensor] = self._inference_module
        """What act_batch runs on torch: the inference module, or its pass bound by
        _bound_forward."""
        self._refresh_copies()

    def _build_inference_module(self) -> nn.Module:
        """The module the forward pass runs (see the class docstring)."""
        dtype = self.inference_dtype
        leaves = {
            name: layer
            for name, layer in self.module.named_modules()
            if isinstance(layer, (nn.Conv2d, nn.Linear))
        }
        if dtype == "float32" and not any(isinstance(m, nn.Conv2d) for m in leaves.values()):
            return self.module
        module = copy.deepcopy(self.module)
        conv_input_sizes: dict[str, tuple[int, int, int]] = {}
        atari = isinstance(module, _AtariNet)
        conv_dtype = _CONV_DTYPES[dtype]
        # A CPU that cannot pack bfloat16 convolutions (AVX2) runs them as float32 ones on
        # bfloat16 values, rounding each output to bfloat16 (see _FusedConv2dReLU).
        emulated = atari and conv_dtype == torch.bfloat16 and _bfloat16_convolutions_emulated()
        if atari:
            # conv1 takes the observation as it is, its weights scaled by 1/255 instead (one
            # conversion of the input instead of three), and a reduced-precision dense layer
            # takes its columns in the channels-last conv output's order (no flatten copy).
            module.raw_input = True
            module.fc_input_nhwc = dtype != "float32"
            if conv_dtype in _FUSED_CONV_DTYPES or emulated:
                conv_input_sizes = dict(
                    zip(("conv1", "conv2", "conv3"), module.conv_input_sizes, strict=True)
                )
        # The one weight whose copy is re-ordered: the dense layer's, into channels-last order.
        nhwc_fc = (
            functools.partial(_nhwc_columns, shape=module.conv_output_shape)
            if atari and module.fc_input_nhwc
            else None
        )

        for name, source in leaves.items():
            layer: nn.Module
            if name == self._output_layer or (isinstance(source, nn.Linear) and dtype == "float32"):
                layer = source  # its parameters stay views of the buffer
            elif isinstance(source, nn.Linear) and dtype == "int8":
                # The Atari net's dense layer is followed by a ReLU, which fbgemm applies.
                layer = _Int8Linear(source.in_features, source.out_features, relu=atari)
                weight_of = nhwc_fc if name == "fc" and nhwc_fc is not None else _unchanged
                self._refresh.append(
                    lambda layer=layer, source=source, weight_of=weight_of: layer.pack(
                        weight_of(source.weight), source.bias
                    )
                )
            else:
                layer = module.get_submodule(name)
                input_size = conv_input_sizes.get(name)
                if input_size is not None:
                    layer = _FusedConv2dReLU(
                        source.in_channels, source.out_channels, source.kernel_size,
                        source.stride, source.padding, input_size=input_size,
                        output_dtype=conv_dtype if emulated else None, device="meta",
                    )  # fmt: skip
                is_conv = isinstance(source, nn.Conv2d)
                target_dtype = (
                    (torch.float32 if emulated else conv_dtype) if is_conv else torch.bfloat16
                )
                for attr in ("weight", "bias"):
                    original = getattr(source, attr)
                    channels_last = original.dim() == 4
                    target = torch.empty(
                        original.shape,
                        dtype=target_dtype,
                        memory_format=torch.channels_last
                        if channels_last
                        else (torch.contiguous_format),
                    )
                    setattr(layer, attr, nn.Parameter(target, requires_grad=False))
                    transform: Callable[[torch.Tensor], torch.Tensor] | None = None
                    if attr == "weight" and atari and name == "conv1":
                        transform = _scaled_to_unit_input
                    elif attr == "weight" and name == "fc":
                        transform = nhwc_fc
                    if emulated and is_conv:
                        transform = _bfloat16_values if transform is None else (
                            lambda w, scaled=transform: _bfloat16_values(scaled(w))
                        )  # fmt: skip
                    self._refresh.append(functools.partial(_copy_into, target, original, transform))
                if isinstance(layer, _FusedConv2dReLU):
                    self._refresh.append(layer.pack)  # after its weight's copy
            parent, _, attr = name.rpartition(".")
            setattr(module.get_submodule(parent), attr, layer)
        return module

    def weight_bytes_per_forward(self) -> int:
        """Bytes of weights one forward pass reads, in the dtypes it computes in."""
        if self._onnx is not None:
            return self._onnx.weight_bytes
        if self._static is not None:
            return self._static.weight_bytes
        total = 0
        for layer in self._inference_module.modules():
            if isinstance(layer, _Int8Linear):
                total += layer.weight_bytes
            elif isinstance(layer, (nn.Conv2d, nn.Linear)):
                total += sum(p.numel() * p.element_size() for p in layer.parameters())
        return total

    def _refresh_copies(self) -> None:
        if self._onnx is not None:
            self._onnx.load(self._onnx_weights())
            return
        if self._static is not None:
            net = self.module
            self._static.load(
                [(c.weight.numpy(), c.bias.numpy()) for c in (net.conv1, net.conv2, net.conv3)],
                (net.fc.weight.numpy(), net.fc.bias.numpy()),
                (net.out.weight.numpy(), net.out.bias.numpy()),
            )
            return
        with torch.no_grad():
            for refresh in self._refresh:
                refresh()
        module = self._inference_module
        bound = _bound_forward(module) if isinstance(module, _AtariNet) else None
        self._forward = bound or module

    def _onnx_weights(self) -> AtariWeights:
        """The genome's weights as the onnxruntime pass takes them, transformed as the torch
        pass's copies are (conv1's 1/255; bfloat16 values and int8 rows for int8)."""
        net = self.module
        int8 = self.inference_dtype == "int8"

        def values(tensor: torch.Tensor) -> np.ndarray:
            return (_bfloat16_values(tensor) if int8 else tensor).numpy()

        with torch.no_grad():
            convs = [
                (values(_scaled_to_unit_input(conv.weight) if conv is net.conv1 else conv.weight),
                 values(conv.bias))
                for conv in (net.conv1, net.conv2, net.conv3)
            ]  # fmt: skip
            if int8:
                integers, row_scales = _int8_rows_numpy(net.fc.weight.numpy())
                fc: tuple[np.ndarray, ...] = (integers, row_scales, net.fc.bias.numpy())
            else:
                fc = (net.fc.weight.numpy(), net.fc.bias.numpy())
            return AtariWeights(convs, fc, (net.out.weight.numpy(), net.out.bias.numpy()))

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
        self._refresh_copies()

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
        if self._onnx is not None:  # it copies the observations into its own input
            return actions_from_outputs(self._onnx(obs), self.action_space)
        if self._static is not None:
            return actions_from_outputs(self._static(obs), self.action_space)
        if not (obs.flags.writeable and obs.flags.c_contiguous):
            # torch.from_numpy warns on read-only arrays (e.g. replay of a memmap).
            obs = np.array(obs, order="C")
        with torch.inference_mode():
            out = self._forward(torch.from_numpy(obs)).float().numpy()
        return actions_from_outputs(out, self.action_space)


def _static_int8_forward(module: nn.Module, observation_shape: tuple[int, ...], engine: str,
                         calibration: np.ndarray | None) -> StaticInt8Forward:  # fmt: skip
    """The int8-static pass of an Atari net; ValueError naming what is missing otherwise."""
    if not isinstance(module, _AtariNet):
        raise ValueError(
            f"inference dtype {STATIC_INT8!r} quantises the Atari nets (deepga, nature), "
            f"not {type(module).__name__}: choose float32, bfloat16 or int8"
        )
    if calibration is None:
        raise ValueError(
            f"inference dtype {STATIC_INT8!r} needs calibration observations (build_policy's "
            "calibration: worker.static_int8.calibration_observations(env_id, dynamics))"
        )
    if np.shape(calibration)[1:] != observation_shape:
        raise ValueError(
            f"int8-static calibration frames of shape {np.shape(calibration)[1:]} do not match "
            f"the observations' {observation_shape}"
        )
    calibrated = StaticInt8Pass([stride for _, _, stride in ATARI_CONVS], module.pads, calibration)
    return StaticInt8Forward(calibrated, engine, observation_shape)


def actions_from_outputs(out: np.ndarray, space: Any) -> np.ndarray:
    """The action head: argmax + start for Discrete (lowest index on ties), tanh squashed to
    [low, high] for Box; one action per row of the (batch, n_out) network outputs."""
    if isinstance(space, gym.spaces.Discrete):
        # np.argmax picks the lowest index on ties.
        actions = np.argmax(out, axis=1).astype(np.int64, copy=False)
        return actions + int(space.start) if space.start else actions
    low, high = space.low.astype(np.float32).ravel(), space.high.astype(np.float32).ravel()
    squashed = (np.tanh(out) + 1.0) * 0.5
    actions = low + squashed * (high - low)
    return actions.reshape(len(out), *space.shape).astype(space.dtype)


def _box_dim(space: gym.spaces.Box) -> int:
    return math.prod(space.shape)


def build_policy(
    architecture: str,
    observation_space: Any,
    action_space: Any,
    hidden_sizes: Sequence[int] = (),
    inference_dtype: str = "float32",
    inference_engine: str | None = None,
    calibration: np.ndarray | None = None,
) -> Policy:
    """Build the named network for these spaces with zeroed parameters.

    `inference_engine`: see Policy; None takes default_inference_engine() (onnxruntime where
    it is installed). `calibration`: the uint8 observations an int8-static policy sets its
    activation scales on (worker/static_int8.py: calibration_observations); other dtypes
    take none."""
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
            module = _AtariNet(n_out, architecture)
    engine = default_inference_engine() if inference_engine is None else inference_engine
    return Policy(module, obs_shape, action_space, inference_dtype, engine, calibration)
