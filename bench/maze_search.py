"""Deceptive maze: plain GA against GA-NS (novelty search) at the same budget, seed by seed.

    python -m bench.maze_search              # seeds 1-5, the vector-env preset, both arms
    python -m bench.maze_search --seeds 1 2 --population 200 --generations 50 \\
        --json bench/results/maze-search-<variant>-<machine>-<date>.json

Both arms are the master's own algorithms driven through ask/tell, with its preset for vector
envs (population 100, truncation 10, mutation power 0.05, 3 elite candidates, one elite
episode: the maze is deterministic, mlp 64x64) and, for GA-NS, its novelty defaults (k=10,
archive probability 0.01): "ga" is master.algorithms.ga.GeneticAlgorithm, parents the best by
return; "ga-ns" is master.algorithms.ga_ns.NoveltyGA, parents the most novel by final (x, y),
the elite still the best by return.

A run stops at the first generation (numbered from 0) in which an offspring reaches the goal,
else after --generations. The population plays in lockstep on the maze module's batched
dynamics, each network evaluated in numpy from the vector the project's genome decoder builds;
each run's best genome is then replayed through the worker's own path (make_env, build_policy,
run_episode) to check that the batch scored what a worker would.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import asdict, dataclass

import numpy as np

from bench.common import write_json
from master.algorithms.base import Algorithm
from master.algorithms.ga import GAConfig, GeneticAlgorithm
from master.algorithms.ga_ns import NoveltyGA
from master.algorithms.novelty import NoveltyConfig
from neuro.decode import GenomeDecoder
from neuro.envs import MAZE_ID, maze
from neuro.envs.make import make_env
from neuro.genome import Genome
from neuro.noise import SMALL_NOISE_TABLE_SIZE, NoiseTableSpec, load_noise_table
from worker.inference.policy import Policy, build_policy
from worker.play.rollout import run_episode

ARMS = ("ga", "ga-ns")


@dataclass(frozen=True)
class RunResult:
    """One run of one arm."""

    arm: str
    seed: int
    reached_at: int | None
    """First generation (from 0) in which an offspring reached the goal; None: never."""
    generations: int
    """Generations played (the run stops once the goal is reached)."""
    best_distance: float
    """Closest final distance to the goal of any offspring of the run."""
    best_where: str
    best_seeds: tuple[int, ...]
    replay_return: float
    """The best genome's return replayed through make_env, build_policy and run_episode."""
    seconds: float


def population_actions(
    weights: list[tuple[np.ndarray, np.ndarray]], observations: np.ndarray, policy: Policy
) -> np.ndarray:
    """The mlp policy's Box actions for (P, obs) observations, one network per row."""
    hidden = observations
    for weight, bias in weights[:-1]:
        hidden = np.tanh(np.matmul(weight, hidden[:, :, None])[:, :, 0] + bias)
    weight, bias = weights[-1]
    out = np.matmul(weight, hidden[:, :, None])[:, :, 0] + bias
    low, high = policy.action_space.low, policy.action_space.high
    return (low + (np.tanh(out) + 1.0) * 0.5 * (high - low)).astype(np.float32)


def split_layers(thetas: np.ndarray, policy: Policy) -> list[tuple[np.ndarray, np.ndarray]]:
    """(P, num_params) vectors -> per layer (P, out, in) weights and (P, out) biases."""
    arrays, offset = [], 0
    for _, shape in policy.parameter_layout:
        size = math.prod(shape)
        arrays.append(thetas[:, offset : offset + size].reshape(len(thetas), *shape))
        offset += size
    return list(zip(arrays[0::2], arrays[1::2], strict=True))


def play_population(thetas: np.ndarray, policy: Policy) -> tuple[np.ndarray, np.ndarray]:
    """(returns (P,), final positions (P, 2)) of one maze episode per parameter vector."""
    weights = split_layers(thetas, policy)
    positions = maze.start_positions(len(thetas))
    playing = np.ones(len(thetas), dtype=bool)
    for _ in range(maze.EPISODE_STEPS):
        actions = population_actions(weights, maze.observe(positions), policy)
        moved = maze.move(positions, actions.astype(np.float64))
        positions = np.where(playing[:, None], moved, positions)
        playing &= maze.goal_distance(positions) > maze.GOAL_RADIUS
        if not playing.any():
            break
    return -maze.goal_distance(positions), positions


def region(position: np.ndarray) -> str:
    """Where a final position lies, in the maze's terms."""
    x, y = position
    if math.dist(position, maze.GOAL) <= maze.GOAL_RADIUS:
        return "goal"
    if maze.CUP_LEFT < x < maze.CUP_RIGHT and maze.CUP_BOTTOM < y < maze.CUP_ROOF:
        under_roof = y >= maze.CUP_ROOF - maze.CLEARANCE - maze.MAX_SPEED
        return "under the roof" if under_roof else "in the cup"
    return "above the cup" if y > maze.CUP_ROOF else "around the cup"


def build(arm: str, seed: int, args: argparse.Namespace) -> Algorithm:
    """The arm's algorithm, seeded."""
    config = GAConfig(
        population_size=args.population,
        truncation=args.truncation,
        mutation_power=args.mutation_power,
        elite_candidates=args.elite_candidates,
        elite_episodes=1,
        seed=seed,
    )
    if arm == "ga":
        return GeneticAlgorithm(config)
    novelty = NoveltyConfig(k=args.novelty_k, archive_probability=args.archive_probability)
    return NoveltyGA(config, novelty)


def run(arm: str, seed: int, args: argparse.Namespace, decoder: GenomeDecoder,
        policy: Policy) -> RunResult:  # fmt: skip
    """One run of `arm` from `seed`."""
    started = time.perf_counter()
    algorithm = build(arm, seed, args)
    best = (-math.inf, np.zeros(2), Genome((0,)))
    reached_at = None
    generation = 0
    for generation in range(args.generations):
        requests = algorithm.ask()
        thetas = np.stack([decoder.decode(r.genome.seeds) for r in requests])
        returns, finals = play_population(thetas, policy)
        top = int(np.argmax(returns))
        if returns[top] > best[0]:
            best = (float(returns[top]), finals[top], requests[top].genome)
        if returns[top] >= -maze.GOAL_RADIUS:
            reached_at = generation
            break
        # The elite phase asks again for genomes just played: the maze is deterministic, so
        # their one episode answers it.
        played = {r.genome.seeds: i for i, r in enumerate(requests)}
        summary = None
        while summary is None:
            asked = [(r.key, played[r.genome.seeds]) for r in algorithm.ask()]
            behaviours = {key: finals[i][None].astype(np.float32) for key, i in asked}
            summary = algorithm.tell(
                {key: [float(returns[i])] for key, i in asked},
                behaviours if algorithm.needs_behaviours else None,
            )
    replay = replay_return(best[2], decoder, policy)
    return RunResult(arm, seed, reached_at, generation + 1, -best[0], region(best[1]),
                     best[2].seeds, replay, time.perf_counter() - started)  # fmt: skip


def replay_return(genome: Genome, decoder: GenomeDecoder, policy: Policy) -> float:
    """The genome's return played the way a worker plays it."""
    handle = make_env(MAZE_ID)
    policy.load_parameters(np.array(decoder.decode(genome.seeds)))
    return run_episode(policy.act, handle, seed=0).total_reward


def main(argv: list[str] | None = None) -> list[RunResult]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5],
                        help="one run of each arm per seed (the algorithm's seed)")  # fmt: skip
    parser.add_argument("--population", type=int, default=100)
    parser.add_argument("--generations", type=int, default=100,
                        help="budget; a run stops once an offspring reaches the goal")  # fmt: skip
    parser.add_argument("--truncation", type=int, default=10)
    parser.add_argument("--mutation-power", type=float, default=0.05)
    parser.add_argument("--elite-candidates", type=int, default=3)
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    parser.add_argument("--novelty-k", type=int, default=NoveltyConfig.k)
    parser.add_argument("--archive-probability", type=float,
                        default=NoveltyConfig.archive_probability)  # fmt: skip
    parser.add_argument("--noise-table-size", type=int, default=SMALL_NOISE_TABLE_SIZE)
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)

    env = make_env(MAZE_ID).env
    policy = build_policy("mlp", env.observation_space, env.action_space, args.hidden)
    table = load_noise_table(NoiseTableSpec(size=args.noise_table_size))
    decoder = GenomeDecoder(table, policy.init_scale(), args.mutation_power)
    print(f"{MAZE_ID}: population {args.population} x {args.generations} generations, "
          f"truncation {args.truncation}, mutation power {args.mutation_power}, "
          f"mlp {tuple(args.hidden)}, novelty k={args.novelty_k}, "
          f"archive p={args.archive_probability}")  # fmt: skip
    print(f"{'arm':6} {'seed':>4} {'goal at gen':>11} {'gens':>5} {'best dist':>9} "
          f"{'best ends':15} {'replayed':>8} {'seconds':>7}")  # fmt: skip
    results = []
    for arm in args.arms:
        for seed in args.seeds:
            result = run(arm, seed, args, decoder, policy)
            results.append(result)
            reached = "-" if result.reached_at is None else str(result.reached_at)
            print(f"{arm:6} {seed:>4} {reached:>11} {result.generations:>5} "
                  f"{result.best_distance:>9.4f} {result.best_where:15} "
                  f"{result.replay_return:>8.4f} {result.seconds:>7.1f}", flush=True)  # fmt: skip
    for arm in args.arms:
        reached = [r.reached_at for r in results if r.arm == arm and r.reached_at is not None]
        print(f"{arm}: goal reached in {len(reached)}/{len(args.seeds)} runs"
              + (f", at generations {sorted(reached)}" if reached else ""))  # fmt: skip
    if args.json:
        write_json(args.json, [asdict(r) for r in results])
    return results


if __name__ == "__main__":
    main()
