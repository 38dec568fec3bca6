"""Checkpoints: atomic and checksummed on disk; a stopped master continues where it stopped."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path

import pytest

from master.config import inspect_env_id, preset
from master.run.checkpoint import (
    CURRENT,
    PREVIOUS,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)
from master.run.rundir import read_metrics
from master.run.start import resume_config, start_master
from tests.conftest import spawn_worker, stop_processes


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
    """Runs until generation 1's elite phase is part done, stops, resumes, finishes."""
    config = cartpole()
    first = await start_master(config, run_dir, port=0, out=None, checkpoint_seconds=3600)
    training = asyncio.ensure_future(first.trainer.run())
    worker = spawn_worker(first.port, "w1")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ga, recorded = first.trainer.ga, first.trainer.fleet.recorded()
            if ga.generation == 1 and ga.phase == "elite" and len(recorded) >= 3:
                break
            await asyncio.sleep(0.002)
        training.cancel()  # what SIGTERM does in run_master
        with pytest.raises(asyncio.CancelledError):
            await training
        complete_after_stop = first.trainer.fleet.run_complete
        await first.stop(0)
    finally:
        stop_processes([worker])
    payload = load_checkpoint(run_dir)
    resumed_config = resume_config(payload)
    second = await start_master(resumed_config, run_dir, port=0, out=None, resume=payload)
    worker = spawn_worker(second.port, "w2")
    try:
        records = await asyncio.wait_for(second.trainer.run(), 120)
    finally:
        stop_processes([worker])
        await second.stop(0)
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
    assert payload["ga"]["generation"] == 1 and payload["ga"]["phase"] == "elite"
    assert len(payload["phase_recorded"]) >= 3  # work done before the stop was kept
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
    for previous, record in itertools.pairwise(records):
        seeds = record["elite_seeds"]
        # A new elite is a child made this generation: one mutation on a parent of the last.
        # (Parents can be short: a carried elite is a parent too.)
        assert seeds == previous["elite_seeds"] or 2 <= len(seeds) <= record["generation"] + 1
    assert records[1]["wall_s"] <= records[2]["wall_s"]


def test_resuming_keeps_the_runs_settings(tmp_path: Path) -> None:
    payload = {"config": cartpole().to_dict()}
    assert resume_config(payload, generations=9).generations == 9
    with pytest.raises(ValueError, match="cannot change \\['population_size'\\]"):
        resume_config(payload, population_size=5)
