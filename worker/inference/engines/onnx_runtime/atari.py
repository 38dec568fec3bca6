"""The Atari net's forward pass on ONNX Runtime, the CPU worker's default engine.

Why a second engine: at batch 1, with its caches cold from the emulator, ONNX Runtime's
convolutions (MLAS, weights re-blocked once per session) take ~90-100 us each where oneDNN's
take ~160 us (a Zen 3 core stepping Frostbite), so an int8 pass fell from 0.75 to 0.43 ms a
step and a float32 one from 1.00 to 0.74 ms (bench/inference_engines.py; docs/performance.md,
"The inference engine"). A genome's weights are constants of a session built per load (int8
16 ms, float32 26 ms, against an offspring episode's 3-4 s), so that ONNX Runtime packs them
once.

The numbers are those of the torch engine's pass for the same dtype, up to the order of float
sums (as between two CPUs; tests/worker/inference/test_onnxruntime_engine.py holds the
logits close and the greedy actions the same):
- float32: the torch pass's layers and weights (conv1's scaled by 1/255), in float32.
- int8: the convolutions on bfloat16 values (weights, biases and each ReLU output rounded to
  bfloat16 and back, as the torch pass does on a CPU without bfloat16 convolutions); the
  dense layer on the same int8 integers and row scales as Int8Linear (worker/inference/quantise.py),
  its input quantised per observation to 7 bits over [0, max] (what fbgemm's dynamic
  quantisation does with reduce_range: a ReLU output has no negatives), summed in int32, then
  scaled to float32.
bfloat16 is not served here (ONNX Runtime has no bfloat16 convolution on CPU): the registry
runs its policies on torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from neuro.inference import FLOAT32, INT8
from neuro.layout import ATARI_CONVS, atari_conv_pads
from worker.inference.base import NetSpec, NetWeights
from worker.inference.engines.onnx_runtime.session import BoundSession, Graph
from worker.inference.quantise import INT8_LEVELS, MIN_SCALE, bfloat16_values, quantise_rows

_INT8_INPUT_LEVELS = 127.0
"""7-bit activations: AVX2's int8 dot products add pairs of u8 x s8 products in saturating
int16, and 2 x 127 x 127 fits where 2 x 255 x 127 does not (fbgemm's reduce_range)."""


@dataclass(frozen=True)
class AtariWeights:
    """One genome's weights as the forward pass computes with them (numpy, C order).

    `convs`: per layer (weight (out, in, kh, kw), bias), conv1's already scaled by 1/255 and,
    for int8, all rounded to bfloat16 values. `fc`: (weight (out, in), bias) in float32, or
    for int8 (int8 integers (out, in), float32 row scales, bias). `out`: (weight, bias).
    """

    convs: Sequence[tuple[np.ndarray, np.ndarray]]
    fc: tuple[np.ndarray, ...]
    out: tuple[np.ndarray, np.ndarray]

    @classmethod
    def of(cls, weights: NetWeights, dtype: str) -> AtariWeights:
        """A policy's float32 weights, transformed as the torch engine's copies are (conv1's
        1/255; for int8, bfloat16 values and int8 rows)."""
        int8 = dtype == INT8

        def values(array: np.ndarray) -> np.ndarray:
            return bfloat16_values(array) if int8 else array

        convs = []
        for name in ("conv1", "conv2", "conv3"):
            weight, bias = weights.layer(name)
            if name == "conv1":  # conv(x / 255, w) = conv(x, w / 255)
                weight = weight / np.float32(255)
            convs.append((values(weight), values(bias)))
        fc_weight, fc_bias = weights.layer("fc")
        if int8:
            integers, row_scales = quantise_rows(fc_weight, INT8_LEVELS)
            fc: tuple[np.ndarray, ...] = (integers, row_scales, fc_bias)
        else:
            fc = (fc_weight, fc_bias)
        return cls(convs, fc, weights.layer("out"))


class OnnxAtariForward:
    """Logits of the Atari net for a batch of observations, on one ONNX Runtime session.

    A session is built by each load() over the policy's current weights (they are copied into
    it) and runs in the calling thread.
    """

    def __init__(self, spec: NetSpec, weights: NetWeights) -> None:
        if spec.dtype not in (FLOAT32, INT8):
            raise ValueError(
                f"onnxruntime's Atari pass computes float32 or int8, not {spec.dtype!r}"
            )
        self.dtype = spec.dtype
        self.weights = weights
        self._strides = [stride for _, _, stride in ATARI_CONVS]
        self._pads = [list(p) for p in atari_conv_pads(spec.architecture)]
        self._observation_shape = spec.observation_shape
        self._n_outputs = spec.n_outputs
        self._bound: BoundSession | None = None
        self._single_input = np.zeros((1, *spec.observation_shape), dtype=np.float32)
        self._single_shape = self._single_input.shape
        self._run_single: Any = None
        self._binding: Any = None
        self._single_output = np.zeros((1, 0), dtype=np.float32)
        self.layer_bytes: dict[str, int] = {}
        """Bytes each layer's weights take in the session, in the dtype it computes in."""

    @property
    def weight_bytes(self) -> int:
        return sum(self.layer_bytes.values())

    def load(self) -> None:
        """Builds the session over the weights as they are now."""
        weights = AtariWeights.of(self.weights, self.dtype)
        self._bound = bound = BoundSession(self.model(weights), self._single_input,
                                           self._n_outputs)  # fmt: skip
        self._run_single, self._binding = bound.run_single, bound.binding
        self._single_output = bound.single_output
        layers = {f"conv{i}": conv for i, conv in enumerate(weights.convs, 1)}
        layers.update(fc=weights.fc, out=weights.out)
        self.layer_bytes = {
            name: sum(int(array.nbytes) for array in arrays) for name, arrays in layers.items()
        }

    def __call__(self, observations: np.ndarray) -> np.ndarray:
        """(batch, n_actions) float32 logits; observations are (batch, *observation_shape)."""
        if observations.shape == self._single_shape and self._run_single is not None:
            np.copyto(self._single_input, observations, casting="unsafe")
            self._run_single(self._binding)
            return self._single_output.copy()
        if self._bound is None:
            raise RuntimeError("load() a genome before the first forward pass")
        return self._bound.batch(np.ascontiguousarray(observations, dtype=np.float32))

    def model(self, weights: AtariWeights) -> Any:
        """The ONNX model of the pass over these weights; nodes are named by their output."""
        from onnx import TensorProto

        graph = Graph()
        constant, node = graph.constant, graph.node

        def rounded_to_bfloat16(x: str) -> str:
            return node("Cast", [node("Cast", [x], f"{x}_bf16", to=TensorProto.BFLOAT16)],
                        f"{x}_rounded", to=TensorProto.FLOAT)  # fmt: skip

        x = "observation"
        layers = zip(weights.convs, self._strides, self._pads, strict=True)
        for index, ((weight, bias), stride, (left, right, top, bottom)) in enumerate(layers, 1):
            name = f"conv{index}"
            inputs = [x, constant(f"{name}.weight", weight), constant(f"{name}.bias", bias)]
            conv = node("Conv", inputs, name, strides=[stride, stride],
                        pads=[top, left, bottom, right])  # fmt: skip
            x = node("Relu", [conv], f"relu{index}")
            if self.dtype == INT8:
                x = rounded_to_bfloat16(x)
        x = node("Flatten", [x], "features", axis=1)
        if self.dtype == INT8:
            x = _int8_dense(graph, x, weights.fc)
        else:
            weight, bias = weights.fc
            x = node("Gemm", [x, constant("fc.weight", weight), constant("fc.bias", bias)],
                     "fc", transB=1)  # fmt: skip
        x = node("Relu", [x], "hidden")
        weight, bias = weights.out
        node("Gemm", [x, constant("out.weight", weight), constant("out.bias", bias)], "logits",
             transB=1)  # fmt: skip
        return graph.model("atari_net", (TensorProto.FLOAT, self._observation_shape),
                           self._n_outputs)  # fmt: skip


def _int8_dense(graph: Graph, x: str, fc: tuple[np.ndarray, ...]) -> str:
    """x W^T + b with int8 W and x quantised per row to 7 bits over [0, max(x)]."""
    from onnx import TensorProto

    constant, node = graph.constant, graph.node
    integers, row_scales, bias = fc
    peak = node("ReduceMax", [x], "fc_input_max", axes=[1], keepdims=1)
    levels = constant("levels", np.float32(_INT8_INPUT_LEVELS))
    raw_scale = node("Div", [peak, levels], "fc_input_scale_raw")
    scale = node("Max", [raw_scale, constant("min_scale", MIN_SCALE)], "fc_input_scale")
    # fbgemm multiplies by the scale's reciprocal (a division would round differently).
    scaled = node("Mul", [x, node("Reciprocal", [scale], "fc_input_inverse")], "fc_scaled")
    rounded = node("Round", [scaled], "fc_rounded")
    clipped = node("Clip", [rounded, constant("zero", np.float32(0)), levels], "fc_levels")
    quantised = node("Cast", [clipped], "fc_input_uint8", to=TensorProto.UINT8)
    sums = node("MatMulInteger", [quantised, constant("fc.integers", integers.T)], "fc_sums")
    sums_float = node("Cast", [sums], "fc_sums_float", to=TensorProto.FLOAT)
    output_scale = node("Mul", [scale, constant("fc.row_scales", row_scales)], "fc_out_scale")
    product = node("Mul", [sums_float, output_scale], "fc_product")
    return node("Add", [product, constant("fc.bias", bias)], "fc")
