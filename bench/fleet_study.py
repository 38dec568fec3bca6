"""The paper's table on a simulated fleet: one run at a time, with the exact overlap, and as one
study (many runs at once, fair share, a cap on concurrent runs), in virtual time.

bench/study_sim.py drives the master's real lease tables (master/fleet/leases.py) and its real
fair-share picker (master/fleet/shares.py) with simulated workers as bench/fleet_sim.py models
them (speeds lognormal(0, 0.15) with a 2x-slow 5%, round trips of 1-5 ms, one task prefetched,
the master's pacing of idle polls, backup copies). Its inputs:

- The study: master/studies/paper.toml (`--study`): 13 games x 5 seeds, 1B frames each, the
  paper's generation (1,000 offspring, then 10 candidates x 30 episodes), 30 final test
  episodes per run, `max_concurrent_runs` runs at once.
- The per-step cost: int8-static's measured whole paper generation on the Xeon, 52.8
  core-hours per 1B frames idle (0.760 ms an agent step; `--core-hours-per-1b-frames` to
  take another, e.g. 64.9, the same run loaded), read from STEP_COST_RESULT.
- Episode lengths: each game's random-start play (bench/results/paper-games-episode-steps.json,
  `python -m bench.episode_lengths`); a game not measured there plays Frostbite's recorded
  lengths (bench/results/frostbite-episode-steps.json), and `--lengths trained-frostbite` gives
  every game those (a trained policy's: longer, with a tenth at the 5,000-step cap).

Two commands:

- `table`: the paper's table on 100 / 1,000 / 10,000 workers, one run at a time (with and
  without the exact overlap) against one study at each cap in `--caps`: utilisation (the
  fleet's worker time on results that count), wall time, the targets. Every run's budget is
  cut by `--scale` (1B / 40 frames: a run of 2 to 19 generations instead of 60 to 760) so that
  the simulation takes minutes; the wall time is scaled back by the table's work over the
  simulated work. A shortened run's last generation and test are a bigger share of it, so the
  scaled figures are on the low side for utilisation. One run at a time simulates each game's
  first seed and counts it five times (a game's seeds differ only in their draws).
- `picker`: this machine's time of one fair-share lease call with r runs served (the
  simulation charges the master no time: this says what serving many runs costs its core).
- `utilisation`: how busy W workers are while r runs are served at once (the steady state:
  from the moment every run has finished its first generation until the first run ends), the
  table `neuro-deploy estimate` interpolates (deploy/fleet_utilisation.json), and the same
  figure for one run without the overlap.

    python -m bench.fleet_study table \\
        --json bench/results/fleet-study-paper-table-<variant>-virtual-<date>.json
    python -m bench.fleet_study utilisation --json deploy/fleet_utilisation.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.common import EPISODE_STEPS, REPO, RESULTS, machine, provenance, write_json
from bench.study_sim import FRAME_SKIP, GENOME, Pools, RunPlan, Shape, StudyFigures, StudySimulation
from deploy.fleet import UTILISATION_NAME, timeline, utilisation_table

STEP_COST_RESULT = (
    RESULTS / "throughput-int8-static-paper-generation-xeon-avx512-2core-2026-11-27.json"
)
STEP_COST_FIELD = ("runs", "int8-static", "core_hours", "idle", "core_hours_per_1b_frames")
UTILISATION_FILE = REPO / "deploy" / UTILISATION_NAME
GAME_STEPS = RESULTS / "paper-games-episode-steps.json"
"""Each of the paper's games' random-start episode lengths (bench/episode_lengths.py)."""
RANDOM, TRAINED = "random-start", "trained-frostbite"
TABLE_WORKERS = (100, 1000, 10000)
UTILISATION_WORKERS = (10, 30, 100, 300, 1000, 3000, 10000)
RUNS_AT_ONCE = (1, 2, 4, 8, 16)
TARGET_UTILISATION = 0.90
TARGET_HOURS = 4.0
TARGET_WORKERS = 1000


def measured_core_hours() -> float:
    """int8-static's core-hours per 1B frames for the paper's whole generation (idle)."""
    document = json.loads(STEP_COST_RESULT.read_text())
    for key in STEP_COST_FIELD:
        document = document[key]
    return float(document)


def step_ms(core_hours_per_1b_frames: float) -> float:
    """ms of one agent step (FRAME_SKIP frames) at that many core-hours per 1B frames."""
    return core_hours_per_1b_frames * 3.6e6 / (1e9 / FRAME_SKIP)


def load_pools(envs: list[str], lengths: str) -> tuple[dict[str, Pools], dict[str, str]]:
    """Each env's episode-length pools, and where each came from."""
    trained = json.loads(EPISODE_STEPS.read_text())
    frostbite = Pools(np.array(trained["offspring"]["steps"]), np.array(trained["elite"]["steps"]))
    games = json.loads(GAME_STEPS.read_text())["games"] if lengths == RANDOM else {}
    pools, origin = {}, {}
    for env in envs:
        if env in games:
            steps = np.array(games[env]["steps"])
            pools[env], origin[env] = Pools(steps, steps), GAME_STEPS.name
        else:
            pools[env], origin[env] = frostbite, EPISODE_STEPS.name
    return pools, origin


@dataclass(frozen=True)
class Plan:
    """The study's runs and generation, and the table's work at the measured step cost."""

    runs: list[RunPlan]
    shape: Shape
    cap: int
    pools: dict[str, Pools]
    origin: dict[str, str]
    step_ms: float

    def work_s(self, runs: list[RunPlan], scale: float = 1.0) -> float:
        """Worker-seconds of these runs' budgets (cut by `scale`) and final tests, nominal."""
        step_s = self.step_ms / 1000.0
        total = 0.0
        for run in runs:
            test = self.shape.test_episodes * float(np.mean(self.pools[run.env].elite))
            total += (run.frames / scale / FRAME_SKIP + test) * step_s
        return total


def interleaved(runs: list[RunPlan]) -> list[RunPlan]:
    """The runs seed by seed, each round through every env (as a study file lists them with
    one [[grid]] per seed), instead of env by env: the runs served at once mix short and
    long episodes."""
    by_env: dict[str, list[RunPlan]] = {}
    for run in runs:
        by_env.setdefault(run.env, []).append(run)
    rounds = max(len(group) for group in by_env.values())
    return [group[i] for i in range(rounds) for group in by_env.values() if i < len(group)]


def study_plan(study_name: str, lengths: str, core_hours: float, interleave: bool) -> Plan:
    from master.study.file import load_study

    study = load_study(study_name)
    first = study.runs[0]
    ga = first.config.sections["ga"]
    shape = Shape(ga.population_size, ga.elite_candidates, ga.elite_episodes, first.test_episodes)
    runs = []
    for run in study.runs:
        config = run.config
        own = config.sections.get("ga")
        generation = (
            (own.population_size, own.elite_candidates, own.elite_episodes) if own else None
        )
        if generation != (shape.population, shape.elite_candidates, shape.elite_episodes) or (
            run.test_episodes != shape.test_episodes
        ):
            raise SystemExit(f"run {run.name}: the simulation takes one GA generation for all")
        frames = config.frames or config.generations * shape.tasks * 1000 * FRAME_SKIP
        runs.append(RunPlan(run.name, run.env, int(frames)))
    pools, origin = load_pools(sorted({run.env for run in runs}), lengths)
    runs = interleaved(runs) if interleave else runs
    return Plan(runs, shape, study.max_concurrent_runs, pools, origin, step_ms(core_hours))


def simulate(
    plan: Plan, runs: list[RunPlan], workers: int, cap: int, overlap: bool, scale: float,
    seed: int,
) -> StudyFigures:  # fmt: skip
    scaled = [RunPlan(run.name, run.env, max(1, round(run.frames / scale))) for run in runs]
    sim = StudySimulation(workers, scaled, plan.pools, plan.shape, step_ms=plan.step_ms,
                          overlap=overlap, max_concurrent=cap, seed=seed)  # fmt: skip
    return sim.run()


# ------------------------------------------------------------------------------ table


def table_row(job: tuple[Plan, int, str, int, float, int]) -> dict[str, Any]:
    """One mode on one fleet size: the simulated figures and the whole table's."""
    plan, workers, mode, cap, scale, seed = job
    started = time.perf_counter()
    one_at_a_time = mode != "study"
    # One run at a time: each game's first seed, counted as many times as the game has seeds.
    runs = plan.runs
    if one_at_a_time:
        seen: dict[str, RunPlan] = {}
        for run in runs:
            seen.setdefault(run.env, run)
        runs = list(seen.values())
    figures = simulate(plan, runs, workers, cap, mode != "one-at-a-time", scale, seed)
    sim_work = figures.nominal_s
    table_work = plan.work_s(plan.runs)
    wall_h = figures.wall_s * table_work / sim_work / 3600
    # The estimate's model, fed the simulated runs' own work: how well it predicts this.
    per_run = [plan.work_s([run], scale) / 3600 for run in runs]
    predicted = None
    if not one_at_a_time and (UTILISATION_FILE).exists():
        model = timeline(per_run, cap, workers, utilisation_table())
        predicted = round(model.utilisation, 3)
    return {
        "workers": workers,
        "mode": mode,
        "cap": cap,
        "runs_simulated": len(runs),
        "generations_simulated": sum(r["generations"] for r in figures.runs),
        "utilisation": round(figures.utilisation, 3),
        "busy": round(figures.busy, 3),
        "wall_hours": round(wall_h, 2),
        "simulated_wall_s": round(figures.wall_s, 1),
        "ideal_hours": round(table_work / workers / 3600, 2),
        "backups": figures.backups,
        "estimate_model_utilisation": predicted,
        "sim_s": round(time.perf_counter() - started, 1),
    }


def run_table(args: argparse.Namespace, plan: Plan) -> dict[str, Any]:
    jobs = []
    for workers in args.workers:
        jobs.append((plan, workers, "one-at-a-time", 1, args.scale, args.seed))
        jobs.append((plan, workers, "one-at-a-time-overlap", 1, args.scale, args.seed))
        for cap in args.caps or [plan.cap]:
            jobs.append((plan, workers, "study", cap, args.scale, args.seed))
    rows = _map(table_row, jobs, args.processes)
    print(f"{'workers':>7} {'mode':<22} {'cap':>4} {'util':>6} {'busy':>6} {'hours':>7} "
          f"{'model':>6} {'sim s':>6}")  # fmt: skip
    for row in rows:
        model = row["estimate_model_utilisation"]
        print(f"{row['workers']:>7} {row['mode']:<22} {row['cap']:>4} {row['utilisation']:>6.3f} "
              f"{row['busy']:>6.3f} {row['wall_hours']:>7.2f} "
              f"{'' if model is None else f'{model:.3f}':>6} {row['sim_s']:>6.0f}")  # fmt: skip
    by = {(r["workers"], r["mode"], r["cap"]): r for r in rows}
    gains = {
        str(w): round(by[(w, "one-at-a-time", 1)]["wall_hours"]
                      / by[(w, "one-at-a-time-overlap", 1)]["wall_hours"], 3)
        for w in args.workers
    }  # fmt: skip
    targets = [
        {"cap": r["cap"], "utilisation": r["utilisation"], "wall_hours": r["wall_hours"],
         "utilisation_met": r["utilisation"] >= TARGET_UTILISATION,
         "hours_met": r["wall_hours"] <= TARGET_HOURS}
        for r in rows if r["workers"] == TARGET_WORKERS and r["mode"] == "study"
    ]  # fmt: skip
    for check in targets:
        print(f"{TARGET_WORKERS:,} workers, one study, cap {check['cap']}: utilisation "
              f"{check['utilisation']:.3f} (target {TARGET_UTILISATION}), "
              f"{check['wall_hours']:.2f} h (target {TARGET_HOURS})")  # fmt: skip
    print(
        "the overlap's gain, one run at a time (wall without / with): "
        + ", ".join(f"{w} workers {g:.3f}x" for w, g in gains.items())
    )
    return {"runs": rows, "overlap_gain_one_at_a_time": gains, "targets_1000_workers": targets}


# ------------------------------------------------------------------------------ utilisation


def steady_state(figures: StudyFigures, workers: int) -> tuple[float, float]:
    """(useful worker-seconds, fleet worker-seconds) from the moment every run finished its
    first generation to the first run's last generation."""
    ends = [run["generation_ends"] for run in figures.runs]
    start = max(e[0] for e in ends)
    stop = min(e[-1] for e in ends)
    marks = dict(figures.useful_at)
    if stop <= start:
        raise SystemExit("no steady state: give the runs more generations (--frames)")
    return marks[stop] - marks[start], workers * (stop - start)


def utilisation_cell(job: tuple[Plan, int, int, bool, int, int]) -> dict[str, Any]:
    """u(W, r): r runs served at once, games taken in turn so that every game is in a mix."""
    plan, workers, runs_at_once, overlap, frames, seed = job
    started = time.perf_counter()
    envs = sorted(plan.pools)
    useful = fleet = 0.0
    sets = max(1, -(-len(envs) // runs_at_once))
    for first in range(sets):
        chosen = [envs[(first * runs_at_once + i) % len(envs)] for i in range(runs_at_once)]
        runs = [RunPlan(f"{env}-{i}", env, frames) for i, env in enumerate(chosen)]
        figures = simulate(plan, runs, workers, runs_at_once, overlap, 1.0, seed + first)
        u, f = steady_state(figures, workers)
        useful, fleet = useful + u, fleet + f
    return {
        "workers": workers,
        "runs_at_once": runs_at_once,
        "overlap": overlap,
        "utilisation": round(useful / fleet, 4),
        "sim_s": round(time.perf_counter() - started, 1),
    }


def run_utilisation(args: argparse.Namespace, plan: Plan) -> dict[str, Any]:
    # Each run's frames: the game with the longest episodes plays `--generations` generations.
    longest = max(float(np.mean(pools.offspring)) for pools in plan.pools.values())
    frames = int(args.generations * plan.shape.tasks * longest * FRAME_SKIP)
    jobs = [(plan, w, r, True, frames, args.seed) for w in args.workers for r in args.runs]
    jobs += [(plan, w, 1, False, frames, args.seed) for w in args.workers]
    cells = _map(utilisation_cell, jobs, args.processes)
    grid = {(c["workers"], c["runs_at_once"], c["overlap"]): c["utilisation"] for c in cells}
    print(f"{'workers':>7} " + " ".join(f"{f'r={r}':>7}" for r in args.runs) + "  barrier r=1")
    for w in args.workers:
        print(f"{w:>7} " + " ".join(f"{grid[(w, r, True)]:>7.3f}" for r in args.runs)
              + f"  {grid[(w, 1, False)]:>7.3f}")  # fmt: skip
    return {
        "about": "Utilisation (share of the fleet's worker time spent on results that count) of "
        "W workers serving r runs of the paper's generation at once, steady state, with the "
        "GA's exact overlap; neuro-deploy estimate interpolates it (deploy/fleet.py). "
        "Simulated by driving the master's lease tables and fair-share picker in virtual time.",
        "generation": {
            "population": plan.shape.population,
            "elite_candidates": plan.shape.elite_candidates,
            "elite_episodes": plan.shape.elite_episodes,
        },
        "overlap": True,
        "workers": list(args.workers),
        "runs_at_once": list(args.runs),
        "utilisation": [[grid[(w, r, True)] for r in args.runs] for w in args.workers],
        "one_run_barrier": [grid[(w, 1, False)] for w in args.workers],
        "frames_per_run": frames,
        "cells": cells,
    }


# ------------------------------------------------------------------------------ picker


def picker_cost(runs: int, calls: int, tasks: int) -> float:
    """Seconds of one fair-share lease call taking one task, `runs` runs of `tasks` pending
    tasks each served (this machine's time: the simulation itself charges the master none)."""
    from master.fleet.leases import LeaseTable, PhaseTask
    from master.fleet.shares import FairShare

    shares: FairShare[LeaseTable] = FairShare()
    for r in range(runs):
        phase = [PhaseTask(f"r{r}/{i}", f"r{r}/{i}", GENOME, 1, 0) for i in range(tasks)]
        shares.set_tables(f"r{r}", [LeaseTable(phase, 60.0, 5)])
    started = time.perf_counter()
    for i in range(calls):
        shares.lease(f"w{i}", 1, 0.0, fleet_slots=2 * calls)
    return (time.perf_counter() - started) / calls


def run_picker(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    for runs in args.runs:
        seconds = min(picker_cost(runs, 2000, 1300) for _ in range(3))
        rows.append({"runs": runs, "us_per_lease_call": round(seconds * 1e6, 1)})
        print(f"{runs:>4} runs served: {seconds * 1e6:8.1f} us per lease call")
    return {"picker": rows, "machine": machine()}


# ------------------------------------------------------------------------------ main


def _map(fn: Any, jobs: list, processes: int) -> list:
    if processes <= 1:
        return [fn(job) for job in jobs]
    with mp.get_context("spawn").Pool(processes) as pool:
        return pool.map(fn, jobs, chunksize=1)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("table", "utilisation", "picker"))
    parser.add_argument("--study", default="paper", help="a ready study's name or a file")
    parser.add_argument("--workers", type=int, nargs="+", default=None,
                        help=f"fleet sizes (table: {TABLE_WORKERS}; utilisation: "
                        f"{UTILISATION_WORKERS})")  # fmt: skip
    parser.add_argument(
        "--caps",
        type=int,
        nargs="+",
        default=None,
        help="table: the study's caps on runs at once (default: the file's)",
    )
    parser.add_argument(
        "--scale",
        type=float,
        default=40.0,
        help="table: every run's budget divided by this (default 40)",
    )
    parser.add_argument("--runs", type=int, nargs="+", default=list(RUNS_AT_ONCE),
                        help="utilisation: runs served at once")  # fmt: skip
    parser.add_argument(
        "--generations",
        type=float,
        default=6.0,
        # Runs share the fleet's time, so a long-episode game's generation takes as long as
        # many short-episode ones: with 3, Enduro's first ended after Asterix's last.
        help="utilisation: generations of the longest-episode game per run (with 3, a run of "
        "the shortest-episode game could end before its first: no steady state)",
    )
    parser.add_argument("--lengths", choices=(RANDOM, TRAINED), default=RANDOM)
    parser.add_argument("--interleave", action="store_true",
                        help="table: queue the runs seed by seed, not env by env")  # fmt: skip
    parser.add_argument(
        "--core-hours-per-1b-frames",
        type=float,
        default=None,
        help="the per-step cost (default: the measured int8-static figure)",
    )
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    for name in ("scale", "generations", "processes"):
        if not getattr(args, name) >= 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.workers is None:
        args.workers = list(TABLE_WORKERS if args.command == "table" else UTILISATION_WORKERS)
    if min(args.workers) < 1 or min(args.runs) < 1 or min(args.caps or [1]) < 1:
        parser.error("--workers, --runs and --caps must be >= 1")
    made = provenance(__file__, argv)
    core_hours = args.core_hours_per_1b_frames or measured_core_hours()
    if args.command == "picker":
        result = {**made, **run_picker(args)}
        if args.json:
            write_json(args.json, result)
        return result
    plan = study_plan(args.study, args.lengths, core_hours, args.interleave)
    started, cpu = time.perf_counter(), time.process_time()
    body = run_table(args, plan) if args.command == "table" else run_utilisation(args, plan)
    wall = time.perf_counter() - started
    print(f"simulated in {wall:.0f} s")
    result = {
        **made,
        "step_cost": {
            "core_hours_per_1b_frames": round(core_hours, 2),
            "ms_per_agent_step": round(plan.step_ms, 4),
            "source": f"{STEP_COST_RESULT.relative_to(REPO)}: {'.'.join(STEP_COST_FIELD)}"
            if args.core_hours_per_1b_frames is None
            else "given",
        },
        "study": args.study,
        "queue": "seed by seed" if args.interleave else "the file's order",
        "max_concurrent_runs": plan.cap,
        "runs": len(plan.runs),
        "generation": {
            "population": plan.shape.population,
            "elite_candidates": plan.shape.elite_candidates,
            "elite_episodes": plan.shape.elite_episodes,
            "test_episodes": plan.shape.test_episodes,
        },
        "episode_lengths": {
            "kind": args.lengths,
            "per_env": {
                env: {
                    "file": plan.origin[env],
                    "mean": round(float(np.mean(plan.pools[env].offspring)), 1),
                }
                for env in sorted(plan.pools)
            },
        },
        "scale": args.scale if args.command == "table" else None,
        **body,
        "wall_s": round(wall, 1),
        "cpu_s": round(time.process_time() - cpu, 1),
    }
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
