"""GA against GA-NS on neuro/DeceptiveMaze-v0 through the real system, seed by seed.

    python -m bench.maze_compare --out runs/maze-compare   # seeds 1-5, 2 local workers each

Each run is `python -m master --env neuro/DeceptiveMaze-v0 --algo ALGO --seed S --frames F
--local-workers W` with the vector-env preset (population 100, truncation 10, mutation power
0.05, mlp 64x64, elite of 3 candidates x 1 episode; GA-NS: k=10, archive probability 0.01), the
same frame budget for both, stopping early once the elite reaches the goal (the env's
reward_threshold, -0.05: within the goal's radius). Prints one line per run and a summary, writes
the figures as JSON and a plot of every run's elite distance to the goal against frames.
bench/maze_search.py runs the same comparison in process, in a fraction of the time.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from bench.common import REPO, write_json
from master.run.rundir import read_metrics
from neuro.envs.maze import GOAL_RADIUS

MAZE = "neuro/DeceptiveMaze-v0"
ARMS = ("ga", "ga-ns")
COLOURS = {"ga": "tab:red", "ga-ns": "tab:blue"}


def run(arm: str, seed: int, frames: int, workers: int, run_dir: Path) -> dict:
    command = [sys.executable, "-m", "master", "--env", MAZE, "--algo", arm, "--seed", str(seed),
               "--frames", str(frames), "--local-workers", str(workers), "--port", "0",
               "--run-dir", str(run_dir), "--quiet"]  # fmt: skip
    started = time.monotonic()
    subprocess.run(command, cwd=REPO, check=True)
    records = read_metrics(run_dir / "metrics.jsonl")
    reached = next((r for r in records if r["elite_score"] >= -GOAL_RADIUS), None)
    return {
        "arm": arm,
        "seed": seed,
        "reached_goal": reached is not None,
        "generation": reached["generation"] if reached else None,
        "frames_to_goal": reached["frames"] if reached else None,
        "generations": len(records),
        "frames": records[-1]["frames"],
        "best_distance": -max(r["elite_score"] for r in records),
        "wall_s": round(time.monotonic() - started, 1),
        "curve": [(r["frames"], -r["elite_score"]) for r in records],
    }


def plot(results: list[dict], frames: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5))
    for result in results:
        x, y = zip(*result["curve"], strict=True)
        label = result["arm"] if result["seed"] == min(r["seed"] for r in results) else None
        axes.step(x, y, where="post", color=COLOURS[result["arm"]], alpha=0.8, label=label)
    axes.axhline(GOAL_RADIUS, color="black", linestyle="--", linewidth=1, label="goal radius")
    axes.set_xlim(0, frames)
    axes.set_ylim(0, None)
    axes.set_xlabel("frames (agent steps)")
    axes.set_ylabel("elite's final distance to the goal")
    seeds = ", ".join(str(seed) for seed in sorted({r["seed"] for r in results}))
    axes.set_title(f"{MAZE}: GA vs GA-NS, seeds {seeds}")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/maze-compare"),
                        help="run dirs, results.json and the plot go here")  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--frames", type=int, default=2_000_000,
                        help="the frame budget of every run (default %(default)s, about 100 "
                        "generations of the preset)")  # fmt: skip
    parser.add_argument("--workers", type=int, default=2, help="local workers per run")
    parser.add_argument("--plot", type=Path, default=None, help="PNG path (default OUT/maze.png)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    print(f"{'arm':6} {'seed':>4} {'goal':>5} {'gen':>4} {'frames to goal':>14} "
          f"{'gens':>5} {'best dist':>9} {'wall s':>7}")  # fmt: skip
    for arm in ARMS:
        for seed in args.seeds:
            result = run(arm, seed, args.frames, args.workers, args.out / f"{arm}-{seed}")
            results.append(result)
            print(f"{arm:6} {seed:>4} {'yes' if result['reached_goal'] else 'no':>5} "
                  f"{result['generation'] if result['reached_goal'] else '-':>4} "
                  f"{result['frames_to_goal'] or '-':>14} {result['generations']:>5} "
                  f"{result['best_distance']:>9.4f} {result['wall_s']:>7}", flush=True)  # fmt: skip
    for arm in ARMS:
        mine = [r for r in results if r["arm"] == arm]
        reached = sum(r["reached_goal"] for r in mine)
        print(f"{arm}: reached the goal in {reached}/{len(mine)} runs")
    write_json(args.out / "results.json", results)
    plot(results, args.frames, args.plot or args.out / "maze.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
