"""A problem of your own: importing the package registers its env, gymnasium's convention, so
`mypkg:MyEnv-v0` names it to gymnasium.make, neuro-master and neuro.train alike."""

from __future__ import annotations

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

__all__ = ["ShortPoleCartPole"]


class ShortPoleCartPole(CartPoleEnv):
    """CartPole with a pole half as long, which falls faster, and a weaker push."""

    def __init__(self, render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode)
        self.length = 0.25  # half the pole's length (CartPole's: 0.5)
        self.polemass_length = self.masspole * self.length
        self.force_mag = 5.0  # CartPole's: 10


if "MyEnv-v0" not in gym.registry:
    gym.register(
        "MyEnv-v0",
        entry_point=f"{__name__}:ShortPoleCartPole",
        max_episode_steps=300,
        reward_threshold=290.0,
    )
