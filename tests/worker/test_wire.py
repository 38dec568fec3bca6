"""The worker's side of the wire: a leased Task becomes plain values once, and a finished task a
TaskResult the master reads back exactly."""

from __future__ import annotations

import numpy as np
import pytest

from neuro.observation_stats import ObservationStats
from neuro.v1 import evolution_pb2 as pb
from neuro.wire import ATARI_DYNAMICS_TO_WIRE, MAX_ERROR_CHARS
from worker.client import wire
from worker.client.held import HeldTasks
from worker.client.wire import LeasedTask, failed_result, leased_task, task_result
from worker.evaluation.evaluator import Evaluation

TABLE = pb.NoiseTableSpec(seed=123, size=2**16)


def _task(task_id: str = "g0/o/0/0", seeds: tuple[int, ...] = (1, 2), **fields) -> pb.Task:
    """A GA task as master/fleet/tasks.py builds one; `fields` replace its own."""
    defaults = {
        "task_id": task_id, "run_id": "run-1", "episodes": 1, "lease_seconds": 30.0,
        "env": pb.EnvSpec(env_id="CartPole-v1"),
        "policy": pb.PolicySpec(architecture="mlp", hidden_sizes=[8]),
        "genome": pb.Genome(seeds=list(seeds), mutation_power=0.05, noise_table=TABLE),
    }  # fmt: skip
    return pb.Task(**{**defaults, **fields})


def _counting_conversions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    convert = wire.spec_from_task

    def counting(task: pb.Task):
        calls.append(task.task_id)
        return convert(task)

    monkeypatch.setattr(wire, "spec_from_task", counting)
    return calls


# -- a leased Task, once -----------------------------------------------------------------------


def test_a_task_is_converted_once_however_often_the_scheduler_asks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _counting_conversions(monkeypatch)
    tasks = [leased_task(_task(f"g0/e/0/{i}", seeds=(7, 9))) for i in range(3)]
    tasks.append(leased_task(_task("g0/o/1/0", seeds=(7, 11))))
    assert calls == [t.task_id for t in tasks]
    held = HeldTasks(slots=4, prefetch=1, batched=False)
    held.inbox.extend(tasks)
    for _ in range(50):  # the main loop asks on every step while tasks wait
        held.room()
        held.take_startable(0)
    started = held.take_startable(4)
    # The three episodes of one genome start together; the other genome waits its turn.
    assert [t.task_id for t in started] == ["g0/e/0/0", "g0/e/0/1", "g0/e/0/2"]
    assert [t.task_id for t in held.inbox] == ["g0/o/1/0"]
    assert len(calls) == 4


def test_a_leased_task_carries_plain_values_and_its_spec() -> None:
    task = leased_task(_task())
    assert isinstance(task, LeasedTask)
    assert (task.task_id, task.run_id, task.env_id) == ("g0/o/0/0", "run-1", "CartPole-v1")
    assert task.lease_seconds == 30.0 and task.parameters is None and task.refusal == ""
    assert task.spec is not None and task.spec.seeds == (1, 2)
    assert task.genome_key == task.spec.genome_key
    assert not any(isinstance(value, pb.Task) for value in vars(task).values())


def test_an_es_task_names_the_parameter_version_to_fetch() -> None:
    task = _task(genome=pb.Genome(noise_table=TABLE))
    es = task.perturbation
    es.version, es.noise_index, es.sign, es.sigma = 3, 5, 1, 0.02
    es.parameters_sha256, es.num_params, es.observation_size = "ab" * 32, 100, 4
    leased = leased_task(task)
    # The version is of the task's run: a master serving several numbers each one's from 0.
    assert leased.parameters == wire.ParameterVersion(3, "ab" * 32, 100 + 2 * 4, task.run_id)
    assert task.run_id and leased.spec is not None
    assert leased.spec.perturbation_run == task.run_id
    es.num_params = 0  # a master that does not say
    assert leased_task(task).parameters == wire.ParameterVersion(3, "ab" * 32, None, "run-1")


def test_a_refused_task_keeps_its_reason_and_is_an_individual_of_its_own() -> None:
    """Refused when its lease arrives (here: a 4 TiB noise table), it fails naming the value
    when it starts; it shares no genome key with another refused task."""
    huge = pb.NoiseTableSpec(seed=1, size=2**40)
    first = leased_task(_task("a", genome=pb.Genome(seeds=[1], noise_table=huge)))
    second = leased_task(_task("b", genome=pb.Genome(seeds=[1], noise_table=huge)))
    assert first.spec is None and str(2**40) in first.refusal
    assert first.genome_key != second.genome_key
    result = failed_result(first, first.refusal)
    assert (result.task_id, result.run_id, result.error) == ("a", "run-1", first.refusal)
    unknown = leased_task(_task(env=pb.EnvSpec(env_id="Frostbite-v4", atari_dynamics=7)))
    assert unknown.spec is None
    assert unknown.refusal.startswith("atari dynamics 7 is not one this worker plays")


def test_a_task_s_atari_dynamics_reads_through_the_shared_map() -> None:
    for name, value in ATARI_DYNAMICS_TO_WIRE.items():
        assert wire.atari_dynamics(value) == name
    # A task with the field unset: non-Atari, or a master from before it.
    assert wire.atari_dynamics(pb.ATARI_DYNAMICS_UNSPECIFIED) == "paper"
    with pytest.raises(ValueError, match="atari dynamics 7 is not one this worker plays"):
        wire.atari_dynamics(7)


# -- a finished task, to the master ------------------------------------------------------------


def _round_trip(result: pb.TaskResult) -> pb.TaskResult:
    return pb.TaskResult.FromString(result.SerializeToString())


def test_an_evaluation_round_trips_returns_frames_behaviours_and_observation_sums() -> None:
    task = leased_task(_task())
    observations = ObservationStats(
        count=5, total=np.array([1.5, -2.0, 0.25]), squares=np.array([4.0, 9.0, 0.5])
    )
    evaluation = Evaluation(
        returns=[12.0, -3.5], frames=[40, 8],
        behaviours=[np.array([0.5, 1.0], np.float32), np.array([-1.0, 2.0], np.float32)],
        observations=observations,
    )  # fmt: skip
    result = _round_trip(task_result(task, evaluation))
    assert (result.task_id, result.run_id, result.error) == ("g0/o/0/0", "run-1", "")
    assert list(result.episode_returns) == [12.0, -3.5]
    assert list(result.episode_frames) == [40, 8] and result.frames == 48
    # Behaviours travel flat, episode after episode; the master reshapes them by its BC size.
    assert list(result.behaviours) == [0.5, 1.0, -1.0, 2.0]
    sums = result.observation_sums
    assert sums.count == 5
    np.testing.assert_array_equal(sums.sum, observations.total)
    np.testing.assert_array_equal(sums.sum_of_squares, observations.squares)


def test_an_evaluation_without_extras_sends_none() -> None:
    result = _round_trip(task_result(leased_task(_task()), Evaluation([1.0], [10])))
    assert not result.behaviours and not result.HasField("observation_sums")


@pytest.mark.parametrize("error", ["env raised: boom", "y" * (1 << 20)])
def test_an_error_travels_alone_and_bounded(error: str) -> None:
    task = leased_task(_task())
    for result in (task_result(task, Evaluation([], [], error=error)), failed_result(task, error)):
        assert not result.episode_returns and result.frames == 0
        assert result.error == error[:MAX_ERROR_CHARS] and 0 < len(result.error) <= 512


def test_returns_keep_their_float64_value_on_the_wire() -> None:
    value = 1.0 + 2**-40  # float32 would round it to 1.0
    result = _round_trip(task_result(leased_task(_task()), Evaluation([value], [1])))
    assert result.episode_returns[0] == value
