"""A study's progress on the master's terminal: a live table of its runs, or JSON lines.

On a terminal the study is one table, redrawn in place: a line per run (name, env, seed,
generation, frames, elite, ETA, state) and a line for the fleet (workers, how busy they are,
runs by state). A study of 65 runs does not fit a terminal, so the table shows the running
runs first, then the failed, complete and queued ones as far as the terminal's height allows,
and counts the rest; generations do not scroll (they are the table's figures), and only a
run's start, end or failure prints a line above it. Anywhere else (a file, a pipe, a
container's log) each generation of each run prints progress.py's JSON line with a "run"
field, and each change of a run's state one line {"run", "state", "error"}.

The table's rows and lines are pure functions of the runs; StudyProgress does the I/O.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from master.observe.events import (
    RUN_STATES,
    GenerationRecord,
    Observer,
    RunSnapshot,
    RunView,
    StudyView,
)
from master.observe.progress import (
    GenerationStats,
    Mark,
    Output,
    RateTracker,
    format_duration,
    format_score,
    format_si,
    generation_json,
    is_terminal,
    terminal_size,
)

log = logging.getLogger(__name__)

REDRAW_S = 0.5
"""The table is redrawn this often: it follows every run's running phase, not only their ends."""
NAME_WIDTH = 32
ENV_WIDTH = 24
"""Longer names and env ids are cut in the table (the JSON lines and status carry them whole)."""
SHOWN_FIRST = ("running", "failed", "complete", "queued")
"""Which runs get the table's rows when not all fit: running ones first."""
_ERASE_TO_END = "\x1b[J"


@dataclass(frozen=True)
class Estimate:
    """A run's ETA as of its last generation, counted down by the time since."""

    eta_s: float | None
    at: float
    """time.monotonic() when it was made."""

    def now(self, now: float) -> float | None:
        """Seconds left as of `now`, never below 0; None when unknown."""
        return None if self.eta_s is None else max(0.0, self.eta_s - (now - self.at))


@dataclass(frozen=True)
class Row:
    """One run's line in the table."""

    name: str
    env_id: str
    seed: int
    generation: int | None
    frames: int | None
    elite_score: float | None
    eta_s: float | None
    state: str


def row_of(run: RunView, eta_s: float | None) -> Row:
    """The table's row for a run; figures it does not have yet are None."""
    s = run.snapshot
    return Row(
        name=run.name,
        env_id=run.env_id,
        seed=run.seed,
        generation=None if s is None else s.generation,
        frames=None if s is None else s.frames,
        elite_score=None if s is None else s.elite_score,
        eta_s=eta_s if run.state == "running" else None,
        state=run.state,
    )


def fleet_line(runs: Sequence[RunView], workers: int | None, utilisation: float | None) -> str:
    """The fleet's line: workers, how busy they are, the study's runs by state."""
    counts = {state: sum(run.state == state for run in runs) for state in RUN_STATES}
    by_state = ", ".join(f"{counts[state]} {state}" for state in RUN_STATES if counts[state])
    busy = "-" if utilisation is None or not math.isfinite(utilisation) else f"{utilisation:.0%}"
    shown_workers = "-" if workers is None else str(workers)
    return f"fleet: workers {shown_workers} | busy {busy} | runs {by_state or 'none'}"


def table_lines(rows: Sequence[Row], fleet: str, height: int, width: int) -> list[str]:
    """The table as lines of at most `width` - 1 characters, at most `height` lines in all
    (3 at the least: the header, a count of the runs, the fleet's line).

    Rows beyond the height are left out, running runs kept first, and one line counts them.
    """
    room = max(height - 2, 1)  # the header and the fleet's line
    shown = _shown(rows, room)
    names = max((len(r.name) for r in shown), default=3)
    envs = max((len(r.env_id) for r in shown), default=3)
    name_w, env_w = min(max(names, 3), NAME_WIDTH), min(max(envs, 3), ENV_WIDTH)
    seed_w = max([4, *(len(str(r.seed)) for r in shown)])
    header = (
        f"{'run':<{name_w}}  {'env':<{env_w}}  {'seed':>{seed_w}}  {'gen':>5}  {'frames':>6}  "
        f"{'elite':>8}  {'ETA':>6}  state"
    )
    lines = [header]
    for r in shown:
        lines.append(
            f"{_cut(r.name, name_w):<{name_w}}  {_cut(r.env_id, env_w):<{env_w}}  "
            f"{r.seed:>{seed_w}}  {_or_dash(r.generation):>5}  {format_si(r.frames):>6}  "
            f"{_score(r.elite_score):>8}  {format_duration(r.eta_s):>6}  {r.state}"
        )
    left_out = [r for r in rows if r not in shown]
    if left_out:
        counts = {state: sum(r.state == state for r in left_out) for state in SHOWN_FIRST}
        what = ", ".join(f"{n} {state}" for state, n in counts.items() if n)
        lines.append(f"... {len(left_out)} more runs: {what}")
    lines.append(fleet)
    return [_cut(line, max(width - 1, 1)) for line in lines]


def _shown(rows: Sequence[Row], room: int) -> list[Row]:
    """The rows that fit in `room` lines (one kept for the count of the rest), by state."""
    if len(rows) <= room:
        return list(rows)
    ranked = sorted(rows, key=lambda r: _rank(r.state))  # stable: the file's order within
    return ranked[: max(room - 1, 0)]


def _rank(state: str) -> int:
    return SHOWN_FIRST.index(state) if state in SHOWN_FIRST else len(SHOWN_FIRST)


def _cut(text: str, width: int) -> str:
    """`text` in at most `width` characters, printable (names come from a file, ids from envs)."""
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= width else text[: max(width - 1, 0)] + "~"


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def _score(value: float | None) -> str:
    return "-" if value is None else format_score(value)


def state_json(name: str, state: str, error: str = "") -> str:
    """The JSON line a log gets when a run's state changes."""
    return json.dumps({"run": name, "state": state, "error": error})


def run_generation_json(name: str, record: GenerationRecord, stats: GenerationStats) -> str:
    """progress.py's JSON line for a generation, with the run's name first."""
    document: dict[str, Any] = {"run": name, **json.loads(generation_json(record, stats))}
    return json.dumps(document)


def state_notice(name: str, state: str, error: str = "") -> str:
    """The line a terminal gets above the table when a run starts, ends or fails."""
    words = {"running": "started", "complete": "complete", "failed": "failed"}
    line = f"run {_cut(name, NAME_WIDTH * 2)} {words.get(state, state)}"
    return f"{line}: {_cut(error, 400)}" if error else line


class StudyProgress:
    """Shows every run of a study: a live table on a terminal, JSON lines elsewhere.

    Each run's Trainer gets `observer_for(name)` among its observers; the study runner calls
    `run_state(name, state, error)` when a run is queued, starts, completes or fails, and
    `close()` at the end. `interactive` overrides the terminal check; `quiet` prints nothing.
    The table is drawn by a periodic task on the event loop, from `view`. While it is on the
    screen, `notice(line)` prints a line above it, and so does every log record that would have
    gone to a terminal: written there directly, it would land inside the table and break its
    redrawing.
    """

    def __init__(
        self,
        view: StudyView,
        stream: TextIO = sys.stdout,
        interactive: bool | None = None,
        quiet: bool = False,
    ) -> None:
        self.view = view
        self.quiet = quiet
        self.interactive = not quiet and (
            is_terminal(stream) if interactive is None else interactive
        )
        self._out = Output(stream)
        self._stream = stream
        self._estimates: dict[str, Estimate] = {}
        self._states: dict[str, str] = {}
        self._workers: int | None = None
        # The screen is written from the event loop (the table) and from any thread that logs.
        self._lock = threading.Lock()
        self._lines: list[str] = []
        """The table as last drawn, the cursor at the end of its last line."""
        self._broken = False
        self._log_streams: list[tuple[logging.StreamHandler, Any]] = []
        self._ticker: asyncio.Task[None] | None = None
        self._closed = False

    def observer_for(
        self, run_name: str, generations: int | None = None, frames: int | None = None
    ) -> Observer:
        """The observer for one run's Trainer; `generations`, `frames`: its budget (the ETA)."""
        if self.quiet:
            return Observer()
        return _RunObserver(self, run_name, generations, frames)

    def run_state(self, name: str, state: str, error: str = "") -> None:
        """A run's state changed; ValueError naming a state that is none of RUN_STATES."""
        if state not in RUN_STATES:
            raise ValueError(f"a run's state is one of {RUN_STATES}, not {state!r}")
        if self.quiet or self._states.get(name) == state:
            return
        first = name not in self._states
        self._states[name] = state
        if not self.interactive:
            self._out.line(state_json(name, state, error))
            return
        # A run's first state is where it stood when the study (re)started: a row, not news;
        # so is a run that waits its turn.
        if not first and state != "queued":
            self.notice(state_notice(name, state, error))
        self._start_ticker()

    def notice(self, line: str) -> None:
        """Prints `line` above the table (on a terminal; elsewhere, where JSON lines are not,
        as a plain line is no JSON: nothing). Any thread may call it."""
        if self.interactive:
            self._draw(line, None)

    def close(self) -> None:
        """Draws the table a last time and leaves it on the screen; stops redrawing."""
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        if not self.interactive or self._closed:
            return
        try:
            self.redraw()
        except Exception as error:  # the view is the runner's: closing must not fail
            log.warning("study table not drawn: %s: %s", type(error).__name__, error)
        self._closed = True
        self._draw(None, [])  # a newline below the table, which stays
        self._give_back_log_streams()

    def redraw(self) -> None:
        """Draws the table anew in place of the one on the screen."""
        if self.interactive and not self._closed:
            self._draw(None, self._table())

    # -- what the run observers tell ---------------------------------------------------------

    def _started(self) -> None:
        self._start_ticker()

    def _generation(self, name: str, record: GenerationRecord, stats: GenerationStats) -> None:
        self._workers = stats.workers
        if self.interactive:
            self._estimates[name] = Estimate(stats.eta_s, time.monotonic())
        elif not self.quiet:
            self._out.line(run_generation_json(name, record, stats))

    # -- the terminal --------------------------------------------------------------------------

    def _table(self) -> list[str]:
        runs = self.view.runs()
        now = time.monotonic()
        rows = []
        for run in runs:
            estimate = self._estimates.get(run.name)
            rows.append(row_of(run, None if estimate is None else estimate.now(now)))
            if run.state == "running" and run.snapshot is not None:
                self._workers = run.snapshot.workers  # one fleet: every run's count is its
        width, height = terminal_size(self._stream)
        fleet = fleet_line(runs, self._workers, self.view.utilisation())
        # A line short of the screen: the cursor's line, so the table's first never scrolls off.
        return table_lines(rows, fleet, height - 1, width)

    def _draw(self, line: str | None, table: list[str] | None) -> None:
        """Erases the table, writes `line` (if any) where it was and `table` below it (None:
        the table as last drawn; [] once closed: a newline, leaving the table as it is)."""
        failed: Exception | None = None
        with self._lock:
            if self._broken:
                return
            if self._closed:
                text = "" if line is None else line + "\n"
                if table == [] and self._lines:
                    text, self._lines = "\n", []
            else:
                table = self._lines if table is None else table
                text = _erase(len(self._lines)) + ("" if line is None else line + "\n")
                text += "\n".join(table)
                self._lines = table
            try:
                self._stream.write(text)
                self._stream.flush()
            except (OSError, ValueError) as error:
                self._broken, failed = True, error
        if failed is not None:
            # Not under the lock: a log record may come back here through notice().
            self._give_back_log_streams()
            log.warning("progress output stopped: %s", failed)
        elif self._lines and not self._log_streams and not self._closed:
            self._take_log_streams()

    def _take_log_streams(self) -> None:
        """Routes the root logger's handlers that write to a terminal through notice()."""
        for handler in logging.getLogger().handlers:
            if type(handler) is logging.StreamHandler and is_terminal(handler.stream):
                self._log_streams.append((handler, handler.setStream(_LinesAbove(self))))

    def _give_back_log_streams(self) -> None:
        streams, self._log_streams = self._log_streams, []
        for handler, stream in streams:
            handler.setStream(stream)

    def _start_ticker(self) -> None:
        if self._ticker is not None or self._closed or not self.interactive:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.redraw()  # no loop to redraw on: once, now
            return
        self._ticker = loop.create_task(self._redraw_periodically())

    async def _redraw_periodically(self) -> None:
        while not self._broken:
            try:
                self.redraw()
                over = all(run.state in ("complete", "failed") for run in self.view.runs())
            except Exception as error:
                # The table is a view of the study: without it, the runs go on.
                log.warning("study table stopped: %s: %s", type(error).__name__, error)
                return
            if over:  # every run is done: the table stays as it is
                self._ticker = None
                self.close()
                return
            await asyncio.sleep(REDRAW_S)


def _erase(lines: int) -> str:
    """From the end of the last of `lines` lines on the screen, back to the first and erased."""
    if lines == 0:
        return ""
    up = f"\x1b[{lines - 1}A" if lines > 1 else ""
    return f"\r{up}{_ERASE_TO_END}"


class _LinesAbove(io.TextIOBase):
    """A log handler's stream while the table is drawn: each whole line goes above the table."""

    def __init__(self, progress: StudyProgress) -> None:
        super().__init__()
        self._progress = progress
        self._partial = ""

    def write(self, text: str) -> int:
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            self._progress.notice(line)
        return len(text)


class _RunObserver(Observer):
    """One run's observer: its generations' rates and ETA, handed to the study's view."""

    def __init__(
        self, study: StudyProgress, name: str, generations: int | None, frames: int | None
    ) -> None:
        self._study = study
        self._name = name
        self._budget = (generations, frames)
        self._tracker: RateTracker | None = None

    def started(self, snapshot: Callable[[], RunSnapshot]) -> None:
        now = snapshot()
        start = Mark(now.generation, now.frames, now.evaluations, now.wall_s)
        self._tracker = RateTracker(start, *self._budget)
        self._study._started()

    def generation(self, record: GenerationRecord, workers: int) -> None:
        assert self._tracker is not None, "generation() before started()"
        self._study._generation(self._name, record, self._tracker.add(record, workers))
