"""The run directory: config.json, metrics.jsonl (one line per generation), best_genome.json,
and genomes/ (each distinct elite once, named by the sha256 its metrics lines carry)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import math
import os
import socket
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

# The record is what observers are told too, so it is defined with them (master.observe).
from master.observe.events import GenerationRecord
from neuro.runfiles import (
    BEST_GENOME,
    CONFIG,
    ELITE_GENOME,
    GENOME_FORMAT,
    METRICS,
    genome_file,
    seeds_sha256,
)

log = logging.getLogger(__name__)

LOCK_FILE = ".master.lock"
"""In the run dir while a master runs on it: that master holds an exclusive flock on it. The
lock goes with the process however it ends, so a crashed master leaves a file but no lock."""
_LOCK_UNSUPPORTED = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS})
"""flock's answer on a filesystem that keeps no locks (some network filesystems)."""
_LOCK_TRIES = 5
"""Opens of the lock file before giving up on one another master keeps removing."""


class RunDirInUse(Exception):
    """Another master holds the run dir's lock; the message names the run dir and the holder."""


@contextlib.contextmanager
def run_dir_lock(path: str | os.PathLike) -> Iterator[Path]:
    """Holds the run dir's exclusive lock for the block (creating the run dir if need be).

    RunDirInUse if another master holds it: two masters on one run dir would interleave
    metrics.jsonl and overwrite each other's checkpoints. Readers (plots, replay, the S3
    mirror, `neuro-master status`) never take it. On leaving, the lock file goes, and so does
    the run dir if this made it and nothing else was written there (a master refused later).
    """
    run_dir = Path(path)
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    lock_path = run_dir / LOCK_FILE
    fd, locked = _lock(run_dir, lock_path)
    try:
        yield run_dir
    finally:
        if locked:
            # Removed while still held: a master that opened it meanwhile finds it gone
            # once it has the lock, and opens the path again (see _lock).
            lock_path.unlink(missing_ok=True)
        os.close(fd)  # releases the lock
        if created:
            with contextlib.suppress(OSError):
                run_dir.rmdir()  # only if empty


def _lock(run_dir: Path, lock_path: Path) -> tuple[int, bool]:
    """(fd, True) holding the lock; (fd, False) where the filesystem keeps no locks."""
    for _ in range(_LOCK_TRIES):
        # Not inherited by local workers (Python's default), so the lock ends with this process.
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise RunDirInUse(
                f"run dir {run_dir} is in use by another master{holder}: stop it first, "
                "or give this run another --run-dir"
            ) from None
        except OSError as error:
            if error.errno not in _LOCK_UNSUPPORTED:
                os.close(fd)
                raise
            log.warning("cannot lock run dir %s (%s): nothing stops a second master on it",
                        run_dir, error.strerror)  # fmt: skip
            return fd, False
        try:
            held, named = os.fstat(fd), os.stat(lock_path)
            same = (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)
        except FileNotFoundError:
            same = False
        if same:
            # Who holds it, for the message a second master prints.
            note = f"pid {os.getpid()} on {socket.gethostname()}\n".encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, note, 0)
            return fd, True
        os.close(fd)  # the holder removed the file as it left: lock the path's new one
    raise RunDirInUse(f"run dir {run_dir}: its lock file keeps changing; is another master "
                      "starting and stopping there?")  # fmt: skip


def _holder(fd: int) -> str:
    """The holder's note, as " (pid N on HOST)", or "" if it cannot be read."""
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""
    # Printed on a terminal: nothing a terminal would act on.
    text = "".join(c for c in text if c.isprintable())
    return f" ({text})" if text else ""


def write_json_atomic(path: Path, data: Any) -> None:
    """Writes via a temp file, fsync and rename, so a crash leaves the old file or the new one."""
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")


def write_array_atomic(path: Path, array: np.ndarray) -> str:
    """Saves an .npy via a temp file, fsync and rename; returns the sha256 of its values."""
    with _atomic_file(path) as f:
        np.save(f, array, allow_pickle=False)
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def write_text_atomic(path: Path, text: str) -> None:
    """Writes via a temp file, fsync and rename, so a crash leaves the old file or the new one."""
    write_bytes_atomic(path, [text.encode()])


def write_bytes_atomic(path: Path, chunks: Iterable[bytes]) -> None:
    """write_text_atomic for a stream of bytes (e.g. a download)."""
    with _atomic_file(path) as f:
        for chunk in chunks:
            f.write(chunk)


@contextlib.contextmanager
def _atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A temp file beside `path`, fsynced and renamed over it on success, removed on failure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class RunDirectory:
    """Writes what a run produces; the training loop calls it, the GA never does."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.config_path = self.path / CONFIG
        self.metrics_path = self.path / METRICS
        self.best_genome_path = self.path / BEST_GENOME
        self.elite_genome_path = self.path / ELITE_GENOME
        self._best_score = -math.inf
        self._config: dict[str, Any] | None = None
        if self.best_genome_path.exists():  # a resumed run keeps its best so far
            score = json.loads(self.best_genome_path.read_text()).get("elite_score")
            self._best_score = score if score is not None else -math.inf

    def truncate_metrics(self, generations: int) -> None:
        """Keeps the first `generations` lines: those a checkpoint vouches for."""
        if not self.metrics_path.exists():
            return
        lines = self.metrics_path.read_text().splitlines(keepends=True)
        complete = [line for line in lines if line.endswith("\n")][:generations]
        if len(complete) != len(lines):
            write_text_atomic(self.metrics_path, "".join(complete))

    def write_config(self, config: dict[str, Any]) -> None:
        """Writes config.json; genome files are built from this config."""
        write_json_atomic(self.config_path, config)
        self._config = config

    def append_metrics(self, record: GenerationRecord) -> None:
        """Appends the record's line, after writing its elite's genome file if that is new.

        The genome file goes first, so every line names a genome file that is on disk.
        """
        if record.elite_seeds:
            self._write_genome(record.elite_seeds)
        line = memoryview((record.to_json() + "\n").encode())
        fd = os.open(self.metrics_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            end = os.lseek(fd, 0, os.SEEK_END)
            try:
                while line:
                    line = line[os.write(fd, line) :]
                os.fsync(fd)
            except OSError:
                # A full disk may have taken part of the line: cut it off, so that the line
                # written again later is the only one.
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, end)
                raise
        finally:
            os.close(fd)

    def _write_genome(self, seeds: list[int]) -> None:
        path = self.path / genome_file(seeds_sha256(seeds))
        if path.is_file():
            return  # content-addressed: an elite carried over has its file already
        # Imported here: master.config pulls in every algorithm, and the algorithms may come
        # to use master.run (checkpoints); a top-level import would risk a cycle.
        from master.config import RunConfig
        from neuro.genome import Genome

        if self._config is None:  # a run dir opened again: its config is on disk
            self._config = json.loads(self.config_path.read_text())
        document = RunConfig.from_dict(self._config).genome_document(Genome(tuple(seeds)))
        # One line, not indented: these files hold most of a long run's seeds.
        write_text_atomic(path, json.dumps(document) + "\n")

    def save_elite(self, genome_document: dict[str, Any], score: float) -> None:
        """Keeps the latest elite, and the best one so far by re-evaluated score.

        A document whose "parameters" is an array (ES) gets it saved as an .npy beside the
        JSON first, which then names that file and its sha256.
        """
        write_json_atomic(self.elite_genome_path, self._with_parameters_file(genome_document,
                                                                            "elite"))  # fmt: skip
        if math.isfinite(score) and score > self._best_score:
            write_json_atomic(
                self.best_genome_path, self._with_parameters_file(genome_document, "best")
            )
            self._best_score = score  # once written: a failed write is tried again

    def _with_parameters_file(self, document: dict[str, Any], stem: str) -> dict[str, Any]:
        parameters = document.get("parameters")
        if not isinstance(parameters, np.ndarray):
            return document
        name = f"{stem}_params.npy"
        sha256 = write_array_atomic(self.path / name, parameters)
        return {**document, "parameters": {"file": name, "sha256": sha256}}


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file (None where a value was NaN)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_elite_seeds(run_dir: str | os.PathLike, record: dict[str, Any]) -> list[int]:
    """A metrics record's elite seed list, from the genome file it names ([] without an elite).

    ValueError naming the file if it is missing, unreadable or not the genome the record names.
    """
    if "elite_seeds" in record:  # a run dir from before genomes/
        return list(record["elite_seeds"])
    sha256 = record.get("elite_sha256")
    if sha256 is None:
        return []
    path = Path(run_dir) / genome_file(sha256)
    try:
        document = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"genome file {path}: unreadable ({error})") from None
    seeds = document.get("seeds") if isinstance(document, dict) else None
    if (
        not isinstance(seeds, list)
        or document.get("format") != GENOME_FORMAT
        or not all(type(s) is int for s in seeds)
        or seeds_sha256(seeds) != sha256
        or len(seeds) != record.get("elite_length")
    ):
        raise ValueError(f"genome file {path}: not the {GENOME_FORMAT} seed list its name says")
    return seeds
