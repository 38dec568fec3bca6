"""Pipelined vector envs (the batched runner's two halves): a step is sent, the other half's
actions are computed, then it is received; every reset waits for the step in flight. A lane
must play exactly what it plays alone, whenever it joins, on games with and without FIRE."""

from __future__ import annotations

import numpy as np
import pytest

from tests.worker.play.test_atari_vector import STEPS, Scripted, vector_handle
from worker.play.atari_vector import VectorGroup
from worker.play.envs import EnvCache
from worker.play.rollout import Rollout

# lane: (task seed, its action script's rng seed, episodes, max steps, step it joins at)
PLANS = {
    "a": (7, 0, 2, 120, 0),
    "b": (5, 1, 1, 90, 0),
    "c": (6, 2, 2, 60, 3),
    "d": (9, 3, 1, 150, 5),  # joins a group whose step is in flight
    "e": (5, 4, 3, 40, 70),  # takes a sub-env another lane has just left
}


def _alone(game: str, n_actions: int) -> dict:
    alone = {}
    for key, (seed, script, episodes, max_steps, _) in PLANS.items():
        actions = np.random.default_rng(script).integers(0, n_actions, STEPS)
        rollout, actor = Rollout(), Scripted(actions)
        handle = vector_handle(VectorGroup(game, 1))
        rollout.add(key, handle, actor, episodes, max_steps, seed=seed)
        alone[key] = (rollout.run()[key], actor.observations)
    return alone


@pytest.mark.slow  # seconds of emulation
@pytest.mark.parametrize(("game", "n_actions"), [("frostbite", 18), ("freeway", 3)])
def test_lanes_of_pipelined_halves_play_what_they_play_alone(game: str, n_actions: int) -> None:
    """Frostbite presses FIRE after every reset; Freeway has no FIRE, so its first observation
    comes straight from the reset that waited for the step in flight."""
    halves = [VectorGroup(game, 2, pipelined=True), VectorGroup(game, 2, pipelined=True)]
    assert (halves[0].fire is None) == (game == "freeway")
    rollout, actors, handles, done, step = Rollout(), {}, {}, {}, 0
    waiting = dict(PLANS)
    overlapped = 0
    while waiting or len(rollout):
        for key, (seed, script, episodes, max_steps, joins) in list(waiting.items()):
            group = max(halves, key=lambda half: half.free_count)
            if joins <= step and group.free_count:
                actors[key] = Scripted(np.random.default_rng(script).integers(0, n_actions, STEPS))
                handles[key] = vector_handle(group)
                rollout.add(key, handles[key], actors[key], episodes, max_steps, seed)
                del waiting[key]
        for key, episodes in rollout.step():
            done[key] = episodes
            sub = handles[key].env
            sub.group.give(sub)  # as the runner does: the next task may take it at once
        overlapped += all(half.in_flight for half in halves)
        step += 1
        assert step < 5000, "the rollout never finished"
    alone = _alone(game, n_actions)
    for key, (episodes, observations) in alone.items():
        assert done[key] == episodes, key
        played = actors[key].observations
        assert len(played) == len(observations), key
        assert all(np.array_equal(a, b) for a, b in zip(played, observations, strict=True)), key
    assert overlapped > 0  # both halves were stepping at once


def test_a_pipelined_group_refuses_a_second_send_and_a_reset_while_in_flight() -> None:
    group = VectorGroup("frostbite", 2, pipelined=True)
    sub = group.take()
    assert sub is not None
    blank = sub.reset(seed=3)[0]
    assert not blank.any() and not sub.ready  # no agent acts before the reset has happened
    group.send({})
    with pytest.raises(RuntimeError, match="in flight"):
        group.send({})
    with pytest.raises(RuntimeError, match="in flight"):
        group.restart_queued()
    result = group.receive()
    assert not result.counted[sub.index]  # that step was not the new task's
    first = group.restart_queued()
    assert set(first) == {sub.index} and first[sub.index].any()
    with pytest.raises(RuntimeError, match="no step in flight"):
        group.receive()


def test_env_cache_splits_pipelined_slots_into_two_balanced_halves() -> None:
    cache = EnvCache("vector", 5, pipelined=True)
    handles = [cache.take("Frostbite-v4") for _ in range(4)]
    halves = cache._groups["frostbite"]
    assert [half.size for half in halves] == [3, 2]
    assert all(half.pipelined for half in halves)
    assert [half.free_count for half in halves] == [1, 0]  # 2 and 2 taken, in turn
    cache.give("Frostbite-v4", "paper", handles[0])
    assert not EnvCache("vector", 1, pipelined=True).pipelined  # one sub-env: nothing to overlap
