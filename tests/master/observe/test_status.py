"""neuro-master status and /metrics: per-worker figures, the CLI against a real master, Prometheus.

The end-to-end test runs a real master on loopback with one real worker process, freezes the
worker (SIGSTOP) mid-run so the run stands still, and checks that the status command, its
human format and the /metrics endpoint all tell the same story as metrics.jsonl.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from master import cli
from master.algorithms.ga import EvaluationRequest, Genome
from master.fleet.fleet import Fleet
from master.fleet.phases import FleetSettings, TaskOutcome
from master.fleet.roster import WorkerRoster
from master.observe import status as status_cli
from master.observe.events import RunSnapshot
from master.observe.prometheus import StatusCollector, start_metrics_server
from master.run.rundir import read_elite_seeds, read_metrics
from tests.support.harness import live_master
from tests.support.processes import REPO, free_port, spawn_worker, stop_processes, worker_env
from tests.support.tiny import tiny_cartpole

TOKEN = "status-test-token-5f2c9a"
WRONG = "not-the-token-81d0e4"
CLIENT_ENV = ("NEURO_TOKEN", "NEURO_TOKEN_FILE", "NEURO_TLS_CA", "NEURO_MASTER")
CLI = [sys.executable, "-c", "import sys; from master.cli import main; sys.exit(main())"]


@pytest.fixture(autouse=True)
def _no_client_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*CLIENT_ENV, "NEURO_METRICS_PORT", "NEURO_METRICS_HOST"):
        monkeypatch.delenv(name, raising=False)


# -- per-worker figures: the sliding rate window and forgetting --------------------------------


def test_frame_rate_is_accepted_frames_over_the_last_minute() -> None:
    roster = WorkerRoster(rate_window_s=60.0, forget_after_s=600.0)
    roster.seen("w", 0.0)
    roster.credit("w", 1, 600, 10.0)
    roster.credit("w", 1, 600, 20.0)
    [w] = roster.snapshot(30.0, lambda task_id: None)
    assert (w.evaluations, w.frames) == (2, 1200)
    assert w.frames_per_second == pytest.approx(1200 / 30)  # joined 30 s ago: since then
    roster.seen("w", 90.0)
    [w] = roster.snapshot(90.0, lambda task_id: None)
    assert w.frames_per_second == 0.0  # nothing in the last minute
    assert w.frames == 1200  # the totals stay
    # Steady 100 frames/s, reported in many small pieces: the rate reads 100 (to a bucket).
    for step in range(1200):
        now = 100.0 + step * 0.1
        roster.seen("w", now)
        roster.credit("w", 1, 10, now)
    [w] = roster.snapshot(now, lambda task_id: None)
    assert w.frames_per_second == pytest.approx(100.0, rel=0.02)
    assert w.seconds_since_contact == 0.0
    # One bucket per clock second: memory stays flat however often a worker reports.
    assert len(roster._workers["w"].buckets) <= 62


def test_a_first_report_does_not_read_as_a_burst() -> None:
    roster = WorkerRoster()
    roster.seen("w", 50.0)
    roster.credit("w", 1, 500, 50.01)
    [w] = roster.snapshot(50.02, lambda task_id: None)
    assert w.frames_per_second == pytest.approx(500.0)  # over at least one second


def test_silent_workers_are_forgotten_and_the_table_stays_bounded() -> None:
    roster = WorkerRoster(rate_window_s=60.0, forget_after_s=600.0)
    roster.seen("a", 0.0)
    roster.seen("b", 300.0)
    roster.seen("c", 601.0)  # any contact forgets whoever was silent for 600 s
    assert len(roster) == 2
    assert [w.worker_id for w in roster.snapshot(601.0, lambda t: None)] == ["b", "c"]
    assert roster.connected(601.0, 60.0) == 1
    assert [w.worker_id for w in roster.snapshot(901.0, lambda t: None)] == ["c"]
    roster.credit("a", 1, 99, 901.0)  # a late report from a forgotten worker changes nothing
    assert len(roster) == 1
    # Churn: 20,000 spot workers, one new every 0.1 s, each seen once.
    for i in range(20_000):
        roster.seen(f"spot-{i}", 1000.0 + i * 0.1)
    assert len(roster) <= 600 / 0.1 + 1
    assert roster.connected(1000.0 + 19_999 * 0.1, 60.0) == 601


def test_tasks_in_hand_follow_leases_reports_releases_and_lapses() -> None:
    now = [0.0]
    fleet = Fleet(FleetSettings(run_id="r", run_seed=1, lease_seconds=10.0), clock=lambda: now[0])

    def in_hand() -> dict[str, int]:
        return {w.worker_id: w.tasks_leased for w in fleet.worker_stats()}

    async def scenario() -> None:
        genome = Genome((1,))
        requests = [EvaluationRequest(f"k{i}", genome, 1) for i in range(8)]
        phase = asyncio.ensure_future(fleet.evaluate(requests))
        await asyncio.sleep(0)
        one = fleet.lease("w1", 3)
        two = fleet.lease("w2", 2)
        assert in_hand() == {"w1": 3, "w2": 2}
        fleet.report_many("w1", [TaskOutcome(one[0].task_id, (1.0,), 40)])
        fleet.report_many("w1", [TaskOutcome(one[0].task_id, (1.0,), 40)])  # duplicate
        fleet.release("w2", [two[0].task_id])
        assert in_hand() == {"w1": 2, "w2": 1}
        [w1, _] = fleet.worker_stats()
        assert (w1.evaluations, w1.frames) == (1, 40)  # the duplicate is not counted
        now[0] = 11.0  # every lease lapses; w3's lease calls re-issue them to it
        while fleet.lease("w3", 8):  # a share of what is pending at a time (3 workers known)
            pass
        assert fleet.heartbeat("w1", [t.task_id for t in one[1:]]) == [t.task_id for t in one[1:]]
        assert in_hand() == {"w1": 0, "w2": 0, "w3": 7}
        fleet.report_many("w3", [TaskOutcome(f"k{i}/0", (2.0,), 5) for i in range(8)])
        await asyncio.wait_for(phase, 5)
        assert in_hand() == {"w1": 0, "w2": 0, "w3": 0}
        assert fleet.workers_connected() == 3

    asyncio.run(scenario())


def test_metrics_drop_the_series_of_forgotten_workers() -> None:
    now = [0.0]
    fleet = Fleet(FleetSettings(run_id="r", run_seed=1), clock=lambda: now[0])
    fleet.lease("old", 1)
    now[0] = 500.0
    fleet.lease("new", 1)

    def scrape() -> dict[str, dict[tuple, float]]:
        def read() -> RunSnapshot:
            return RunSnapshot(run_id="r", env_id="CartPole-v1", generation=0, phase="offspring",
                               frames=0, evaluations=0, elite_score=math.nan, elite_seeds=(),
                               tasks_pending=0, tasks_leased=0, tasks_done=0, workers=2,
                               leases_reissued=0, run_complete=False, wall_s=0.0,
                               worker_status=tuple(fleet.worker_stats()))  # fmt: skip

        registry = CollectorRegistry(auto_describe=False)
        registry.register(StatusCollector(read))
        return parse_metrics(generate_latest(registry).decode())

    samples = scrape()
    assert set(samples["neuro_worker_seconds_since_contact"]) == {("old",), ("new",)}
    assert samples["neuro_worker_seconds_since_contact"][("old",)] == 500.0
    assert math.isnan(samples["neuro_elite_score"][()])  # no elite yet
    assert "neuro_score_max" not in samples  # no generation recorded yet
    now[0] = 601.0
    samples = scrape()
    assert set(samples["neuro_worker_seconds_since_contact"]) == {("new",)}
    assert set(samples["neuro_worker_frames_per_second"]) == {("new",)}


# -- the status command -------------------------------------------------------------------------


def parse_metrics(text: str) -> dict[str, dict[tuple, float]]:
    """sample name -> {label values (by label name): value}, read by Prometheus's parser."""
    parsed: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(v for k, v in sorted(sample.labels.items()) if k != "__name__")
            parsed.setdefault(sample.name, {})[labels] = sample.value
    return parsed


async def run_status_command(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`neuro-master status ...` as a subprocess, while this event loop keeps serving."""
    base = {k: v for k, v in worker_env().items() if k not in CLIENT_ENV}
    process = await asyncio.create_subprocess_exec(
        *CLI, "status", *argv, env={**base, **(env or {})}, cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode, out.decode(), err.decode()


async def status_in_thread(*argv: str) -> int:
    """status_cli.main in a thread (its call blocks), so this loop's master can answer."""
    return await asyncio.to_thread(status_cli.main, list(argv))


async def fetch_metrics(url: str) -> dict[str, dict[tuple, float]]:
    # Off the loop: a scrape reads its snapshot on this very loop.
    def get() -> str:
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
            return response.read().decode()

    return parse_metrics(await asyncio.to_thread(get))


async def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def settled(read: Callable[[], Any], quiet_s: float = 0.3, timeout: float = 10.0) -> None:
    """Waits until read() has not changed for quiet_s (a report in flight has landed)."""
    deadline, last, since = time.monotonic() + timeout, read(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, "the master kept changing with its worker frozen"
        await asyncio.sleep(0.02)
        if (now := read()) != last:
            last, since = now, time.monotonic()


def check_against_metrics_file(status: dict, run_dir: Path) -> dict:
    lines = read_metrics(run_dir / "metrics.jsonl")
    last = lines[-1]
    assert status["generation"] == len(lines)
    assert status["frames"] >= last["frames"] and status["evaluations"] >= last["evaluations"]
    assert status["elite_score"] == last["elite_score"]
    assert status["elite_seeds"] == read_elite_seeds(run_dir, last)
    return last


def check_metrics_match(metrics: dict, status: dict, last: dict) -> None:
    single = {name: values[()] for name, values in metrics.items() if () in values}
    assert single["neuro_generation"] == status["generation"]
    assert single["neuro_frames_total"] == status["frames"]
    assert single["neuro_evaluations_total"] == status["evaluations"]
    assert single["neuro_elite_score"] == status["elite_score"]
    assert single["neuro_score_max"] == last["score_max"]
    assert single["neuro_score_mean"] == last["score_mean"]
    assert single["neuro_workers_connected"] == status["workers"]
    assert single["neuro_tasks_pending"] == status["tasks_pending"]
    assert single["neuro_tasks_leased"] == status["tasks_leased"]
    assert single["neuro_tasks_done"] == status["tasks_done"]
    assert single["neuro_leases_reissued_total"] == status["leases_reissued"]
    assert single["neuro_run_complete"] == int(status["run_complete"])
    run_info = metrics["neuro_run_info"]
    assert run_info == {(status["env_id"], status["run_id"]): 1.0}
    [worker] = status["worker_status"]
    key = (worker["worker_id"],)
    assert set(metrics["neuro_worker_tasks_leased"]) == {key}
    assert metrics["neuro_worker_tasks_leased"][key] == worker["tasks_leased"]
    # Taken a moment after the status: the contact only ages, the rate only settles.
    assert metrics["neuro_worker_seconds_since_contact"][key] >= worker["seconds_since_contact"]
    assert 0 < metrics["neuro_worker_frames_per_second"][key] <= worker["frames_per_second"]


def worker_row(human: str, worker_id: str) -> list[str]:
    [row] = [line.split() for line in human.splitlines() if line.startswith(worker_id + " ")]
    return row


@pytest.mark.slow
def test_status_and_metrics_tell_what_metrics_jsonl_says(tmp_path: Path, noise_cache: Path):
    run_dir = tmp_path / "run"
    config = tiny_cartpole(generations=4, population_size=20, truncation=4, elite_episodes=4,
                           target_score=None, lease_seconds=60.0, seed=5)  # fmt: skip
    token_env = {"NEURO_TOKEN": TOKEN}

    async def scenario() -> None:
        async with live_master(config, run_dir, token=TOKEN) as live:
            master, training = live.master, live.training
            metrics = start_metrics_server(master.trainer, "127.0.0.1", 0)
            worker = spawn_worker(master.port, "w-status", env=token_env)
            trainer, fleet = master.trainer, master.trainer.fleet
            address = live.address
            try:
                await until(
                    lambda: trainer.algorithm.generation >= 1 or training.done(), 90, "generation 1"
                )
                os.kill(worker.pid, signal.SIGSTOP)  # the run stands still, mid-run
                await settled(
                    lambda: (
                        trainer.algorithm.generation,
                        trainer.algorithm.phase,
                        fleet.counters(),
                    )
                )
                assert not training.done()
                await until(lambda: len(read_metrics(run_dir / "metrics.jsonl")) ==
                            trainer.algorithm.generation, 10, "metrics.jsonl")  # fmt: skip

                code, out, err = await run_status_command(
                    "--master", address, "--json", env=token_env
                )
                assert code == 0, err
                status = json.loads(out)
                last = check_against_metrics_file(status, run_dir)
                assert 1 <= status["generation"] < 4 and not status["run_complete"]
                assert (status["run_id"], status["env_id"]) == (config.run_id, "CartPole-v1")
                phase_tasks = 20 if status["phase"] == "offspring" else 2 * 4
                assert status["tasks_pending"] + status["tasks_leased"] + status["tasks_done"] == (
                    phase_tasks
                )
                assert status["workers"] == 1
                [w] = status["worker_status"]
                assert w["worker_id"] == "w-status" and w["tasks_leased"] == status["tasks_leased"]
                # Everything the one worker did, and nothing else: recorded phases plus this one's.
                this_phase = fleet.recorded().values()
                assert w["frames"] == status["frames"] + sum(frames for _, frames in this_phase)
                assert w["evaluations"] == status["evaluations"] + sum(
                    len(r) for r, _ in this_phase
                )
                assert w["frames"] > 0 and w["frames_per_second"] > 0
                assert 0 <= w["seconds_since_contact"] < 30

                check_metrics_match(await fetch_metrics(metrics.url), status, last)

                code, human, err = await run_status_command("--master", address, env=token_env)
                assert code == 0, err
                phase = status["phase"]
                assert f"generation    {status['generation']} ({phase} phase)" in human
                assert f"frames        {status['frames']:,}" in human
                assert f"evaluations   {status['evaluations']:,}" in human
                assert f"elite score   {status['elite_score']:.2f}" in human
                assert f"leases out    {status['tasks_leased']:,} tasks" in human
                assert f"pending       {status['tasks_pending']:,} tasks" in human
                assert "run complete  no" in human
                row = worker_row(human, "w-status")
                assert row[1:4] == [f"{w['tasks_leased']:,}", f"{w['evaluations']:,}",
                                    f"{w['frames']:,}"]  # fmt: skip
                assert float(row[5]) >= w["seconds_since_contact"] - 0.05

                os.kill(worker.pid, signal.SIGCONT)
                await asyncio.wait_for(training, 90)
                # It leaves on run_complete; after that nothing calls in, so the figures hold still.
                await until(lambda: worker.poll() is not None, 30, "the worker to leave")
                assert worker.returncode == 0
                code, out, err = await run_status_command(
                    "--master", address, "--json", env=token_env
                )
                assert code == 0, err
                status = json.loads(out)
                last = check_against_metrics_file(status, run_dir)
                assert status["generation"] == 4 and status["run_complete"]
                assert (status["frames"], status["evaluations"]) == (
                    last["frames"],
                    last["evaluations"],
                )
                assert (
                    status["tasks_pending"] == status["tasks_leased"] == status["tasks_done"] == 0
                )
                [w] = status["worker_status"]
                assert (w["frames"], w["evaluations"]) == (status["frames"], status["evaluations"])
                assert w["tasks_leased"] == 0
                check_metrics_match(await fetch_metrics(metrics.url), status, last)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signal.SIGCONT)
                training.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await training
                stop_processes([worker])
                await metrics.close()

    asyncio.run(scenario())


def with_idle_master(scenario: Callable[[Any], Awaitable[None]], tmp_path: Path, **kwargs) -> None:
    """A master that serves Status but trains nothing (nobody leases); always stopped."""

    async def main() -> None:
        config = tiny_cartpole(generations=1, population_size=4, elite_candidates=1,
                               elite_episodes=1, target_score=None)  # fmt: skip
        async with live_master(config, tmp_path / "run", train=False, **kwargs) as live:
            await asyncio.wait_for(scenario(live.master), 60)

    asyncio.run(main())


def test_a_missing_or_wrong_token_is_a_clear_error(tmp_path, monkeypatch, capsys) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(WRONG + "\n")

    async def scenario(master) -> None:
        address = f"127.0.0.1:{master.port}"
        assert await status_in_thread("--master", address) == 2
        err = capsys.readouterr().err
        assert f"the master at {address} requires a token" in err and "NEURO_TOKEN" in err
        assert await status_in_thread("--master", address, "--token-file", str(token_file)) == 2
        err = capsys.readouterr().err
        assert f"refused the token in {token_file}: the token is wrong" in err
        monkeypatch.setenv("NEURO_TOKEN", WRONG)
        assert await status_in_thread("--master", address) == 2
        err = capsys.readouterr().err
        assert "refused the token in NEURO_TOKEN: the token is wrong" in err
        assert WRONG not in err and TOKEN not in err  # a token never reaches the terminal
        monkeypatch.setenv("NEURO_TOKEN", TOKEN)
        assert await status_in_thread("--master", address, "--json") == 0
        answer = json.loads(capsys.readouterr().out)
        assert answer["generation"] == 0 and answer["elite_score"] is None
        assert answer["worker_status"] == []

    with_idle_master(scenario, tmp_path, token=TOKEN)


def test_status_over_tls(tmp_path, monkeypatch, capsys) -> None:
    from tests.support.tls import self_signed

    certificate, key = self_signed()
    ca = tmp_path / "master.pem"
    ca.write_bytes(certificate)
    monkeypatch.setenv("NEURO_TOKEN", TOKEN)

    async def scenario(master) -> None:
        address = f"127.0.0.1:{master.port}"
        assert await status_in_thread("--master", address, "--tls-ca", str(ca)) == 0
        assert "run complete  no" in capsys.readouterr().out
        assert await status_in_thread("--master", address, "--timeout", "5") == 1
        err = capsys.readouterr().err
        assert f"cannot reach the master at {address}" in err and "give --tls-ca" in err

    with_idle_master(scenario, tmp_path, token=TOKEN, tls=(certificate, key))


def test_an_unreachable_master_is_named(capsys) -> None:
    address = f"127.0.0.1:{free_port()}"
    assert status_cli.main(["--master", address]) == 1
    err = capsys.readouterr().err
    assert f"cannot reach the master at {address}" in err and "is it running" in err


def test_a_master_that_never_answers_hits_the_deadline(capsys) -> None:
    # A socket that accepts connections (the kernel's backlog) but never speaks HTTP/2.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        assert status_cli.main(["--master", address, "--timeout", "0.5"]) == 1
        assert time.monotonic() - started < 10
    err = capsys.readouterr().err
    assert f"the master at {address} did not answer within 0.5 s" in err


@pytest.mark.parametrize(
    "address", ["nonsense", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", "http://x:80", ":80"]
)
def test_a_bad_address_is_a_usage_error(address: str, capsys) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["status", "--master", address])
    assert caught.value.code == 2
    assert f"--master {address!r} is not an address: expected host:port" in capsys.readouterr().err


@pytest.mark.parametrize("address", ["127.0.0.1:8080", "localhost:1", "[::1]:8080", "m-1.ec2:80"])
def test_good_addresses(address: str) -> None:
    assert status_cli.parse_address(address) == address


# -- the metrics endpoint of neuro-master ------------------------------------------------------


def master_cli_kwargs(monkeypatch, tmp_path, *argv: str) -> dict:
    """neuro-master's main() up to the point where it would serve; what it would serve with."""
    served = {}

    async def run_master(config, run_dir, serve, options, **kwargs):
        served.update(vars(serve), **vars(options))

    monkeypatch.setattr("master.run.start.run_master", run_master)
    assert cli.main(["--env", "CartPole-v1", "--run-dir", str(tmp_path / "run"), *argv]) == 0
    return served


def test_metrics_flags_and_environment(tmp_path, monkeypatch, capsys) -> None:
    served = master_cli_kwargs(monkeypatch, tmp_path)
    assert served["metrics_port"] is None and served["metrics_host"] == "127.0.0.1"  # off
    served = master_cli_kwargs(monkeypatch, tmp_path, "--metrics-port", "9100")
    assert served["metrics_port"] == 9100
    monkeypatch.setenv("NEURO_METRICS_PORT", "9200")
    monkeypatch.setenv("NEURO_METRICS_HOST", "0.0.0.0")
    served = master_cli_kwargs(monkeypatch, tmp_path)
    assert (served["metrics_port"], served["metrics_host"]) == (9200, "0.0.0.0")
    monkeypatch.setenv("NEURO_METRICS_PORT", "ninety")
    with pytest.raises(SystemExit) as caught:
        master_cli_kwargs(monkeypatch, tmp_path)
    assert caught.value.code == 2
    assert "must be a port in 0-65535 (flag or NEURO_METRICS_PORT), got 'ninety'" in (
        capsys.readouterr().err
    )


def test_a_taken_metrics_port_is_named(tmp_path) -> None:
    async def scenario(master) -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen(1)
            port = taken.getsockname()[1]
            with pytest.raises(OSError, match=f"could not serve metrics on 127.0.0.1:{port}"):
                start_metrics_server(master.trainer, "127.0.0.1", port)

    with_idle_master(scenario, tmp_path)


@pytest.mark.slow
def test_neuro_master_serves_metrics_while_it_trains(tmp_path: Path, noise_cache: Path) -> None:
    port = free_port()
    command = [*CLI, "--env", "CartPole-v1", "--local-workers", "1", "--port", "0",
               "--run-dir", str(tmp_path / "run"), "--generations", "500", "--population", "10",
               "--elite-candidates", "1", "--elite-episodes", "2", "--no-target",
               "--metrics-port", str(port)]  # fmt: skip
    master = subprocess.Popen(command, env=worker_env(), cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline, samples = time.monotonic() + 90, {}
        while samples.get("neuro_generation", {}).get((), 0) < 1:
            assert master.poll() is None, master.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "no generation on /metrics"
            time.sleep(0.2)
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as response:
                samples = parse_metrics(response.read().decode())
        assert samples["neuro_run_complete"][()] == 0
        assert samples["neuro_frames_total"][()] > 0
        assert samples["neuro_score_max"][()] >= samples["neuro_score_mean"][()] > 0
        assert len(samples["neuro_worker_frames_per_second"]) == 1
        master.send_signal(signal.SIGTERM)
        out, err = master.communicate(timeout=60)
        assert master.returncode == 128 + signal.SIGTERM, err[-3000:]  # stopped unfinished
        assert f"neuro master: metrics at {url}" in out + err  # stderr when stdout is piped
    finally:
        stop_processes([master])
