"""Building a spec's policy: on the engine the registry picks, preferring the worker's, with
int8-static calibrated on the game's own frames; which engine each kind of policy got is
logged once and kept for the stats file."""

from __future__ import annotations

import logging

from neuro.envs.make import EnvHandle
from worker.evaluation.spec import EvaluationSpec
from worker.inference.policy import Policy, build_policy
from worker.inference.registry import check_preference, engine, preferred_engine
from worker.play.calibration import calibration_for

log = logging.getLogger(__name__)


class PolicyBuilder:
    """Builds policies for specs, preferring `inference_engine` (None: preferred_engine(),
    onnxruntime where it is installed); ValueError naming an engine that cannot be preferred."""

    def __init__(self, inference_engine: str | None = None) -> None:
        self.inference_engine = check_preference(
            preferred_engine() if inference_engine is None else inference_engine
        )
        self.engines_used: dict[str, str] = {}
        """"architecture/dtype" ("package.module:callable/dtype" for a user's network) -> the
        engine its policies run on here (the stats file's)."""

    def build(self, spec: EvaluationSpec, handle: EnvHandle) -> Policy:
        """A new policy for `spec`'s network on `handle`'s env (int8-static: calibrated on the
        env's own frames), on the engine the registry picks; the choice is logged once."""
        env = handle.env
        policy = build_policy(
            spec.architecture, env.observation_space, env.action_space, spec.hidden_sizes,
            spec.inference_dtype, self.inference_engine,
            calibration_for(spec.inference_dtype, spec.env_id, spec.atari_dynamics),
            spec.policy,
        )  # fmt: skip
        network = spec.policy.factory if spec.policy is not None else spec.architecture
        kind = f"{network}/{spec.inference_dtype}"
        if kind not in self.engines_used:
            self.engines_used[kind] = policy.inference_engine
            preferred = self.inference_engine
            why = ""
            if policy.inference_engine != preferred:
                # A user's module is unknown to the engines that compile a built-in network.
                serves = engine(preferred).row.architectures
                why = (
                    f" ({preferred} serves only the {', '.join(sorted(serves))} networks)"
                    if spec.architecture not in serves
                    else f" ({preferred} does not serve them)"
                )
            log.info("%s %s policies run on %s%s", network, spec.inference_dtype,
                     policy.inference_engine, why)  # fmt: skip
        return policy
