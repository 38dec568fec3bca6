"""neuro: distributed deep neuroevolution. The shared core of the master and the workers, and
the Python API: neuro.train, neuro.load_policy and neuro.Result (neuro/api.py), loaded on
first use so that `import neuro` stays light (no torch, neither side)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from neuro.api import Result, load_policy, train

__all__ = ["Result", "load_policy", "train"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from neuro import api

        return getattr(api, name)
    raise AttributeError(f"module 'neuro' has no attribute {name!r}")
