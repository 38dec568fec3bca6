"""One forward step of B different individuals: grouped conv vs a per-individual loop vs vmap.

Each row of a batch is played by its own individual (B distinct weight sets of one network,
float32). Three ways to compute the step, all from the same stacked weights on one device:

- grouped: the batched runner's engine, BatchedPolicies (one grouped conv per conv layer,
  groups=B, and one baddbmm per dense layer);
- loop: one ordinary forward per individual (F.conv2d / F.linear with that slot's weights, as
  Policy's network computes it), B forwards in a row;
- vmap: torch.func.vmap of that single forward, each row's weights gathered from its slot.

Prints the median ms per step for batch 1, 8 and 32 on CUDA when present, else on the CPU.
The grouped pass in other dtypes, layouts and kernels (bfloat16, channels-last, unfold + bmm,
CUDA graphs): bench/forward_variants.py.

    python -m bench.batched_forward [--arch deepga] [--device cpu] [--threads 1] \\
        [--json bench/results/batched-forward-<device>-<machine>-<date>.json]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch.func import vmap

from bench.common import median_ms, provenance, write_json
from neuro.inference import ARCHITECTURES
from neuro.layout import ATARI_CONVS, atari_conv_pads
from worker.inference.engines.torch_grouped.grouped import BatchedPolicies, strict_float32
from worker.inference.policy import Policy, build_policy

METHODS = ("grouped", "loop", "vmap")


def single_forward(
    arch: str, policy: Policy
) -> Callable[[list[torch.Tensor], torch.Tensor], torch.Tensor]:
    """One individual's forward pass (weights in layout order), as Policy computes it."""
    if arch == "mlp":

        def mlp(params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
            x = x.to(torch.float32).flatten(1)
            for i in range(0, len(params) - 2, 2):
                x = torch.tanh(F.linear(x, params[i], params[i + 1]))
            return F.linear(x, params[-2], params[-1])

        return mlp
    pads = atari_conv_pads(arch)
    strides = [stride for _, _, stride in ATARI_CONVS]

    def atari(params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.float32) / 255.0
        for layer, (pad, stride) in enumerate(zip(pads, strides, strict=True)):
            x = F.relu(F.conv2d(F.pad(x, pad), params[2 * layer], params[2 * layer + 1], stride))
        x = F.relu(F.linear(x.flatten(1), params[6], params[7]))
        return F.linear(x, params[8], params[9])

    return atari


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", choices=ARCHITECTURES, default="deepga")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cuda":
        strict_float32()

    if args.arch == "mlp":
        obs_space = gym.spaces.Box(-np.inf, np.inf, (17,), np.float32)
    else:
        obs_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    policy = build_policy(args.arch, obs_space, gym.spaces.Discrete(18))
    capacity = max(args.batches)
    batched = BatchedPolicies(policy.spec, capacity, device)
    rng = np.random.default_rng(0)
    scale = policy.init_scale()
    for slot in range(capacity):
        batched.load(slot, scale * rng.standard_normal(policy.num_params, dtype=np.float32))
    params = batched._params  # (capacity, *shape) per parameter, layout order
    forward = single_forward(args.arch, policy)

    def one(row_params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return forward(row_params, x[None])[0]

    batched_call = vmap(one)
    results: dict[int, dict[str, float]] = {}
    print(
        f"{args.arch} ({policy.num_params} parameters), float32 on {device}, "
        f"{torch.get_num_threads()} threads: ms per step, B distinct individuals"
    )
    print(f"{'batch':>6} " + " ".join(f"{m:>9}" for m in METHODS))
    for batch in args.batches:
        slots = list(range(batch))
        obs = rng.integers(0, 256, (batch, *obs_space.shape)).astype(obs_space.dtype)

        def loop(slots: list[int] = slots, obs: np.ndarray = obs) -> torch.Tensor:
            x = torch.from_numpy(obs).to(device)
            with torch.inference_mode():
                rows = [forward([p[s] for p in params], x[i : i + 1]) for i, s in enumerate(slots)]
                return torch.cat(rows)

        def vmapped(slots: list[int] = slots, obs: np.ndarray = obs) -> torch.Tensor:
            index = torch.tensor(slots, device=device)
            x = torch.from_numpy(obs).to(device)
            with torch.inference_mode():
                rows = [p.index_select(0, index) for p in params]
                return batched_call(rows, x)

        steps = {
            "grouped": lambda slots=slots, obs=obs: batched.forward(slots, obs),
            "loop": loop,
            "vmap": vmapped,
        }
        reference = steps["loop"]()
        for step in steps.values():
            # The three compute the same thing: a timing of a wrong result is worthless.
            torch.testing.assert_close(step(), reference, rtol=1e-4, atol=1e-5)
        results[batch] = {m: median_ms(step, args.repeats, device) for m, step in steps.items()}
        print(f"{batch:>6} " + " ".join(f"{results[batch][m]:>9.2f}" for m in METHODS))
    report = {
        **provenance(__file__, argv),
        "arch": args.arch,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "ms_per_step": {str(b): r for b, r in results.items()},
    }
    if args.json:
        write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
