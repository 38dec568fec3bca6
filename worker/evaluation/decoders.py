"""The decoders a worker keeps warm: one GenomeDecoder (and parent cache) per decoder key on the
host, and one torch decoder on a device."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any

from neuro.decode import CacheBudget, GenomeDecoder
from neuro.layout import check_parameter_count, parameter_count
from neuro.noise import load_noise_table
from neuro.shared_store import SharedVectorStore
from worker.evaluation.spec import DecoderKey, EvaluationSpec
from worker.inference.base import NetSpec

MAX_DECODERS = 8
"""Decoders (sigma, noise table, network) a worker keeps; a run uses one or two."""


class Decoders:
    """Decoders by the spec's decoder key, least recently used dropped first.

    `decode_cache_bytes` bounds the decoded vectors of all decoders together, and at most
    `max_decoders` decoders (each holding a noise table) are kept. `shared_store`: where this
    host's workers share decoded parents (None: private).
    """

    def __init__(
        self,
        noise_cache_dir: str | None = None,
        decode_cache_bytes: int = 512 * 2**20,
        shared_store: SharedVectorStore | None = None,
        max_decoders: int = MAX_DECODERS,
    ) -> None:
        if max_decoders < 1:
            raise ValueError(f"max_decoders must be >= 1, got {max_decoders}")
        self._noise_cache_dir = noise_cache_dir
        self._cache_bytes = decode_cache_bytes
        self._budget = CacheBudget(decode_cache_bytes)
        self._max_decoders = max_decoders
        self._shared_store = shared_store
        self._decoders: OrderedDict[DecoderKey, GenomeDecoder] = OrderedDict()  # LRU first
        self._device_decoders: dict[tuple[DecoderKey, str], Any] = {}

    def __len__(self) -> int:
        return len(self._decoders)

    def decoder(self, spec: EvaluationSpec, network: NetSpec) -> GenomeDecoder:
        """One decoder (and parent cache) per network shape, noise table and sigma."""
        key = spec.decoder_key
        decoder = self._decoders.get(key)
        if decoder is not None:
            self._decoders.move_to_end(key)
            return decoder
        num_params = parameter_count(network.layout)
        # Before building the table or the init scale: a network the table cannot hold fails.
        check_parameter_count(num_params, spec.noise_table.size)
        table = load_noise_table(spec.noise_table, self._noise_cache_dir)
        # The host-shared store's namespace: the key's fields in their order, and the size.
        fields = [getattr(key, field.name) for field in dataclasses.fields(key)]
        namespace = "|".join(map(repr, (*fields, num_params)))
        decoder = GenomeDecoder(
            table, network.init_scale(), spec.mutation_power, self._cache_bytes,
            shared=self._shared_store, shared_namespace=namespace, budget=self._budget,
        )  # fmt: skip
        self._decoders[key] = decoder
        while len(self._decoders) > self._max_decoders:
            _, dropped = self._decoders.popitem(last=False)
            dropped.clear()  # its vectors leave the shared budget now, not at garbage collection
        return decoder

    def device_decoder(self, spec: EvaluationSpec, network: NetSpec, device: str) -> Any:
        """The torch decoder of `spec`'s seeds on `device` (worker/evaluation/device_decode.py,
        bit for bit the host's decode), over a copy of the noise table kept there."""
        from worker.evaluation.device_decode import DEFAULT_CACHE_BYTES, TorchDecoder

        key = (spec.decoder_key, device)
        decoder = self._device_decoders.get(key)
        if decoder is None:
            num_params = check_parameter_count(parameter_count(network.layout),
                                               spec.noise_table.size)  # fmt: skip
            table = load_noise_table(spec.noise_table, self._noise_cache_dir)
            scale = network.init_scale()
            assert scale.size == num_params
            decoder = TorchDecoder(table, scale, spec.mutation_power, device,
                                   cache_bytes=DEFAULT_CACHE_BYTES)  # fmt: skip
            # One network and sigma at a time on a device: the table is what costs memory.
            self._device_decoders = {key: decoder}
        return decoder
