"""Many runs on one simulated fleet, in virtual time: the event loop bench/fleet_study.py drives.

Each run has its own phases, one lease table (master/fleet/leases.py's LeaseTable) per phase,
as a run's PhaseLoop has; a lease call draws from the table of the run the fleet's picker
(master/fleet/shares.py) chooses, and backup copies go out only once no run has a task
pending. A run is the GA's: generation g's offspring phase (`population` one-episode tasks),
then its elite phase (`elite_candidates` x `elite_episodes` one-episode tasks); with the exact
overlap, from generation 1 on, generation g+1's offspring but the carried elite are leased
while generation g's elite phase runs, after every run's current phase in priority, and the
next offspring phase is what is left of them plus the carried elite's task. When the run's
frame budget is spent (checked at a generation's end, as the master checks it) the final elite
plays `test_episodes` episodes, and the run is done; a study then starts the next queued run.

The workers behave as worker/client/ does and as bench/fleet_sim.py simulates them (its worker
speeds, round trips, prefetch, heartbeats and the master's pacing of idle polls). None dies
here: bench/fleet_sim.py measures deaths. Pure: no sockets, no sleeping, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from bench.fleet_sim import (
    BEAT,
    HEARTBEAT_IDLE_S,
    POLL,
    PREFETCH,
    REPORT,
    RTT_RANGE_S,
    SLOW_FACTOR,
    SLOW_SHARE,
    SPEED_SIGMA,
    SimEvents,
)
from master.fleet.leases import Disposition, LeaseTable, PhaseTask, moving_task_seconds
from master.fleet.pacing import IDLE_POLLS_PER_S
from master.fleet.phases import FleetSettings
from master.fleet.shares import FairShare
from neuro.genome import Genome

FRAME_SKIP = 4
MAX_VIRTUAL_S = 1e9
"""A study still running after this many virtual seconds (31 years) is a simulation bug."""
OFFSPRING, ELITE, TEST, DONE = "offspring", "elite", "test", "done"
GENOME = Genome((0,))


@dataclass(frozen=True)
class Shape:
    """A GA run's generation (the paper's by default) and its final test."""

    population: int = 1000
    elite_candidates: int = 10
    elite_episodes: int = 30
    test_episodes: int = 30

    @property
    def tasks(self) -> int:
        """One-episode tasks a generation takes."""
        return self.population + self.elite_candidates * self.elite_episodes


@dataclass(frozen=True)
class RunPlan:
    """One run of a study: its name, the game whose episode lengths it plays, its budget."""

    name: str
    env: str
    frames: int


@dataclass(frozen=True)
class Pools:
    """Agent steps an offspring's and an elite's (or a test's) episode is drawn from."""

    offspring: np.ndarray
    elite: np.ndarray


@dataclass
class SimRun:
    plan: RunPlan
    pools: Pools
    rng: np.random.Generator
    phase: str = OFFSPRING
    generation: int = 0
    frames: int = 0
    tables: list[LeaseTable] = field(default_factory=list)
    """The current phase's tables: one, or the leased-ahead offspring plus the elite's task."""
    ahead: LeaseTable | None = None
    started_s: float = math.nan
    ended_s: float = math.nan
    generation_ends: list[float] = field(default_factory=list)
    task_s: float | None = None
    """Its seconds per task as the master averages them from results (the picker's weight)."""
    elite_frames: int = 0
    """Its last elite phase's frames: the trainer's guess of what the running one adds."""

    @property
    def leased_tables(self) -> list[LeaseTable]:
        """What the fleet leases from for this run, in priority order: the current phase's
        tables, then the next offspring played ahead."""
        return [*self.tables, *([] if self.ahead is None else [self.ahead])]

    def figures(self) -> dict:
        return {
            "name": self.plan.name,
            "env": self.plan.env,
            "generations": self.generation + 1,
            "frames": self.frames,
            "start_s": self.started_s,
            "end_s": self.ended_s,
            "generation_ends": self.generation_ends,
        }


@dataclass(frozen=True)
class StudyFigures:
    """What one simulated study did: its span, the fleet's time and every run's."""

    workers: int
    wall_s: float
    useful_s: float
    """Worker-seconds of results that counted (the worker's own speed)."""
    wasted_s: float
    """Worker-seconds of copies that did not count: duplicates, stale, dropped by heartbeat,
    and leased-ahead offspring of a run whose budget ended."""
    capacity: float
    """The fleet's speed in nominal workers (sum of 1 / speed factor)."""
    nominal_s: float
    """Worker-seconds of the counted results at the nominal step cost."""
    tasks: int
    backups: int
    lease_calls: int
    runs: list[dict]
    useful_at: list[tuple[float, float]]
    """(virtual time, useful worker-seconds so far) at every generation's end."""

    @property
    def utilisation(self) -> float:
        """Share of the fleet's worker-seconds spent on results that counted."""
        return self.useful_s / (self.workers * self.wall_s)

    @property
    def busy(self) -> float:
        return (self.useful_s + self.wasted_s) / (self.workers * self.wall_s)


class StudySimulation:
    """One study (or one run, or runs one after another: cap 1) on `workers` workers."""

    def __init__(
        self,
        workers: int,
        plans: Sequence[RunPlan],
        pools: dict[str, Pools],
        shape: Shape,
        *,
        step_ms: float,
        overlap: bool,
        max_concurrent: int,
        seed: int,
        lease_s: float = 60.0,
        max_attempts: int = 5,
    ) -> None:
        if workers < 1 or max_concurrent < 1 or not plans:
            raise ValueError(f"workers {workers}, max_concurrent {max_concurrent}, "
                             f"{len(plans)} runs: each must be >= 1")  # fmt: skip
        self.workers, self.shape, self.overlap = workers, shape, overlap
        self.step_s = step_ms / 1000.0
        self.max_concurrent = max_concurrent
        self.lease_s, self.max_attempts = lease_s, max_attempts
        rng = np.random.default_rng(seed)
        speed = rng.lognormal(0.0, SPEED_SIGMA, workers)
        speed[rng.random(workers) < SLOW_SHARE] *= SLOW_FACTOR
        # The measured step cost is the fleet's mean: its speeds sum to `workers` nominal ones.
        speed *= float(np.sum(1.0 / speed)) / workers
        self.speed = speed.tolist()
        self.half_rtt = (rng.uniform(*RTT_RANGE_S, workers) / 2).tolist()
        self.grid = rng.random(workers).tolist()
        self.queued = [
            SimRun(plan, pools[plan.env], np.random.default_rng([seed, index]))
            for index, plan in enumerate(plans)
        ]
        self.queued.reverse()  # popped from the end: file order
        self.active: list[SimRun] = []
        self.finished: list[SimRun] = []
        self.shares: FairShare[LeaseTable] = FairShare()
        """The master's picker over every active run's tables."""
        self.owner: dict[str, tuple[SimRun, LeaseTable]] = {}
        self.useful_of: dict[int, float] = {}
        """Useful worker-seconds recorded per table (by id), so a discarded table's move to
        wasted."""
        self.useful_s = self.wasted_s = self.nominal_s = 0.0
        self.tasks = 0
        self.useful_at: list[tuple[float, float]] = []

    # ---------------------------------------------------------------- the runs' phases

    def _table(self, run: SimRun, key: str, count: int, pool: np.ndarray, first: int = 0):
        steps = run.rng.choice(pool, count).tolist()
        # A task's agent steps ride in its env_seed, which the table never reads: a worker
        # plays a task to its end even after its phase is over, as a real one does.
        tasks = []
        for i, n in zip(range(first, first + count), steps, strict=True):
            task_id = f"{run.plan.name}/{key}/{i}"
            tasks.append(PhaseTask(task_id, task_id, GENOME, 1, int(n)))
        table = LeaseTable(tasks, self.lease_s, self.max_attempts, backups=True)
        for task in tasks:
            self.owner[task.task_id] = (run, table)
        self.useful_of[id(table)] = 0.0
        return table

    def _retire(self, table: LeaseTable, wasted: bool = False) -> None:
        """The table leaves the fleet: later reports of its tasks are stale."""
        for task in table.tasks():
            self.owner.pop(task.task_id, None)
        useful = self.useful_of.pop(id(table))
        if wasted:
            self.useful_s -= useful
            self.wasted_s += useful
        elif not table.complete or any(math.isnan(x) for xs in table.results().values()
                                       for x in xs):  # fmt: skip
            raise AssertionError(f"a phase ended with a task not done exactly once: {table!r}")
        else:
            self.tasks += len(table.tasks())
            self.nominal_s += table.frames / FRAME_SKIP * self.step_s

    def _start_run(self, run: SimRun, t: float) -> None:
        run.started_s = t
        run.tables = [self._table(run, "g0/o", self.shape.population, run.pools.offspring)]
        self.active.append(run)
        self.shares.set_tables(run.plan.name, run.leased_tables)

    def _phase_done(self, run: SimRun, t: float) -> None:
        """The run's current phase is complete: its next one, as the trainer goes on."""
        shape = self.shape
        phase_frames = sum(table.frames for table in run.tables)
        run.frames += phase_frames
        for table in run.tables:
            self._retire(table)
        g = run.generation
        if run.phase == OFFSPRING:
            run.phase = ELITE
            elite_tasks = shape.elite_candidates * shape.elite_episodes
            run.tables = [self._table(run, f"g{g}/e", elite_tasks, run.pools.elite)]
            # As master.run.trainer.Trainer._ahead: nothing ahead of the generation that will
            # likely spend the frames budget.
            last = run.frames + run.elite_frames >= run.plan.frames
            if self.overlap and g >= 1 and not last:
                # The GA draws them at the offspring phase's tell once an elite exists.
                run.ahead = self._table(run, f"g{g + 1}/o", shape.population - 1,
                                        run.pools.offspring)  # fmt: skip
        elif run.phase == ELITE:
            run.elite_frames = phase_frames
            run.generation_ends.append(t)
            self.useful_at.append((t, self.useful_s))
            if run.frames >= run.plan.frames:
                if run.ahead is not None:
                    self._retire(run.ahead, wasted=True)
                    run.ahead = None
                run.phase = TEST
                run.tables = [self._table(run, "test", shape.test_episodes, run.pools.elite)]
            else:
                run.generation = g = g + 1
                run.phase = OFFSPRING
                if run.ahead is not None:
                    carried = self._table(run, f"g{g}/o", 1, run.pools.offspring,
                                          first=shape.population - 1)  # fmt: skip
                    run.tables, run.ahead = [run.ahead, carried], None
                else:
                    pool = run.pools.offspring
                    run.tables = [self._table(run, f"g{g}/o", shape.population, pool)]
        else:
            run.phase, run.tables, run.ended_s = DONE, [], t
            self.active.remove(run)
            self.shares.remove(run.plan.name)
            self.finished.append(run)
            if self.queued:
                self._start_run(self.queued.pop(), t)
            return
        self.shares.set_tables(run.plan.name, run.leased_tables)

    # ---------------------------------------------------------------- the event loop

    def run(self) -> StudyFigures:
        workers, speed, half_rtt, grid = self.workers, self.speed, self.half_rtt, self.grid
        fleet = FleetSettings("sim", 0)
        retry_s = max(fleet.retry_after_ms / 1000.0, workers / IDLE_POLLS_PER_S)
        beat_s = self.lease_s / 4
        names = [f"w{i}" for i in range(workers)]
        running: list[PhaseTask | None] = [None] * workers
        run_token = [0] * workers
        run_started = [0.0] * workers
        inbox: list[list[PhaseTask]] = [[] for _ in range(workers)]
        beating = [False] * workers
        last_ask = [0] * workers
        slots = backups = lease_calls = 0
        events = SimEvents(workers, retry_s, grid, half_rtt)
        # Parked: workers whose last lease came back empty (see bench/fleet_sim.py's `parked`):
        # with nobody dying, what they would get changes only when a phase or a run starts, so
        # they are woken then, each at its own next retry time.
        poll_token, parked = events.poll_token, events.parked
        push, pop = events.push, events.pop
        schedule_poll, wake_all = events.schedule_poll, events.wake_all
        owner, step_s = self.owner, self.step_s

        def start(w: int, task: PhaseTask, t: float) -> None:
            running[w] = task
            run_started[w] = t
            run_token[w] += 1
            finish = t + task.env_seed * step_s * speed[w] + half_rtt[w]
            push(finish, REPORT, w, run_token[w])

        def holding(w: int, t: float) -> None:
            if not beating[w]:
                beating[w] = True
                offset = (grid[w] * HEARTBEAT_IDLE_S - t) % HEARTBEAT_IDLE_S
                push(t + offset, BEAT, w, 0)

        def lease(w: int, room: int, t: float) -> list[PhaseTask]:
            """The master's lease call: the picker's fresh tasks, else backup copies."""
            nonlocal backups
            drawn = self.shares.lease(names[w], room, t, fleet_slots=slots)
            tasks = [task for part in drawn for task in part.tasks]
            backups += sum(len(part.tasks) for part in drawn if part.backup)
            return tasks

        for _ in range(min(self.max_concurrent, len(self.queued))):
            self._start_run(self.queued.pop(), 0.0)
        wake_all(0.0)
        t = 0.0
        while self.active:
            t, _, kind, w, arg = pop()
            if t > MAX_VIRTUAL_S:
                raise RuntimeError(f"study still running at {t:.0f} s")
            if kind == POLL:
                if arg != poll_token[w]:
                    continue
                room = 1 + PREFETCH - len(inbox[w]) - (running[w] is not None)
                if room <= 0:
                    continue
                lease_calls += 1
                slots += room - last_ask[w]
                last_ask[w] = room
                granted = lease(w, room, t)
                if not granted:
                    parked.add(w)
                    continue
                arrives = t + half_rtt[w]
                holding(w, arrives)
                if running[w] is None:
                    start(w, granted.pop(0), arrives)
                inbox[w].extend(granted)
                if room > len(granted):
                    schedule_poll(w, arrives + half_rtt[w])
            elif kind == REPORT:
                if arg != run_token[w]:
                    continue  # dropped on a heartbeat's word
                task = running[w]
                running[w] = None
                seconds = (t - half_rtt[w]) - run_started[w]
                found = owner.get(task.task_id)
                outcome = Disposition.STALE
                if found is not None:
                    run, table = found
                    frames = FRAME_SKIP * task.env_seed
                    outcome = table.complete_task(task.task_id, (0.0,), frames, names[w])
                if outcome is Disposition.ACCEPTED:
                    self.useful_s += seconds
                    self.useful_of[id(table)] += seconds
                    # The master weighs each run's work in flight by its results' busy seconds.
                    run.task_s = moving_task_seconds(run.task_s, seconds)
                    self.shares.set_task_seconds(run.plan.name, run.task_s)
                    if table.complete and all(tb.complete for tb in run.tables):
                        self._phase_done(run, t)
                        wake_all(t)
                else:
                    self.wasted_s += seconds
                finished = t - half_rtt[w]
                if inbox[w]:
                    start(w, inbox[w].pop(0), finished)
                parked.discard(w)
                schedule_poll(w, t + half_rtt[w])
            else:  # BEAT
                held = [task.task_id for task in inbox[w]]
                if running[w] is not None:
                    held.append(running[w].task_id)
                if not held:
                    beating[w] = False
                    continue
                by_table: dict[int, tuple[LeaseTable, list[str]]] = {}
                dropped = set()
                for task_id in held:
                    found = owner.get(task_id)
                    if found is None:
                        dropped.add(task_id)  # its phase is over
                    else:
                        by_table.setdefault(id(found[1]), (found[1], []))[1].append(task_id)
                for table, ids in by_table.values():
                    dropped.update(table.heartbeat(names[w], ids, t))
                if dropped:
                    inbox[w] = [task for task in inbox[w] if task.task_id not in dropped]
                    if running[w] is not None and running[w].task_id in dropped:
                        self.wasted_s += t - run_started[w]
                        running[w] = None
                        run_token[w] += 1
                        if inbox[w]:
                            start(w, inbox[w].pop(0), t + half_rtt[w])
                        parked.discard(w)
                        schedule_poll(w, t + 2 * half_rtt[w])
                push(t + beat_s, BEAT, w, 0)
        return StudyFigures(
            workers=workers,
            wall_s=t,
            useful_s=self.useful_s,
            wasted_s=self.wasted_s,
            capacity=sum(1.0 / s for s in speed),
            nominal_s=self.nominal_s,
            tasks=self.tasks,
            backups=backups,
            lease_calls=lease_calls,
            runs=[run.figures() for run in self.finished],
            useful_at=self.useful_at,
        )
