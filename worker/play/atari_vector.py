"""The paper's Atari protocol on ale-py's C++ vector env: many episodes, one `step` call.

A `VectorGroup` owns one `AtariVectorEnv` of a game with a fixed number of sub-envs; each
`SubEnv` is one Rollout lane's env. The rollout gathers the actions of all lanes of a group
and steps them in one call, so no per-frame Python runs.

What matches the gymnasium path (`neuro.envs.make`) exactly, given the same start state and
actions: rewards, episode ends and observations (no sticky actions, skip 4 with max-pool over
the last 2 frames, 84x84 gray, stack of 4, FIRE for one agent step after reset, no reward
clipping, no life-loss termination), and frames counted as agent steps * 4 (the no-op and
FIRE frames of a reset are not counted on either path). What differs: the 0-30 no-ops at
reset are drawn by the emulator's own RNG seeded with the task's seed (mod 2**31), not by
gymnasium's `np_random`, so the same seed starts the game a different number of frames in.
Later episodes of a task continue that RNG (an unseeded reset), so a task is reproducible
from its seed on this engine alone. `tests/worker/play/test_atari_vector.py` checks both.

A pipelined group (the batched runner's two halves) is stepped as send() and receive() with
other work between; a reset then waits for restart_queued(), after the step in flight, and
a lane plays exactly what it plays on a group stepped at once (test_pipelined_vector.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from neuro.envs.make import FRAME_STACK, PAPER_FRAME_SKIP, PAPER_NOOP_MAX, SCREEN_SIZE

MAX_EMULATOR_FRAMES = 2**31 - 1
"""The emulator's own episode cap, out of the way: the rollout enforces max_episode_steps."""
SEED_MODULUS = 2**31
"""The emulator takes a signed 32-bit seed."""


@dataclass(frozen=True)
class StepResult:
    """Every sub-env's outcome of one group step; `counted` is False for a reset's FIRE."""

    observations: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    counted: np.ndarray


class VectorGroup:
    """`size` sub-envs of one game in one C++ vector env, stepped by one call."""

    def __init__(
        self,
        game: str,
        size: int,
        noop_max: int = PAPER_NOOP_MAX,
        threads: int = 1,
        pipelined: bool = False,
    ) -> None:
        """`pipelined`: the group is stepped as send() then receive(), with other work (another
        group's forward pass) in between, and every reset waits for restart_queued()."""
        from ale_py import Action
        from ale_py.vector_env import AtariVectorEnv

        if size < 1:
            raise ValueError(f"a vector group needs >= 1 sub-env, got {size}")
        self.game = game
        self.size = size
        self.env = AtariVectorEnv(
            game, size, frameskip=PAPER_FRAME_SKIP, maxpool=True, grayscale=True,
            img_height=SCREEN_SIZE, img_width=SCREEN_SIZE, stack_num=FRAME_STACK,
            noop_max=noop_max, repeat_action_probability=0.0, reward_clipping=False,
            episodic_life=False, num_threads=threads,
            max_num_frames_per_episode=MAX_EMULATOR_FRAMES,
            # The emulator's own FIRE reset presses FIRE for 1 frame, not one 4-frame agent
            # step as the gymnasium path does; the group presses it as a step instead.
            use_fire_reset=False,
            # SAME_STEP: a game-over step already returns the next episode's first frame, so
            # a lane never spends a step on a reset; its next task's seeded reset is a mask.
            autoreset_mode="SameStep",
        )  # fmt: skip
        actions = list(self.env.ale.get_action_set())
        self.fire = actions.index(Action.FIRE) if Action.FIRE in actions else None
        self.observation_space = self.env.single_observation_space
        self.action_space = self.env.single_action_space
        # Per-step bookkeeping is Python sets and dicts of the few lanes that need it, not
        # arrays over all sub-envs: a worker's group is mostly one sub-env, and each numpy
        # call on a step costs several microseconds with the caches cold.
        self._taken = np.zeros(size, dtype=bool)
        self._firing: set[int] = set()
        """Taken sub-envs whose next step presses their reset's FIRE (not an agent step)."""
        self._young: dict[int, int] = {}
        """Stacked frames that belong to the current episode's start, for the sub-envs where
        that is fewer than FRAME_STACK (the others: all of them)."""
        self._autoreset = np.zeros(size, dtype=bool)
        self._actions = np.zeros(size, dtype=np.int64)
        self._paddles = np.ones(size, dtype=np.float32)
        self._pending: np.ndarray | None = None  # the last step's observations
        self._free = list(range(size - 1, -1, -1))
        # With several emulator threads, seeded resets (each reloads the ROM, ~0.1 s) wait for
        # the group's next step and run there in one call, shared by the threads, instead of
        # one after another in the caller's thread as each task starts.
        self._defer_seeded = threads > 1 and self.fire is not None and not pipelined
        self._seeding: dict[int, int] = {}
        """Sub-envs whose seeded reset waits for the next step, and their seeds (-1: an
        unseeded reset, pipelined only)."""
        self.pipelined = pipelined
        # What the step in flight was sent with: which sub-envs pressed FIRE, which were taken.
        self._in_flight: tuple[set[int], np.ndarray] | None = None
        # Partial resets need one full reset first. Unseeded: every task's first reset is
        # seeded, and a seeded reset reloads the ROM (~0.1 s), which a group built for a
        # task would otherwise pay twice.
        self.env.reset()

    def __repr__(self) -> str:
        return f"VectorGroup({self.game!r}, taken={int(self._taken.sum())}/{self.size})"

    @property
    def free_count(self) -> int:
        """Sub-envs no task holds."""
        return len(self._free)

    def take(self) -> SubEnv | None:
        """A free sub-env, or None when all are taken."""
        if not self._free:
            return None
        index = self._free.pop()
        self._taken[index] = True
        return SubEnv(self, index)

    def give(self, sub: SubEnv) -> None:
        """Frees a sub-env; it keeps being stepped (with NOOP) but reports to no one."""
        if self._taken[sub.index]:
            self._taken[sub.index] = False
            self._firing.discard(sub.index)  # a free sub-env is stepped with NOOP
            self._seeding.pop(sub.index, None)
            self._young.pop(sub.index, None)  # ages only matter while taken
            self._free.append(sub.index)

    def reset(self, index: int, seed: int | None) -> np.ndarray:
        """Starts an episode in one sub-env: seeded, or continuing its RNG (seed None).

        A deferred seeded reset (several threads, a game with FIRE) happens at the next step,
        before its FIRE; it returns a blank observation, which no agent acts on: the episode's
        first observation is the one after FIRE, as on every path.
        """
        if seed is not None and self._defer_seeded:
            self._seeding[index] = seed % SEED_MODULUS
            self._start(index)
            return self._blank()
        if seed is None and self._autoreset[index]:
            observation = self._pending[index].copy()  # the game-over step already reset it
        elif self.pipelined:
            # The step in flight may be stepping this sub-env (for the task that left it): the
            # reset waits for restart_queued(), after that step is received. Until then the
            # sub-env is not ready, so no agent acts on this blank observation.
            self._seeding[index] = -1 if seed is None else seed % SEED_MODULUS
            self._autoreset[index] = False
            return self._blank()
        else:
            mask = np.zeros(self.size, dtype=bool)
            mask[index] = True
            seeds = np.array([-1 if seed is None else seed % SEED_MODULUS], dtype=np.int64)
            observations, _ = self.env.reset(seed=seeds, options={"reset_mask": mask})
            observation = observations[index].copy()
        self._start(index)
        return self._pad(index, observation)

    def ready(self, index: int) -> bool:
        """Whether the sub-env wants an agent action (not its reset's FIRE) this step."""
        return index not in self._firing and not (self.pipelined and index in self._seeding)

    @property
    def in_flight(self) -> bool:
        """Whether a step was sent and not yet received."""
        return self._in_flight is not None

    def step(self, actions: dict[int, int]) -> StepResult:
        """One step of every sub-env: given actions, FIRE where a reset wants it, else NOOP."""
        self.send(actions)
        return self.receive()

    def send(self, actions: dict[int, int]) -> None:
        """Starts one step of every sub-env (step()'s first half): the emulator's threads play
        it while the caller does other work, until receive()."""
        if self._in_flight is not None:
            raise RuntimeError(f"{self!r}: a step is in flight; receive() it first")
        if self._seeding and not self.pipelined:
            self._reset_queued()
        batch = self._actions
        batch.fill(0)
        for index, action in actions.items():
            batch[index] = action
        fired = self._firing
        if fired:
            self._firing = set()
            for index in fired:
                batch[index] = self.fire
        # The vector env's step() is send() + recv(); send() would build the (constant)
        # paddle strengths anew on every call.
        self._in_flight = (fired, self._taken.copy())
        self.env.ale.send(batch, self._paddles)

    def receive(self) -> StepResult:
        """Waits for the step in flight (step()'s second half); `counted` is False where the
        sub-env pressed its reset's FIRE, or (pipelined) was given back or waits for a reset
        since the step was sent: that step was not its current task's."""
        if self._in_flight is None:
            raise RuntimeError(f"{self!r}: no step in flight")
        fired, counted = self._in_flight
        self._in_flight = None
        observations, rewards, terminated, truncated, _ = self.env.ale.recv()
        if self.pipelined:
            counted &= self._taken
            for index in self._seeding:
                counted[index] = False
            # A sub-env that left or awaits its reset has no FIRE bookkeeping from this step.
            fired = {index for index in fired if self._taken[index] and index not in self._seeding}
        if fired:
            counted[list(fired)] = False
        young = self._young
        for index in list(young):
            if counted[index]:
                age = young[index] + 1
                if age < FRAME_STACK:
                    young[index] = age
                else:
                    del young[index]
        for index in fired:
            young[index] = 1  # the frame after FIRE is the gymnasium path's first one
        ended = terminated | truncated
        self._autoreset = ended
        self._pending = observations
        # Only a sub-env that fired or whose stack still holds its first frame needs more:
        # a restart when the game ended on the FIRE step, else its stack's padding.
        if fired or young:
            for index in fired | young.keys():
                if ended[index] and not counted[index]:
                    self._start(index)  # game over on the FIRE step: start again, FIRE again
                elif not ended[index]:
                    self._pad(index, observations[index])
        return StepResult(observations, rewards, terminated, truncated, counted)

    def restart_queued(self) -> dict[int, np.ndarray]:
        """(Pipelined.) Every reset that waits, in one call; the first observation of each, by
        sub-env index. Nothing may be in flight."""
        if not self._seeding:
            return {}
        if self._in_flight is not None:
            raise RuntimeError(f"{self!r}: resets wait until the step in flight is received")
        indices = sorted(self._seeding)
        observations = self._reset_queued()
        restarted = {}
        for index in indices:
            self._start(index)
            restarted[index] = self._pad(index, observations[index].copy())
        return restarted

    def _reset_queued(self) -> np.ndarray:
        """Every deferred reset, in one call (the vector env's threads share them); every
        sub-env's observation after it."""
        indices = sorted(self._seeding)
        mask = np.zeros(self.size, dtype=bool)
        mask[indices] = True
        # One seed per reset sub-env, in index order, as the vector env reads them.
        seeds = np.array([self._seeding[index] for index in indices], dtype=np.int64)
        self._seeding = {}
        observations, _ = self.env.reset(seed=seeds, options={"reset_mask": mask})
        return observations

    def _blank(self) -> np.ndarray:
        return np.zeros(self.observation_space.shape, dtype=self.observation_space.dtype)

    def _start(self, index: int) -> None:
        self._autoreset[index] = False
        if self.fire is not None:
            self._firing.add(index)
        self._young[index] = 1

    def _pad(self, index: int, observation: np.ndarray) -> np.ndarray:
        """Repeats the episode's first frame over the emulator's zero (or no-op) padding.

        The gymnasium path's frame stack starts as 4 copies of the first observation.
        """
        age = self._young.get(index, FRAME_STACK)
        if age < FRAME_STACK:
            observation[: FRAME_STACK - age] = observation[FRAME_STACK - age]
        return observation


class SubEnv:
    """One sub-env of a `VectorGroup`: a Rollout lane's env, stepped only through its group."""

    def __init__(self, group: VectorGroup, index: int) -> None:
        self.group = group
        self.index = index
        self.observation_space = group.observation_space
        self.action_space = group.action_space

    def __repr__(self) -> str:
        return f"SubEnv({self.group.game!r}, {self.index})"

    @property
    def ready(self) -> bool:
        return self.group.ready(self.index)

    def reset(self, seed: int | None = None, **_: Any) -> tuple[np.ndarray, dict]:
        """Starts an episode: seeded by the task, or (None) continuing the sub-env's RNG."""
        return self.group.reset(self.index, seed), {}

    def step(self, action: Any) -> Any:
        raise TypeError("a SubEnv is stepped through its VectorGroup, with its group's lanes")
