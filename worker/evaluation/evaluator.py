"""What a task's evaluation is (returns, frames, behaviours, observation sums, or an error), and
the Evaluator: the one surface the runners and the client turn specs into policies and
parameters through."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from neuro.envs.make import EnvHandle
from neuro.observation_stats import ObservationStats
from neuro.shared_store import SharedVectorStore
from worker.evaluation.decoders import MAX_DECODERS, Decoders
from worker.evaluation.es_parameters import EsParameterStore
from worker.evaluation.policies import PolicyBuilder
from worker.evaluation.resolver import ParameterResolver
from worker.evaluation.spec import EvaluationSpec
from worker.inference.base import NetSpec
from worker.inference.policy import Policy
from worker.play.envs import GYM, check_atari_backend
from worker.play.rollout import EpisodeResult


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
    busy_s: float = field(default=0.0, compare=False)
    """Seconds the worker spent on the task (worker.runners.base's rule): how long it took,
    not what it scored, so two evaluations of the same episodes are equal whatever it was."""

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


class Evaluator:
    """What a worker turns specs into policies and parameters with, stateless from the master's
    view (it caches only what can be rebuilt from a task): one surface over four parts, each of
    its own module: `policies` (building, the engine each kind got), `decoders`,
    `es_parameters` (fetched versions) and `resolver` (the parameters and normaliser a spec
    names)."""

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
        (neuro-worker --atari-backend), which the runners' envs are built with.
        `inference_engine`: the engine to prefer for the policies' forward pass (None:
        preferred_engine(), onnxruntime where it is installed); `engines_used` records
        which one each kind of policy got.

        `decode_cache_bytes` bounds the decoded vectors of all decoders together, and at most
        `max_decoders` decoders (each holding a noise table) are kept.
        """
        self.atari_backend = check_atari_backend(atari_backend)
        self.policies = PolicyBuilder(inference_engine)
        self.decoders = Decoders(noise_cache_dir, decode_cache_bytes, shared_store, max_decoders)
        self.es_parameters = EsParameterStore()
        self.resolver = ParameterResolver(self.decoders, self.es_parameters, noise_cache_dir)

    @property
    def inference_engine(self) -> str:
        """The engine policies prefer here."""
        return self.policies.inference_engine

    @property
    def engines_used(self) -> dict[str, str]:
        """ "architecture/dtype" -> the engine its policies run on here (the stats file's)."""
        return self.policies.engines_used

    def has_parameters(self, version: int, run: str = "") -> bool:
        """Whether the ES parameters of this version of this run are here."""
        return self.es_parameters.has(version, run)

    def set_parameters(self, version: int, theta: np.ndarray, run: str = "") -> None:
        """Keeps a fetched ES parameter version of a run (and the one before, for stragglers)."""
        self.es_parameters.put(version, theta, run)

    def build_policy(self, spec: EvaluationSpec, handle: EnvHandle) -> Policy:
        """A new policy for `spec`'s network on `handle`'s env (PolicyBuilder.build)."""
        return self.policies.build(spec, handle)

    def parameters(self, spec: EvaluationSpec, network: NetSpec) -> np.ndarray:
        """The flat parameters a spec names: a saved file, an ES perturbation or a genome."""
        return self.resolver.parameters(spec, network)

    def device_parameters(self, spec: EvaluationSpec, network: NetSpec, device: str) -> Any:
        """parameters() as a float32 tensor on a torch device, a genome's seeds decoded there."""
        return self.resolver.device_parameters(spec, network, device)

    def observation_norm(
        self, spec: EvaluationSpec, network: NetSpec
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """(mean, std) the policy normalises observations with under `spec`; None: none."""
        return self.resolver.observation_norm(spec, network)

    def load(self, spec: EvaluationSpec, policy: Policy) -> None:
        """Loads the parameters (and observation normaliser) `spec` names into `policy`; a
        spec refused here (ValueError) leaves the policy as it was."""
        self.resolver.load(spec, policy)


def mean_and_spread(values: Sequence[float]) -> str:
    """Scores as one line: mean, standard deviation, min and max (neuro-eval's summary)."""
    import statistics

    if not values:
        return "no episodes"
    spread = statistics.pstdev(values) if len(values) > 1 else 0.0
    return (
        f"mean {statistics.fmean(values):.1f} std {spread:.1f} "
        f"min {min(values):.1f} max {max(values):.1f} over {len(values)} episodes"
    )
