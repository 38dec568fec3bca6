"""Does int8-static learn as well as float32? Training runs through the real CLIs, per game,
seed and dtype, each best genome replayed on fresh episodes, and the decision by a rule fixed
before the runs.

    python -m bench.learning_parity run \\
        --out bench/results/learning-parity-runs-<machine>-<date>
    python -m bench.learning_parity report \\
        --out bench/results/learning-parity-runs-<machine>-<date> --cost-ratio 1.59 \\
        --json bench/results/learning-parity-report-<machine>-<date>.json \\
        --plot docs/img/learning-parity.png

`run` trains every (game, seed, dtype) that has no result file in --out yet, one after another
(`neuro-master --local-workers W`, the paper's network, protocol and sigma, the small
learning-check setting), and writes each run's file as soon as it is done: a study stopped
half way resumes where it stopped. float32 runs stop at --frames; the other dtypes at
--frames x --budget-ratio, so that their curve holds both the equal-frames point and the
equal-cost one. Each run's best genome at each point (COST_POINTS) is replayed on
--replay-episodes fresh episodes under float32 and under the run's own dtype
(`evaluate_policy`, what neuro-eval plays).

`report` compares at equal frames and at equal core-hours. Core-hours are counted from frames
at each dtype's measured cost (--cost-ratio: float32's core-hours per frame over the other
dtype's, from bench/throughput.py run for both dtypes on the same host in one run), so that
other work on the machine during the study cannot bias the comparison. While a planned run
(GAMES) has no result file, the report lists it under missing_runs and decides nothing.
--markdown writes the per-seed table (equal frames, equal cost, final) for the docs.

The decision rule (DECISION_RULE below, recorded in every result file before the runs): for
each game, at equal core-hours, the other dtype's median replay score (its own dtype) is not
below float32's median by more than the float32 seeds' own spread (their standard deviation),
and a two-sided exact Mann-Whitney U test does not reject equality at p < 0.05. The default
changes only if every game passes. The equal-frames comparison is reported beside it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, json_text, write_json

DECISION_RULE = (
    "Per game, at equal core-hours (frames x the dtype's measured core-hours per frame on the "
    "same host): the candidate dtype's median replay score (30 fresh episodes of each run's "
    "best genome, under its own dtype) is not below float32's median by more than the "
    "standard deviation of float32's per-seed scores, and a two-sided exact Mann-Whitney U "
    "test does not reject equality at p < 0.05. The candidate becomes the default only if "
    "every game passes. The equal-frames comparison is reported beside it, and where the two "
    "disagree the study says why."
)
GAMES = {"Frostbite-v4": 5, "Seaquest-v4": 3}
COST_POINTS = (1.0, 1.25, 1.5, 1.75, 2.0)
"""Where a candidate run's best genome is replayed, in multiples of float32's frames: 1.0 is
equal frames; report takes equal cost at the largest point within the measured cost ratio
(conservative: the candidate is never credited with frames it did not pay for)."""
SETTINGS = ("--population", "40", "--truncation", "8", "--elite-candidates", "3",
            "--elite-episodes", "5", "--noise-table-size", "67108864")  # fmt: skip


def run_file(out: Path, game: str, seed: int, dtype: str) -> Path:
    return out / f"{game.removesuffix('-v4').lower()}-{dtype}-seed{seed}.json"


def train(game: str, seed: int, dtype: str, frames: int, workers: int, run_dir: Path) -> float:
    """One run through neuro-master's CLI; its wall seconds."""
    command = [sys.executable, "-m", "master", "--env", game, "--local-workers", str(workers),
               *SETTINGS, "--frames", str(frames), "--inference-dtype", dtype, "--seed",
               str(seed), "--no-target", "--quiet", "--run-dir", str(run_dir)]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    return time.perf_counter() - started


def best_until(metrics: list[dict[str, Any]], frames: float) -> dict[str, Any] | None:
    """The generation record whose elite scored best among those within `frames`."""
    within = [m for m in metrics if m["frames"] <= frames and m.get("elite_sha256")]
    finite = [m for m in within if isinstance(m.get("elite_score"), int | float)]
    return max(finite, key=lambda m: m["elite_score"]) if finite else None


def replay(run_dir: Path, sha: str, dtypes: list[str], episodes: int) -> dict[str, list[float]]:
    """The genome's replay scores under each dtype: 30 fresh episodes, the first reset seeded
    with a seed no training task used."""
    from neuro.runfiles import genome_file
    from worker.offline.replay import evaluate_policy

    path = run_dir / genome_file(sha)
    return {d: evaluate_policy(path, episodes=episodes, env_seed=10**6, inference_dtype=d)
            for d in dtypes}  # fmt: skip


def run_all(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan = [(game, seed, dtype) for game, seeds in args.games.items()
            for seed in range(1, seeds + 1) for dtype in args.dtypes]  # fmt: skip
    for index, (game, seed, dtype) in enumerate(plan, 1):
        path = run_file(out, game, seed, dtype)
        if path.exists():
            continue
        budget = args.frames if dtype == "float32" else int(args.frames * args.budget_ratio)
        print(f"[{index}/{len(plan)}] {game} seed {seed} {dtype}: {budget:,} frames", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = Path(tmp) / "run"
            wall = train(game, seed, dtype, budget, args.workers, run_dir)
            metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
            points = {"final": budget}
            if dtype != "float32":
                points.update({f"x{ratio:g}": int(args.frames * ratio) for ratio in COST_POINTS
                               if ratio <= args.budget_ratio})  # fmt: skip
            replays: dict[str, Any] = {}
            replayed: dict[str, dict[str, list[float]]] = {}  # one replay per distinct genome
            for name, frames in points.items():
                best = best_until(metrics, frames)
                if best is None:
                    continue
                sha = best["elite_sha256"]
                # The final genome under float32 and its own dtype; the others under their
                # own dtype, what the run would have deployed at that cost.
                wanted = {"float32", dtype} if name == "final" else {dtype}
                have = replayed.setdefault(sha, {})
                missing = sorted(wanted - have.keys())
                if missing:
                    have.update(replay(run_dir, sha, missing, args.replay_episodes))
                replays[name] = {"frames_within": frames, "generation": best["generation"],
                                 "elite_sha256": sha, "elite_score": best["elite_score"],
                                 "scores": dict(replayed[sha])}  # fmt: skip
            genomes = {m["elite_sha256"]: json.loads((run_dir / "genomes" /
                       f"{m['elite_sha256']}.json").read_text())["seeds"]
                       for m in metrics if m.get("elite_sha256")}  # fmt: skip
        result = {"game": game, "seed": seed, "dtype": dtype, "frames_budget": budget,
                  "wall_s": wall, "workers": args.workers, "settings": list(SETTINGS),
                  "decision_rule": DECISION_RULE, "metrics": metrics, "replays": replays,
                  "elite_seeds": genomes, "measured": time.strftime("%Y-%m-%d")}  # fmt: skip
        tmp_path = path.with_suffix(".json.tmp")
        tmp_path.write_text(json.dumps(result, indent=1) + "\n")
        os.replace(tmp_path, path)


def mann_whitney_p(a: list[float], b: list[float]) -> float:
    """Two-sided exact p-value of the Mann-Whitney U test (ties: mid-ranks), by enumeration."""
    pooled = a + b
    order = sorted(range(len(pooled)), key=lambda i: pooled[i])
    ranks = [0.0] * len(pooled)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and pooled[order[j + 1]] == pooled[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    expected = len(a) * (len(pooled) + 1) / 2
    observed = abs(sum(ranks[: len(a)]) - expected)
    splits = list(itertools.combinations(range(len(pooled)), len(a)))
    extreme = sum(abs(sum(ranks[k] for k in s) - expected) >= observed - 1e-9 for s in splits)
    return extreme / len(splits)


def replay_mean(run: dict[str, Any], point: str, dtype: str) -> float | None:
    found = run["replays"].get(point)
    return None if found is None else statistics.fmean(found["scores"][dtype])


def equal_cost_point(ratio: float) -> str:
    """The replay point a candidate run is compared at for a measured cost ratio."""
    return f"x{max(r for r in COST_POINTS if r <= max(ratio, 1.0)):g}"


def summarise(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "n": len(values)}  # fmt: skip


def run_report(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    runs = [json.loads(p.read_text()) for p in sorted(out.glob("*-seed*.json"))]
    report: dict[str, Any] = {"decision_rule": DECISION_RULE, "cost_ratio": args.cost_ratio,
                              "equal_cost_point": equal_cost_point(args.cost_ratio),
                              "games": {}}  # fmt: skip
    passes = []
    for game in sorted({r["game"] for r in runs}):
        of = [r for r in runs if r["game"] == game]
        base = [replay_mean(r, "final", "float32") for r in of if r["dtype"] == "float32"]
        base = [v for v in base if v is not None]
        entry: dict[str, Any] = {"float32": summarise(base) if base else None}
        for dtype in sorted({r["dtype"] for r in of} - {"float32"}):
            mine = [r for r in of if r["dtype"] == dtype]
            at_frames = [replay_mean(r, "x1", dtype) for r in mine]
            at_cost = [replay_mean(r, equal_cost_point(args.cost_ratio), dtype) for r in mine]
            at_frames = [v for v in at_frames if v is not None]
            at_cost = [v for v in at_cost if v is not None]
            row: dict[str, Any] = {}
            for name, values in (("equal_frames", at_frames), ("equal_cost", at_cost)):
                if not values or len(base) < 2:
                    continue
                spread = statistics.stdev(base)
                gap = statistics.median(base) - statistics.median(values)
                p = mann_whitney_p(values, base)
                row[name] = {**summarise(values), "median_gap_below_float32": gap,
                             "float32_spread": spread, "mann_whitney_p": p,
                             "passes": gap <= spread and p >= 0.05}  # fmt: skip
            entry[dtype] = row
            if "equal_cost" in row:
                passes.append(row["equal_cost"]["passes"])
        report["games"][game] = entry
    # No decision on part of the plan: a game or seed still missing could change it.
    report["missing_runs"] = missing_runs(runs, GAMES, ("float32", "int8-static"))
    report["decision"] = (bool(passes) and all(passes)) if not report["missing_runs"] else None
    print(json_text(report))
    if args.json:
        write_json(args.json, report)
    if args.markdown:
        Path(args.markdown).write_text(markdown_table(runs, args.cost_ratio))
    if args.plot:
        plot(runs, args.cost_ratio, Path(args.plot))
    return report


def missing_runs(runs: list[dict[str, Any]], games: dict[str, int], dtypes) -> list[str]:
    """The planned (game, seed, dtype) runs without a result file, as their file stems."""
    done = {(r["game"], r["seed"], r["dtype"]) for r in runs}
    return [run_file(Path(), game, seed, dtype).stem for game, seeds in games.items()
            for seed in range(1, seeds + 1) for dtype in dtypes
            if (game, seed, dtype) not in done]  # fmt: skip


def markdown_table(runs: list[dict[str, Any]], ratio: float) -> str:
    """Per game and seed: each run's replay mean (30 fresh episodes, its own dtype) at equal
    frames, at equal cost and at its final point."""
    point = equal_cost_point(ratio)
    lines = [f"| game | seed | float32 (3M frames) | int8-static, equal frames | "
             f"int8-static, equal cost ({point}) | int8-static, final |",
             "|---|---|---|---|---|---|"]  # fmt: skip

    def cell(run: dict[str, Any] | None, at: str, dtype: str) -> str:
        value = replay_mean(run, at, dtype) if run is not None else None
        return "" if value is None else f"{value:,.0f}"

    for game in sorted({r["game"] for r in runs}):
        by = {(r["seed"], r["dtype"]): r for r in runs if r["game"] == game}
        for seed in sorted({seed for seed, _ in by}):
            base, other = by.get((seed, "float32")), by.get((seed, "int8-static"))
            lines.append(f"| {game} | {seed} | {cell(base, 'final', 'float32')} | "
                         f"{cell(other, 'x1', 'int8-static')} | "
                         f"{cell(other, point, 'int8-static')} | "
                         f"{cell(other, 'final', 'int8-static')} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(runs: list[dict[str, Any]], ratio: float, path: Path) -> None:
    """Elite score against float32-equivalent core-hours, one panel per game."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    games = sorted({r["game"] for r in runs})
    figure, axes = plt.subplots(1, len(games), figsize=(6 * len(games), 4), squeeze=False)
    for axis, game in zip(axes[0], games, strict=True):
        for run in (r for r in runs if r["game"] == game):
            scale = 1.0 if run["dtype"] == "float32" else 1.0 / ratio
            xs = [m["frames"] * scale / 1e6 for m in run["metrics"]]
            ys = [m["elite_score"] for m in run["metrics"]]
            colour = "tab:blue" if run["dtype"] == "float32" else "tab:orange"
            axis.plot(xs, ys, color=colour, alpha=0.7,
                      label=run["dtype"] if run["seed"] == 1 else None)  # fmt: skip
        axis.set_title(game)
        axis.set_xlabel("cost (million float32-equivalent frames)")
        axis.set_ylabel("elite score (mean of its re-evaluations)")
        axis.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def games_arg(text: str) -> dict[str, int]:
    games = {}
    for part in text.split(","):
        name, _, count = part.partition("=")
        if not count.isdigit() or int(count) < 1:
            raise argparse.ArgumentTypeError(f"expected GAME=SEEDS, got {part!r}")
        games[name] = int(count)
    return games


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="train and replay what has no result file yet")
    run.add_argument("--out", required=True)
    run.add_argument(
        "--games",
        type=games_arg,
        default=GAMES,
        help="GAME=SEEDS,... (default Frostbite-v4=5,Seaquest-v4=3)",
    )
    run.add_argument("--dtypes", nargs="+", default=["float32", "int8-static"])
    run.add_argument("--frames", type=int, default=3_000_000, help="float32's budget")
    run.add_argument(
        "--budget-ratio",
        type=float,
        default=2.0,
        help="the other dtypes' budget over float32's (>= the cost ratio)",
    )
    run.add_argument("--workers", type=int, default=2)
    run.add_argument("--replay-episodes", type=int, default=30)
    report = commands.add_parser("report", help="the table and the decision")
    report.add_argument("--out", required=True)
    report.add_argument(
        "--cost-ratio",
        type=float,
        required=True,
        help="float32's core-hours per frame over the other dtype's",
    )
    report.add_argument("--json", default=None)
    report.add_argument("--plot", default=None)
    report.add_argument("--markdown", default=None, help="write the per-seed table here")
    args = parser.parse_args(argv)
    if args.command == "run":
        for name in ("frames", "workers", "replay_episodes"):
            if getattr(args, name) < 1:
                parser.error(f"--{name.replace('_', '-')} must be >= 1")
        if not (math.isfinite(args.budget_ratio) and args.budget_ratio >= 1):
            parser.error(f"--budget-ratio must be >= 1, got {args.budget_ratio}")
        run_all(args)
    else:
        if not (math.isfinite(args.cost_ratio) and args.cost_ratio > 0):
            parser.error(f"--cost-ratio must be > 0, got {args.cost_ratio}")
        run_report(args)


if __name__ == "__main__":
    main()
