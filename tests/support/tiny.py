"""THE tiny CartPole configs for tests: one place for their settings, in process and on the CLI.

A test that needs a small CartPole run takes it from here (`tiny_cartpole(**overrides)`, or
`LOCAL_CARTPOLE_ARGS` for `python -m master`) instead of spelling out its own settings; it
passes explicitly the values its assertions count on (e.g. population_size for N + K x E).
Tests whose point is a particular shape (the chaos test's N, K, E) keep their own.
"""

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
# That run on one machine: one local worker, a free port (tests add --population, --run-dir, ...).
LOCAL_CARTPOLE_ARGS: tuple[str, ...] = (*TINY_CARTPOLE_ARGS, "--local-workers", "1",
                                        "--port", "0")  # fmt: skip


def tiny_cartpole(**overrides: Any) -> RunConfig:
    """A tiny CartPole GA run (TINY_GA) with `overrides` on top."""
    return preset(CARTPOLE, **{**TINY_GA, **overrides})


# Elite tasks of 300 CartPole episodes each, one generation of 4 + 2 x 300 evaluations: long
# enough for a test to catch a worker mid-task (it sets lease_seconds to suit).
LONG_ELITE_TASKS: dict[str, Any] = {"generations": 1, "population_size": 4, "truncation": 2,
                                    "elite_candidates": 2, "elite_episodes": 300,
                                    "episodes_per_task": 300, "target_score": None}  # fmt: skip


def long_elite_tasks(**overrides: Any) -> RunConfig:
    """A CartPole GA run whose elite tasks are long (LONG_ELITE_TASKS) with `overrides` on top."""
    return preset(CARTPOLE, **{**LONG_ELITE_TASKS, **overrides})
