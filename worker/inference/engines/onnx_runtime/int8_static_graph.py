"""The int8-static pass as an ONNX Runtime model, laid out channels-last from end to end.

ONNX Runtime runs an integer convolution on x86 and ARM in NHWC. Given the standard (NCHW)
QLinearConv, it wraps the three convolutions in a transpose of the observation and one of
conv3's output, and its conv1 (8x8, stride 4, four input channels) is its slowest. So the
model takes conv1's input already cut into stride x stride blocks (`ObservationBlocks`, a
space-to-depth done once in numpy instead of ORT's transpose), on which conv1 is a 2x2,
stride-1 convolution over 64 channels; the convolutions are the channels-last QLinearConv
(com.microsoft); and the dense layer's rows are permuted to the (h, w, c) order of conv3's
flattened NHWC output. Each output byte is the same integer sum, requantised the same way,
as on the NCHW pass (the torch engine's; tests/worker/inference/test_int8_static.py holds
them equal); on a Zen 3
(AVX2) this cut a batch-1 pass from 0.271 to 0.256 ms (docs/performance.md, "int8-static").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from worker.inference.base import NetSpec, NetWeights
from worker.inference.engines.onnx_runtime.session import BoundSession, Graph
from worker.inference.int8_static import (
    QuantisedAtariNet,
    QuantisingForward,
    check_observations,
)

_BLOCK_UNITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
"""The unsigned type as wide as one block row of one channel, by stride: moving a row as one
element makes the space-to-depth a 4-d transpose of 7,744 elements (Atari) instead of 6-d of
30,976 bytes."""


class ObservationBlocks:
    """conv1's zero-padded input, (channels, H, W) uint8, as (H/s, W/s, s * channels * s)
    blocks of stride s: block (a, b) channel i*C*s + c*s + j is padded pixel (c, a*s+i, b*s+j).

    conv1 (kernel k, stride s) over the padded input equals a (k/s)x(k/s) stride-1
    convolution over the blocks with `weights(w)`.
    """

    def __init__(
        self,
        observation_shape: Sequence[int],
        kernel: int,
        stride: int,
        pad: tuple[int, int, int, int],
    ) -> None:
        channels, height, width = observation_shape
        left, right, top, bottom = pad
        padded_height, padded_width = height + top + bottom, width + left + right
        if (
            stride not in _BLOCK_UNITS
            or kernel % stride
            or padded_height % stride
            or padded_width % stride
        ):
            raise ValueError(
                f"conv1 (kernel {kernel}, stride {stride}) over a padded {padded_height}x"
                f"{padded_width} input does not cut into whole blocks of its stride"
            )
        self.stride = stride
        self.channels = channels
        self.observation_shape = (channels, height, width)
        self.kernel_blocks = kernel // stride
        self.shape = (padded_height // stride, padded_width // stride, stride * channels * stride)
        self._unit = _BLOCK_UNITS[stride]
        self._padded_shape = (channels, padded_height, padded_width)
        self._inside = (slice(None), slice(None), slice(top, top + height),
                        slice(left, left + width))  # fmt: skip
        self._single = np.zeros((1, *self._padded_shape), dtype=np.uint8)
        """Batch 1 (every step of an offspring): its padding stays zero, only the inside is
        written."""

    def __call__(self, observations: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """(batch, *shape) uint8 blocks of (batch, *observation_shape) uint8 observations,
        written into `out` where given."""
        if observations.shape[1:] != self.observation_shape:
            raise ValueError(
                f"observations of shape {observations.shape[1:]}, expected {self.observation_shape}"
            )
        batch = len(observations)
        padded = self._single if batch == 1 else np.zeros((batch, *self._padded_shape), np.uint8)
        padded[self._inside] = observations
        rows, columns, _ = self.shape
        # (batch, c, a, i, b) of block rows -> (batch, a, b, i, c)
        units = padded.view(self._unit).reshape(batch, self.channels, rows, self.stride, columns)
        blocks = units.transpose(0, 2, 4, 3, 1)
        if out is None:
            return np.ascontiguousarray(blocks).view(np.uint8).reshape(batch, *self.shape)
        np.copyto(out.view(self._unit).reshape(blocks.shape), blocks)
        return out

    def weights(self, weight: np.ndarray) -> np.ndarray:
        """conv1's (out, channels, k, k) weights as the blocks' (out, s*C*s, k/s, k/s)."""
        out, s, kb = weight.shape[0], self.stride, self.kernel_blocks
        # (o, c, a, i, b, j) -> (o, i, c, j, a, b)
        cut = weight.reshape(out, self.channels, kb, s, kb, s).transpose(0, 3, 1, 5, 2, 4)
        return np.ascontiguousarray(cut).reshape(out, s * self.channels * s, kb, kb)


def onnx_model(
    net: QuantisedAtariNet,
    blocks: ObservationBlocks,
    strides: Sequence[int],
    pads: Sequence[tuple[int, int, int, int]],
) -> Any:
    """The int8-static pass over `blocks` of the observation: channels-last QLinearConv
    (u8 x s8, per-channel weights), MatMulInteger, float32 output layer."""
    from onnx import TensorProto

    graph = Graph()
    constant, node = graph.constant, graph.node
    x = "observation"
    zero_u8 = constant("zero_u8", np.uint8(0))
    height, width = blocks.shape[:2]
    for layer, (stride, (left, right, top, bottom)) in enumerate(zip(strides, pads, strict=True)):
        name = f"conv{layer + 1}"
        weight = net.conv_integers[layer]
        if layer == 0:  # on the blocks: stride 1, the padding already in them
            weight, stride, left, right, top, bottom = blocks.weights(weight), 1, 0, 0, 0, 0
        kernel = weight.shape[2]
        height = (height + top + bottom - kernel) // stride + 1
        width = (width + left + right - kernel) // stride + 1
        channels = len(net.conv_scales[layer])
        inputs = [
            x, constant(f"{name}.input_scale", np.float32(net.input_scales[layer])), zero_u8,
            constant(f"{name}.integers", weight),
            constant(f"{name}.scales", net.conv_scales[layer]),
            constant(f"{name}.zero_points", np.zeros(channels, np.int8)),
            constant(f"{name}.output_scale", np.float32(net.output_scales[layer])), zero_u8,
            constant(f"{name}.bias", net.conv_biases[layer]),
        ]  # fmt: skip
        # The output's zero point 0 and its clamp to [0, 255] are the ReLU.
        x = node("QLinearConv", inputs, name, domain="com.microsoft", channels_last=1,
                 kernel_shape=[kernel, kernel], strides=[stride, stride],
                 pads=[top, left, bottom, right])  # fmt: skip
    x = node("Flatten", [x], "features", axis=1)
    rows, _, bias = net.fc
    # The dense rows in the (h, w, c) order of the flattened NHWC features.
    rows = rows.reshape(len(rows), channels, height, width).transpose(0, 2, 3, 1)
    rows = rows.reshape(len(bias), -1)
    sums = node("MatMulInteger", [x, constant("fc.integers", rows.T)], "fc_sums")
    sums = node("Cast", [sums], "fc_sums_float", to=TensorProto.FLOAT)
    scaled = node("Mul", [sums, constant("fc.multipliers", net.fc_multipliers())], "fc_scaled")
    x = node("Relu", [node("Add", [scaled, constant("fc.bias", bias)], "fc")], "hidden")
    weight, out_bias = net.out
    node("Gemm", [x, constant("out.weight", weight), constant("out.bias", out_bias)], "logits",
         transB=1)  # fmt: skip
    return graph.model("atari_net_int8_static", (TensorProto.UINT8, blocks.shape),
                       len(out_bias), microsoft_ops=True)  # fmt: skip


class OnnxStaticInt8Forward(QuantisingForward):
    """A policy's int8-static pass on ONNX Runtime: quantises each genome it loads
    (worker/inference/int8_static.py) and builds a session over the integers."""

    def __init__(self, spec: NetSpec, weights: NetWeights) -> None:
        super().__init__(spec, weights)
        kernel = spec.layout[0][1][-1]
        stride, pad = self.calibrated.strides[0], self.calibrated.pads[0]
        self.blocks = ObservationBlocks(spec.observation_shape, kernel, stride, pad)
        """The blocks of the observation its model takes."""
        self._n_outputs = spec.n_outputs
        self._single_input = np.zeros((1, *self.blocks.shape), dtype=np.uint8)
        self._bound: BoundSession | None = None
        self._run_single: Any = None
        self._binding: Any = None
        self._single_output = np.zeros((1, 0), dtype=np.float32)

    def load(self) -> None:
        """Quantises the weights as they are now and builds the session over them."""
        super().load()
        self._bound = bound = BoundSession(self.onnx_model(), self._single_input,
                                           self._n_outputs)  # fmt: skip
        self._run_single, self._binding = bound.run_single, bound.binding
        self._single_output = bound.single_output

    def onnx_model(self) -> Any:
        """The loaded genome's ONNX model, over `self.blocks`."""
        if self.net is None:
            raise RuntimeError("load() a genome before building its model")
        return onnx_model(self.net, self.blocks, self.calibrated.strides, self.calibrated.pads)

    def __call__(self, observations: np.ndarray) -> np.ndarray:
        """(batch, n_actions) float32 logits of (batch, *observation_shape) uint8 observations."""
        if self._bound is None:
            raise RuntimeError("load() a genome before the first forward pass")
        if observations.dtype != np.uint8:
            check_observations(observations)  # raises, naming the dtype
        if len(observations) == 1:
            self.blocks(observations, out=self._single_input)
            self._run_single(self._binding)
            return self._single_output.copy()
        return self._bound.batch(self.blocks(observations))
