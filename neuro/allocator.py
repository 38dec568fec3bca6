"""The memory allocator a worker process runs with.

A worker's Atari step allocates and frees the same few tensors and arrays (each layer's
output, the emulator's observation) every millisecond or so, with its caches cold. glibc's
malloc spends a measurable share of the step on them (consolidating free chunks, touching
fresh pages); tcmalloc serves them from per-thread caches. Measured in the throughput bench,
an offspring step took 7-10% less with tcmalloc preloaded, int8 and float32, on an AVX2 and
an AVX-512 host (docs/performance.md). So worker processes that neuro starts itself (a
master's local workers, the benchmarks) get tcmalloc preloaded where the host has it, and the
worker image sets it. The library is the system's (Debian/Ubuntu: libtcmalloc-minimal4);
without it, or with LD_PRELOAD already set (even to nothing, the way to opt out), nothing
changes.
"""

from __future__ import annotations

import ctypes.util
import functools
from collections.abc import Mapping
from pathlib import Path

TCMALLOC = "libtcmalloc_minimal.so.4"
"""tcmalloc without the heap profiler, by the name the dynamic linker looks up."""

_ALLOCATORS = ("tcmalloc", "jemalloc")
"""Allocators recognised in a process's mapped files, by a part of their file names."""


@functools.cache
def tcmalloc_installed() -> bool:
    """Whether the dynamic linker finds tcmalloc (minimal) on this host (asked once: the
    look-up runs ldconfig)."""
    return ctypes.util.find_library("tcmalloc_minimal") == TCMALLOC


def worker_environment(env: Mapping[str, str]) -> dict[str, str]:
    """`env` for a worker process: with tcmalloc preloaded where the host has it and `env`
    does not already say what to preload."""
    out = dict(env)
    if "LD_PRELOAD" not in out and tcmalloc_installed():
        out["LD_PRELOAD"] = TCMALLOC
    return out


def allocator_advice(allocator: str, env: Mapping[str, str], installed: bool) -> str | None:
    """What a worker running on `allocator` should be told, or None: how to get tcmalloc where
    it runs on the system's malloc and nothing chose that (LD_PRELOAD unset in `env`).
    `installed`: tcmalloc_installed()."""
    if allocator != "system" or "LD_PRELOAD" in env:
        return None
    if installed:
        return (f"tcmalloc is installed but not preloaded: LD_PRELOAD={TCMALLOC} makes an "
                "Atari step 5-10% faster (docs/performance.md)")  # fmt: skip
    return ("running on the system's malloc: with tcmalloc an Atari step takes 5-10% less "
            "(Debian/Ubuntu: apt-get install libtcmalloc-minimal4; neuro's local workers "
            f"then preload it, or set LD_PRELOAD={TCMALLOC}; docs/performance.md)")  # fmt: skip


def allocator_in_use(maps: Path = Path("/proc/self/maps")) -> str:
    """ "tcmalloc" or "jemalloc" where one is mapped into this process, else "system"."""
    try:
        text = maps.read_text()
    except OSError:  # no /proc (not Linux): nothing preloaded by this module either
        return "system"
    return next((name for name in _ALLOCATORS if name in text), "system")


@functools.cache
def this_process_allocator() -> str:
    """allocator_in_use() for this process, read once: what is preloaded is fixed at start."""
    return allocator_in_use()
