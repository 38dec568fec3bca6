"""Names and formats of a run dir's files: the master writes them, replay and plots read them."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

GENOME_FORMAT = "neuro.genome/1"
"""best_genome.json / elite_genome.json: a genome with everything needed to replay it."""
CONFIG = "config.json"
METRICS = "metrics.jsonl"
BEST_GENOME = "best_genome.json"
ELITE_GENOME = "elite_genome.json"
GENOMES = "genomes"
"""genomes/<sha256>.json: each distinct elite once, a whole genome document metrics.jsonl names."""
FINAL_TEST = "final_test.json"
"""The final elite's scores on fresh test episodes, played when the run's budget ends."""
FINAL_TEST_FORMAT = "neuro.final-test/1"
"""final_test.json: {"format", "genome_sha256", "scores": [...], "mean", "median", "episodes",
"frames"}; a run whose dir holds it is complete (master.study.studydir)."""
STUDY_JSON = "study.json"
"""A study dir's resolved runs: each run's name, env, seed, label, settings, budget and state."""
STUDY_RUNS = "runs"
"""A study dir's folder of run dirs: runs/<name>/, each a run dir as above."""


def seeds_sha256(seeds: Sequence[int]) -> str:
    """sha256 of a seed list's canonical JSON ("[1,2,3]"): the name of its genome file."""
    return hashlib.sha256(
        json.dumps([int(s) for s in seeds], separators=(",", ":")).encode()
    ).hexdigest()


def genome_file(sha256: str) -> str:
    """The run-dir path of the genome file for a seed list's sha256."""
    return f"{GENOMES}/{sha256}.json"
