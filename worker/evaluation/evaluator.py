"""Turns an evaluation spec into episode returns; keeps envs, policies and decoders warm."""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from neuro.decode import CacheBudget, GenomeDecoder
from neuro.envs.make import EnvHandle
from neuro.layout import check_parameter_count, init_scale, parameter_count
from neuro.noise import load_noise_table
from neuro.observation_stats import ObservationStats
from neuro.shared_store import SharedVectorStore
from worker.evaluation.parameters import (
    load_parameters_file,
    perturbed_parameters,
    without_statistics,
)
from worker.evaluation.spec import DecoderKey, EvaluationSpec, NetworkKey
from worker.inference.base import NetSpec
from worker.inference.policy import Policy, build_policy
from worker.inference.registry import check_preference, preferred_engine
from worker.play.calibration import calibration_for
from worker.play.envs import GYM, EnvCache
from worker.play.rollout import EpisodeResult, play

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Evaluation:
    returns: list[float]
    frames: list[int]
    behaviours: list[np.ndarray] | None = None
    """Each episode's behaviour characterisation, when the task asks for them."""
    observations: ObservationStats | None = None
    """The sums of every observation the policy was fed, when the task asks for them."""
    error: str = ""
    """Set when the task's env or policy raised mid-episode: it failed, with no returns."""

    @classmethod
    def of(cls, episodes: Sequence[EpisodeResult]) -> Evaluation:
        """The returns, frames (and behaviours, observation sums) of a task's episodes."""
        behaviours = [e.behaviour for e in episodes]
        sums = [e.observations for e in episodes if e.observations is not None]
        total = None
        for stats in sums:
            total = stats if total is None else total + stats
        return cls(
            [e.total_reward for e in episodes],
            [e.frames for e in episodes],
            behaviours if all(b is not None for b in behaviours) and behaviours else None,
            total,
        )


MAX_DECODERS = 8
"""Decoders (sigma, noise table, network) an Evaluator keeps; a run uses one or two."""


class Evaluator:
    """Stateless from the master's view: caches only what can be rebuilt from a task."""

    def __init__(
        self,
        noise_cache_dir: str | None = None,
        decode_cache_bytes: int = 512 * 2**20,
        shared_store: SharedVectorStore | None = None,
        max_decoders: int = MAX_DECODERS,
        atari_backend: str = GYM,
        inference_engine: str | None = None,
    ):
        """`shared_store`: where this host's workers share decoded parents (None: private).

        `atari_backend`: "gym" or "vector" (ale-py's C++ vector env) for paper-protocol Atari
        (neuro-worker --atari-engine).
        `inference_engine`: the engine to prefer for the policies' forward pass (None:
        preferred_engine(), onnxruntime where it is installed); `engines_used` records
        which one each kind of policy got.

        `decode_cache_bytes` bounds the decoded vectors of all decoders together, and at most
        `max_decoders` decoders (each holding a noise table) are kept.
        """
        if max_decoders < 1:
            raise ValueError(f"max_decoders must be >= 1, got {max_decoders}")
        self._noise_cache_dir = noise_cache_dir
        self._decode_cache_bytes = decode_cache_bytes
        self._decode_budget = CacheBudget(decode_cache_bytes)
        self._max_decoders = max_decoders
        self._shared_store = shared_store
        self.atari_backend = atari_backend
        self.inference_engine = check_preference(
            preferred_engine() if inference_engine is None else inference_engine
        )
        self.engines_used: dict[str, str] = {}
        """"architecture/dtype" -> the engine its policies run on here (the stats file's)."""
        self._envs = EnvCache(atari_backend)
        self._policies: dict[NetworkKey, Policy] = {}
        self._decoders: OrderedDict[DecoderKey, GenomeDecoder] = OrderedDict()  # LRU first
        self._device_decoders: dict[tuple[DecoderKey, str], Any] = {}
        # ES parameter versions fetched by the link thread, read by the episode thread.
        self._es_parameters: dict[int, np.ndarray] = {}
        self._es_lock = threading.Lock()

    def has_parameters(self, version: int) -> bool:
        """Whether the ES parameters of this version are here."""
        with self._es_lock:
            return version in self._es_parameters

    def set_parameters(self, version: int, theta: np.ndarray) -> None:
        """Keeps a fetched ES parameter version (and the one before, for stragglers)."""
        theta.flags.writeable = False
        with self._es_lock:
            self._es_parameters[version] = theta
            for old in sorted(self._es_parameters)[:-2]:
                del self._es_parameters[old]

    def build_policy(self, spec: EvaluationSpec, handle: EnvHandle) -> Policy:
        """A new policy for `spec`'s network on `handle`'s env (int8-static: calibrated on the
        env's own frames), on the engine the registry picks; the choice is logged once."""
        env = handle.env
        policy = build_policy(
            spec.architecture, env.observation_space, env.action_space, spec.hidden_sizes,
            spec.inference_dtype, self.inference_engine,
            calibration_for(spec.inference_dtype, spec.env_id, spec.atari_dynamics),
        )  # fmt: skip
        kind = f"{spec.architecture}/{spec.inference_dtype}"
        if kind not in self.engines_used:
            self.engines_used[kind] = policy.inference_engine
            preferred = self.inference_engine
            why = (
                f" ({preferred} does not serve them)"
                if policy.inference_engine != preferred
                else ""
            )
            log.info("%s %s policies run on %s%s", spec.architecture, spec.inference_dtype,
                     policy.inference_engine, why)  # fmt: skip
        return policy

    def parameters(self, spec: EvaluationSpec, network: NetSpec) -> np.ndarray:
        """The flat parameters a spec names: a saved file, an ES perturbation or a genome."""
        num_params = parameter_count(network.layout)
        if spec.parameters_file is not None:
            saved = load_parameters_file(spec.parameters_file, spec.parameters_sha256)
            return without_statistics(saved, num_params, spec.observation_size)
        if spec.perturbation is not None:
            check_parameter_count(num_params, spec.noise_table.size)  # before building it
            _, index, sign, sigma = spec.perturbation
            theta = without_statistics(self._fetched(spec), num_params, spec.observation_size)
            table = load_noise_table(spec.noise_table, self._noise_cache_dir)
            return perturbed_parameters(theta, table, index, sign, sigma)
        return self.decoder(spec, network).decode(spec.seeds)

    def device_parameters(self, spec: EvaluationSpec, network: NetSpec, device: str) -> Any:
        """parameters() as a float32 tensor on a torch device: a genome's seeds decoded there
        (worker/evaluation/device_decode.py, bit for bit the host's decode) from a copy of the
        noise table kept on the device, so only the seeds cross to it; anything else through
        the host."""
        if spec.parameters_file is not None or spec.perturbation is not None:
            return self.parameters(spec, network)
        from worker.evaluation.device_decode import DEFAULT_CACHE_BYTES, TorchDecoder

        key = (spec.decoder_key, device)
        decoder = self._device_decoders.get(key)
        if decoder is None:
            num_params = check_parameter_count(parameter_count(network.layout),
                                               spec.noise_table.size)  # fmt: skip
            table = load_noise_table(spec.noise_table, self._noise_cache_dir)
            scale = init_scale(network.layout)
            assert scale.size == num_params
            decoder = TorchDecoder(table, scale, spec.mutation_power, device,
                                   cache_bytes=DEFAULT_CACHE_BYTES)  # fmt: skip
            # One network and sigma at a time on a device: the table is what costs memory.
            self._device_decoders = {key: decoder}
        return decoder.decode(spec.seeds)

    def _fetched(self, spec: EvaluationSpec) -> np.ndarray:
        assert spec.perturbation is not None
        version = spec.perturbation[0]
        with self._es_lock:
            fetched = self._es_parameters.get(version)
        if fetched is None:
            raise ValueError(f"ES parameters of version {version} were not fetched")
        return fetched

    def observation_norm(
        self, spec: EvaluationSpec, network: NetSpec
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """(mean, std) the policy normalises observations with under `spec`; None: none."""
        if not spec.observation_size:
            return None
        # Checked before the episode: a normaliser of another size would fail mid-episode as a
        # broadcast error, and the observation sums reported would be of the wrong size.
        expected = math.prod(network.observation_shape)
        if spec.observation_size != expected:
            raise ValueError(
                f"observation_size {spec.observation_size} does not match {spec.env_id}, whose "
                f"observations have {expected} values (shape {network.observation_shape})"
            )
        if spec.parameters_file is not None:
            stored = load_parameters_file(spec.parameters_file, spec.parameters_sha256)
        elif spec.perturbation is not None:
            stored = self._fetched(spec)
        else:
            raise ValueError("observation statistics come only with ES parameters")
        n, size = parameter_count(network.layout), spec.observation_size
        without_statistics(stored, n, size)  # checks the length
        mean, std = stored[n : n + size], stored[n + size :]
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(std)) and np.all(std > 0)):
            raise ValueError("ES observation statistics must be finite, with std > 0")
        return mean, std

    def load(self, spec: EvaluationSpec, policy: Policy) -> None:
        """Loads the parameters (and observation normaliser) `spec` names into `policy`; a
        spec refused here (ValueError) leaves the policy as it was."""
        norm = self.observation_norm(spec, policy.spec)
        policy.load_parameters(self.parameters(spec, policy.spec))
        policy.observation_norm = norm

    def evaluate(self, spec: EvaluationSpec) -> Evaluation:
        """Plays spec.episodes episodes; the first reset is seeded with spec.env_seed."""
        handle = self._envs.take(spec.env_id, spec.atari_dynamics, spec.behaviour_size > 0)
        try:
            policy = self._policies.get(spec.network_key)
            if policy is None:
                policy = self._policies[spec.network_key] = self.build_policy(spec, handle)
            self.load(spec, policy)
            episodes = play(
                policy, handle, spec.episodes, spec.max_episode_steps, spec.env_seed,
                behaviour_size=spec.behaviour_size, observation_sums=bool(spec.observation_size),
            )  # fmt: skip
        finally:
            self._envs.give(spec.env_id, spec.atari_dynamics, handle)
        return Evaluation.of(episodes)

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
            table, init_scale(network.layout), spec.mutation_power, self._decode_cache_bytes,
            shared=self._shared_store, shared_namespace=namespace, budget=self._decode_budget,
        )  # fmt: skip
        self._decoders[key] = decoder
        while len(self._decoders) > self._max_decoders:
            _, dropped = self._decoders.popitem(last=False)
            dropped.clear()  # its vectors leave the shared budget now, not at garbage collection
        return decoder


def mean_and_spread(values: Sequence[float]) -> str:
    import statistics

    if not values:
        return "no episodes"
    spread = statistics.pstdev(values) if len(values) > 1 else 0.0
    return (
        f"mean {statistics.fmean(values):.1f} std {spread:.1f} "
        f"min {min(values):.1f} max {max(values):.1f} over {len(values)} episodes"
    )
