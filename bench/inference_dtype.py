"""Forward-pass precision for the paper's 4M network: speed, load cost, and what it changes.

Per dtype (float32, bfloat16, int8 and int8-static as Policy runs them), on one core: ms per
forward at batch 1 (offspring) and 16 (elite re-evaluation), ms per load_parameters (decode
excluded; int8 quantises on every load, int8-static calibrates too), and weight bytes one step
reads. Then agreement: random genomes play Frostbite with the float32 policy, and at every
visited observation each dtype's greedy action is compared with float32's. Last, a trained
genome's scores under each dtype, over the same env seeds.

    python -m bench.inference_dtype --json bench/results/inference-dtype-<machine>-<date>.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common import REPO, TRAINED_GENOME, json_text, provenance, write_json
from neuro.decode import decode_genome
from neuro.envs.make import PAPER, make_env
from neuro.noise import NoiseTableSpec, load_noise_table
from worker.inference.policy import Policy, build_policy
from worker.play.calibration import calibration_for
from worker.play.rollout import run_episode

DTYPES = ("float32", "bfloat16", "int8", "int8-static")


def quartiles_ms(fn: Callable[[], Any], repeats: int) -> dict[str, float]:
    """Median and quartile range in ms of `repeats` calls, after two warm-up calls."""
    fn(), fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1e3)
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return {"median": round(q[1], 4), "p25": round(q[0], 4), "p75": round(q[2], 4)}


def build(dtype: str, handle: Any, env_id: str) -> Policy:
    """A deepga policy of this dtype for the env's spaces (int8-static: calibrated on the
    env's frames, as a worker calibrates it)."""
    env = handle.env
    return build_policy("deepga", env.observation_space, env.action_space, inference_dtype=dtype,
                        calibration=calibration_for(dtype, env_id, PAPER))  # fmt: skip


def random_genomes(count: int, policy: Policy, table: np.ndarray, rng: np.random.Generator):
    """Genomes of 1-10 seeds, decoded exactly (sigma 0.002, the paper's)."""
    scale = policy.init_scale()
    for _ in range(count):
        seeds = [int(s) for s in rng.integers(0, 2**32 - 1, int(rng.integers(1, 11)))]
        yield seeds, decode_genome(table, scale, 0.002, seeds)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Frostbite-v4")
    parser.add_argument("--noise-table-size", type=int, default=2**26)
    parser.add_argument("--forward-repeats", type=int, default=300)
    parser.add_argument("--load-repeats", type=int, default=30)
    parser.add_argument("--genomes", type=int, default=16)
    parser.add_argument("--episodes", type=int, default=2, help="per random genome")
    parser.add_argument("--max-steps", type=int, default=2000, help="per agreement episode")
    parser.add_argument("--trained-genome", default=str(TRAINED_GENOME),
                        help="genome file to score per dtype; 'none' skips it")  # fmt: skip
    parser.add_argument("--trained-episodes", type=int, default=3)
    parser.add_argument("--trained-max-steps", type=int, default=0,
                        help="0: the genome file's own cap")  # fmt: skip
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # a worker process runs on one core
    handle = make_env(args.env, PAPER)
    policies = {dtype: build(dtype, handle, args.env) for dtype in DTYPES}
    base = policies["float32"]
    table = load_noise_table(NoiseTableSpec(123, args.noise_table_size))
    rng = np.random.default_rng(0)
    genomes = list(random_genomes(args.genomes, base, table, rng))
    theta = genomes[0][1]
    result: dict[str, Any] = {
        **provenance(__file__, argv),
        "env": args.env, "params": base.num_params, "torch": torch.__version__,
        "noise_table_size": args.noise_table_size, "torch_threads": 1, "dtypes": {},
    }  # fmt: skip
    shape = base.observation_shape
    for dtype, policy in policies.items():
        policy.load_parameters(theta)
        entry: dict[str, Any] = {"weight_bytes_per_step": policy.weight_bytes_per_forward()}
        for batch in (1, 16):
            obs = rng.integers(0, 256, (batch, *shape), dtype=np.uint8)
            entry[f"forward_ms_batch_{batch}"] = quartiles_ms(
                lambda p=policy, o=obs: p.act_batch(o), args.forward_repeats
            )
        entry["load_ms"] = quartiles_ms(
            lambda p=policy: p.load_parameters(theta), args.load_repeats
        )
        result["dtypes"][dtype] = entry

    # Agreement at the observations the float32 policy visits.
    agree = {dtype: 0 for dtype in DTYPES}
    steps = 0
    for index, (_, flat) in enumerate(genomes):
        for policy in policies.values():
            policy.load_parameters(flat)

        def act(observation: np.ndarray) -> int:
            nonlocal steps
            batch = np.asarray(observation)[None]
            reference = int(base.act_batch(batch)[0])
            for dtype, policy in policies.items():
                agree[dtype] += int(policy.act_batch(batch)[0]) == reference
            steps += 1
            return reference

        for episode in range(args.episodes):
            run_episode(act, handle, args.max_steps, seed=1000 * index + episode)
    result["agreement"] = {
        "steps": steps, "genomes": args.genomes, "episodes_per_genome": args.episodes,
        "fraction_agreeing": {d: round(agree[d] / max(steps, 1), 5) for d in DTYPES},
    }  # fmt: skip

    if args.trained_genome != "none":
        result["trained"] = trained_scores(args, handle, policies)
    if args.json:
        write_json(args.json, result)
    print(json_text(result))
    return result


def trained_scores(args: argparse.Namespace, handle: Any, policies: dict) -> dict:
    """The trained genome's episode scores per dtype, over the same env seeds."""
    document = json.loads(Path(args.trained_genome).read_text())
    table_spec = NoiseTableSpec(document["noise_table"]["seed"], document["noise_table"]["size"])
    table = load_noise_table(table_spec)
    scale = policies["float32"].init_scale()
    flat = decode_genome(table, scale, document["mutation_power"], document["seeds"])
    cap = args.trained_max_steps or int(document.get("max_episode_steps") or 0)
    scores: dict[str, Any] = {"genome": _shown(args.trained_genome), "max_steps": cap,
                              "episodes": args.trained_episodes}  # fmt: skip
    for dtype, policy in policies.items():
        policy.load_parameters(flat)
        returns = [
            run_episode(
                lambda o, p=policy: int(p.act_batch(np.asarray(o)[None])[0]),
                handle,
                cap,
                seed=episode,
            ).total_reward
            for episode in range(args.trained_episodes)
        ]
        scores[dtype] = {"returns": returns, "mean": statistics.fmean(returns)}
    return scores


def _shown(path: str) -> str:
    """A path as the results should show it: relative to the repository when inside it."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(path)


if __name__ == "__main__":
    main()
