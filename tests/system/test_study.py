"""A study served by one master on one port to one fleet: a real grpc.aio master on loopback,
real worker processes, `neuro-master status` as users run it.

Three small runs (CartPole and Memorize under the GA, CartPole under ES) on two workers, at
most two at once: every run completes with exact evaluation counts and its final test; the
third waits its turn; the runs' leases alternate while they all have work; a run a worker
refuses fails alone while the others complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from master.run.rundir import read_metrics
from master.run.start import RunOptions, ServeOptions
from master.run.study import StudyRunPlan
from master.run.study_master import StudyServing, start_study
from master.study.file import Study, parse_study
from master.study.studydir import StudyDir
from neuro.runfiles import FINAL_TEST, FINAL_TEST_FORMAT, seeds_sha256
from neuro.v1 import evolution_pb2 as pb
from neuro.v1 import evolution_pb2_grpc as pb_grpc
from tests.support.processes import REPO, spawn_worker, stop_processes, worker_env
from tests.support.user_problem import MY_ENV, USER_PACKAGES

GA = "population_size = 8, truncation = 2, elite_candidates = 2, elite_episodes = 2"
STUDY = f"""
name = "three"
max_concurrent_runs = 2
test_episodes = 4

[budget]
no_target = true
generations = 3

[[grid]]
envs = ["CartPole-v1", "neuro/Memorize-K10-v0"]
seeds = [1]
settings = {{ {GA} }}

[[run]]
env = "CartPole-v1"
seed = 3
name = "cartpole-es"
settings = {{ algorithm = "es", pairs = 4, eval_episodes = 2 }}
"""
RUN_S = 180.0
CALL_S = 5.0


def opened(study_dir: Path, text: str) -> tuple[Study, StudyDir, list[StudyRunPlan]]:
    """The study read from `text` and opened in `study_dir`, as neuro-master opens it."""
    study = parse_study(text, "study.toml")
    directory = StudyDir(study_dir)
    plan = directory.open(study)
    plans = [StudyRunPlan(run.name, run.env, run.seed, run.label, run.config, run.test_episodes,
                          directory.run_dir(run.name), plan.states[run.name])
             for run in study.runs]  # fmt: skip
    return study, directory, plans


def status_json(port: int) -> dict:
    """`neuro-master status --json`, run as a user runs it."""
    command = [sys.executable, "-m", "master", "status", "--master", f"127.0.0.1:{port}", "--json"]
    done = subprocess.run(command, env=worker_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    return json.loads(done.stdout)


def test_a_study_of_three_runs_on_two_workers_completes_each_with_exact_counts(
    tmp_path: Path, noise_cache: Path
) -> None:
    study, directory, plans = opened(tmp_path / "study", STUDY)
    serving = StudyServing(study.name, plans, directory, study.max_concurrent_runs,
                           directory.path)  # fmt: skip

    async def main() -> tuple[dict, dict, dict]:
        master = await start_study(serving, ServeOptions(), RunOptions(out=None, overlap=True))
        serving_task = asyncio.ensure_future(master.runner.run())
        workers: list[subprocess.Popen] = []
        try:
            await asyncio.sleep(0.5)  # the first two runs start serving
            before = await asyncio.to_thread(status_json, master.port)
            workers = [spawn_worker(master.port, f"w{i}") for i in range(2)]
            states = await asyncio.wait_for(serving_task, RUN_S)
            after = await asyncio.to_thread(status_json, master.port)
        finally:
            serving_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving_task
            stop_processes(workers)
            await master.stop(0)
        return before, states, after

    before, states, after = asyncio.run(main())
    names = [run.name for run in study.runs]
    assert names == ["cartpole-v1-s1", "neuro-memorize-k10-v0-s1", "cartpole-es"]
    # Before any worker: two runs served, the third waiting its turn; status lists them all.
    assert [(r["name"], r["state"]) for r in before["runs"]] == [
        (names[0], "running"), (names[1], "running"), (names[2], "queued")]  # fmt: skip
    assert before["utilisation"] is None and before["run_id"] == "three"
    assert states == dict.fromkeys(names, "complete")
    assert {r["state"] for r in after["runs"]} == {"complete"}
    assert directory.states() == dict.fromkeys(names, "complete")
    for run in study.runs:
        run_dir = directory.run_dir(run.name)
        lines = read_metrics(run_dir / "metrics.jsonl")
        per_generation = run.config.evaluations_per_generation
        # Every generation's evaluations counted once, the final test's in none of them.
        assert [line["generation"] for line in lines] == [0, 1, 2], run.name
        assert [line["generation_evaluations"] for line in lines] == [per_generation] * 3
        assert lines[-1]["evaluations"] == 3 * per_generation
        assert lines[-1]["failed_evaluations"] == 0 and lines[-1]["worker_s"] > 0
        test = json.loads((run_dir / FINAL_TEST).read_text())
        assert test["format"] == FINAL_TEST_FORMAT and test["episodes"] == 4
        assert len(test["scores"]) == 4 and all(math.isfinite(s) for s in test["scores"])
        best = json.loads((run_dir / "best_genome.json").read_text())
        if run.config.algorithm == "es":
            assert test["genome_sha256"] == best["parameters"]["sha256"]
        else:
            assert test["genome_sha256"] == seeds_sha256(best["seeds"])
        config = json.loads((run_dir / "config.json").read_text())
        assert config["env_id"] == run.env and config["algorithm"] == run.config.algorithm


def test_a_studys_runs_take_turns_at_a_worker_while_each_has_work(tmp_path: Path) -> None:
    """The test as the worker, leasing one task at a time through the gRPC edge: the fair-share
    picker hands the runs' tasks out in turn, so no run waits while another is served."""
    text = STUDY.replace("max_concurrent_runs = 2", "max_concurrent_runs = 3")
    study, directory, plans = opened(tmp_path / "study", text)
    serving = StudyServing(study.name, plans[:2], directory, 3, directory.path)

    async def main() -> list[str]:
        master = await start_study(serving, ServeOptions(), RunOptions(out=None))
        serving_task = asyncio.ensure_future(master.runner.run())
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{master.port}")
        stub = pb_grpc.EvolutionStub(channel)
        runs = []
        try:
            request = pb.LeaseRequest(protocol_version=pb.PROTOCOL_VERSION_CURRENT,
                                      worker_id="w", max_tasks=1)  # fmt: skip
            while len(runs) < 16:  # both runs' eight offspring, held (never reported)
                response = await stub.Lease(request, timeout=CALL_S)
                for task in response.tasks:
                    key, _, own = task.task_id.partition("|")
                    assert own.startswith("g0/o/") and key == task.run_id
                    runs.append(task.env.env_id)
                if not response.tasks:
                    await asyncio.sleep(0.01)
        finally:
            serving_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving_task
            await channel.close()
            await master.stop(0)
        return runs

    runs = asyncio.run(main())
    # In turn: each pair of leases gave one task of each run.
    for i in range(0, 16, 2):
        assert sorted(runs[i : i + 2]) == ["CartPole-v1", "neuro/Memorize-K10-v0"], runs
    # Cancelled mid-phase, the runs stay running in the study dir for the next start.
    assert set(directory.states().values()) <= {"running", "queued"}


def test_a_run_every_worker_refuses_fails_alone_and_the_others_complete(
    tmp_path: Path, noise_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The master has the user's package, the workers do not: they refuse that run's tasks,
    which fails naming the module, while the other run completes on the same workers."""
    monkeypatch.syspath_prepend(str(USER_PACKAGES))
    text = f"""
name = "refused"
max_concurrent_runs = 2
test_episodes = 2
[budget]
no_target = true
generations = 2
[[grid]]
envs = ["CartPole-v1", "{MY_ENV}"]
seeds = [1]
settings = {{ {GA} }}
"""
    study, directory, plans = opened(tmp_path / "study", text)
    serving = StudyServing(study.name, plans, directory, 2, directory.path)

    async def main() -> dict:
        master = await start_study(serving, ServeOptions(), RunOptions(out=None))
        workers = [spawn_worker(master.port, f"w{i}", stderr=subprocess.DEVNULL)
                   for i in range(2)]  # fmt: skip
        try:
            return await asyncio.wait_for(master.runner.run(), RUN_S)
        finally:
            stop_processes(workers)
            await master.stop(0)

    states = asyncio.run(main())
    refused = "userpkg-myenv-v0-s1"
    assert states == {"cartpole-v1-s1": "complete", refused: "failed"}
    assert directory.states() == states
    assert "cannot import module 'userpkg'" in directory.error(refused)
    assert (directory.run_dir("cartpole-v1-s1") / FINAL_TEST).is_file()
    assert not (directory.run_dir(refused) / FINAL_TEST).exists()


def test_two_es_runs_at_once_on_one_worker_each_play_what_they_play_alone(
    tmp_path: Path, noise_cache: Path
) -> None:
    """Each ES run numbers its parameter versions from 0: a worker holding two runs' version 1
    keeps them apart (by run), so each run's generations are those it has served alone."""
    text = """
name = "es-pair"
max_concurrent_runs = 2
test_episodes = 1
[budget]
no_target = true
generations = 3
[[grid]]
envs = ["CartPole-v1"]
seeds = [1, 2]
label = "es"
settings = { algorithm = "es", pairs = 4, eval_episodes = 2 }
"""
    results = {}
    for at_once in (2, 1):
        study, directory, plans = opened(tmp_path / f"at-once-{at_once}", text)
        serving = StudyServing(study.name, plans, directory, at_once, directory.path)

        async def main(serving: StudyServing = serving) -> dict:
            master = await start_study(serving, ServeOptions(), RunOptions(out=None))
            worker = spawn_worker(master.port, "w")
            try:
                return await asyncio.wait_for(master.runner.run(), RUN_S)
            finally:
                stop_processes([worker])
                await master.stop(0)

        assert set(asyncio.run(main()).values()) == {"complete"}
        results[at_once] = {
            run.name: [(line["score_mean"], line["score_max"], line["elite_score"])
                       for line in read_metrics(directory.run_dir(run.name) / "metrics.jsonl")]
            for run in study.runs
        }  # fmt: skip
    assert results[2] == results[1]
    assert results[1]["cartpole-v1-es-s1"] != results[1]["cartpole-v1-es-s2"]
