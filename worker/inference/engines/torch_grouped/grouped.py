"""Many individuals of one architecture in one forward pass: K weight sets stacked on a device.

A batch of observations is evaluated row by row under different weights: row i uses the
individual loaded in slot slots[i]. Rows are grouped by slot, so each individual's weights are
read once per step however many of its episodes are in the batch:

- the U distinct slots of a batch and the m most rows any of them has lay the batch out as an
  (m, U) grid (short groups padded with zero rows, whose outputs are dropped);
- every conv layer is ONE grouped convolution: the U individuals' inputs stacked along the
  channel axis, groups=U, their U kernels stacked along the output channels (or, built with
  convolution="unfold", one unfold and one batched matmul: unfold.py);
- every dense layer is ONE torch.baddbmm over the U individuals (m rows each).

The batch's weights are a view of the stacked tensors over the range of its slots when that
range is at most twice as wide as U (the common case: a worker fills its slots in order, and
some idle; an idle slot inside the range computes zero rows), else the U slots' weights are
gathered once per step (index_select).

The networks are those of the per-genome engines (the genome's layout, neuro/layout.py),
float32 only: outputs agree with each individual's own Policy to float32 rounding (the
summation order of a grouped convolution or a batched matmul is not that of a single one), not
bit for bit. This is the batched runner's engine (torch-grouped in the shared table).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from neuro.inference import CPU, FLOAT32, MLP_ARCHITECTURE
from neuro.layout import ATARI_CONVS, ATARI_SHAPE, atari_conv_pads
from neuro.observation_stats import normalise
from worker.inference.base import NetSpec
from worker.inference.engines.torch_grouped.unfold import Convolution, grouped_conv2d_unfold

__all__ = ["CONVOLUTIONS", "BatchedPolicies", "atari_forward", "dense", "strict_float32"]

GROUPED, UNFOLD = "grouped", "unfold"
CONVOLUTIONS: dict[str, Convolution] = {GROUPED: F.conv2d, UNFOLD: grouped_conv2d_unfold}
"""How BatchedPolicies computes its conv layers (the runner's default: grouped)."""


def strict_float32() -> None:
    """Turns TF32 off for CUDA matmuls and convolutions (process-wide torch flags).

    TF32 rounds matmul and conv inputs to 10 mantissa bits on Ampere and later GPUs (cuDNN
    convolutions use it by default). A genome must be the same policy on every worker: a
    GPU worker whose greedy actions came from 10-bit products would play a different game
    than a CPU worker given the same seeds, and an elite's re-evaluated score would depend
    on the hardware it landed on.
    """
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _as_cpu_tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor sharing `array`'s memory; a read-only array (a decoded genome) is only read."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def dense(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """x (U, m, in) through U dense layers, weight (U, out, in) and bias (U, out): (U, m, out)."""
    return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))


def atari_forward(
    x: torch.Tensor,
    params: Sequence[torch.Tensor],
    pads: Sequence[tuple[int, int, int, int]],
    strides: Sequence[int],
    conv: Convolution = F.conv2d,
) -> torch.Tensor:
    """U individuals' Atari networks at once: x (m, U*C, H, W) scaled to [0, 1], `params` the
    network's parameters in layout order, each (U, *shape); their outputs, (U, m, n_out).

    `conv` is called as F.conv2d(x, weight, bias, stride=, groups=U) with the U kernels stacked
    along the output channels (grouped_conv2d_unfold computes the same). Any dtype or memory
    format the caller gives the tensors (bench/forward_variants.py tries several).
    """
    depth, width = x.shape[0], params[0].shape[0]
    for layer, (pad, stride) in enumerate(zip(pads, strides, strict=True)):
        weight, bias = params[2 * layer], params[2 * layer + 1]
        if any(pad):
            x = F.pad(x, pad)
        x = F.relu(conv(x, weight.flatten(0, 1), bias.flatten(), stride=stride, groups=width))
    # (m, U*C', H', W') -> (U, m, C'*H'*W'): each individual's features in Policy's order.
    x = x.reshape(depth, width, -1).transpose(0, 1)
    x = F.relu(dense(x, params[6], params[7]))
    return dense(x, params[8], params[9])


class BatchedPolicies:
    """`capacity` slots of one network's weights, stacked on `device`; a call mixes slots.

    A slot holds nothing until load(). Calls return the raw network outputs (logits, or
    pre-squash Box values); the caller applies the action head.
    """

    def __init__(
        self,
        spec: NetSpec,
        capacity: int,
        device: str | torch.device = CPU,
        convolution: str = GROUPED,
    ) -> None:
        """`convolution`: how the conv layers are computed, "grouped" (one grouped convolution
        each) or "unfold" (unfold + one batched matmul each, worker/inference/engines/
        torch_grouped/unfold.py); the same outputs to float32 rounding."""
        if convolution not in CONVOLUTIONS:
            raise ValueError(
                f"convolution must be one of {', '.join(CONVOLUTIONS)}, got {convolution!r}"
            )
        if isinstance(capacity, bool) or not isinstance(capacity, int | np.integer):
            raise ValueError(f"capacity must be an int, got {capacity!r}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if spec.dtype != FLOAT32:
            raise ValueError(f"batched policies run float32 only, not {spec.dtype!r}")
        self.architecture = spec.architecture
        self.capacity = int(capacity)
        self.device = torch.device(device)
        if self.device.type == "cuda":
            # No TF32: a genome must be the same policy on a GPU worker as on a CPU one.
            strict_float32()
        self.observation_shape = tuple(spec.observation_shape)
        self.observation_norm: tuple[np.ndarray, np.ndarray] | None = None
        """(mean, std), as Policy.observation_norm: one normaliser for every slot (ES)."""
        self.parameter_layout = [(name, tuple(shape)) for name, shape in spec.layout]
        self.num_params = sum(int(np.prod(shape)) for _, shape in self.parameter_layout)
        self.convolution = convolution
        self._conv = CONVOLUTIONS[convolution]
        self._pads = atari_conv_pads(self.architecture)
        self._strides = [stride for _, _, stride in ATARI_CONVS]
        # One (capacity, *shape) tensor per parameter, in the flat layout's order.
        self._params = [
            torch.zeros((self.capacity, *shape), dtype=torch.float32, device=self.device)
            for _, shape in self.parameter_layout
        ]
        self._loaded = np.zeros(self.capacity, dtype=bool)

    def __repr__(self) -> str:
        return (
            f"BatchedPolicies({self.architecture!r}, num_params={self.num_params}, "
            f"capacity={self.capacity}, loaded={int(self._loaded.sum())}, device={self.device})"
        )

    def _check_slot(self, slot: object) -> int:
        if isinstance(slot, bool) or not isinstance(slot, int | np.integer):
            raise ValueError(f"slot must be an int, got {slot!r}")
        if not 0 <= slot < self.capacity:
            raise ValueError(f"slot {slot} is outside [0, {self.capacity})")
        return int(slot)

    def load(self, slot: int, flat: np.ndarray | torch.Tensor) -> None:
        """Copy one individual's float32 vector (Policy.parameter_layout order) into `slot`."""
        slot = self._check_slot(slot)
        if isinstance(flat, np.ndarray):
            if flat.dtype != np.float32:
                raise ValueError(f"parameters must be float32, got {flat.dtype}")
        elif isinstance(flat, torch.Tensor):
            if flat.dtype != torch.float32:
                raise ValueError(f"parameters must be float32, got {flat.dtype}")
        else:
            raise ValueError(
                f"parameters must be a float32 ndarray or tensor, got {type(flat).__name__}"
            )
        if tuple(flat.shape) != (self.num_params,):
            raise ValueError(
                f"parameters have shape {tuple(flat.shape)}, expected ({self.num_params},)"
            )
        source = _as_cpu_tensor(flat) if isinstance(flat, np.ndarray) else flat
        # One host-to-device transfer, then per-layer copies on the device.
        source = source.to(self.device)
        offset = 0
        with torch.no_grad():
            for param, (_, shape) in zip(self._params, self.parameter_layout, strict=True):
                n = param[slot].numel()
                param[slot].copy_(source[offset : offset + n].reshape(shape))
                offset += n
        self._loaded[slot] = True

    def _check_batch(self, slots: Sequence[int], observations: np.ndarray) -> np.ndarray:
        """The slots as an int64 array, after checking them against the observations."""
        if observations.ndim < 1 or observations.shape[1:] != self.observation_shape:
            raise ValueError(
                f"observation batch shape {observations.shape} does not match "
                f"(batch, *{self.observation_shape})"
            )
        for slot in slots:
            self._check_slot(slot)
        index = np.asarray(slots, dtype=np.int64).reshape(-1)
        if index.size != len(observations):
            raise ValueError(
                f"{index.size} slots given for {len(observations)} observations; "
                "one slot per observation row"
            )
        empty = index[~self._loaded[index]]
        if empty.size:
            raise ValueError(f"slot {int(empty[0])} holds no parameters: load() it first")
        return index

    def forward(self, slots: Sequence[int], observations: np.ndarray) -> torch.Tensor:
        """Raw network outputs (logits, or pre-squash Box values), (batch, n_out) on the device.

        Row i is the output of the individual in slot slots[i] for observations[i].
        """
        obs = np.asarray(observations)
        index = self._check_batch(slots, obs)
        n_out = self.parameter_layout[-1][1][0]
        if index.size == 0:
            return torch.zeros((0, n_out), dtype=torch.float32, device=self.device)
        if self.observation_norm is not None:
            mean, std = self.observation_norm
            obs = normalise(obs, mean, std).reshape(obs.shape)
        if not obs.flags.c_contiguous:
            obs = np.ascontiguousarray(obs)

        # Group rows by slot: row i goes to cell (rank[i], column[i]) of an (m, width) grid,
        # rank counting the earlier rows of the same slot.
        unique, group, counts = np.unique(index, return_inverse=True, return_counts=True)
        depth = int(counts.max())
        order = np.argsort(group, kind="stable")
        rank = np.empty_like(group)
        rank[order] = np.arange(index.size) - (np.cumsum(counts) - counts)[group[order]]
        first, span = int(unique[0]), int(unique[-1] - unique[0]) + 1
        if span <= 2 * unique.size:
            # A view of the stacked weights over the slots' range; a slot in a gap gets zero
            # rows. Reading a gap's weights costs less than gathering (read, write, read again).
            take: slice | torch.Tensor = slice(first, first + span)
            column, width = index - first, span
        else:
            take = torch.from_numpy(unique).to(self.device)
            column, width = group, unique.size

        with torch.inference_mode():
            x = _as_cpu_tensor(obs).to(self.device).to(torch.float32)
            if self.architecture == MLP_ARCHITECTURE:
                rows = self._grid(x.flatten(1), column * depth + rank, width * depth)
                out = self._mlp(rows.view(width, depth, -1), take)  # (U, m, n_out)
            else:
                grid = self._grid(x / 255.0, rank * width + column, depth * width)
                out = self._atari(grid.view(depth, width * ATARI_SHAPE[0], *ATARI_SHAPE[1:]), take)
            picks = torch.from_numpy(column * depth + rank).to(self.device)
            return out.reshape(width * depth, -1).index_select(0, picks)

    def _grid(self, x: torch.Tensor, cells: np.ndarray, size: int) -> torch.Tensor:
        """The rows of `x` placed at `cells` of a zeroed (size, ...) tensor (x itself if that
        is already the layout: no copy when each slot has one row, in slot order)."""
        if size == x.shape[0] and np.array_equal(cells, np.arange(size)):
            return x
        grid = x.new_zeros((size, *x.shape[1:]))
        grid.index_copy_(0, torch.from_numpy(cells).to(self.device), x)
        return grid

    def _take(self, i: int, take: slice | torch.Tensor) -> torch.Tensor:
        """Parameter i of the batch's U slots: (U, *shape)."""
        param = self._params[i]
        return param[take] if isinstance(take, slice) else param.index_select(0, take)

    def _dense(self, x: torch.Tensor, i: int, take: slice | torch.Tensor) -> torch.Tensor:
        """x (U, m, in) through the dense layer whose weight is parameter i: (U, m, out)."""
        return dense(x, self._take(i, take), self._take(i + 1, take))

    def _mlp(self, x: torch.Tensor, take: slice | torch.Tensor) -> torch.Tensor:
        n_hidden = len(self.parameter_layout) // 2 - 1
        for layer in range(n_hidden):
            x = torch.tanh(self._dense(x, 2 * layer, take))
        return self._dense(x, 2 * n_hidden, take)

    def _atari(self, x: torch.Tensor, take: slice | torch.Tensor) -> torch.Tensor:
        """x (m, U*C, H, W), scaled to [0, 1]: the U individuals' outputs, (U, m, n_out)."""
        params = [self._take(i, take) for i in range(len(self._params))]
        return atari_forward(x, params, self._pads, self._strides, self._conv)

    def __call__(self, slots: Sequence[int], observations: np.ndarray) -> np.ndarray:
        """forward()'s outputs as a float32 array on the host."""
        return self.forward(slots, observations).cpu().numpy()
