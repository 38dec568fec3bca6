"""The forward pass's ms per agent step on each inference engine, as a worker's step runs it.

One pinned process per core, all at once (`--processes`, default: every core), each stepping
Frostbite on the C++ vector env with a random `deepga` genome (the paper's init) per engine
and dtype, the engines and dtypes taking turns (`--rounds`), so that the emulator between two
passes leaves the caches as cold as it does in training. Prints and writes per engine and
dtype the mean forward and emulator ms per step over all processes and rounds. Then how often
the two engines choose the same greedy action, over random genomes playing Frostbite.

    python -m bench.inference_engines --json bench/results/inference-engines-<machine>-<date>.json
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
from typing import Any

from bench.common import atari_vector_env, play_timed, provenance, write_json
from neuro.allocator import worker_environment

ENGINES = ("torch", "onnxruntime")
COMBINATIONS = [(dtype, engine) for dtype in ("float32", "int8") for engine in ENGINES]


def _child(core: int, steps: int, rounds: int, queue: Any) -> None:
    os.sched_setaffinity(0, {core})
    import gymnasium as gym
    import numpy as np
    import torch

    from worker.inference.policy import build_policy

    torch.set_num_threads(1)
    observations = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    env = atari_vector_env("Frostbite-v4", 1)  # the ceiling's emulator, under the paper protocol
    rng = np.random.default_rng(core)
    result: dict[str, list[dict[str, float]]] = {}
    for _ in range(rounds):
        for dtype, engine in COMBINATIONS:
            policy = build_policy("deepga", observations, gym.spaces.Discrete(18),
                                  inference_dtype=dtype, inference_engine=engine)  # fmt: skip
            scale = policy.init_scale()
            policy.load_parameters((rng.standard_normal(policy.num_params) * scale).astype("f4"))
            result.setdefault(f"{dtype}/{engine}", []).append(play_timed(policy, env, core, steps))
    env.close()
    queue.put(result)


def measure(processes: int, steps: int, rounds: int) -> dict[str, Any]:
    """Runs the pinned processes at once; the mean per engine and dtype over all of them."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    children = [context.Process(target=_child, args=(core, steps, rounds, queue))
                for core in range(processes)]  # fmt: skip
    for child in children:
        child.start()
    results = [queue.get(timeout=600) for _ in children]
    for child in children:
        child.join()
    summary = {}
    for key in results[0]:
        runs = [run for result in results for run in result[key]]
        names = ("forward_ms", "emulator_ms")
        summary[key] = {name: sum(run[name] for run in runs) / len(runs) for name in names}
    return {"processes": processes, "steps": steps, "rounds": rounds, "summary": summary,
            "per_process": results}  # fmt: skip


def agreement(genomes: int, steps: int) -> dict[str, dict[str, float]]:
    """Per dtype: random genomes play Frostbite with torch's greedy actions; at every visited
    observation onnxruntime's greedy action is compared, and the logits' largest difference
    relative to their size is kept."""
    import gymnasium as gym
    import numpy as np
    import torch

    from neuro.envs.make import make_env
    from worker.inference.policy import build_policy

    torch.set_num_threads(1)
    space, actions = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(18)
    result = {}
    for dtype in ("float32", "int8"):
        on = {engine: build_policy("deepga", space, actions, inference_dtype=dtype,
                                   inference_engine=engine) for engine in ENGINES}  # fmt: skip
        same = played = 0
        worst = 0.0
        for genome in range(genomes):
            rng = np.random.default_rng(100 + genome)
            scale = on["torch"].init_scale()
            flat = (rng.standard_normal(on["torch"].num_params) * scale).astype(np.float32)
            for policy in on.values():
                policy.load_parameters(flat)
            handle = make_env("Frostbite-v4")
            observation, _ = handle.env.reset(seed=genome)
            for _ in range(steps):
                expected = on["torch"].forward(observation[None])[0]
                got = on["onnxruntime"].forward(observation[None])[0]
                difference = float(np.abs(expected - got).max() / np.abs(expected).max())
                worst = max(worst, difference)
                action = int(np.argmax(expected))
                same += action == int(np.argmax(got))
                played += 1
                observation, _, terminated, truncated, _ = handle.env.step(action)
                if terminated or truncated:
                    break
            handle.env.close()
        result[dtype] = {"steps": played, "same_action": same / played,
                         "largest_relative_logit_difference": worst}  # fmt: skip
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--steps", type=int, default=2000, help="per engine, dtype and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--agreement-genomes",
        type=int,
        default=16,
        help="random genomes whose greedy actions the engines compare (0: none)",
    )
    parser.add_argument("--agreement-steps", type=int, default=2000, help="per genome, at most")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    for name in ("processes", "steps", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    # The processes run with the allocator a master's local workers get (neuro.allocator):
    # tcmalloc where the host has it; LD_PRELOAD= (set, empty) measures without.
    os.environ.update(worker_environment(os.environ))
    result = {**provenance(__file__, argv), **measure(args.processes, args.steps, args.rounds)}
    if args.agreement_genomes > 0:
        result["agreement"] = agreement(args.agreement_genomes, args.agreement_steps)
    import onnxruntime
    import torch

    result["machine"] = {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
    }
    for key, figures in result["summary"].items():
        print(f"{key:20s} forward {figures['forward_ms']:.3f} ms  emulator "
              f"{figures['emulator_ms']:.3f} ms per step")  # fmt: skip
    for dtype, figures in result.get("agreement", {}).items():
        print(f"{dtype}: the same greedy action on {figures['same_action']:.4%} of "
              f"{figures['steps']} steps; logits within "
              f"{figures['largest_relative_logit_difference']:.1e} of their size")  # fmt: skip
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
