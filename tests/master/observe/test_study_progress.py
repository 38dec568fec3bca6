"""A study's progress: the table's pure parts, JSON lines, a pseudo-terminal, a real master.

The terminal tests read what was written through a small screen model (carriage return,
newline, cursor up, erase below: the only controls the table writes), so they check the
screen a person sees, not the escape codes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
import logging
import math
import os
import re
import select
from collections.abc import Iterator
from pathlib import Path

import pytest

from master.observe.events import RUN_STATES, GenerationRecord, RunSnapshot, RunView
from master.observe.progress import GenerationStats, generation_json
from master.observe.study_progress import (
    Row,
    StudyProgress,
    fleet_line,
    row_of,
    run_generation_json,
    state_json,
    table_lines,
)
from master.run.rundir import read_metrics
from tests.support.harness import live_master
from tests.support.processes import spawn_worker, stop_processes
from tests.support.tiny import tiny_cartpole


def snapshot(
    generation: int = 3, frames: int = 12_000, elite: float = 21.5, **fields
) -> RunSnapshot:
    values = dict(run_id="r", env_id="CartPole-v1", generation=generation, phase="offspring",
                  frames=frames, evaluations=40, elite_score=elite, elite_seeds=(1, 2),
                  tasks_pending=0, tasks_leased=0, tasks_done=0, workers=2, leases_reissued=0,
                  run_complete=False, wall_s=10.0)  # fmt: skip
    values.update(fields)
    return RunSnapshot(**values)  # type: ignore[arg-type]


def record(generation: int, **fields) -> GenerationRecord:
    values = dict(generation=generation, frames=1000 * (generation + 1),
                  evaluations=14 * (generation + 1), wall_s=2.0 * (generation + 1),
                  score_mean=61.7, score_max=500.0, elite_score=487.25, elite_seeds=[7, 11],
                  generation_evaluations=14, generation_frames=1000, failed_evaluations=0,
                  leases_reissued=0)  # fmt: skip
    values.update(fields)
    return GenerationRecord(**values)  # type: ignore[arg-type]


def view_of(name: str, state: str = "running", snap: RunSnapshot | None = None, **kw) -> RunView:
    return RunView(name=name, env_id=kw.pop("env_id", "CartPole-v1"), seed=kw.pop("seed", 0),
                   label=kw.pop("label", ""), state=state, snapshot=snap, **kw)  # fmt: skip


class StandInStudy:
    """A StudyView whose runs the test sets."""

    def __init__(self, runs: list[RunView], utilisation: float | None = None) -> None:
        self.views = runs
        self.busy = utilisation
        self.reads = 0

    def runs(self) -> tuple[RunView, ...]:
        self.reads += 1
        return tuple(self.views)

    def utilisation(self) -> float | None:
        return self.busy


def screen(written: str) -> list[str]:
    """The lines a terminal shows after `written`: text, \\r, \\n, ESC[nA, ESC[J."""
    lines, row, col = [""], 0, 0
    for token in re.findall(r"\x1b\[(\d*)([AJ])|(\r)|(\n)|([^\x1b\r\n]+)", written):
        count, command, cr, nl, text = token
        if command == "A":
            row = max(row - int(count or 1), 0)
        elif command == "J":
            lines[row] = lines[row][:col]
            del lines[row + 1 :]
        elif cr:
            col = 0
        elif nl:
            row, col = row + 1, 0
            if row == len(lines):
                lines.append("")
        else:
            line = lines[row].ljust(col)
            lines[row] = line[:col] + text + line[col + len(text) :]
            col += len(text)
    return lines


def test_the_screen_model_follows_the_controls() -> None:
    assert screen("ab\ncd\r\x1b[1A\x1b[Jxy") == ["xy"]
    assert screen("one\ntwo\nthree\r\x1b[2A\x1b[Jnew\nrow") == ["new", "row"]
    assert screen("abc\rX") == ["Xbc"]


# -- the table's pure parts -------------------------------------------------------------------


def test_a_row_shows_a_run_and_what_it_does_not_know_yet() -> None:
    running = row_of(view_of("frostbite-v4-s0", snap=snapshot(), seed=4), eta_s=65.0)
    assert running == Row("frostbite-v4-s0", "CartPole-v1", 4, 3, 12_000, 21.5, 65.0, "running")
    queued = row_of(view_of("q", "queued"), eta_s=None)
    assert (queued.generation, queued.frames, queued.elite_score) == (None, None, None)
    # Only a running run has an ETA.
    assert row_of(view_of("c", "complete", snapshot()), eta_s=30.0).eta_s is None
    lines = table_lines([running, queued], "fleet", height=10, width=100)
    assert lines[0].split() == ["run", "env", "seed", "gen", "frames", "elite", "ETA", "state"]
    assert lines[1].split() == ["frostbite-v4-s0", "CartPole-v1", "4", "3", "12.0k", "21.5",
                                "1m05s", "running"]  # fmt: skip
    assert lines[2].split() == ["q", "CartPole-v1", "0", "-", "-", "-", "-", "queued"]
    assert lines[3] == "fleet"
    nan_elite = row_of(view_of("n", snap=snapshot(elite=math.nan)), eta_s=None)
    assert table_lines([nan_elite], "f", 5, 100)[1].split()[5] == "-"


def test_the_fleet_line_counts_runs_by_state_and_shows_how_busy() -> None:
    runs = [view_of("a"), view_of("b", "queued"), view_of("c", "queued"), view_of("d", "complete")]
    assert fleet_line(runs, 12, 0.874) == (
        "fleet: workers 12 | busy 87% | runs 2 queued, 1 running, 1 complete"
    )
    assert fleet_line([], None, None) == "fleet: workers - | busy - | runs none"
    assert fleet_line(runs[:1], 0, math.nan) == "fleet: workers 0 | busy - | runs 1 running"


def test_65_runs_fit_the_terminal_running_ones_first() -> None:
    states = ["complete"] * 20 + ["running"] * 13 + ["queued"] * 30 + ["failed"] * 2
    rows = [row_of(view_of(f"game{i:02d}-s{i % 5}", state), None) for i, state in enumerate(states)]
    lines = table_lines(rows, "fleet: ...", height=23, width=80)
    assert len(lines) == 23 and all(len(line) <= 79 for line in lines)
    body = lines[1:-2]
    assert len(body) == 20
    assert [line.split()[-1] for line in body] == ["running"] * 13 + ["failed"] * 2 + [
        "complete"
    ] * 5
    # Within a state, the study file's order.
    assert [line.split()[0] for line in body[:13]] == [
        f"game{i:02d}-s{i % 5}" for i in range(20, 33)
    ]
    assert lines[-2] == "... 45 more runs: 15 complete, 30 queued"
    assert lines[-1] == "fleet: ..."
    # A study that fits is shown whole, in its file's order; a tiny terminal still gets a line.
    assert len(table_lines(rows[:5], "f", height=23, width=80)) == 7
    tiny = table_lines(rows, "f", height=1, width=10)
    assert tiny == ["run  env~", "... 65 m~", "f"]


def test_long_or_unprintable_names_are_cut_and_escaped() -> None:
    row = row_of(view_of("x" * 50, env_id="evil\x1b[2Jenv\n"), None)
    line = table_lines([row], "f", 5, 200)[1]
    assert "\x1b" not in line and "\n" not in line
    assert line.startswith("x" * 31 + "~  evil?[2Jenv?")


# -- JSON lines -----------------------------------------------------------------------------


def test_piped_each_generation_and_each_state_change_is_one_json_line() -> None:
    out = io.StringIO()
    study = StandInStudy([view_of("a"), view_of("b", "queued")])
    progress = StudyProgress(study, out)  # a StringIO is no terminal
    assert not progress.interactive
    progress.run_state("a", "queued")
    progress.run_state("a", "queued")  # no change: no line
    progress.run_state("a", "running")
    observer = progress.observer_for("a", generations=4)
    observer.started(lambda: snapshot(generation=0, frames=0, evaluations=0, wall_s=0.0))
    first, second = record(0), record(1, elite_score=math.nan)
    observer.generation(first, 3)
    observer.generation(second, 3)
    progress.run_state("a", "failed", "an error\nof two lines")
    progress.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 5 and study.reads == 0  # JSON lines never read the table
    assert [json.loads(line) for line in (lines[0], lines[1], lines[4])] == [
        {"run": "a", "state": "queued", "error": ""},
        {"run": "a", "state": "running", "error": ""},
        {"run": "a", "state": "failed", "error": "an error\nof two lines"},
    ]
    for line, rec, stats in zip(
        lines[2:4],
        (first, second),
        (GenerationStats(7.0, 500.0, 3, 6.0), GenerationStats(7.0, 500.0, 3, 4.0)),
        strict=True,
    ):
        document = json.loads(line)
        assert next(iter(document)) == "run" and document.pop("run") == "a"
        assert document == json.loads(generation_json(rec, stats))
    assert "NaN" not in lines[3]
    assert (
        json.loads(run_generation_json("b", first, GenerationStats(None, None, 0, None)))["eta_s"]
        is None
    )
    assert json.loads(state_json("b", "complete")) == {"run": "b", "state": "complete", "error": ""}


def test_quiet_prints_nothing_and_a_bad_state_is_named() -> None:
    out = io.StringIO()
    for interactive in (None, True, False):
        progress = StudyProgress(StandInStudy([view_of("a")]), out, interactive, quiet=True)
        progress.run_state("a", "running")
        observer = progress.observer_for("a")
        observer.started(lambda: snapshot(generation=0))
        observer.generation(record(0), 1)
        observer.stopped()
        progress.close()
    assert out.getvalue() == ""
    with pytest.raises(ValueError, match="not 'paused'"):
        StudyProgress(StandInStudy([]), out).run_state("a", "paused")
    assert set(RUN_STATES) == {"queued", "running", "complete", "failed"}


def test_a_closed_stream_stops_the_output_not_the_study() -> None:
    out = io.StringIO()
    progress = StudyProgress(StandInStudy([view_of("a")]), out)
    observer = progress.observer_for("a")
    observer.started(lambda: snapshot(generation=0))
    out.close()
    observer.generation(record(0), 1)  # no exception: the run goes on
    progress.run_state("a", "complete")


# -- a terminal -----------------------------------------------------------------------------


@contextlib.contextmanager
def pseudo_terminal(columns: int = 100, rows: int = 20) -> Iterator[tuple[io.TextIOWrapper, int]]:
    import fcntl
    import struct
    import termios

    main_fd, terminal_fd = os.openpty()
    fcntl.ioctl(terminal_fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    # The terminal's own newline translation off: the screen model reads what was written.
    attributes = termios.tcgetattr(terminal_fd)
    attributes[1] &= ~termios.OPOST
    termios.tcsetattr(terminal_fd, termios.TCSANOW, attributes)
    terminal = os.fdopen(terminal_fd, "w")
    try:
        yield terminal, main_fd
    finally:
        terminal.close()
        os.close(main_fd)


def read_available(fd: int) -> str:
    chunks = []
    while select.select([fd], [], [], 0.05)[0]:
        chunks.append(os.read(fd, 65536))
    return b"".join(chunks).decode()


def test_a_terminal_gets_one_table_redrawn_in_place() -> None:
    runs = [view_of(f"run-{i}", "queued", seed=i) for i in range(3)]
    study = StandInStudy([*runs, view_of("done-before", "complete", seed=3)], utilisation=0.5)

    during: list[str] = []

    async def scenario(terminal: io.TextIOWrapper, main_fd: int) -> str:
        progress = StudyProgress(study, terminal)
        assert progress.interactive
        written = []
        for name in ("run-0", "run-1", "run-2"):
            progress.run_state(name, "queued")  # a row, no notice
        progress.run_state("done-before", "complete")  # so was it when the study started
        study.views[0] = view_of("run-0", "running", snapshot(generation=0, frames=0), seed=0)
        progress.run_state("run-0", "running")
        observer = progress.observer_for("run-0", generations=10)
        observer.started(lambda: snapshot(generation=0, frames=0, evaluations=0, wall_s=0.0))
        for generation in range(3):
            await asyncio.sleep(0.6)  # at least one periodic redraw between generations
            written.append(read_available(main_fd))
            rec = record(generation)
            observer.generation(rec, 2)
            study.views[0] = view_of(
                "run-0", "running", snapshot(generation + 1, rec.frames, rec.elite_score), seed=0
            )
        await asyncio.sleep(0.6)
        written.append(read_available(main_fd))
        during.append("".join(written))
        study.views[0] = dataclasses.replace(study.views[0], state="complete")
        study.views[1] = view_of("run-1", "failed", None, seed=1, error="boom")
        progress.run_state("run-0", "complete")
        progress.run_state("run-1", "failed", "boom")
        study.views[2] = view_of("run-2", "complete", snapshot(generation=9), seed=2)
        progress.run_state("run-2", "complete")
        await asyncio.sleep(1.2)  # every run is over: the ticker draws a last time and stops
        progress.close()  # nothing more
        progress.run_state("run-2", "failed", "late")  # below the table, which stays
        written.append(read_available(main_fd))
        reads = study.reads
        await asyncio.sleep(1.2)
        assert study.reads == reads  # no redraws after the end
        return "".join(written)

    with pseudo_terminal() as (terminal, main_fd):
        written = asyncio.run(scenario(terminal, main_fd))
    assert written.count("\x1b[J") >= 5  # redrawn, each time over the last one
    shown = screen(written)
    assert shown[:4] == [
        "run run-0 started",
        "run run-0 complete",
        "run run-1 failed: boom",
        "run run-2 complete",
    ]
    table = [line.split() for line in shown[4:10]]
    assert table[0][:2] == ["run", "env"]
    assert table[1] == ["run-0", "CartPole-v1", "0", "3", "3.00k", "487.2", "-", "complete"]
    assert table[2] == ["run-1", "CartPole-v1", "1", "-", "-", "-", "-", "failed"]
    assert table[3] == ["run-2", "CartPole-v1", "2", "9", "12.0k", "21.5", "-", "complete"]
    assert table[4] == ["done-before", "CartPole-v1", "3", "-", "-", "-", "-", "complete"]
    assert shown[9] == "fleet: workers 2 | busy 50% | runs 3 complete, 1 failed"
    assert shown[10:] == ["run run-2 failed: late", ""]
    # While it ran: the ETA of the running run (7 generations at 2 s, counted down).
    [row] = [line.split() for line in screen(during[0]) if line.startswith("run-0 ")]
    assert row[3:5] == ["3", "3.00k"] and row[-1] == "running"
    assert re.fullmatch(r"1[0-4]s", row[6]), row


# -- a real master --------------------------------------------------------------------------


def test_a_real_runs_generations_reach_the_json_lines_and_the_table(
    tmp_path: Path, noise_cache: Path
) -> None:
    """One real run watched as a study's run would be: its Trainer with observer_for's observer."""
    run_dir = tmp_path / "run"
    config = tiny_cartpole(generations=3, population_size=8, target_score=None, seed=3)
    piped, table = io.StringIO(), io.StringIO()

    async def scenario() -> None:
        async with live_master(config, run_dir, train=False) as live:
            trainer = live.trainer
            state = {"value": "running"}

            class OneRun:
                def runs(self) -> tuple[RunView, ...]:
                    return (RunView("cartpole-s3", "CartPole-v1", 3, "", state["value"],
                                    trainer.snapshot()),)  # fmt: skip

                def utilisation(self) -> float | None:
                    return None

            json_lines = StudyProgress(OneRun(), piped)
            live_table = StudyProgress(OneRun(), table, interactive=True)
            for progress in (json_lines, live_table):
                progress.run_state("cartpole-s3", "running")
                trainer.observers.append(
                    progress.observer_for("cartpole-s3", generations=config.generations)
                )
            worker = spawn_worker(live.port, "w-study-progress")
            try:
                await asyncio.wait_for(live.start_training(), 120)
            finally:
                stop_processes([worker])
            state["value"] = "complete"
            for progress in (json_lines, live_table):
                progress.run_state("cartpole-s3", "complete")
                progress.close()

    asyncio.run(scenario())
    metrics = read_metrics(run_dir / "metrics.jsonl")
    lines = [json.loads(line) for line in piped.getvalue().splitlines()]
    assert lines[0] == {"run": "cartpole-s3", "state": "running", "error": ""}
    assert lines[-1] == {"run": "cartpole-s3", "state": "complete", "error": ""}
    generations = lines[1:-1]
    assert len(generations) == len(metrics) == 3
    for line, metric in zip(generations, metrics, strict=True):
        assert line["run"] == "cartpole-s3" and {k: line[k] for k in metric} == metric
        assert line["workers"] == 1 and line["eta_s"] is not None
    assert generations[-1]["eta_s"] == 0.0
    shown = screen(table.getvalue())
    [row] = [line.split() for line in shown if line.startswith("cartpole-s3 ")]
    last = metrics[-1]
    assert row[:4] == ["cartpole-s3", "CartPole-v1", "3", "3"]
    assert row[5] == f"{last['elite_score']:.1f}" and row[-1] == "complete"
    assert shown[-2:] == ["fleet: workers 1 | busy - | runs 1 complete", ""]


def test_log_records_go_above_the_table_not_into_it() -> None:
    """A log handler writing to the terminal would land inside the table and break its
    redrawing: while the table is drawn its lines go above it, from any thread."""
    study = StandInStudy([view_of("run-0", "running", snapshot(generation=2))])

    async def scenario(terminal: io.TextIOWrapper, main_fd: int) -> str:
        handler = logging.StreamHandler(terminal)
        root = logging.getLogger()
        root.addHandler(handler)
        try:
            progress = StudyProgress(study, terminal)
            progress.run_state("run-0", "running")
            await asyncio.sleep(0.1)  # the table is drawn
            assert handler.stream is not terminal
            await asyncio.to_thread(logging.getLogger("elsewhere").warning, "from a thread")
            logging.getLogger("here").warning("two\nlines")
            progress.notice("a notice")
            await asyncio.sleep(0.6)
            progress.close()
            assert handler.stream is terminal  # given back
            logging.getLogger("after").warning("after the study")
        finally:
            root.removeHandler(handler)
        return read_available(main_fd)

    with pseudo_terminal() as (terminal, main_fd):
        written = asyncio.run(scenario(terminal, main_fd))
    shown = screen(written)
    assert shown[:4] == ["from a thread", "two", "lines", "a notice"]
    assert shown[4].split()[:2] == ["run", "env"] and shown[5].startswith("run-0 ")
    assert shown[6] == "fleet: workers 2 | busy - | runs 1 running"
    assert shown[7:] == ["after the study", ""]
