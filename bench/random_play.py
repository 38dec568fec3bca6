"""Score of uniformly random actions under the run's Atari protocol: the floor of a curve.

    python -m bench.random_play --env Frostbite-v4 --episodes 30 \\
        --json bench/results/random-play-<env>-<machine>-<date>.json
"""

from __future__ import annotations

import argparse
import statistics

from bench.common import provenance, write_json


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Frostbite-v4")
    parser.add_argument("--episodes", type=int, default=30)
    parser.add_argument("--max-episode-steps", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    import numpy as np

    from neuro.envs.make import make_env
    from worker.play.rollout import FunctionActor, play

    handle = make_env(args.env)
    rng = np.random.default_rng(args.seed)
    n_actions = handle.env.action_space.n
    actor = FunctionActor(lambda _: int(rng.integers(n_actions)))
    episodes = play(actor, handle, args.episodes, args.max_episode_steps, args.seed)
    scores = [episode.total_reward for episode in episodes]
    summary = {
        **provenance(__file__, argv),
        "env": args.env,
        "episodes": args.episodes,
        "mean": statistics.fmean(scores),
        "std": statistics.pstdev(scores),
        "min": min(scores),
        "max": max(scores),
    }
    print(f"random play on {args.env}: mean {summary['mean']:.1f} std {summary['std']:.1f} "
          f"over {args.episodes} episodes")  # fmt: skip
    if args.json:
        write_json(args.json, summary)
    return summary


if __name__ == "__main__":
    main()
