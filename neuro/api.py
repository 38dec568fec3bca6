"""neuro's Python API: train, load_policy and Result, loaded on first use.

The one module of the shared core that reaches into the two sides, by design: `neuro.train`
runs the master (master/api.py) and `neuro.load_policy` a worker's policy
(worker/offline/loading.py). Each is imported when first asked for, so `import neuro` loads
neither side, nor torch, and a master-only install can train with remote workers. pyproject.toml
names exactly these two imports as the exception to the core's contracts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from master.api import Result, train
    from worker.offline.loading import load_policy

__all__ = ["Result", "load_policy", "train"]


def __getattr__(name: str) -> Any:
    if name in ("train", "Result"):
        from master import api

        return getattr(api, name)
    if name == "load_policy":
        from worker.offline import loading

        return loading.load_policy
    raise AttributeError(f"module 'neuro.api' has no attribute {name!r}")
