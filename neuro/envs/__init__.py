"""neuro's own gymnasium envs: toy tasks for studying GA settings in seconds.

Ids (registered when neuro.envs is imported, gymnasium's convention, so
`gym.make("neuro.envs:neuro/Memorize-v0")` works too; the sized variants on first use):

- `neuro/Memorize-v0`: K=64 random Gaussian vectors of dimension D=16, 10 random classes;
  reward -1 per wrong answer, K steps; return = -(number wrong), 0 is perfect.
- `neuro/MemorizeUntilMistake-v0`: the same dataset, but the episode ends at the first wrong
  answer; reward +1 per right answer; return = number right before the first mistake, K is
  perfect.
- Sized variants name K, D and the task seed in the id, each part optional, in this order:
  `neuro/Memorize-K10-v0`, `neuro/MemorizeUntilMistake-K32-D8-v0`, `neuro/Memorize-K64-S7-v0`.
  An id is all a worker receives, so this is how a distributed run picks the task;
  `register_envs(env_id)` registers such an id on first use. Sizes are bounded (K up to
  2**20, D up to 2**16, K * D up to 2**24: see neuro.envs.memorize), so an absurd id fails
  before any dataset is drawn.
- `neuro/DeceptiveMaze-v0`: a point robot in a maze whose straight path to the goal ends in a
  dead end (see neuro.envs.maze); reward 0 but on the last step, return = -(final distance to
  the goal), EPISODE_STEPS steps or fewer; info["bc"] is the robot's (x, y). A task for novelty
  search: rewarding closeness to the goal leads into the dead end.

Each memorisation id is registered with max_episode_steps=K and its perfect score as
reward_threshold, so a run stops once the elite memorises the whole set. In Python,
`gym.make(id, num_examples=K, obs_dim=D, task_seed=s)` overrides the registered values, but
gymnasium still applies the id's time limit and threshold: pass `max_episode_steps=K` too when
K grows, or use a sized id. The maze's id has max_episode_steps=EPISODE_STEPS and
reward_threshold=-GOAL_RADIUS, which a return reaches exactly when the robot ends within the
goal.
"""

from __future__ import annotations

import re

import gymnasium as gym

from neuro.envs.maze import EPISODE_STEPS, GOAL_RADIUS, DeceptiveMaze
from neuro.envs.memorize import (
    DEFAULT_NUM_EXAMPLES,
    DEFAULT_OBS_DIM,
    DEFAULT_TASK_SEED,
    NUM_CLASSES,
    Memorize,
    MemorizeUntilMistake,
    check_task,
    memorize_dataset,
)

__all__ = [
    "ENTRY_POINT_PREFIX",
    "MAZE_ID",
    "NUM_CLASSES",
    "DeceptiveMaze",
    "Memorize",
    "MemorizeUntilMistake",
    "memorize_dataset",
    "register_envs",
]

ENTRY_POINT_PREFIX = "neuro.envs."
MAZE_ID = "neuro/DeceptiveMaze-v0"
_TASKS = {"Memorize": Memorize, "MemorizeUntilMistake": MemorizeUntilMistake}
_SIZED_ID = re.compile(
    r"neuro/(?P<task>Memorize|MemorizeUntilMistake)"
    r"(?:-K(?P<num_examples>\d+))?(?:-D(?P<obs_dim>\d+))?(?:-S(?P<task_seed>\d+))?-v0"
)


def register_envs(env_id: str | None = None) -> None:
    """Registers the default ids, and `env_id` too when it names a sized variant; idempotent.

    Raises ValueError naming the id when it asks for an impossible task (K0, D0, ...).
    """
    for task in _TASKS:
        _register(f"neuro/{task}-v0", task, {})
    if MAZE_ID not in gym.registry:
        gym.register(
            id=MAZE_ID,
            entry_point=f"{DeceptiveMaze.__module__}:{DeceptiveMaze.__name__}",
            max_episode_steps=EPISODE_STEPS,
            reward_threshold=-GOAL_RADIUS,
        )
    match = _SIZED_ID.fullmatch(env_id) if env_id is not None else None
    if match is not None:
        sizes = {name: int(value) for name, value in match.groupdict().items()
                 if name != "task" and value is not None}  # fmt: skip
        _register(env_id, match["task"], sizes)


def _register(env_id: str, task: str, sizes: dict[str, int]) -> None:
    if env_id in gym.registry:
        return
    settings = {
        "num_examples": DEFAULT_NUM_EXAMPLES,
        "obs_dim": DEFAULT_OBS_DIM,
        "task_seed": DEFAULT_TASK_SEED,
        **sizes,
    }
    try:
        num_examples, _, _ = check_task(**settings)
    except ValueError as error:
        raise ValueError(f"env id {env_id!r}: {error}") from None
    env_class = _TASKS[task]
    gym.register(
        id=env_id,
        entry_point=f"{env_class.__module__}:{env_class.__name__}",
        kwargs=settings,
        max_episode_steps=num_examples,
        reward_threshold=float(num_examples) if env_class.until_mistake else 0.0,
    )


register_envs()  # importing the package registers its ids, as gymnasium packages do
