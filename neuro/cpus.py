"""CPU lists as the Linux kernel writes them ("0-3,8,10-11"), for pinning workers."""

from __future__ import annotations

from collections.abc import Iterable


def parse_cpu_list(text: str) -> list[int]:
    """A kernel CPU list ("0-3,8,10-11") as its CPUs, in order; ValueError if malformed."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return sorted(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """CPUs as the kernel lists them: "0-3,8,10-11"."""
    ranges: list[list[int]] = []
    for cpu in sorted(cpus):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)
