"""Random-start episode lengths of the paper's 13 Atari games: how long a task runs, per game.

Each game plays `--episodes` episodes of uniformly random actions under the paper's protocol as
a worker's vector backend plays it (worker/play/atari_vector.py: ale-py's C++ vector env, the
emulator's 0-30 no-ops seeded by the task's env seed, FIRE for one agent step where the game
has it, frameskip 4), each episode cut at `--max-episode-steps` agent steps (the training cap,
5,000). Episodes run `--lanes` at a time in one vector env per game, the games spread over
`--processes` processes. Random actions are not a trained policy's: a learning policy survives
longer in most games (bench/results/frostbite-episode-steps.json: offspring of a trained
Frostbite genome, mean 1,134 steps against random play's mean here), so these lengths are the
start of a run, and bench/fleet_study.py can take the trained Frostbite lengths instead.

    python -m bench.episode_lengths --json bench/results/paper-games-episode-steps.json

(a few minutes on 2 cores). bench/fleet_study.py reads the result by name.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import statistics
import time
from typing import Any

from bench.common import ale_game, provenance, write_json

PAPER_GAMES = (
    "Amidar-v4", "Assault-v4", "Asterix-v4", "Asteroids-v4", "Atlantis-v4", "Enduro-v4",
    "Frostbite-v4", "Gravitar-v4", "Kangaroo-v4", "Seaquest-v4", "Skiing-v4", "Venture-v4",
    "Zaxxon-v4",
)  # fmt: skip
"""The 13 games of Such et al. (2017), Table 1."""


def summary(steps: list[int], cap: int) -> dict[str, Any]:
    """Mean, median, p95, extremes and the share cut at the cap of a list of episode lengths."""
    ordered = sorted(steps)
    return {
        "episodes": len(ordered),
        "mean": round(statistics.fmean(ordered), 1),
        "median": statistics.median(ordered),
        "p95": ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)],
        "min": ordered[0],
        "max": ordered[-1],
        "at_cap": sum(1 for s in ordered if s >= cap),
    }


def play_game(env_id: str, episodes: int, lanes: int, cap: int, seed: int) -> dict[str, Any]:
    """`episodes` random-action episodes of one game, `lanes` at a time: steps and returns."""
    import numpy as np

    from master.fleet.phases import env_seed_for
    from worker.play.atari_vector import VectorGroup

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    started = time.perf_counter()
    group = VectorGroup(ale_game(env_id), min(lanes, episodes))
    rng = np.random.default_rng(seed)
    n_actions = int(group.action_space.n)
    subs = [group.take() for _ in range(group.size)]
    queue = list(range(episodes))
    running: dict[int, list] = {}  # lane -> [episode index, steps, return]
    steps_of = [0] * episodes
    returns_of = [0.0] * episodes

    def start(lane: int) -> None:
        episode = queue.pop(0)
        # Seeded as a task's env seed is: by the run seed and a task id.
        subs[lane].reset(seed=env_seed_for(seed, f"{env_id}/random/{episode}"))
        running[lane] = [episode, 0, 0.0]

    for lane in range(group.size):
        start(lane)
    emulated = 0
    while running:
        actions = {lane: int(rng.integers(n_actions)) for lane in running if group.ready(lane)}
        result = group.step(actions)
        emulated += group.size
        for lane in list(running):
            if not result.counted[lane]:
                continue  # the reset's FIRE, not an agent step
            entry = running[lane]
            entry[1] += 1
            entry[2] += float(result.rewards[lane])
            if result.terminated[lane] or result.truncated[lane] or entry[1] >= cap:
                steps_of[entry[0]], returns_of[entry[0]] = entry[1], entry[2]
                del running[lane]
                if queue:
                    start(lane)
    wall = time.perf_counter() - started
    return {
        "env": env_id,
        **summary(steps_of, cap),
        "steps": steps_of,
        "returns": returns_of,
        "mean_return": round(statistics.fmean(returns_of), 1),
        "wall_s": round(wall, 1),
        "emulated_steps": emulated,
    }


def _play(job: tuple[str, int, int, int, int]) -> dict[str, Any]:
    return play_game(*job)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=list(PAPER_GAMES),
                        help="gymnasium ids (default: the paper's 13 games)")  # fmt: skip
    parser.add_argument("--episodes", type=int, default=30, help="per game (default 30)")
    parser.add_argument("--lanes", type=int, default=10,
                        help="episodes played at once in one game's vector env")  # fmt: skip
    parser.add_argument("--max-episode-steps", type=int, default=5000)
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    for flag in ("episodes", "lanes", "max_episode_steps", "processes"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    made = provenance(__file__, argv)
    started = time.perf_counter()
    jobs = [(env, args.episodes, args.lanes, args.max_episode_steps, args.seed)
            for env in args.envs]  # fmt: skip
    with mp.get_context("spawn").Pool(min(args.processes, len(jobs))) as pool:
        games = pool.map(_play, jobs, chunksize=1)
    wall = time.perf_counter() - started
    print(f"{'env':<14} {'mean':>7} {'median':>7} {'p95':>6} {'max':>6} {'at cap':>6} {'s':>5}")
    for game in games:
        print(f"{game['env']:<14} {game['mean']:>7.1f} {game['median']:>7.0f} {game['p95']:>6} "
              f"{game['max']:>6} {game['at_cap']:>6} {game['wall_s']:>5.0f}")  # fmt: skip
    print(f"measured in {wall:.0f} s")
    result = {
        **made,
        "what": "agent steps of random-action episodes under the paper's protocol, per game, "
        "for bench/fleet_study.py",
        "policy": "uniformly random actions over each game's minimal action set",
        "protocol": "worker/play/atari_vector.py (the vector backend): 0-30 seeded no-ops, "
        "FIRE where the game has it, frameskip 4 with max-pool, no sticky actions",
        "max_episode_steps": args.max_episode_steps,
        "episodes_per_game": args.episodes,
        "seed": args.seed,
        "wall_s": round(wall, 1),
        "games": {game["env"]: game for game in games},
    }
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
