"""No sequence of results the edge accepts can make the run's normaliser unusable.

Property test over the gRPC edge's own check (master.fleet.service) of the observation sums a
result carries: whatever a lease holder reports, the results it lets through add up (from the
run's prior, as ES tell() adds them) without error to sums whose float32 mean and std are
finite with std > 0, and one result never counts more observations than its episodes can have.
"""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
from hypothesis import given, settings

from master.algorithms.base import Parameters
from master.config import inspect_env_id, preset
from master.fleet.service import MAX_EPISODE_FRAMES, _extras_problem
from master.fleet.tasks import ParameterStore, task_template
from neuro.observation_stats import STD_FLOOR, ObservationStats
from neuro.v1 import evolution_pb2 as pb

SIZE = 3
STEP_LIMIT = 200
"""Pendulum-v1's time limit."""


def template():
    config = preset(inspect_env_id("Pendulum-v1"), algorithm="es", observation_norm=True,
                    pairs=2, eval_episodes=1, noise_table_size=2**16)  # fmt: skip
    norm = (np.zeros(SIZE, np.float32), np.ones(SIZE, np.float32))
    store = ParameterStore(lambda: Parameters(0, np.zeros(8, np.float32), observation_norm=norm))
    return task_template(config, store)


TEMPLATE = template()
SPECIAL = [0.0, 1.0, 1e30, -1e30, 1e45, 1e90, 1.7e308, -1.7e308, 5e-324, 1e-300]
VALUES = st.one_of(st.floats(-1e3, 1e3), st.sampled_from(SPECIAL),
                   st.floats(allow_nan=False, allow_infinity=False))  # fmt: skip
COUNTS = st.one_of(st.sampled_from([1.0, 201.0, 402.0, 4e9, 2.0**33, 1e300]), st.floats(1, 1e4))


@st.composite
def reports(draw) -> tuple[pb.TaskResult, int]:
    """A result of 1 to 3 episodes with any frames, and sums honest-looking or not."""
    episodes = draw(st.integers(1, 3))
    frames = [
        draw(st.sampled_from([0, 10, STEP_LIMIT, MAX_EPISODE_FRAMES])) for _ in range(episodes)
    ]
    count = draw(COUNTS)
    if draw(st.booleans()):
        mean = np.array([draw(VALUES) for _ in range(SIZE)])
        spread = np.array([draw(VALUES) for _ in range(SIZE)])
        with np.errstate(over="ignore", invalid="ignore"):
            total, squares = count * mean, count * (np.square(mean) + np.square(spread))
    else:
        total = np.array([draw(VALUES) for _ in range(SIZE)])
        squares = np.abs(np.array([draw(VALUES) for _ in range(SIZE)]))
    result = pb.TaskResult(task_id="v0/p/0+/0", episode_returns=[1.0] * episodes,
                           episode_frames=frames, frames=sum(frames))  # fmt: skip
    result.observation_sums.CopyFrom(
        pb.ObservationSums(count=count, sum=total.tolist(), sum_of_squares=squares.tolist())
    )
    return result, episodes


@settings(max_examples=400, deadline=None, database=None)
@given(st.lists(reports(), min_size=1, max_size=25))
def test_no_sequence_of_accepted_sums_makes_the_normaliser_unusable(reported) -> None:
    run = ObservationStats.prior(SIZE)
    for result, episodes in reported:
        if _extras_problem(result, result.task_id, "", episodes, TEMPLATE) is not None:
            continue  # refused: nothing of it reaches the run
        sums = result.observation_sums
        # One result weighs no more than its episodes can: the master's step limit, not frames.
        assert sums.count <= episodes * (STEP_LIMIT + 1)
        run = run + ObservationStats(sums.count, np.array(sums.sum), np.array(sums.sum_of_squares))
        mean, std = run.normaliser()
        assert np.isfinite(mean).all() and np.isfinite(std).all(), (mean, std)
        assert (std >= np.float32(STD_FLOOR)).all(), std
