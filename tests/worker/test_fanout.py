"""One worker per device: which devices --device names, the split of the CPUs among them, the
names cuda:N takes everywhere a device is taken, and the supervisor with stand-in children.

No GPU is needed: torch's count of CUDA devices is replaced where a test needs GPUs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from neuro.inference import BATCHED, check_combination, device_kind, dtypes_for, engines_for
from worker.cli import worker_parser, worker_settings
from worker.fanout import Fanout, Share, child_stats_file, split_devices
from worker.inference.devices import resolve_device, resolve_devices
from worker.inference.registry import select


def gpus(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """Makes torch seem to see `count` CUDA devices."""
    monkeypatch.setattr("worker.inference.devices.cuda_device_count", lambda: count)


def settings_of(*argv: str):
    parser = worker_parser()
    return worker_settings(parser, parser.parse_args(["--master", "127.0.0.1:1", *argv]))


# -- the split: devices x allowed CPUs x cores -> each child's CPUs and envs ------------------


def test_two_gpus_on_16_cpus_split_by_core_with_siblings_together() -> None:
    # Eight cores of two threads, the siblings numbered after every core (0/8, 1/9, ...), as
    # most x86 hosts list them: each GPU gets four whole cores.
    core_of = {cpu: cpu % 8 for cpu in range(16)}
    first, second = split_devices(["cuda:0", "cuda:1"], range(16), core_of)
    assert first == Share("cuda:0", (0, 1, 2, 3, 8, 9, 10, 11), 16, "gpu0")
    assert second == Share("cuda:1", (4, 5, 6, 7, 12, 13, 14, 15), 16, "gpu1")
    # Siblings numbered next to each other (0/1, 2/3, ...): the same rule, other numbers.
    adjacent = {cpu: cpu - cpu % 2 for cpu in range(16)}
    shares = split_devices(["cuda:0", "cuda:1"], range(16), adjacent)
    assert [s.cpus for s in shares] == [tuple(range(8)), tuple(range(8, 16))]


def test_three_gpus_on_8_cpus_the_first_shares_one_core_longer() -> None:
    shares = split_devices(["cuda:0", "cuda:1", "cuda:2"], range(8), {})
    assert [s.cpus for s in shares] == [(0, 1, 2), (3, 4, 5), (6, 7)]
    assert [s.envs for s in shares] == [6, 6, 4]  # two per CPU: a pipeline half each
    assert [s.name for s in shares] == ["gpu0", "gpu1", "gpu2"]


def test_a_cpuset_s_own_cpus_are_split_and_envs_given_go_to_each() -> None:
    # A container's cpuset (4-7, 12-15 of a 16-CPU host, siblings i/i+8), --envs 32.
    allowed = [4, 5, 6, 7, 12, 13, 14, 15]
    shares = split_devices(["cuda:0", "cuda:2"], allowed, {c: c % 8 for c in allowed}, envs=32)
    assert [(s.name, s.cpus, s.envs) for s in shares] == [
        ("gpu0", (4, 5, 12, 13), 32), ("gpu2", (6, 7, 14, 15), 32)
    ]  # fmt: skip


def test_cpu_entries_may_repeat_and_are_named_by_their_place() -> None:
    shares = split_devices(["cpu", "cpu"], [0, 1], {})
    assert [(s.device, s.cpus, s.envs, s.name) for s in shares] == [
        ("cpu", (0,), 2, "cpu0"), ("cpu", (1,), 2, "cpu1")
    ]  # fmt: skip


def test_more_devices_than_cores_is_refused_naming_both() -> None:
    # Four CPUs but two cores (SMT): four GPUs cannot each have a core.
    with pytest.raises(ValueError) as refused:
        split_devices(["cuda:0", "cuda:1", "cuda:2", "cuda:3"], range(4), {0: 0, 1: 1, 2: 0, 3: 1})
    message = str(refused.value)
    assert "4 devices (cuda:0,cuda:1,cuda:2,cuda:3) but 2 physical cores" in message
    assert "(0-3)" in message


def test_a_gpu_named_twice_is_refused_by_the_split_too() -> None:
    with pytest.raises(ValueError, match="cuda:1 named more than once"):
        split_devices(["cuda:1", "cuda:1"], range(8), {})


# -- which devices --device names --------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "count", "devices"),
    [
        ("auto", 0, ("cpu",)),
        ("auto", 1, ("cuda",)),  # one GPU: one worker, as before
        ("auto", 3, ("cuda:0", "cuda:1", "cuda:2")),
        ("cuda", 2, ("cuda:0", "cuda:1")),
        ("cuda:1", 2, ("cuda:1",)),  # an explicit index: that GPU alone
        ("cuda:01", 2, ("cuda:1",)),
        ("cuda:0,cuda:2", 3, ("cuda:0", "cuda:2")),
        ("cuda, cuda:1", 2, ("cuda:0", "cuda:1")),  # "cuda" in a list is GPU 0
        ("cpu,cpu", 0, ("cpu", "cpu")),
        ("cpu", 4, ("cpu",)),
    ],
)
def test_device_values_name_these_devices(value, count, devices, monkeypatch) -> None:
    gpus(monkeypatch, count)
    assert resolve_devices(value) == devices


@pytest.mark.parametrize(
    ("value", "count", "named"),
    [
        ("cuda:0,cuda:0", 2, "'cuda:0,cuda:0' names cuda:0 more than once"),
        ("cuda,cuda:0", 2, "'cuda,cuda:0' names cuda:0 more than once"),
        ("cuda:2", 2, "device 'cuda:2' is not here: torch sees 2 CUDA devices (cuda:0 to cuda:1)"),
        ("cuda:1", 1, "device 'cuda:1' is not here: torch sees 1 CUDA device (cuda:0 to cuda:0)"),
        ("cuda:0,cuda:5", 2, "device 'cuda:5' is not here: torch sees 2 CUDA devices"),
        ("cuda:1", 0, "device 'cuda:1' asked for, but torch sees no CUDA device here"),
        ("cuda:x", 2, "got 'cuda:x'"),
        ("cuda:-1", 2, "got 'cuda:-1'"),
        ("tpu", 2, "got 'tpu'"),
        ("auto,cpu", 2, "device list 'auto,cpu'"),
        ("cpu,", 2, "device list 'cpu,'"),
    ],
)
def test_bad_device_values_are_refused_naming_them(value, count, named, monkeypatch) -> None:
    gpus(monkeypatch, count)
    with pytest.raises(ValueError) as refused:
        resolve_devices(value)
    assert named in str(refused.value)


def test_a_cpu_worker_asks_torch_nothing(monkeypatch) -> None:
    def no_torch() -> int:
        raise AssertionError("torch asked about CUDA for a CPU device")

    monkeypatch.setattr("worker.inference.devices.cuda_device_count", no_torch)
    assert resolve_devices("cpu,cpu,cpu") == ("cpu", "cpu", "cpu")
    assert resolve_device("cpu") == "cpu"


# -- cuda:N wherever a device is taken ---------------------------------------------------------


def test_the_shared_table_reads_cuda_n_as_cuda() -> None:
    assert device_kind("cuda:3") == "cuda" and device_kind("cpu") == "cpu"
    assert engines_for("float32", "deepga", BATCHED, "cuda:1") == ("torch-grouped",)
    assert dtypes_for("nature", BATCHED, "cuda:7") == ("float32",)
    check_combination("float32", "mlp", BATCHED, "cuda:1")  # no error
    with pytest.raises(ValueError, match="device 'cuda:' is not one of cpu, cuda or cuda:N"):
        check_combination("float32", "mlp", BATCHED, "cuda:")
    with pytest.raises(ValueError, match="does not run on the batched runner on cuda:1"):
        check_combination("int8", "deepga", BATCHED, "cuda:1")


def test_the_registry_serves_a_gpu_by_index_and_names_one_that_is_not_here(monkeypatch) -> None:
    gpus(monkeypatch, 2)
    assert select("float32", "deepga", BATCHED, "cuda:1").name == "torch-grouped"
    with pytest.raises(ValueError, match="torch sees 2 CUDA devices"):
        select("float32", "deepga", BATCHED, "cuda:2")


def test_a_worker_on_gpu_n_makes_it_torch_s_current_device(monkeypatch) -> None:
    import torch

    from worker.cli.work import _build_client

    gpus(monkeypatch, 2)
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    settings = settings_of("--device", "cuda:1", "--shared-cache-mb", "0")
    assert settings.device == "cuda:1" and not settings.shares
    _build_client(settings)
    assert chosen == ["cuda:1"]


# -- neuro-worker's settings -------------------------------------------------------------------


def test_several_gpus_make_a_fanout_of_one_worker_per_gpu(monkeypatch) -> None:
    gpus(monkeypatch, 2)
    monkeypatch.setattr("worker.fanout.os.sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr("worker.fanout.host_cores", lambda cpus: {c: c % 8 for c in cpus})
    shares = settings_of().shares  # --device auto
    assert [(s.device, s.cpus, s.envs) for s in shares] == [
        ("cuda:0", (0, 1, 2, 3, 8, 9, 10, 11), 16), ("cuda:1", (4, 5, 6, 7, 12, 13, 14, 15), 16)
    ]  # fmt: skip
    monkeypatch.setenv("NEURO_DEVICE", "cuda:1,cuda:0")
    assert [s.name for s in settings_of("--envs", "64").shares] == ["gpu1", "gpu0"]
    assert {s.envs for s in settings_of("--envs", "64").shares} == {64}


def test_one_gpu_keeps_one_worker_with_an_env_slot_per_cpu_it_may_use(monkeypatch) -> None:
    gpus(monkeypatch, 1)
    settings = settings_of()
    assert settings.device == "cuda" and not settings.shares
    assert settings.envs == 2 * len(os.sched_getaffinity(0))
    assert settings_of("--device", "cuda:0", "--cpu", "0").envs == 2  # its --cpu set's CPUs


def test_the_fanout_refuses_a_cpu_of_its_own_and_a_split_that_cannot_be(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        settings_of("--device", "cpu,cpu", "--cpu", "0")
    assert exited.value.code == 2
    assert "--cpu (or NEURO_CPU) 0 with several devices (cpu,cpu)" in capsys.readouterr().err
    many = ",".join(["cpu"] * (len(os.sched_getaffinity(0)) + 1))
    with pytest.raises(SystemExit):
        settings_of("--device", many)
    assert "physical core" in capsys.readouterr().err


def test_a_bad_device_exits_2_naming_it(capsys, monkeypatch) -> None:
    gpus(monkeypatch, 2)
    with pytest.raises(SystemExit) as exited:
        settings_of("--device", "cuda:4")
    assert exited.value.code == 2
    assert "--device (or NEURO_DEVICE): device 'cuda:4' is not here" in capsys.readouterr().err


# -- the supervisor ----------------------------------------------------------------------------


def test_each_child_gets_the_parent_s_flags_then_its_own() -> None:
    share = Share("cuda:2", (4, 5, 6, 7, 12, 13), 6, "gpu2")
    fanout = Fanout(["--master", "m:1", "--envs", "0"], [share], "host-7", "out/stats.json", "py")
    assert fanout.command(share) == [
        "py", "-m", "worker", "--master", "m:1", "--envs", "0",
        "--device", "cuda:2", "--cpu", "4-7,12-13", "--envs", "6", "--worker-id", "host-7-gpu2",
        "--stats-file", str(Path("out/stats-gpu2.json")),
    ]  # fmt: skip
    assert child_stats_file("stats", share) == "stats-gpu2"
    # The child's own flags win: argparse keeps the last of a repeated flag.
    args = worker_parser().parse_args(fanout.command(share)[3:])
    assert (args.device, args.envs, args.cpu) == ("cuda:2", 6, (4, 5, 6, 7, 12, 13))


class StandIn(Fanout):
    """A Fanout whose children are small scripts: the supervision without workers."""

    def __init__(self, scripts: list[str], ready: Path) -> None:
        shares = [Share("cpu", (0,), 1, f"cpu{i}") for i in range(len(scripts))]
        super().__init__([], shares, "standin")
        self.scripts, self.ready = scripts, ready

    def command(self, share: Share) -> list[str]:
        index = self.shares.index(share)
        # Ready once its signal handlers are set (READY), or at once.
        mark = f"open({str(self.ready / str(index))!r}, 'w').close()\n"
        script = self.scripts[index]
        return [sys.executable, "-c", script.replace("READY\n", mark) if "READY" in script
                else mark + script]  # fmt: skip


# Leaves with 0 on SIGTERM or SIGINT, as a worker does once it has handed its tasks back.
DRAINS = """import signal, sys, time
for s in (signal.SIGTERM, signal.SIGINT):
    signal.signal(s, lambda *_: sys.exit(0))
READY
time.sleep(60)
sys.exit(9)
"""


def wait_until(predicate, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def signal_when_ready(ready: Path, count: int, signum: int) -> threading.Thread:
    """Sends this process `signum` once `count` children have started."""

    def send() -> None:
        deadline = time.monotonic() + 30
        while len(list(ready.iterdir())) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signum)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_parent_drains_every_child_and_it_exits_0(tmp_path, signum) -> None:
    fanout = StandIn([DRAINS, DRAINS], tmp_path)
    before = signal.getsignal(signum)
    signal_when_ready(tmp_path, 2, signum)
    started = time.monotonic()
    assert fanout.run() == 0
    assert time.monotonic() - started < 20
    assert fanout.codes.keys() == {"standin-cpu0", "standin-cpu1"}
    assert set(fanout.codes.values()) == {0}
    assert signal.getsignal(signum) is before  # the parent's handler is put back


def test_a_child_that_dies_is_not_restarted_and_its_code_is_the_parent_s(tmp_path) -> None:
    # The second child fails at once; the first keeps going until the parent is signalled.
    fanout = StandIn([DRAINS, "import sys; sys.exit(3)"], tmp_path)
    fanout.start()
    wait_until(lambda: (tmp_path / "0").exists() and fanout.processes[1].poll() is not None)
    assert fanout.processes[0].poll() is None  # its sibling's death did not stop it
    fanout.stop()
    assert fanout.wait() == 3
    assert fanout.codes == {"standin-cpu1": 3, "standin-cpu0": 0}
    assert len(fanout.processes) == 2  # none started again


def test_a_child_killed_by_a_signal_makes_the_parent_exit_128_plus_it(tmp_path: Path) -> None:
    fanout = StandIn([DRAINS, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                     tmp_path)  # fmt: skip
    fanout.start()
    wait_until(lambda: (tmp_path / "0").exists() and fanout.processes[1].poll() is not None)
    fanout.stop()
    assert fanout.wait() == 128 + signal.SIGKILL


# A parent that makes two stand-in children (as StandIn does) and waits for them.
KILLED_PARENT = """
import sys
from tests.worker.test_fanout import DRAINS, StandIn
from pathlib import Path
StandIn([DRAINS, DRAINS], Path(sys.argv[1])).run()
"""


def gone(pid: str) -> bool:
    """Whether a process has exited (a zombie whose new parent has not reaped it yet counts)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_the_children_of_a_killed_parent_are_told_to_drain(tmp_path: Path) -> None:
    # SIGKILL leaves the parent nothing to pass on: the kernel's parent-death signal does it.
    from tests.support.processes import REPO, worker_env

    parent = subprocess.Popen([sys.executable, "-c", KILLED_PARENT, str(tmp_path)],
                              cwd=REPO, env=worker_env())  # fmt: skip
    children: list[str] = []
    try:
        wait_until(lambda: len(list(tmp_path.iterdir())) == 2)
        children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()
        assert len(children) == 2
        parent.kill()
        parent.wait()
        wait_until(lambda: all(gone(pid) for pid in children), 10)
    finally:
        parent.kill()
        for pid in children:
            if not gone(pid):
                os.kill(int(pid), signal.SIGKILL)
