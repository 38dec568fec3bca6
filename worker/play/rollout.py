"""The one rollout loop: episodes in several envs stepped in lockstep, pure apart from the envs.

The fleet's slots, replay, video and the benchmarks all play through `Rollout`, so an episode
scores the same wherever it is played. Envs that share an actor (episodes of one genome) share
one batched forward pass per step.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from neuro.envs.behaviour import behaviour_of
from neuro.envs.behaviour import behaviour_size as env_behaviour_size
from neuro.envs.make import EnvHandle
from neuro.observation_stats import ObservationStats
from worker.play.atari_vector import SubEnv


class Actor(Protocol):
    """Anything that maps a batch of observations (leading axis) to one action per row."""

    def act_batch(self, observations: np.ndarray) -> np.ndarray | Sequence[Any]: ...


class BatchGroup(Protocol):
    """Actors of different individuals that act together: one call for all their lanes."""

    def act_rows(self, actors: Sequence[Any], observations: np.ndarray) -> np.ndarray:
        """One action per row, row i acting as actors[i]."""
        ...


@runtime_checkable
class GroupedActor(Protocol):
    """An actor stepped with the other actors of its `batch_group` in one act_rows call (the
    batched runner's slots, worker/runners/batched.py)."""

    batch_group: BatchGroup

    def act_batch(self, observations: np.ndarray) -> np.ndarray | Sequence[Any]: ...


class FunctionActor:
    """A per-observation act function as an Actor: each row of a batch is one call."""

    def __init__(self, act: Callable[[Any], Any]) -> None:
        self._act = act

    def act_batch(self, observations: np.ndarray) -> list[Any]:
        return [self._act(observation) for observation in observations]


@dataclass
class StepTimers:
    """Where a worker's time goes; the benchmark prints these."""

    env_s: float = 0.0
    forward_s: float = 0.0
    decode_s: float = 0.0
    wait_s: float = 0.0
    """Time with every slot empty, waiting on the master for work."""
    reset_s: float = 0.0
    """A task's first, seeded reset: on the C++ engine it reloads the ROM to re-seed the
    emulator (~0.1 s), which no later, unseeded reset of the task repeats."""
    steps: int = 0
    forward_calls: int = 0
    episodes: int = 0

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class EpisodeResult:
    total_reward: float
    steps: int
    frames: int
    behaviour: np.ndarray | None = None
    """The episode's behaviour characterisation (see neuro.envs.behaviour), if asked for."""
    observations: ObservationStats | None = None
    """Sums of the observations the actor was fed this episode, if asked for."""


@dataclass(eq=False)
class _Lane:
    """One env playing a run of episodes."""

    handle: EnvHandle
    actor: Actor
    episodes: int
    max_steps: int
    discrete: bool
    observation: Any
    behaviour_size: int = 0
    sums: list[Any] | None = None
    """[count, sum, sum of squares] of the observations fed this episode, when collected."""
    info: dict[str, Any] = field(default_factory=dict)
    action: Any = None
    total: float = 0.0
    steps: int = 0
    results: list[EpisodeResult] = field(default_factory=list)
    group: BatchGroup | None = None
    """The actor's batch group, if it has one: the lanes of a group act in one call."""
    sub_env: SubEnv | None = None
    """The env as a C++ vector env's sub-env, stepped through its group; None: on its own."""

    @property
    def batch_key(self) -> int:
        """Lanes of one key share a forward pass: one actor's, or one batch group's."""
        return id(self.group if self.group is not None else self.actor)


class Rollout:
    """Plays runs of episodes in lockstep, one agent step in every env per `step()`.

    A run's first reset is seeded with its `seed`; its later episodes continue the env's RNG
    from there, so a run is reproducible from (actor, env, seed) alone.
    """

    def __init__(self, timers: StepTimers | None = None, contain_failures: bool = False) -> None:
        """`contain_failures`: a run whose env or actor raises ends alone, kept for
        take_failures(), instead of the exception ending step() for every run."""
        self.timers = timers or StepTimers()
        self._lanes: dict[Hashable, _Lane] = {}
        self._contain = contain_failures
        self._failures: list[tuple[Hashable, str]] = []

    def __repr__(self) -> str:
        return f"Rollout(runs={len(self._lanes)}, {self.timers})"

    def __len__(self) -> int:
        return len(self._lanes)

    def add(
        self,
        key: Hashable,
        handle: EnvHandle,
        actor: Actor,
        episodes: int = 1,
        max_steps: int = 0,
        seed: int | None = None,
        behaviour_size: int = 0,
        observation_sums: bool = False,
    ) -> None:
        """Resets the env (seeded) for `episodes` episodes of <= `max_steps` steps (0: no cap).

        `behaviour_size` > 0: each episode records its behaviour characterisation, which must
        have that many values; `observation_sums`: each records the sums of its observations.
        """
        if key in self._lanes:
            raise ValueError(f"a run {key!r} is already playing")
        if episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {episodes}")
        sub_env = handle.env if isinstance(handle.env, SubEnv) else None
        if behaviour_size:
            if sub_env is not None:
                raise ValueError("a vector env's sub-env has no behaviour characterisation (RAM)")
            produced = env_behaviour_size(handle.env, handle.atari)
            if produced != behaviour_size:
                raise ValueError(
                    f"the task asks for behaviours of {behaviour_size} values; this env's have "
                    f"{produced}"
                )
        started = time.perf_counter()
        observation, info = handle.env.reset(seed=seed)
        self.timers.reset_s += time.perf_counter() - started
        discrete = handle.env.action_space.shape == ()
        lane = _Lane(handle, actor, episodes, max_steps, discrete, observation, behaviour_size)
        lane.info = info
        lane.sub_env = sub_env
        lane.group = actor.batch_group if isinstance(actor, GroupedActor) else None
        if observation_sums:
            size = int(np.size(observation))
            lane.sums = [0, np.zeros(size), np.zeros(size)]
        self._lanes[key] = lane

    def remove(self, key: Hashable) -> bool:
        """Abandons a run mid-episode; False if there is none under `key`."""
        return self._lanes.pop(key, None) is not None

    def take_failures(self) -> list[tuple[Hashable, str]]:
        """Runs that ended because their env or actor raised (with contain_failures), and why."""
        failures, self._failures = self._failures, []
        return failures

    def _failed(self, keys: Sequence[Hashable], error: Exception) -> None:
        if not self._contain:
            raise error
        for key in keys:
            if self._lanes.pop(key, None) is not None:
                self._failures.append((key, f"{type(error).__name__}: {error}"))

    def step(self) -> list[tuple[Hashable, list[EpisodeResult]]]:
        """One agent step in every env; returns the runs that finished, with their episodes."""
        finished = []
        pipelined: dict[int, list[tuple[Hashable, _Lane]]] = defaultdict(list)
        rest = []
        for key, lane in self._lanes.items():
            if lane.sub_env is not None and lane.sub_env.group.pipelined:
                pipelined[id(lane.sub_env.group)].append((key, lane))
            else:
                rest.append((key, lane))
        for members in pipelined.values():
            finished += self._step_pipelined(members)
        if not rest:
            return finished
        # A vector sub-env pressing its reset's FIRE takes no agent action this step.
        started = time.perf_counter()
        self._forward([(key, lane) for key, lane in rest
                       if lane.sub_env is None or lane.sub_env.ready])  # fmt: skip
        stepped = time.perf_counter()
        self.timers.forward_s += stepped - started
        groups: dict[int, list[tuple[Hashable, _Lane]]] = defaultdict(list)
        for key, lane in rest:
            if key not in self._lanes:  # its actor failed
                continue
            if lane.sub_env is not None:
                groups[id(lane.sub_env.group)].append((key, lane))
                continue
            try:
                # Envs check actions against their space: a Discrete one wants an int.
                action = int(lane.action) if lane.discrete else lane.action
                observation, reward, terminated, truncated, info = lane.handle.env.step(action)
                lane.observation, lane.info = observation, info
                ended = self._after_step(lane, float(reward), bool(terminated or truncated))
            except Exception as error:  # the env (or its behaviour, or its reset) failed
                self._failed([key], error)
                continue
            if ended:
                del self._lanes[key]
                finished.append((key, lane.results))
        for members in groups.values():
            finished += self._step_group(members)
        self.timers.env_s += time.perf_counter() - stepped
        return finished

    def _forward(self, members: Sequence[tuple[Hashable, _Lane]]) -> None:
        """Each lane's action for its observation; lanes of one actor (one genome's episodes)
        or one batch group (worker.runners.batched's slots) share one call."""
        by_actor: dict[int, list[tuple[Hashable, _Lane]]] = defaultdict(list)
        for key, lane in members:
            by_actor[lane.batch_key].append((key, lane))
        for batch_members in by_actor.values():
            lanes = [lane for _, lane in batch_members]
            # One lane (an offspring's episode, most of a run): a view, not a copy.
            batch = (
                lanes[0].observation[None]
                if len(lanes) == 1
                else (np.stack([lane.observation for lane in lanes]))
            )
            for row, lane in enumerate(lanes):
                if lane.sums is not None:
                    observed = batch[row].astype(np.float64).ravel()
                    lane.sums[0] += 1
                    lane.sums[1] += observed
                    lane.sums[2] += observed * observed
            try:
                group = lanes[0].group
                if group is not None:
                    actions = group.act_rows([lane.actor for lane in lanes], batch)
                else:
                    actions = lanes[0].actor.act_batch(batch)
            except Exception as error:  # e.g. a policy that cannot read this observation
                self._failed([key for key, _ in batch_members], error)
                continue
            for lane, action in zip(lanes, actions, strict=True):
                lane.action = action
            self.timers.forward_calls += 1

    def _step_pipelined(self, members: list[tuple[Hashable, _Lane]]) -> list:
        """One step of a pipelined vector env's lanes: receive the step sent last time, restart
        the sub-envs whose reset waited for it, act, and send the next step without waiting
        for it. The emulator's threads play it while the caller computes the other groups'
        actions (worker.runners.batched's two halves), so neither waits for the other."""
        group = members[0][1].sub_env.group
        finished = []
        started = time.perf_counter()
        if group.in_flight:
            finished = self._absorb(members, group.receive())
        received = time.perf_counter()
        restarted = group.restart_queued()
        live = [(key, lane) for key, lane in members if self._lanes.get(key) is lane]
        for _, lane in live:
            observation = restarted.get(lane.sub_env.index)
            if observation is not None:
                lane.observation = observation
        acting = time.perf_counter()
        self.timers.reset_s += acting - received
        ready = [(key, lane) for key, lane in live if lane.sub_env.ready]
        self._forward(ready)
        sending = time.perf_counter()
        self.timers.forward_s += sending - acting
        try:
            group.send({lane.sub_env.index: int(lane.action) for key, lane in ready
                        if key in self._lanes})  # fmt: skip
        except Exception as error:  # one C++ call steps them all: they fail together
            self._failed([key for key, lane in live if key in self._lanes], error)
        self.timers.env_s += (received - started) + (time.perf_counter() - sending)
        return finished

    def _step_group(self, members: list[tuple[Hashable, _Lane]]) -> list:
        """One call steps every lane of a vector env (see worker.play.atari_vector)."""
        subs = [lane.sub_env for _, lane in members]
        group = subs[0].group
        actions = {sub.index: int(lane.action) for sub, (_, lane) in zip(subs, members, strict=True)
                   if sub.ready}  # fmt: skip
        try:
            result = group.step(actions)
        except Exception as error:  # one C++ call steps them all: they fail together
            self._failed([key for key, _ in members], error)
            return []
        return self._absorb(members, result)

    def _absorb(self, members: list[tuple[Hashable, _Lane]], result: Any) -> list:
        """A vector env's step result into its lanes; the runs it finished."""
        finished = []
        for key, lane in members:
            if self._lanes.get(key) is not lane:  # removed, or failed, since the step was sent
                continue
            index = lane.sub_env.index
            # A view: the vector env returns new arrays on every step, and a lane's observation
            # is read (by the forward pass) before the group's next step replaces it.
            lane.observation = result.observations[index]
            if not result.counted[index]:
                continue
            over = bool(result.terminated[index] or result.truncated[index])
            try:
                ended = self._after_step(lane, float(result.rewards[index]), over)
            except Exception as error:
                self._failed([key], error)
                continue
            if ended:
                del self._lanes[key]
                finished.append((key, lane.results))
        return finished

    def _after_step(self, lane: _Lane, reward: float, over: bool) -> bool:
        """Counts one agent step; True when it ended the lane's run."""
        lane.total += reward
        lane.steps += 1
        self.timers.steps += 1
        return (over or lane.steps == lane.max_steps) and self._end_episode(lane)

    def run(self) -> dict[Hashable, list[EpisodeResult]]:
        """Steps until every run has finished; their episodes by key."""
        done: dict[Hashable, list[EpisodeResult]] = {}
        while self._lanes:
            done.update(self.step())
        return done

    def _end_episode(self, lane: _Lane) -> bool:
        """Records the episode; starts the run's next one. True when the run is done."""
        frames = lane.handle.frames_used(lane.steps)
        behaviour = observations = None
        if lane.behaviour_size:
            handle = lane.handle
            behaviour = behaviour_of(handle.env, handle.atari, lane.observation, lane.info)
            if behaviour.size != lane.behaviour_size or not np.all(np.isfinite(behaviour)):
                raise ValueError(
                    f"the env's behaviour characterisation has {behaviour.size} values (finite: "
                    f"{bool(np.all(np.isfinite(behaviour)))}); the task asks for "
                    f"{lane.behaviour_size} finite values"
                )
        if lane.sums is not None:
            count, total, squares = lane.sums
            observations = ObservationStats(float(count), total, squares)
            lane.sums = [0, np.zeros_like(total), np.zeros_like(squares)]
        lane.results.append(EpisodeResult(lane.total, lane.steps, frames, behaviour, observations))
        self.timers.episodes += 1
        lane.total, lane.steps = 0.0, 0
        if len(lane.results) == lane.episodes:
            return True
        # Later episodes continue the env's RNG from the run's one seeded reset.
        lane.observation, lane.info = lane.handle.env.reset()
        return False


def play(
    actor: Actor,
    handle: EnvHandle,
    episodes: int = 1,
    max_steps: int = 0,
    seed: int | None = None,
    timers: StepTimers | None = None,
    behaviour_size: int = 0,
    observation_sums: bool = False,
) -> list[EpisodeResult]:
    """Plays one run of `episodes` episodes in one env (the replay and video path)."""
    rollout = Rollout(timers)
    rollout.add("run", handle, actor, episodes, max_steps, seed, behaviour_size, observation_sums)
    return rollout.run()["run"]


def run_episode(
    act: Callable[[Any], Any],
    handle: EnvHandle,
    max_steps: int = 0,
    seed: int | None = None,
) -> EpisodeResult:
    """Plays until the env ends the episode or `max_steps` agent steps (0: no cap) pass.

    `seed` seeds the reset; None continues the env's RNG, so a sequence of episodes started
    from one seeded reset is reproducible.
    """
    return play(FunctionActor(act), handle, 1, max_steps, seed)[0]
