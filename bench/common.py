"""What several benchmarks share: paths, the host, the paper's Atari emulator, timing, git
revisions and result files.

Only the standard library is imported at the top (numpy, torch and ale-py inside the
functions that need them), so that bench/compare_revisions.py can load this module beside
another revision's worker code.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import multiprocessing as mp
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
TRAINED_GENOME = RESULTS / "frostbite-best-genome.json"
"""The learning check's best Frostbite genome (float32), which several benchmarks replay."""
EPISODE_STEPS = RESULTS / "frostbite-episode-steps.json"
"""Episode lengths of real Frostbite play, recorded by bench/fleet_sim.py --record-episodes."""

# ------------------------------------------------------------------------------ the host


def pin_to(core: int) -> None:
    """Pins this process to one core (modulo the machine's count)."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core % os.cpu_count()})


def pin_to_cores(cores: set[int]) -> None:
    """Pins this process to those of `cores` it may use (left as it is where it may use none)."""
    available = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    if cores & available:
        os.sched_setaffinity(0, cores & available)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads included (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def raise_file_limit() -> None:
    """Thousands of connections need as many file descriptors as the hard limit allows."""
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def l3_cache() -> dict[str, Any]:
    """Last-level cache size in bytes, from /sys (or lscpu where /sys has no index3)."""
    path = Path("/sys/devices/system/cpu/cpu0/cache/index3/size")
    try:
        text = path.read_text().strip()
        source = str(path)
    except OSError:
        try:
            done = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10)
            line = next(x for x in done.stdout.splitlines() if x.startswith("L3 cache"))
            text, source = line.split(":", 1)[1].split("(")[0].strip(), "lscpu"
        except (OSError, StopIteration, subprocess.SubprocessError):
            return {"bytes": None, "source": "unknown"}
    match = re.match(r"([\d.]+)\s*([KMG]?)i?B?", text.replace(" ", ""))
    if not match:
        return {"bytes": None, "source": source, "text": text}
    scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match.group(2)]
    return {"bytes": int(float(match.group(1)) * scale), "source": source, "text": text}


def machine() -> dict[str, Any]:
    """The host a measurement ran on: CPUs, CPU model, platform, Python, preloaded allocator."""
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
    }


def process_memory(pid: int | str = "self") -> dict[str, float]:
    """A process's RSS, PSS (shared pages split among their users: the noise table), shared
    clean and private dirty memory in MiB, from /proc/PID/smaps_rollup."""
    figures = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("Rss", "Pss", "Shared_Clean", "Private_Dirty"):
                figures[key.lower() + "_mib"] = int(value.split()[0]) / 1024
    return figures


def in_child(fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
    """Runs fn in a fresh spawned process, so this one (a master's) never imports torch;
    multiprocessing.TimeoutError after `timeout` seconds (None: no limit)."""
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply_async(fn, args).get(timeout)


# ------------------------------------------------------------------------------ the emulator


def ale_game(env_id: str) -> str:
    """ALE's ROM name for a gymnasium id: Frostbite-v4 -> frostbite, Pong -> pong."""
    name = env_id.split("/")[-1].split("-")[0].removesuffix("NoFrameskip")
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def atari_vector_env(env_id: str, num_envs: int) -> Any:
    """ale-py's C++ vector env under the paper's protocol: the emulator ceiling's."""
    from ale_py.vector_env import AtariVectorEnv

    return AtariVectorEnv(ale_game(env_id), num_envs, num_threads=1, frameskip=4, maxpool=True,
                          grayscale=True, img_height=84, img_width=84, stack_num=4, noop_max=30,
                          use_fire_reset=True, repeat_action_probability=0.0,
                          reward_clipping=False, episodic_life=False)  # fmt: skip


def step_vector_env(env: Any, seconds: float, rng: Any) -> tuple[int, int, int, float]:
    """Steps a reset C++ vector env with random actions for `seconds`: (frames, env steps,
    episodes, wall seconds)."""
    import numpy as np

    num_envs = env.num_envs
    n_actions = int(env.single_action_space.n)
    steps = frames = episodes = 0
    resetting = np.zeros(num_envs, dtype=bool)
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        _, _, terminated, truncated, _ = env.step(rng.integers(n_actions, size=num_envs))
        # Autoreset (next step): the step after an episode's end only resets that env.
        frames += 4 * int(num_envs - resetting.sum())
        resetting = terminated | truncated
        episodes += int(resetting.sum())
        steps += num_envs
    return frames, steps, episodes, time.perf_counter() - started


def play_timed(policy: Any, env: Any, seed: int, steps: int) -> dict[str, float]:
    """Plays `steps` greedy steps of `policy` on a one-env vector env from a reset seeded
    `seed`, as a worker's step runs: the mean forward and emulator ms a step."""
    import numpy as np

    observation, _ = env.reset(seed=seed)
    forward = emulator = 0.0
    for _ in range(steps):
        started = time.perf_counter()
        action = int(policy.act_batch(observation)[0])
        acted = time.perf_counter()
        observation, *_ = env.step(np.array([action]))
        forward += acted - started
        emulator += time.perf_counter() - acted
    return {"forward_ms": forward / steps * 1e3, "emulator_ms": emulator / steps * 1e3}


# ------------------------------------------------------------------------------ timing


def median_ms(step: Callable[[], object], repeats: int, device: Any = None) -> float:
    """Median wall ms of `repeats` steps, after two warm-up steps; on a CUDA torch device each
    step is timed to the device's end of it."""
    synchronise = None
    if getattr(device, "type", None) == "cuda":
        import torch

        def synchronise() -> None:
            torch.cuda.synchronize(device)

    def timed() -> float:
        started = time.perf_counter()
        step()
        if synchronise is not None:
            synchronise()
        return (time.perf_counter() - started) * 1e3

    timed()
    timed()
    return statistics.median(timed() for _ in range(repeats))


def best_seconds(fn: Callable[[], object], repeats: int = 5) -> float:
    """The fastest of `repeats` timed calls of fn (the least disturbed by the rest of the host)."""
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


# ------------------------------------------------------------------------------ git


def commit_of(revision: str) -> str | None:
    """The full hash of a revision of this repository, or None where it names no commit."""
    done = subprocess.run(["git", "rev-parse", "--verify", f"{revision}^{{commit}}"], cwd=REPO,
                          capture_output=True, text=True)  # fmt: skip
    return done.stdout.strip() if done.returncode == 0 else None


def head_revision() -> str | None:
    """This tree's commit, saying so where tracked files differ from it; None outside git."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if head.returncode != 0:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    return head.stdout.strip() + (" with uncommitted changes" if dirty else "")


@contextlib.contextmanager
def worktree(commit: str) -> Iterator[Path]:
    """A temporary checkout of `commit` (a git worktree), removed on the way out."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=REPO,
                       check=True, capture_output=True)  # fmt: skip
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO,
                           capture_output=True)  # fmt: skip


# ------------------------------------------------------------------------------ result files


def provenance(script: str, argv: list[str] | None) -> dict[str, Any]:
    """How a result was made: the command (`script` is the benchmark's __file__; argv None
    means this process's own arguments), this tree's revision and today's date."""
    args = sys.argv[1:] if argv is None else argv
    command = " ".join(["python -m", f"bench.{Path(script).stem}", *map(shlex.quote, args)])
    return {
        "command": command,
        "revision": head_revision(),
        "date": datetime.date.today().isoformat(),
    }


def finite(value: Any) -> Any:
    """The document with NaN and infinities as null, so it is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def json_text(document: Any) -> str:
    """The document as strict JSON, one level indented; values JSON has no type for as str."""
    return json.dumps(finite(document), indent=1, default=str)


def write_json(path: str | Path, document: Any) -> None:
    """Writes the document (json_text) to path, creating its folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json_text(document) + "\n")
