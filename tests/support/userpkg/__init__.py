"""A user's own problem, as a package of its own: importing it registers its envs, gymnasium's
convention, so `userpkg:MyEnv-v0` names one to neuro-master; userpkg.nets holds the policy
factories (--policy userpkg.nets:make_policy).

Tests put tests/support on a process's PYTHONPATH to give it the package, and leave it off to
start a worker without it.
"""

from __future__ import annotations

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from .pixels import SIDES, Sides

__all__ = ["SIDES", "MyEnv", "Sides"]


class MyEnv(CartPoleEnv):
    """CartPole under the user's own name."""


if "MyEnv-v0" not in gym.registry:
    gym.register(
        "MyEnv-v0", entry_point=f"{__name__}:MyEnv", max_episode_steps=200, reward_threshold=195.0
    )
if SIDES not in gym.registry:
    gym.register(SIDES, entry_point=f"{__name__}:Sides", reward_threshold=float(Sides.STEPS))
