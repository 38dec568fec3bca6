"""The torch engine's forward pass of one network in float32, bfloat16 or int8.

The genome's float32 parameters stay where they are (the module's parameters are views of the
policy's flat vector); the pass runs on an inference copy whose layers are replaced per dtype:
"bfloat16" runs every layer but the output layer on bfloat16 copies; "int8" runs the hidden
dense layers with int8 weights (Int8Linear) and the convolutions on bfloat16 copies. The copies
are refreshed by load(). The output layer stays float32 in every dtype: it is ~0.2% of the
weights, and bfloat16 logits (8 mantissa bits) would tie often, and argmax breaks ties by
index. Convolutions run on channels-last copies of their weights in every dtype.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from neuro.inference import BFLOAT16, FLOAT32, INT8, MLP_ARCHITECTURE
from worker.inference.base import NetSpec, NetWeights
from worker.inference.engines.torch_cpu import layers
from worker.inference.engines.torch_cpu.bound import bound_forward
from worker.inference.engines.torch_cpu.layers import (
    CONV_DTYPES,
    FusedConv2dReLU,
    Int8Linear,
    bfloat16_convolutions_emulated,
    bfloat16_values,
    copy_into,
    nhwc_columns,
    scaled_to_unit_input,
    unchanged,
    warn_if_bfloat16_is_slow,
)
from worker.inference.engines.torch_cpu.nets import MLP, AtariNet


def network(spec: NetSpec) -> nn.Module:
    """The spec's module on the meta device: no memory, no init (the engine binds views)."""
    with torch.device("meta"):
        if spec.architecture == MLP_ARCHITECTURE:
            return MLP(int(np.prod(spec.observation_shape)), list(spec.hidden_sizes),
                       spec.n_outputs)  # fmt: skip
        return AtariNet(spec.n_outputs, spec.architecture)


def bind(module: nn.Module, weights: NetWeights) -> nn.Module:
    """Makes every parameter of `module` a view of `weights` (so a load is one copy into the
    flat vector, and the module sees it)."""
    names = [name for name, _ in module.named_parameters()]
    if names != list(weights):
        raise AssertionError(f"module parameters {names} are not the layout {list(weights)}")
    for name in names:
        path, _, attr = name.rpartition(".")
        view = torch.from_numpy(weights[name])
        setattr(module.get_submodule(path), attr, nn.Parameter(view, requires_grad=False))
    return module.eval()


class TorchForward:
    """A float32, bfloat16 or int8 pass over a policy's weights, on torch."""

    def __init__(self, spec: NetSpec, weights: NetWeights) -> None:
        self.dtype = spec.dtype
        if self.dtype == BFLOAT16:
            warn_if_bfloat16_is_slow()
        self.module = bind(network(spec), weights)
        """The float32 network, its parameters views of the genome's vector."""
        self._output_layer = next(reversed(list(weights))).rsplit(".", 1)[0]
        # What load() runs to bring the inference copies up to date.
        self._refresh: list[Callable[[], None]] = []
        self.inference_module = self._inference_module()
        self._forward: Callable[[torch.Tensor], torch.Tensor] = self.inference_module
        """What a call runs: the inference module, or its pass bound by bound_forward."""
        self.layer_bytes = {
            name: layer.weight_bytes
            if isinstance(layer, Int8Linear)
            else sum(p.numel() * p.element_size() for p in layer.parameters())
            for name, layer in self.inference_module.named_modules()
            if isinstance(layer, (Int8Linear, nn.Conv2d, nn.Linear))
        }
        """Bytes each layer's weights take in the dtype the pass reads them in."""

    @property
    def weight_bytes(self) -> int:
        return sum(self.layer_bytes.values())

    def load(self) -> None:
        with torch.no_grad():
            for refresh in self._refresh:
                refresh()
        module = self.inference_module
        bound = bound_forward(module) if isinstance(module, AtariNet) else None
        self._forward = bound or module

    def __call__(self, observations: np.ndarray) -> np.ndarray:
        if not (observations.flags.writeable and observations.flags.c_contiguous):
            # torch.from_numpy warns on read-only arrays (e.g. replay of a memmap).
            observations = np.array(observations, order="C")
        with torch.inference_mode():
            return self._forward(torch.from_numpy(observations)).float().numpy()

    def _inference_module(self) -> nn.Module:
        """The module the forward pass runs (see the module docstring)."""
        dtype = self.dtype
        leaves = {
            name: layer
            for name, layer in self.module.named_modules()
            if isinstance(layer, (nn.Conv2d, nn.Linear))
        }
        if dtype == FLOAT32 and not any(isinstance(m, nn.Conv2d) for m in leaves.values()):
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
            module.fc_input_nhwc = dtype != FLOAT32
            # Read through the module, not imported: what this host packs is probed once
            # there, and tests stand in another answer for it.
            if conv_dtype in layers.FUSED_CONV_DTYPES or emulated:
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
            if name == self._output_layer or (isinstance(source, nn.Linear) and dtype == FLOAT32):
                layer = source  # its parameters stay views of the buffer
            elif isinstance(source, nn.Linear) and dtype == INT8:
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
