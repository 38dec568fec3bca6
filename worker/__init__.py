"""neuro worker: rebuilds policies from genomes, plays episodes, reports returns."""

from __future__ import annotations

from typing import Any

__all__ = ["evaluate_policy", "load_genome_file"]


def __getattr__(name: str) -> Any:
    # Lazy: the master imports torch-free worker modules (noise, layout) without pulling torch.
    if name in __all__:
        from worker import replay

        return getattr(replay, name)
    raise AttributeError(f"module 'worker' has no attribute {name!r}")
