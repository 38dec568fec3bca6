"""The run directory: config.json, metrics.jsonl (one line per generation), best_genome.json,
and genomes/ (each distinct elite once, named by the sha256 its metrics lines carry)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
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
        with open(self.metrics_path, "a") as f:
            f.write(record.to_json() + "\n")
            f.flush()
            os.fsync(f.fileno())

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
            self._best_score = score
            write_json_atomic(
                self.best_genome_path, self._with_parameters_file(genome_document, "best")
            )

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
