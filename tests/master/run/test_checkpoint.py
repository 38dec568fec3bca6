"""Checkpoints: atomic and checksummed on disk; a stopped master continues where it stopped."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from master.config import RunConfig, inspect_env_id, preset
from master.fleet.phases import TaskOutcome
from master.run.checkpoint import (
    CURRENT,
    PREVIOUS,
    CheckpointError,
    load_checkpoint,
    load_sidecar,
    save_checkpoint,
    save_sidecar,
)
from master.run.rundir import read_elite_seeds, read_metrics
from master.run.start import resume_config
from tests.support.fleet_calls import ACCEPTED, lease_some, report, result
from tests.support.harness import live_master
from tests.support.processes import spawn_worker, stop_processes


def test_round_trip_and_the_previous_one_is_kept(tmp_path: Path) -> None:
    assert load_checkpoint(tmp_path) is None
    save_checkpoint(tmp_path, {"n": 1})
    save_checkpoint(tmp_path, {"n": 2})
    assert load_checkpoint(tmp_path) == {"n": 2}
    assert json.loads((tmp_path / PREVIOUS).read_text())["payload"] == {"n": 1}
    assert not list(tmp_path.glob(".checkpoint.*"))  # no temp files left behind


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: text[: len(text) // 2],  # truncated
        lambda text: text.replace('"n": 2', '"n": 3'),  # a changed value
        lambda text: "",  # empty
        lambda text: json.dumps({"format": "something else"}),
    ],
)
def test_a_damaged_checkpoint_falls_back_to_the_previous_good_one(tmp_path, damage, caplog):
    save_checkpoint(tmp_path, {"n": 1})
    save_checkpoint(tmp_path, {"n": 2})
    current = tmp_path / CURRENT
    current.write_text(damage(current.read_text()))
    assert load_checkpoint(tmp_path) == {"n": 1}
    assert str(current) in caplog.text and "refused" in caplog.text


def test_with_every_checkpoint_damaged_the_master_refuses_with_a_clear_message(tmp_path):
    save_checkpoint(tmp_path, {"n": 1})
    save_checkpoint(tmp_path, {"n": 2})
    for name in (CURRENT, PREVIOUS):
        (tmp_path / name).write_text("{")
    with pytest.raises(CheckpointError, match=r"checkpoint\.json: unreadable"):
        load_checkpoint(tmp_path)


def test_a_crash_between_the_renames_leaves_the_previous_checkpoint(tmp_path):
    save_checkpoint(tmp_path, {"n": 1})
    save_checkpoint(tmp_path, {"n": 2})
    (tmp_path / CURRENT).unlink()  # renamed away, new one not yet in place
    assert load_checkpoint(tmp_path) == {"n": 1}


def cartpole(**overrides):
    settings = dict(population_size=12, truncation=3, elite_candidates=3, elite_episodes=4,
                    generations=3, target_score=None, seed=5, lease_seconds=2.0)  # fmt: skip
    return preset(inspect_env_id("CartPole-v1"), **{**settings, **overrides})


async def _stop_mid_elite_phase_then_resume(run_dir: Path) -> dict:
    """Runs until generation 1's elite phase is part done, stops, resumes, finishes.

    Until the stop this test is the worker, so the stop falls at the same point however fast
    the machine (a real worker could finish the phase before a poll noticed it).
    """
    config = cartpole()
    async with live_master(config, run_dir, checkpoint_seconds=3600) as first:
        stub = first.stub()
        # Task ids name their phase (g<generation>/o or /e): every task up to generation 1's
        # elite phase is done, then three of that phase's twelve.
        while not (tasks := await lease_some(stub))[0].task_id.startswith("g1/e/"):
            assert await report(stub, [result(t) for t in tasks]) == [ACCEPTED] * len(tasks)
        assert len(tasks) == 3 * 4  # the whole elite phase, of which three come back
        assert await report(stub, [result(t) for t in tasks[:3]]) == [ACCEPTED] * 3
        first.training.cancel()  # what SIGTERM does in run_master
        with pytest.raises(asyncio.CancelledError):
            await first.training
        complete_after_stop = first.trainer.fleet.run_complete
    payload = load_checkpoint(run_dir)
    resumed_config = resume_config(payload)
    async with live_master(resumed_config, run_dir, train=False, resume=payload) as second:
        worker = spawn_worker(second.port, "w2")
        try:
            records = await asyncio.wait_for(second.trainer.run(), 120)
        finally:
            stop_processes([worker])
    return {"payload": payload, "records": records, "complete": complete_after_stop,
            "config": config, "resumed_config": resumed_config}  # fmt: skip


@pytest.mark.slow
def test_a_stopped_master_resumes_mid_phase_and_scores_everything_exactly_once(
    tmp_path: Path, noise_cache: Path
) -> None:
    run_dir = tmp_path / "run"
    outcome = asyncio.run(_stop_mid_elite_phase_then_resume(run_dir))
    payload = outcome["payload"]
    assert not outcome["complete"]  # a stop is not the end of the run: workers wait
    state = payload["algorithm"]["state"]
    assert state["generation"] == 1 and state["phase"] == "elite"
    assert len(payload["phase_recorded"]) == 3  # work done before the stop was kept
    assert outcome["resumed_config"] == outcome["config"]  # same run id, same settings
    # The resumed master finished generations 1 and 2; the record on disk is seamless.
    assert [r.generation for r in outcome["records"]] == [1, 2]
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["generation"] for r in records] == [0, 1, 2]
    frames = evaluations = 0
    for record in records:
        assert record["generation_evaluations"] == 12 + 3 * 4
        frames += record["generation_frames"]
        evaluations += record["generation_evaluations"]
        assert (record["frames"], record["evaluations"]) == (frames, evaluations)
        assert record["failed_evaluations"] == 0
    # Elite chain: each elite is the previous one or a member of its own generation.
    chain = [(record["generation"], read_elite_seeds(run_dir, record)) for record in records]
    for (_, previous), (generation, seeds) in itertools.pairwise(chain):
        # A new elite is a child made this generation: one mutation on a parent of the last.
        # (Parents can be short: a carried elite is a parent too.)
        assert seeds == previous or 2 <= len(seeds) <= generation + 1
    assert records[1]["wall_s"] <= records[2]["wall_s"]


def test_resuming_keeps_the_runs_settings(tmp_path: Path) -> None:
    payload = {"config": cartpole().to_dict()}
    assert resume_config(payload, generations=9).generations == 9
    with pytest.raises(ValueError, match="cannot change \\['population_size'\\]"):
        resume_config(payload, population_size=5)


# -- checkpoints written before the "algorithm" section -----------------------------------------


async def _resume_with_an_in_process_worker(
    config: RunConfig, run_dir: Path
) -> tuple[dict[str, Any], list]:
    """Resumes the run dir's checkpoint and trains to the budget; a loop here plays every task.

    Returns the resumed algorithm's state document (before any training) and the records.
    """
    payload = load_checkpoint(run_dir)
    async with live_master(config, run_dir, train=False, resume=payload) as live:
        fleet = live.trainer.fleet
        state = live.trainer.algorithm.state_dict()
        training = live.start_training()
        deadline = time.monotonic() + 60
        while not training.done() and time.monotonic() < deadline:
            fleet.report_many("w", [
                TaskOutcome(task.task_id, (float(len(task.task_id) % 7),) * task.episodes,
                            10 * task.episodes)
                for task in fleet.lease("w", 256)
            ])  # fmt: skip
            await asyncio.sleep(0.001)
        records = await asyncio.wait_for(training, 1)
    return state, records


def without_format(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k != "format"}


def test_a_ga_checkpoint_of_the_old_layout_resumes(tmp_path: Path) -> None:
    config = cartpole(generations=3)  # 12 offspring, then 3 candidates x 4 episodes
    rng_state = np.random.Generator(np.random.PCG64(77)).bit_generator.state
    elite = [42, 43]
    # As the trainer wrote it before: the GA's state under "ga", no algorithm name.
    old = {
        "config": config.to_dict(),
        "ga": {"generation": 2, "phase": "offspring", "rng_state": rng_state,
               "population": [[1000 + i, 7 * i + 1] for i in range(11)] + [elite],
               "scores": [], "candidates": [], "parents": [[42], [7], [9]], "elite": elite,
               "elite_score": 25.5},
        "trainer": {"frames": 5000, "evaluations": 48, "wall_s": 10.0,
                    "generation_start": [5000, 48, 1], "leases_reissued": 1},
        "phase_recorded": {"g2/o/0/0": [[3.0], 20]},
    }  # fmt: skip
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save_checkpoint(run_dir, old)
    state, records = asyncio.run(_resume_with_an_in_process_worker(config, run_dir))
    assert without_format(state) == old["ga"]
    [record] = records
    assert record.generation == 2 and record.generation_evaluations == 12 + 3 * 4
    # The task recorded before the stop counts once, with its frames; the rest were played.
    assert (record.evaluations, record.frames) == (48 + 24, 5000 + 20 + 10 * 23)
    new = load_checkpoint(run_dir)
    assert "ga" not in new and new["algorithm"]["name"] == "ga"
    assert new["algorithm"]["state"]["generation"] == 3
    assert new["algorithm"]["state"]["format"] == "neuro.ga/1"


def test_an_es_checkpoint_of_the_old_layout_resumes_with_its_arrays(
    tmp_path: Path, noise_cache: Path
) -> None:
    config = preset(inspect_env_id("CartPole-v1"), algorithm="es", pairs=2, eval_episodes=1,
                    seed=1, generations=2, target_score=None, hidden_sizes=(8,),
                    noise_table_size=2**16)  # fmt: skip
    num_params = 4 * 8 + 8 + 8 * 2 + 2  # CartPole: 4 inputs, 8 hidden units, 2 actions
    rng = np.random.default_rng(5)
    arrays = np.stack([rng.normal(0, 0.1, num_params), np.zeros(num_params),
                       np.full(num_params, 1e-4)]).astype(np.float32)  # fmt: skip
    run_dir = tmp_path / "run"
    # As the trainer wrote it before: the ES's state under "ga", its arrays in a sidecar.
    old = {
        "config": config.to_dict(),
        "ga": {"generation": 1, "phase": "offspring", "adam_steps": 1,
               "rng_state": np.random.Generator(np.random.PCG64(11)).bit_generator.state,
               "noise_indices": [17, 123456], "elite_score": 20.0, "theta_rank": 0,
               "num_params": num_params,
               "arrays_sha256": hashlib.sha256(arrays.tobytes()).hexdigest()},
        "trainer": {"frames": 300, "evaluations": 5, "wall_s": 3.0,
                    "generation_start": [300, 5, 0], "leases_reissued": 0},
        "phase_recorded": {},
        "sidecar": save_sidecar(run_dir, 1, arrays),
    }  # fmt: skip
    save_checkpoint(run_dir, old)
    state, records = asyncio.run(_resume_with_an_in_process_worker(config, run_dir))
    # The same state, in today's document (which says it keeps no observation sums).
    assert without_format(state) == {**old["ga"], "observations": None}
    [record] = records
    assert record.generation == 1 and record.generation_evaluations == 2 * 2 + 1
    new = load_checkpoint(run_dir)
    assert "ga" not in new and new["algorithm"]["name"] == "es"
    assert new["algorithm"]["state"]["generation"] == 2
    theta = load_sidecar(run_dir, new["sidecar"])[0]
    # One Adam step on from the old checkpoint's theta.
    assert theta.shape == arrays[0].shape and not np.array_equal(theta, arrays[0])
    assert np.isfinite(theta).all() and not math.isnan(record.elite_score)
