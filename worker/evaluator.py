"""Turns an evaluation task into episode returns; keeps envs, policies and decoders warm."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from neuro.decode import CacheBudget, GenomeDecoder
from neuro.envs.make import PAPER, EnvHandle
from neuro.layout import check_parameter_count
from neuro.noise import NoiseTableSpec, load_noise_table, noise_offset
from neuro.observation_stats import ObservationStats
from neuro.shared_store import SharedVectorStore
from worker.envs import GYM, EnvPool
from worker.envs import EnvBuildError as EnvBuildError  # the client and tests import it here
from worker.envs import NotRunnableHere as NotRunnableHere
from worker.onnx_forward import check_inference_engine, default_inference_engine
from worker.policies import Policy, build_policy
from worker.rollout import EpisodeResult, play
from worker.static_int8 import calibration_for


@dataclass(frozen=True)
class EvaluationSpec:
    """Everything needed to score a genome; a task off the wire becomes one of these."""

    env_id: str
    seeds: tuple[int, ...]
    mutation_power: float
    noise_table: NoiseTableSpec
    architecture: str
    hidden_sizes: tuple[int, ...] = ()
    atari_dynamics: str = PAPER
    episodes: int = 1
    max_episode_steps: int = 0
    env_seed: int | None = None
    perturbation: tuple[int, int, int, float] | None = None
    """ES: (version, noise index, sign, sigma) applied to the fetched parameters of version."""
    parameters_file: str | None = None
    """A saved parameter vector (.npy) to play instead of decoding `seeds`."""
    parameters_sha256: str | None = None
    inference_dtype: str = "float32"
    """Precision of the forward pass (after the float32 decode): float32, bfloat16 or int8."""
    behaviour_size: int = 0
    """> 0: each episode reports its behaviour characterisation of this many values."""
    observation_size: int = 0
    """ES with observation normalisation: the fetched version ends with the observation mean
    and std (this many values each), and the task reports its observations' sums."""


def perturbed_parameters(
    theta: np.ndarray, table: np.ndarray, noise_index: int, sign: int, sigma: float
) -> np.ndarray:
    """theta + sign * (sigma * eps(noise_index)) in float32, as the ES master defines it."""
    n = theta.size
    offset = noise_offset(noise_index, n, table.size)
    if sign == 0:
        return theta.copy()
    step = np.multiply(table[offset : offset + n], np.float32(sigma))
    return np.add(theta, np.multiply(step, np.float32(sign)))


def _without_statistics(stored: np.ndarray, num_params: int, observation_size: int) -> np.ndarray:
    """The parameters of an ES vector that may end with observation mean and std; ValueError
    unless its length is exactly that."""
    if stored.size != num_params + 2 * observation_size:
        extra = f" + 2 x {observation_size} observation statistics" if observation_size else ""
        raise ValueError(
            f"ES parameters have {stored.size} values, expected {num_params} (the policy's)" + extra
        )
    return stored[:num_params]


def load_parameters_file(path: str, sha256: str | None = None) -> np.ndarray:
    """A saved float32 parameter vector, checked against its recorded sha256."""
    theta = np.load(path, allow_pickle=False)
    if theta.dtype != np.float32 or theta.ndim != 1:
        raise ValueError(f"{path}: expected a 1-D float32 array, got {theta.dtype} {theta.shape}")
    if sha256 is not None and hashlib.sha256(theta.tobytes()).hexdigest() != sha256:
        raise ValueError(f"{path}: sha256 does not match the genome file's")
    return theta


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
        atari_engine: str = GYM,
        inference_engine: str | None = None,
    ):
        """`shared_store`: where this host's workers share decoded parents (None: private).

        `atari_engine`: "gym" or "vector" (ale-py's C++ vector env) for paper-protocol Atari.
        `inference_engine`: what runs the policies' forward pass (see Policy; None: the
        default, onnxruntime where it is installed).

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
        self.atari_engine = atari_engine
        self.inference_engine = (
            default_inference_engine() if inference_engine is None else inference_engine
        )
        check_inference_engine(self.inference_engine)
        self._envs = EnvPool(atari_engine)
        self._policies: dict[tuple, Policy] = {}
        self._decoders: OrderedDict[tuple, GenomeDecoder] = OrderedDict()  # least recent first
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

    def parameters(self, spec: EvaluationSpec, policy: Policy) -> np.ndarray:
        """The flat parameters a spec names: a saved file, an ES perturbation or a genome."""
        if spec.parameters_file is not None:
            saved = load_parameters_file(spec.parameters_file, spec.parameters_sha256)
            return _without_statistics(saved, policy.num_params, spec.observation_size)
        if spec.perturbation is not None:
            check_parameter_count(policy.num_params, spec.noise_table.size)  # before building it
            _, index, sign, sigma = spec.perturbation
            theta = _without_statistics(
                self._fetched(spec), policy.num_params, spec.observation_size
            )
            table = load_noise_table(spec.noise_table, self._noise_cache_dir)
            return perturbed_parameters(theta, table, index, sign, sigma)
        return self.decoder(spec, policy).decode(spec.seeds)

    def _fetched(self, spec: EvaluationSpec) -> np.ndarray:
        assert spec.perturbation is not None
        version = spec.perturbation[0]
        with self._es_lock:
            fetched = self._es_parameters.get(version)
        if fetched is None:
            raise ValueError(f"ES parameters of version {version} were not fetched")
        return fetched

    def observation_norm(
        self, spec: EvaluationSpec, policy: Policy
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """(mean, std) the policy normalises observations with under `spec`; None: none."""
        if not spec.observation_size:
            return None
        if spec.parameters_file is not None:
            stored = load_parameters_file(spec.parameters_file, spec.parameters_sha256)
        elif spec.perturbation is not None:
            stored = self._fetched(spec)
        else:
            raise ValueError("observation statistics come only with ES parameters")
        n, size = policy.num_params, spec.observation_size
        _without_statistics(stored, n, size)  # checks the length
        mean, std = stored[n : n + size], stored[n + size :]
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(std)) and np.all(std > 0)):
            raise ValueError("ES observation statistics must be finite, with std > 0")
        return mean, std

    def load(self, spec: EvaluationSpec, policy: Policy) -> None:
        """Loads the parameters (and observation normaliser) `spec` names into `policy`."""
        policy.load_parameters(self.parameters(spec, policy))
        policy.observation_norm = self.observation_norm(spec, policy)

    def evaluate(self, spec: EvaluationSpec) -> Evaluation:
        """Plays spec.episodes episodes; the first reset is seeded with spec.env_seed."""
        handle = self._envs.take(spec.env_id, spec.atari_dynamics, spec.behaviour_size > 0)
        try:
            policy = self._policy(spec, handle)
            self.load(spec, policy)
            episodes = play(
                policy, handle, spec.episodes, spec.max_episode_steps, spec.env_seed,
                behaviour_size=spec.behaviour_size, observation_sums=bool(spec.observation_size),
            )  # fmt: skip
        finally:
            self._envs.give(spec.env_id, spec.atari_dynamics, handle)
        return Evaluation.of(episodes)

    def _policy(self, spec: EvaluationSpec, handle: EnvHandle) -> Policy:
        key = (spec.architecture, spec.hidden_sizes, spec.env_id, spec.atari_dynamics,
               spec.inference_dtype)  # fmt: skip
        if key not in self._policies:
            env = handle.env
            self._policies[key] = build_policy(
                spec.architecture, env.observation_space, env.action_space, spec.hidden_sizes,
                spec.inference_dtype, self.inference_engine,
                calibration_for(spec.inference_dtype, spec.env_id, spec.atari_dynamics),
            )  # fmt: skip
        return self._policies[key]

    def decoder(self, spec: EvaluationSpec, policy: Policy) -> GenomeDecoder:
        """One decoder (and parent cache) per network shape, noise table and sigma."""
        key = (spec.noise_table, spec.mutation_power, spec.architecture, spec.hidden_sizes,
               spec.env_id, spec.atari_dynamics)  # fmt: skip
        decoder = self._decoders.get(key)
        if decoder is not None:
            self._decoders.move_to_end(key)
            return decoder
        # Before building the table or the init scale: a network the table cannot hold fails.
        check_parameter_count(policy.num_params, spec.noise_table.size)
        table = load_noise_table(spec.noise_table, self._noise_cache_dir)
        namespace = "|".join(map(repr, (*key, policy.num_params)))
        decoder = GenomeDecoder(
            table, policy.init_scale(), spec.mutation_power, self._decode_cache_bytes,
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
