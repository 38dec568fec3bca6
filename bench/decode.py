"""Genome decoding cost for the paper's 4M network: it must not grow with the generation.

Measures, in one run on one core: a mutation from the shared noise table versus generating the
same Gaussian noise per seed (torch, NumPy); a generation-1 child and a generation-1000 child
with their parent cached (the ratio must stay near 1); a cold decode of a 1000-entry genome.

    python -m bench.decode --json bench/results/decode-<machine>-<date>.json
"""

from __future__ import annotations

import argparse
import os
import time

from bench.common import pin_to, process_memory, provenance, write_json


def median_seconds(fn, repeats: int) -> float:
    """Median seconds of `repeats` calls (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    times.sort()
    return times[len(times) // 2]


def _worker_memory(args: tuple) -> dict:
    """One worker's decoding of children of the same T parents; its memory afterwards."""
    policy_name, table_size, shared_dir, parents, children = args
    import gymnasium as gym
    import numpy as np

    from neuro.decode import GenomeDecoder
    from neuro.noise import NoiseTableSpec, load_noise_table
    from neuro.shared_store import SharedVectorStore
    from worker.inference.policy import build_policy

    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    policy = build_policy(policy_name, space, gym.spaces.Discrete(18))
    table = load_noise_table(NoiseTableSpec(size=table_size))
    store = SharedVectorStore(shared_dir) if shared_dir else None
    decoder = GenomeDecoder(table, policy.init_scale(), 0.002, 2**30, store, policy_name)
    rng = np.random.default_rng(os.getpid())
    for _ in range(children):
        parent = parents[int(rng.integers(len(parents)))]
        policy.load_parameters(decoder.decode([*parent, int(rng.integers(2**32))]))
    return process_memory()


def shared_parents_memory(policy: str, table_size: int, workers: int = 2, children: int = 60):
    """W workers decoding children of the same 20 generation-10 parents, shared vs private."""
    import multiprocessing as mp
    import tempfile

    import numpy as np

    rng = np.random.default_rng(7)
    parents = [[int(s) for s in rng.integers(0, 2**32, 10)] for _ in range(20)]
    result = {}
    for mode in ("private", "shared"):
        with tempfile.TemporaryDirectory() as shared_dir:
            store = shared_dir if mode == "shared" else None
            jobs = [(policy, table_size, store, parents, children)]
            with mp.get_context("spawn").Pool(workers) as pool:
                result[mode] = pool.map(_worker_memory, jobs * workers)
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generations", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--policy", default="deepga", choices=("deepga", "nature", "mlp"))
    parser.add_argument("--noise-table-size", type=int, default=2**26)
    parser.add_argument("--memory-workers", type=int, default=2)
    parser.add_argument("--memory-children", type=int, default=60)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    pin_to(0)

    import gymnasium as gym
    import numpy as np
    import torch

    from neuro.decode import GenomeDecoder, decode_genome
    from neuro.noise import NoiseTableSpec, load_noise_table
    from worker.inference.policy import build_policy

    torch.set_num_threads(1)
    if args.policy == "mlp":
        spaces = (gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
    else:
        spaces = (gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(18))
    policy = build_policy(args.policy, *spaces)
    n = policy.num_params
    scale = policy.init_scale()
    started = time.perf_counter()
    table = load_noise_table(NoiseTableSpec(size=args.noise_table_size))
    np.asarray(table[::4096]).sum()  # fault the pages in: first use is not the steady state
    table_load_s = time.perf_counter() - started
    sigma = 0.002
    rng = np.random.default_rng(0)
    seeds = [int(s) for s in rng.integers(0, 2**32, size=args.generations + args.repeats + 2)]

    theta = np.zeros(n, np.float32)
    tmp = np.empty(n, np.float32)

    def table_mutation():
        offset = int(rng.integers(0, args.noise_table_size - n))
        np.multiply(table[offset : offset + n], np.float32(sigma), out=tmp)
        np.add(theta, tmp, out=theta)

    generator = torch.Generator().manual_seed(0)

    def torch_noise_mutation():
        theta_t = torch.from_numpy(theta)
        theta_t.add_(torch.randn(n, generator=generator), alpha=sigma)

    numpy_generator = np.random.default_rng(1)

    def numpy_noise_mutation():
        theta.__iadd__(numpy_generator.standard_normal(n, dtype=np.float32) * np.float32(sigma))

    mutation = {
        "noise_table_slice_add_ms": median_seconds(table_mutation, args.repeats) * 1e3,
        "torch_randn_per_seed_ms": median_seconds(torch_noise_mutation, args.repeats) * 1e3,
        "numpy_generator_per_seed_ms": median_seconds(numpy_noise_mutation, args.repeats) * 1e3,
    }

    def child_cost(parent_length: int) -> tuple[float, float]:
        """(steady-state, first-use) seconds for a child of a cached parent.

        The first children a worker decodes land in fresh memory, and every page faults on
        first touch; once the cache has filled, evicted vectors are reused. Both are reported.
        """
        decoder = GenomeDecoder(table, scale, sigma)
        parent = seeds[:parent_length]
        decoder.decode(parent)  # cached, as it is for the workers that run its children
        children = iter(range(2**31, 2**32))
        started = time.perf_counter()
        decoder.decode([*parent, next(children)])
        first_use = time.perf_counter() - started
        for _ in range(decoder.cache_bytes // (4 * n) + 2):
            decoder.decode([*parent, next(children)])
        child = median_seconds(lambda: decoder.decode([*parent, next(children)]), args.repeats)
        return child, first_use

    gen1, gen1_first = child_cost(1)
    gen_n, _ = child_cost(args.generations - 1)
    cold = median_seconds(lambda: decode_genome(table, scale, sigma, seeds[: args.generations]), 3)
    result = {
        **provenance(__file__, argv),
        "policy": args.policy,
        "params": n,
        "noise_table_size": args.noise_table_size,
        "noise_table_load_s": table_load_s,
        "mutation": mutation,
        "table_speedup_vs_torch_randn": mutation["torch_randn_per_seed_ms"]
        / mutation["noise_table_slice_add_ms"],
        "child_generation_1_ms": gen1 * 1e3,
        f"child_generation_{args.generations}_ms": gen_n * 1e3,
        "child_cost_ratio": gen_n / gen1,
        "child_first_use_ms": gen1_first * 1e3,
        f"cold_decode_{args.generations}_entries_s": cold,
    }
    print(f"decode, {args.policy} ({n:,} params), one core:")
    for key, value in mutation.items():
        print(f"  one mutation, {key}: {value:.2f}")
    print(f"  child of a cached parent: generation 1 {gen1 * 1e3:.2f} ms, generation "
          f"{args.generations} {gen_n * 1e3:.2f} ms, ratio {gen_n / gen1:.2f}")  # fmt: skip
    print(f"  a child's first use of fresh memory (page faults): {gen1_first * 1e3:.2f} ms")
    print(f"  cold decode of a {args.generations}-entry genome: {cold:.2f} s")
    if args.policy != "mlp" and args.memory_workers:
        memory = shared_parents_memory(
            args.policy, args.noise_table_size, args.memory_workers, args.memory_children
        )
        result["worker_memory_mib"] = memory
        for mode, figures in memory.items():
            cells = ", ".join(f"PSS {m['pss_mib']:.0f} private {m['private_dirty_mib']:.0f}"
                              for m in figures)  # fmt: skip
            print(f"  {len(figures)} workers, children of 20 shared parents, {mode}: {cells} MiB")
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
