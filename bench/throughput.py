"""Atari throughput and core-hours per billion frames, measured as a fleet host runs.

In one run, on the same cores (W = --workers, one pinned process per core):
  ceiling   the C++ vector env stepping Frostbite with random actions, W processes at once,
            before the first training run and after each: a run is divided by the mean of
            the two around it (the gymnasium path measured the same way, for reference);
  training  a real master here and W real worker processes, the paper's network; offspring-
            and elite-phase frames/s timed from the master's fleet, and the paper's mix
            (N=1000 x 1 episode + 10 candidates x 30 episodes) computed from the two;
  forward   a batch-1 forward pass with one weight set (cache-warm, idle) and cycling more
            distinct weight sets than the L3 holds (loaded), per inference dtype;
  floor     emulator ms per step + max(bytes / bandwidth, FLOPs / peak), both measured here;
  cost      core-hours (and dollars at --price) per 1B frames, idle and loaded.

    python -m bench.throughput --json bench/results/throughput-float32-<machine>-<date>.json
    python -m bench.throughput --inference-dtype float32 bfloat16 \
        --worker-arg=--atari-backend --worker-arg=vector \
        --json bench/results/throughput-float32-bfloat16-<machine>-<date>.json
    # a GPU host: one batched worker with 256 env slots against the 16-process ceiling
    python -m bench.throughput --workers 16 --batched-envs 256 --device cuda --population 1000 \
        --json bench/results/throughput-float32-batched-cuda-<machine>-<date>.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    REPO,
    in_child,
    json_text,
    l3_cache,
    machine,
    pin_to,
    process_memory,
    provenance,
    write_json,
)
from bench.gpu_sampling import GpuSampler
from bench.hostcost import bandwidth_and_peak, dtype_support, emulator, forward_costs
from neuro.allocator import worker_environment

# The paper's generation: N offspring of one episode each, then C elite candidates x E episodes.
PAPER_OFFSPRING = 1000
PAPER_ELITE_CANDIDATES = 10
PAPER_ELITE_EPISODES = 30
# Reference points for 1B frames: the Go/gRPC replication (~900 core-hours) and the paper (~720).
SEED_000_CORE_HOURS = 900.0
PAPER_CORE_HOURS = 720.0
# No Spot price is recorded in the project's reference notes, so the default is an assumption,
# labelled as one in the output; pass --price with the region's current figure.
ASSUMED_PRICE_PER_VCPU_HOUR = 0.02
FRAMES_PER_STEP = 4


def read_stats(stats_dir: Path) -> list[dict]:
    """Every worker's latest stats file."""
    stats = []
    for path in sorted(stats_dir.glob("worker-*.json")):
        with contextlib.suppress(OSError, json.JSONDecodeError):  # mid-replace: skip it
            stats.append(json.loads(path.read_text()))
    return stats


def master_overrides(args: argparse.Namespace, dtype: str) -> dict[str, Any]:
    """Run settings: the bench's own, then --master-arg flags parsed by the master's parser."""
    from master.cli import build_parser
    from master.config import GAConfig, RunConfig

    overrides: dict[str, Any] = {
        "population_size": args.population, "truncation": min(20, args.population),
        "noise_table_size": args.noise_table_size, "architecture": args.policy,
        "generations": args.generations, "seed": 0,
    }  # fmt: skip
    if args.elite_episodes:  # only the tiny test run shrinks the paper's 10 x 30
        overrides |= {"elite_candidates": 1, "elite_episodes": args.elite_episodes}
    if args.max_episode_steps:
        overrides["max_episode_steps"] = args.max_episode_steps
    fields = {f.name for f in dataclasses.fields(RunConfig)} | {
        f.name for f in dataclasses.fields(GAConfig)
    }
    if dtype != "float32" or "inference_dtype" in fields:
        if "inference_dtype" not in fields:
            raise SystemExit(f"--inference-dtype {dtype}: this master has no inference_dtype")
        overrides["inference_dtype"] = dtype
    parsed = vars(build_parser().parse_args(["--env", args.env, *args.master_arg]))
    overrides |= {k: v for k, v in parsed.items() if k in fields and v is not None}
    return overrides


async def end_to_end(args: argparse.Namespace, dtype: str, run_dir: Path, stats_dir: Path) -> dict:
    """A real master here, W real worker processes, each pinned to its own core."""
    from master.config import inspect_env_id, preset
    from master.run.start import start_master

    config = preset(inspect_env_id(args.env), **master_overrides(args, dtype))
    master = await start_master(config, run_dir, port=0, out=None)
    trainer, fleet = master.trainer, master.trainer.fleet
    phases: list[dict] = []
    first_lease: list[float] = []
    evaluate = fleet.evaluate

    async def timed_evaluate(*a: Any, **k: Any) -> Any:
        # Wraps the master's fleet: each call is one phase, so its frames and wall time are
        # the master's own, including the phase's tail when some workers are already idle.
        algorithm, start = trainer.algorithm, time.monotonic()
        phase, generation = algorithm.phase, algorithm.generation
        outcome = await evaluate(*a, **k)
        if not phases and first_lease:  # worker start-up (imports, noise table) is no phase
            start = max(start, first_lease[0])
        wall = time.monotonic() - start
        phases.append({"phase": phase, "generation": generation, "frames": outcome.frames,
                       "episodes": outcome.episodes, "wall_s": wall})  # fmt: skip
        return outcome

    fleet.evaluate = timed_evaluate
    training = asyncio.ensure_future(trainer.run())
    workers = []
    # This checkout first, then whatever the caller's PYTHONPATH holds (packages installed
    # outside the interpreter's site-packages, e.g. with pip --target).
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath}
    if args.batched_envs:
        # One batched worker for the whole host (the GPU worker's shape), not pinned: its
        # vector env's threads step the emulators on every core.
        command = [sys.executable, "-m", "worker", "--master", f"127.0.0.1:{master.port}",
                   "--device", args.device, "--envs", str(args.batched_envs),
                   "--worker-id", "bench-batched", "--stats-file",
                   str(stats_dir / "worker-0.json"), *args.worker_arg]  # fmt: skip
        workers.append(subprocess.Popen(command, env=env, cwd=REPO))
    for index in range(0 if args.batched_envs else args.workers):
        command = [sys.executable, "-m", "worker", "--master", f"127.0.0.1:{master.port}",
                   "--slots", str(args.slots), "--worker-id", f"bench-{index}",
                   # Pinned per-core workers: on a GPU host, the default device (auto) would
                   # make each one a batched CUDA worker instead.
                   "--device", "cpu",
                   "--stats-file", str(stats_dir / f"worker-{index}.json"),
                   *args.worker_arg]  # fmt: skip
        workers.append(subprocess.Popen(command, env=env, cwd=REPO,
                                        preexec_fn=lambda i=index: pin_to(i)))  # fmt: skip
    gpu = GpuSampler() if args.device == "cuda" or args.sample_gpu else None
    try:
        deadline = time.monotonic() + args.timeout
        while fleet.counters().leased == 0 and time.monotonic() < deadline:
            if training.done():
                training.result()  # raises what stopped the master
                break
            stop_if_all_exited(workers, "before its first lease")
            await asyncio.sleep(0.01)
        if fleet.counters().leased == 0 and not training.done():
            raise SystemExit(f"no worker leased a task within --timeout {args.timeout} s")
        first_lease.append(time.monotonic())
        t0, cpu0 = time.monotonic(), time.process_time()
        before = {s["worker_id"]: s for s in read_stats(stats_dir)}
        if gpu is not None:
            gpu.start()
        # --training-seconds: the run is measured over that window if it has not ended by then.
        window_end = t0 + args.training_seconds if args.training_seconds else math.inf
        while not training.done() and time.monotonic() < window_end:
            if time.monotonic() > deadline:
                raise SystemExit(f"training did not finish within --timeout {args.timeout} s")
            stop_if_all_exited(workers, "during training")
            await asyncio.sleep(0.05)
        complete = training.done()
        if complete:
            training.result()
        wall, master_cpu = time.monotonic() - t0, time.process_time() - cpu0
        # Frames the master has recorded: whole phases, and this phase's finished tasks.
        recorded = trainer.frames + (0 if complete else current_phase_frames(fleet))
        gpu_utilisation = gpu.stop() if gpu is not None else None
        memory_mib = {"master": process_memory(os.getpid())}
        for index, w in enumerate(workers):
            memory_mib[f"worker-{index}"] = process_memory(w.pid)
    finally:
        if gpu is not None:
            gpu.stop()
        stopped = time.monotonic()
        for w in workers:
            w.terminate()  # each writes its final stats on the way out
        for w in workers:
            try:
                w.wait(60)
            except subprocess.TimeoutExpired:  # a worker that hangs on its way out
                w.kill()
                w.wait(10)
        training.cancel()
        await master.stop(0)
    zero = {"steps": 0, "time": 0.0, "forward_calls": 0, "episodes": 0,
            **{f"{k}_s": 0.0 for k in ("env", "forward", "decode", "wait", "reset")}}  # fmt: skip
    deltas, allocators, engines = [], set(), set()
    for stats in read_stats(stats_dir):
        allocators.add(stats.get("allocator", "unknown"))
        engines.add(stats.get("inference_engine", "torch"))
        start = before.get(stats["worker_id"], zero)
        deltas.append({k: stats.get(k, 0) - start.get(k, 0) for k in zero})
    # Every step the workers played, finished episodes or not (their final stats, written as
    # they stopped): what a window that ends mid-generation is measured by.
    played = sum(d["steps"] for d in deltas) * FRAMES_PER_STEP
    if recorded == 0 and played == 0:
        raise SystemExit("training played no frame: every task failed (see the workers' log)")
    if complete:
        rate, source = recorded / wall, "master"
    else:
        rate, source = played / (stopped - t0), "workers"
    records = trainer.records
    per_phase = phase_rates(phases, args.workers)
    parts = breakdown(deltas, wall)
    return {
        "inference_dtype": config_value(config, "inference_dtype", "float32"),
        "worker_args": list(args.worker_arg),
        "allocator": sorted(allocators),
        "inference_engine": sorted(engines),
        "wall_s": wall,
        "workers": args.workers,
        "generations": len(records),
        "frames": recorded,
        "evaluations": trainer.evaluations,
        "complete": complete,
        "window_s": args.training_seconds or None,
        "played_frames": played,
        "frames_per_s": rate,
        "frames_per_s_source": source,
        "frames_per_s_per_core": rate / args.workers,
        "phases": per_phase,
        "phase_log": phases,
        "elite_samples_per_forward": elite_batching(per_phase, parts),
        "master_cpu_share": master_cpu / wall,
        "elite_score": records[-1].elite_score if records else None,
        "memory_mib": memory_mib,
        "breakdown": parts,
        "batched_envs": args.batched_envs,
        "device": args.device,
        "gpu_utilisation_percent": gpu_utilisation,
        "gpu": gpu.summary() if gpu is not None else None,
        "hours_per_1b_frames_on_this_host": 1e9 / rate / 3600,
    }


def current_phase_frames(fleet: Any) -> int:
    """Frames of the tasks the master has recorded in the phase now running."""
    return sum(frames for _, frames in fleet.recorded().values())


def stop_if_all_exited(workers: list[subprocess.Popen], when: str) -> None:
    """SystemExit naming their exit codes once every worker process has exited: the master
    would otherwise wait for them until --timeout."""
    if all(w.poll() is not None for w in workers):
        codes = [w.returncode for w in workers]
        raise SystemExit(f"every worker exited {when} (exit codes {codes})")


def config_value(config: Any, name: str, default: Any) -> Any:
    """A RunConfig setting, or its default where this master has no such field."""
    return getattr(config, name, default)


def phase_rates(phases: list[dict], workers: int) -> dict[str, dict]:
    """Frames, wall time, frames/s per core and mean episode length, per phase kind."""
    rates = {}
    for kind in sorted({p["phase"] for p in phases}):
        mine = [p for p in phases if p["phase"] == kind]
        frames, episodes = sum(p["frames"] for p in mine), sum(p["episodes"] for p in mine)
        wall = sum(p["wall_s"] for p in mine)
        per_core = frames / wall / workers if wall > 0 else 0.0
        rates[kind] = {
            "phases": len(mine), "frames": frames, "episodes": episodes, "wall_s": wall,
            "frames_per_s_per_core": per_core,
            "ms_per_step_per_core": FRAMES_PER_STEP / per_core * 1e3 if per_core else None,
            "mean_episode_steps": frames / FRAMES_PER_STEP / episodes if episodes else None,
        }  # fmt: skip
    return rates


def elite_batching(phases: dict[str, dict], parts: dict) -> float:
    """Samples per forward in the elite phase: offspring steps each take one forward pass."""
    offspring = phases.get("offspring", {}).get("frames", 0) / FRAMES_PER_STEP
    elite = phases.get("elite", {}).get("frames", 0) / FRAMES_PER_STEP
    elite_forwards = parts["forward_calls"] - offspring
    return elite / elite_forwards if elite > 0 and elite_forwards > 0 else 1.0


def breakdown(deltas: list[dict], wall: float) -> dict:
    """Per agent step, all workers together, over the measured generations."""
    steps = sum(d["steps"] for d in deltas) or 1
    wall = wall * len(deltas) or 1.0
    # reset: a task's seeded first reset (0 from a worker older than that timer)
    parts = {k: sum(d[f"{k}_s"] for d in deltas)
             for k in ("env", "forward", "decode", "wait", "reset")}  # fmt: skip
    parts["other"] = max(0.0, wall - sum(parts.values()))
    forward_calls = sum(d["forward_calls"] for d in deltas)
    return {
        "agent_steps": steps,
        "forward_calls": forward_calls,
        "ms_per_step": {k: v / steps * 1e3 for k, v in parts.items()},
        "share": {k: v / wall for k, v in parts.items()},
        "samples_per_forward": steps / max(1, forward_calls),
        "episodes": sum(d["episodes"] for d in deltas),
    }


def paper_mix(phases: dict[str, dict], forward: dict | None, elite_batch: float) -> dict | None:
    """The paper's generation from the two phase rates, idle and with the loaded forward.

    Frame shares use the measured mean episode length of each phase:
      F_o = 1000 x L_o x 4,  F_e = 10 x 30 x L_e x 4,  s = F / (F_o + F_e)
      r_mix = 1 / (s_o / r_o + s_e / r_e)   (time adds, so rates combine harmonically)
    Loaded: each phase's step time t = 4 / r (per core) grows by the forward slowdown
      t' = t + (loaded_ms - idle_ms) / samples per forward  (1 for offspring, measured for elite)
    """
    offspring, elite = phases.get("offspring"), phases.get("elite")
    if not offspring or not elite or not offspring["mean_episode_steps"]:
        return None
    if not elite["mean_episode_steps"] or not elite["frames_per_s_per_core"]:
        return None
    f_o = PAPER_OFFSPRING * offspring["mean_episode_steps"] * FRAMES_PER_STEP
    elite_episodes = PAPER_ELITE_CANDIDATES * PAPER_ELITE_EPISODES
    f_e = elite_episodes * elite["mean_episode_steps"] * FRAMES_PER_STEP
    s_o, s_e = f_o / (f_o + f_e), f_e / (f_o + f_e)
    r_o, r_e = offspring["frames_per_s_per_core"], elite["frames_per_s_per_core"]
    idle = 1 / (s_o / r_o + s_e / r_e)
    result = {
        "offspring_episode_steps": offspring["mean_episode_steps"],
        "elite_episode_steps": elite["mean_episode_steps"],
        "offspring_frame_share": s_o,
        "elite_frame_share": s_e,
        "frames_per_generation": f_o + f_e,
        "idle_frames_per_s_per_core": idle,
        "idle_ms_per_step": FRAMES_PER_STEP / idle * 1e3,
    }
    if forward is not None:
        # A loaded pass measured faster than an idle one is noise: the model adds nothing then.
        extra = max(0.0, forward["loaded_ms"] - forward["idle_ms"])
        t_o = FRAMES_PER_STEP / r_o * 1e3 + extra
        t_e = FRAMES_PER_STEP / r_e * 1e3 + extra / elite_batch
        r_o2, r_e2 = FRAMES_PER_STEP / t_o * 1e3, FRAMES_PER_STEP / t_e * 1e3
        loaded = 1 / (s_o / r_o2 + s_e / r_e2)
        result |= {"forward_extra_ms": extra, "elite_samples_per_forward": elite_batch,
                   "forward_measured_extra_ms": forward["loaded_ms"] - forward["idle_ms"],
                   "loaded_frames_per_s_per_core": loaded,
                   "loaded_ms_per_step": FRAMES_PER_STEP / loaded * 1e3}  # fmt: skip
    return result


def core_hours(mix: dict | None, price: float) -> dict | None:
    """Core-hours and dollars per 1B frames, idle and loaded, next to the reference runs."""
    if mix is None:
        return None
    result: dict[str, Any] = {}
    for mode in ("idle", "loaded"):
        rate = mix.get(f"{mode}_frames_per_s_per_core")
        if rate:
            hours = 1e9 / rate / 3600
            result[mode] = {"frames_per_s_per_core": rate, "core_hours_per_1b_frames": hours,
                            "usd_per_1b_frames": hours * price}  # fmt: skip
    result["vs_seed_000"] = {m: v["core_hours_per_1b_frames"] / SEED_000_CORE_HOURS
                             for m, v in result.items() if isinstance(v, dict)}  # fmt: skip
    result["vs_paper"] = {m: v["core_hours_per_1b_frames"] / PAPER_CORE_HOURS
                          for m, v in result.items() if m in ("idle", "loaded")}  # fmt: skip
    return result


def floor(ceiling: dict, host: dict, forward: dict, training: dict) -> dict:
    """Emulator ms per step (C++) + max(bytes / bandwidth, FLOPs / peak), vs the measured step.

    Loaded (every pass's weights from memory): the bytes at one core's read bandwidth, against
    the offspring step plus the loaded pass's measured extra (as the paper mix adds it)."""
    peaks = host["peak_flop_per_s"]
    memory_ms = forward["bytes_per_forward"] / host["bytes_per_s"] * 1e3
    # Each layer at the peak of the dtype it computes in (int8: dense layers int8, convolutions
    # bfloat16), so the compute floor is a sum of per-dtype times. No dtype's floor is below
    # float32's: a CPU without bfloat16 arithmetic (AVX2) widens bfloat16 exactly to float32,
    # where torch's own bfloat16 matmul crawls (~0.3 GFLOP/s there).
    by_dtype = forward.get("flops_by_dtype") or {forward["dtype"]: forward["flops_per_forward"]}
    compute_ms = 0.0
    for dtype, flops in by_dtype.items():
        peak = max(peaks.get(dtype) or 0.0, peaks.get("float32") or 0.0)
        compute_ms += flops / peak * 1e3 if peak else 0.0
    forward_floor = max(memory_ms, compute_ms)
    step_floor = ceiling["ms_per_env_step"] + forward_floor
    offspring = training["phases"].get("offspring", {}).get("ms_per_step_per_core")
    read = host.get("read_bytes_per_s")  # absent from results older than the read figure
    loaded_memory_ms = forward["bytes_per_forward"] / read * 1e3 if read else None
    loaded_step_floor = loaded_offspring = None
    if loaded_memory_ms is not None:
        loaded_step_floor = ceiling["ms_per_env_step"] + max(loaded_memory_ms, compute_ms)
    if offspring:
        loaded_offspring = offspring + max(0.0, forward["loaded_ms"] - forward["idle_ms"])
    return {
        "emulator_ms_per_step": ceiling["ms_per_env_step"],
        "forward_memory_ms": memory_ms,
        "forward_compute_ms": compute_ms,
        "forward_floor_ms": forward_floor,
        "forward_bound": "memory" if memory_ms >= compute_ms else "compute",
        "step_floor_ms": step_floor,
        "offspring_measured_ms_per_step": offspring,
        "floor_over_offspring_measured": step_floor / offspring if offspring else None,
        "idle_forward_over_floor": forward["idle_ms"] / forward_floor,
        "loaded_forward_over_floor": forward["loaded_ms"] / forward_floor,
        "forward_loaded_memory_ms": loaded_memory_ms,
        "loaded_step_floor_ms": loaded_step_floor,
        "offspring_loaded_ms_per_step": loaded_offspring,
        "loaded_floor_over_offspring_loaded": (
            loaded_step_floor / loaded_offspring if loaded_step_floor and loaded_offspring else None
        ),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The bench's options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Frostbite-v4")
    parser.add_argument("--generations", type=int, default=1, help="generations to measure")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--emulator-seconds", type=float, default=20.0)
    parser.add_argument("--vector-envs", type=int, default=1,
                        help="num_envs of each ceiling process's vector env")  # fmt: skip
    parser.add_argument("--population", type=int, default=60)
    parser.add_argument("--policy", default="deepga", choices=("deepga", "nature"))
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--noise-table-size", type=int, default=2**26)
    parser.add_argument("--inference-dtype", nargs="+", default=["float32"],
                        help="one training run and one forward benchmark per dtype")  # fmt: skip
    parser.add_argument("--worker-arg", action="append", default=[],
                        help="extra argument for every worker process (repeatable), "
                        "e.g. --worker-arg=--atari-backend --worker-arg=vector")  # fmt: skip
    parser.add_argument("--master-arg", action="append", default=[],
                        help="extra neuro-master flag (repeatable)")  # fmt: skip
    parser.add_argument("--loaded-sets", type=int, default=8,
                        help="distinct weight sets cycled (raised to cover 4x the L3)")  # fmt: skip
    parser.add_argument("--forward-repeats", type=int, default=200)
    parser.add_argument("--bandwidth-mb", type=int, default=512)
    parser.add_argument("--matrix", type=int, default=2048, help="torch.mm size for peak")
    parser.add_argument("--price", type=float, default=None,
                        help=f"USD per vCPU-hour (default {ASSUMED_PRICE_PER_VCPU_HOUR}, "
                        "an assumption)")  # fmt: skip
    parser.add_argument("--batched-envs", type=int, default=0,
                        help="train with ONE batched worker of this many env slots instead of "
                        "--workers pinned ones (the GPU worker's shape); the ceiling still "
                        "runs --workers processes")  # fmt: skip
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="the batched worker's device (with --batched-envs)")  # fmt: skip
    parser.add_argument("--training-seconds", type=float, default=0.0,
                        help="measure training over this window from the first lease if the "
                        "generations have not ended by then (0: until they end)")  # fmt: skip
    parser.add_argument("--sample-gpu", action="store_true",
                        help="sample GPU utilisation with --device cpu too")  # fmt: skip
    parser.add_argument("--skip-gym", action="store_true", help="no gymnasium reference")
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--elite-episodes", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--max-episode-steps", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    """Runs every measurement, prints one JSON document, and writes it with --json."""
    args = parse_args(argv)
    if args.batched_envs and set(args.inference_dtype) != {"float32"}:
        raise SystemExit("--batched-envs: the batched worker runs float32 only")
    if args.batched_envs > args.population:
        # Measured so on a GPU host: the C++ vector env steps its idle sub-envs too, so a
        # generation smaller than the slots times mostly idle emulators, not the worker.
        print(f"note: --population {args.population} < --batched-envs {args.batched_envs}: "
              "most env slots idle through the offspring phase, and idle sub-envs are still "
              "stepped", file=sys.stderr)  # fmt: skip
    # Every process the bench starts (the ceiling's, the forward pass's, the workers) runs
    # with the allocator a master's local workers get (neuro.allocator); LD_PRELOAD= (set,
    # empty) measures them all with the system's.
    os.environ.update(worker_environment(os.environ))
    support = in_child(dtype_support)
    for dtype in args.inference_dtype:
        if dtype not in support["dtypes"]:
            raise SystemExit(f"inference dtype {dtype!r}: this worker supports {support['dtypes']}")
    cache = l3_cache()
    ceiling = emulator("vector", args.env, args.workers, args.emulator_seconds, args.vector_envs)
    gym_path = None
    if not args.skip_gym:
        gym_path = emulator("gym", args.env, args.workers, args.emulator_seconds, 1)
    # int8 runs its convolutions in bfloat16: its floor needs that peak too. int8-static's
    # floor is the int8 peak (every layer but the output layer in integers).
    peak_dtypes = {"float32", *args.inference_dtype} - {"int8-static"}
    if "int8" in args.inference_dtype:
        peak_dtypes.add("bfloat16")
    if "int8-static" in args.inference_dtype:
        peak_dtypes.add("int8")
    host = bandwidth_and_peak(args.bandwidth_mb, args.matrix, sorted(peak_dtypes))
    price = ASSUMED_PRICE_PER_VCPU_HOUR if args.price is None else args.price
    runs = {}
    ceilings = [ceiling]
    for dtype in args.inference_dtype:
        forward = forward_costs(args.policy, dtype, support["keyword"], args.loaded_sets,
                                cache["bytes"], args.forward_repeats)  # fmt: skip
        with tempfile.TemporaryDirectory() as tmp:
            training = asyncio.run(end_to_end(args, dtype, Path(tmp) / "run", Path(tmp)))
        ceilings.append(
            emulator("vector", args.env, args.workers, args.emulator_seconds, args.vector_envs)
        )
        bracket = bracketing(ceilings[-2], ceilings[-1])
        mix = paper_mix(training["phases"], forward, training["elite_samples_per_forward"])
        rate = bracket["frames_per_s_per_core"]
        ratios = {k: v["frames_per_s_per_core"] / rate for k, v in training["phases"].items()}
        ratios["run"] = training["frames_per_s_per_core"] / rate
        if mix is not None:
            ratios["paper_mix_idle"] = mix["idle_frames_per_s_per_core"] / rate
            ratios["paper_mix_loaded"] = mix["loaded_frames_per_s_per_core"] / rate
        runs[dtype] = {
            "ceiling": bracket,
            "forward": forward,
            "training": training,
            "paper_mix": mix,
            "ratio_to_ceiling": ratios,
            "core_hours": core_hours(mix, price),
            "floor": floor(bracket, host, forward, training),
        }
    result = {
        **provenance(__file__, argv),
        "machine": {**machine(), "l3": cache},
        "settings": vars(args),
        "dtype_support": support,
        "price": {"usd_per_vcpu_hour": price,
                  "source": "--price" if args.price is not None else "assumption, not a quote"},
        "reference_core_hours_per_1b_frames": {"seed_000": SEED_000_CORE_HOURS,
                                               "paper": PAPER_CORE_HOURS},
        "ceiling": ceiling,
        "ceiling_after_each_run": ceilings[1:],
        "gym_reference": gym_path,
        "host": host,
        "runs": runs,
    }  # fmt: skip
    print(json_text(result))
    if args.json:
        write_json(args.json, result)
    return result


def bracketing(before: dict, after: dict) -> dict:
    """The ceiling a training run is divided by: the mean of the C++ ceiling measured just
    before and just after it, so a shared host that speeds up or slows down during the run
    moves both sides of the ratio (`spread` says by how much the two differed)."""
    rates = [before["frames_per_s_per_core"], after["frames_per_s_per_core"]]
    steps = [before["ms_per_env_step"], after["ms_per_env_step"]]
    mean = sum(rates) / 2
    return {
        "frames_per_s_per_core_before": rates[0],
        "frames_per_s_per_core_after": rates[1],
        "frames_per_s_per_core": mean,
        "ms_per_env_step": sum(steps) / 2,
        "spread": abs(rates[1] - rates[0]) / mean if mean else None,
    }


if __name__ == "__main__":
    main()
