"""The worker's commands: neuro-worker (join a master and work) and neuro-eval (replay a saved
genome).

Each entry point parses its flags here and hands the checked settings to its module:
settings.py (neuro-worker's flags and their checks), work.py (join and work, or fan out over
devices), replay.py (neuro-eval); pinning.py pins a worker's threads to its CPUs.
"""

from __future__ import annotations

import sys

from worker.cli.replay import eval_parser, replay
from worker.cli.settings import worker_parser, worker_settings
from worker.cli.work import run_fanout, run_worker

__all__ = ["eval_main", "worker_main", "worker_parser", "worker_settings"]


def worker_main(argv: list[str] | None = None) -> int:
    """neuro-worker: parse the flags, check them into settings, join the master and work (or,
    given several devices, start and supervise one worker process per device)."""
    parser = worker_parser()
    settings = worker_settings(parser, parser.parse_args(argv))
    if settings.shares:
        return run_fanout(settings, sys.argv[1:] if argv is None else argv)
    return run_worker(settings)


def eval_main(argv: list[str] | None = None) -> int:
    """neuro-eval: replay a saved genome and print its score statistics."""
    parser = eval_parser()
    return replay(parser, parser.parse_args(argv))
