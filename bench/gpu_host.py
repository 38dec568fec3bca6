"""One command to measure a GPU host: emulator ceiling, training frames/s, their ratio, GPU use.

In one run, with bench/throughput.py's own machinery:
  host      torch, CUDA, cuDNN, the GPU's name and memory, checked in a child process (this
            process is the master's and never imports torch); --device cuda without a CUDA
            device stops here;
  ceiling   ale-py's C++ vector env stepping Frostbite with random actions under the paper's
            protocol, one pinned process per core (--workers), all at once, just before and
            just after training: training is divided by the mean of the two;
  training  a real master here and ONE batched worker (--device, --envs) on the paper's
            Frostbite generation: 1000 offspring x 1 episode, then 10 candidates x 30 episodes,
            the Deep GA network, timed from the first lease. A generation still running after
            --training-seconds is measured over that window (the frames the worker played,
            finished episodes or not);
  GPU       utilisation and memory once a second through training (nvidia-smi, else
            torch.cuda.utilization(), else null and why).
Prints the JSON document (also written to --json) and then a short summary. Every stage is
bounded in time; a stage that fails (a dead worker, a master error, a timeout) ends the run
with exit code 1 and the JSON naming the stage and the reason, with what was measured before.

    # a 16-core host with one H100: about 5 minutes
    python -m bench.gpu_host --json bench/results/gpu-host-<machine>-<date>.json
    # tiny, on a CPU (the tests run this)
    python -m bench.gpu_host --device cpu --envs 4 --population 6 --emulator-seconds 0.5 ...
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import throughput
from bench.common import in_child, json_text, machine, provenance, write_json
from bench.hostcost import emulator
from neuro.allocator import worker_environment
from worker.fanout import ENVS_PER_CPU

TARGET_RATIO = 0.85
"""The issue's bar: training frames/s at least this share of the same host's ceiling."""
PREFLIGHT_TIMEOUT_S = 180.0


def host_info(device: str) -> dict[str, Any]:
    """What the worker will run on (in a child process); "error" where it cannot run there."""
    import importlib.metadata

    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
                            "cuda_available": torch.cuda.is_available(),
                            "gpu_count": torch.cuda.device_count()}  # fmt: skip
    for package in ("ale-py", "gymnasium", "numpy", "grpcio", "onnxruntime"):
        try:
            info[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            info[package] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info |= {"device_name": props.name, "device_memory_gib": props.total_memory / 2**30,
                 "capability": f"{props.major}.{props.minor}",
                 "cudnn": torch.backends.cudnn.version()}  # fmt: skip
    if device.startswith("cuda") and not torch.cuda.is_available():
        info["error"] = (f"--device {device}: torch {torch.__version__} (built with CUDA "
                         f"{torch.version.cuda}) sees no CUDA device here")  # fmt: skip
    if info["ale-py"] is None:
        info["error"] = "ale-py is not installed: the ceiling and Atari training need it"
    return info


def driver_version() -> str | None:
    """The NVIDIA driver's version from nvidia-smi, where there is one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else None


def throughput_args(args: argparse.Namespace) -> argparse.Namespace:
    """bench/throughput.py's settings for this run: its defaults, and this bench's choices."""
    argv = ["--env", args.env, "--population", str(args.population),
            "--generations", str(args.generations), "--workers", str(args.workers),
            "--batched-envs", str(args.envs), "--device", args.device,
            "--noise-table-size", str(args.noise_table_size), "--timeout", str(args.timeout),
            "--training-seconds", str(args.training_seconds), "--sample-gpu",
            "--elite-episodes", str(args.elite_episodes),
            "--max-episode-steps", str(args.max_episode_steps),
            # The worker's INFO lines would bury this bench's output; warnings still show.
            "--worker-arg=--log-level", "--worker-arg=WARNING"]  # fmt: skip
    argv += [f"--worker-arg={a}" for a in args.worker_arg]
    argv += [f"--master-arg={a}" for a in args.master_arg]
    return throughput.parse_args(argv)


def figures(ceilings: list[dict], training: dict | None) -> dict[str, Any]:
    """The headline numbers from the stages that ran."""
    out: dict[str, Any] = {}
    if ceilings:
        if len(ceilings) == 2:
            bracket = throughput.bracketing(*ceilings)
        else:
            bracket = {"frames_per_s_per_core": ceilings[0]["frames_per_s_per_core"]}
        out["ceiling_frames_per_s"] = bracket["frames_per_s_per_core"] * ceilings[0]["processes"]
        out["ceiling_processes"] = ceilings[0]["processes"]
        out["ceiling_measured"] = "before and after training" if len(ceilings) == 2 else "before"
    if training is not None:
        rate = training["frames_per_s"]
        out |= {"training_frames_per_s": rate, "hours_per_1b_frames": 1e9 / rate / 3600,
                "complete_generation": training["complete"]}  # fmt: skip
        gpu = training.get("gpu") or {}
        out |= {"gpu_utilisation_percent": gpu.get("utilisation_percent_mean"),
                "gpu_memory_used_mib": gpu.get("memory_used_mib_max"),
                "gpu_utilisation_reason": gpu.get("reason")}  # fmt: skip
        if "ceiling_frames_per_s" in out:
            out["ratio"] = rate / out["ceiling_frames_per_s"]
            out["target_ratio"] = TARGET_RATIO
            out["meets_target"] = out["ratio"] >= TARGET_RATIO
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every stage in turn; the first that fails is recorded and ends the run."""
    started = time.monotonic()
    # The ceiling's processes and the worker run with the allocator a master's local workers
    # get (neuro.allocator), as in bench/throughput.py.
    os.environ.update(worker_environment(os.environ))
    result: dict[str, Any] = {
        "host": {**machine(), "driver": driver_version()},
        "settings": vars(args), "error": None, "failed_stage": None,
    }  # fmt: skip
    ceilings: list[dict] = []
    training = None
    stage = "host"
    try:
        result["host"] |= in_child(host_info, args.device, timeout=PREFLIGHT_TIMEOUT_S)
        if result["host"].get("error"):
            raise SystemExit(result["host"]["error"])
        stage = "ceiling before training"
        ceilings.append(emulator("vector", args.env, args.workers, args.emulator_seconds, 1))
        stage = "training"
        with tempfile.TemporaryDirectory() as tmp:
            end_to_end = throughput.end_to_end(throughput_args(args), "float32",
                                               Path(tmp) / "run", Path(tmp))  # fmt: skip
            training = asyncio.run(end_to_end)
        stage = "ceiling after training"
        ceilings.append(emulator("vector", args.env, args.workers, args.emulator_seconds, 1))
    except (Exception, SystemExit) as error:  # recorded, with what was measured before it
        if isinstance(error, SystemExit):
            code = error.code
            # argparse (a bad --master-arg) exits with a number, its message printed above.
            message = (
                f"exit code {code} (see the messages above)" if isinstance(code, int) else str(code)
            )
        else:
            message = f"{type(error).__name__}: {error}"
        result |= {"error": message, "failed_stage": stage}
    result["summary"] = figures(ceilings, training)
    result["ceiling"] = {"before": ceilings[0] if ceilings else None,
                         "after": ceilings[1] if len(ceilings) > 1 else None,
                         "bracket": throughput.bracketing(*ceilings) if len(ceilings) == 2
                         else None}  # fmt: skip
    result["training"] = training
    result["wall_s"] = time.monotonic() - started
    return result


def summary_lines(result: dict[str, Any]) -> list[str]:
    """The few lines a person reads first."""
    host, s, args = result["host"], result["summary"], result["settings"]
    lines = [f"host: {host.get('device_name') or 'no GPU'}, {host['cpus']} cores "
             f"({host['cpu_model']}), torch {host.get('torch')} (CUDA {host.get('torch_cuda')}),"
             f" driver {host.get('driver')}"]  # fmt: skip
    if "ceiling_frames_per_s" in s:
        lines.append(f"ceiling:  {s['ceiling_frames_per_s']:>10,.0f} frames/s (C++ vector env, "
                     f"{s['ceiling_processes']} processes, {s['ceiling_measured']})")  # fmt: skip
    if "training_frames_per_s" in s:
        how = ("the whole generation" if s["complete_generation"]
               else f"a {args['training_seconds']:g} s window of the generation")  # fmt: skip
        lines.append(f"training: {s['training_frames_per_s']:>10,.0f} frames/s (one batched "
                     f"worker, {args['device']}, {args['envs']} envs; {how})")  # fmt: skip
        if "ratio" in s:
            verdict = "met" if s["meets_target"] else "not met"
            lines.append(f"ratio:    {s['ratio']:>10.3f} (target {TARGET_RATIO}: {verdict})")
        busy = s["gpu_utilisation_percent"]
        lines.append(
            f"GPU:      {busy:>9.1f}% busy, {s['gpu_memory_used_mib'] or 0:,.0f} MiB at most"
            if busy is not None else f"GPU:      not sampled ({s['gpu_utilisation_reason']})"
        )  # fmt: skip
        lines.append(f"1B frames: {s['hours_per_1b_frames']:.2f} hours on this host")
    if result["error"]:
        lines.append(f"FAILED in {result['failed_stage']}: {result['error']}")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="the batched worker's (default cuda)")
    parser.add_argument("--envs", type=int, default=None,
                        help="the batched worker's env slots (default: the worker's own, "
                        f"{ENVS_PER_CPU} per CPU this process may use)")  # fmt: skip
    parser.add_argument("--population", type=int, default=1000, help="the paper's 1000")
    parser.add_argument("--generations", type=int, default=1)
    parser.add_argument("--workers", type=int, default=os.cpu_count(),
                        help="ceiling processes, one per core (default: every core)")  # fmt: skip
    parser.add_argument("--emulator-seconds", type=float, default=10.0,
                        help="each of the two ceiling measurements")  # fmt: skip
    parser.add_argument("--training-seconds", type=float, default=150.0,
                        help="measure over this window if the generation runs longer "
                        "(0: until it ends)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=420.0,
                        help="training, worker start-up included, fails after this")  # fmt: skip
    parser.add_argument("--noise-table-size", type=int, default=2**26)
    parser.add_argument("--env", default="Frostbite-v4")
    parser.add_argument("--worker-arg", action="append", default=[],
                        help="extra worker argument (repeatable)")  # fmt: skip
    parser.add_argument("--master-arg", action="append", default=[],
                        help="extra neuro-master flag (repeatable)")  # fmt: skip
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    # Only the tiny test run shrinks the paper's 10 x 30 elite phase and its episodes.
    parser.add_argument("--elite-episodes", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--max-episode-steps", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.envs is None:
        args.envs = ENVS_PER_CPU * len(os.sched_getaffinity(0))
    if args.envs < 1 or args.population < 1 or args.workers < 1:
        parser.error("--envs, --population and --workers must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Measures, prints the JSON and the summary; 0, or 1 where a stage failed."""
    args = parse_args(argv)
    result = {**provenance(__file__, argv), **run(args)}
    if args.json is not None:
        write_json(args.json, result)
    print(json_text(result))
    print("\n".join(summary_lines(result)), flush=True)
    return 1 if result["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
