"""Atari throughput, measured in one run on the same cores.

(a) emulator-only frames/s per core (Frostbite, the paper's preprocessing, random actions);
(b) end-to-end training frames/s per core through a real master and real worker processes
    (Frostbite, default GA settings except a small population, the paper's network);
(c) the ratio b/a;
(d) where a worker's time goes: env step, policy forward, genome decode, waiting on the master;
plus the per-layer cost of one forward pass, the floor the network sets.

    python bench/throughput.py --json bench/results/throughput.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def pin_to(core: int) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core % os.cpu_count()})


def _emulator_child(env_id: str, seconds: float, queue: mp.Queue) -> None:
    pin_to(0)
    import numpy as np

    from neuro.envs.make import make_env

    handle = make_env(env_id)
    rng = np.random.default_rng(0)
    n_actions = handle.env.action_space.n
    handle.env.reset(seed=0)
    steps = frames_done = 0
    episode_steps = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        _, _, terminated, truncated, _ = handle.env.step(int(rng.integers(n_actions)))
        steps += 1
        episode_steps += 1
        if terminated or truncated:
            frames_done += handle.frames_used(episode_steps)
            episode_steps = 0
            handle.env.reset()
    frames_done += handle.frames_used(episode_steps)
    wall = time.perf_counter() - started
    queue.put({"frames": frames_done, "steps": steps, "wall_s": wall,
               "frames_per_s": frames_done / wall, "ms_per_step": wall / steps * 1e3})  # fmt: skip


def emulator_only(env_id: str, seconds: float) -> dict:
    """(a): one process on one core stepping the env with random actions."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_emulator_child, args=(env_id, seconds, queue))
    child.start()
    result = queue.get(timeout=seconds + 120)
    child.join()
    return result


def forward_layers(architecture: str, repeats: int = 200) -> dict:
    """Per-layer cost of one batch-1 forward pass on one thread: the floor of a step."""
    import gymnasium as gym
    import numpy as np
    import torch
    import torch.nn.functional as F

    from worker.policies import build_policy

    torch.set_num_threads(1)
    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    policy = build_policy(architecture, space, gym.spaces.Discrete(18))
    module = policy.module
    x = torch.from_numpy(np.random.default_rng(0).integers(0, 255, (1, 4, 84, 84), dtype=np.uint8))
    timings = {name: 0.0 for name in ("conv1", "conv2", "conv3", "fc", "out")}
    with torch.inference_mode():
        for repeat in range(repeats + 20):
            h = x.to(torch.float32) / 255.0
            for name, conv, pad in zip(("conv1", "conv2", "conv3"),
                                       (module.conv1, module.conv2, module.conv3),
                                       module.pads, strict=True):  # fmt: skip
                t = time.perf_counter()
                h = F.relu(conv(F.pad(h, pad) if any(pad) else h))
                if repeat >= 20:
                    timings[name] += time.perf_counter() - t
            t = time.perf_counter()
            h = F.relu(module.fc(h.flatten(1)))
            t2 = time.perf_counter()
            module.out(h)
            if repeat >= 20:
                timings["fc"] += t2 - t
                timings["out"] += time.perf_counter() - t2
    per_layer = {k: v / repeats * 1e3 for k, v in timings.items()}
    batch = {}
    for size in (1, 8):
        obs = np.random.default_rng(1).integers(0, 255, (size, 4, 84, 84), dtype=np.uint8)
        for _ in range(10):
            policy.act_batch(obs)
        t = time.perf_counter()
        for _ in range(repeats // 4):
            policy.act_batch(obs)
        elapsed = time.perf_counter() - t
        batch[f"batch{size}_ms_per_sample"] = elapsed / (repeats // 4) / size * 1e3
    return {"params": policy.num_params, "layer_ms": per_layer,
            "forward_ms": sum(per_layer.values()), **batch}  # fmt: skip


def memory(pid: int) -> dict[str, float]:
    """RSS and PSS in MiB: PSS splits shared pages (the noise table) among their users."""
    figures = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("Rss", "Pss", "Shared_Clean", "Private_Dirty"):
                figures[key.lower() + "_mib"] = int(value.split()[0]) / 1024
    return figures


def in_child(fn, *args):
    """Runs fn in a fresh process, so this one (the master's) never imports torch."""
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(fn, args)


def read_stats(stats_dir: Path) -> list[dict]:
    stats = []
    for path in sorted(stats_dir.glob("worker-*.json")):
        with contextlib.suppress(OSError, json.JSONDecodeError):  # mid-replace: skip it
            stats.append(json.loads(path.read_text()))
    return stats


async def end_to_end(args: argparse.Namespace, run_dir: Path, stats_dir: Path) -> dict:
    """(b): a real master here, W real worker processes, each pinned to its own core."""
    import subprocess

    from master.config import inspect_env_id, preset
    from master.run.start import start_master

    overrides = {"population_size": args.population, "truncation": min(20, args.population),
                 "noise_table_size": args.noise_table_size, "architecture": args.policy,
                 "generations": args.generations, "seed": 0}  # fmt: skip
    if args.elite_episodes:  # only the tiny test run shrinks the paper's 10 x 30
        overrides |= {"elite_candidates": 1, "elite_episodes": args.elite_episodes}
    if args.max_episode_steps:
        overrides["max_episode_steps"] = args.max_episode_steps
    config = preset(inspect_env_id(args.env), **overrides)
    master = await start_master(config, run_dir, port=0, out=None)
    fleet = master.trainer.fleet
    training = asyncio.ensure_future(master.trainer.run())
    workers = []
    for index in range(args.workers):
        command = [sys.executable, "-m", "worker", "--master", f"127.0.0.1:{master.port}",
                   "--slots", str(args.slots), "--worker-id", f"bench-{index}",
                   "--stats-file", str(stats_dir / f"worker-{index}.json")]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        workers.append(subprocess.Popen(command, env=env, cwd=REPO,
                                        preexec_fn=lambda i=index: pin_to(i)))  # fmt: skip
    try:
        # The clock starts at the first lease: worker start-up (imports, building the noise
        # table) is not training throughput. It stops when the last generation ends, so the
        # offspring and elite phases are in their real proportions.
        deadline = time.monotonic() + args.timeout
        while fleet.counters().leased == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        t0, cpu0 = time.monotonic(), time.process_time()
        before = {s["worker_id"]: s for s in read_stats(stats_dir)}
        await asyncio.wait_for(training, max(1.0, deadline - time.monotonic()))
        wall, master_cpu = time.monotonic() - t0, time.process_time() - cpu0
        memory_mib = {"master": memory(os.getpid())}
        for index, w in enumerate(workers):
            memory_mib[f"worker-{index}"] = memory(w.pid)
    finally:
        for w in workers:
            w.terminate()  # each writes its final stats on the way out
        for w in workers:
            w.wait(60)
        training.cancel()
        await master.stop(0)
    zero = {"steps": 0, "time": 0.0, "forward_calls": 0, "episodes": 0,
            **{f"{k}_s": 0.0 for k in ("env", "forward", "decode", "wait")}}  # fmt: skip
    deltas = []
    for stats in read_stats(stats_dir):
        start = before.get(stats["worker_id"], zero)
        deltas.append({k: stats[k] - start.get(k, 0) for k in zero})
    frames = master.trainer.frames
    records = master.trainer.records
    return {
        "wall_s": wall,
        "workers": args.workers,
        "generations": len(records),
        "frames": frames,
        "evaluations": master.trainer.evaluations,
        "frames_per_s": frames / wall,
        "frames_per_s_per_core": frames / wall / args.workers,
        "master_cpu_share": master_cpu / wall,
        "elite_score": records[-1].elite_score if records else None,
        "memory_mib": memory_mib,
        "breakdown": breakdown(deltas, wall),
    }


def breakdown(deltas: list[dict], wall: float) -> dict:
    """(d): per agent step, all workers together, over the measured generations."""
    steps = sum(d["steps"] for d in deltas) or 1
    wall = wall * len(deltas) or 1.0
    parts = {k: sum(d[f"{k}_s"] for d in deltas) for k in ("env", "forward", "decode", "wait")}
    parts["other"] = max(0.0, wall - sum(parts.values()))
    return {
        "agent_steps": steps,
        "ms_per_step": {k: v / steps * 1e3 for k, v in parts.items()},
        "share": {k: v / wall for k, v in parts.items()},
        "samples_per_forward": steps / max(1, sum(d["forward_calls"] for d in deltas)),
        "episodes": sum(d["episodes"] for d in deltas),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Frostbite-v4")
    parser.add_argument("--generations", type=int, default=1, help="generations to measure")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--emulator-seconds", type=float, default=20.0)
    parser.add_argument("--population", type=int, default=20)
    parser.add_argument("--policy", default="deepga", choices=("deepga", "nature"))
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--noise-table-size", type=int, default=2**26)
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--elite-episodes", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--max-episode-steps", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    emulator = emulator_only(args.env, args.emulator_seconds)
    print(f"(a) emulator only: {emulator['frames_per_s']:,.0f} frames/s per core "
          f"({emulator['ms_per_step']:.3f} ms per 4-frame step)")  # fmt: skip
    layers = {arch: in_child(forward_layers, arch) for arch in ("deepga", "nature")}
    for arch, figures in layers.items():
        cells = ", ".join(f"{k} {v:.3f}" for k, v in figures["layer_ms"].items())
        print(f"    forward {arch} ({figures['params']:,} params), ms: {cells}; "
              f"batch 8 same weights {figures['batch8_ms_per_sample']:.3f} ms/sample")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        training = asyncio.run(end_to_end(args, Path(tmp) / "run", Path(tmp)))
    ratio = training["frames_per_s_per_core"] / emulator["frames_per_s"]
    print(
        f"(b) training: {training['frames_per_s_per_core']:,.0f} frames/s per core "
        f"({args.workers} workers x {args.slots} slots, {args.policy}, N={args.population})"
    )
    print(f"(c) ratio b/a: {ratio:.3f}")
    parts = training["breakdown"]
    cells = ", ".join(f"{k} {v:.3f} ms ({parts['share'][k]:.0%})"
                      for k, v in parts["ms_per_step"].items())  # fmt: skip
    print(f"(d) per agent step: {cells}")
    mem = training["memory_mib"]
    cells = ", ".join(f"{k} RSS {v['rss_mib']:.0f} PSS {v['pss_mib']:.0f}" for k, v in mem.items())
    print(f"    memory (MiB; PSS shares the mapped noise table among its users): {cells}")
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "settings": vars(args),
        "emulator": emulator,
        "forward": layers,
        "training": training,
        "ratio": ratio,
    }  # fmt: skip
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
