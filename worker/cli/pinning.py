"""CPU pinning: which CPUs this process may run on, and pinning every thread of it to some."""

from __future__ import annotations

import contextlib
import os


def allowed_cpus() -> tuple[int, ...]:
    """The CPUs this process may run on (a container's or taskset's, not the host's)."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


def pin_to_cpus(cpus: tuple[int, ...] | set[int]) -> None:
    """Pins every thread of this process to `cpus`; threads it starts later inherit that.

    Why: ale-py's vector env steps the emulator in a thread of its own and hands each
    observation to the caller's thread, which runs the forward pass. Left to the scheduler,
    the two often sit on different cores, and every step crosses caches (and, in a VM, costs
    a cross-CPU wake-up): docs/performance.md measures the difference. A batched worker's
    share (several CPUs) keeps its emulator threads off the other shares' cores."""
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:  # no /proc: this thread, which has started no other yet
        threads = [0]
    for tid in threads:
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            os.sched_setaffinity(tid, set(cpus))


def pin_to_cpu(cpu: int) -> None:
    """Pins every thread of this process to one logical CPU (pin_to_cpus)."""
    pin_to_cpus({cpu})
