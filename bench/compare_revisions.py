"""The forward pass's ms per agent step on each inference engine, this tree against a revision.

What bench/inference_engines.py measures (bench/common.py's `play_timed`: one pinned process
per core, each stepping Frostbite on the C++ vector env with a random deepga genome, forward
and emulator ms per step), run from two trees in turns on the same cores: a git revision
checked out in a temporary worktree ("before") and this working tree ("after"). The trees
alternate round by round, so that a slow hour of a shared host falls on both alike. Each tree
builds its policies with its own code, whatever its module layout; both are timed by this
tree's bench/common.py, loaded by its file path, so the harness is the same on both sides.
Prints and writes per engine and dtype the mean over processes and rounds, and after / before.

    python -m bench.compare_revisions --before HEAD~1 \\
        --json bench/results/compare-revisions-<change>-<machine>-<date>.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench import common
from bench.common import REPO, commit_of, head_revision, provenance, worktree, write_json
from neuro.allocator import worker_environment

COMBINATIONS = [
    (dtype, engine)
    for dtype in ("float32", "int8", "int8-static")
    for engine in ("torch", "onnxruntime")
]

# Run in a process of its own inside one tree (its working directory, first on sys.path): that
# tree's build_policy, wherever it lives, timed by the harness file named in argv[4].
CHILD = """
import importlib.util, json, os, sys
core, steps, combos = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
os.sched_setaffinity(0, {core})
spec = importlib.util.spec_from_file_location("harness", sys.argv[4])
harness = importlib.util.module_from_spec(spec)
spec.loader.exec_module(harness)
import gymnasium as gym
import numpy as np
import torch
try:
    from worker.inference.policy import build_policy
    try:
        from worker.play.calibration import calibration_observations
    except ImportError:  # before calibration moved to play/
        from worker.evaluation.calibration import calibration_observations
except ImportError:  # the layout before the worker's rooms
    from worker.policies import build_policy
    from worker.static_int8 import calibration_observations

torch.set_num_threads(1)
space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
env = harness.atari_vector_env("Frostbite-v4", 1)
rng = np.random.default_rng(core)
result = {}
for dtype, engine in combos:
    extra = {}
    if dtype == "int8-static":
        extra["calibration"] = calibration_observations("Frostbite-v4", "paper")
    policy = build_policy("deepga", space, gym.spaces.Discrete(18), inference_dtype=dtype,
                          inference_engine=engine, **extra)
    assert policy.inference_engine == engine, (dtype, engine, policy.inference_engine)
    scale = policy.init_scale()
    policy.load_parameters((rng.standard_normal(policy.num_params) * scale).astype("f4"))
    result[dtype + "/" + engine] = harness.play_timed(policy, env, core, steps)
env.close()
print(json.dumps(result))
"""


def run_tree(tree: Path, processes: int, steps: int) -> list[dict[str, dict[str, float]]]:
    """One round in one tree: a pinned process per core, all at once."""
    command = [sys.executable, "-c", CHILD]
    settings = [str(steps), json.dumps(COMBINATIONS), common.__file__]
    children = [
        subprocess.Popen(
            [*command, str(core), *settings],
            cwd=tree,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(tree)},
        )
        for core in range(processes)
    ]
    results = []
    for child in children:
        out, _ = child.communicate(timeout=1800)
        if child.returncode != 0:
            raise RuntimeError(f"a measuring process in {tree} exited {child.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def summary(runs: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    keys = runs[0]
    return {
        key: {name: sum(run[key][name] for run in runs) / len(runs)
              for name in ("forward_ms", "emulator_ms")}
        for key in keys
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="a git revision of this repository")
    parser.add_argument("--processes", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--steps", type=int, default=2000, help="per engine, dtype and round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per tree, alternating")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    for name in ("processes", "steps", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    commit = commit_of(args.before)
    if commit is None:
        parser.error(f"--before {args.before!r} is not a commit of this repository")
    os.environ.update(worker_environment(os.environ))  # the allocator local workers get
    runs: dict[str, list] = {"before": [], "after": []}
    with worktree(commit) as before:
        for round_ in range(args.rounds):
            for name, tree in (("before", before), ("after", REPO)):
                runs[name] += run_tree(tree, args.processes, args.steps)
                print(f"round {round_ + 1}/{args.rounds}: {name} measured", flush=True)
    result: dict[str, Any] = {
        **provenance(__file__, argv),
        "before": commit,
        "after": head_revision(),
        "processes": args.processes,
        "steps": args.steps,
        "rounds": args.rounds,
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
        "summary": {name: summary(found) for name, found in runs.items()},
    }
    import torch

    result["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    for key, after in result["summary"]["after"].items():
        was = result["summary"]["before"][key]
        ratio = after["forward_ms"] / was["forward_ms"]
        result["summary"].setdefault("ratio", {})[key] = ratio
        print(f"{key:24s} forward {was['forward_ms']:.3f} -> {after['forward_ms']:.3f} ms "
              f"({ratio:.3f}x); emulator {was['emulator_ms']:.3f} -> "
              f"{after['emulator_ms']:.3f} ms")  # fmt: skip
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
