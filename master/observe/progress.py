"""Progress on the master's terminal: a line per generation and a live bar, or JSON lines.

On a terminal each generation prints one readable line (scores, throughput, workers, ETA) and
a bar below it follows the running phase. Anywhere else (a file, a pipe, a container's log)
each generation prints exactly one JSON object per line, with metrics.jsonl's fields and the
throughput, workers and ETA, and nothing else goes to stdout: the master's plain-text notices
then go to stderr (see notice_stream).

The rates, the ETA and the formatting are pure functions; ProgressObserver does the I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from master.algorithms.base import OFFSPRING
from master.observe.events import GenerationRecord, Observer, RunSnapshot

if TYPE_CHECKING:
    from tqdm import tqdm

log = logging.getLogger(__name__)

RATE_WINDOW = 5
"""Generations the ETA extrapolates from: recent enough to follow a change in speed."""
REFRESH_S = 0.25
"""The bar is redrawn at most this often."""
BAR_DELAY_S = 0.5
"""A phase shorter than this shows no bar: fast generations would only make it flicker."""
DEFAULT_SIZE = (80, 24)
_SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


@dataclass(frozen=True)
class Mark:
    """Where the run stood at one moment: the points rates and the ETA are measured between."""

    generations: int
    """Generations completed."""
    frames: int
    evaluations: int
    wall_s: float


@dataclass(frozen=True)
class GenerationStats:
    """What the progress line adds to a generation's record."""

    evals_per_s: float | None
    frames_per_s: float | None
    workers: int
    eta_s: float | None
    """Seconds until the binding budget (--generations or --frames) is spent; None: unknown."""


def mark_of(record: GenerationRecord) -> Mark:
    """The run's position at the end of a generation."""
    return Mark(record.generation + 1, record.frames, record.evaluations, record.wall_s)


def rates(before: Mark, after: Mark) -> tuple[float | None, float | None]:
    """(evaluations/s, frames/s) between two marks; None where no time passed between them."""
    elapsed = after.wall_s - before.wall_s
    if not elapsed > 0:
        return None, None
    evaluations, frames = after.evaluations - before.evaluations, after.frames - before.frames
    return evaluations / elapsed, frames / elapsed


def eta_seconds(
    marks: Sequence[Mark], generations: int | None = None, frames: int | None = None
) -> float | None:
    """Seconds left until the first budget to be reached, extrapolated from `marks`.

    `marks` are the recent ones, oldest first. The run stops only at the end of a generation,
    so a frame budget counts as the whole generations needed to reach it. None when there is
    no such budget or too little history to tell.
    """
    last = marks[-1]
    if generations is None and frames is None:
        return None
    if (generations is not None and last.generations >= generations) or (
        frames is not None and last.frames >= frames
    ):
        return 0.0
    first = marks[0]
    done, elapsed = last.generations - first.generations, last.wall_s - first.wall_s
    if done <= 0 or not elapsed > 0:
        return None
    remaining = []
    if generations is not None:
        remaining.append(generations - last.generations)
    if frames is not None:
        frames_per_generation = (last.frames - first.frames) / done
        if frames_per_generation > 0:
            remaining.append(math.ceil((frames - last.frames) / frames_per_generation))
    if not remaining:
        return None
    return min(remaining) * elapsed / done


class RateTracker:
    """Turns each generation's record into its stats; keeps the last few marks for the ETA."""

    def __init__(
        self,
        start: Mark,
        generations: int | None = None,
        frames: int | None = None,
        window: int = RATE_WINDOW,
    ) -> None:
        if window < 1:
            raise ValueError(f"the rate window must be >= 1 generation, got {window}")
        self.generations = generations
        self.frames = frames
        self._marks: deque[Mark] = deque([start], maxlen=window + 1)

    def add(self, record: GenerationRecord, workers: int) -> GenerationStats:
        mark = mark_of(record)
        evals_per_s, frames_per_s = rates(self._marks[-1], mark)
        self._marks.append(mark)
        eta = eta_seconds(self._marks, self.generations, self.frames)
        return GenerationStats(evals_per_s, frames_per_s, workers, eta)


def format_si(value: float | None) -> str:
    """A count or rate in at most 5 characters or so: 950, 12.3k, 1.23M; "-" when unknown."""
    if value is None or not math.isfinite(value):
        return "-"
    for scale, suffix in _SI:
        if abs(value) >= scale * 0.9995:
            scaled = value / scale
            digits = 2 if abs(scaled) < 10 else 1 if abs(scaled) < 100 else 0
            return f"{scaled:.{digits}f}{suffix}"
    return f"{value:.0f}" if abs(value) >= 10 or value == int(value) else f"{value:.1f}"


def format_duration(seconds: float | None) -> str:
    """45s, 3m05s, 2h07m, 3d04h; "-" when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "-"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def format_tail(seconds: float) -> str:
    """A phase tail: tenths of a second under a minute (most are), else as format_duration."""
    return f"{seconds:.1f}s" if 0 <= seconds < 59.95 else format_duration(seconds)


def format_score(value: float) -> str:
    """A score with one decimal; "-" for a generation whose evaluations all failed."""
    return f"{value:.1f}" if math.isfinite(value) else "-"


def generation_line(record: GenerationRecord, stats: GenerationStats) -> str:
    """The readable line a terminal shows after each generation."""
    return (
        f"gen {record.generation:4d} | frames {format_si(record.frames):>6} | "
        f"elite {format_score(record.elite_score):>7} | "
        f"max {format_score(record.score_max):>7} mean {format_score(record.score_mean):>7} | "
        f"{format_si(stats.evals_per_s):>6} evals/s {format_si(stats.frames_per_s):>6} frames/s | "
        f"workers {stats.workers:3d} | tail {format_tail(record.tail_s)}"
        f"{_backups(record)} | ETA {format_duration(stats.eta_s)}"
    )


def _backups(record: GenerationRecord) -> str:
    """The backup tasks of a generation that ran some ("won/run"), else nothing."""
    return f", backups {record.backup_wins}/{record.backup_tasks}" if record.backup_tasks else ""


def generation_json(record: GenerationRecord, stats: GenerationStats) -> str:
    """The JSON line a log gets after each generation: metrics.jsonl's fields and the stats."""
    document: dict[str, Any] = json.loads(record.to_json())
    document.update(
        evals_per_s=_rounded(stats.evals_per_s, 2),
        frames_per_s=_rounded(stats.frames_per_s, 1),
        workers=stats.workers,
        eta_s=_rounded(stats.eta_s, 1),
    )
    return json.dumps(document)


def is_terminal(stream: TextIO) -> bool:
    """Whether `stream` is an interactive terminal (a closed or odd stream is not)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def notice_stream(out: TextIO) -> TextIO:
    """Where the master's plain-text notices go: the terminal, else stderr (stdout is JSON)."""
    return out if is_terminal(out) else sys.stderr


def terminal_size(out: TextIO) -> tuple[int, int]:
    """(columns, lines) of the terminal `out` writes to; DEFAULT_SIZE where it reports none."""
    try:
        size = os.get_terminal_size(out.fileno())
    except (AttributeError, ValueError, OSError):
        return DEFAULT_SIZE
    # A fresh pseudo-terminal may report 0x0.
    return size.columns or DEFAULT_SIZE[0], size.lines or DEFAULT_SIZE[1]


class Output:
    """Writes progress to a stream until a write fails, then nothing more.

    A closed pipe or terminal must not stop the run: the run dir has it all.
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.broken = False

    def write(self, text: str) -> None:
        """Writes `text` as it is and flushes it."""
        if self.broken:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError) as error:
            self.broken = True
            log.warning("progress output stopped: %s", error)

    def line(self, line: str) -> None:
        """Writes `line` and a newline."""
        self.write(line + "\n")


class ProgressObserver(Observer):
    """Prints each generation to `out`; on a terminal, also a live bar for the running phase.

    `live` overrides the terminal check. `generations` and `frames` are the run's budget (for
    the ETA); `episodes_per_task` tells the bar whether a task is one evaluation. The bar is
    drawn by a periodic task that reads the run's snapshot, so the path that records results
    never touches the terminal.
    """

    def __init__(
        self,
        out: TextIO,
        live: bool | None = None,
        generations: int | None = None,
        frames: int | None = None,
        episodes_per_task: int = 1,
    ) -> None:
        self.out = out
        self.live = is_terminal(out) if live is None else live
        self.generations = generations
        self.frames = frames
        self.episodes_per_task = episodes_per_task
        self._snapshot: Callable[[], RunSnapshot] | None = None
        self._tracker: RateTracker | None = None
        self._ticker: asyncio.Future[None] | None = None
        self._bar: tqdm | None = None
        self._bar_key: tuple[int, str] | None = None
        self._output = Output(out)

    def started(self, snapshot: Callable[[], RunSnapshot]) -> None:
        self._snapshot = snapshot
        now = snapshot()
        start = Mark(now.generation, now.frames, now.evaluations, now.wall_s)
        self._tracker = RateTracker(start, self.generations, self.frames)
        if self.live:
            self._ticker = asyncio.ensure_future(self._redraw_periodically())

    def generation(self, record: GenerationRecord, workers: int) -> None:
        assert self._tracker is not None, "generation() before started()"
        stats = self._tracker.add(record, workers)
        if not self.live:
            self._write(generation_json(record, stats))
            return
        shown = self._bar is not None and _shown(self._bar)
        if self._bar is not None and self._bar_key is not None:
            if self._bar_key[0] <= record.generation:
                self._close_bar()  # the finished generation's bar goes with it
            elif shown:
                self._bar.clear()  # the next generation's bar comes back below the line
        self._write(generation_line(record, stats))
        if self._bar is not None and shown and not self._output.broken:
            self._bar.refresh()

    def stopped(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        self._close_bar()

    def _write(self, line: str) -> None:
        self._output.line(line)

    async def _redraw_periodically(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            try:
                self._redraw()
            except Exception as error:
                # The bar is a view of the run: without it, the generation lines go on.
                log.warning("progress bar stopped: %s: %s", type(error).__name__, error)
                self._close_bar()
                return

    def _redraw(self) -> None:
        if self._snapshot is None or self._output.broken:
            return
        now = self._snapshot()
        total = now.tasks_pending + now.tasks_leased + now.tasks_done
        if total == 0:
            return  # between phases: the last bar stays until the next phase or line
        key = (now.generation, now.phase)
        if self._bar is None or key != self._bar_key:
            self._close_bar()
            what = "offspring" if key[1] == OFFSPRING else "elite re-evaluation"
            description = f"gen {key[0]} {what}"
            unit = _unit(key[1], self.episodes_per_task)
            self._bar = progress_bar(self.out, description, total, now.tasks_done, unit)
            self._bar_key = key
        bar = self._bar
        bar.set_postfix_str(f"workers {now.workers}", refresh=False)
        if now.tasks_done > bar.n:
            bar.update(now.tasks_done - bar.n)  # its own delay keeps short phases bar-free
        elif _shown(bar):
            bar.refresh()  # elapsed time and workers move even while no result comes in

    def _close_bar(self) -> None:
        if self._bar is not None:
            with contextlib.suppress(OSError, ValueError):
                self._bar.close()
            self._bar = None
            self._bar_key = None


def _shown(bar: tqdm) -> bool:
    """Whether the bar has outlived its delay (tqdm's refresh() would draw it even before)."""
    return bar.format_dict["elapsed"] >= BAR_DELAY_S


def _unit(phase: str, episodes_per_task: int) -> str:
    # The fleet counts tasks; a task is one evaluation unless elite episodes are batched.
    batched = phase != OFFSPRING and episodes_per_task > 1
    return "task" if batched else "eval"


def progress_bar(out: TextIO, description: str, total: int, done: int, unit: str) -> tqdm:
    """A bar that shows once it has lasted BAR_DELAY_S and clears itself when closed."""
    from tqdm import tqdm

    columns = _columns(out)
    return tqdm(
        total=total,
        initial=done,
        desc=description,
        unit=unit,
        file=out,
        leave=False,
        # Follows the terminal's size; a terminal that reports none (0x0, as a fresh
        # pseudo-terminal may) gets 80x24, where tqdm would draw nothing.
        dynamic_ncols=columns > 0,
        ncols=None if columns > 0 else DEFAULT_SIZE[0],
        nrows=None if columns > 0 else DEFAULT_SIZE[1],
        # The periodic task throttles redraws; tqdm draws whenever it is told to.
        mininterval=0,
        miniters=1,
        delay=BAR_DELAY_S,
    )


def _columns(out: TextIO) -> int:
    try:
        return os.get_terminal_size(out.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 0


def _rounded(value: float | None, digits: int) -> float | None:
    return round(value, digits) if value is not None and math.isfinite(value) else None
