"""What pinning a worker to one CPU (neuro-worker --cpu) changes in its Atari step.

ale-py's vector env steps the emulator in a thread of its own and hands each observation to
the caller's thread, which runs the forward pass. This runs that loop as a worker does
(Frostbite on the C++ vector env under the paper protocol, a random `deepga` genome, one
forward pass per step) in `--processes` processes at once, left to the scheduler and then
pinned one per CPU (every thread of a process on its CPU, as `pin_to_cpu` does), taking
turns for `--rounds`. Prints the mean forward and emulator ms per step of each, and their
ratio. With fewer processes than CPUs (the default, 1) a process has idle cores beside it,
as a worker on a host it does not fill has; with one per CPU every core is busy.

    python -m bench.pinning --json bench/results/pinning-<machine>-<date>.json
    python -m bench.pinning --processes 2 --json bench/results/pinning-busy-<machine>-<date>.json
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
from typing import Any

from bench.common import atari_vector_env, play_timed, provenance, write_json
from neuro.allocator import worker_environment

MODES = ("scheduler", "pinned")


def _child(index: int, cpu: int | None, dtype: str, steps: int, queue: Any) -> None:
    if cpu is not None:
        from worker.cli.pinning import pin_to_cpu

        pin_to_cpu(cpu)  # before the vector env starts its thread: it inherits the CPU
    import gymnasium as gym
    import numpy as np
    import torch

    from worker.inference.policy import build_policy
    from worker.play.calibration import calibration_for

    torch.set_num_threads(1)
    policy = build_policy("deepga", gym.spaces.Box(0, 255, (4, 84, 84), np.uint8),
                          gym.spaces.Discrete(18), inference_dtype=dtype,
                          calibration=calibration_for(dtype, "Frostbite-v4", "paper"))  # fmt: skip
    rng = np.random.default_rng(index)
    policy.load_parameters(
        (rng.standard_normal(policy.num_params) * policy.init_scale()).astype(np.float32)
    )
    env = atari_vector_env("Frostbite-v4", 1)  # the ceiling's emulator, under the paper protocol
    timed = play_timed(policy, env, index, steps)
    env.close()
    queue.put(timed)


def trial(mode: str, processes: int, dtype: str, steps: int) -> dict[str, float]:
    """`processes` loops at once, pinned one per allowed CPU or not; their mean ms a step."""
    cpus = sorted(os.sched_getaffinity(0))
    context = mp.get_context("spawn")
    queue = context.Queue()
    pinned_to = [cpus[index] if mode == "pinned" else None for index in range(processes)]
    children = [
        context.Process(target=_child, args=(index, cpu, dtype, steps, queue))
        for index, cpu in enumerate(pinned_to)
    ]
    for child in children:
        child.start()
    results = [queue.get(timeout=600) for _ in children]
    for child in children:
        child.join()
    mean = {name: sum(r[name] for r in results) / len(results) for name in results[0]}
    return {**mean, "step_ms": mean["forward_ms"] + mean["emulator_ms"]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=1,
                        help="loops at once (default 1: idle CPUs beside it)")  # fmt: skip
    parser.add_argument("--inference-dtype", default="int8-static")
    parser.add_argument("--steps", type=int, default=4000, help="per process and trial")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    for name in ("processes", "steps", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    allowed = len(os.sched_getaffinity(0))
    if args.processes > allowed:
        parser.error(f"--processes {args.processes}: only {allowed} CPUs to pin them to")
    # The allocator a master's local workers get (neuro.allocator): tcmalloc where installed.
    os.environ.update(worker_environment(os.environ))
    rounds: list[dict[str, dict[str, float]]] = []
    for number in range(args.rounds):
        rounds.append({mode: trial(mode, args.processes, args.inference_dtype, args.steps)
                       for mode in MODES})  # fmt: skip
        figures = "  ".join(f"{mode} {r['forward_ms']:.3f} + {r['emulator_ms']:.3f} ms"
                            for mode, r in rounds[-1].items())  # fmt: skip
        print(f"round {number + 1}: forward + emulator per step: {figures}", flush=True)
    summary = {
        mode: {name: sum(r[mode][name] for r in rounds) / len(rounds) for name in rounds[0][mode]}
        for mode in MODES
    }
    ratio = summary["pinned"]["step_ms"] / summary["scheduler"]["step_ms"]
    print(f"mean step: scheduler {summary['scheduler']['step_ms']:.3f} ms, pinned "
          f"{summary['pinned']['step_ms']:.3f} ms (pinned / scheduler {ratio:.3f}), "
          f"{args.processes} process(es) on {allowed} CPUs")  # fmt: skip
    result = {
        **provenance(__file__, argv),
        "settings": {**vars(args), "cpus": allowed, "ld_preload": os.environ.get("LD_PRELOAD", "")},
        "rounds": rounds,
        "summary": summary,
        "pinned_over_scheduler": ratio,
    }
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
