"""What one task may ask of a worker: the master refuses a run whose tasks would exceed these
at parse time, and a worker refuses a task that does (a master may be buggy or another
version), so a setting no worker would play never starts a run."""

from __future__ import annotations

__all__ = ["MAX_EPISODES_PER_TASK", "MAX_EPISODE_STEPS"]

MAX_EPISODES_PER_TASK = 10_000
"""Episodes per task (the master splits re-evaluations into tasks of a few episodes)."""
MAX_EPISODE_STEPS = 10_000_000
"""Per-episode step cap a task may ask for (Atari's 108k frames are 27k steps); 0 means the
env's own limit."""
