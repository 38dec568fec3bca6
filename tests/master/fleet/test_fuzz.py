"""Random and malformed messages against a live master on loopback.

Every call ends OK or with a clear status whose details name the offending value; a refused
call leaves the master's state as it was; afterwards a well-behaved worker still finishes the
run. The master serves on this test's event loop; hypothesis runs in a thread and calls it
with a blocking channel.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import grpc
import hypothesis.strategies as st
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings

from master.fleet.service import (
    MAX_EPISODE_FRAMES,
    MAX_EPISODE_RETURN,
    MAX_ID_LENGTH,
    MAX_REQUEST_BYTES,
    MAX_TASKS_PER_LEASE,
)
from neuro.v1 import evolution_pb2 as pb
from neuro.v1 import evolution_pb2_grpc as pb_grpc
from neuro.wire import WORKER_ID_CHARACTERS, worker_id_problem
from tests.support.harness import live_master
from tests.support.tiny import tiny_cartpole

CURRENT = pb.PROTOCOL_VERSION_CURRENT
ACCEPTED = pb.RESULT_DISPOSITION_ACCEPTED
DISPOSITIONS = {ACCEPTED, pb.RESULT_DISPOSITION_DUPLICATE, pb.RESULT_DISPOSITION_STALE,
                pb.RESULT_DISPOSITION_REJECTED}  # fmt: skip
CALL_S = 5.0
SETTLE_S = 5.0
FINISH_S = 30.0
UINT64_MAX = 2**64 - 1
GENERATIONS, POPULATION, CANDIDATES, EPISODES, PER_TASK = 6, 12, 2, 4, 2
PER_GENERATION = POPULATION + CANDIDATES * EPISODES
# A lease outlives the test, so no lease lapses in the background while a refused call is
# compared before and after; the held tasks are released by their holders at the end. No
# target score: a worker holding a task may report any finite return up to
# MAX_EPISODE_RETURN (the master cannot know an env's best score), so a fuzzed score past
# CartPole's 475 would rightly end the run after generation 0, and the generations this test
# counts would depend on which scores the fuzz happened to draw.
CONFIG = {"generations": GENERATIONS, "population_size": POPULATION, "truncation": 3,
          "elite_candidates": CANDIDATES, "elite_episodes": EPISODES,
          "episodes_per_task": PER_TASK, "lease_seconds": 600.0,
          "target_score": None}  # fmt: skip
REQUESTS = {"Lease": pb.LeaseRequest, "Report": pb.ReportRequest,
            "Heartbeat": pb.HeartbeatRequest, "Release": pb.ReleaseRequest,
            "Status": pb.StatusRequest}  # fmt: skip
RESPONSES = {"Lease": pb.LeaseResponse, "Report": pb.ReportResponse,
             "Heartbeat": pb.HeartbeatResponse, "Release": pb.ReleaseResponse,
             "Status": pb.StatusResponse}  # fmt: skip
# Codes that tell the caller what was wrong with its call. UNKNOWN and INTERNAL mean the master
# failed in a way it did not foresee.
CLEAR = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION}


# -- strategies ---------------------------------------------------------------------------

# Each strategy pair is (good, bad): a message is either well formed, or wrong in some fields.
VERSIONS = st.just(CURRENT), st.integers(-(2**31), 2**31 - 1).filter(lambda v: v != CURRENT)
LONG_TEXT = st.text(min_size=MAX_ID_LENGTH + 1, max_size=MAX_ID_LENGTH + 40)
# Worker ids are printable ASCII letters, digits and a few marks; any other text is refused.
WORKER_IDS = (
    st.one_of(st.sampled_from(["w1", "w2", "w3"]),
              st.text(alphabet=sorted(WORKER_ID_CHARACTERS), min_size=1, max_size=20)),
    st.one_of(st.just(""), LONG_TEXT,
              st.text(min_size=1, max_size=20).filter(lambda t: worker_id_problem(t) is not None)),
)  # fmt: skip
MAX_TASKS = (
    st.one_of(st.integers(1, 8), st.just(MAX_TASKS_PER_LEASE)),
    st.one_of(st.just(0), st.integers(MAX_TASKS_PER_LEASE + 1, 2**32 - 1)),
)
# Ids of this run's tasks (g<generation>/<o|e>/<index>/<first episode>), and strangers.
TASK_IDS = (
    st.one_of(
        st.builds(
            "g{}/{}/{}/{}".format,
            st.integers(0, 2),
            st.sampled_from("oe"),
            st.integers(0, POPULATION),
            st.sampled_from([0, PER_TASK, 1]),
        ),
        st.text(min_size=1, max_size=20),
    ),
    st.one_of(st.just(""), LONG_TEXT),
)
SCORES = (
    st.one_of(st.floats(-1e3, 1e3),
              st.sampled_from([0.0, MAX_EPISODE_RETURN, -MAX_EPISODE_RETURN, 5e-324]),
              st.floats(-MAX_EPISODE_RETURN, MAX_EPISODE_RETURN).filter(lambda v: v != 0)),
    st.one_of(st.sampled_from([-0.0, math.nan, math.inf, -math.inf, 1e308, -1e308]),
              st.floats(MAX_EPISODE_RETURN, 1e308, exclude_min=True)),
)  # fmt: skip
FRAMES = (
    st.one_of(st.integers(0, 100), st.integers(0, MAX_EPISODE_FRAMES)),
    st.integers(MAX_EPISODE_FRAMES + 1, UINT64_MAX),
)


def maybe(draw, pair: tuple, wrong: bool) -> Any:
    """A good value, or (when this message is to be wrong) a bad one half of the time."""
    good, bad = pair
    return draw(bad if wrong and draw(st.booleans()) else good)


def episodes_of(task_id: str) -> int:
    """How many episodes a task of this run has, by its id."""
    return PER_TASK if "/e/" in task_id else 1


def task_id(draw, known: list[str], wrong: bool) -> str:
    """A task id: one a lease handed out during this test, or one drawn from TASK_IDS.

    The draws never depend on `known` (hypothesis replays a case and expects the same draws,
    while the ids leased so far change from case to case).
    """
    use_known, index = draw(st.integers(0, 3)) > 0, draw(st.integers(0, 1023))
    drawn = maybe(draw, TASK_IDS, wrong)
    return known[index % len(known)] if known and use_known else drawn


@st.composite
def task_results(draw, run_id: str, known: list[str], wrong: bool) -> pb.TaskResult:
    task = task_id(draw, known, wrong)
    right_count, count = draw(st.integers(0, 3)), draw(st.integers(1, 3))
    episodes = episodes_of(task) if right_count else count
    returns = [maybe(draw, SCORES, wrong) for _ in range(3)][:episodes]
    frames = [maybe(draw, FRAMES, wrong) for _ in range(3)][:episodes]
    total = sum(frames)
    if wrong and draw(st.booleans()):
        shape = draw(st.sampled_from(["no returns", "fewer frames", "more frames", "total"]))
        if shape == "no returns":
            returns = []
        elif shape == "fewer frames":
            frames = frames[1:]
        elif shape == "more frames":
            frames = [*frames, 10]
        else:
            total = draw(st.integers(0, UINT64_MAX).filter(lambda v: v != total))
    message = pb.TaskResult(
        task_id=task,
        run_id=draw(st.sampled_from([run_id, run_id, run_id, "", "another-run"])),
        episode_returns=returns,
        episode_frames=frames,
        frames=min(total, UINT64_MAX),
        error=draw(st.sampled_from(["", "", "", "", "env failed", "\u00e9\x00" * 50])),
    )
    if wrong and draw(st.integers(0, 3)) == 0:
        # What novelty search and normalised ES send, in a run that asks for neither: the
        # statistics and behaviour attacks' values included.
        values = st.sampled_from([0.0, 255.0, 256.0, 1e12, 1e30, 1.7e308, -1e45])
        if draw(st.booleans()):
            message.behaviours.extend(draw(st.lists(values, min_size=1, max_size=8)))
        else:
            message.observation_sums.CopyFrom(pb.ObservationSums(
                count=draw(st.sampled_from([1.0, 4e9, 1e300])),
                sum=draw(st.lists(values, max_size=4)),
                sum_of_squares=draw(st.lists(values, max_size=4)),
            ))  # fmt: skip
    return message


@st.composite
def messages(draw, run_id: str, known: list[str]) -> tuple[str, Any]:
    """A method name and a request for it: well formed, or wrong in some fields."""
    # Leases and reports come most often, so the run moves on through its phases.
    method = draw(st.sampled_from(["Lease", "Lease", "Report", "Report", "Report", "Heartbeat",
                                   "Release", "Status"]))  # fmt: skip
    if method == "Status":
        return method, pb.StatusRequest()
    wrong = draw(st.booleans())
    common = {
        "protocol_version": maybe(draw, VERSIONS, wrong),
        "worker_id": maybe(draw, WORKER_IDS, wrong),
    }
    if method == "Lease":
        return method, pb.LeaseRequest(
            **common,
            max_tasks=maybe(draw, MAX_TASKS, wrong),
            unsupported_env_ids=draw(st.lists(st.sampled_from(["CartPole-v1", "Pong-v4"]))),
        )
    if method == "Report":
        results = draw(st.lists(task_results(run_id, known, wrong), max_size=4))
        return method, pb.ReportRequest(**common, results=results)
    task_ids = [task_id(draw, known, wrong) for _ in range(draw(st.integers(0, 4)))]
    return method, REQUESTS[method](**common, task_ids=task_ids)


@st.composite
def raw_calls(draw, run_id: str, known: list[str]) -> tuple[str, bytes]:
    """A method name and bytes: random, or a message with bytes flipped, cut or added."""
    if draw(st.booleans()):
        return draw(st.sampled_from(sorted(REQUESTS))), draw(st.binary(max_size=64))
    method, message = draw(messages(run_id, known))
    data = bytearray(message.SerializeToString())
    for _ in range(draw(st.integers(1, 3))):
        edit = draw(st.sampled_from(["flip", "cut", "add"]))
        at = draw(st.integers(0, 2**16)) % (len(data) + 1)
        flip, extra = draw(st.integers(1, 255)), draw(st.binary(min_size=1, max_size=4))
        if edit == "flip" and at < len(data):
            data[at] ^= flip
        elif edit == "cut":
            del data[at:]
        elif edit == "add":
            data[at:at] = extra
    return method, bytes(data)


# -- what the master must answer ------------------------------------------------------------


def expected_refusal(method: str, request: Any) -> tuple[grpc.StatusCode, list[str]] | None:
    """The status a request must get and what its details must name; None: it may pass.

    A Report that passes these checks can still be refused for carrying the wrong number of
    episodes for its task, which only the master knows.
    """
    if method == "Status":
        return None
    if request.protocol_version != CURRENT:
        return grpc.StatusCode.FAILED_PRECONDITION, [f"protocol_version {request.protocol_version}"]
    worker = request.worker_id
    if worker_id_problem(worker) is not None:
        return grpc.StatusCode.INVALID_ARGUMENT, ["worker_id", repr(worker[:40])]
    if method == "Lease":
        if not 1 <= request.max_tasks <= MAX_TASKS_PER_LEASE:
            return grpc.StatusCode.INVALID_ARGUMENT, [f"got {request.max_tasks}"]
        return None
    if method == "Report":
        for result in request.results:
            problem = result_problem(result)
            if problem is not None:
                return grpc.StatusCode.INVALID_ARGUMENT, problem
        return None
    for task_id in request.task_ids:
        if not task_id or len(task_id) > MAX_ID_LENGTH:
            return grpc.StatusCode.INVALID_ARGUMENT, ["task_id", repr(task_id[:80])]
    return None


def result_problem(result: pb.TaskResult) -> list[str] | None:
    task_id = result.task_id
    if not task_id or len(task_id) > MAX_ID_LENGTH:
        return ["task_id", repr(task_id[:80])]
    if result.error:
        return None
    returns, frames = list(result.episode_returns), list(result.episode_frames)
    if not returns:
        return [task_id[:80], "no episode_returns"]
    for value in returns:
        if not math.isfinite(value) or (math.copysign(1.0, value) < 0 and value == 0):
            return [task_id[:80], repr(value)]
        if abs(value) > MAX_EPISODE_RETURN:
            return [task_id[:80], repr(value), "2**53"]
    if len(frames) != len(returns):
        return [task_id[:80], f"{len(frames)} episode_frames"]
    if max(frames, default=0) > MAX_EPISODE_FRAMES:
        return [task_id[:80], f"episode_frames {max(frames)}"]
    if sum(frames) != result.frames:
        return [task_id[:80], f"frames {result.frames}"]
    if result.behaviours:
        return [task_id[:80], f"{len(result.behaviours)} behaviour values, the run expects 0"]
    if result.HasField("observation_sums"):
        return [task_id[:80], "observation sums in a run without normalisation"]
    return None


# -- a live master --------------------------------------------------------------------------


class State(NamedTuple):
    """What a refused call must leave as it was."""

    generation: int
    phase: str
    frames: int
    evaluations: int
    run_complete: bool
    elite_score: str
    elite_seeds: tuple[int, ...]
    pending: int
    leased: int
    done: int
    reissued: int
    frames_accepted: int
    records: int

    def tasks(self) -> int:
        return self.pending + self.leased + self.done


@dataclass
class Live:
    """A master on this event loop, called from hypothesis's thread."""

    master: Any
    loop: asyncio.AbstractEventLoop
    channel: grpc.Channel
    run_id: str
    workers: set[str] = field(default_factory=set)
    """Worker ids of calls that went through: the only ones that can hold a task."""
    task_ids: set[str] = field(default_factory=set)
    """Task ids that a call that went through leased or named."""
    leased: set[str] = field(default_factory=set)
    """Task ids that leases handed out."""
    refused: int = 0
    turn: int = 0

    def on_loop(self, function: Callable[[], Any]) -> Any:
        async def call():
            return function()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(CALL_S)

    def settled(self) -> State:
        """The master's state, once no phase change is under way.

        With a phase open and unfinished (or the run over) nothing changes in the background:
        leases outlive the test, so only calls change the state.
        """
        trainer = self.master.trainer
        fleet = trainer.fleet

        def snapshot():
            counters = fleet.counters()
            if counters.pending + counters.leased == 0 and not fleet.run_complete:
                return None
            s = trainer.snapshot()
            # s.workers is left out: a Report refused for a wrong episode count still marks
            # its worker as seen (Fleet.report_many), which is harmless.
            return State(s.generation, s.phase, s.frames, s.evaluations, s.run_complete,
                         repr(s.elite_score), s.elite_seeds, counters.pending,
                         counters.leased, counters.done, counters.reissued,
                         fleet.frames_accepted, len(trainer.records))  # fmt: skip

        for _ in range(int(SETTLE_S / 0.002)):
            if (state := self.on_loop(snapshot)) is not None:
                return state
            time.sleep(0.002)
        raise AssertionError(f"the master did not settle within {SETTLE_S} s")

    def call(self, method: str, payload: Any, raw: bool = False) -> Any:
        """Sends one call, checks the answer and the state against the request; the answer."""
        request = payload
        if raw:
            try:
                request = REQUESTS[method].FromString(payload)
            except DecodeError:
                request = None
        path = f"/neuro.v1.Evolution/{method}"
        if raw:
            send = self.channel.unary_unary(path)
        else:
            send = self.channel.unary_unary(
                path, REQUESTS[method].SerializeToString, RESPONSES[method].FromString
            )
        before = self.settled()
        try:
            response = send(payload, timeout=CALL_S)
        except grpc.RpcError as error:
            self.refused += 1
            check_refusal(error, method, request)
            assert self.settled() == before, f"a refused {method} changed the master's state"
            return None
        if request is None:
            raise AssertionError(f"{method}: unparsable bytes were accepted")
        refusal = expected_refusal(method, request)
        assert refusal is None, f"{method} should have been refused: {refusal}"
        if raw:
            response = RESPONSES[method].FromString(response)
        self.check_answer(method, request, response, before, self.settled())
        return response

    def work(self) -> None:
        """What a good worker does: leases two tasks, reports them and three others seen."""
        lease = pb.LeaseRequest(protocol_version=CURRENT, worker_id="good", max_tasks=2)
        task_ids = [t.task_id for t in self.call("Lease", lease).tasks]
        # In turn, so that a task another worker holds is done too and the phase can end.
        known = sorted(self.task_ids)
        task_ids += [known[(self.turn + i) % len(known)] for i in range(3) if known]
        self.turn += 3
        results = [good_result(task_id, self.run_id, episodes_of(task_id)) for task_id in task_ids]
        report = pb.ReportRequest(protocol_version=CURRENT, worker_id="good", results=results)
        self.call("Report", report)

    def check_answer(self, method: str, request: Any, response: Any, before, after) -> None:
        if method != "Status":
            self.workers.add(request.worker_id)
        if method == "Lease":
            assert len(response.tasks) <= request.max_tasks
            assert all(t.run_id == self.run_id for t in response.tasks)
            assert not (response.run_complete and response.tasks)
            self.leased.update(t.task_id for t in response.tasks)
            self.task_ids.update(self.leased)
        elif method == "Report":
            acks = [(a.task_id, a.disposition) for a in response.acks]
            assert [task_id for task_id, _ in acks] == [r.task_id for r in request.results]
            assert {disposition for _, disposition in acks} <= DISPOSITIONS
        elif method == "Heartbeat":
            assert set(response.dropped_task_ids) <= set(request.task_ids)
            self.task_ids.update(request.task_ids)
        elif method == "Release":
            assert response.released <= len(request.task_ids)
        # No task appears or vanishes within a phase, and counts only grow.
        if (after.generation, after.phase) == (before.generation, before.phase):
            assert after.tasks() == before.tasks() or after.run_complete, (before, after)
        assert after.frames >= before.frames and after.evaluations >= before.evaluations


def check_refusal(error: grpc.RpcError, method: str, request: Any) -> None:
    code, details = error.code(), error.details()
    assert code in CLEAR, f"{method}: {code} {details!r}"
    assert details, f"{method}: {code} without details"
    if request is None:
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert f"not a valid neuro.v1.{method}Request" in details, details
        return
    refusal = expected_refusal(method, request)
    if refusal is None:
        # Only the master knows a task's episode count.
        assert method == "Report" and code == grpc.StatusCode.INVALID_ARGUMENT, details
        assert "episode_returns" in details, details
        assert any(r.task_id[:80] in details for r in request.results), details
        return
    expected_code, names = refusal
    assert code == expected_code, f"{method}: {code} {details!r}, expected {expected_code}"
    for name in names:
        assert name in details, f"{method}: {details!r} does not name {name!r}"


def good_result(task_id: str, run_id: str, episodes: int) -> pb.TaskResult:
    return pb.TaskResult(task_id=task_id, run_id=run_id, episode_returns=[1.0] * episodes,
                         episode_frames=[10] * episodes, frames=10 * episodes)  # fmt: skip


async def finish_run(live: Live) -> pb.StatusResponse:
    """A well-behaved worker: takes back what the fuzz held, then plays until the run ends."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{live.master.port}") as channel:
        stub = pb_grpc.EvolutionStub(channel)
        for worker in sorted(live.workers):
            request = pb.ReleaseRequest(
                protocol_version=CURRENT, worker_id=worker, task_ids=sorted(live.task_ids)
            )
            await stub.Release(request, timeout=CALL_S)
        lease = pb.LeaseRequest(protocol_version=CURRENT, worker_id="good", max_tasks=8)
        while not (response := await stub.Lease(lease, timeout=CALL_S)).run_complete:
            results = [good_result(t.task_id, t.run_id, t.episodes) for t in response.tasks]
            report = pb.ReportRequest(protocol_version=CURRENT, worker_id="good", results=results)
            acks = (await stub.Report(report, timeout=CALL_S)).acks
            assert {a.disposition for a in acks} <= {ACCEPTED}
            if not response.tasks:
                await asyncio.sleep(response.retry_after_ms / 1000)
        status = await stub.Status(pb.StatusRequest(), timeout=CALL_S)
    return status


def run_fuzz(tmp_path, strategy, raw: bool, examples: int) -> None:
    """Fuzzes a fresh master, then checks a well-behaved worker finishes its run."""

    async def main():
        config = tiny_cartpole(**CONFIG)
        async with live_master(config, tmp_path / "run") as live:
            master, training = live.master, live.training
            channel = grpc.insecure_channel(live.address)
            live_calls = Live(master, asyncio.get_running_loop(), channel, config.run_id)

            def work() -> None:
                @settings(max_examples=examples, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck))  # fmt: skip
                @given(st.data())
                def one_call(data):
                    if data.draw(st.integers(0, 3)) == 0:
                        live_calls.work()
                    known = sorted(live_calls.leased)
                    method, payload = data.draw(strategy(live_calls.run_id, known))
                    live_calls.call(method, payload, raw=raw)

                one_call()

            try:
                await asyncio.to_thread(work)
                assert live_calls.refused > 0
                status = await asyncio.wait_for(finish_run(live_calls), FINISH_S)
                records = await asyncio.wait_for(training, CALL_S)
            finally:
                channel.close()
        assert status.run_complete
        assert [r.generation for r in records] == list(range(GENERATIONS))
        assert (status.tasks_pending, status.tasks_leased) == (0, 0)
        assert status.evaluations == records[-1].evaluations == master.trainer.evaluations
        assert status.frames == records[-1].frames == master.trainer.frames
        for record in records:
            # Tasks the fuzz failed count as NaN; a generation with fewer than CANDIDATES
            # scored offspring re-evaluates fewer candidates.
            assert POPULATION <= record.generation_evaluations <= PER_GENERATION

    asyncio.run(main())


def test_random_messages_get_an_answer_or_a_clear_status(tmp_path):
    run_fuzz(tmp_path, messages, raw=False, examples=300)


def test_malformed_bytes_get_a_clear_status(tmp_path):
    run_fuzz(tmp_path, raw_calls, raw=True, examples=300)


# -- single cases -------------------------------------------------------------------------


def drive(scenario, tmp_path) -> None:
    """Runs one scenario against a fresh master, bounded in time, and always stops it."""

    async def main():
        async with live_master(tiny_cartpole(**CONFIG), tmp_path / "run") as live:
            # No client-side size limit: the server's limit is what is tested.
            channel = live.channel(options=[("grpc.max_send_message_length", -1)])
            await asyncio.wait_for(scenario(channel, live.master), FINISH_S)

    asyncio.run(main())


async def leased(stub, max_tasks: int) -> list[pb.Task]:
    request = pb.LeaseRequest(protocol_version=CURRENT, worker_id="w", max_tasks=max_tasks)
    while not (response := await stub.Lease(request, timeout=CALL_S)).tasks:
        await asyncio.sleep(0.005)
    return list(response.tasks)


async def state(stub) -> tuple:
    s = await stub.Status(pb.StatusRequest(), timeout=CALL_S)
    return (s.generation, s.phase, s.frames, s.evaluations, s.tasks_pending, s.tasks_leased,
            s.tasks_done, s.leases_reissued)  # fmt: skip


async def refused(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call
    return error.value


def one_result(task: pb.Task, **fields) -> pb.TaskResult:
    values = {"episode_returns": [1.0], "episode_frames": [10], "frames": 10} | fields
    return pb.TaskResult(task_id=task.task_id, run_id=task.run_id, **values)


def report(stub, results) -> Any:
    request = pb.ReportRequest(protocol_version=CURRENT, worker_id="w", results=results)
    return stub.Report(request, timeout=CALL_S)


@pytest.mark.parametrize(
    ("fields", "detail"),
    [
        ({"episode_returns": [-0.0]}, "-0.0 is negative zero"),
        # Finite, and yet a generation's sums of such returns would not be.
        ({"episode_returns": [1e308]}, "1e+308 is beyond +-9007199254740992 (2**53)"),
        ({"episode_frames": [MAX_EPISODE_FRAMES + 1], "frames": MAX_EPISODE_FRAMES + 1},
         f"episode_frames {MAX_EPISODE_FRAMES + 1}"),
    ],
)  # fmt: skip
def test_negative_zero_huge_returns_and_impossible_frames_are_refused(tmp_path, fields, detail):
    async def scenario(channel, master):
        stub = pb_grpc.EvolutionStub(channel)
        [task] = await leased(stub, 1)
        before = await state(stub)
        error = await refused(report(stub, [one_result(task, **fields)]))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert detail in error.details() and task.task_id in error.details()
        assert await state(stub) == before
        acks = (await report(stub, [one_result(task, episode_returns=[0.0])])).acks
        assert [a.disposition for a in acks] == [ACCEPTED]

    drive(scenario, tmp_path)


def test_frames_that_would_overflow_the_status_counters_are_refused(tmp_path):
    # Every result here adds up, but together they once pushed the frame counter past
    # uint64 and Status failed with UNKNOWN from then on.
    async def scenario(channel, master):
        stub = pb_grpc.EvolutionStub(channel)
        tasks = await leased(stub, MAX_TASKS_PER_LEASE)
        huge = UINT64_MAX // 2
        error = await refused(
            report(stub, [one_result(t, episode_frames=[huge], frames=huge) for t in tasks])
        )
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and str(huge) in error.details()
        biggest = [one_result(t, episode_frames=[MAX_EPISODE_FRAMES], frames=MAX_EPISODE_FRAMES)
                   for t in tasks]  # fmt: skip
        assert {a.disposition for a in (await report(stub, biggest)).acks} == {ACCEPTED}
        s = await stub.Status(pb.StatusRequest(), timeout=CALL_S)
        assert s.frames == master.trainer.frames >= MAX_EPISODE_FRAMES * POPULATION

    drive(scenario, tmp_path)


@pytest.mark.parametrize("method", ["Heartbeat", "Release"])
@pytest.mark.parametrize("task_id", ["", "x" * (MAX_ID_LENGTH + 1)])
def test_heartbeat_and_release_refuse_impossible_task_ids(tmp_path, method, task_id):
    async def scenario(channel, master):
        stub = pb_grpc.EvolutionStub(channel)
        [task] = await leased(stub, 1)
        before = await state(stub)
        request = REQUESTS[method](
            protocol_version=CURRENT, worker_id="w", task_ids=[task.task_id, task_id]
        )
        error = await refused(getattr(stub, method)(request, timeout=CALL_S))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert repr(task_id[:80]) in error.details()
        assert await state(stub) == before

    drive(scenario, tmp_path)


@pytest.mark.parametrize("method", sorted(REQUESTS))
def test_unparsable_bytes_are_invalid_argument(tmp_path, method):
    async def scenario(channel, master):
        stub = pb_grpc.EvolutionStub(channel)
        await leased(stub, 1)
        before = await state(stub)
        call = channel.unary_unary(f"/neuro.v1.Evolution/{method}")
        # A bad tag, a cut varint, and (but for Status, which has no fields) bad UTF-8.
        for data in (b"\xff\xff\xff", b"\x08", b"\x12\x02\xff\xfe")[
            : 2 if method == "Status" else 3
        ]:
            error = await refused(call(data, timeout=CALL_S))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
            assert f"not a valid neuro.v1.{method}Request ({len(data)} bytes)" in error.details()
        assert await state(stub) == before

    drive(scenario, tmp_path)


def test_oversized_message_is_refused_and_the_master_keeps_serving(tmp_path):
    async def scenario(channel, master):
        stub = pb_grpc.EvolutionStub(channel)
        [task] = await leased(stub, 1)
        before = await state(stub)
        big = pb.TaskResult(task_id=task.task_id, run_id=task.run_id, error="x" * (5 << 20))
        error = await refused(report(stub, [big]))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
        assert str(MAX_REQUEST_BYTES) in error.details()
        assert await state(stub) == before
        assert [a.disposition for a in (await report(stub, [one_result(task)])).acks] == [ACCEPTED]

    drive(scenario, tmp_path)
