"""neuro-master: serve a GA run over gRPC, optionally with local worker processes."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from pathlib import Path

from master.config import ARCHITECTURES, ATARI_DYNAMICS, inspect_env_id, preset


def _hidden_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"hidden sizes must look like 64,64, got {text!r}"
        ) from None
    if not sizes or any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"hidden sizes must be positive integers, got {text!r}")
    return sizes


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="neuro-master",
        description="Run the Deep GA master: hands individuals out as leases over gRPC.",
    )
    p.add_argument(
        "--env",
        default=os.environ.get("NEURO_ENV"),
        required="NEURO_ENV" not in os.environ,
        help="gymnasium id: Frostbite-v4, ALE/Frostbite-v5, CartPole-v1, ... (env NEURO_ENV)",
    )
    p.add_argument(
        "--host",
        default=os.environ.get("NEURO_HOST", "127.0.0.1"),
        help="address to listen on (default %(default)s; 0.0.0.0 for a fleet)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("NEURO_PORT", "8080")),
        help="gRPC port (default %(default)s; 0 picks a free one)",
    )
    p.add_argument(
        "--local-workers",
        type=int,
        default=0,
        metavar="W",
        help="also start W worker processes on this machine",
    )
    p.add_argument(
        "--run-dir",
        default=os.environ.get("NEURO_RUN_DIR"),
        help="where metrics and genomes go (default runs/ENV-TIMESTAMP)",
    )
    budget = p.add_argument_group("budget (the run stops at the first one reached)")
    budget.add_argument("--generations", type=int)
    budget.add_argument("--frames", type=int, help="emulator frames (4 per Atari step)")
    budget.add_argument(
        "--target-score",
        type=float,
        help="stop once the elite's re-evaluated mean reaches this "
        "(default: the env's reward threshold, if it has one)",
    )
    budget.add_argument(
        "--no-target",
        action="store_true",
        help="never stop at a target score; run the other budgets out",
    )
    ga = p.add_argument_group("genetic algorithm (defaults: the paper's for Atari)")
    ga.add_argument("--population", type=int, dest="population_size")
    ga.add_argument("--truncation", type=int, help="parents per generation; 0 = random search")
    ga.add_argument("--mutation-power", type=float)
    ga.add_argument("--elite-candidates", type=int)
    ga.add_argument("--elite-episodes", type=int)
    ga.add_argument("--seed", type=int, help="seeds the whole run (default 0)")
    policy = p.add_argument_group("policy and env")
    policy.add_argument(
        "--policy",
        choices=ARCHITECTURES,
        dest="architecture",
        help="deepga (paper, 4M params), nature (1.7M), mlp (vector observations)",
    )
    policy.add_argument(
        "--hidden", type=_hidden_sizes, dest="hidden_sizes", help="mlp sizes, e.g. 64,64"
    )
    policy.add_argument(
        "--atari-dynamics",
        choices=ATARI_DYNAMICS,
        help="paper (default): the paper's protocol; registered: the env's own",
    )
    policy.add_argument(
        "--max-episode-steps",
        type=int,
        help="agent steps per training episode (Atari default 5000; 0 = env's own)",
    )
    policy.add_argument("--noise-table-size", type=int)
    policy.add_argument("--noise-table-seed", type=int)
    fleet = p.add_argument_group("fleet")
    fleet.add_argument("--lease-seconds", type=float, help="a lease lapses after this (default 60)")
    fleet.add_argument(
        "--max-task-attempts",
        type=int,
        help="failures before an evaluation is recorded as failed (default 5)",
    )
    fleet.add_argument("--episodes-per-task", type=int)
    fleet.add_argument(
        "--worker-arg",
        action="append",
        default=[],
        help="extra argument for local workers (repeatable)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines on stdout")
    return p


GA_FLAGS = ("population_size", "truncation", "mutation_power", "elite_candidates", "elite_episodes",
            "seed")  # fmt: skip
RUN_FLAGS = ("generations", "frames", "target_score", "architecture", "hidden_sizes",
             "atari_dynamics", "max_episode_steps", "noise_table_size", "noise_table_seed",
             "lease_seconds", "max_task_attempts", "episodes_per_task")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s master %(message)s")
    if args.local_workers < 0:
        parser.error(f"--local-workers must be >= 0, got {args.local_workers}")
    try:
        kind = inspect_env_id(args.env)
        overrides = {
            k: getattr(args, k) for k in GA_FLAGS + RUN_FLAGS if getattr(args, k) is not None
        }
        if args.no_target:
            overrides["target_score"] = None
        config = preset(kind, **overrides)
    except (ValueError, TypeError) as error:
        parser.error(str(error))
    run_dir = Path(
        args.run_dir or f"runs/{args.env.replace('/', '_')}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    from master.server import run_master

    try:
        asyncio.run(
            run_master(
                config,
                run_dir,
                args.host,
                args.port,
                local_workers=args.local_workers,
                worker_args=(*args.worker_arg, "--give-up-after", "30"),
                out=None if args.quiet else sys.stdout,
            )
        )
    except (OSError, RuntimeError) as error:
        print(f"neuro-master: {error}", file=sys.stderr)
        return 1
    return 0
