"""Genome decoding on a torch device, bit-identical to neuro.decode's CPU decoder.

The batched runner on a CUDA device decodes its tasks' genomes here (Evaluator.
device_parameters), from a copy of the noise table kept on the device: only the seeds cross.

The same definition as neuro/decode.py, over a copy of the noise table on the device:

    theta_0 = table[o_0 : o_0 + n] * init_scale
    theta_k = theta_{k-1} + sigma * table[o_k : o_k + n]
    o_i = noise_offset(seeds[i], n, len(table))

Bit-identical because both sides run the same float32 operations in the same order, each one
IEEE-rounded on its own: a multiply into a temporary, then an add. Never torch.add(alpha=),
torch.addcmul or anything else that computes `theta + sigma * eps` in one kernel: those may
use a fused multiply-add (one rounding instead of two; ATen's CPU add-with-alpha does), which
changes the last bit of some parameters and so the policy a genome stands for. Elementwise
float32 multiplies and adds are correctly rounded on every device torch runs on, so summation
order is the only thing to keep (and an elementwise op has none); denormals are kept, as numpy
keeps them, unless someone calls torch.set_flush_denormal(True).

TorchDecoder caches decoded vectors on the device like neuro.decode.GenomeDecoder, smaller: an
LRU bounded by bytes, children entering at the cold end (a stream of children does not evict
the parents they share), only the last few children kept, a miss resuming from the nearest
cached ancestor. No host-shared store and no budget shared between decoders.
"""

from __future__ import annotations

import math
import warnings
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import torch

from neuro.decode import CachedDecoder, DecodeStats
from neuro.genome import Genome, check_seeds
from neuro.noise import noise_offset

__all__ = ["DEFAULT_CACHE_BYTES", "TorchDecoder", "decode_genome_torch", "device_table"]

DEFAULT_CACHE_BYTES = 256 * 2**20
"""Device memory for cached vectors: 16 of the paper's 4M-parameter network."""


def device_table(table: np.ndarray | torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """The noise table as a 1-D float32 tensor on `device`, copied there once.

    On the CPU a numpy table (the read-only memory map of neuro.noise) is shared, not copied;
    it is only ever read. Pass the result to several TorchDecoders (one per mutation power or
    network) so they share one copy.
    """
    device = torch.device(device)
    if isinstance(table, np.ndarray):
        if table.dtype != np.float32 or table.ndim != 1:
            raise ValueError(f"noise table must be 1-D float32, got {table.dtype} {table.shape}")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            host = torch.from_numpy(table)
        return host.to(device)
    if isinstance(table, torch.Tensor):
        if table.dtype != torch.float32 or table.dim() != 1:
            raise ValueError(
                f"noise table must be 1-D float32, got {table.dtype} {tuple(table.shape)}"
            )
        return table.to(device)
    raise ValueError(f"noise table must be an ndarray or a tensor, got {type(table).__name__}")


def _sigma32(mutation_power: float) -> float:
    """The mutation power rounded to float32 (as neuro.decode does), as a Python float.

    The float32 value is exact as a double, and the product of two float32 values is exact
    in double: whether torch multiplies by it in float32 or double, the result rounds once
    to the same float32.
    """
    if not (math.isfinite(mutation_power) and mutation_power >= 0):
        raise ValueError(f"mutation_power must be finite and >= 0, got {mutation_power}")
    return float(np.float32(mutation_power))


def _seeds(genome: Genome | Sequence[int]) -> tuple[int, ...]:
    return check_seeds(genome.seeds if isinstance(genome, Genome) else genome)


def _init_scale(init_scale: np.ndarray | torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    if isinstance(init_scale, np.ndarray):
        if init_scale.dtype != np.float32 or init_scale.ndim != 1:
            raise ValueError(
                f"init_scale must be 1-D float32, got {init_scale.dtype} {init_scale.shape}"
            )
        scale = torch.from_numpy(np.ascontiguousarray(init_scale))
    elif isinstance(init_scale, torch.Tensor):
        if init_scale.dtype != torch.float32 or init_scale.dim() != 1:
            raise ValueError(
                f"init_scale must be 1-D float32, got {init_scale.dtype} {tuple(init_scale.shape)}"
            )
        scale = init_scale
    else:
        raise ValueError(f"init_scale must be an ndarray or a tensor, got {type(init_scale)}")
    noise_offset(0, scale.numel(), table.numel())  # raises if the table is too small
    return scale.to(table.device).contiguous()


class TorchDecoder(CachedDecoder):
    """Decodes genomes on the noise table's device, with a byte-bounded cache of vectors.

    `table`: the host table (numpy, copied to `device` here) or a tensor from device_table()
    (shared, not copied). `init_scale`: Policy.init_scale(). `cache_bytes` 0 turns the cache
    off (unlike GenomeDecoder, which keeps its newest vector even over budget: device memory
    is the scarcer).

    decode() returns the cached tensor itself: treat it as read-only (torch has no read-only
    flag); clone it before changing it in place.
    """

    def __init__(
        self,
        table: np.ndarray | torch.Tensor,
        init_scale: np.ndarray | torch.Tensor,
        mutation_power: float,
        device: str | torch.device | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        max_children: int = 8,
    ) -> None:
        if cache_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0, got {cache_bytes}")
        if max_children < 0:
            raise ValueError(f"max_children must be >= 0, got {max_children}")
        self._sigma = _sigma32(mutation_power)
        self.mutation_power = float(mutation_power)
        if device is None:
            device = table.device if isinstance(table, torch.Tensor) else "cpu"
        self.table = device_table(table, device)
        self.init_scale = _init_scale(init_scale, self.table)
        self.cache_bytes = cache_bytes
        self.max_children = max_children
        self.stats = DecodeStats()
        self._cache: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()
        self._children: OrderedDict[tuple[int, ...], None] = OrderedDict()
        self._cached_bytes = 0
        self._tmp = torch.empty_like(self.init_scale)

    @property
    def device(self) -> torch.device:
        """Where the table, and every decoded vector, lives."""
        return self.table.device

    @property
    def num_params(self) -> int:
        """Length of every decoded vector."""
        return self.init_scale.numel()

    @property
    def cached_bytes(self) -> int:
        """Bytes of device memory the cached vectors take."""
        return self._cached_bytes

    def __contains__(self, genome: Genome | Sequence[int]) -> bool:
        return tuple(int(s) for s in getattr(genome, "seeds", genome)) in self._cache

    def __repr__(self) -> str:
        return (
            f"TorchDecoder(num_params={self.num_params}, device={self.device}, "
            f"cached={len(self._cache)}, cached_bytes={self._cached_bytes}, stats={self.stats})"
        )

    def _slice(self, seed: int) -> torch.Tensor:
        n = self.num_params
        offset = noise_offset(seed, n, self.table.numel())
        return self.table[offset : offset + n]

    def _extend(self, base: torch.Tensor | None, key: tuple[int, ...], start: int) -> torch.Tensor:
        """The vector of `key`, applying key[start:] to `base` (None: from scratch)."""
        if base is None:
            theta = torch.mul(self._slice(key[0]), self.init_scale)
            start = 1
        else:
            theta = base.clone()
        for seed in key[start:]:
            # Two roundings, as numpy: the product into a temporary, then the sum.
            torch.mul(self._slice(seed), self._sigma, out=self._tmp)
            theta.add_(self._tmp)
        return theta

    def decode(self, genome: Genome | Sequence[int]) -> torch.Tensor:
        """The float32 parameter vector of a genome (a seed list or a Genome), on the device.

        Identical, bit for bit, to neuro.decode.decode_genome of the same table, init_scale,
        mutation power and seeds.
        """
        return self._decode_key(_seeds(genome))

    @property
    def _keeps_parents(self) -> bool:
        return bool(self.cache_bytes)

    def _drop(self, key: tuple[int, ...]) -> None:
        old = self._cache.pop(key, None)
        self._children.pop(key, None)
        if old is not None:
            self._cached_bytes -= old.numel() * old.element_size()

    def _insert(self, key: tuple[int, ...], theta: torch.Tensor, hot: bool) -> None:
        nbytes = theta.numel() * theta.element_size()
        if key in self._cache or nbytes > self.cache_bytes:
            return
        while self._cached_bytes + nbytes > self.cache_bytes:
            self._drop(next(iter(self._cache)))  # the least recently used
        self._cache[key] = theta
        self._cached_bytes += nbytes
        if not hot:
            self._cache.move_to_end(key, last=False)
            self._children[key] = None
            while len(self._children) > self.max_children:
                self._drop(next(iter(self._children)))


def decode_genome_torch(
    table: np.ndarray | torch.Tensor,
    init_scale: np.ndarray | torch.Tensor,
    mutation_power: float,
    genome: Genome | Sequence[int],
) -> torch.Tensor:
    """Decode a genome from scratch (no cache) on the table's device: a new float32 tensor.

    The torch twin of neuro.decode.decode_genome; a numpy `table` decodes on the CPU.
    """
    return TorchDecoder(table, init_scale, mutation_power, cache_bytes=0).decode(genome)
