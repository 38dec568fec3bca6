"""neuro worker: rebuilds policies from genomes, plays episodes, reports returns.

The rooms: the process edge (cli/, client/, limits, spot, fanout); evaluation/ (a task ->
parameters -> policy); runners/ (per-genome, batched); play/ (the rollout, envs, the Atari
vector env); inference/ (the engine interface, the registry, one folder or file per engine);
offline/ (replay, video). docs/architecture.md walks one task through them.

Importing the package loads no torch: `neuro-worker --help` and a bad flag answer at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from worker.offline.replay import evaluate_policy, load_genome_file

__all__ = ["evaluate_policy", "load_genome_file"]


def __getattr__(name: str) -> Any:
    # The replay API, loaded (with torch) on first use rather than on `import worker`.
    if name in __all__:
        from worker.offline import replay

        return getattr(replay, name)
    raise AttributeError(f"module 'worker' has no attribute {name!r}")
