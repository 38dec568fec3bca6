"""What one mutation does to a genome's policy under each inference dtype: the plateau question.

In the learning study (bench/learning_parity.py) two int8-static Frostbite runs of five never
left the ~240 plateau in 6M frames, while every float32 run did within 3M. Random genomes score
alike under both dtypes (the study's generation 0 is the same genomes), so the question is the
search: does quantisation absorb the paper's small mutations (sigma 0.002), so that more
offspring are the parent's policy again and a generation tries fewer new behaviours?

Two measurements, for each parent given (a plateau elite of a stalled run, by default):

- weights: over K offspring (the parent's seeds plus one), the share of int8-static's 7-bit
  weight codes that a mutation changes, per layer, and the quantisation step against sigma
  (every float32 weight changes);
- behaviour: the parent and its K offspring each play one episode from the same start under
  each dtype; an offspring is neutral when it plays the parent's episode again (the same score
  and length); how many are, how many distinct outcomes the K give, how many beat the parent.

    python -m bench.mutation_effects [--offspring 40] \\
        [--json bench/results/mutation-effects-<machine>-<date>.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from bench.common import RESULTS, provenance, write_json
from neuro.decode import decode_genome
from neuro.inference import FLOAT32, INT8_STATIC
from neuro.layout import ATARI_SHAPE, init_scale, parameter_layout
from neuro.noise import NoiseTableSpec, load_noise_table
from worker.evaluation.evaluator import Evaluator
from worker.evaluation.spec import EvaluationSpec
from worker.inference.int8_static import quantised_rows
from worker.play.envs import VECTOR
from worker.runners.per_genome import PerGenomeRunner

STUDY = RESULTS / "learning-parity-runs-xeon-avx512-2core-2026-11-27"
FROSTBITE_ACTIONS = 18
SIGMA = 0.002


def plateau_parent(run_file: Path) -> tuple[int, ...]:
    """The final elite of a study run (its seeds), whose replay scored on the plateau."""
    run = json.loads(run_file.read_text())
    sha = run["replays"]["final"]["elite_sha256"]
    return tuple(run["elite_seeds"][sha])


def weight_effects(table: np.ndarray, parent: tuple[int, ...], children: list[int]) -> dict:
    """Per weight layer: the share of 7-bit codes one mutation changes (mean over children),
    and the median quantisation step (max|w| / 63 of a row) in units of sigma."""
    layout = parameter_layout("deepga", ATARI_SHAPE, FROSTBITE_ACTIONS)
    scale = init_scale(layout)
    base = decode_genome(table, scale, SIGMA, parent)
    layers = {}
    offsets, offset = {}, 0
    for name, shape in layout:
        size = int(np.prod(shape))
        offsets[name] = (offset, shape)
        offset += size
    for name, (start, shape) in offsets.items():
        if not name.endswith(".weight") or name.startswith("out."):
            continue  # int8-static keeps the output layer in float32
        size = int(np.prod(shape))
        codes, steps = quantised_rows(base[start : start + size].reshape(shape[0], -1))
        changed = []
        for child in children:
            theta = decode_genome(table, scale, SIGMA, (*parent, child))
            child_codes, _ = quantised_rows(theta[start : start + size].reshape(shape[0], -1))
            changed.append(float(np.mean(child_codes != codes)))
        layers[name] = {
            "codes_changed": round(statistics.fmean(changed), 4),
            "step_over_sigma": round(float(np.median(steps)) / SIGMA, 2),
        }
    return layers


def behaviour_effects(
    evaluator: Evaluator, table: NoiseTableSpec, parent: tuple[int, ...], children: list[int],
    dtype: str, env_seed: int, max_steps: int,
) -> dict:  # fmt: skip
    """One episode each of the parent and its children from the same start, under `dtype`."""
    runner = PerGenomeRunner(evaluator, 1)  # as a worker's: its env and policy kept between plays

    def play(seeds: tuple[int, ...]) -> tuple[float, int]:
        spec = EvaluationSpec("Frostbite-v4", seeds, SIGMA, table, "deepga", episodes=1,
                              max_episode_steps=max_steps, env_seed=env_seed,
                              inference_dtype=dtype)  # fmt: skip
        evaluation = runner.play(spec)
        if evaluation.error:
            raise RuntimeError(f"{seeds}: {evaluation.error}")
        return evaluation.returns[0], evaluation.frames[0]

    started = time.perf_counter()
    home = play(parent)
    outcomes = [play((*parent, child)) for child in children]
    scores = [score for score, _ in outcomes]
    return {
        "parent": {"score": home[0], "frames": home[1]},
        "neutral": sum(outcome == home for outcome in outcomes),
        "distinct_outcomes": len(set(outcomes)),
        "better": sum(score > home[0] for score in scores),
        "worse": sum(score < home[0] for score in scores),
        "offspring_mean": round(statistics.fmean(scores), 1),
        "offspring_max": max(scores),
        "seconds": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runs",
        nargs="+",
        default=[
            "frostbite-int8-static-seed1.json",
            "frostbite-int8-static-seed5.json",
        ],
        help="study run files (in --study-dir) whose final elites are parents",
    )
    parser.add_argument("--offspring", type=int, default=40)
    parser.add_argument("--env-seed", type=int, default=7)
    parser.add_argument("--max-steps", type=int, default=5000)
    parser.add_argument("--noise-table-size", type=int, default=2**26)
    parser.add_argument("--study-dir", default=str(STUDY))
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.offspring < 1:
        parser.error(f"--offspring must be >= 1, got {args.offspring}")
    table_spec = NoiseTableSpec(size=args.noise_table_size)
    table = load_noise_table(table_spec)
    children = [int(s) for s in np.random.default_rng(2026).integers(0, 2**32, args.offspring)]
    evaluator = Evaluator(atari_backend=VECTOR)
    report: dict = {**provenance(__file__, argv), "offspring": args.offspring, "sigma": SIGMA,
                    "env_seed": args.env_seed, "parents": {}}  # fmt: skip
    for run in args.runs:
        parent = plateau_parent(Path(args.study_dir) / run)
        entry: dict = {"seeds": list(parent), "weights": weight_effects(table, parent, children)}
        for dtype in (FLOAT32, INT8_STATIC):
            entry[dtype] = behaviour_effects(evaluator, table_spec, parent, children, dtype,
                                             args.env_seed, args.max_steps)  # fmt: skip
            print(f"{run} {dtype}: {json.dumps(entry[dtype])}", flush=True)
        print(f"{run} weights: {json.dumps(entry['weights'])}", flush=True)
        report["parents"][run] = entry
    if args.json:
        write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
