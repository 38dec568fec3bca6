"""neuro worker: rebuilds policies from genomes, plays episodes, reports returns."""

from worker.replay import evaluate_policy, load_genome_file

__all__ = ["evaluate_policy", "load_genome_file"]
