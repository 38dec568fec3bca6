"""Names and formats of a run dir's files: the master writes them, replay and plots read them."""

from __future__ import annotations

GENOME_FORMAT = "neuro.genome/1"
"""best_genome.json / elite_genome.json: a genome with everything needed to replay it."""
CONFIG = "config.json"
METRICS = "metrics.jsonl"
BEST_GENOME = "best_genome.json"
ELITE_GENOME = "elite_genome.json"
