"""An Atari net's torch pass bound into one function over its current weights.

A worker's step runs with its caches cold (the emulator and the dense layer's weight stream
evict them), where every Python attribute look-up, module call and argument list costs several
times what it does warm; this is where the torch engine's per-step time goes, and why the pass
is written out here rather than run through the modules.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from worker.inference.engines.torch_cpu.layers import FusedConv2dReLU, Int8Linear, layer_dtype
from worker.inference.engines.torch_cpu.nets import AtariNet


def _channels_last(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, memory_format=torch.channels_last)


def bound_forward(net: AtariNet) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """net's forward pass as one function over its current weights, the ops pre-resolved.

    The same ops in the same order as net.forward (bit-equal:
    tests/worker/inference/test_policy_and_torch_engine.py), without the module machinery
    between them. A worker's step runs with its caches cold (the
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
