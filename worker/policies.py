"""Policy networks whose parameters all live in one flat float32 buffer.

The genome contract: a flat parameter vector is laid out in module registration order, layer by
layer, weight then bias (see Policy.parameter_layout). Conv weights are (out, in, kh, kw) and
linear weights are (out, in), both row-major, as torch stores them.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from neuro.layout import (
    ARCHITECTURES,
    ATARI_CONVS,
    ATARI_SHAPE,
    DEFAULT_MLP_HIDDEN,
    HIDDEN_STD,
    INFERENCE_DTYPES,
    OUTPUT_STD,
    check_parameter_count,
    parameter_count,
    parameter_layout,
)
from neuro.observation_stats import normalise
from worker import atari_net
from worker.atari_net import (
    CONV_DTYPES,
    AtariNet,
    FusedConv2dReLU,
    Int8Linear,
    bfloat16_convolutions_emulated,
    bfloat16_values,
    bound_forward,
    copy_into,
    int8_rows_numpy,
    layer_dtype,
    nhwc_columns,
    scaled_to_unit_input,
    unchanged,
    warn_if_bfloat16_is_slow,
)
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
            x = torch.tanh(layer(x.to(layer_dtype(layer))))
        return self.out(x.to(layer_dtype(self.out)))


def _fan_in(weight: torch.Tensor) -> int:
    return math.prod(weight.shape[1:])


class Policy:
    """A network plus its action head, with parameters in one contiguous float32 buffer.

    `inference_dtype` (after the exact float32 decode, so a genome is the same policy for
    every worker of a run): "float32" computes in float32; "bfloat16" runs every layer but the
    output layer on bfloat16 copies; "int8" runs the hidden dense layers with int8 weights
    (Int8Linear) and the convolutions on bfloat16 copies; "int8-static" runs the Atari net in
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
            warn_if_bfloat16_is_slow()
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
            and isinstance(module, AtariNet)
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
        bound_forward."""
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
        atari = isinstance(module, AtariNet)
        conv_dtype = CONV_DTYPES[dtype]
        # A CPU that cannot pack bfloat16 convolutions (AVX2) runs them as float32 ones on
        # bfloat16 values, rounding each output to bfloat16 (see FusedConv2dReLU).
        emulated = atari and conv_dtype == torch.bfloat16 and bfloat16_convolutions_emulated()
        if atari:
            # conv1 takes the observation as it is, its weights scaled by 1/255 instead (one
            # conversion of the input instead of three), and a reduced-precision dense layer
            # takes its columns in the channels-last conv output's order (no flatten copy).
            module.raw_input = True
            module.fc_input_nhwc = dtype != "float32"
            # Read through the module, not imported: what this host packs is probed once
            # there, and tests stand in another answer for it.
            if conv_dtype in atari_net.FUSED_CONV_DTYPES or emulated:
                conv_input_sizes = dict(
                    zip(("conv1", "conv2", "conv3"), module.conv_input_sizes, strict=True)
                )
        # The one weight whose copy is re-ordered: the dense layer's, into channels-last order.
        nhwc_fc = (
            functools.partial(nhwc_columns, shape=module.conv_output_shape)
            if atari and module.fc_input_nhwc
            else None
        )

        for name, source in leaves.items():
            layer: nn.Module
            if name == self._output_layer or (isinstance(source, nn.Linear) and dtype == "float32"):
                layer = source  # its parameters stay views of the buffer
            elif isinstance(source, nn.Linear) and dtype == "int8":
                # The Atari net's dense layer is followed by a ReLU, which fbgemm applies.
                layer = Int8Linear(source.in_features, source.out_features, relu=atari)
                weight_of = nhwc_fc if name == "fc" and nhwc_fc is not None else unchanged
                self._refresh.append(
                    lambda layer=layer, source=source, weight_of=weight_of: layer.pack(
                        weight_of(source.weight), source.bias
                    )
                )
            else:
                layer = module.get_submodule(name)
                input_size = conv_input_sizes.get(name)
                if input_size is not None:
                    layer = FusedConv2dReLU(
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
                        transform = scaled_to_unit_input
                    elif attr == "weight" and name == "fc":
                        transform = nhwc_fc
                    if emulated and is_conv:
                        transform = bfloat16_values if transform is None else (
                            lambda w, scaled=transform: bfloat16_values(scaled(w))
                        )  # fmt: skip
                    self._refresh.append(functools.partial(copy_into, target, original, transform))
                if isinstance(layer, FusedConv2dReLU):
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
            if isinstance(layer, Int8Linear):
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
        bound = bound_forward(module) if isinstance(module, AtariNet) else None
        self._forward = bound or module

    def _onnx_weights(self) -> AtariWeights:
        """The genome's weights as the onnxruntime pass takes them, transformed as the torch
        pass's copies are (conv1's 1/255; bfloat16 values and int8 rows for int8)."""
        net = self.module
        int8 = self.inference_dtype == "int8"

        def values(tensor: torch.Tensor) -> np.ndarray:
            return (bfloat16_values(tensor) if int8 else tensor).numpy()

        with torch.no_grad():
            convs = [
                (values(scaled_to_unit_input(conv.weight) if conv is net.conv1 else conv.weight),
                 values(conv.bias))
                for conv in (net.conv1, net.conv2, net.conv3)
            ]  # fmt: skip
            if int8:
                integers, row_scales = int8_rows_numpy(net.fc.weight.numpy())
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
    if not isinstance(module, AtariNet):
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
            module = AtariNet(n_out, architecture)
    engine = default_inference_engine() if inference_engine is None else inference_engine
    return Policy(module, obs_shape, action_space, inference_dtype, engine, calibration)
