"""neuro-worker --device cpu,cpu against a real master: two batched workers, each pinned to its
half of the CPUs, do the run's tasks; SIGTERM to the parent drains both, and it exits 0."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from neuro.cpus import format_cpu_list
from tests.support.harness import live_master
from tests.support.processes import spawn_worker, stop_processes
from tests.support.tiny import tiny_cartpole
from worker.fanout import plan_shares

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        len(os.sched_getaffinity(0)) < 2,
        reason="two workers each pinned to a share of the CPUs need 2 CPUs this process may use",
    ),
]

CHILDREN = ("fan-cpu0", "fan-cpu1")


def children_of(pid: int) -> dict[str, int]:
    """The parent's children, by the --worker-id on their command line."""
    found = {}
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        ids = [argv[i + 1].decode() for i, arg in enumerate(argv[:-1]) if arg == b"--worker-id"]
        found[ids[-1]] = int(child)  # the last --worker-id is the one it goes by
    return found


def thread_cpus(pid: int) -> set[str]:
    """The CPU lists the threads of a process may run on, as /proc writes them."""
    lists = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        line = next(x for x in status.splitlines() if x.startswith("Cpus_allowed_list:"))
        lists.add(line.split(":", 1)[1].strip())
    return lists


async def _fanout_run(tmp_path: Path) -> dict:
    # A run that outlasts the test, so the SIGTERM comes mid-run; a 600 s lease means only a
    # hand-back frees a task within the test.
    config = tiny_cartpole(generations=1000, population_size=12, target_score=None,
                           lease_seconds=600.0)  # fmt: skip
    async with live_master(config, tmp_path / "run") as live:
        fleet = live.trainer.fleet
        released: list[str] = []
        release = fleet.release

        def recording_release(worker_id: str, task_ids) -> int:
            count = release(worker_id, task_ids)
            released.extend([worker_id] * count)
            return count

        fleet.release = recording_release
        log_path = tmp_path / "fanout.log"
        with log_path.open("w") as log_file:
            parent = spawn_worker(live.port, "fan", "--device", "cpu,cpu", "--envs", "2",
                                  "--stats-file", str(tmp_path / "stats.json"),
                                  stderr=log_file)  # fmt: skip
        try:

            def evaluations() -> dict[str, int]:
                return {s.worker_id: s.evaluations for s in fleet.worker_stats(None)}

            def held() -> int:
                # Every table's leases: the running phase's and the next one's played ahead.
                return sum(len(fleet.tasks_leased_to(child)) for child in CHILDREN)

            deadline = time.monotonic() + 180
            while not (len(live.trainer.records) >= 1 and held() >= 1
                       and all(evaluations().get(c, 0) > 0 for c in CHILDREN)):  # fmt: skip
                assert parent.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, log_path.read_text()[-3000:]
                await asyncio.sleep(0.02)
            children = children_of(parent.pid)
            cpus = {name: thread_cpus(pid) for name, pid in children.items()}
            held_before = held()
            signalled = time.monotonic()
            parent.send_signal(signal.SIGTERM)
            while parent.poll() is None and time.monotonic() - signalled < 60:
                await asyncio.sleep(0.05)
            return dict(exit_code=parent.poll(), exit_s=time.monotonic() - signalled,
                        children=children, cpus=cpus, held_before=held_before,
                        held_after=held(), released=released,
                        evaluations=evaluations(), records=list(live.trainer.records),
                        log=log_path.read_text())  # fmt: skip
        finally:
            stop_processes([parent])


def test_two_cpu_workers_each_on_half_the_cpus_work_and_drain_on_sigterm(
    tmp_path: Path, noise_cache: Path
) -> None:
    outcome = asyncio.run(_fanout_run(tmp_path))
    log = outcome["log"]
    assert outcome["exit_code"] == 0, log[-3000:]
    assert outcome["exit_s"] < 30, log[-3000:]
    # Both joined under their own ids, each pinned (every thread) to its half of the CPUs.
    assert sorted(outcome["children"]) == list(CHILDREN)
    halves = [format_cpu_list(share.cpus) for share in plan_shares(["cpu", "cpu"])]
    assert [outcome["cpus"][name] for name in CHILDREN] == [{half} for half in halves]
    for name, half in zip(CHILDREN, halves, strict=True):
        assert f"worker {name} starting on cpu, CPUs {half}, 2 envs" in log
        assert f"worker {name} pinned to CPU" in log
        assert f"worker {name} on cpu exited 0" in log
    # The run's tasks got done by them, none failed.
    assert all(outcome["evaluations"][name] > 0 for name in CHILDREN)
    assert outcome["records"] and all(r.failed_evaluations == 0 for r in outcome["records"])
    # SIGTERM reached both: each handed its tasks back (nothing stays leased under a 600 s
    # lease) and left; the parent waited for them (no child outlives it).
    assert "worker fan: SIGTERM, passed on to its 2 workers" in log
    assert outcome["held_before"] >= 1
    assert outcome["released"] and set(outcome["released"]) <= set(CHILDREN)
    assert outcome["held_after"] == 0
    assert not any(Path(f"/proc/{pid}").exists() for pid in outcome["children"].values())
    for name in ("cpu0", "cpu1"):
        assert (tmp_path / f"stats-{name}.json").exists()
