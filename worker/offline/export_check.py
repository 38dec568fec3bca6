"""neuro-export --check: the exported file's greedy actions against neuro-eval's on the same
observations, over real episodes of the genome's env.

neuro-eval's policy (the genome's own dtype, a worker's default engine, the gymnasium env)
plays; at every step the exported file is asked for its action on the same observation, and
the steps where the two differ are counted. For a Box action space "differ" means by more than
BOX_TOLERANCE of the box's range (the tanh of two runtimes may differ in the last bits).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np

from worker.evaluation.evaluator import Evaluator
from worker.inference.policy import Policy
from worker.offline.export import ONNX, SAFETENSORS, SUFFIXES
from worker.offline.loading import GenomeSource, genome_spec
from worker.play.envs import build_env
from worker.play.rollout import play

BOX_TOLERANCE = 1e-5
"""Largest difference between two box actions, as a share of the box's range, that is equal."""


@dataclass(frozen=True)
class Agreement:
    """How often the exported file chose neuro-eval's action."""

    steps: int
    differing: int
    """Steps whose actions differ."""
    returns: list[float]
    """The episodes neuro-eval's policy played, the first reset seeded as neuro-eval --seed."""
    replay_dtype: str
    """The dtype neuro-eval replays the genome in (the genome's own)."""

    @property
    def agreeing(self) -> float:
        """The share of steps with the same action."""
        return 1.0 - self.differing / self.steps if self.steps else 1.0

    def __str__(self) -> str:
        mean = sum(self.returns) / len(self.returns) if self.returns else float("nan")
        return (
            f"{self.steps - self.differing} of {self.steps} steps ({self.agreeing:.2%}) chose "
            f"neuro-eval's action ({self.replay_dtype} replay, {len(self.returns)} episodes, "
            f"mean return {mean:g})"
        )


class _Comparing:
    """neuro-eval's policy as the actor, asking the exported file on every observation."""

    def __init__(self, replayed: Policy, exported: Callable[[np.ndarray], np.ndarray]) -> None:
        self.replayed = replayed
        self.exported = exported
        self.steps = 0
        self.differing = 0
        space = replayed.action_space
        self._tolerance = (
            BOX_TOLERANCE * float(np.max(space.high - space.low))
            if isinstance(space, gym.spaces.Box)
            else None
        )

    def act_batch(self, observations: np.ndarray) -> np.ndarray:
        actions = self.replayed.act_batch(observations)
        other = np.asarray(self.exported(np.asarray(observations)))
        if self._tolerance is None:
            same = np.equal(actions, other)
        else:
            difference = np.abs(actions.astype(np.float64) - other.astype(np.float64))
            same = difference.reshape(len(actions), -1).max(axis=1) <= self._tolerance
        self.steps += len(actions)
        self.differing += int(np.count_nonzero(~same))
        return actions


def exported_actions(
    model: str | os.PathLike, genome: GenomeSource
) -> Callable[[np.ndarray], np.ndarray]:
    """The greedy actions of an exported file: ONNX on ONNX Runtime; safetensors loaded into
    neuro.load_policy's module for the genome."""
    suffix = Path(model).suffix
    if suffix == SUFFIXES[ONNX]:
        from worker.offline.onnx_graph import model_actions

        return model_actions(model)
    if suffix == SUFFIXES[SAFETENSORS]:
        from safetensors.torch import load_file

        from worker.offline.loading import load_policy

        module = load_policy(genome)
        module.network.load_state_dict(load_file(str(model)))
        return module.act
    raise ValueError(f"{str(model)!r} is neither an .onnx nor a .safetensors file")


def check_export(
    model: str | os.PathLike, genome: GenomeSource, steps: int, seed: int = 0
) -> Agreement:
    """Plays whole episodes of `genome` with neuro-eval's policy until at least `steps` steps
    (the first reset seeded with `seed`), comparing the exported file's action at each."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    spec = genome_spec(genome)
    exported = exported_actions(model, genome)
    evaluator = Evaluator()
    handle = build_env(spec.env_id, spec.atari_dynamics)
    try:
        policy = evaluator.build_policy(spec, handle)
        evaluator.load(spec, policy)
        actor = _Comparing(policy, exported)
        returns: list[float] = []
        while actor.steps < steps:
            first = seed if not returns else None  # later episodes continue the env's RNG
            (episode,) = play(actor, handle, 1, spec.max_episode_steps, first)
            returns.append(episode.total_reward)
    finally:
        handle.env.close()
    return Agreement(actor.steps, actor.differing, returns, spec.inference_dtype)
