"""TensorBoard scalars in RUN_DIR/tensorboard: one point per generation, written off the loop.

Tags, at step = generation: score/mean, score/max, score/elite, throughput/evals_per_s,
throughput/frames_per_s, fleet/workers, fleet/leases_reissued (re-issued in that generation,
as in metrics.jsonl) and frames (cumulative). The scores again under by_frames/ at step =
cumulative frames, for the paper's plots of score against frames. A score that is NaN (every
evaluation failed) is left out rather than drawn.

Events are written with tensorboardX's synchronous EventsWriter on one thread of our own, not
with its SummaryWriter: SummaryWriter's writer thread dies silently on a write error, after
which its bounded queue blocks the caller; here a failure logs one warning and the run goes on.
Each process appends a new event file; TensorBoard merges the files of the directory. Steps
already written (by an earlier process of the run) are never written again.
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import logging
import math
import os
import struct
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from google.protobuf.message import DecodeError

from master.observe.events import GenerationRecord, Observer, RunSnapshot
from master.observe.progress import GenerationStats, Mark, RateTracker

log = logging.getLogger(__name__)

BY_FRAMES = "by_frames/"
CLOSE_TIMEOUT_S = 10.0
"""At the end of a run, the last events get this long to reach the disk before the exit."""
_file_numbers = itertools.count()


def generation_scalars(record: GenerationRecord, stats: GenerationStats) -> dict[str, float]:
    """The scalars of one generation at step = generation (non-finite values left out)."""
    values = {
        "score/mean": record.score_mean,
        "score/max": record.score_max,
        "score/elite": record.elite_score,
        "throughput/evals_per_s": stats.evals_per_s,
        "throughput/frames_per_s": stats.frames_per_s,
        "fleet/workers": stats.workers,
        "fleet/leases_reissued": record.leases_reissued,
        "frames": record.frames,
    }
    # The algorithm's own numeric figures (ES: theta_rank, grad_norm, ...) under algo/.
    for name, value in record.extra.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            values[f"algo/{name}"] = value
    return _finite(values)


def frame_scalars(record: GenerationRecord) -> dict[str, float]:
    """The scores at step = cumulative frames, under by_frames/."""
    values = {
        f"{BY_FRAMES}score/mean": record.score_mean,
        f"{BY_FRAMES}score/max": record.score_max,
        f"{BY_FRAMES}score/elite": record.elite_score,
    }
    return _finite(values)


def last_generation_written(directory: str | os.PathLike) -> int | None:
    """The highest generation step in the directory's event files; None if there is none."""
    event_pb2 = _tensorboardx().event_pb2
    last = None
    for path in sorted(Path(directory).glob("*tfevents*")):
        for data in _records(path):
            event = event_pb2.Event()
            try:
                event.ParseFromString(data)
            except DecodeError:
                break  # torn by a crash: nothing after it was written either
            if any(not value.tag.startswith(BY_FRAMES) for value in event.summary.value):
                last = event.step if last is None else max(last, event.step)
    return last


class TensorBoardObserver(Observer):
    """Writes each generation's scalars to `directory` on a thread; never stops the run."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self._executor = concurrent.futures.ThreadPoolExecutor(1, "tensorboard")
        self._tracker: RateTracker | None = None
        self._writer: Any = None
        self._written_through: int | None = None
        self._failed = False
        try:
            _tensorboardx()  # now, before the run's threads: the import hides torch for a moment
        except Exception as error:
            self._fail(error)

    def __repr__(self) -> str:
        state = "failed" if self._failed else f"written through {self._written_through}"
        return f"TensorBoardObserver({str(self.directory)!r}, {state})"

    def started(self, snapshot: Callable[[], RunSnapshot]) -> None:
        now = snapshot()
        self._tracker = RateTracker(Mark(now.generation, now.frames, now.evaluations, now.wall_s))
        self._submit(self._open)

    def generation(self, record: GenerationRecord, workers: int) -> None:
        assert self._tracker is not None, "generation() before started()"
        self._submit(self._write, record, self._tracker.add(record, workers))

    def stopped(self) -> None:
        closing = self._submit(self._close)
        self._executor.shutdown(wait=False)
        if closing is not None:
            # Blocks the loop only at the very end, and only as long as the disk is slow.
            concurrent.futures.wait([closing], timeout=CLOSE_TIMEOUT_S)

    def _submit(self, job: Callable[..., None], *args: Any) -> concurrent.futures.Future | None:
        if self._failed:
            return None
        return self._executor.submit(self._guarded, job, *args)

    def _guarded(self, job: Callable[..., None], *args: Any) -> None:
        if self._failed:
            return
        try:
            job(*args)
        except Exception as error:
            self._fail(error)
            self._close_quietly()

    def _fail(self, error: Exception) -> None:
        self._failed = True
        log.warning(
            "cannot write TensorBoard events to %s (%s: %s); the run goes on without them",
            self.directory, type(error).__name__, error,
        )  # fmt: skip

    def _open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._written_through = last_generation_written(self.directory)
        # The file name holds the second it was made: the pid and a counter keep two files of
        # one second apart (EventsWriter would truncate an existing one).
        suffix = f".{os.getpid()}.{next(_file_numbers)}"
        self._writer = _tensorboardx().EventsWriter(str(self.directory / "events"), suffix)
        self._writer.flush()

    def _write(self, record: GenerationRecord, stats: GenerationStats) -> None:
        if self._written_through is not None and record.generation <= self._written_through:
            return  # an earlier process wrote this step; a replayed generation adds no second
        now = time.time()
        self._writer.write_event(_event(now, record.generation, generation_scalars(record, stats)))
        self._writer.write_event(_event(now, record.frames, frame_scalars(record)))
        self._writer.flush()
        self._written_through = record.generation

    def _close(self) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.close()

    def _close_quietly(self) -> None:
        try:
            self._close()
        except Exception:  # the first error is the one worth reporting
            self._writer = None


class _TensorBoardX(NamedTuple):
    EventsWriter: Any
    event_pb2: Any
    summary_pb2: Any


@functools.cache
def _tensorboardx() -> _TensorBoardX:
    """tensorboardX's event writer and protos, imported without torch.

    tensorboardX imports torch whenever it is installed (as it is beside local workers) only
    to accept its tensors, which the master never has: that would cost the master a second and
    some 180 MB. Hidden for the import, `import torch` raises ImportError and is skipped.
    """
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        import tensorboardX.event_file_writer
        import tensorboardX.proto.event_pb2
        import tensorboardX.proto.summary_pb2
    finally:
        if hide and sys.modules.get("torch", ...) is None:
            del sys.modules["torch"]
    return _TensorBoardX(
        tensorboardX.event_file_writer.EventsWriter,
        tensorboardX.proto.event_pb2,
        tensorboardX.proto.summary_pb2,
    )


def _event(wall_time: float, step: int, scalars: dict[str, float]) -> Any:
    _, event_pb2, summary_pb2 = _tensorboardx()
    values = [summary_pb2.Summary.Value(tag=tag, simple_value=v) for tag, v in scalars.items()]
    summary = summary_pb2.Summary(value=values)
    return event_pb2.Event(wall_time=wall_time, step=step, summary=summary)


def _records(path: Path) -> Iterator[bytes]:
    """The payloads of a TFRecord file (length, length CRC, data, data CRC), up to a torn end."""
    with open(path, "rb") as f:
        while True:
            header = f.read(12)
            if len(header) < 12:
                return
            (length,) = struct.unpack("<Q", header[:8])
            data = f.read(length)
            if len(data) < length or len(f.read(4)) < 4:
                return
            yield data


def _finite(values: dict[str, float | int | None]) -> dict[str, float]:
    return {
        tag: float(value)
        for tag, value in values.items()
        if value is not None and math.isfinite(value)
    }
