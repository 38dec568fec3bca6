"""A study on this machine's local workers, for real: R runs served at once against the same
runs one after another, on the same W workers, wall time and utilisation side by side.

Each way is one `neuro-master --study FILE --local-workers W` process over the same study
file, but for max_concurrent_runs (R at once, or 1: one run after another on the same master
and workers). Utilisation is the runs' worker-seconds (each run's last metrics line's
worker_s: the seconds the workers spent on its accepted results, as they measured them)
over W x the wall time. The runs are the same in both (same seeds, same results: the runs'
final elite scores are recorded to show it).

    python -m bench.study_local --json bench/results/study-local-<machine>-<date>.json
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, machine, provenance, write_json

STUDY = """
name = "local"
max_concurrent_runs = {concurrent}
test_episodes = {test_episodes}

[budget]
no_target = true
generations = {generations}

[[grid]]
envs = ["{env}"]
seeds = {runs}
[grid.settings]
population_size = {population}
truncation = {truncation}
elite_candidates = {candidates}
elite_episodes = {episodes}
"""


def study_text(args: argparse.Namespace, concurrent: int) -> str:
    return STUDY.format(concurrent=concurrent, test_episodes=args.test_episodes,
                        generations=args.generations, env=args.env, runs=args.runs,
                        population=args.population, truncation=args.truncation,
                        candidates=args.elite_candidates, episodes=args.elite_episodes)  # fmt: skip


def serve(args: argparse.Namespace, concurrent: int, folder: Path) -> dict[str, Any]:
    """Serves the study with `concurrent` runs at once; its wall time, worker-seconds and
    each run's last elite score."""
    study_file = folder / f"study-{concurrent}.toml"
    study_file.write_text(study_text(args, concurrent))
    study_dir = folder / f"at-once-{concurrent}"
    command = [sys.executable, "-m", "master", "--study", str(study_file), "--study-dir",
               str(study_dir), "--local-workers", str(args.workers), "--port", "0",
               "--quiet"]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    wall_s = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # The master and its local workers (it waits for them): every CPU second the study took.
    cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"neuro-master exited {done.returncode}: {done.stderr[-2000:]}")
    runs = {}
    for metrics in sorted(study_dir.glob("runs/*/metrics.jsonl")):
        last = json.loads(metrics.read_text().splitlines()[-1])
        runs[metrics.parent.name] = {"worker_s": last["worker_s"], "frames": last["frames"],
                                     "elite_score": last["elite_score"]}  # fmt: skip
    worker_s = sum(run["worker_s"] for run in runs.values())
    return {
        "max_concurrent_runs": concurrent,
        "wall_s": round(wall_s, 2),
        "worker_s": round(worker_s, 2),
        "utilisation": round(worker_s / (args.workers * wall_s), 3),
        "cpu_s": round(cpu_s, 2),
        "runs": runs,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.study_local",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=4, help="runs of the study (seeds 0..R-1)")
    parser.add_argument("--workers", type=int, default=2, help="local workers")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--generations", type=int, default=10)
    parser.add_argument("--population", type=int, default=40)
    parser.add_argument("--truncation", type=int, default=8)
    parser.add_argument("--elite-candidates", type=int, default=3)
    parser.add_argument("--elite-episodes", type=int, default=5)
    parser.add_argument("--test-episodes", type=int, default=5)
    parser.add_argument("--json", help="write the result here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not 1 <= args.runs <= 64 or not 1 <= args.workers <= 64:
        raise SystemExit(f"--runs and --workers must be in [1, 64], got {args.runs}, "
                         f"{args.workers}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="study-local-") as folder:
        at_once = serve(args, args.runs, Path(folder))
        one_by_one = serve(args, 1, Path(folder))
    same = {n: r["elite_score"] for n, r in at_once["runs"].items()} == {
        n: r["elite_score"] for n, r in one_by_one["runs"].items()}  # fmt: skip
    document = {
        **provenance(__file__, argv),
        "machine": machine(),
        "workers": args.workers,
        "runs": args.runs,
        "study": at_once,
        "one_after_another": one_by_one,
        "speedup": round(one_by_one["wall_s"] / at_once["wall_s"], 3),
        "same_results": same,
    }
    print(f"{args.runs} runs on {args.workers} local workers: at once {at_once['wall_s']} s "
          f"(utilisation {at_once['utilisation']}, {at_once['cpu_s']} CPU s), one after another "
          f"{one_by_one['wall_s']} s (utilisation {one_by_one['utilisation']}, "
          f"{one_by_one['cpu_s']} CPU s); the same results: {same}")  # fmt: skip
    if args.json:
        write_json(args.json, document)
    return 0


if __name__ == "__main__":
    sys.exit(main())
