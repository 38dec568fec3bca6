"""The batched forward pass in other dtypes, layouts and kernels, timed and checked against float32.

For the Deep GA network and B distinct individuals (one observation each, B = --batches), one
step from B host observations to B rows of outputs on the host, under each variant:

  float32           BatchedPolicies as the batched runner calls it (the reference)
  float32+direct    the same grouped pass called directly, without the runner's slot bookkeeping
  +channels-last    inputs and kernels channels-last (NHWC)
  +cudnn-benchmark  torch.backends.cudnn.benchmark on: cuDNN times its algorithms first (CUDA)
  bfloat16, float16 weights and activations in that dtype
  +unfold           convolutions as unfold + one batched matmul (torch_grouped/unfold.py)
  +graph            the whole step captured once as a CUDA graph and replayed, its input and
                    weights in static buffers (CUDA)

Per variant and batch: the median ms per step, and the share of rows whose greedy action
(argmax) is the float32 reference's on the same batch, over real Frostbite frames from random
play. TF32 stays off (a float32 variant is float32). A variant that needs CUDA is skipped on a
CPU, saying so; one that fails records its error and the others run; --budget-s bounds the
whole run (what did not fit is recorded as skipped).

    python -m bench.forward_variants --batches 8 32 128 256 \\
        --json bench/results/forward-variants-<machine>-<date>.json
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

from bench.common import median_ms, provenance, write_json
from neuro.layout import ATARI_CONVS, atari_conv_pads
from worker.inference.engines.torch_grouped.grouped import (
    BatchedPolicies,
    atari_forward,
    strict_float32,
)
from worker.inference.engines.torch_grouped.unfold import grouped_conv2d_unfold
from worker.inference.policy import build_policy

ARCH = "deepga"
ATARI_OBS = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FLAGS = ("direct", "channels-last", "cudnn-benchmark", "unfold", "graph")
CUDA_ONLY = {"cudnn-benchmark": "cuDNN's autotuner is a CUDA setting",
             "graph": "CUDA graphs need a CUDA device"}  # fmt: skip
DEFAULT_VARIANTS = (
    "float32", "float32+direct", "float32+channels-last", "float32+cudnn-benchmark",
    "bfloat16", "float16", "bfloat16+channels-last+cudnn-benchmark",
    "float32+unfold", "bfloat16+unfold", "float16+unfold",
    "float32+graph", "float32+unfold+graph", "bfloat16+unfold+graph",
)  # fmt: skip
MUTATION_POWER = 0.002  # the paper's sigma: a few mutations on top of the init scale
AGREEMENT_TARGET = 0.999


@dataclasses.dataclass(frozen=True)
class Variant:
    """A dtype and the flags on top of it, named as on the command line: "bfloat16+unfold"."""

    name: str
    dtype: str
    flags: frozenset[str]

    @classmethod
    def parse(cls, name: str) -> Variant:
        """ValueError naming an unknown dtype or flag."""
        dtype, *flags = name.split("+")
        if dtype not in DTYPES:
            raise ValueError(f"variant {name!r}: the dtype must be one of {', '.join(DTYPES)}")
        for flag in flags:
            if flag not in FLAGS:
                raise ValueError(f"variant {name!r}: unknown flag {flag!r} (flags: {FLAGS})")
        return cls(name, dtype, frozenset(flags))

    @property
    def runner_path(self) -> bool:
        """The reference path: BatchedPolicies called as the runner calls it."""
        return self.dtype == "float32" and self.flags <= {"cudnn-benchmark"}

    def skip_reason(self, device: torch.device) -> str | None:
        if device.type != "cuda":
            for flag in sorted(self.flags & CUDA_ONLY.keys()):
                return CUDA_ONLY[flag]
        return None


def real_frames(env_id: str, count: int, seed: int) -> np.ndarray:
    """`count` stacked observations from random play of the paper's env (every other step)."""
    from neuro.envs.make import make_env

    env = make_env(env_id).env
    rng = np.random.default_rng(seed)
    observation, _ = env.reset(seed=seed)
    frames = []
    while len(frames) < count:
        for _ in range(2):
            observation, _, terminated, truncated, _ = env.step(int(rng.integers(18)))
            if terminated or truncated:
                observation, _ = env.reset()
        frames.append(np.asarray(observation))
    env.close()
    return np.stack(frames)


def build_step(
    variant: Variant, reference: BatchedPolicies, batch: int
) -> Callable[[np.ndarray], np.ndarray]:
    """One step under `variant`: (batch, 4, 84, 84) uint8 on the host -> (batch, 18) float32."""
    slots = list(range(batch))
    if variant.runner_path:
        return lambda obs: reference(slots, obs)
    device, dtype = reference.device, DTYPES[variant.dtype]
    # Slots 0..batch-1 of the stacked weights (a view), in the variant's dtype (a copy).
    params = [p[:batch].to(dtype) for p in reference._params]
    channels_last = "channels-last" in variant.flags
    if channels_last:
        for i in (0, 2, 4):  # the kernels, (U, O, C, k, k): NHWC as the conv sees them
            shape = params[i].shape
            flat = params[i].flatten(0, 1).contiguous(memory_format=torch.channels_last)
            params[i] = flat.view(shape)
    base = grouped_conv2d_unfold if "unfold" in variant.flags else F.conv2d

    def conv(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return base(x, *args, **kwargs)

    pads = atari_conv_pads(ARCH)
    strides = [stride for _, _, stride in ATARI_CONVS]

    def body(x: torch.Tensor) -> torch.Tensor:
        scaled = (x.to(torch.float32) / 255.0).to(dtype).view(1, batch * 4, 84, 84)
        return atari_forward(scaled, params, pads, strides, conv).reshape(batch, -1).float()

    if "graph" not in variant.flags:

        def step(obs: np.ndarray) -> np.ndarray:
            with torch.inference_mode():
                return body(torch.from_numpy(obs).to(device)).cpu().numpy()

        return step
    static_in = torch.zeros((batch, *ATARI_OBS.shape), dtype=torch.uint8, device=device)
    host = torch.zeros(static_in.shape, dtype=torch.uint8).pin_memory()
    with torch.no_grad():
        # Warm up on a side stream (cuDNN picks its algorithms, the allocator fills its pool),
        # then capture: replays run the same kernels on the same buffers.
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(3):
                body(static_in)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = body(static_in)

    def replay(obs: np.ndarray) -> np.ndarray:
        host.numpy()[:] = obs
        static_in.copy_(host, non_blocking=True)
        graph.replay()
        return static_out.cpu().numpy()  # waits for the replay

    return replay


def measure(
    variant: Variant, reference: BatchedPolicies, batch: int, draws: list[np.ndarray],
    expected: list[np.ndarray], repeats: int,
) -> dict[str, Any]:  # fmt: skip
    """Agreement with the float32 reference over every draw, then the median ms per step."""
    device = reference.device
    benchmark = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = "cudnn-benchmark" in variant.flags
    step = None
    try:
        step = build_step(variant, reference, batch)
        agree = rows = 0
        worst = 0.0
        for obs, ref in zip(draws, expected, strict=True):
            out = step(obs)
            agree += int(np.sum(np.argmax(out, axis=1) == np.argmax(ref, axis=1)))
            rows += len(ref)
            scale = float(np.max(np.abs(ref))) or 1.0
            worst = max(worst, float(np.max(np.abs(out - ref))) / scale)
        ms = median_ms(lambda: step(draws[0]), repeats, device)
    finally:
        torch.backends.cudnn.benchmark = benchmark
        step = None  # its weight copies (and graph) go back to the allocator before the next
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"status": "ok", "median_ms": ms, "ms_per_individual": ms / batch,
            "agreement": agree / rows, "rows": rows, "max_relative_difference": worst}  # fmt: skip


def machine(device: torch.device) -> dict[str, Any]:
    """What the figures were measured on."""
    info: dict[str, Any] = {
        "device": str(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        info |= {"device_name": torch.cuda.get_device_name(device),
                 "cudnn": torch.backends.cudnn.version(),
                 "tf32": {"matmul": torch.backends.cuda.matmul.allow_tf32,
                          "cudnn": torch.backends.cudnn.allow_tf32}}  # fmt: skip
    return info


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32, 128, 256])
    parser.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS),
                        help="dtype[+flag...]; flags: " + ", ".join(FLAGS))  # fmt: skip
    parser.add_argument("--repeats", type=int, default=20, help="timed steps per median")
    parser.add_argument("--agreement-rows", type=int, default=512,
                        help="at least this many rows compared per variant and batch")  # fmt: skip
    parser.add_argument("--env", default="Frostbite-v4")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--budget-s", type=float, default=240.0,
                        help="what has not started by then is skipped, saying so")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    try:
        args.variants = [Variant.parse(name) for name in args.variants]
    except ValueError as error:
        parser.error(str(error))
    if min(args.batches) < 1 or args.repeats < 1:
        parser.error("--batches and --repeats must be >= 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measures every variant at every batch size; prints a table, returns (and writes) JSON.
    A failure before the first variant (no such device) is written to the JSON too."""
    args = parse_args(argv)
    made = provenance(__file__, argv)
    try:
        report = {**made, **measure_all(args)}
    except Exception as error:  # written down for a host run blind, then re-raised
        if args.json:
            failed = {"device": args.device, "error": f"{type(error).__name__}: {error}"}
            write_json(args.json, {**made, **failed})
        raise
    if args.json:
        write_json(args.json, report)
    return report


def measure_all(args: argparse.Namespace) -> dict[str, Any]:
    """The variants x batches table of one run."""
    started = time.monotonic()
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cuda":
        strict_float32()
    policy = build_policy(ARCH, ATARI_OBS, gym.spaces.Discrete(18), inference_engine="torch")
    capacity = max(args.batches)
    reference = BatchedPolicies(policy.spec, capacity, device)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    scale = torch.from_numpy(policy.init_scale()).to(device)
    for slot in range(capacity):
        # Drawn on the device: 256 x 4M normals would take the host most of a minute.
        noise = torch.randn(2, policy.num_params, generator=generator, device=device)
        reference.load(slot, scale * noise[0] + MUTATION_POWER * noise[1])
    pool = real_frames(args.env, max(2 * capacity, 64), args.seed)
    rng = np.random.default_rng(args.seed)
    results: list[dict[str, Any]] = []
    print(f"{ARCH} on {device}: median ms per step (agreement of greedy actions with float32)")
    for batch in args.batches:
        draws = [pool[rng.choice(len(pool), batch, replace=False)]
                 for _ in range(math.ceil(args.agreement_rows / batch))]  # fmt: skip
        expected = [reference(list(range(batch)), obs) for obs in draws]
        for variant in args.variants:
            row: dict[str, Any] = {"variant": variant.name, "batch": batch}
            reason = variant.skip_reason(device)
            if reason is None and time.monotonic() - started > args.budget_s:
                reason = f"time budget: --budget-s {args.budget_s:g} spent"
            if reason is not None:
                row |= {"status": "skipped", "reason": reason}
            else:
                try:
                    row |= measure(variant, reference, batch, draws, expected, args.repeats)
                except Exception as error:  # a kernel this device lacks, memory: the rest run
                    row |= {"status": "error", "reason": f"{type(error).__name__}: {error}"}
            results.append(row)
            print(f"  B={batch:<4} {variant.name:42s} " + (
                f"{row['median_ms']:9.3f} ms ({row['agreement']:.4f})"
                if row["status"] == "ok" else f"{row['status']}: {row['reason'][:80]}"
            ), flush=True)  # fmt: skip
    settings = {k: v for k, v in vars(args).items() if k != "json"}
    settings["variants"] = [variant.name for variant in args.variants]
    report = {
        "arch": ARCH,
        "machine": machine(device),
        "settings": settings,
        "agreement_target": AGREEMENT_TARGET,
        "results": results,
        "fastest": fastest(results),
        "wall_s": time.monotonic() - started,
    }
    return report


def fastest(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per batch: the reference's ms, and the fastest variant whose actions agree with it on
    at least AGREEMENT_TARGET of the rows, with its speed-up."""
    best: dict[str, dict[str, Any]] = {}
    for batch in sorted({r["batch"] for r in results}):
        ok = [r for r in results if r["batch"] == batch and r["status"] == "ok"]
        reference = next((r for r in ok if r["variant"] == "float32"), None)
        agreeing = [r for r in ok if r["agreement"] >= AGREEMENT_TARGET]
        if reference is None or not agreeing:
            continue
        winner = min(agreeing, key=lambda r: r["median_ms"])
        best[str(batch)] = {"variant": winner["variant"], "median_ms": winner["median_ms"],
                            "float32_ms": reference["median_ms"],
                            "speedup": reference["median_ms"] / winner["median_ms"]}  # fmt: skip
    return best


if __name__ == "__main__":
    main()
