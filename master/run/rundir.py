"""The run directory: config.json, metrics.jsonl (one line per generation), best_genome.json."""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from neuro.runfiles import BEST_GENOME, CONFIG, ELITE_GENOME, METRICS


@dataclass(frozen=True)
class GenerationRecord:
    """One line of metrics.jsonl."""

    generation: int
    frames: int
    """Cumulative emulator frames, training and elite re-evaluation episodes alike."""
    evaluations: int
    """Cumulative episodes recorded."""
    wall_s: float
    score_mean: float
    score_max: float
    elite_score: float
    elite_seeds: list[int]
    generation_evaluations: int
    generation_frames: int
    failed_evaluations: int
    leases_reissued: int
    extra: dict[str, Any] = field(default_factory=dict)
    """The algorithm's own figures (ES: theta_rank, ...), written beside the common ones."""

    def to_json(self) -> str:
        fields = {k: v for k, v in self.__dict__.items() if k != "extra"}
        return json.dumps({k: _finite_or_none(v) for k, v in {**fields, **self.extra}.items()})


def write_json_atomic(path: Path, data: Any) -> None:
    """Writes via a temp file, fsync and rename, so a crash leaves the old file or the new one."""
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")


def write_array_atomic(path: Path, array: np.ndarray) -> str:
    """Saves an .npy via a temp file, fsync and rename; returns the sha256 of its values."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, array, allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def write_text_atomic(path: Path, text: str) -> None:
    """Writes via a temp file, fsync and rename, so a crash leaves the old file or the new one."""
    write_bytes_atomic(path, [text.encode()])


def write_bytes_atomic(path: Path, chunks: Iterable[bytes]) -> None:
    """write_text_atomic for a stream of bytes (e.g. a download)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
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
        write_json_atomic(self.config_path, config)

    def append_metrics(self, record: GenerationRecord) -> None:
        with open(self.metrics_path, "a") as f:
            f.write(record.to_json() + "\n")
            f.flush()
            os.fsync(f.fileno())

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


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
