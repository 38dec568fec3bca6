"""What a worker refuses before it plays: an ES step no master asks for, an observation
normaliser of another size than the env's observations, and flags it could not honour.

Each refusal names the value; a refused task is reported as failed, not played, and the worker
takes the next one.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from neuro.layout import parameter_count, parameter_layout
from neuro.noise import NoiseTableSpec
from neuro.v1 import evolution_pb2 as pb
from worker.cli import worker_parser, worker_settings
from worker.client import WorkerClient
from worker.client.wire import leased_task, spec_from_task
from worker.evaluation.evaluator import Evaluator
from worker.evaluation.spec import EvaluationSpec
from worker.runners.batched import BatchedRunner
from worker.runners.per_genome import PerGenomeRunner

TABLE = NoiseTableSpec(seed=123, size=2**16)
HIDDEN = (8,)
PENDULUM_OBSERVATIONS = 3  # Pendulum-v1: cos, sin, angular velocity
PENDULUM_PARAMETERS = parameter_count(parameter_layout("mlp", (PENDULUM_OBSERVATIONS,), 1, HIDDEN))


def _es_task(sign: int = 1, sigma: float = 0.02, observation_size: int = 0) -> pb.Task:
    """An ES task as master/fleet/tasks.py builds one, with the fields under test set."""
    task = pb.Task(
        task_id="v1/p/0+", run_id="r", episodes=1, env=pb.EnvSpec(env_id="Pendulum-v1"),
        policy=pb.PolicySpec(architecture="mlp", hidden_sizes=list(HIDDEN)),
        genome=pb.Genome(noise_table=pb.NoiseTableSpec(seed=TABLE.seed, size=TABLE.size)),
    )  # fmt: skip
    es = task.perturbation
    es.version, es.noise_index, es.sign, es.sigma = 1, 5, sign, sigma
    es.num_params, es.observation_size = PENDULUM_PARAMETERS, observation_size
    return task


# -- the ES step ---------------------------------------------------------------------------------


@pytest.mark.parametrize("sign", [-1, 0, 1])
def test_the_steps_the_master_asks_for_are_taken(sign: int) -> None:
    spec = spec_from_task(_es_task(sign=sign))
    assert spec.perturbation is not None
    version, index, got_sign, sigma = spec.perturbation
    assert (version, index, got_sign) == (1, 5, sign)
    assert sigma == pytest.approx(0.02)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"sign": 7}, "sign must be -1, 0 or 1, got 7"),
        ({"sign": -2}, "sign must be -1, 0 or 1, got -2"),
        ({"sigma": math.nan}, "sigma must be finite and > 0, got nan"),
        ({"sigma": math.inf}, "sigma must be finite and > 0, got inf"),
        ({"sigma": -0.02}, "sigma must be finite and > 0, got -0.02"),
        ({"sigma": 0.0}, "sigma must be finite and > 0, got 0$"),
        # sign 0 is theta itself, but a NaN sigma is still no master's.
        ({"sign": 0, "sigma": math.nan}, "got nan"),
    ],
)
def test_an_es_step_no_master_asks_for_is_refused_by_name(fields: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        spec_from_task(_es_task(**fields))


def test_a_refused_step_is_reported_as_failed_and_not_played(tmp_path: Path) -> None:
    """Refused when its lease arrives, the task keeps the reason; through the client's own
    start path it becomes an error result naming the sign, and the runner never holds it."""
    evaluator = Evaluator(str(tmp_path))
    evaluator.set_parameters(1, np.zeros(PENDULUM_PARAMETERS, dtype=np.float32))
    client = WorkerClient("127.0.0.1:1", "w", evaluator)
    runner = PerGenomeRunner(evaluator, 2)
    task = leased_task(_es_task(sign=7))
    assert task.spec is None and "got 7" in task.refusal
    client.held.running[task.task_id] = task
    client._start(runner, task)
    (result,) = client.held.outbox
    assert result.task_id == task.task_id and "got 7" in result.error
    assert not result.episode_returns and not runner.busy and client.counters.tasks_failed == 1
    assert task.task_id not in client.held.running


# -- the observation normaliser ------------------------------------------------------------------


def _normalised_spec(observation_size: int) -> EvaluationSpec:
    return EvaluationSpec(
        env_id="Pendulum-v1", seeds=(), mutation_power=0.02, noise_table=TABLE,
        architecture="mlp", hidden_sizes=HIDDEN, episodes=1, max_episode_steps=20,
        perturbation=(1, 5, 1, 0.02), observation_size=observation_size,
    )  # fmt: skip


def _fetched(observation_size: int) -> np.ndarray:
    """The version's bytes as a master would send them: parameters, then mean and std of the
    observation_size the task names (so only that size disagrees with the env)."""
    stats = np.concatenate([np.zeros(observation_size), np.ones(observation_size)])
    return np.concatenate([np.zeros(PENDULUM_PARAMETERS), stats]).astype(np.float32)


def _runners(evaluator: Evaluator) -> dict[str, object]:
    return {"per-genome": PerGenomeRunner(evaluator, 2), "batched": BatchedRunner(evaluator, 2)}


@pytest.mark.parametrize("kind", ["per-genome", "batched"])
@pytest.mark.parametrize("observation_size", [1, 5, 2 * PENDULUM_OBSERVATIONS])
def test_an_observation_size_the_env_does_not_have_is_refused_when_the_task_starts(
    tmp_path: Path, kind: str, observation_size: int
) -> None:
    evaluator = Evaluator(str(tmp_path))
    evaluator.set_parameters(1, _fetched(observation_size))
    runner = _runners(evaluator)[kind]
    named = (
        f"observation_size {observation_size} does not match Pendulum-v1, whose observations "
        f"have {PENDULUM_OBSERVATIONS} values"
    )
    with pytest.raises(ValueError, match=named):
        runner.start("t", _normalised_spec(observation_size))  # type: ignore[attr-defined]
    # Refused before any episode: the slot is free and nothing was played.
    assert not runner.busy  # type: ignore[attr-defined]
    assert runner.timers.episodes == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["per-genome", "batched"])
def test_the_env_s_own_observation_size_is_played_after_a_refused_one(
    tmp_path: Path, kind: str
) -> None:
    evaluator = Evaluator(str(tmp_path))
    evaluator.set_parameters(1, _fetched(PENDULUM_OBSERVATIONS + 1))
    runner = _runners(evaluator)[kind]
    with pytest.raises(ValueError, match="observation_size"):
        runner.start("bad", _normalised_spec(PENDULUM_OBSERVATIONS + 1))  # type: ignore[attr-defined]
    evaluator.set_parameters(2, _fetched(PENDULUM_OBSERVATIONS))
    good = _normalised_spec(PENDULUM_OBSERVATIONS)
    good = EvaluationSpec(**{**good.__dict__, "perturbation": (2, 5, 1, 0.02)})
    runner.start("good", good)  # type: ignore[attr-defined]
    finished = []
    for _ in range(100):  # 20 steps at most
        finished += runner.step()  # type: ignore[attr-defined]
        if finished:
            break
    ((task_id, evaluation),) = finished
    assert task_id == "good" and not evaluation.error, evaluation.error
    assert evaluation.frames == [20]
    assert evaluation.observations is not None
    assert evaluation.observations.total.shape == (PENDULUM_OBSERVATIONS,)


# -- flags ---------------------------------------------------------------------------------------


def _settings(*argv: str):
    parser = worker_parser()
    return worker_settings(parser, parser.parse_args(["--master", "127.0.0.1:1", *argv]))


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--decode-cache-mb", "-1"], "--decode-cache-mb must be in [0, "),
        (["--decode-cache-mb", "-1"], "got -1"),
        (["--decode-cache-mb", str(2**40)], f"got {2**40}"),
        (["--shared-cache-mb", "-5"], "--shared-cache-mb must be in [0, "),
    ],
)
def test_cache_sizes_it_cannot_hold_are_refused_at_parse_time(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        _settings(*argv)
    assert exited.value.code == 2
    assert named in capsys.readouterr().err


def test_cache_sizes_it_can_hold_are_kept() -> None:
    assert _settings().decode_cache_mb == 512  # the defaults, on any machine
    assert _settings("--decode-cache-mb", "0", "--shared-cache-mb", "0").decode_cache_mb == 0


def test_a_stats_file_it_cannot_write_is_refused_at_parse_time_naming_path_and_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-dir" / "stats.json"
    with pytest.raises(SystemExit) as exited:
        _settings("--stats-file", str(missing))
    assert exited.value.code == 2
    assert f"--stats-file {missing}: cannot write there: No such file or directory" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit) as exited:
        _settings("--stats-file", str(tmp_path))
    assert exited.value.code == 2
    assert f"--stats-file {tmp_path}: is a directory" in capsys.readouterr().err
    # A writable one is taken, and the check leaves nothing behind.
    good = tmp_path / "stats.json"
    assert _settings("--stats-file", str(good)).stats_file == str(good)
    assert list(tmp_path.iterdir()) == []


def test_a_stats_file_that_becomes_unwritable_mid_run_is_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "stats"
    folder.mkdir()
    client = WorkerClient("127.0.0.1:1", "w", Evaluator(str(tmp_path)),
                          stats_path=str(folder / "stats.json"))  # fmt: skip
    assert client.write_stats() is True
    (folder / "stats.json").unlink()
    folder.rmdir()  # e.g. a cleaned-up scratch dir
    assert client.write_stats() is False
    assert client.write_stats() is False
    warnings = [r for r in caplog.records if "cannot write stats file" in r.getMessage()]
    assert len(warnings) == 1 and str(folder / "stats.json") in warnings[0].getMessage()


# -- the Atari dynamics --------------------------------------------------------------------------


def test_atari_dynamics_this_worker_does_not_know_are_refused_by_name() -> None:
    """A newer master's protocol is refused, not played as the paper's: the genome would be
    scored under other rules. The known values map as they always did."""
    table = pb.NoiseTableSpec(size=2**23)
    task = pb.Task(task_id="t", run_id="r", episodes=1,
                   env=pb.EnvSpec(env_id="Frostbite-v4", atari_dynamics=7),
                   policy=pb.PolicySpec(architecture="deepga"),
                   genome=pb.Genome(seeds=[1], noise_table=table))  # fmt: skip
    with pytest.raises(ValueError, match="atari dynamics 7 is not one this worker plays"):
        spec_from_task(task)
    expected = {pb.ATARI_DYNAMICS_UNSPECIFIED: "paper", pb.ATARI_DYNAMICS_PAPER: "paper",
                pb.ATARI_DYNAMICS_REGISTERED: "registered"}  # fmt: skip
    for value, dynamics in expected.items():
        task.env.atari_dynamics = value
        assert spec_from_task(task).atari_dynamics == dynamics
