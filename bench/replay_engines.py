"""A saved genome's replay scores in every inference dtype on every per-genome engine.

What neuro-eval plays (the genome file's env and protocol, the first reset seeded with
--seed), once per dtype and engine in one process. A refactor of the worker must leave every
score as it was: run this before and after on the same host and compare the JSON.

    python -m bench.replay_engines bench/results/frostbite-best-genome.json --episodes 30 \\
        --json bench/results/replay-engines-<change>-<machine>-<date>.json
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.common import provenance, write_json
from neuro.inference import INFERENCE_DTYPES, INFERENCE_ENGINES


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("genome", help="a genome file or a run dir, as neuro-eval takes")
    parser.add_argument("--episodes", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes must be >= 1, got {args.episodes}")
    import torch

    from worker.evaluation.evaluator import Evaluator
    from worker.offline.replay import evaluate_policy

    torch.set_num_threads(1)
    result: dict[str, Any] = {**provenance(__file__, argv), "genome": args.genome,
                              "episodes": args.episodes, "seed": args.seed, "scores": {},
                              "engines": {}}  # fmt: skip
    for dtype in INFERENCE_DTYPES:
        for engine in INFERENCE_ENGINES:
            evaluator = Evaluator(inference_engine=engine)
            started = time.perf_counter()
            scores = evaluate_policy(args.genome, episodes=args.episodes, env_seed=args.seed,
                                     inference_dtype=dtype, evaluator=evaluator)  # fmt: skip
            key = f"{dtype}/{engine}"
            result["scores"][key] = scores
            # The engine that ran it: a preferred one that does not serve the dtype gives way.
            result["engines"][key] = sorted(set(evaluator.engines_used.values()))
            print(f"{key:24s} on {','.join(result['engines'][key])}: mean "
                  f"{sum(scores) / len(scores):.1f} ({time.perf_counter() - started:.0f} s)",
                  flush=True)  # fmt: skip
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
