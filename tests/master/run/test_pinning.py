"""Pinned workers: neuro-worker --cpu, and the CPUs neuro-master gives its local workers."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from master.run.local_workers import LocalWorkers, local_worker_cpus
from neuro.cpus import format_cpu_list, parse_cpu_list
from tests.support.harness import live_master
from tests.support.processes import spawn_worker, stop_processes
from tests.support.tiny import long_elite_tasks
from worker.cli import worker_parser, worker_settings

ALLOWED = sorted(os.sched_getaffinity(0))


def settings_of(*argv: str):
    parser = worker_parser()
    return worker_settings(parser, parser.parse_args(["--master", "127.0.0.1:1", *argv]))


def test_a_worker_takes_a_cpu_it_may_run_on_and_refuses_others(capsys, monkeypatch):
    assert settings_of("--cpu", str(ALLOWED[-1])).cpus == (ALLOWED[-1],)
    assert settings_of().cpus is None
    monkeypatch.setenv("NEURO_CPU", str(ALLOWED[0]))
    assert worker_parser().parse_args([]).cpu == (ALLOWED[0],)
    outside = ALLOWED[-1] + 1000
    with pytest.raises(SystemExit):
        settings_of("--cpu", str(outside))
    error = capsys.readouterr().err
    assert f"--cpu (or NEURO_CPU) {outside} is not a CPU this process may run on" in error
    assert f"allowed: {format_cpu_list(ALLOWED)}" in error
    with pytest.raises(SystemExit):
        settings_of("--cpu", f"{ALLOWED[0]},{outside}-{outside + 1}")
    error = capsys.readouterr().err
    assert f"names {outside}-{outside + 1}, not CPUs this process may run on" in error
    with pytest.raises(SystemExit):
        settings_of("--cpu", "one")
    assert "argument --cpu: invalid cpu_list value: 'one'" in capsys.readouterr().err


def test_a_cpu_list_pins_a_worker_to_a_share_of_the_cpus():
    assert settings_of("--cpu", format_cpu_list(ALLOWED)).cpus == tuple(ALLOWED)


@pytest.mark.parametrize(
    ("argv", "threads"),
    [
        (["--device", "cpu", "--envs", "4"], 1),  # the CPU batched worker: one emulator thread
        (["--device", "cpu", "--envs", "4", "--cpu", format_cpu_list(ALLOWED)],
         min(4, len(ALLOWED))),  # pinned to a share: one per CPU of it
        (["--device", "cpu", "--envs", "4", "--cpu", str(ALLOWED[0])], 1),
    ],
)  # fmt: skip
def test_a_pinned_batched_worker_steps_its_emulators_on_its_own_cpus(argv, threads, monkeypatch):
    from worker.cli.work import _batched_runner

    built = []
    monkeypatch.setattr("worker.runners.batched.BatchedRunner",
                        lambda *args, **kwargs: built.append(args))  # fmt: skip
    _batched_runner(settings_of(*argv))(None, 4, None)
    ((_, capacity, device, _, env_threads),) = built
    assert (capacity, device, env_threads) == (4, "cpu", threads)


@pytest.mark.parametrize(
    ("count", "dtype", "worker_arg", "allowed", "cpus"),
    [
        (2, "float32", [], [0, 1], (0, 1)),
        (2, "float32", [], [4, 6, 7], (4, 6)),  # a cpuset's own CPUs, in order
        (1, "int8", [], [0, 1], (0,)),  # a CPU worker either way (local_worker_args)
        (1, "float32", [], [0, 1], ()),  # may be a CUDA host's batched worker: every core
        (3, "float32", [], [0, 1], ()),  # more workers than CPUs: the scheduler shares them
        (0, "float32", [], [0, 1], ()),
        (2, "float32", ["--device", "cuda"], [0, 1], ()),  # the user placed them
        (2, "float32", ["--envs=8"], [0, 1], ()),
        (2, "float32", ["--cpu", "1"], [0, 1], ()),
    ],
)
@pytest.mark.parametrize("architecture", ["deepga", "mlp"])
def test_local_workers_are_pinned_one_per_cpu_when_they_are_per_core_workers(
    count, dtype, worker_arg, allowed, cpus, architecture, monkeypatch
):
    monkeypatch.setattr("master.run.local_workers._sibling_rank", lambda cpu: 0)
    assert local_worker_cpus(worker_arg, count, dtype, architecture, allowed) == cpus


@pytest.mark.parametrize(
    ("ranks", "cpus"),
    [
        ({0: 0, 1: 0, 2: 1, 3: 1}, (0, 1)),  # siblings numbered after all cores: 0/2, 1/3
        ({0: 0, 1: 1, 2: 0, 3: 1}, (0, 2)),  # siblings numbered next to each other: 0/1, 2/3
    ],
)
def test_local_workers_take_one_thread_of_every_core_before_a_sibling(ranks, cpus, monkeypatch):
    monkeypatch.setattr("master.run.local_workers._sibling_rank", ranks.__getitem__)
    assert local_worker_cpus([], 2, "float32", "deepga", [0, 1, 2, 3]) == cpus
    assert len(set(local_worker_cpus([], 4, "float32", "deepga", [0, 1, 2, 3]))) == 4


@pytest.mark.parametrize(
    ("worker_arg", "count", "dtype", "cpus", "gpus", "line"),
    [
        ([], 1, "float32", (), 4, "1 local worker: the batched worker, one process per GPU "
         "(4 GPUs listed by the NVIDIA driver here), each pinned to its share of the cores"),
        ([], 1, "float32", (), 1, "1 local worker: the batched worker on this host's GPU"),
        ([], 1, "float32", (), None, "1 local worker, device auto: the batched worker where "
         "torch sees a GPU (one process per GPU), else a per-genome CPU worker"),
        # --local-workers > 1 keeps meaning per-core CPU workers, GPUs or not.
        ([], 3, "float32", (0, 1, 2), 4, "3 local workers: per-core CPU workers (--device cpu), "
         "pinned to CPUs 0-2"),
        ([], 1, "int8", (5,), 4, "1 local worker: a per-core CPU worker (--device cpu), pinned "
         "to CPUs 5"),
        ([], 40, "float32", (), None, "40 local workers: per-core CPU workers (--device cpu), "
         "not pinned"),
        (["--device=cuda:1"], 1, "float32", (), 4, "1 local worker, placed by --worker-arg: "
         "--device=cuda:1"),
    ],
)  # fmt: skip
def test_the_master_says_what_its_local_workers_will_be(worker_arg, count, dtype, cpus, gpus,
                                                        line):  # fmt: skip
    from master.run.local_workers import describe_local_workers

    assert describe_local_workers(worker_arg, count, dtype, "deepga", cpus, gpus).startswith(line)


def test_the_gpus_the_driver_lists(tmp_path: Path):
    from master.run.local_workers import listed_gpus

    assert listed_gpus(tmp_path / "absent") is None
    assert listed_gpus(tmp_path) is None  # a driver that lists none
    for address in ("0000:17:00.0", "0000:65:00.0"):
        (tmp_path / address).mkdir()
    assert listed_gpus(tmp_path) == 2


def test_cpu_lists_read_and_written_as_the_kernel_writes_them():
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpu_list([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert format_cpu_list([5]) == "5" and format_cpu_list([]) == ""
    assert parse_cpu_list("5") == [5]
    with pytest.raises(ValueError):
        parse_cpu_list("a-b")


def test_local_workers_start_with_their_cpus_and_without_the_masters_neuro_cpu(monkeypatch):
    started = []
    monkeypatch.setenv("NEURO_CPU", "0")
    monkeypatch.setattr("master.run.local_workers._worker_installed", lambda: True)
    monkeypatch.setattr("neuro.allocator.tcmalloc_installed", lambda: False)
    monkeypatch.setattr("master.run.local_workers.subprocess.Popen",
                        lambda command, env, **output: started.append((command, env)))  # fmt: skip
    LocalWorkers("127.0.0.1:1", 2, ("--slots", "2"), cpus=(1, 0)).start()
    for (command, env), cpu in zip(started, ("1", "0"), strict=True):
        assert command[command.index("--cpu") + 1] == cpu
        assert "NEURO_CPU" not in env
    with pytest.raises(ValueError, match="2 local workers need 2 CPUs"):
        LocalWorkers("127.0.0.1:1", 2, cpus=(0,))


def thread_cpus(pid: int) -> dict[int, str]:
    """Each thread of a process and the CPUs it may run on, as /proc lists them."""
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        line = next(x for x in status.splitlines() if x.startswith("Cpus_allowed_list:"))
        found[int(tid)] = line.split(":", 1)[1].strip()
    return found


async def _pinned_worker_threads(tmp_path: Path, cpu: int) -> dict[int, str]:
    async with live_master(long_elite_tasks(lease_seconds=60.0), tmp_path / "run") as live:
        fleet = live.trainer.fleet
        worker = spawn_worker(live.port, "pinned", "--cpu", str(cpu))
        try:
            deadline = time.monotonic() + 60
            # Holding a lease: its gRPC channel, started after the pinning, is up.
            while not fleet.tasks_leased_to("pinned"):
                assert worker.poll() is None, "the pinned worker exited"
                assert time.monotonic() < deadline, "the pinned worker never leased a task"
                await asyncio.sleep(0.05)
            return thread_cpus(worker.pid)
        finally:
            stop_processes([worker])


@pytest.mark.slow
def test_every_thread_of_a_pinned_worker_runs_on_its_cpu(tmp_path: Path, noise_cache: Path):
    cpu = ALLOWED[-1]
    threads = asyncio.run(_pinned_worker_threads(tmp_path, cpu))
    assert len(threads) > 1  # the main thread and those it started (gRPC's at least)
    assert set(threads.values()) == {str(cpu)}
