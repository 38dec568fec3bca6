"""Memorisation toy tasks: label a fixed set of random Gaussian vectors, one step per vector.

The dataset is the task: K vectors of dimension D drawn from N(0, 1) with labels drawn
uniformly from 10 classes, fixed by `task_seed` through NumPy's frozen legacy stream, so every
worker, whatever its NumPy version, builds the same dataset. The episode's reset seed never
changes the dataset. By default the examples come in the dataset's order, so an episode's
return is a deterministic function of the policy: every worker scores a genome the same.

- `Memorize`: each step shows one example; reward 0 for the right class, -1 for a wrong one;
  the episode ends after K steps. Return = -(number wrong); 0 is perfect memorisation.
  There is no partial credit: a wrong class scores the same whatever the logits were.
- `MemorizeUntilMistake`: the same, but the episode ends at the first wrong answer. Reward +1
  per right answer, 0 for the wrong one. Return = number right before the first mistake,
  0 to K; K is perfect. Most random policies end at once, like a game that kills early.
"""

from __future__ import annotations

import numbers
from typing import Any

import gymnasium as gym
import numpy as np

NUM_CLASSES = 10
DEFAULT_NUM_EXAMPLES = 64
DEFAULT_OBS_DIM = 16
DEFAULT_TASK_SEED = 0
OBS_BOUND = 10.0
"""Inputs are clipped to +-OBS_BOUND so the space is bounded; N(0, 1) never gets near it."""
MAX_NUM_EXAMPLES = 2**20
"""Largest K: an episode is K steps."""
MAX_OBS_DIM = 2**16
"""Largest D: the policy's input width."""
MAX_DATASET_VALUES = 2**24
"""Largest K * D: 64 MiB of float32, 128 MiB of float64 while it is drawn. An id arrives from
the master, so a typo must fail here, not take gigabytes on every worker."""
_MAX_TASK_SEED = 2**32 - 1  # numpy.random.RandomState's seed range


def check_task(num_examples: Any, obs_dim: Any, task_seed: Any) -> tuple[int, int, int]:
    """The task's (K, D, seed) as ints, or a ValueError naming the bad value."""
    for name, value, low, high in (
        ("num_examples", num_examples, 1, None),
        ("obs_dim", obs_dim, 1, None),
        ("task_seed", task_seed, 0, _MAX_TASK_SEED),
    ):
        # bool is an Integral too, but True examples is surely a mistake.
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        if value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise ValueError(f"{name} must be {bound}, got {value}")
    k, d = int(num_examples), int(obs_dim)
    if k > MAX_NUM_EXAMPLES:
        raise ValueError(f"num_examples must be <= {MAX_NUM_EXAMPLES}, got {k}")
    if d > MAX_OBS_DIM:
        raise ValueError(f"obs_dim must be <= {MAX_OBS_DIM}, got {d}")
    if k * d > MAX_DATASET_VALUES:
        raise ValueError(
            f"num_examples * obs_dim must be <= {MAX_DATASET_VALUES}, got {k} * {d} = {k * d}"
        )
    return k, d, int(task_seed)


def memorize_dataset(
    num_examples: int = DEFAULT_NUM_EXAMPLES,
    obs_dim: int = DEFAULT_OBS_DIM,
    task_seed: int = DEFAULT_TASK_SEED,
) -> tuple[np.ndarray, np.ndarray]:
    """The task's inputs (K, D) float32 and labels (K,) int64, both read-only."""
    k, d, seed = check_task(num_examples, obs_dim, task_seed)
    # RandomState's stream is frozen across NumPy releases; Generator's is not promised to be.
    rng = np.random.RandomState(seed)
    inputs = np.clip(rng.standard_normal((k, d)), -OBS_BOUND, OBS_BOUND).astype(np.float32)
    labels = rng.randint(0, NUM_CLASSES, size=k).astype(np.int64)
    inputs.flags.writeable = False
    labels.flags.writeable = False
    return inputs, labels


class Memorize(gym.Env):
    """Classify K fixed random vectors; reward -1 per wrong answer; K steps per episode."""

    metadata: dict[str, Any] = {"render_modes": []}
    until_mistake = False

    def __init__(
        self,
        num_examples: int = DEFAULT_NUM_EXAMPLES,
        obs_dim: int = DEFAULT_OBS_DIM,
        task_seed: int = DEFAULT_TASK_SEED,
        shuffle: bool = False,
        render_mode: str | None = None,
    ) -> None:
        """`shuffle=True` presents the examples in an order drawn from the reset seed."""
        if render_mode is not None:
            raise ValueError(
                f"{type(self).__name__} cannot render; got render_mode={render_mode!r}"
            )
        if not isinstance(shuffle, bool):
            raise ValueError(f"shuffle must be True or False, got {shuffle!r}")
        self._inputs, self._labels = memorize_dataset(num_examples, obs_dim, task_seed)
        self.num_examples, self.obs_dim = self._inputs.shape
        self.task_seed = int(task_seed)
        self.shuffle = shuffle
        self.render_mode = None
        self.observation_space = gym.spaces.Box(-OBS_BOUND, OBS_BOUND, (self.obs_dim,), np.float32)
        self.action_space = gym.spaces.Discrete(NUM_CLASSES)
        self._order = np.arange(self.num_examples)
        self._position = 0
        self._mistakes = 0
        self._done = True

    @property
    def inputs(self) -> np.ndarray:
        """The task's inputs, (K, D) float32, in dataset order (read-only)."""
        return self._inputs

    @property
    def labels(self) -> np.ndarray:
        """The task's labels, (K,) int64 in [0, 10), in dataset order (read-only)."""
        return self._labels

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Starts over at the first example (of a fresh order when shuffling)."""
        super().reset(seed=seed)
        if self.shuffle:
            self._order = self.np_random.permutation(self.num_examples)
        self._position = 0
        self._mistakes = 0
        self._done = False
        return self._observation(), {"example": int(self._order[0])}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Scores the guess for the shown example and shows the next one."""
        if self._done:
            raise RuntimeError("the episode has ended; call reset() before step()")
        if not self.action_space.contains(action):
            raise ValueError(f"action must be a class in 0..{NUM_CLASSES - 1}, got {action!r}")
        correct = int(action) == int(self._labels[self._order[self._position]])
        self._position += 1
        self._mistakes += not correct
        if self.until_mistake:
            reward = 1.0 if correct else 0.0
            self._done = not correct or self._position == self.num_examples
        else:
            reward = 0.0 if correct else -1.0
            self._done = self._position == self.num_examples
        info = {"correct": correct, "mistakes": self._mistakes}
        return self._observation(), reward, self._done, False, info

    def _observation(self) -> np.ndarray:
        # After the last step there is nothing left to show: zeros, still in the space.
        if self._done:
            return np.zeros(self.obs_dim, dtype=np.float32)
        return self._inputs[self._order[self._position]].copy()


class MemorizeUntilMistake(Memorize):
    """Classify K fixed random vectors until the first wrong answer; reward +1 per right one."""

    until_mistake = True
