"""Worker processes on this machine, talking to the master through the same gRPC path: how
each is started (its arguments, the CPU it is pinned to) and stopped with the run."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from neuro.allocator import worker_environment
from neuro.cpus import format_cpu_list, parse_cpu_list
from neuro.inference import batched_runs

log = logging.getLogger(__name__)

PLACEMENT_FLAGS = ("--device", "--envs", "--cpu")
"""Worker flags that say where a worker runs: a --worker-arg naming one places the workers."""
WORKER_SETTINGS_ENV = ("NEURO_DEVICE", "NEURO_ENVS", "NEURO_SLOTS", "NEURO_CPU",
                       "NEURO_INFERENCE_ENGINE", "NEURO_ATARI_BACKEND", "NEURO_ATARI_ENGINE",
                       "NEURO_MASTER", "NEURO_TLS_CA", "NEURO_TOKEN_FILE", "NEURO_SPOT_NOTICE",
                       "NEURO_SPOT_POLL_SECONDS")  # fmt: skip
"""neuro-worker's settings from its environment that would make a local worker other than
the one the master placed (and logged), or point it elsewhere: local workers are told only
through their arguments (--worker-arg); the host's directories and log level are kept."""
LOG_FILE = "local-workers.log"
"""Where, in the run dir, local workers write while the master draws a live progress bar."""
MAX_LOCAL_WORKERS_PER_CPU = 2
"""--local-workers at most this many per CPU the master may use: each is a process playing on
one core, so more only share cores (and thousands would exhaust the host)."""


def local_worker_args(
    worker_arg: Sequence[str], count: int, inference_dtype: str, architecture: str
) -> tuple[str, ...]:
    """What each of `count` local workers is started with, after --master and --worker-id.

    On a CUDA host a worker's default device (auto) makes it the batched worker, in the dtypes
    and networks neuro.inference's table lets it run: one process for the whole host, which
    on a host with several GPUs starts one worker process per GPU by itself, each pinned to
    its share of the cores (worker/fanout.py). Several local workers are one per core, and a
    run the batched worker cannot run stays on the per-genome CPU path: both get --device
    cpu, unless --worker-arg names a device (later arguments win).
    """
    cpu = _per_core_workers(count, inference_dtype, architecture)
    return (*(("--device", "cpu") if cpu else ()), *worker_arg, "--give-up-after", "30")


def batched_local_workers(worker_arg: Sequence[str], count: int, gpus: int | None) -> bool:
    """Whether `count` local workers will run the batched runner (so a new run's default dtype
    is float32, neuro.inference.default_dtype): --worker-arg gives them env slots (--envs) or
    a GPU (--device cuda...), or one local worker on a host whose NVIDIA driver lists a GPU
    (`gpus`, listed_gpus), where its default device (auto) makes it the batched worker."""
    if count < 1:
        return False
    device, envs = _worker_flag(worker_arg, "--device"), _worker_flag(worker_arg, "--envs")
    if envs not in (None, "0") or (device is not None and device != "cpu"):
        return True
    return count == 1 and device is None and gpus is not None


def count_problem(count: int, cpus: int | None = None) -> str | None:
    """Why `count` local workers cannot be started (None: they can). `cpus`: those this
    process may use (allowed_cpus, by default)."""
    if cpus is None:
        cpus = len(allowed_cpus()) or os.cpu_count() or 1
    most = MAX_LOCAL_WORKERS_PER_CPU * max(1, cpus)
    if not 0 <= count <= most:
        return (f"--local-workers must be in [0, {most}] ({MAX_LOCAL_WORKERS_PER_CPU} per CPU "
                f"this process may use, {cpus}), got {count}")  # fmt: skip
    return None


def local_worker_environment(environment: Mapping[str, str], token: str | None) -> dict[str, str]:
    """What a local worker's environment is, given the master's: one torch thread, tcmalloc
    where the host has it, the token if there is one, and none of neuro-worker's settings."""
    # One torch thread per worker process: W workers on W cores, no oversubscription;
    # tcmalloc preloaded where the host has it (see neuro.allocator).
    env = worker_environment(
        {**environment, "OMP_NUM_THREADS": environment.get("OMP_NUM_THREADS", "1")}
    )
    # A NEURO_ENVS of the master's would make a batched worker of a per-core one, a NEURO_CPU
    # put every unpinned one on the same core: each is told by its arguments alone.
    for name in WORKER_SETTINGS_ENV:
        env.pop(name, None)
    if token is not None:
        # Through the environment, not argv: any user on the host can read argv in ps.
        env["NEURO_TOKEN"] = token
    return env


def _placed_by_user(worker_arg: Sequence[str]) -> bool:
    """Whether --worker-arg names a placement flag (as --flag value or --flag=value)."""
    return any(arg.split("=")[0] in PLACEMENT_FLAGS for arg in worker_arg)


def _worker_flag(worker_arg: Sequence[str], flag: str) -> str | None:
    """The last value --worker-arg gives `flag` (as --flag value or --flag=value), or None."""
    value = None
    for index, arg in enumerate(worker_arg):
        if arg == flag and index + 1 < len(worker_arg):
            value = worker_arg[index + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def _per_core_workers(count: int, inference_dtype: str, architecture: str) -> bool:
    """Whether local workers are per-core CPU workers; else one worker, which a CUDA host makes
    its batched worker."""
    return count > 1 or not batched_runs(inference_dtype, architecture)


def study_placement(networks: Sequence[tuple[str, str]]) -> tuple[str, str]:
    """The (inference dtype, architecture) that places a study's local workers, among its
    runs' (each a run's dtype and network): one the batched worker cannot run, if any, so
    that every run's tasks can run on them (per-core CPU workers); else the first."""
    return next((n for n in networks if not batched_runs(*n)), networks[0])


def local_worker_cpus(
    worker_arg: Sequence[str],
    count: int,
    inference_dtype: str,
    architecture: str,
    allowed: Sequence[int],
) -> tuple[int, ...]:
    """The logical CPU each of `count` local workers is pinned to (`--cpu`), or () for none.

    Pinned: per-core CPU workers (see local_worker_args), one per physical core first (an SMT
    sibling only after every core has one), when they fit in `allowed`. Not pinned: a worker
    that may be the batched one (it uses every core), or one the user placed (--worker-arg
    naming --device, --envs or --cpu)."""
    per_core = _per_core_workers(count, inference_dtype, architecture)
    if not per_core or _placed_by_user(worker_arg) or not 0 < count <= len(allowed):
        return ()
    return tuple(sorted(allowed, key=lambda cpu: (_sibling_rank(cpu), cpu))[:count])


def describe_local_workers(
    worker_arg: Sequence[str],
    count: int,
    inference_dtype: str,
    architecture: str,
    cpus: Sequence[int],
    gpus: int | None,
) -> str:
    """One line for the log: what the local workers will be. `cpus`: those they are pinned
    to (pinned_cpus); `gpus`: the GPUs the NVIDIA driver lists here (listed_gpus), None where
    it lists none. The master imports no torch: the worker itself decides what auto means."""
    plural = "s" if count != 1 else ""
    if _placed_by_user(worker_arg):
        return f"{count} local worker{plural}, placed by --worker-arg: {' '.join(worker_arg)}"
    if _per_core_workers(count, inference_dtype, architecture):
        where = f"pinned to CPUs {format_cpu_list(cpus)}" if cpus else "not pinned"
        kind = "a per-core CPU worker" if count == 1 else "per-core CPU workers"
        return f"{count} local worker{plural}: {kind} (--device cpu), {where}"
    if gpus is None:
        return ("1 local worker, device auto: the batched worker where torch sees a GPU (one "
                "process per GPU), else a per-genome CPU worker")  # fmt: skip
    if gpus == 1:
        return "1 local worker: the batched worker on this host's GPU, using every core"
    return (f"1 local worker: the batched worker, one process per GPU ({gpus} GPUs listed by "
            f"the NVIDIA driver here), each pinned to its share of the cores")  # fmt: skip


def listed_gpus(driver: Path = Path("/proc/driver/nvidia/gpus")) -> int | None:
    """The GPUs the NVIDIA driver lists on this host, or None where it lists none (no driver,
    or no GPU). CUDA_VISIBLE_DEVICES may let torch see fewer: the worker's log has the final
    word."""
    try:
        count = sum(1 for _ in driver.iterdir())
    except OSError:
        return None
    return count or None


def pinned_cpus(
    pin: bool, worker_arg: Sequence[str], count: int, inference_dtype: str, architecture: str
) -> tuple[int, ...]:
    """The local workers' CPUs among those this process may use (local_worker_cpus); none
    unless `pin` (neuro-master --no-pin-workers clears it)."""
    if not pin:
        return ()
    return local_worker_cpus(worker_arg, count, inference_dtype, architecture, allowed_cpus())


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on (none where the OS cannot pin)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def _sibling_rank(cpu: int) -> int:
    """0 for the first hardware thread of its core, 1 for the next, ... (0 where unknown)."""
    siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
    try:
        listed = parse_cpu_list(siblings.read_text())
    except (OSError, ValueError):
        return 0
    return listed.index(cpu) if cpu in listed else 0


class LocalWorkers:
    """Starts `count` `python -m worker` processes and stops them with the run.

    `cpus`: worker i is pinned to cpus[i] (neuro-worker --cpu); empty: none is pinned. `log`:
    a file their output is appended to (None: they write where the master does)."""

    def __init__(
        self,
        address: str,
        count: int,
        extra_args: tuple[str, ...] = (),
        token: str | None = None,
        cpus: Sequence[int] = (),
        log: Path | None = None,
    ) -> None:
        if count < 0:
            raise ValueError(f"local worker count must be >= 0, got {count}")
        if cpus and len(cpus) != count:
            raise ValueError(f"{count} local workers need {count} CPUs to pin to, got {list(cpus)}")
        self.cpus = tuple(cpus)
        self.log = log
        self.address = address
        self.count = count
        self.extra_args = extra_args
        self._token = token
        self.processes: list[subprocess.Popen] = []
        self.all_exited: list[int] | None = None
        """Their exit codes, once every one exited while the run went on (watch)."""

    def __repr__(self) -> str:
        alive = sum(p.poll() is None for p in self.processes)
        return f"LocalWorkers(address={self.address!r}, alive={alive}/{self.count})"

    def start(self) -> None:
        if self.count and not _worker_installed():
            raise RuntimeError(
                "--local-workers needs the worker installed: pip install 'neuro[worker]'"
            )
        env = local_worker_environment(os.environ, self._token)
        if self.cpus:
            log.info("local workers pinned to CPUs %s (--no-pin-workers: not pinned)",
                     ", ".join(map(str, self.cpus)))  # fmt: skip
        with contextlib.ExitStack() as opened:
            output = None
            if self.log is not None and self.count:
                # Each child holds its own descriptor of it: this one closes once they start.
                output = opened.enter_context(open(self.log, "ab"))
            for index in range(self.count):
                command = [
                    sys.executable, "-m", "worker", "--master", self.address,
                    "--worker-id", f"local-{os.getpid()}-{index}",
                    *(("--cpu", str(self.cpus[index])) if self.cpus else ()), *self.extra_args,
                ]  # fmt: skip
                process = subprocess.Popen(command, env=env, stdout=output, stderr=output)
                self.processes.append(process)

    async def watch(self, training: asyncio.Future) -> None:
        """Stops the run if every local worker died, instead of waiting forever."""
        if not self.processes:
            return
        while not training.done():
            await asyncio.sleep(1.0)
            if all(p.poll() not in (None, 0) for p in self.processes):
                codes = [p.returncode for p in self.processes]
                log.error("every local worker exited (codes %s); stopping the run", codes)
                self.all_exited = codes
                training.cancel()
                return

    async def stop(self, timeout: float) -> None:
        """Waits for workers to leave on their own, then SIGTERM, then SIGKILL."""
        deadline = asyncio.get_running_loop().time() + timeout
        for signal_them in (None, "terminate", "kill"):
            if signal_them:
                for p in self.processes:
                    if p.poll() is None:
                        with contextlib.suppress(ProcessLookupError):
                            getattr(p, signal_them)()
                deadline = asyncio.get_running_loop().time() + timeout
            while any(p.poll() is None for p in self.processes):
                if asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.05)
            else:
                return


def _worker_installed() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("worker", "torch"))
