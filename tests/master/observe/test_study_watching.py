"""Watching a real study of two runs: JSON lines, neuro-master status and /metrics tell what each
run's metrics.jsonl says; on a terminal, neuro-master --study keeps one table of the runs.

The in-process test freezes its one worker (SIGSTOP) once both runs have generations, so the
study stands still while status and /metrics are read; the command's test reads the terminal
through the screen model of test_study_progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import io
import json
import os
import signal
import struct
import subprocess
import sys
import termios
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from master.observe.prometheus import start_metrics_server
from master.observe.study_progress import StudyProgress
from master.run.rundir import read_metrics
from master.run.start import RunOptions, ServeOptions
from master.run.study import StudyRunPlan
from master.run.study_master import StudyServing, start_study
from master.study.file import parse_study
from master.study.studydir import StudyDir
from tests.master.observe.test_study_progress import screen
from tests.support.processes import REPO, spawn_worker, stop_processes, worker_env

STUDY = """
name = "two"
max_concurrent_runs = 2
test_episodes = 2

[settings]
population_size = 8
truncation = 2
elite_candidates = 2
elite_episodes = 2

[budget]
no_target = true
generations = 4

[[grid]]
envs = ["CartPole-v1"]
seeds = [1, 2]
"""
NAMES = ["cartpole-v1-s1", "cartpole-v1-s2"]
RUN_S = 180.0


def plans_of(study_dir: Path) -> tuple[StudyServing, StudyDir]:
    """The study opened in `study_dir` as neuro-master opens it."""
    study = parse_study(STUDY, "study.toml")
    directory = StudyDir(study_dir)
    plan = directory.open(study)
    plans = [StudyRunPlan(run.name, run.env, run.seed, run.label, run.config, run.test_episodes,
                          directory.run_dir(run.name), plan.states[run.name])
             for run in study.runs]  # fmt: skip
    serving = StudyServing(study.name, plans, directory, study.max_concurrent_runs,
                           directory.path)  # fmt: skip
    return serving, directory


def status_json(port: int) -> dict:
    """`neuro-master status --json`, run as a user runs it."""
    command = [sys.executable, "-m", "master", "status", "--master", f"127.0.0.1:{port}", "--json"]
    done = subprocess.run(command, env=worker_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    return json.loads(done.stdout)


def scrape(url: str) -> dict[str, dict[tuple, float]]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    parsed: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            parsed.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return parsed


async def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def settled(read: Callable[[], Any], quiet_s: float = 0.3, timeout: float = 10.0) -> None:
    """Waits until read() has not changed for quiet_s (a report in flight has landed)."""
    deadline, last, since = time.monotonic() + timeout, read(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, "the study kept changing with its worker frozen"
        await asyncio.sleep(0.02)
        if (now := read()) != last:
            last, since = now, time.monotonic()


def test_status_metrics_and_json_lines_follow_each_run_of_a_real_study(
    tmp_path: Path, noise_cache: Path
) -> None:
    serving, directory = plans_of(tmp_path / "study")
    piped = io.StringIO()

    async def main() -> tuple[dict, dict, dict, dict]:
        frozen: dict[str, list[dict]] = {}
        master = await start_study(serving, ServeOptions(), RunOptions(out=None))
        runner = master.runner
        runner.options.watcher = StudyProgress(runner, piped)
        metrics = start_metrics_server(runner, "127.0.0.1", 0, study=runner)
        study_task = asyncio.ensure_future(runner.run())
        worker = spawn_worker(master.port, "w-watch")
        try:

            def generations() -> list[int]:
                return [v.snapshot.generation if v.snapshot else 0 for v in runner.runs()]

            await until(lambda: min(generations()) >= 1 or study_task.done(), 90,
                        "a generation of each run")  # fmt: skip
            os.kill(worker.pid, signal.SIGSTOP)  # the study stands still
            await settled(lambda: (generations(), runner.states()))
            views = {v.name: v for v in runner.runs()}
            frozen = {n: read_metrics(directory.run_dir(n) / "metrics.jsonl") for n in NAMES}
            status = await asyncio.to_thread(status_json, master.port)
            samples = await asyncio.to_thread(scrape, metrics.url)
            os.kill(worker.pid, signal.SIGCONT)
            states = await asyncio.wait_for(study_task, RUN_S)
            after = await asyncio.to_thread(status_json, master.port)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGCONT)
            study_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await study_task
            stop_processes([worker])
            await metrics.close()
            await master.stop(0)
        return views, status, samples, {"states": states, "after": after, "frozen": frozen}

    views, status, samples, end = asyncio.run(main())
    assert end["states"] == dict.fromkeys(NAMES, "complete")

    # Frozen mid-study: status and /metrics say what each run's own figures say.
    assert [run["name"] for run in status["runs"]] == NAMES
    for run in status["runs"]:
        view = views[run["name"]]
        snap = view.snapshot
        assert snap is not None and run["state"] == view.state
        assert (run["env_id"], run["seed"], run["label"]) == ("CartPole-v1", view.seed, "")
        assert (run["generation"], run["frames"]) == (snap.generation, snap.frames)
        lines = end["frozen"][run["name"]]
        assert run["generation"] == len(lines) >= 1
        assert run["elite_score"] == lines[-1]["elite_score"]
        label = (("run", run["name"]),)
        assert samples["neuro_study_run_generation"][label] == run["generation"]
        assert samples["neuro_study_run_frames_total"][label] == run["frames"]
        assert samples["neuro_study_run_elite_score"][label] == run["elite_score"]
        assert samples["neuro_study_run_score_mean"][label] == lines[-1]["score_mean"]
        for state in ("queued", "running", "complete", "failed"):
            key = (("run", run["name"]), ("state", state))
            assert samples["neuro_study_run_state"][key] == float(run["state"] == state)
    assert samples["neuro_workers_connected"][()] == status["workers"] == 1
    running = sum(run["state"] == "running" for run in status["runs"])
    assert samples["neuro_study_runs"][(("state", "running"),)] == running
    utilisation = samples["neuro_fleet_utilisation"][()]
    assert status["utilisation"] is None or abs(status["utilisation"] - utilisation) < 0.2

    # At the end, every run complete, in status and in study.json.
    assert [(r["name"], r["state"]) for r in end["after"]["runs"]] == [
        (name, "complete") for name in NAMES
    ]
    assert directory.states() == dict.fromkeys(NAMES, "complete")

    # The JSON lines: each run's state changes in order, and each of its generations as its
    # metrics.jsonl line with its name.
    lines = [json.loads(line) for line in piped.getvalue().splitlines()]
    for name in NAMES:
        changes = [line["state"] for line in lines if line["run"] == name and "state" in line]
        assert changes == ["queued", "running", "complete"], (name, changes)
        generations = [line for line in lines if line["run"] == name and "generation" in line]
        metrics = read_metrics(directory.run_dir(name) / "metrics.jsonl")
        assert len(generations) == len(metrics) == 4
        for line, metric in zip(generations, metrics, strict=True):
            assert {k: line[k] for k in metric} == metric
    assert {line["run"] for line in lines} == set(NAMES)


def on_a_terminal(
    command: list[str],
    until_shown: bytes | None = None,
    then: Callable[[subprocess.Popen], None] | None = None,
) -> tuple[int, str]:
    """Runs `command` with a pseudo-terminal as stdout and stderr (as a shell gives them) and
    returns its exit status and all it wrote; once it has written `until_shown`, calls `then`
    with the process (to signal it)."""
    main_fd, terminal_fd = os.openpty()
    fcntl.ioctl(terminal_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    attributes = termios.tcgetattr(terminal_fd)
    attributes[1] &= ~termios.OPOST  # the screen model reads what was written
    termios.tcsetattr(terminal_fd, termios.TCSANOW, attributes)
    process = subprocess.Popen(command, env=worker_env(), cwd=REPO, stdin=subprocess.DEVNULL,
                               stdout=terminal_fd, stderr=terminal_fd)  # fmt: skip
    os.close(terminal_fd)
    written = b""
    try:
        deadline = time.monotonic() + RUN_S
        while time.monotonic() < deadline:
            try:
                chunk = os.read(main_fd, 65536)
            except OSError:  # the terminal closed: every writer exited
                break
            if not chunk:
                break
            written += chunk
            if until_shown is not None and then is not None and until_shown in written:
                then(process)
                until_shown = None
        status = process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(main_fd)
    return status, written.decode(errors="replace")


def test_neuro_master_study_on_a_terminal_keeps_one_table_of_the_runs(
    tmp_path: Path, noise_cache: Path
) -> None:
    """The command as a user runs it, a pseudo-terminal as stdout and stderr (as a shell gives
    them), two local workers: the screen ends with the table of both runs complete."""
    study_file = tmp_path / "two.toml"
    study_file.write_text(STUDY)
    study_dir = tmp_path / "study"
    command = [sys.executable, "-m", "master", "--study", str(study_file), "--study-dir",
               str(study_dir), "--local-workers", "2", "--port", "0"]  # fmt: skip
    status, text = on_a_terminal(command)
    assert status == 0, text[-3000:]
    shown = [line for line in screen(text) if line]
    assert "\x1b[J" in text  # redrawn in place
    # The master's log lines come above the table, whole, rather than inside it.
    tests = [line for line in shown if "final test of 2 episodes" in line]
    assert len(tests) == 2 and all(" INFO master run " in line for line in tests), shown
    # The local workers' lines go to the study dir's log, which one line names.
    assert "joining master" not in text
    assert "joining master" in (study_dir / "local-workers.log").read_text()
    for name in NAMES:
        assert f"run {name} started" in shown and f"run {name} complete" in shown
    header = next(i for i, line in enumerate(shown) if line.startswith("run  "))
    assert shown[header].split() == ["run", "env", "seed", "gen", "frames", "elite", "ETA",
                                     "state"]  # fmt: skip
    rows = [line.split() for line in shown[header + 1 : header + 3]]
    for row, name, seed in zip(rows, NAMES, (1, 2), strict=True):
        metrics = read_metrics(study_dir / "runs" / name / "metrics.jsonl")
        assert row[:4] == [name, "CartPole-v1", str(seed), str(len(metrics))]
        assert row[5] == f"{metrics[-1]['elite_score']:.1f}" and row[-1] == "complete"
    assert shown[header + 3].startswith("fleet: workers ")
    assert shown[header + 3].endswith("| runs 2 complete")


def test_ctrl_c_on_a_terminal_says_stopping_above_the_table(tmp_path: Path, noise_cache: Path):
    """Ctrl-C while the table is drawn: "stopping" comes above the table, which stays whole
    (one header, its rows below it), and the study stops resumable (130)."""
    study_file = tmp_path / "two.toml"
    study_file.write_text(STUDY.replace("generations = 4", "generations = 1000"))
    study_dir = tmp_path / "study"
    command = [sys.executable, "-m", "master", "--study", str(study_file), "--study-dir",
               str(study_dir), "--local-workers", "2", "--port", "0"]  # fmt: skip
    status, text = on_a_terminal(command, b"fleet: workers", lambda p: p.send_signal(2))
    assert status == 130, text[-3000:]
    shown = [line for line in screen(text) if line]
    headers = [i for i, line in enumerate(shown) if line.startswith("run  ")]
    stopping = [i for i, line in enumerate(shown) if line == "neuro master: stopping"]
    assert len(headers) == 1 and len(stopping) == 1, shown
    assert stopping[0] < headers[0], shown
    rows = [line.split()[0] for line in shown[headers[0] + 1 : headers[0] + 3]]
    assert rows == NAMES, shown
