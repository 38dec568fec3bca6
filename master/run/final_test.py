"""The final test: once a run's budget is spent, its best elite plays fresh episodes.

As the paper scores its table, the run's best elite (best_genome.json: the highest
re-evaluated elite score of the run, else the latest elite) plays `episodes` episodes on the
fleet, under task ids no training phase uses (FINAL_TEST_KEY), their env seeds derived from
the run seed and those ids as every task's are; their frames are not the training budget's.
RUN_DIR/final_test.json (neuro/runfiles.py: FINAL_TEST, FINAL_TEST_FORMAT) holds the scores,
and a study counts the run complete once it is written.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from master.algorithms.base import Candidate, EvaluationRequest, Perturbation
from master.run.rundir import write_json_atomic
from neuro.genome import Genome
from neuro.runfiles import (
    BEST_GENOME,
    ELITE_GENOME,
    FINAL_TEST,
    FINAL_TEST_FORMAT,
    GENOME_FORMAT,
    seeds_sha256,
)

FINAL_TEST_KEY = "final/test"
"""The request key of the final test: its task ids (final/test/0, ...) are no training phase's,
so its episodes are fresh ones."""


@dataclass(frozen=True)
class FinalCandidate:
    """What the final test plays, and the sha256 that names it in final_test.json."""

    candidate: Candidate
    genome_sha256: str


@dataclass(frozen=True)
class FinalTest:
    """A run's final test: how many episodes, and what plays them (read when the test starts,
    so a resumed run tests the best elite of all its processes)."""

    episodes: int
    candidate: Callable[[], FinalCandidate | None]

    def request(self, candidate: FinalCandidate) -> EvaluationRequest:
        return EvaluationRequest(FINAL_TEST_KEY, candidate.candidate, self.episodes)


def best_elite(
    run_dir: Path, fix: Callable[[np.ndarray], int] | None = None
) -> FinalCandidate | None:
    """The run's best elite (else its latest) as the final test plays it; None if it has none.

    A genome's seeds play as they are; an ES elite's parameters (the .npy beside its document)
    are served through `fix` (master.fleet.tasks.ParameterStore.fix), which returns the version
    they are served under, and play as that version's theta. ValueError naming the file if it
    is not a genome document this run could have written.
    """
    for name in (BEST_GENOME, ELITE_GENOME):
        path = run_dir / name
        if not path.is_file():
            continue
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"{path}: unreadable ({error})") from None
        if not isinstance(document, dict) or document.get("format") != GENOME_FORMAT:
            raise ValueError(f"{path}: not a {GENOME_FORMAT} document")
        parameters = document.get("parameters")
        if isinstance(parameters, dict):
            return _fixed_parameters(run_dir, path, parameters, fix)
        seeds = document.get("seeds")
        if not isinstance(seeds, list) or not seeds or not all(type(s) is int for s in seeds):
            raise ValueError(f"{path}: its seeds are not a list of integers")
        return FinalCandidate(Genome(tuple(seeds)), seeds_sha256(seeds))
    return None


def _fixed_parameters(
    run_dir: Path, path: Path, parameters: dict[str, Any], fix: Callable[[np.ndarray], int] | None
) -> FinalCandidate:
    if fix is None:
        raise ValueError(f"{path}: an ES elite's parameters need the run's parameter store")
    vector_path = run_dir / str(parameters.get("file", ""))
    try:
        vector = np.load(vector_path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise ValueError(f"{vector_path}: unreadable ({error})") from None
    version = fix(np.asarray(vector, dtype=np.float32))
    return FinalCandidate(Perturbation(version, 0, 0), str(parameters.get("sha256", "")))


def final_test_document(
    candidate: FinalCandidate, returns: Sequence[float], frames: int
) -> dict[str, Any]:
    """final_test.json: the scores (null where an episode failed), their mean and median over
    the episodes that did not, the episodes and frames played."""
    scores = [float(r) for r in returns]
    valid = [s for s in scores if math.isfinite(s)]
    return {
        "format": FINAL_TEST_FORMAT,
        "genome_sha256": candidate.genome_sha256,
        "scores": [s if math.isfinite(s) else None for s in scores],
        "mean": statistics.fmean(valid) if valid else None,
        "median": statistics.median(valid) if valid else None,
        "episodes": len(scores),
        "frames": int(frames),
    }


def write_final_test(run_dir: Path, document: dict[str, Any]) -> None:
    write_json_atomic(run_dir / FINAL_TEST, document)


def tested(run_dir: Path) -> bool:
    """Whether the run dir holds its final test (the run then needs nothing more)."""
    try:
        document = json.loads((run_dir / FINAL_TEST).read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(document, dict) and document.get("format") == FINAL_TEST_FORMAT
