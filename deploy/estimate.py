"""`neuro-deploy estimate`: what a run or a study would cost on the stack, and on what fleet.

The work is frames / the measured frames per vCPU-hour (deploy/throughput.json); how busy a
fleet of W workers keeps with that work, and so its wall clock, comes from the simulated fleet
(deploy/fleet.py, deploy/fleet_utilisation.json); the prices are AWS's (deploy/cost.py). A
fleet's idle hours are paid for: workers cost W x the wall clock, not the work alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from deploy import cost, fleet, stack
from deploy.cost_commands import prices, template_settings
from deploy.stack import Clients, DeployError
from deploy.study import read_study

EXCLUDED = (
    "not included: S3 storage and requests, CloudWatch Logs, data transfer, the master's EBS "
    "volume, workers pending for Spot capacity (idle workers at phases' ends are counted: "
    "the simulated fleet's utilisation)"
)


@dataclass(frozen=True)
class Budget:
    """What is priced: each run's frames (final tests included) and generation size."""

    words: str
    frames: tuple[float, ...]
    tasks_per_generation: tuple[int, ...]
    max_concurrent: int

    @property
    def total_frames(self) -> float:
        return float(sum(self.frames))


@dataclass(frozen=True)
class FleetOption:
    """One fleet size for the same runs: how busy, how long, how dear."""

    workers: int
    utilisation: float
    wall_hours: float
    worker_usd: float
    master_usd: float | None

    @property
    def total_usd(self) -> float:
        return self.worker_usd + (self.master_usd or 0.0)


def budget_of(args: argparse.Namespace, defaults: dict[str, str]) -> Budget:
    """The runs the flags describe: --study's, or one run of --frames or --generations."""
    if args.study is not None:
        study = read_study(args.study)
        frames = tuple(
            run.budget_frames(args.episode_steps) + run.test_frames(args.episode_steps)
            for run in study.runs
        )
        tests = (
            ""
            if args.episode_steps is not None
            else ("; its runs' final tests not counted (--episode-steps counts them)")
        )
        words = (
            f"{sum(frames):,.0f} frames: study {study.name}, {len(study.runs)} runs, "
            f"{study.max_concurrent_runs} at once{tests}"
        )
        sizes = tuple(run.tasks_per_generation for run in study.runs)
        return Budget(words, frames, sizes, study.max_concurrent_runs)
    population = args.population or int(defaults["Population"])
    if args.generations is not None:
        if args.episode_steps is None:
            raise DeployError("--generations needs --episode-steps (mean agent steps an episode)")
        total = cost.frames_for_generations(args.generations, population, args.episode_steps,
                                            args.elite_candidates, args.elite_episodes)  # fmt: skip
        words = (
            f"{total:,.0f} frames: {args.generations:,} generations x ({population:,} + "
            f"{args.elite_candidates} x {args.elite_episodes} episodes) x "
            f"{args.episode_steps:,g} steps x {cost.FRAME_SKIP} frames"
        )
    else:
        total = cost.PAPER_FRAMES if args.frames is None else args.frames
        words = f"{total:,.0f} frames" + (" (the paper's budget)" if args.frames is None else "")
    tasks = population + args.elite_candidates * args.elite_episodes
    return Budget(words, (float(total),), (tasks,), 1)


def fleet_option(
    budget: Budget,
    rate: cost.Throughput,
    workers: int,
    table: fleet.UtilisationTable,
    price: cost.Price,
    master_price: cost.Price | None,
) -> FleetOption:
    works = [rate.vcpu_hours(frames) for frames in budget.frames]
    line = fleet.timeline(works, budget.max_concurrent, workers, table,
                          budget.tasks_per_generation)  # fmt: skip
    return FleetOption(
        workers=workers,
        utilisation=line.utilisation,
        wall_hours=line.wall_hours,
        worker_usd=workers * line.wall_hours * price.usd,
        master_usd=None if master_price is None else line.wall_hours * master_price.usd,
    )


def soonest_for_the_money(options: Sequence[FleetOption]) -> FleetOption:
    """The fastest fleet whose total is within fleet.COST_TOLERANCE of the cheapest."""
    cheapest = min(option.total_usd for option in options)
    affordable = [o for o in options if o.total_usd <= cheapest * (1 + fleet.COST_TOLERANCE)]
    return min(affordable, key=lambda o: (o.wall_hours, o.total_usd))


def cmd_estimate(
    clients: Clients | None, args: argparse.Namespace, out: Callable[[str], None]
) -> int:
    defaults = cost.template_parameter_defaults(stack.template_body())
    if args.study is not None and args.population is not None:
        raise DeployError("--population goes with --generations: a study sets its own")
    if args.study is None and args.generations is None and args.episode_steps is not None:
        raise DeployError("--population and --episode-steps go with --generations")
    if args.generations is None and args.population is not None:
        raise DeployError("--population and --episode-steps go with --generations")
    settings = template_settings(args, defaults)
    budget = budget_of(args, defaults)
    # The table's default is the master's on CPU workers (neuro.inference.default_dtype).
    network, dtype = cost.throughput_table()["default"].split("/")
    rate = cost.throughput(f"{args.network or network}/{args.inference_dtype or dtype}")
    region = clients.region if clients is not None else "-"
    worker_price, master_price, unpriced = prices(clients, args, settings, region)
    table = fleet.utilisation_table()
    workers = settings["workers"]
    chosen = fleet_option(budget, rate, workers, table, worker_price, master_price)
    result = cost.cost(budget.total_frames, rate, workers, worker_price, master_price,
                       utilisation=chosen.utilisation)  # fmt: skip
    sizes = sorted(set(args.fleet_sizes or fleet.FLEET_SIZES))
    options = [fleet_option(budget, rate, w, table, worker_price, master_price) for w in sizes]
    suggested = soonest_for_the_money(options)
    total = result.worker_usd + (result.master_usd or 0.0)
    # The flags' bounds keep every figure finite; a price AWS sent is checked here.
    figures = [result.vcpu_hours, result.wall_hours, total,
               *(o.total_usd for o in options)]  # fmt: skip
    if not all(map(math.isfinite, figures)):
        raise DeployError(
            f"no finite estimate: {budget.total_frames:g} frames at {worker_price.usd:g} USD "
            f"per vCPU-hour ({worker_price.source})"
        )
    runs = len(budget.frames)
    at_once = min(runs, budget.max_concurrent)
    if args.json:
        # allow_nan=False: the output is JSON, never a NaN or Infinity no parser accepts.
        out(json.dumps({
            "settings": settings,
            "budget": {"runs": runs, "max_concurrent_runs": budget.max_concurrent,
                       "frames": list(budget.frames)},
            "throughput": dataclasses.asdict(rate),
            "worker_price": worker_price.__dict__,
            "master_price": master_price and master_price.__dict__,
            "master_unpriced": unpriced,
            "cost": result.__dict__,
            "total_usd": total,
            "fleet": {"source": table.source, "runs_at_once": at_once},
            "fleet_sizes": [{**o.__dict__, "total_usd": o.total_usd} for o in options],
            "suggested_workers": suggested.workers,
            "region": region,
        }, sort_keys=True, allow_nan=False))  # fmt: skip
        return 0
    out(f"budget: {budget.words}")
    out(
        f"throughput: {rate.frames_per_s_per_vcpu:,.0f} training frames/s per vCPU, {rate.key} "
        f"(deploy/throughput.json: measured {rate.measured} on {rate.machine})"
    )
    out(
        f"compute: {result.vcpu_hours:,.2f} vCPU-hours of workers' work "
        f"({rate.core_hours_per_1b_frames:g} per 1B frames)"
    )
    for other in rate.elsewhere:
        # The same run at another host's measured rate: per-vCPU speed is the host's.
        hours = other.vcpu_hours(budget.total_frames)
        out(
            f"  measured elsewhere: {other.frames_per_s_per_vcpu:,.0f} frames/s per vCPU on "
            f"{other.machine} ({other.measured}): {hours:,.2f} vCPU-hours, "
            f"{hours / result.utilisation * worker_price.usd:,.2f} USD of workers at the price "
            "below"
        )
    out(
        f"fleet: {workers:,} workers busy {result.utilisation:.1%} of the time with {at_once} "
        f"run{'s' * (at_once > 1)} served at once (simulated: deploy/fleet_utilisation.json)"
    )
    out(
        f"wall clock: {result.wall_hours:,.2f} h at {result.workers:,} workers "
        f"({settings['capacity']}, 1 vCPU and {settings['worker_memory']} MiB each)"
    )
    out(
        f"worker price: {worker_price.usd:.4f} USD per vCPU-hour, {worker_price.source}, "
        f"as of {worker_price.as_of}"
    )
    out(
        f"workers: {result.worker_usd:,.2f} USD ({workers:,} x {result.wall_hours:,.2f} h, "
        "idle hours included)"
    )
    master = f"master: {settings['master_instance_type']} on demand for {result.wall_hours:,.2f} h"
    if master_price is None or result.master_usd is None:
        out(f"{master}: excluded ({unpriced})")
        out(f"total: {total:,.2f} USD (workers only)")
    else:
        out(
            f"{master} at {master_price.usd:.4f} USD per hour ({master_price.source}, as of "
            f"{master_price.as_of}): {result.master_usd:,.2f} USD"
        )
        out(f"total: {total:,.2f} USD")
    for line in describe_options(options, suggested, master_price is not None):
        out(line)
    out(EXCLUDED)
    return 0


def describe_options(
    options: Sequence[FleetOption], suggested: FleetOption, master_priced: bool
) -> list[str]:
    """The fleet-size table and the suggestion, as `estimate` prints them."""
    what = "total USD" if master_priced else "workers USD"
    lines = [f"fleet sizes: {'workers':>8} {'busy':>6} {'wall h':>9} {what:>13}"]
    for option in options:
        mark = "  <- soonest for the money" if option is suggested else ""
        lines.append(
            f"             {option.workers:>8,} {option.utilisation:>6.1%} "
            f"{option.wall_hours:>9,.2f} {option.total_usd:>13,.2f}{mark}"
        )
    lines.append(
        f"soonest for the money: {suggested.workers:,} workers, {suggested.wall_hours:,.2f} h, "
        f"{suggested.total_usd:,.2f} USD (the fastest within {fleet.COST_TOLERANCE:.0%} of the "
        "cheapest fleet above)"
    )
    return lines
