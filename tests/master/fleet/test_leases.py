"""The lease table of one phase: pure bookkeeping driven by an explicit clock."""

from __future__ import annotations

import math

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from master.algorithms.ga import EvaluationRequest, Genome
from master.fleet.leases import Disposition, LeaseCounters, LeaseTable
from master.fleet.phases import FleetSettings, split_into_tasks

LEASE_S = 10.0
GENOME = Genome((1,))


def make_tasks(episodes: dict[str, int], per_task: int = 1):
    requests = [EvaluationRequest(key, GENOME, n) for key, n in episodes.items()]
    return split_into_tasks(requests, FleetSettings("run", 0, episodes_per_task=per_task))


def table(n: int = 4, max_attempts: int = 3) -> LeaseTable:
    """n one-episode tasks with ids k0/0, k1/0, ..."""
    return LeaseTable(make_tasks({f"k{i}": 1 for i in range(n)}), LEASE_S, max_attempts)


def ids(tasks) -> list[str]:
    return [t.task_id for t in tasks]


@pytest.mark.parametrize(
    ("lease_seconds", "max_attempts"), [(0, 1), (-1, 1), (math.inf, 1), (math.nan, 1), (1, 0)]
)
def test_bad_settings_are_refused(lease_seconds, max_attempts):
    with pytest.raises(ValueError):
        LeaseTable(make_tasks({"a": 1}), lease_seconds, max_attempts)


def test_duplicate_task_ids_are_refused():
    tasks = make_tasks({"a": 1})
    with pytest.raises(ValueError, match="unique"):
        LeaseTable(tasks * 2, LEASE_S, 1)


@pytest.mark.parametrize(
    ("asks", "granted"),
    [
        ([1, 1, 1, 1, 1], [["k0/0"], ["k1/0"], ["k2/0"], ["k3/0"], []]),
        ([3, 3], [["k0/0", "k1/0", "k2/0"], ["k3/0"]]),
        ([0, 2, 9], [[], ["k0/0", "k1/0"], ["k2/0", "k3/0"]]),
        ([10], [["k0/0", "k1/0", "k2/0", "k3/0"]]),
    ],
)
def test_lease_hands_out_in_order_up_to_max_tasks(asks, granted):
    t = table()
    assert [ids(t.lease("w", n, now=0.0)) for n in asks] == granted
    leased = sum(len(g) for g in granted)
    assert t.counters == LeaseCounters(pending=4 - leased, leased=leased, done=0, reissued=0)
    assert all(t.holder(i) == "w" for g in granted for i in g)


def test_a_phases_last_tasks_go_to_workers_that_hold_none():
    lease_table = table(5)
    assert ids(lease_table.lease("a", 2, 0.0)) == ["k0/0", "k1/0"]  # running + prefetched
    assert ids(lease_table.lease("b", 2, 0.0)) == ["k2/0", "k3/0"]
    # One task left for two busy workers: a prefetch would make it wait behind a running task
    # while the other worker may already be out of work.
    assert lease_table.lease("a", 1, 0.0) == []
    assert lease_table.lease("b", 1, 0.0) == []
    for task_id in ("k0/0", "k1/0"):
        lease_table.complete_task(task_id, [1.0], 4, "a")
    assert ids(lease_table.lease("a", 2, 0.0)) == ["k4/0"]  # "a" holds none now
    # A lone worker, or enough tasks for every holder: prefetch as usual.
    single = table(2)
    assert ids(single.lease("a", 1, 0.0)) == ["k0/0"]
    assert ids(single.lease("a", 1, 0.0)) == ["k1/0"]


def test_lapsed_lease_is_reissued_to_another_worker():
    t = table(n=2)
    assert ids(t.lease("a", 1, now=0.0)) == ["k0/0"]
    assert ids(t.lease("b", 5, now=LEASE_S - 0.1)) == ["k1/0"]
    assert ids(t.lease("c", 5, now=LEASE_S)) == ["k0/0"]  # the deadline itself lapses
    assert t.holder("k0/0") == "c"
    assert t.counters == LeaseCounters(pending=0, leased=2, done=0, reissued=1)


def test_heartbeat_extends_only_the_holders_lease():
    t = table(n=2)
    t.lease("a", 2, now=0.0)
    assert t.heartbeat("a", ["k0/0"], now=5.0) == []
    assert t.heartbeat("b", ["k1/0"], now=5.0) == ["k1/0"]
    assert t.expire(now=LEASE_S) == 1  # k1/0: b's heartbeat did not extend a's lease
    assert (t.holder("k0/0"), t.holder("k1/0")) == ("a", None)
    assert t.expire(now=5.0 + LEASE_S) == 1
    assert t.counters.reissued == 2


def test_heartbeat_names_tasks_to_drop():
    t = table(n=3)
    t.lease("a", 1, now=0.0)
    t.lease("b", 2, now=0.0)
    t.complete_task("k1/0", [1.0], 10)
    dropped = t.heartbeat("b", ["k1/0", "k2/0", "nope", "k0/0"], now=1.0)
    assert dropped == ["k1/0", "nope", "k0/0"]  # done, unknown, a's
    assert t.holder("k0/0") == "a" and t.holder("k2/0") == "b"


def test_heartbeat_after_a_lapse_reclaims_the_pending_task():
    t = table(n=2)
    t.lease("a", 1, now=0.0)
    t.expire(now=LEASE_S)
    assert t.holder("k0/0") is None and t.counters.pending == 2
    assert t.heartbeat("a", ["k0/0"], now=LEASE_S + 1) == []
    assert t.holder("k0/0") == "a"
    assert ids(t.lease("b", 5, now=LEASE_S + 1)) == ["k1/0"]  # not run twice
    assert t.counters == LeaseCounters(pending=0, leased=2, done=0, reissued=1)


def test_heartbeat_after_reissue_to_another_worker_is_dropped():
    t = table(n=1)
    t.lease("a", 1, now=0.0)
    t.lease("b", 1, now=LEASE_S)
    assert t.heartbeat("a", ["k0/0"], now=LEASE_S + 1) == ["k0/0"]
    assert t.holder("k0/0") == "b"


def test_release_puts_the_holders_tasks_at_the_front():
    t = table(n=4)
    t.lease("a", 2, now=0.0)
    t.lease("b", 1, now=0.0)
    assert t.release("a", ["k1/0", "k2/0", "nope"]) == 1  # k2/0 is b's
    assert t.holder("k1/0") is None and t.holder("k2/0") == "b"
    assert ids(t.lease("c", 1, now=1.0)) == ["k1/0"]
    assert t.counters == LeaseCounters(pending=1, leased=3, done=0, reissued=0)


def test_release_of_a_done_task_does_nothing():
    t = table(n=1)
    t.lease("a", 1, now=0.0)
    t.complete_task("k0/0", [1.0], 3)
    assert t.release("a", ["k0/0"]) == 0
    assert t.counters == LeaseCounters(pending=0, leased=0, done=1, reissued=0)


def test_complete_is_accepted_once_then_duplicate():
    t = table(n=2)
    t.lease("a", 1, now=0.0)
    assert t.complete_task("k0/0", [5.0], 7) is Disposition.ACCEPTED
    assert t.complete_task("k0/0", [9.0], 70) is Disposition.DUPLICATE
    assert t.fail_task("k0/0", "boom") is Disposition.DUPLICATE
    assert t.complete_task("k1/0", [6.0], 8) is Disposition.ACCEPTED  # pending, never leased
    assert t.complete
    assert t.results() == {"k0": [5.0], "k1": [6.0]}
    assert t.frames == 15


@pytest.mark.parametrize(
    "report", [lambda t: t.complete_task("x/0", [1.0], 1), lambda t: t.fail_task("x/0", "e")]
)
def test_unknown_task_is_stale(report):
    t = table(n=1)
    assert report(t) is Disposition.STALE
    assert t.counters == LeaseCounters(pending=1, leased=0, done=0, reissued=0)


@pytest.mark.parametrize("returns", [[], [1.0, 2.0]])
def test_wrong_number_of_returns_names_the_task(returns):
    t = table(n=1)
    t.lease("a", 1, now=0.0)
    with pytest.raises(ValueError, match="k0/0"):
        t.complete_task("k0/0", returns, 1)
    assert t.holder("k0/0") == "a" and t.counters.done == 0


def test_failures_retry_then_record_nan():
    t = LeaseTable(make_tasks({"a": 2}, per_task=2), LEASE_S, max_attempts=3)
    for attempt in range(2):
        assert ids(t.lease("w", 1, now=0.0)) == ["a/0"]
        assert t.fail_task("a/0", f"err{attempt}") is Disposition.ACCEPTED
        assert t.counters == LeaseCounters(pending=1, leased=0, done=0, reissued=0)
    t.lease("w", 1, now=0.0)
    assert t.fail_task("a/0", "err2") is Disposition.ACCEPTED
    assert t.complete and t.errors("a/0") == ["err0", "err1", "err2"]
    assert all(math.isnan(r) for r in t.results()["a"]) and len(t.results()["a"]) == 2
    assert t.frames == 0
    assert t.complete_task("a/0", [1.0, 2.0], 5) is Disposition.DUPLICATE


def test_expiries_count_as_attempts():
    t = table(n=1, max_attempts=3)
    t.lease("w", 1, now=0.0)
    t.fail_task("k0/0", "err")
    t.lease("w", 1, now=0.0)
    t.expire(now=LEASE_S)
    assert not t.complete
    t.lease("w", 1, now=LEASE_S)
    t.expire(now=2 * LEASE_S)
    assert t.complete and math.isnan(t.results()["k0"][0])
    assert ids(t.lease("w", 1, now=2 * LEASE_S)) == []


def test_results_join_tasks_in_episode_order_and_wait_for_completion():
    tasks = make_tasks({"a": 12, "b": 1}, per_task=1)  # a/10 sorts before a/2 as a string
    t = LeaseTable(tasks, LEASE_S, 1)
    with pytest.raises(RuntimeError, match="not complete"):
        t.results()
    for task in reversed(tasks):
        first = int(task.task_id.rsplit("/", 1)[1])
        t.complete_task(task.task_id, [float(first)], 1)
        assert t.complete == (task is tasks[0])
    assert t.results() == {"a": [float(i) for i in range(12)], "b": [0.0]}


def test_frames_sum_only_accepted_results():
    t = LeaseTable(make_tasks({"a": 3}, per_task=2), LEASE_S, 1)
    t.complete_task("a/0", [1.0, 2.0], 30)
    t.complete_task("a/0", [1.0, 2.0], 999)
    t.complete_task("zz/0", [1.0], 999)
    with pytest.raises(ValueError):
        t.complete_task("a/2", [1.0, 2.0], 999)
    assert t.frames == 30
    t.fail_task("a/2", "boom")
    assert t.frames == 30
    joined = t.results()["a"]
    assert joined[:2] == [1.0, 2.0] and math.isnan(joined[2])


# -- the phase's tail: backup copies and workers known to be gone ------------------------------


def test_idle_workers_back_up_the_longest_running_tasks_once_nothing_is_pending():
    t = table(2)
    assert ids(t.lease("w1", 1, now=0.0)) == ["k0/0"]
    assert ids(t.lease("w2", 1, now=1.0)) == ["k1/0"]
    assert t.tail.last_fresh_lease == 1.0
    assert ids(t.lease("w1", 1, now=2.0)) == []  # busy: no copy of anything for it
    assert ids(t.lease("w3", 5, now=3.0)) == ["k0/0"]  # idle: the longest running, once
    assert ids(t.lease("w4", 5, now=3.0)) == ["k1/0"]
    assert ids(t.lease("w5", 5, now=3.0)) == []  # one copy per task
    assert (t.holder("k0/0"), t.backup_holder("k0/0")) == ("w1", "w3")
    assert t.counters == LeaseCounters(pending=0, leased=2, done=0, reissued=0)
    # The copy's result comes first and counts; the first holder's is a duplicate.
    assert t.complete_task("k0/0", [1.0], 10, "w3") is Disposition.ACCEPTED
    assert t.complete_task("k0/0", [9.0], 10, "w1") is Disposition.DUPLICATE
    assert t.heartbeat("w1", ["k0/0"], now=4.0) == ["k0/0"]  # told to drop it
    # Here the first holder wins; its copy hears the task is done.
    assert t.heartbeat("w4", ["k1/0"], now=4.0) == []
    assert t.complete_task("k1/0", [2.0], 10, "w2") is Disposition.ACCEPTED
    assert t.heartbeat("w4", ["k1/0"], now=5.0) == ["k1/0"]
    assert t.complete and t.results() == {"k0": [1.0], "k1": [2.0]}
    assert (t.tail.backups, t.tail.backups_won) == (2, 1)


def test_without_backups_an_idle_worker_waits():
    t = LeaseTable(make_tasks({"k0": 1}), LEASE_S, 3, backups=False)
    t.lease("w1", 1, now=0.0)
    assert ids(t.lease("w2", 1, now=1.0)) == [] and t.tail.backups == 0


def test_pending_counts_the_tasks_waiting_to_be_leased():
    t = table(3)
    assert t.pending == 3
    t.lease("w1", 2, now=0.0)
    assert t.pending == 1
    t.release("w1", ["k0/0"])
    assert t.pending == 2 == t.counters.pending


def test_a_lease_without_backups_hands_out_no_copy_and_lease_backups_only_copies():
    t = table(2)
    assert ids(t.lease("w1", 1, now=0.0)) == ["k0/0"]
    assert ids(t.lease_backups("w2", 1, now=0.5)) == []  # k1/0 is still pending
    assert ids(t.lease("w2", 1, now=1.0, backups=False)) == ["k1/0"]  # pending tasks still go
    assert ids(t.lease("w3", 1, now=2.0, backups=False)) == []  # but never a copy
    assert t.tail.backups == 0
    assert ids(t.lease_backups("w1", 1, now=2.0)) == []  # it holds a task of this table
    assert ids(t.lease_backups("w3", 5, now=2.0)) == ["k0/0"]  # one per call, longest first
    assert ids(t.lease_backups("w4", 5, now=2.0)) == ["k1/0"]
    assert ids(t.lease_backups("w5", 5, now=2.0)) == []  # one copy per task
    assert t.backup_holder("k0/0") == "w3" and t.tail.backups == 2
    no_copies = LeaseTable(make_tasks({"k0": 1}), LEASE_S, 3, backups=False)
    no_copies.lease("w1", 1, now=0.0)
    assert ids(no_copies.lease_backups("w2", 1, now=1.0)) == []


def test_a_gone_worker_loses_its_leases_at_once_and_its_late_result_still_counts():
    t = table(3)
    assert ids(t.lease("w1", 2, now=0.0)) == ["k0/0", "k1/0"]
    assert t.worker_gone("w1") == 2
    assert t.counters == LeaseCounters(pending=3, leased=0, done=0, reissued=2)
    assert ids(t.lease("w2", 3, now=1.0)) == ["k0/0", "k1/0", "k2/0"]  # the lost ones first
    # It was alive after all: its result counts, once.
    assert t.complete_task("k1/0", [1.0], 5, "w1") is Disposition.ACCEPTED
    assert t.complete_task("k1/0", [2.0], 5, "w2") is Disposition.DUPLICATE
    assert t.worker_gone("w9") == 0 and t.tail.workers_lost == 1


def test_a_gone_worker_s_task_not_yet_taken_comes_back_to_it_by_heartbeat():
    t = table(1)
    t.lease("w1", 1, now=0.0)
    t.worker_gone("w1")
    assert t.heartbeat("w1", ["k0/0"], now=1.0) == []
    assert t.holder("k0/0") == "w1" and t.counters.pending == 0


def test_a_backup_that_took_over_is_backed_up_again():
    t = table(1)
    t.lease("w1", 1, now=0.0)
    assert ids(t.lease("w2", 1, now=1.0)) == ["k0/0"]  # the backup copy
    t.worker_gone("w1")
    assert (t.holder("k0/0"), t.backup_holder("k0/0")) == ("w2", None)
    # Its new holder may die too: the next idle worker gets a copy, not an idle wait.
    assert ids(t.lease("w3", 1, now=2.0)) == ["k0/0"] and t.backup_holder("k0/0") == "w3"


def test_no_worker_takes_more_than_its_share_of_what_is_pending():
    t = table(10)
    # As many workers as tasks: one each, none queued behind a running one.
    # Ten workers that ask for two each: one each.
    assert [len(t.lease(f"w{i}", 2, now=0.0, fleet_slots=20)) for i in range(4)] == [1] * 4
    # Six left, three workers asking for four each: two each; unknown slots leave max_tasks.
    assert len(t.lease("w4", 4, now=0.0, fleet_slots=12)) == 2
    # A big worker among small ones: its share follows what it asks for.
    t = table(100)
    assert len(t.lease("gpu", 64, now=0.0, fleet_slots=64 + 30 * 2)) == 52
    assert len(t.lease("cpu", 2, now=0.0, fleet_slots=64 + 30 * 2)) == 1
    assert len(t.lease("w5", 4, now=0.0)) == 4


def test_a_backup_takes_over_when_the_first_holder_is_gone_fails_or_hands_back():
    for end in ("gone", "fail", "release", "lapse"):
        t = table(1, max_attempts=3)
        t.lease("w1", 1, now=0.0)
        assert ids(t.lease("w2", 1, now=LEASE_S / 2)) == ["k0/0"]  # the backup copy
        t.heartbeat("w2", ["k0/0"], now=LEASE_S * 0.9)
        if end == "gone":
            t.worker_gone("w1")
        elif end == "fail":
            t.fail_task("k0/0", "boom", "w1")
        elif end == "release":
            t.release("w1", ["k0/0"])
        else:
            t.expire(now=LEASE_S)  # w1's lease lapses; w2's, extended, does not
        assert (t.holder("k0/0"), t.backup_holder("k0/0")) == ("w2", None), end
        assert t.counters.pending == 0, end
        assert t.complete_task("k0/0", [1.0], 5, "w2") is Disposition.ACCEPTED, end


def test_a_backup_that_fails_lapses_or_is_handed_back_leaves_the_task_where_it_runs():
    for end in ("fail", "release", "lapse", "gone"):
        t = table(1, max_attempts=3)
        t.lease("w1", 1, now=0.0)
        t.lease("w2", 1, now=1.0)
        t.heartbeat("w1", ["k0/0"], now=LEASE_S * 0.95)
        if end == "fail":
            assert t.fail_task("k0/0", "boom", "w2") is Disposition.ACCEPTED
        elif end == "release":
            t.release("w2", ["k0/0"])
        elif end == "lapse":
            t.expire(now=LEASE_S + 1.0)
        else:
            t.worker_gone("w2")
        assert (t.holder("k0/0"), t.backup_holder("k0/0")) == ("w1", None), end
        # It may be backed up again, by another idle worker.
        assert ids(t.lease("w3", 1, now=LEASE_S + 2.0)) == ["k0/0"], end


# -- a worker that fails its tasks ------------------------------------------------------------


def test_a_failed_task_goes_to_another_worker_not_back_to_the_one_that_failed_it():
    t = table(2, max_attempts=3)
    assert ids(t.lease("bad", 1, now=0.0)) == ["k0/0"]
    assert ids(t.lease("good", 1, now=0.0)) == ["k1/0"]
    assert t.fail_task("k0/0", "RuntimeError: CUDA out of memory", "bad") is Disposition.ACCEPTED
    # The good worker holds a task, so it can take this one: the bad one gets nothing.
    assert ids(t.lease("bad", 4, now=1.0)) == []
    assert ids(t.lease_backups("bad", 4, now=1.0)) == []
    assert t.pending == 1
    t.complete_task("k1/0", [1.0], 5, "good")
    assert ids(t.lease("good", 1, now=2.0)) == ["k0/0"]
    assert t.complete_task("k0/0", [2.0], 5, "good") is Disposition.ACCEPTED
    assert t.results() == {"k0": [2.0], "k1": [1.0]}


def test_a_failed_task_is_skipped_while_a_worker_the_caller_names_has_not_failed_it():
    t = table(2, max_attempts=3)
    t.lease("bad", 1, now=0.0)
    t.fail_task("k0/0", "boom", "bad")
    # The queue keeps its order: the task it failed stays first, for the others.
    assert ids(t.lease("bad", 2, now=1.0, workers=["bad", "good"])) == ["k1/0"]
    assert ids(t.lease("good", 2, now=1.0, workers=["bad", "good"])) == ["k0/0"]


def test_a_task_every_known_worker_failed_is_retried_spending_attempts():
    t = table(1, max_attempts=3)
    for attempt in range(3):
        assert ids(t.lease("only", 1, now=0.0, workers=["only"])) == ["k0/0"], attempt
        t.fail_task("k0/0", f"err{attempt}", "only")
    assert t.complete and math.isnan(t.results()["k0"][0])
    # Two workers that both failed it: retried too, never stalled.
    t = table(1, max_attempts=3)
    t.lease("a", 1, now=0.0)
    t.fail_task("k0/0", "boom", "a")
    assert ids(t.lease("a", 1, now=0.0, workers=["a", "b"])) == []
    assert ids(t.lease("b", 1, now=0.0, workers=["a", "b"])) == ["k0/0"]
    t.fail_task("k0/0", "boom", "b")
    assert ids(t.lease("a", 1, now=0.0, workers=["a", "b"])) == ["k0/0"]


def test_backup_copies_that_fail_spend_no_attempt_and_never_go_back_to_their_worker():
    # One healthy worker holds every task; an idle one fails each copy it gets, at once.
    t = table(4, max_attempts=3)
    assert len(t.lease("good", 4, now=0.0)) == 4
    failed = 0
    for step in range(20):
        for task in t.lease("bad", 1, now=1.0 + step / 4):
            assert t.fail_task(task.task_id, "RuntimeError: CUDA out of memory", "bad") is (
                Disposition.ACCEPTED
            )
            failed += 1
    assert failed == 4  # one copy of each task, never the same twice
    assert not t.complete and t.counters.leased == 4
    for task_id in ("k0/0", "k1/0", "k2/0", "k3/0"):
        assert t.complete_task(task_id, [1.0], 5, "good") is Disposition.ACCEPTED
    assert t.results() == {f"k{i}": [1.0] for i in range(4)}
    # Another idle worker may still back a task up after the bad one failed its copy.
    t = table(1)
    t.lease("good", 1, now=0.0)
    t.fail_task(ids(t.lease("bad", 1, now=1.0))[0], "boom", "bad")
    assert ids(t.lease("spare", 1, now=2.0)) == ["k0/0"]


def test_a_lost_presence_spends_no_attempt_when_its_worker_takes_the_tasks_back():
    t = table(2, max_attempts=2)
    t.lease("w1", 2, now=0.0)
    for cycle in range(5):  # its presence call ends again and again; it lives on
        assert t.worker_gone("w1") == 2, cycle
        assert t.heartbeat("w1", ["k0/0", "k1/0"], now=1.0 + cycle) == []
        assert (t.holder("k0/0"), t.holder("k1/0")) == ("w1", "w1")
    assert t.complete_task("k0/0", [1.0], 5, "w1") is Disposition.ACCEPTED
    assert t.complete_task("k1/0", [2.0], 5, "w1") is Disposition.ACCEPTED
    assert t.results() == {"k0": [1.0], "k1": [2.0]}


def test_a_lost_task_leased_again_spends_an_attempt_so_a_task_that_kills_workers_ends():
    t = table(1, max_attempts=3)
    for crash in range(2):
        assert ids(t.lease("w1", 1, now=float(crash))) == ["k0/0"]  # a restarted process
        t.worker_gone("w1")
        assert not t.complete
    assert ids(t.lease("w1", 1, now=2.0)) == ["k0/0"]
    t.worker_gone("w1")
    assert ids(t.lease("w1", 1, now=3.0)) == []  # the third loss is out of attempts
    assert t.complete and math.isnan(t.results()["k0"][0])


WORKERS = st.sampled_from(["w0", "w1", "w2"])
REQUESTS = {"a": 1, "b": 3, "c": 2, "d": 1}


class LeaseMachine(RuleBasedStateMachine):
    """Random worker behaviour; every task must end DONE exactly once, first result wins."""

    @initialize(max_attempts=st.integers(1, 4))
    def setup(self, max_attempts):
        self.tasks = make_tasks(REQUESTS, per_task=2)
        self.ids = st.sampled_from([t.task_id for t in self.tasks] + ["zz/0"])
        self.table = LeaseTable(self.tasks, LEASE_S, max_attempts)
        self.now = 0.0
        self.serial = 0
        self.first: dict[str, tuple[float, ...]] = {}
        self.frames = 0
        self.done = 0
        self.leased_to: dict[str, set[str]] = {t.task_id: set() for t in self.tasks}
        """Workers a task was leased to (or backed up on) and that did not hand it back."""
        self.failed_by: dict[str, set[str]] = {t.task_id: set() for t in self.tasks}

    def _complete(self, task_id: str, worker: str | None = None) -> None:
        task = next((t for t in self.tasks if t.task_id == task_id), None)
        self.serial += 1
        returns = [float(self.serial)] * (task.episodes if task else 1)
        was_done = self.table.counters.done
        disposition = self.table.complete_task(task_id, returns, self.serial, worker)
        if task is None:
            assert disposition is Disposition.STALE
        elif disposition is Disposition.REJECTED:
            assert worker is not None and worker not in self.leased_to[task_id]
            assert task_id not in self.first
        elif disposition is Disposition.ACCEPTED:
            assert task_id not in self.first
            # A result counts only from a worker the task was leased (or backed up) to.
            assert worker is None or worker in self.leased_to[task_id]
            self.first[task_id] = tuple(returns)
            self.frames += self.serial
            assert self.table.counters.done == was_done + 1
        else:
            assert disposition is Disposition.DUPLICATE

    @rule(worker=WORKERS, n=st.integers(0, 4), fleet=st.integers(0, 12))
    def lease(self, worker, n, fleet):
        self.table.expire(self.now)  # what lease() does first, so `pending` is what it sees
        pending = self.table.counters.pending
        granted = self.table.lease(worker, n, self.now, fleet_slots=fleet)
        if fleet:  # never more than its share of what was pending (a backup copy: one)
            assert len(granted) <= max(1, -(-pending * n // max(fleet, n)))
        for task in granted:
            # Its lease, or a backup copy of another worker's running task.
            backup = self.table.backup_holder(task.task_id) == worker
            assert self.table.holder(task.task_id) == worker or backup
            assert not backup or self.table.holder(task.task_id) not in (None, worker)
            # Never a copy of a task it failed.
            assert not backup or worker not in self.failed_by[task.task_id]
            self.leased_to[task.task_id].add(worker)

    @rule(worker=WORKERS)
    def gone(self, worker):
        self.table.worker_gone(worker)
        for task_id in self.leased_to:
            assert worker not in (self.table.holder(task_id), self.table.backup_holder(task_id))

    @rule(worker=WORKERS, data=st.data())
    def complete_from(self, worker, data):
        self._complete(data.draw(self.ids), worker)

    @rule(worker=WORKERS, data=st.data())
    def heartbeat(self, worker, data):
        self.table.heartbeat(worker, data.draw(st.lists(self.ids, max_size=3)), self.now)

    @rule(worker=WORKERS, data=st.data())
    def release(self, worker, data):
        task_ids = data.draw(st.lists(self.ids, max_size=3))
        held = {
            t for t in task_ids if worker in (self.table.holder(t), self.table.backup_holder(t))
        }
        self.table.release(worker, task_ids)
        for task_id in held:
            self.leased_to[task_id].discard(worker)

    @rule(data=st.data())
    def complete(self, data):
        self._complete(data.draw(self.ids))

    @rule(data=st.data())
    def fail(self, data):
        self.table.fail_task(data.draw(self.ids), "boom")

    @rule(worker=WORKERS, data=st.data())
    def fail_from(self, worker, data):
        task_id = data.draw(self.ids)
        if self.table.fail_task(task_id, "boom", worker) is Disposition.ACCEPTED:
            self.failed_by[task_id].add(worker)

    @rule()
    def expire(self):
        self.table.expire(self.now)

    @rule(dt=st.sampled_from([0.5, LEASE_S / 2, LEASE_S]))
    def advance(self, dt):
        self.now += dt

    @invariant()
    def counts_add_up(self):
        c = self.table.counters
        assert c.pending + c.leased + c.done == len(self.tasks)
        assert c.leased == sum(self.table.holder(t.task_id) is not None for t in self.tasks)
        assert c.done >= self.done  # nothing is ever un-done
        # What each worker holds, as the table keeps it to steer leases, is its leases alone.
        expected: dict[str, set[str]] = {}
        for task in self.tasks:
            for worker in (self.table.holder(task.task_id), self.table.backup_holder(task.task_id)):
                if worker is not None:
                    expected.setdefault(worker, set()).add(task.task_id)
        assert self.table._held == expected
        self.done = c.done
        assert self.table.frames == self.frames

    def teardown(self):
        for task in self.tasks:
            self._complete(task.task_id)
        assert self.table.complete and self.table.counters.done == len(self.tasks)
        results = self.table.results()
        assert {k: len(v) for k, v in results.items()} == REQUESTS
        for key in REQUESTS:
            expected = [
                x
                for t in self.tasks
                if t.request_key == key
                for x in self.first.get(t.task_id, (math.nan,) * t.episodes)
            ]
            assert [None if math.isnan(x) else x for x in results[key]] == [
                None if math.isnan(x) else x for x in expected
            ]
        assert self.table.frames == self.frames


LeaseMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_every_task_done_exactly_once = LeaseMachine.TestCase
