"""Progress output: pure rate/ETA/format functions, then real masters on a pipe and on a pty."""

from __future__ import annotations

import fcntl
import io
import json
import math
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from master.observe.progress import (
    GenerationStats,
    Mark,
    RateTracker,
    eta_seconds,
    format_duration,
    format_si,
    generation_json,
    generation_line,
    is_terminal,
    notice_stream,
    progress_bar,
    rates,
)
from master.run.rundir import GenerationRecord, read_metrics
from tests.support.processes import REPO, worker_env
from tests.support.tiny import LOCAL_CARTPOLE_ARGS

MASTER = [sys.executable, "-c", "import sys; from master.cli import main; sys.exit(main())"]
SMALL_RUN = [*LOCAL_CARTPOLE_ARGS, "--seed", "1"]
EXTRA_FIELDS = {"evals_per_s", "frames_per_s", "workers", "eta_s"}


def record(generation: int = 0, **fields: object) -> GenerationRecord:
    values: dict[str, object] = dict(
        generation=generation, frames=1000 * (generation + 1), evaluations=14 * (generation + 1),
        wall_s=2.0 * (generation + 1), score_mean=61.7, score_max=500.0, elite_score=487.25,
        elite_seeds=[7, 11], generation_evaluations=14, generation_frames=1000,
        failed_evaluations=0, leases_reissued=0,
    )  # fmt: skip
    values.update(fields)
    return GenerationRecord(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "-"),
        (math.nan, "-"),
        (math.inf, "-"),
        (0, "0"),
        (7, "7"),
        (2.5, "2.5"),
        (950, "950"),
        (999.4, "999"),
        (999.6, "1.00k"),
        (1000, "1.00k"),
        (12_345, "12.3k"),
        (123_456, "123k"),
        (1_234_567, "1.23M"),
        (4e9, "4.00G"),
    ],
)
def test_format_si(value: float | None, text: str) -> None:
    assert format_si(value) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (-1.0, "-"),
        (math.inf, "-"),
        (0.0, "0s"),
        (44.6, "45s"),
        (59.4, "59s"),
        (59.6, "1m00s"),
        (185, "3m05s"),
        (3600, "1h00m"),
        (7620, "2h07m"),
        (3 * 86400 + 4 * 3600 + 59, "3d04h"),
    ],
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (Mark(0, 0, 0, 0.0), Mark(1, 5000, 100, 2.0), (50.0, 2500.0)),
        (Mark(3, 10_000, 300, 10.0), Mark(4, 12_000, 400, 14.0), (25.0, 500.0)),
        (Mark(3, 10_000, 300, 10.0), Mark(4, 12_000, 400, 10.0), (None, None)),  # no time
    ],
)
def test_rates(before: Mark, after: Mark, expected: tuple) -> None:
    assert rates(before, after) == expected


# Two marks 10 s and 2 generations apart, 3,000 frames per generation.
HISTORY = [Mark(2, 6000, 0, 20.0), Mark(4, 12_000, 0, 30.0)]


@pytest.mark.parametrize(
    ("marks", "generations", "frames", "eta"),
    [
        (HISTORY, None, None, None),  # no budget: nothing to aim at
        (HISTORY, 10, None, 30.0),  # 6 generations at 5 s
        (HISTORY, 4, None, 0.0),  # spent
        (HISTORY[1:], 10, None, None),  # one mark: no rate yet
        (HISTORY[1:], 4, None, 0.0),  # spent needs no rate
        (HISTORY, None, 15_000, 5.0),  # 3,000 frames left: one generation
        (HISTORY, None, 15_001, 10.0),  # the run stops only at a generation's end
        (HISTORY, None, 12_000, 0.0),
        (HISTORY, 100, 15_000, 5.0),  # the budget reached first binds
        (HISTORY, 5, 1_000_000, 5.0),
        ([Mark(2, 6000, 0, 20.0), Mark(4, 6000, 0, 30.0)], None, 9000, None),  # no frames
        ([Mark(2, 6000, 0, 20.0), Mark(4, 6000, 0, 30.0)], 6, 9000, 10.0),
        ([Mark(4, 12_000, 0, 30.0), Mark(4, 12_000, 0, 30.0)], 10, None, None),
    ],
)
def test_eta(marks: list[Mark], generations: int | None, frames: int | None, eta: float) -> None:
    assert eta_seconds(marks, generations, frames) == eta


def test_the_tracker_measures_each_generation_and_extrapolates_from_recent_ones() -> None:
    tracker = RateTracker(Mark(0, 0, 0, 0.0), generations=10, window=2)
    # 1 s per generation, then 3 s: the ETA follows the slowdown within the window.
    walls = [1.0, 2.0, 5.0, 8.0]
    stats = [tracker.add(record(g, wall_s=w, frames=100 * (g + 1)), 2) for g, w in enumerate(walls)]
    assert [s.frames_per_s for s in stats] == [100.0, 100.0, 100 / 3, 100 / 3]
    assert [s.evals_per_s for s in stats] == [14.0, 14.0, 14 / 3, 14 / 3]
    assert [s.eta_s for s in stats] == [9.0, 8.0, 7 * 2.0, 6 * 3.0]
    assert {s.workers for s in stats} == {2}
    with pytest.raises(ValueError, match="got 0"):
        RateTracker(Mark(0, 0, 0, 0.0), window=0)


def test_the_terminal_line_shows_scores_throughput_workers_and_eta() -> None:
    line = generation_line(record(12, frames=1_234_567), GenerationStats(140.0, 9876.0, 3, 185))
    assert line == (
        "gen   12 | frames  1.23M | elite   487.2 | max   500.0 mean    61.7 | "
        "   140 evals/s  9.88k frames/s | workers   3 | tail 0.0s | ETA 3m05s"
    )
    # The phases' tail, and the backup tasks that ran in it: won / run.
    tail = generation_line(record(12, tail_s=2.46, backup_tasks=5, backup_wins=3),
                           GenerationStats(140.0, 9876.0, 3, 185))  # fmt: skip
    assert tail.endswith("workers   3 | tail 2.5s, backups 3/5 | ETA 3m05s")
    failed = generation_line(
        record(0, score_mean=math.nan, score_max=math.nan, elite_score=math.nan),
        GenerationStats(None, None, 0, None),
    )
    assert "elite       - | max       - mean       - |      - evals/s      - frames/s" in failed
    assert failed.endswith("workers   0 | tail 0.0s | ETA -")


@pytest.mark.parametrize(
    ("stats", "extra"),
    [
        (GenerationStats(140.123, 9876.54, 3, 185.06),
         {"evals_per_s": 140.12, "frames_per_s": 9876.5, "workers": 3, "eta_s": 185.1}),
        (GenerationStats(None, None, 0, None),
         {"evals_per_s": None, "frames_per_s": None, "workers": 0, "eta_s": None}),
    ],
)  # fmt: skip
def test_the_json_line_is_the_metrics_line_plus_the_stats(
    stats: GenerationStats, extra: dict
) -> None:
    line = generation_json(record(3, elite_score=math.nan), stats)
    assert "\n" not in line and "NaN" not in line
    assert json.loads(line) == {**json.loads(record(3, elite_score=math.nan).to_json()), **extra}


def test_terminal_detection_and_where_notices_go(tmp_path: Path) -> None:
    main_fd, terminal_fd = os.openpty()
    read_end, write_end = os.pipe()
    with (
        os.fdopen(terminal_fd, "w") as terminal,
        os.fdopen(write_end, "w") as pipe,
        open(tmp_path / "log", "w") as log_file,
    ):
        assert is_terminal(terminal) and notice_stream(terminal) is terminal
        for stream in (pipe, log_file, io.StringIO()):
            assert not is_terminal(stream)
            assert notice_stream(stream) is sys.stderr
    assert not is_terminal(terminal)  # closed
    for fd in (main_fd, read_end):
        os.close(fd)


@pytest.mark.parametrize("size", [(0, 0), (100, 30)])
def test_the_bar_draws_on_any_terminal_after_its_delay_and_clears_itself(
    size: tuple[int, int],
) -> None:
    """Even on a terminal that reports no size (tqdm alone would draw nothing there)."""
    main_fd, terminal_fd = os.openpty()
    columns, rows = size
    fcntl.ioctl(terminal_fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    with os.fdopen(terminal_fd, "w") as terminal:
        bar = progress_bar(terminal, "gen 3 offspring", 200, 10, "eval")
        bar.update(5)
        assert _read_available(main_fd) == b""  # too early: a short phase shows nothing
        time.sleep(0.6)
        bar.update(5)
        drawn = _read_available(main_fd)
        bar.close()
        cleared = _read_available(main_fd)
    os.close(main_fd)
    assert re.fullmatch(rb"\rgen 3 offspring: +\d+%\|.*\| 20/200 \[.*eval/s\]", drawn), drawn
    assert len(drawn.decode()) <= (columns or 80) + 1
    assert re.fullmatch(rb"\r +\r", cleared), cleared


@pytest.mark.slow
def test_a_piped_stdout_gets_exactly_one_json_line_per_generation(
    tmp_path: Path, noise_cache: Path
) -> None:
    run_dir = tmp_path / "run"
    command = [*MASTER, *SMALL_RUN, "--population", "10", "--generations", "3",
               "--run-dir", str(run_dir)]  # fmt: skip
    done = subprocess.run(command, env=worker_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = read_metrics(run_dir / "metrics.jsonl")
    lines = done.stdout.splitlines(keepends=True)
    assert len(lines) == len(metrics) == 3
    # Piped, the local worker writes where the master does.
    assert "joining master" in done.stderr and not (run_dir / "local-workers.log").exists()
    assert "\x1b" not in done.stdout and "\r" not in done.stdout
    for line, metric in zip(lines, metrics, strict=True):
        assert line.endswith("\n")
        progress = json.loads(line)
        assert set(progress) == set(metric) | EXTRA_FIELDS
        assert {k: progress[k] for k in metric} == metric
        assert progress["workers"] == 1
        assert progress["evals_per_s"] > 0 and progress["frames_per_s"] > 0
        assert progress["eta_s"] is not None and progress["eta_s"] >= 0
    assert json.loads(lines[-1])["eta_s"] == 0.0  # the budget is spent
    # The plain-text notices stay out of the JSON stream.
    run_id = json.loads((run_dir / "config.json").read_text())["run_id"]
    assert f"neuro master: run {run_id} on CartPole-v1" in done.stderr


@pytest.mark.slow
def test_a_terminal_gets_generation_lines_under_a_live_bar(
    tmp_path: Path, noise_cache: Path
) -> None:
    """A pseudo-terminal as stdout and stderr, as a shell gives them; 200 individuals on one
    worker take over a second."""
    run_dir = tmp_path / "run"
    command = [*MASTER, *SMALL_RUN, "--population", "200", "--generations", "2",
               "--run-dir", str(run_dir)]  # fmt: skip
    main_fd, terminal_fd = os.openpty()
    fcntl.ioctl(terminal_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    process = subprocess.Popen(command, env=worker_env(), cwd=REPO, stdin=subprocess.DEVNULL,
                               stdout=terminal_fd, stderr=terminal_fd)  # fmt: skip
    os.close(terminal_fd)
    try:
        screen = _read_until_closed(main_fd, deadline=time.monotonic() + 120)
        assert process.wait(30) == 0, screen.decode(errors="replace")[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(main_fd)
    text = screen.decode()
    assert "neuro master: run " in text and "\x1b[" not in text
    # The local worker's own lines go to a file in the run dir, which one line names.
    log = run_dir / "local-workers.log"
    assert f"neuro master: 1 local worker, their log in {log}" in text, text
    assert "joining master" not in text and "joining master" in log.read_text()
    # The first offspring phase lasts at least as long as the worker takes to start: its bar
    # is drawn, and redrawn, each time on the same line (a carriage return, no newline).
    draws = re.findall(r"\rgen 0 offspring: +\d+%\|[^\r\n]*\| *(\d+)/200 \[[^\r\n]*workers \d+\]",
                       text)  # fmt: skip
    assert len(draws) >= 2, text
    assert [int(n) for n in draws] == sorted(int(n) for n in draws)
    lines = [line for line in text.split("\r\n") if "gen    " in line]
    assert len(lines) == 2, text
    for generation, line in enumerate(lines):
        # A bar drawn in this generation is wiped (spaces, carriage return) before its line is
        # written. Generation 0's bar is always drawn (its first phase waits for the worker to
        # start); a later phase shorter than the bar's delay draws none and needs no wipe.
        drawn = re.search(rf"\rgen {generation} (offspring|elite): ", text)
        if generation == 0:
            assert drawn, text
        wipe = rf"\r +\rgen    {generation} \| frames " if drawn else rf"^gen    {generation} \| "
        assert re.search(wipe, line), line
        assert re.search(r"workers   1 \| tail \d+\.\ds(, backups \d+/\d+)? \| ETA \d+s$", line), (
            line
        )
    assert lines[-1].endswith("ETA 0s")
    assert len(read_metrics(run_dir / "metrics.jsonl")) == 2


def _read_available(fd: int, wait_s: float = 0.3) -> bytes:
    data = b""
    while select.select([fd], [], [], wait_s)[0]:
        data += os.read(fd, 65536)
        wait_s = 0.05
    return data


def _read_until_closed(fd: int, deadline: float) -> bytes:
    """Everything written to the terminal until every writer closed it, or the deadline."""
    data = b""
    while time.monotonic() < deadline:
        if not select.select([fd], [], [], 0.5)[0]:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the last writer is gone
            break
        if not chunk:
            break
        data += chunk
    return data
