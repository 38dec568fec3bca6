"""The worker's loop: lease tasks, run them, report; heartbeat while running; hand back on stop.

Two threads: the main thread plays episodes (torch and ALE release the GIL), a link thread
talks to the master (lease ahead, report, heartbeat, reconnect with backoff). Nothing of the
run lives here, so a worker can be killed at any moment and the master re-issues its tasks.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from neuro.allocator import this_process_allocator
from neuro.noise import NoiseTableSpec
from neuro.v1 import evolution_pb2 as pb
from neuro.v1 import evolution_pb2_grpc as pb_grpc
from neuro.wire import MAX_TASKS_PER_LEASE, open_channel
from worker.evaluation.evaluator import Evaluator
from worker.evaluation.spec import EvaluationSpec
from worker.limits import MAX_PARAMS, check_spec
from worker.play.envs import EnvBuildError, NotRunnableHere
from worker.play.rollout import StepTimers
from worker.runners.per_genome import PerGenomeRunner

log = logging.getLogger(__name__)
CALL_TIMEOUT_S = 10.0
MAX_BACKOFF_S = 5.0
HEARTBEAT_MIN_S = 0.5
HEARTBEAT_MAX_S = 300.0
"""A heartbeat goes every quarter lease, kept in this range whatever the master says."""
HEARTBEAT_FALLBACK_S = 5.0
"""The interval when no held task names a usable lease_seconds."""
RETRY_AFTER_RANGE_S = (0.05, 60.0)
"""An empty lease's retry_after_ms, kept in this range: 0 would spin, 2**32 ms is 50 days."""
MAX_ERROR_CHARS = 512
"""A task's error text is sent up to this long (the master keeps no more)."""
MAX_UNSUPPORTED_ENVS = 16
"""Env ids a lease request names as unbuildable here, the most recent ones."""
MAX_TASK_ID_LENGTH = 256
"""The master's own limit on the task ids it accepts back (master.fleet.service)."""
_DYNAMICS = {
    # Unspecified: a non-Atari task, or a master from before the field (the paper's protocol).
    pb.ATARI_DYNAMICS_UNSPECIFIED: "paper",
    pb.ATARI_DYNAMICS_PAPER: "paper",
    pb.ATARI_DYNAMICS_REGISTERED: "registered",
}
_PRESENCE_FINAL = {grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAUTHENTICATED,
                   grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT,
                   grpc.StatusCode.RESOURCE_EXHAUSTED}  # fmt: skip
"""Attach answers that retrying cannot change: an older master, a bad token or id, or a master
watching as many workers as it can (the leases then lapse, as they always did)."""
_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
              grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED}  # fmt: skip


def heartbeat_interval(lease_seconds: Iterable[float]) -> float:
    """Seconds between heartbeats for leases of these lengths (as the master sent them).

    A quarter of the shortest lease, within [HEARTBEAT_MIN_S, HEARTBEAT_MAX_S]: the value comes
    from the master, and NaN would stop heartbeats (and spin the link thread) while 0 would
    send thousands a second. Values that are not positive and finite are ignored.
    """
    usable = [s for s in lease_seconds if math.isfinite(s) and s > 0]
    if not usable:
        return HEARTBEAT_FALLBACK_S
    return min(max(min(usable) / 4.0, HEARTBEAT_MIN_S), HEARTBEAT_MAX_S)


_GENOME_KEYS: OrderedDict[tuple[str, str], Hashable] = OrderedDict()
_GENOME_KEYS_KEPT = 4096


def _genome_key(task: pb.Task) -> Hashable:
    """Which individual a task evaluates (EvaluationSpec.genome_key, the key the runners load
    policies by); remembered per task, since the main loop asks on every step and a late
    genome has hundreds of seeds. A task beyond this worker's limits is an individual of its
    own: it fails when it starts."""
    ident = (task.run_id, task.task_id)
    key = _GENOME_KEYS.get(ident)
    if key is None:
        try:
            key = spec_from_task(task).genome_key
        except ValueError:
            key = ident
        _GENOME_KEYS[ident] = key
        if len(_GENOME_KEYS) > _GENOME_KEYS_KEPT:
            _GENOME_KEYS.popitem(last=False)
    return key


def _dynamics(value: int) -> str:
    """The task's Atari dynamics; ValueError naming a value this worker does not know (a newer
    master's protocol: playing another one would score the genome under other rules)."""
    dynamics = _DYNAMICS.get(value)
    if dynamics is None:
        raise ValueError(f"atari dynamics {value} is not one this worker plays "
                         f"({', '.join(map(str, sorted(_DYNAMICS)))})")  # fmt: skip
    return dynamics


def spec_from_task(task: pb.Task) -> EvaluationSpec:
    """Wire task -> plain evaluation spec; ValueError naming a value beyond this worker's limits."""
    genome = task.genome
    spec = EvaluationSpec(
        env_id=task.env.env_id,
        seeds=tuple(genome.seeds),
        mutation_power=genome.mutation_power,
        noise_table=NoiseTableSpec(genome.noise_table.seed, genome.noise_table.size),
        architecture=task.policy.architecture,
        hidden_sizes=tuple(task.policy.hidden_sizes),
        # Empty: a master from before the field, whose workers all ran float32.
        inference_dtype=task.policy.inference_dtype or "float32",
        atari_dynamics=_dynamics(task.env.atari_dynamics),
        episodes=task.episodes,
        max_episode_steps=task.max_episode_steps,
        env_seed=task.env_seed,
        perturbation=(
            (es.version, es.noise_index, es.sign, es.sigma)
            if task.HasField("perturbation") and (es := task.perturbation)
            else None
        ),
        behaviour_size=task.behaviour_size,
        observation_size=task.perturbation.observation_size,
    )
    return check_spec(spec)


class ParametersUnavailable(Exception):
    """The master no longer serves this parameter version (its update is over)."""


def fetch_parameters(
    stub: pb_grpc.EvolutionStub,
    worker_id: str,
    version: int,
    sha256: str,
    num_params: int | None = None,
) -> np.ndarray:
    """Streams one ES parameter version in chunks and checks it against its sha256.

    `num_params` (the task's values: parameters plus any observation statistics) fixes the
    size; the stream's declared size is checked against it and MAX_PARAMS values before anything
    accumulates.
    """
    request = pb.ParametersRequest(
        protocol_version=pb.PROTOCOL_VERSION_CURRENT, worker_id=worker_id, version=version
    )
    data, total = bytearray(), None
    limit = 4 * MAX_PARAMS
    try:
        for chunk in stub.FetchParameters(request, timeout=CALL_TIMEOUT_S * 6):
            if chunk.offset != len(data) or chunk.version != version:
                raise ValueError(f"parameter chunk at {chunk.offset} out of order")
            if chunk.total_bytes > limit:
                raise ValueError(
                    f"parameters of version {version} declare {chunk.total_bytes} bytes, "
                    f"more than the limit of {limit}"
                )
            if num_params is not None and chunk.total_bytes != 4 * num_params:
                raise ValueError(
                    f"parameters of version {version} declare {chunk.total_bytes} bytes, "
                    f"the task's {num_params} parameters are {4 * num_params}"
                )
            if len(data) + len(chunk.data) > chunk.total_bytes:
                raise ValueError(
                    f"parameters of version {version} overrun their declared "
                    f"{chunk.total_bytes} bytes"
                )
            data += chunk.data
            total, digest = chunk.total_bytes, chunk.sha256
    except grpc.RpcError as error:
        if error.code() == grpc.StatusCode.NOT_FOUND:
            raise ParametersUnavailable(error.details()) from None
        raise
    if total is None or len(data) != total or hashlib.sha256(data).hexdigest() != sha256:
        raise ValueError(f"parameters of version {version} arrived incomplete or altered")
    if digest != sha256:
        raise ParametersUnavailable(f"version {version} changed on the master")
    return np.frombuffer(bytes(data), dtype="<f4").astype(np.float32)


@dataclass
class WorkerCounters:
    tasks_done: int = 0
    tasks_failed: int = 0
    tasks_dropped: int = 0
    frames: int = 0
    reconnects: int = 0


@dataclass
class _Shared:
    inbox: deque = field(default_factory=deque)
    outbox: list = field(default_factory=list)
    running: dict = field(default_factory=dict)
    cancelled: list = field(default_factory=list)
    abandoned: list = field(default_factory=list)
    run_complete: bool = False
    fatal: str | None = None


class WorkerClient:
    """Connects to a master and works until the run completes or stop() is called."""

    def __init__(
        self,
        address: str,
        worker_id: str,
        evaluator: Evaluator,
        prefetch: int = 1,
        give_up_after_s: float = 0.0,
        slots: int = 1,
        stats_path: str | None = None,
        stats_interval_s: float = 5.0,
        token: str | None = None,
        root_certificates: bytes | None = None,
        runner_factory: Callable[[Evaluator, int, StepTimers], Any] | None = None,
    ) -> None:
        self.address = address
        self.worker_id = worker_id
        self.evaluator = evaluator
        self.prefetch = prefetch
        self.give_up_after_s = give_up_after_s
        self.slots = slots
        self.stats_path = stats_path
        self.stats_interval_s = stats_interval_s
        self._token = token  # private and out of __repr__: it must never reach a log line
        self._root_certificates = root_certificates
        self._runner_factory = runner_factory
        self.counters = WorkerCounters()
        self.timers = StepTimers()
        self._stop = threading.Event()
        self._wake = threading.Condition()
        self._shared = _Shared()
        self._presence: Any = None
        """The open Attach call (see _presence_loop), cancelled once the tasks are handed back."""
        self._presence_lock = threading.Lock()
        self._unsupported_envs: dict[str, None] = {}
        """Env ids that failed to build here, oldest first (a dict: an ordered set)."""
        self._stats_failing = False
        """The last stats write failed (its warning is given): the next failure is quiet."""

    def __repr__(self) -> str:
        return f"WorkerClient({self.worker_id!r} -> {self.address}, {self.counters})"

    @property
    def batched(self) -> bool:
        """Runs tasks of different genomes together (worker.runners.batched): it leases and
        starts up to `slots` of them at once, where a PerGenomeRunner runs one genome at a time."""
        return self._runner_factory is not None

    def stop(self) -> None:
        """Stop leasing, abandon the running episode, hand everything back, exit. Signal-safe."""
        self._stop.set()

    def run(self) -> int:
        """Works until done; returns a process exit code."""
        link = threading.Thread(target=self._link_loop, name="master-link", daemon=True)
        presence = threading.Thread(target=self._presence_loop, name="presence", daemon=True)
        link.start()
        presence.start()
        try:
            self._work_loop()
        finally:
            self._stop.set()
            with self._wake:
                self._wake.notify_all()
            link.join(timeout=CALL_TIMEOUT_S * 2)
            # Only now, the tasks handed back: a presence call ending earlier would make the
            # master take them back as a lost worker's, an attempt spent on each.
            with self._presence_lock:
                if self._presence is not None:
                    self._presence.cancel()
            presence.join(timeout=CALL_TIMEOUT_S)
        if self._shared.fatal:
            log.error("worker %s stopped: %s", self.worker_id, self._shared.fatal)
            return 2
        return 0

    # -- main thread: episodes -------------------------------------------------------------

    def _work_loop(self) -> None:
        shared = self._shared
        if self._runner_factory is not None:
            runner = self._runner_factory(self.evaluator, self.slots, self.timers)
        else:
            runner = PerGenomeRunner(self.evaluator, self.slots, self.timers)
        while True:
            with self._wake:
                for task_id in shared.cancelled:
                    if runner.drop(task_id) is not None:
                        self.counters.tasks_dropped += 1
                    shared.running.pop(task_id, None)
                shared.cancelled.clear()
                if self._stop.is_set() or shared.fatal:
                    self._abandon(runner)
                    return
                starting = self._take_startable(runner.free) if shared.inbox else []
                if not starting and not runner.busy:
                    if self._finished():
                        return
                    waited = time.perf_counter()
                    self._wake.wait(0.5)
                    self.timers.wait_s += time.perf_counter() - waited
                    continue
            for task in starting:
                self._start(runner, task)
            if runner.busy:
                finished = runner.step()
                if finished:
                    self._finish(finished)

    def _take_startable(self, free: int) -> list[pb.Task]:
        """Tasks to start now: with slots busy, only more episodes of a running genome.

        Episodes of one genome share a batched forward pass; episodes of different genomes
        would each stream their own weights and slow every step (measured: 1.2 -> 1.6 ms per
        forward of the 4M network with 8 genomes in flight), so those wait their turn.
        """
        shared = self._shared
        if self.batched:  # one forward pass covers every slot, whatever its genome
            starting = [shared.inbox.popleft() for _ in range(min(free, len(shared.inbox)))]
            for task in starting:
                shared.running[task.task_id] = task
            return starting
        running = {_genome_key(t) for t in shared.running.values()}
        starting = []
        for task in list(shared.inbox):
            if len(starting) == free:
                break
            key = _genome_key(task)
            if not running:
                running.add(key)
            if key in running:
                shared.inbox.remove(task)
                shared.running[task.task_id] = task
                starting.append(task)
        return starting

    def _start(self, runner: Any, task: pb.Task) -> None:
        try:
            runner.start(task.task_id, spec_from_task(task))
        except NotRunnableHere as error:
            # No task of this run can run here: it stays held, and is handed back on the way out.
            self._fail(str(error))
        except Exception as error:  # a task that cannot start is reported; the master decides
            if isinstance(error, EnvBuildError):
                self._note_unsupported(task.env.env_id)
            else:
                log.exception("task %s could not start", task.task_id)
            # Bounded: an outsized error would make the report bigger than the master accepts,
            # and the same batch would be resent forever.
            text = str(error)[:MAX_ERROR_CHARS] or type(error).__name__
            result = pb.TaskResult(task_id=task.task_id, run_id=task.run_id, error=text)
            self.counters.tasks_failed += 1
            with self._wake:
                self._shared.running.pop(task.task_id, None)
                self._shared.outbox.append(result)
                self._wake.notify_all()

    def _note_unsupported(self, env_id: str) -> None:
        unsupported = self._unsupported_envs
        unsupported.pop(env_id, None)
        unsupported[env_id] = None
        while len(unsupported) > MAX_UNSUPPORTED_ENVS:
            del unsupported[next(iter(unsupported))]

    def _finish(self, finished: list) -> None:
        results = []
        with self._wake:
            running = self._shared.running
            run_ids = {task_id: running[task_id].run_id for task_id, _ in finished
                       if task_id in running}  # fmt: skip
        for task_id, evaluation in finished:
            if task_id not in run_ids:
                continue  # handed back meanwhile (a stop): the master re-issues it
            result = pb.TaskResult(task_id=task_id, run_id=run_ids[task_id])
            if evaluation.error:
                log.warning("task %s failed mid-episode: %s", task_id, evaluation.error)
                result.error = evaluation.error[:MAX_ERROR_CHARS]
                self.counters.tasks_failed += 1
                results.append(result)
                continue
            result.episode_returns.extend(evaluation.returns)
            result.episode_frames.extend(evaluation.frames)
            result.frames = sum(evaluation.frames)
            if evaluation.behaviours is not None:
                result.behaviours.extend(np.concatenate(evaluation.behaviours).tolist())
            if evaluation.observations is not None:
                sums = result.observation_sums
                sums.count = evaluation.observations.count
                sums.sum.extend(evaluation.observations.total.tolist())
                sums.sum_of_squares.extend(evaluation.observations.squares.tolist())
            self.counters.tasks_done += 1
            self.counters.frames += result.frames
            results.append(result)
        with self._wake:
            for result in results:
                self._shared.running.pop(result.task_id, None)
            self._shared.outbox.extend(results)
            self._wake.notify_all()

    def _abandon(self, runner: Any) -> None:
        """On stop: drop every running episode; the link thread hands the tasks back."""
        shared = self._shared
        for task_id in list(shared.running):
            runner.drop(task_id)
            shared.abandoned.append(task_id)
            self.counters.tasks_dropped += 1
        shared.running.clear()
        self._wake.notify_all()

    def _finished(self) -> bool:
        s = self._shared
        return self._stop.is_set() or s.fatal is not None or (s.run_complete and not s.inbox)

    # -- presence thread: the master knows at once when this worker is gone ----------------

    def _presence_loop(self) -> None:
        """Holds an Attach call open while the worker runs: when this process is killed, or
        its host or network lost, the call ends and the master hands this worker's tasks to
        others at once instead of when their leases lapse. Reconnects with backoff; a master
        without Attach (an older one) leaves the leases to lapse, as before."""
        channel = open_channel(self.address, self._token, self._root_certificates)
        stub = pb_grpc.EvolutionStub(channel)
        request = pb.AttachRequest(protocol_version=pb.PROTOCOL_VERSION_CURRENT,
                                   worker_id=self.worker_id)  # fmt: skip
        backoff = 0.1
        try:
            while not self._stop.is_set():
                call = stub.Attach(request)
                with self._presence_lock:
                    self._presence = call
                    if self._stop.is_set():
                        call.cancel()
                try:
                    for update in call:
                        backoff = 0.1
                        if update.run_complete:
                            with self._wake:
                                self._shared.run_complete = True
                                self._wake.notify_all()
                except grpc.RpcError as error:
                    if self._stop.is_set() or error.code() in _PRESENCE_FINAL:
                        return
                if self._shared.run_complete:
                    return
                self._stop.wait(backoff * random.uniform(0.5, 1.0))
                backoff = min(backoff * 2, MAX_BACKOFF_S)
        finally:
            channel.close()

    # -- link thread: the master ----------------------------------------------------------

    def _link_loop(self) -> None:
        channel = open_channel(self.address, self._token, self._root_certificates)
        stub = pb_grpc.EvolutionStub(channel)
        backoff = 0.1
        unavailable_since: float | None = None
        next_lease = next_heartbeat = next_stats = 0.0
        try:
            while True:
                stopping = self._stop.is_set()
                try:
                    if stopping:
                        self._settle_current()
                    if self._flush_results(stub) and self._idle():
                        # It just ran out of work: ask now, not when an earlier empty lease
                        # said to (the master keeps a phase's last tasks for idle workers).
                        next_lease = 0.0
                    if stopping:
                        self._hand_back(stub)
                        return
                    now = time.monotonic()
                    if now >= next_heartbeat:
                        next_heartbeat = now + self._heartbeat(stub)
                    if now >= next_lease and self._room() > 0:
                        next_lease = now + self._lease(stub)
                    if self.stats_path and now >= next_stats:
                        self.write_stats()
                        next_stats = now + self.stats_interval_s
                    backoff, unavailable_since = 0.1, None
                except grpc.RpcError as error:
                    if error.code() == grpc.StatusCode.UNAUTHENTICATED:
                        # Retrying cannot fix a token; exit so the operator sees it at once.
                        self._fail(
                            "master refused the token (UNAUTHENTICATED): check --token-file, "
                            "NEURO_TOKEN_FILE or NEURO_TOKEN"
                        )
                        return
                    if error.code() not in _RETRYABLE:
                        self._fail(f"master refused: {error.code().name}: {error.details()}")
                        return
                    now = time.monotonic()
                    unavailable_since = unavailable_since or now
                    if self.give_up_after_s and now - unavailable_since > self.give_up_after_s:
                        self._fail(
                            f"master {self.address} unreachable for {self.give_up_after_s:.0f}s"
                        )
                        return
                    if stopping:
                        return  # nobody to hand tasks back to; their leases will lapse
                    self.counters.reconnects += 1
                    log.info(
                        "master unavailable (%s); retrying in %.1fs", error.code().name, backoff
                    )
                    self._stop.wait(backoff * random.uniform(0.5, 1.0))
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
                    continue
                with self._wake:
                    deadline = min(
                        next_heartbeat, next_stats if self.stats_path else next_heartbeat
                    )
                    if self._room() > 0:
                        deadline = min(deadline, next_lease)
                    timeout = deadline - time.monotonic()
                    if not self._stop.is_set() and not self._shared.outbox and timeout > 0:
                        self._wake.wait(timeout)
        finally:
            channel.close()

    def _room(self) -> int:
        """How many more tasks to lease: the slots that can run now plus `prefetch` waiting."""
        shared = self._shared
        if shared.run_complete or shared.fatal:
            return 0
        held = [*shared.inbox, *shared.running.values()]
        # Lease wide only while everything held is several episodes of one genome (an elite's
        # re-evaluation); hoarding tasks of many genomes would run them one after another and
        # leave other workers idle at the end of the phase.
        re_evaluation = len(held) > 1 and len({_genome_key(t) for t in held}) == 1
        width = self.slots if re_evaluation or self.batched else 1
        return min(width + self.prefetch - len(held), MAX_TASKS_PER_LEASE)

    def _settle_current(self) -> None:
        """On stop, let the main thread abandon (or finish) its episode before handing back."""
        deadline = time.monotonic() + CALL_TIMEOUT_S
        with self._wake:
            while self._shared.running and time.monotonic() < deadline:
                self._wake.wait(0.05)

    def stats(self) -> dict:
        """Counters and the time breakdown so far."""
        return {"worker_id": self.worker_id, "slots": self.slots, "time": time.monotonic(),
                "atari_engine": getattr(self.evaluator, "atari_backend", "gym"),
                "inference_engine": getattr(self.evaluator, "inference_engine", "torch"),
                # What each kind of policy ran on ("deepga/int8-static": "onnxruntime").
                "inference_engines": dict(getattr(self.evaluator, "engines_used", {})),
                "allocator": this_process_allocator(),
                **self.counters.__dict__, **self.timers.as_dict()}  # fmt: skip

    def write_stats(self) -> bool:
        """Replaces the stats file atomically, so a reader never sees half of it; False (and a
        warning) if the disk refuses: the stats are a report, never a reason to stop working."""
        path = Path(self.stats_path)
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            tmp.write_text(json.dumps(self.stats(), indent=2))
            os.replace(tmp, path)
        except OSError as error:
            # Once per outage, not every 5 s while a disk stays full.
            report = log.debug if self._stats_failing else log.warning
            report("worker %s: cannot write stats file %s: %s", self.worker_id, path,
                   error.strerror or error)  # fmt: skip
            self._stats_failing = True
            return False
        self._stats_failing = False
        return True

    def _fail(self, reason: str) -> None:
        with self._wake:
            self._shared.fatal = reason
            self._wake.notify_all()

    def _idle(self) -> bool:
        with self._wake:
            return not self._shared.inbox and not self._shared.running

    def _flush_results(self, stub: pb_grpc.EvolutionStub) -> bool:
        """Reports what finished; True if there was anything."""
        with self._wake:
            batch = list(self._shared.outbox)
        if not batch:
            return False
        request = pb.ReportRequest(
            protocol_version=pb.PROTOCOL_VERSION_CURRENT, worker_id=self.worker_id, results=batch
        )
        try:
            stub.Report(request, timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.INVALID_ARGUMENT:
                raise
            # Retrying the same bytes cannot help; the master re-issues the tasks.
            log.error("master rejected results: %s", error.details())
        with self._wake:
            del self._shared.outbox[: len(batch)]
        return True

    def _lease(self, stub: pb_grpc.EvolutionStub) -> float:
        """Tops up the inbox; returns seconds until the next lease attempt."""
        with self._wake:
            wanted = self._room()
        if wanted <= 0:
            return 0.0
        reply = stub.Lease(
            pb.LeaseRequest(
                protocol_version=pb.PROTOCOL_VERSION_CURRENT,
                worker_id=self.worker_id,
                max_tasks=wanted,
                unsupported_env_ids=sorted(self._unsupported_envs),
            ),
            timeout=CALL_TIMEOUT_S,
        )
        tasks = self._with_parameters(stub, self._acceptable(reply.tasks, wanted))
        with self._wake:
            self._shared.inbox.extend(tasks)
            self._shared.run_complete = reply.run_complete
            self._wake.notify_all()
        if reply.tasks:
            return 0.0
        low, high = RETRY_AFTER_RANGE_S
        return min(max(reply.retry_after_ms / 1000.0, low), high)

    def _acceptable(self, tasks, wanted: int) -> list[pb.Task]:
        """The granted tasks this worker takes on; the others' leases lapse on the master."""
        kept = []
        for task in tasks:
            if len(kept) == wanted:
                # More than asked for: holding them would only delay them.
                log.warning("worker %s: master granted %d tasks, %d asked; extra ones skipped",
                            self.worker_id, len(tasks), wanted)  # fmt: skip
                break
            if len(task.task_id) > MAX_TASK_ID_LENGTH:
                # Every report naming it would exceed what the master accepts, and be resent
                # forever.
                log.warning("worker %s: task id of %d characters skipped", self.worker_id,
                            len(task.task_id))  # fmt: skip
                continue
            kept.append(task)
        return kept

    def _with_parameters(self, stub: pb_grpc.EvolutionStub, tasks) -> list[pb.Task]:
        """ES tasks whose parameter version is here (fetched once per version); others as is."""
        kept = []
        for task in tasks:
            if task.HasField("perturbation"):
                es = task.perturbation
                if not self.evaluator.has_parameters(es.version):
                    try:
                        theta = fetch_parameters(
                            stub,
                            self.worker_id,
                            es.version,
                            es.parameters_sha256,
                            # 0: a master that does not say
                            es.num_params + 2 * es.observation_size if es.num_params else None,
                        )
                    except ParametersUnavailable:
                        continue  # a finished update: the master no longer wants this task
                    except ValueError as error:
                        # A damaged transfer must not end the worker: the lease lapses and the
                        # master re-issues the task, to this worker or another.
                        log.warning("worker %s: %s; task %s skipped", self.worker_id, error,
                                    task.task_id)  # fmt: skip
                        continue
                    self.evaluator.set_parameters(es.version, theta)
            kept.append(task)
        return kept

    def _heartbeat(self, stub: pb_grpc.EvolutionStub) -> float:
        """Extends held leases; returns seconds until the next heartbeat."""
        with self._wake:
            held = list(self._shared.inbox) + list(self._shared.running.values())
        if not held:
            return 1.0
        reply = stub.Heartbeat(
            pb.HeartbeatRequest(
                protocol_version=pb.PROTOCOL_VERSION_CURRENT,
                worker_id=self.worker_id,
                task_ids=[t.task_id for t in held],
            ),
            timeout=CALL_TIMEOUT_S,
        )
        dropped = set(reply.dropped_task_ids)
        if dropped or reply.run_complete:
            with self._wake:
                shared = self._shared
                shared.inbox = deque(t for t in shared.inbox if t.task_id not in dropped)
                shared.cancelled.extend(t for t in dropped if t in shared.running)
                shared.run_complete = shared.run_complete or reply.run_complete
                self._wake.notify_all()
        return heartbeat_interval(t.lease_seconds for t in held)

    def _hand_back(self, stub: pb_grpc.EvolutionStub) -> None:
        with self._wake:
            shared = self._shared
            held = [t.task_id for t in shared.inbox] + shared.abandoned + list(shared.running)
            shared.inbox.clear()
            shared.abandoned = []
        if held:
            stub.Release(
                pb.ReleaseRequest(
                    protocol_version=pb.PROTOCOL_VERSION_CURRENT,
                    worker_id=self.worker_id,
                    task_ids=held,
                ),
                timeout=CALL_TIMEOUT_S,
            )
            log.info("handed back %d task(s)", len(held))
