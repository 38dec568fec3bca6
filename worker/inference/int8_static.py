"""The "int8-static" inference dtype: the Atari net in 8-bit integers end to end, its
activations' scales calibrated per genome on a fixed set of the game's own frames.

Why a second int8: on a CPU without bfloat16 arithmetic (AVX2), "int8" still runs its three
convolutions in float32, and they take most of its pass. ONNX Runtime's integer convolution
(QLinearConv, u8 x s8) needs each layer's output scale before it runs, which a per-observation
(dynamic) scale cannot give; static quantisation, as every int8 deployment does it, fixes the
scales from calibration data instead. Training Frostbite on a Zen 3 (AVX2) machine, the
workers' forward pass fell from 0.45 to 0.30 ms a step, and an offspring step from 1.27 to
1.12 ms (docs/performance.md, "int8-static").

The definition, the same numbers on torch and ONNX Runtime and on every CPU (up to the order
of the float32 output layer's sums; tests/worker/inference/test_int8_static.py):
- Weights: per output channel (row), symmetric, 7 bits: scale = max|w| / 63, integers
  round-half-even(w x (1 / scale)). 7 bits because AVX2's u8 x s8 dot product adds pairs of
  products in saturating int16: 2 x 255 x 63 fits, 2 x 255 x 127 does not, and a CPU that
  saturated would sum other integers than one that does not (AVX-512 VNNI).
- conv1 takes the observation's bytes as they are (input scale 1/255: exact).
- Each convolution: the integer sums plus round(bias / (input scale x weight scale)), times
  float32(float32(input scale x weight scale) / output scale), rounded half to even and
  clamped to [0, 255] (the ReLU): its output's bytes. Every product sum is an exact integer
  (|sum| < 2**24), and its float32 is rounded to nearest even on both engines.
- Each convolution's output scale: its largest ReLU output over the calibration
  observations / 255, computed layer by layer on this pass itself (so it is exact too).
  Larger outputs on other frames saturate at 255.
- The dense layer: the bytes of conv3's output x 7-bit rows, summed in integers, float32 of
  the sum x float32(input scale x row scale) + bias, ReLU. The output layer stays float32.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from neuro.inference import ATARI_ARCHITECTURES, INT8_STATIC
from neuro.layout import ATARI_CONVS, atari_conv_pads
from worker.inference.base import NetSpec, NetWeights
from worker.inference.quantise import quantise_rows

WEIGHT_LEVELS = 63
"""7-bit weights (see the module docstring: no CPU's int16 pair sums saturate)."""
ACTIVATION_LEVELS = 255
_EXACT_FLOAT32_SUM = 2**24
"""Integers up to this add exactly in float32, whatever the order of the sums."""
_BIAS_LIMIT = 2**30
"""A quantised bias is clamped to this, so that bias + sums stays within int32."""


@dataclass(frozen=True)
class QuantisedAtariNet:
    """One genome's Atari net as the int8-static pass computes with it.

    Per conv layer: `conv_integers` (out, in, kh, kw) int8, `conv_scales` (out,) float32,
    `conv_biases` (out,) int32, `input_scales` and `output_scales` float32. `fc`: int8
    (out, in) rows, float32 row scales, float32 bias. `out`: float32 (weight, bias).
    """

    conv_integers: Sequence[np.ndarray]
    conv_scales: Sequence[np.ndarray]
    conv_biases: Sequence[np.ndarray]
    input_scales: Sequence[np.float32]
    output_scales: Sequence[np.float32]
    fc: tuple[np.ndarray, np.ndarray, np.ndarray]
    out: tuple[np.ndarray, np.ndarray]

    def multipliers(self, layer: int) -> np.ndarray:
        """float32(float32(input scale x weight scale) / output scale) per output channel."""
        product = (self.input_scales[layer] * self.conv_scales[layer]).astype(np.float32)
        return (product / self.output_scales[layer]).astype(np.float32)

    def fc_multipliers(self) -> np.ndarray:
        """float32(dense input scale x row scale): what turns a row's integer sum to float."""
        return (self.output_scales[-1] * self.fc[1]).astype(np.float32)

    @functools.cached_property
    def torch_tensors(self) -> dict[str, Any]:
        """The torch pass's float tensors of these integers and scales, made once per genome
        instead of on every step: float32 conv weights, float64 conv biases, multipliers,
        float32 dense rows and their multipliers, float32 biases and output layer."""
        import torch

        layers = range(len(self.conv_integers))
        rows, _, bias = self.fc
        weight, out_bias = self.out
        return {
            "conv_weights": [_float_tensor(self.conv_integers[i], np.float32) for i in layers],
            "conv_biases": [_float_tensor(self.conv_biases[i], np.float64) for i in layers],
            "multipliers": [torch.from_numpy(self.multipliers(i)) for i in layers],
            "fc_rows": _float_tensor(rows, np.float32),
            "fc_multipliers": torch.from_numpy(self.fc_multipliers()),
            "fc_bias": torch.from_numpy(bias),
            "out_weight": torch.from_numpy(weight),
            "out_bias": torch.from_numpy(out_bias),
        }

    @property
    def layer_bytes(self) -> dict[str, int]:
        """Bytes of weights each layer reads in one pass: integers, scales and biases."""
        layers: dict[str, tuple[np.ndarray, ...]] = {
            f"conv{i + 1}": (self.conv_integers[i], self.conv_scales[i], self.conv_biases[i])
            for i in range(len(self.conv_integers))
        }
        layers.update(fc=self.fc, out=self.out)
        return {name: sum(int(a.nbytes) for a in arrays) for name, arrays in layers.items()}

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one pass reads."""
        return sum(self.layer_bytes.values())


def quantised_rows(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 weights (out, ...) as 7-bit integers and one float32 scale per row, max|w| / 63."""
    return quantise_rows(weight, WEIGHT_LEVELS)


def check_calibration(spec: NetSpec) -> np.ndarray:
    """The spec's calibration frames; ValueError naming what is missing or does not fit."""
    if spec.architecture not in ATARI_ARCHITECTURES:
        raise ValueError(
            f"inference dtype {INT8_STATIC!r} quantises the Atari nets "
            f"({', '.join(ATARI_ARCHITECTURES)}), not {spec.architecture!r}: choose float32, "
            "bfloat16 or int8"
        )
    if spec.calibration is None:
        raise ValueError(
            f"inference dtype {INT8_STATIC!r} needs calibration observations (build_policy's "
            "calibration: worker.play.calibration.calibration_observations(env_id, "
            "dynamics))"
        )
    if np.shape(spec.calibration)[1:] != spec.observation_shape:
        raise ValueError(
            f"int8-static calibration frames of shape {np.shape(spec.calibration)[1:]} do not "
            f"match the observations' {spec.observation_shape}"
        )
    return spec.calibration


def check_observations(observations: np.ndarray) -> np.ndarray:
    """The observations, if they are frame bytes (uint8); ValueError naming their dtype."""
    if observations.dtype != np.uint8:
        raise ValueError(
            f"int8-static takes uint8 observations (frame bytes), not {observations.dtype}"
        )
    return observations


class QuantisingForward:
    """What every engine's int8-static pass shares: the calibrated quantiser of its spec, the
    policy's weights, and each load's quantised net (an engine adds how it runs it)."""

    def __init__(self, spec: NetSpec, weights: NetWeights) -> None:
        self.calibrated = StaticInt8Pass.for_spec(spec, check_calibration(spec))
        self.weights = weights
        self.net: QuantisedAtariNet | None = None

    @property
    def layer_bytes(self) -> dict[str, int]:
        return {} if self.net is None else self.net.layer_bytes

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one pass reads (0 before the first load)."""
        return 0 if self.net is None else self.net.weight_bytes

    def load(self) -> None:
        """Quantises the weights as they are now."""
        self.net = self.calibrated.quantise_weights(self.weights)


class StaticInt8Pass:
    """Quantises a genome's Atari net by calibration and runs the integer pass on torch.

    `strides` and `pads` (left, right, top, bottom per layer, as F.pad takes them) describe
    the convolutions; `calibration`: (frames, *observation shape) uint8 observations.
    """

    def __init__(
        self,
        strides: Sequence[int],
        pads: Sequence[tuple[int, int, int, int]],
        calibration: np.ndarray,
    ) -> None:
        calibration = np.asarray(calibration)
        if calibration.dtype != np.uint8 or calibration.ndim != 4 or len(calibration) == 0:
            raise ValueError(
                f"int8-static calibration must be a non-empty (frames, channels, height, "
                f"width) uint8 array, got {calibration.dtype} {calibration.shape}"
            )
        self.strides = list(strides)
        self.pads = [tuple(p) for p in pads]
        self._calibration_values = calibration.astype(np.float32)
        """The calibration frames as the float32 values the torch convolutions take."""

    @classmethod
    def for_spec(cls, spec: NetSpec, calibration: np.ndarray) -> StaticInt8Pass:
        """The pass of the spec's Atari net (its strides and padding)."""
        strides = [stride for _, _, stride in ATARI_CONVS]
        return cls(strides, atari_conv_pads(spec.architecture), calibration)

    def quantise_weights(self, weights: NetWeights) -> QuantisedAtariNet:
        """quantise() of a policy's float32 Atari net."""
        convs = [weights.layer(name) for name in ("conv1", "conv2", "conv3")]
        return self.quantise(convs, weights.layer("fc"), weights.layer("out"))

    def quantise(
        self,
        convs: Sequence[tuple[np.ndarray, np.ndarray]],
        fc: tuple[np.ndarray, np.ndarray],
        out: tuple[np.ndarray, np.ndarray],
    ) -> QuantisedAtariNet:
        """The quantised net of the float32 net's weights (conv1's on the observation / 255,
        as the float32 net has them), its output scales set by the calibration."""
        import torch

        integers, scales, biases, inputs, outputs = [], [], [], [], []
        x = torch.from_numpy(self._calibration_values)
        input_scale = np.float32(1 / 255)
        for layer, (weight, bias) in enumerate(convs):
            levels, scale = quantised_rows(weight)
            product = (input_scale * scale).astype(np.float32)
            biases.append(
                np.clip(np.round(bias / product), -_BIAS_LIMIT, _BIAS_LIMIT).astype(np.int32)
            )
            integers.append(levels)
            scales.append(scale)
            inputs.append(input_scale)
            sums = self._conv_sums(x, _float_tensor(levels, np.float32),
                                   _float_tensor(biases[-1], np.float64), layer)  # fmt: skip
            peak = float((sums * torch.from_numpy(product).view(1, -1, 1, 1)).max())
            output_scale = np.float32(max(peak, 0.0) / ACTIVATION_LEVELS)
            output_scale = output_scale if output_scale > 0 else np.float32(1.0)
            outputs.append(output_scale)
            multiplier = (product / output_scale).astype(np.float32)
            x = _requantised(sums, torch.from_numpy(multiplier))
            input_scale = output_scale
        fc_levels, fc_scale = quantised_rows(fc[0])
        return QuantisedAtariNet(
            integers, scales, biases, inputs, outputs,
            (fc_levels, fc_scale, fc[1].astype(np.float32)),
            (out[0].astype(np.float32), out[1].astype(np.float32)),
        )  # fmt: skip

    def logits(self, net: QuantisedAtariNet, observations: np.ndarray) -> np.ndarray:
        """(batch, n_actions) float32 logits of uint8 observations, on torch."""
        import torch

        tensors = net.torch_tensors
        features = self.layer_bytes(net, observations)[-1].flatten(1)
        sums = _exact_matmul(features, tensors["fc_rows"])
        hidden = torch.relu(sums * tensors["fc_multipliers"] + tensors["fc_bias"])
        return torch.nn.functional.linear(
            hidden, tensors["out_weight"], tensors["out_bias"]
        ).numpy()

    def layer_bytes(self, net: QuantisedAtariNet, observations: np.ndarray) -> list[Any]:
        """Each convolution's output bytes (as float32 torch tensors) for uint8 observations."""
        import torch

        tensors = net.torch_tensors
        x = torch.from_numpy(np.ascontiguousarray(observations, dtype=np.float32))
        outputs = []
        for layer, (weight, bias, multiplier) in enumerate(
            zip(
                tensors["conv_weights"], tensors["conv_biases"], tensors["multipliers"], strict=True
            )
        ):
            x = _requantised(self._conv_sums(x, weight, bias, layer), multiplier)
            outputs.append(x)
        return outputs

    def _conv_sums(self, x: Any, weight: Any, bias: Any, layer: int) -> Any:
        """float32 of (integer sums + bias) of one layer over integer-valued float32 input,
        its integers as float32 `weight` and float64 `bias`: float32 convolution sums
        integers below 2**24 exactly, in any order."""
        import torch.nn.functional as F

        x = F.pad(x, self.pads[layer])
        sums = F.conv2d(x, weight, stride=self.strides[layer]).double()
        return (sums + bias.view(1, -1, 1, 1)).float()


def _float_tensor(array: np.ndarray, dtype: Any) -> Any:
    """A torch tensor of an integer array's values in a float dtype (exact: |values| < 2**24
    for float32, < 2**53 for float64)."""
    import torch

    return torch.from_numpy(array.astype(dtype))


def _requantised(sums: Any, multiplier: Any) -> Any:
    """Output bytes (as float32 values): float32 sums x per-channel multiplier, rounded half
    to even, clamped to [0, 255]."""
    import torch

    scaled = sums * multiplier.view(1, -1, 1, 1)
    return torch.clamp(torch.round(scaled), 0, ACTIVATION_LEVELS)


def _exact_matmul(features: Any, rows: Any) -> Any:
    """float32 of the exact integer products features @ rows.T: float32 sums over chunks
    whose largest possible sum stays below 2**24, added in float64."""
    import torch

    chunk = _EXACT_FLOAT32_SUM // (ACTIVATION_LEVELS * WEIGHT_LEVELS)
    total = torch.zeros((features.shape[0], rows.shape[0]), dtype=torch.float64)
    for start in range(0, features.shape[1], chunk):
        part = features[:, start : start + chunk] @ rows[:, start : start + chunk].T
        total += part.double()
    return total.float()
