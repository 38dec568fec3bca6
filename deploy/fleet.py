"""How busy a fleet of W workers is, and how long runs take on it, from the simulator's figures.

deploy/fleet_utilisation.json (written by `python -m bench.fleet_study utilisation`, which
drives the master's real lease tables and fair-share picker in virtual time) holds the share of
a fleet's worker time spent on results that count, for the paper's generation (1,000 offspring
+ 10 x 30 elite episodes, the GA's exact overlap) at several fleet sizes and numbers of runs
served at once. Here that table is read and interpolated, and a study's runs are laid out on a
fleet: every run served gets an equal share of the fleet's useful time (the picker's fair
share levels tasks in flight), the queued ones start as others end. Pure: no AWS, no printing.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

UTILISATION_NAME = "fleet_utilisation.json"
FLEET_SIZES = (10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
"""The fleet sizes `neuro-deploy estimate` compares (up to the stack's 5,000 workers)."""
MAX_FLEET_SIZES = 50
"""Fleet sizes one `estimate` compares at most (--fleet-sizes)."""
COST_TOLERANCE = 0.10
"""The fleet `estimate` suggests: the fastest whose cost is within this share of the cheapest."""


@dataclass(frozen=True)
class UtilisationTable:
    """Utilisation by fleet size (rows) and runs served at once (columns), as simulated."""

    workers: tuple[int, ...]
    runs_at_once: tuple[int, ...]
    utilisation: tuple[tuple[float, ...], ...]
    tasks_per_generation: int
    """One-episode tasks of the simulated generation (1,000 + 10 x 30)."""
    source: str

    def at(self, workers: float, runs: int = 1, tasks_per_generation: int | None = None) -> float:
        """Utilisation of `workers` workers serving `runs` runs at once, interpolated in log
        workers and log runs; a generation of another size counts as the simulated one on a
        fleet scaled by the ratio of their tasks (what matters is tasks per worker). Outside
        the table the nearest edge: beyond its runs at once the last column (more runs only
        fill more tails), beyond its fleets the first or last row."""
        if workers <= 0 or runs < 1:
            raise ValueError(f"workers must be > 0 and runs >= 1, got {workers} and {runs}")
        if tasks_per_generation is not None:
            workers *= self.tasks_per_generation / max(1, tasks_per_generation)
        rows = [_interpolate(self.runs_at_once, row, runs) for row in self.utilisation]
        return _interpolate(self.workers, rows, workers)


def _interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Linear in log x between the table's points, the nearest end outside them."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    x0, x1 = math.log(xs[i - 1]), math.log(xs[i])
    share = (math.log(x) - x0) / (x1 - x0)
    return ys[i - 1] + share * (ys[i] - ys[i - 1])


def utilisation_table(document: dict[str, Any] | None = None) -> UtilisationTable:
    """The packaged deploy/fleet_utilisation.json (or a document of its form), checked."""
    if document is None:
        text = resources.files("deploy").joinpath(UTILISATION_NAME).read_text()
        document = json.loads(text)
    workers = tuple(int(w) for w in document["workers"])
    runs = tuple(int(r) for r in document["runs_at_once"])
    rows = tuple(tuple(float(u) for u in row) for row in document["utilisation"])
    if (
        list(workers) != sorted(set(workers))
        or list(runs) != sorted(set(runs))
        or workers[0] < 1
        or runs[0] < 1
        or len(rows) != len(workers)
        or any(len(row) != len(runs) for row in rows)
        or not all(0.0 < u <= 1.0 for row in rows for u in row)
    ):
        raise ValueError(f"{UTILISATION_NAME}: not a table of utilisations in (0, 1]")
    generation = document["generation"]
    tasks = generation["population"] + generation["elite_candidates"] * generation["elite_episodes"]
    return UtilisationTable(workers, runs, rows, int(tasks), document["command"])


@dataclass(frozen=True)
class Timeline:
    """How a set of runs plays out on a fleet: its span and how busy the fleet was."""

    workers: int
    wall_hours: float
    work_vcpu_hours: float
    run_end_hours: tuple[float, ...]
    """When each run ends, in the given order."""

    @property
    def utilisation(self) -> float:
        """The fleet's worker-hours spent on the runs' work, over the worker-hours it ran."""
        return self.work_vcpu_hours / (self.workers * self.wall_hours)


def timeline(
    work_vcpu_hours: Sequence[float],
    max_concurrent: int,
    workers: int,
    table: UtilisationTable,
    tasks_per_generation: Sequence[int] | None = None,
) -> Timeline:
    """Runs of the given work (vCPU-hours each, in queue order), at most `max_concurrent` at
    once, on `workers` workers: while r runs are served the fleet does useful work at
    workers x utilisation(workers, r) vCPU-hours an hour, shared equally among them."""
    if workers < 1 or max_concurrent < 1 or not work_vcpu_hours:
        raise ValueError(f"workers {workers}, max_concurrent {max_concurrent}, "
                         f"{len(work_vcpu_hours)} runs: each must be >= 1")  # fmt: skip
    if any(not (w > 0 and math.isfinite(w)) for w in work_vcpu_hours):
        raise ValueError("every run's work must be a positive number of vCPU-hours")
    sizes = list(tasks_per_generation or [table.tasks_per_generation] * len(work_vcpu_hours))
    left = dict(enumerate(work_vcpu_hours))
    queue = list(range(len(work_vcpu_hours)))
    active = queue[:max_concurrent]
    del queue[:max_concurrent]
    ends = [0.0] * len(work_vcpu_hours)
    now = 0.0
    while active:
        # The runs served share one utilisation: that of a generation of their mean size.
        size = round(sum(sizes[i] for i in active) / len(active))
        rate = workers * table.at(workers, len(active), size) / len(active)
        first = min(active, key=lambda i: left[i])
        step = left[first] / rate
        now += step
        for i in active:
            left[i] -= step * rate
        ends[first] = now
        active.remove(first)
        for i in [i for i in active if left[i] <= 1e-12 * work_vcpu_hours[i]]:
            ends[i] = now
            active.remove(i)
        while queue and len(active) < max_concurrent:
            active.append(queue.pop(0))
    return Timeline(workers, now, float(sum(work_vcpu_hours)), tuple(ends))
