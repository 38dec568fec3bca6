"""Where an offspring step's time goes on one core, against the emulator stepping alone.

bench/throughput.py measures the whole fleet's ratio to the C++ emulator's ceiling; this says
why it is what it is, measured in one process pinned to one core, in one run:

- emulator: the C++ vector env alone under the paper's protocol (the ceiling's own loop);
- runner: the per-genome worker's runner (PerGenomeRunner, one task at a time, as a worker runs
  offspring) playing offspring of one parent, its wall time per agent step and its timers
  (env, forward, seeded reset, decode, the rest);
- dense: the dense layer alone, the engine's own op (ONNX Runtime's MatMulInteger for
  int8-static, MatMul for float32) over a loaded offspring's own rows, called again and again
  as an offspring's steps call it: the weights no pass can avoid reading (int8-static's 3.8
  MiB, float32's 15.1 MiB, neither fits a core's L2 on today's CPUs, so every pass streams them);
- forward: the engine's whole pass on the same genomes, each called again and again;
- reset: a seeded reset (it reloads the ROM to re-seed the emulator) against an unseeded one.

From these: the step's budget (what each part adds over the emulator), the measured ratio
(emulator / runner step) and the floor ratio: what a step that only emulated and read its
dense weights once (an OR over their bytes, this core's read bandwidth) would reach. The
floor is physics on this core (its caches and bandwidth), not a property of the code: a
target above it cannot be met here by any pass that reads these weights once a step.

    LD_PRELOAD=libtcmalloc_minimal.so.4 python -m bench.offspring_budget [--dtype int8-static] \
        [--tasks 16] [--json bench/results/offspring-budget-<dtype>-<machine>-<date>.json]

(tcmalloc as the workers that neuro starts, and the worker image, preload it.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import (
    ale_game,
    atari_vector_env,
    cpu_model,
    pin_to,
    provenance,
    step_vector_env,
    write_json,
)
from master.config import ATARI_TRAINING_EPISODE_STEPS
from neuro.allocator import this_process_allocator
from neuro.inference import FLOAT32, INT8_STATIC
from neuro.noise import NoiseTableSpec

PARENT_SEED = 17
"""Offspring are this parent plus one mutation each, as a generation's are."""
SIGMA = 0.002


def emulator_ms(env_id: str, seconds: float) -> float:
    """ms per agent step of the C++ vector env alone, one env, random actions: the ceiling's
    own loop (bench/common.py), in this process on its core."""
    env = atari_vector_env(env_id, 1)
    env.reset(seed=0)
    _, steps, _, wall = step_vector_env(env, seconds, np.random.default_rng(0))
    env.close()
    return wall / steps * 1e3


NOISE_TABLE_SIZE = 2**25
"""The fleet's default noise table is larger; a genome's decode reads as much of either."""


@dataclass(frozen=True)
class Offspring:
    """The offspring of one parent that the runner plays: one mutation each, as in a
    generation, each its own env seed."""

    env_id: str
    dtype: str
    table_size: int = NOISE_TABLE_SIZE
    max_steps: int = ATARI_TRAINING_EPISODE_STEPS

    def spec(self, child: int) -> Any:
        from worker.evaluation.spec import EvaluationSpec

        return EvaluationSpec(self.env_id, (PARENT_SEED, child), SIGMA,
                              NoiseTableSpec(size=self.table_size), "deepga",
                              max_episode_steps=self.max_steps, env_seed=child,
                              inference_dtype=self.dtype)  # fmt: skip


def runner_step(offspring: Offspring, tasks: int) -> tuple[dict, Any]:
    """The per-genome runner on `tasks` offspring, one at a time; ms per agent step, overall
    and by timer; and the evaluator (its policies are the dense and forward parts' genomes)."""
    from worker.evaluation.evaluator import Evaluator
    from worker.play.envs import VECTOR
    from worker.runners.per_genome import PerGenomeRunner

    evaluator = Evaluator(atari_backend=VECTOR)
    runner = PerGenomeRunner(evaluator, 1)
    runner.start("warm-up", offspring.spec(tasks))
    while runner.busy:
        runner.step()
    before = runner.timers.as_dict()
    started = time.perf_counter()
    for child in range(tasks):
        runner.start(str(child), offspring.spec(child))
        while runner.busy:
            runner.step()
    wall = time.perf_counter() - started
    after = runner.timers.as_dict()
    steps = after["steps"] - before["steps"]
    parts = {name[:-2]: (after[name] - before[name]) / steps * 1e3
             for name in ("env_s", "forward_s", "reset_s", "decode_s")}  # fmt: skip
    parts["other"] = wall / steps * 1e3 - sum(parts.values())
    return {"ms_per_step": wall / steps * 1e3, "parts_ms": parts, "steps": steps,
            "episodes": tasks, "mean_episode_steps": steps / tasks}, evaluator  # fmt: skip


def offspring_policies(evaluator: Any, offspring: Offspring, count: int) -> list[Any]:
    """`count` policies of the engine the runner used, each loaded with an offspring."""
    from worker.play.envs import build_env

    policies = []
    handle = build_env(offspring.env_id)
    for child in range(count):
        spec = offspring.spec(child)
        policy = evaluator.build_policy(spec, handle)
        evaluator.load(spec, policy)
        policies.append(policy)
    return policies


def dense_rows(policy: Any) -> np.ndarray:
    """The dense layer's (out, in) weights as the pass reads them: int8-static's 7-bit
    integers, else float32."""
    if policy.inference_dtype == INT8_STATIC:
        return policy.forward.net.fc[0]
    return policy.weights.layer("fc")[0]


def weight_reader(rows: np.ndarray) -> Any:
    """A call that reads every byte of `rows` once and nothing else (an OR over 8-byte
    words): the fastest any pass could take them in, this core's own read bandwidth."""
    words = np.ascontiguousarray(rows).reshape(-1).view(np.uint8)
    words = words[: len(words) // 8 * 8].view(np.uint64)
    return lambda: np.bitwise_or.reduce(words)


def dense_session(policy: Any) -> tuple[Any, np.ndarray]:
    """An ONNX Runtime session of the engine's dense op alone over this policy's dense rows,
    and an input for it: int8-static's 7-bit rows (MatMulInteger, u8 x s8), else float32."""
    from onnx import TensorProto

    from worker.inference.engines.onnx_runtime.session import Graph, session

    graph = Graph()
    rows = dense_rows(policy)
    if policy.inference_dtype == INT8_STATIC:
        op, element, features = "MatMulInteger", TensorProto.UINT8, np.uint8
    else:
        op, element, features = "MatMul", TensorProto.FLOAT, np.float32
    graph.node(op, ["observation", graph.constant("rows", np.ascontiguousarray(rows.T))], "sums")
    if op == "MatMulInteger":
        graph.node("Cast", ["sums"], "logits", to=TensorProto.FLOAT)
    else:
        graph.node("Identity", ["sums"], "logits")
    model = graph.model("dense", (element, (rows.shape[1],)), rows.shape[0])
    inputs = np.random.default_rng(0).integers(0, 8, (1, rows.shape[1])).astype(features)
    return session(model), inputs


def repeated_ms(calls: list[Any], seconds: float) -> float:
    """ms per call: each call repeated for its share of `seconds` (after one warm-up call),
    the median over the calls (one genome each)."""
    times = []
    for call in calls:
        call()
        count, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds / len(calls):
            call()
            count += 1
        times.append((time.perf_counter() - started) / count * 1e3)
    return statistics.median(times)


def reset_ms(env_id: str, repeats: int) -> dict[str, float]:
    """Median ms of a seeded reset (the ROM reload) and of an unseeded one, one sub-env."""
    from worker.play.atari_vector import VectorGroup

    group = VectorGroup(ale_game(env_id), 1)
    sub = group.take()
    times: dict[str, list[float]] = {"seeded": [], "unseeded": []}
    for repeat in range(repeats):
        for kind, seed in (("seeded", repeat + 1), ("unseeded", None)):
            started = time.perf_counter()
            sub.reset(seed=seed)
            times[kind].append((time.perf_counter() - started) * 1e3)
    return {kind: statistics.median(values) for kind, values in times.items()}


def budget(
    emulator: float, runner: dict, dense: float, read: float, forward: float, resets: dict
) -> dict:
    """Each part's ms per step over the emulator alone, and the ratios they give; the floor:
    the emulator and one read of the dense weights, nothing else."""
    parts = runner["parts_ms"]
    step = runner["ms_per_step"]
    rows = {
        "emulator": emulator,
        "env_beside_forward": parts["env"] - emulator,
        "dense_weights": dense,
        "rest_of_forward": parts["forward"] - dense,
        "seeded_reset": parts["reset"],
        "decode_and_load": parts["decode"],
        "other": parts["other"],
    }
    return {
        "ms_per_step": rows,
        "ratio_measured": emulator / step,
        "ratio_floor": emulator / (emulator + read),
        "weights_read_ms": read,
        "dense_over_read": dense / read,
        "ratio_without": {
            name: emulator / (step - ms) for name, ms in rows.items() if name != "emulator"
        },
        "forward_ms": forward,
        "seeded_reset_ms": resets["seeded"],
        "unseeded_reset_ms": resets["unseeded"],
        "reset_share_at_episode_length": (resets["seeded"] - resets["unseeded"])
        / runner["mean_episode_steps"]
        / step,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="Frostbite-v4")
    parser.add_argument("--dtype", choices=(INT8_STATIC, FLOAT32), default=INT8_STATIC)
    parser.add_argument("--tasks", type=int, default=12, help="offspring the runner plays")
    parser.add_argument(
        "--max-episode-steps",
        type=int,
        default=ATARI_TRAINING_EPISODE_STEPS,
        help="cap of each offspring's episode, as in training (default %(default)s)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=10.0,
        help="time for each of the emulator, dense and forward measurements",
    )
    parser.add_argument(
        "--genomes",
        type=int,
        default=8,
        help="offspring that dense and forward time, the median taken",
    )
    parser.add_argument("--resets", type=int, default=10)
    parser.add_argument("--noise-table-size", type=int, default=NOISE_TABLE_SIZE)
    parser.add_argument("--core", type=int, default=-1, help="the core to pin to (-1: the last)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    for name in ("tasks", "genomes", "resets"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.seconds <= 0:
        parser.error(f"--seconds must be > 0, got {args.seconds}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    core = args.core if args.core >= 0 else max(os.sched_getaffinity(0))
    pin_to(core)
    offspring = Offspring(args.env, args.dtype, args.noise_table_size, args.max_episode_steps)
    before = emulator_ms(args.env, args.seconds)
    runner, evaluator = runner_step(offspring, args.tasks)
    after = emulator_ms(args.env, args.seconds)
    policies = offspring_policies(evaluator, offspring, args.genomes)
    dense_calls = []
    for policy in policies:
        dense, inputs = dense_session(policy)
        dense_calls.append(
            lambda dense=dense, inputs=inputs: dense.run(None, {"observation": inputs})
        )
    dense = repeated_ms(dense_calls, args.seconds)
    read = repeated_ms([weight_reader(dense_rows(policy)) for policy in policies], args.seconds)
    frames = np.random.default_rng(1).integers(0, 256, (1, *policies[0].observation_shape))
    frames = frames.astype(np.uint8)
    forward = repeated_ms([lambda p=p: p.act_batch(frames) for p in policies], args.seconds)
    resets = reset_ms(args.env, args.resets)
    emulator = (before + after) / 2
    result = {
        **provenance(__file__, argv),
        "settings": {
            **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "core": core,
            "cpu_model": cpu_model(),
            "allocator": this_process_allocator(),
        },
        "engine": policies[0].inference_engine,
        "emulator_ms": {"before": before, "after": after, "mean": emulator},
        "runner": runner,
        "dense_ms": dense,
        "dense_weight_bytes": policies[0].forward.layer_bytes.get("fc"),
        "budget": budget(emulator, runner, dense, read, forward, resets),
    }
    print_budget(result)
    if args.json:
        write_json(args.json, result)
    return result


def print_budget(result: dict) -> None:
    summary = result["budget"]
    print(
        f"{result['settings']['dtype']} on {result['engine']}, core {result['settings']['core']}"
        f" ({result['settings']['cpu_model']}, {result['settings']['allocator']} malloc), "
        f"{result['runner']['steps']} offspring steps"
    )
    for name, ms in summary["ms_per_step"].items():
        without = summary["ratio_without"].get(name)
        tail = f"   ratio without it {without:.3f}" if without is not None else ""
        print(f"  {name:20s} {ms:7.3f} ms/step{tail}")
    print(
        f"  step {result['runner']['ms_per_step']:.3f} ms: ratio to the emulator "
        f"{summary['ratio_measured']:.3f}; floor (emulator + one read of the dense weights "
        f"at {summary['weights_read_ms']:.3f} ms) "
        f"{summary['ratio_floor']:.3f}"
    )
    print(
        f"  seeded reset {summary['seeded_reset_ms']:.1f} ms, unseeded "
        f"{summary['unseeded_reset_ms']:.1f} ms; whole forward alone "
        f"{summary['forward_ms']:.3f} ms"
    )


if __name__ == "__main__":
    main()
