"""Generations under chaos: real master and worker processes, a worker SIGKILLed every few
seconds (and replaced), the seconds each generation took and whether every count is exact.

A killed worker says nothing; before the master watched its workers' connections, its tasks
came back only when their lease lapsed (60 s by default), and each generation waited for that.
`--before REV` runs the same chaos on a git revision (a temporary worktree, its own code for
master and workers) and then on this tree, so the two are measured on the same host in one run.

    python -m bench.chaos_tail --before HEAD~3 --json bench/results/chaos-tail-<machine>-<date>.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, commit_of, head_revision, provenance, worktree, write_json


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_chaos(tree: Path, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """One run in `tree`: a master, `--workers` workers, one killed every `--kill-every` s."""
    rng = random.Random(seed)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        master = subprocess.Popen(
            [sys.executable, "-m", "master", "--env", "CartPole-v1", "--port", str(port),
             "--population", str(args.population), "--generations", str(args.generations),
             "--no-target", "--quiet", "--run-dir", str(run_dir), "--seed", str(seed)],
            cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        serial = 0

        def worker() -> subprocess.Popen:
            nonlocal serial
            serial += 1
            return subprocess.Popen(
                [sys.executable, "-m", "worker", "--master", f"127.0.0.1:{port}",
                 "--worker-id", f"w{serial}", "--give-up-after", "30"],
                cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip

        workers = [worker() for _ in range(args.workers)]
        kills = 0
        started = time.monotonic()
        next_kill = started + args.kill_every
        try:
            while master.poll() is None:
                if time.monotonic() - started > args.timeout:
                    raise RuntimeError(f"the run in {tree} took over {args.timeout} s")
                if time.monotonic() >= next_kill:
                    victim = workers.pop(rng.randrange(len(workers)))
                    victim.send_signal(signal.SIGKILL)
                    victim.wait()
                    kills += 1
                    workers.append(worker())
                    next_kill += args.kill_every
                time.sleep(0.05)
        finally:
            for process in [*workers, master]:
                if process.poll() is None:
                    process.kill()
                process.wait()
        wall = time.monotonic() - started
        lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
        config = json.loads((run_dir / "config.json").read_text())
    ga = config["ga"]
    expected = ga["population_size"] + ga["elite_candidates"] * ga["elite_episodes"]
    ends = [0.0, *(line["wall_s"] for line in lines)]
    seconds = [end - start for start, end in itertools.pairwise(ends)]
    return {
        "wall_s": wall,
        "kills": kills,
        "generations": len(lines),
        "seconds_per_generation": seconds,
        "mean_seconds_per_generation": statistics.fmean(seconds) if seconds else None,
        "exact_counts": all(line["generation_evaluations"] == expected
                            and line["failed_evaluations"] == 0 for line in lines),
        "leases_reissued": [line["leases_reissued"] for line in lines],
        "workers_lost": [line.get("workers_lost") for line in lines],
        "backup_tasks": [line.get("backup_tasks") for line in lines],
        "tail_s": [line.get("tail_s") for line in lines],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=None, help="a git revision to run first")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--population", type=int, default=200)
    parser.add_argument("--generations", type=int, default=3)
    parser.add_argument("--kill-every", type=float, default=3.0, help="seconds between kills")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run at most")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    for name in ("workers", "population", "generations"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if not 0 < args.kill_every < args.timeout:
        parser.error(f"--kill-every must be > 0 and below --timeout, got {args.kill_every}")
    result: dict[str, Any] = {
        **provenance(__file__, argv),
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
    }
    if args.before is not None:
        commit = commit_of(args.before)
        if commit is None:
            parser.error(f"--before {args.before!r} is not a commit of this repository")
        with worktree(commit) as tree:
            result["before"] = {"revision": commit, **run_chaos(tree, args, args.seed)}
    result["after"] = {"revision": head_revision(), **run_chaos(REPO, args, args.seed)}
    for side in ("before", "after"):
        if side in result:
            figures = result[side]
            print(f"{side:6s} {figures['generations']} generations, "
                  f"{figures['mean_seconds_per_generation']:.1f} s each "
                  f"({', '.join(f'{s:.1f}' for s in figures['seconds_per_generation'])}), "
                  f"{figures['kills']} kills, exact counts: {figures['exact_counts']}")  # fmt: skip
    if "before" in result:
        speedup = (result["before"]["mean_seconds_per_generation"]
                   / result["after"]["mean_seconds_per_generation"])  # fmt: skip
        result["speedup"] = speedup
        print(f"after is {speedup:.1f}x faster per generation")
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
