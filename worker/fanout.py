"""One worker process per device: a host with several GPUs (or a big CPU host split in shares)
runs one batched worker per device, each pinned to its share of the cores.

`neuro-worker` on a host where torch sees G > 1 CUDA devices (--device auto or cuda), or given
a list (--device cuda:0,cuda:2, or cpu,cpu), becomes a small supervisor: it starts one
`python -m worker` per device with its own --device, --cpu (its share), --envs, --worker-id
(ID-gpuN, ID-cpuI) and --stats-file (STEM-gpuN.json), forwards SIGTERM and SIGINT to each (each
drains: hands its tasks back and exits 0), and exits when all have: 0 when every one exited 0,
else the first non-zero code.

A child that dies is logged and not restarted: the master gives its tasks to the others,
which keep working, as when a spot host goes. A crash on a GPU (an Xid error, memory) tends to
come back, and a restart loop would hide it; the parent's own exit code reports it when the
others are done, for whatever restarts the host's workers (systemd, the container runtime).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from neuro.cpus import format_cpu_list, parse_cpu_list
from neuro.inference import CPU

log = logging.getLogger(__name__)

__all__ = [
    "ENVS_PER_CPU",
    "Fanout",
    "Share",
    "child_stats_file",
    "host_cores",
    "plan_shares",
    "split_devices",
]


ENVS_PER_CPU = 2
"""A batched worker's default env slots per CPU it runs on: its pipeline's two halves then
hold one sub-env per CPU each, so the emulator's threads have a whole half to step while the
device computes the other half's actions (worker/runners/batched.py)."""


@dataclass(frozen=True)
class Share:
    """One child's device, the CPUs every thread of it runs on, and its env slots."""

    device: str
    cpus: tuple[int, ...]
    envs: int
    name: str
    """gpuN for cuda:N, cpuI for the I-th entry of the device list: its worker id's suffix."""


def split_devices(
    devices: Sequence[str], allowed: Sequence[int], core_of: Mapping[int, int], envs: int = 0
) -> tuple[Share, ...]:
    """Each device's share of the `allowed` CPUs: the rule, a pure function.

    The allowed CPUs are grouped into physical cores (`core_of`: a CPU -> its core, e.g. its
    first SMT sibling; hardware threads of one core always go together), the cores ordered by
    their lowest CPU, and cut into len(devices) contiguous runs, the first cores % len(devices)
    one core longer. Each share's envs: `envs` when > 0, else ENVS_PER_CPU per CPU of its
    share (as one batched worker takes ENVS_PER_CPU per CPU of the host). ValueError where
    there are fewer cores than devices, or a GPU is named twice."""
    if not devices:
        raise ValueError("no device to split the CPUs among")
    twice = sorted({d for d in devices if d != CPU and devices.count(d) > 1})
    if twice:
        raise ValueError(f"devices {','.join(devices)}: {', '.join(twice)} named more than once")
    cores: dict[int, list[int]] = {}
    for cpu in sorted(set(allowed)):
        cores.setdefault(core_of.get(cpu, cpu), []).append(cpu)
    ordered = sorted(cores.values(), key=min)
    if len(ordered) < len(devices):
        raise ValueError(
            f"{len(devices)} devices ({','.join(devices)}) but {len(ordered)} physical "
            f"core{'s' if len(ordered) != 1 else ''} among the CPUs this process may use "
            f"({format_cpu_list(allowed)}): each device's worker needs a core of its own"
        )
    size, longer = divmod(len(ordered), len(devices))
    shares, start = [], 0
    for index, device in enumerate(devices):
        end = start + size + (index < longer)
        cpus = tuple(sorted(cpu for core in ordered[start:end] for cpu in core))
        name = f"cpu{index}" if device == CPU else f"gpu{device.partition(':')[2] or 0}"
        shares.append(Share(device, cpus, envs if envs > 0 else ENVS_PER_CPU * len(cpus), name))
        start = end
    return tuple(shares)


def host_cores(cpus: Sequence[int]) -> dict[int, int]:
    """Each CPU's physical core, named by its first hardware thread (the kernel's
    thread_siblings_list); a CPU whose siblings cannot be read is a core of its own."""
    found = {}
    for cpu in cpus:
        path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        try:
            found[cpu] = min(parse_cpu_list(path.read_text()))
        except (OSError, ValueError):
            found[cpu] = cpu
    return found


def plan_shares(devices: Sequence[str], envs: int = 0) -> tuple[Share, ...]:
    """split_devices over the CPUs this process may use and this host's cores."""
    if not hasattr(os, "sched_getaffinity"):
        raise ValueError("a worker per device pins each to its cores: that needs Linux")
    allowed = sorted(os.sched_getaffinity(0))
    return split_devices(devices, allowed, host_cores(allowed), envs)


def child_stats_file(stats_file: str, share: Share) -> str:
    """A child's own stats file beside the one given: stats.json -> stats-gpu1.json."""
    path = Path(stats_file)
    return str(path.with_name(f"{path.stem}-{share.name}{path.suffix}"))


class Fanout:
    """Starts one worker process per share, forwards SIGTERM/SIGINT to each, waits for all.

    `argv`: the parent's own neuro-worker flags; each child gets them with its device, CPUs,
    envs, worker id and stats file after them (argparse: the later flag wins)."""

    def __init__(
        self,
        argv: Sequence[str],
        shares: Sequence[Share],
        worker_id: str,
        stats_file: str | None = None,
        python: str = sys.executable,
    ) -> None:
        self.argv = tuple(argv)
        self.shares = tuple(shares)
        self.worker_id = worker_id
        self.stats_file = stats_file
        self.python = python
        self.processes: list[subprocess.Popen] = []
        self.codes: dict[str, int] = {}
        """Each exited child's worker id and exit code, in the order they exited."""
        self.stopping = False

    def __repr__(self) -> str:
        alive = sum(p.poll() is None for p in self.processes)
        return (
            f"Fanout({self.worker_id!r}, alive={alive}/{len(self.shares)}, "
            f"exited={self.codes}, stopping={self.stopping})"
        )

    def child_id(self, share: Share) -> str:
        return f"{self.worker_id}-{share.name}"

    def command(self, share: Share) -> list[str]:
        """The child's command line: the parent's flags, then its own."""
        own = ["--device", share.device, "--cpu", format_cpu_list(share.cpus),
               "--envs", str(share.envs), "--worker-id", self.child_id(share)]  # fmt: skip
        if self.stats_file:
            own += ["--stats-file", child_stats_file(self.stats_file, share)]
        return [self.python, "-m", "worker", *self.argv, *own]

    def run(self) -> int:
        """Starts the children, forwards SIGTERM and SIGINT to them until all have exited;
        returns 0 if every one exited 0, else the first non-zero code (128+N for signal N)."""
        previous = {s: signal.signal(s, self._forward) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            return self.wait()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def start(self) -> None:
        """Starts every child not yet started, unless a stop came first."""
        for share in self.shares[len(self.processes) :]:
            if self.stopping:
                return
            log.info("worker %s starting on %s, CPUs %s, %d envs", self.child_id(share),
                     share.device, format_cpu_list(share.cpus), share.envs)  # fmt: skip
            pre_exec = _die_with_parent(os.getpid())
            self.processes.append(subprocess.Popen(self.command(share), preexec_fn=pre_exec))

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Passes `signum` on to every child still running: each drains and exits."""
        self.stopping = True
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signum)

    def wait(self, poll_s: float = 0.1) -> int:
        """Waits for every child; logs each exit. A child that fails is not restarted."""
        first_failure = 0
        running = dict(zip(self.processes, self.shares, strict=False))
        while running:
            for process, share in list(running.items()):
                code = process.poll()
                if code is None:
                    continue
                del running[process]
                self.codes[self.child_id(share)] = code
                if code == 0:
                    log.info("worker %s on %s exited 0", self.child_id(share),
                             share.device)  # fmt: skip
                    continue
                first_failure = first_failure or (128 - code if code < 0 else code)
                log.error(
                    "worker %s on %s exited with %s; not restarted: the master gives its "
                    "tasks to other workers (%d of this host's still working)",
                    self.child_id(share), share.device,
                    f"signal {-code}" if code < 0 else f"code {code}", len(running),
                )  # fmt: skip
            if running:
                time.sleep(poll_s)
        return first_failure

    def _forward(self, signum: int, _frame: object) -> None:
        alive = sum(p.poll() is None for p in self.processes)
        log.info("worker %s: %s, passed on to its %d workers", self.worker_id,
                 signal.Signals(signum).name, alive)  # fmt: skip
        self.stop(signum)


PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> Callable[[], None] | None:
    """A child's pre-exec step: SIGTERM when the parent dies, so the children of a parent that
    was killed (SIGKILL: nothing to forward) drain too rather than work on unsupervised."""
    if not sys.platform.startswith("linux"):
        return None

    def set_parent_death_signal() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # it died before the call above
            os.kill(os.getpid(), signal.SIGTERM)

    return set_parent_death_signal
