"""The tiny CartPole runs the tests use: one place for their settings, in-process and on the CLI."""

from __future__ import annotations

from typing import Any

from master.config import RunConfig, inspect_env_id, preset

CARTPOLE = inspect_env_id("CartPole-v1")
# A GA run of two generations over six genomes; the env's target (475) stays unless overridden.
TINY_GA: dict[str, Any] = {"generations": 2, "population_size": 6, "truncation": 2,
                           "elite_candidates": 2, "elite_episodes": 2}  # fmt: skip
# The same kind of run for `python -m master` (tests add --generations, --population, ...).
TINY_CARTPOLE_ARGS: tuple[str, ...] = ("--env", "CartPole-v1", "--elite-candidates", "2",
                                       "--elite-episodes", "2", "--no-target")  # fmt: skip


def tiny_cartpole(**overrides: Any) -> RunConfig:
    """A tiny CartPole GA run (TINY_GA) with `overrides` on top."""
    return preset(CARTPOLE, **{**TINY_GA, **overrides})
