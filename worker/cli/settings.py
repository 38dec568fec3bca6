"""neuro-worker's flags, each with its env var, and the checks that turn them into settings."""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuro.cpus import format_cpu_list, parse_cpu_list
from neuro.inference import INFERENCE_ENGINES
from neuro.wire import DEFAULT_MASTER, load_token
from worker.cli.pinning import allowed_cpus
from worker.fanout import ENVS_PER_CPU
from worker.inference.registry import check_preference, preferred_engine
from worker.play.envs import ATARI_BACKENDS, DEFAULT_ATARI_BACKEND

if TYPE_CHECKING:
    from worker.fanout import Share

SPOT_NOTICE_MODES = ("off", "imds")


@dataclass(frozen=True)
class WorkerSettings:
    """A worker's checked settings: what the flags and their env vars came to."""

    master: str
    worker_id: str | None
    """None: hostname-pid-random, chosen at start."""
    prefetch: int
    slots: int
    atari_backend: str
    """What plays paper-protocol Atari: "vector", ale-py's C++ vector env; "gym", gymnasium
    wrappers."""
    inference_engine: str
    """The inference engine preferred for the policies' forward pass; a policy it does not
    serve runs on the next one, in the table's order, that does."""
    stats_file: str | None
    torch_threads: int
    noise_cache: str | None
    decode_cache_mb: int
    shared_cache_mb: int
    give_up_after: float
    log_level: str
    token: str | None = field(repr=False)  # never in a log line
    root_certificates: bytes | None
    spot_endpoint: str | None
    """The metadata service to poll for a spot notice; None: don't poll."""
    spot_poll_seconds: float
    device: str = "cpu"
    """Where the forward pass runs: cpu, cuda or cuda:N ("auto" is resolved by
    worker_settings)."""
    envs: int = 0
    """> 0: the batched worker, this many env slots of different individuals stepped together
    with one forward pass; 0: the per-genome worker (PerGenomeRunner, --slots)."""
    cpus: tuple[int, ...] | None = None
    """The logical CPUs every thread of this worker runs on (--cpu); None: the scheduler's."""
    shares: tuple[Share, ...] = ()
    """Several devices: this process works on none itself but runs one worker process per
    share (worker/fanout.py); (): it is the worker."""
    pipeline: bool = True
    """The batched worker's Atari slots in two halves that take turns (--no-pipeline: not)."""


def worker_parser() -> argparse.ArgumentParser:
    """neuro-worker's flags; each env var is a flag's default."""
    parser = argparse.ArgumentParser(
        prog="neuro-worker", description="Lease evaluation tasks from a neuro master and run them."
    )
    parser.add_argument(
        "--master",
        default=os.environ.get("NEURO_MASTER", DEFAULT_MASTER),
        help="master address host:port (env NEURO_MASTER; default %(default)s)",
    )
    parser.add_argument("--worker-id", default=None, help="default: hostname-pid-random")
    parser.add_argument(
        "--prefetch",
        type=int,
        default=1,
        help="tasks to hold beyond the running one, so no round trip idles it",
    )
    parser.add_argument(
        "--slots",
        type=int,
        default=int(os.environ.get("NEURO_SLOTS", "16")),
        help="episodes run at once; episodes of one genome share a batched forward pass "
        "(env NEURO_SLOTS; default %(default)s)",
    )
    parser.add_argument(
        "--device",
        default=os.environ.get("NEURO_DEVICE", "auto"),
        help="where the forward pass runs: auto (CUDA when torch sees one), cpu, cuda or "
        "cuda:N; a CUDA device runs the batched worker (see --envs). Several devices (auto or "
        "cuda where torch sees several GPUs, or a list such as cuda:0,cuda:2 or cpu,cpu): one "
        "worker process per device, each pinned to its share of the cores, ids ID-gpuN / "
        "ID-cpuI (env NEURO_DEVICE; default auto)",
    )
    parser.add_argument(
        "--envs",
        type=int,
        default=int(os.environ.get("NEURO_ENVS", "0")),
        help="env slots in this one process for the batched worker: it leases up to this many "
        "tasks of different individuals and evaluates every live episode in one forward pass "
        "per step; 0: two per CPU it may use on a CUDA device (or of its share, with several "
        "devices), else the per-genome worker (--slots) (env NEURO_ENVS; default 0)",
    )
    parser.add_argument(
        "--no-pipeline",
        dest="pipeline",
        action="store_false",
        help="the batched worker steps all its Atari slots in one vector env after their "
        "forward pass, instead of two halves that take turns (one in the emulator while the "
        "device computes the other's actions); for measuring what the pipeline gains",
    )
    parser.add_argument(
        "--atari-backend",
        default=os.environ.get(
            "NEURO_ATARI_BACKEND", os.environ.get("NEURO_ATARI_ENGINE", DEFAULT_ATARI_BACKEND)
        ),
        help="what plays paper-protocol Atari: vector (ale-py's C++ vector env, one call steps "
        "all slots of a game) or gym (gymnasium wrappers); registered dynamics and non-Atari "
        "envs are gymnasium either way (env NEURO_ATARI_BACKEND; default %(default)s)",
    )
    # The flag's name before the env backend and the inference engine were told apart; still
    # taken, with its env var NEURO_ATARI_ENGINE, so existing scripts and manifests keep working.
    parser.add_argument(
        "--atari-engine",
        dest="atari_backend",
        action=_DeprecatedAlias,
        use="--atari-backend",
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--inference-engine",
        default=None,
        help=f"the inference engine to prefer for the policies' forward pass on a CPU, one of "
        f"{', '.join(INFERENCE_ENGINES)}; a policy whose net or dtype it does not serve runs on "
        "the next of those that does, as the worker logs (env NEURO_INFERENCE_ENGINE; default: "
        "the first of them that runs here)",
    )
    parser.add_argument(
        "--cpu",
        type=cpu_list,
        default=os.environ.get("NEURO_CPU"),
        help="pin every thread of this worker to this logical CPU, as one worker per core "
        "runs best: the emulator's thread and the forward pass then share one core's caches; "
        "or to a list (0-7,16-23), a batched worker's share, its emulators stepped by one "
        "thread per CPU of it (env NEURO_CPU; default: not pinned; neuro-master "
        "--local-workers pins its own)",
    )
    parser.add_argument(
        "--stats-file",
        default=None,
        help="keep the worker's counters and time breakdown in this JSON file (every 5 s)",
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="intra-op threads per worker; run one worker per core (default 1)",
    )
    parser.add_argument(
        "--noise-cache",
        default=None,
        help="noise table cache dir (env NEURO_CACHE_DIR; default ~/.cache/neuro)",
    )
    parser.add_argument(
        "--decode-cache-mb",
        type=int,
        default=512,
        help="memory for recently decoded parameter vectors (parents)",
    )
    parser.add_argument(
        "--shared-cache-mb",
        type=int,
        default=1024,
        help="RAM (/dev/shm, or $NEURO_SHARED_DIR) in which a host's workers share decoded "
        "parents; 0: each worker keeps its own (default %(default)s)",
    )
    parser.add_argument(
        "--give-up-after",
        type=float,
        default=0.0,
        help="exit after the master is unreachable this many seconds (0: never)",
    )
    parser.add_argument("--log-level", default=os.environ.get("NEURO_LOG_LEVEL", "INFO"))
    # The token itself is never a flag: argv is visible to every user of the host in ps.
    parser.add_argument(
        "--token-file",
        default=os.environ.get("NEURO_TOKEN_FILE"),
        help="file holding the master's shared token (env NEURO_TOKEN_FILE, or the token "
        "itself in env NEURO_TOKEN)",
    )
    parser.add_argument(
        "--tls-ca",
        default=os.environ.get("NEURO_TLS_CA"),
        help="PEM root certificate of a TLS master (env NEURO_TLS_CA); plaintext without it",
    )
    parser.add_argument(
        "--spot-notice",
        choices=SPOT_NOTICE_MODES,
        default=os.environ.get("NEURO_SPOT_NOTICE", "off"),
        help="imds: poll the EC2 instance metadata service (IMDSv2, at "
        "$AWS_EC2_METADATA_SERVICE_ENDPOINT or 169.254.169.254) for a spot interruption notice "
        "and drain on it, as on SIGTERM; off: don't (env NEURO_SPOT_NOTICE; default off)",
    )
    parser.add_argument(
        "--spot-poll-seconds",
        type=float,
        default=os.environ.get("NEURO_SPOT_POLL_SECONDS", "5"),
        help="seconds between spot notice polls (env NEURO_SPOT_POLL_SECONDS; default 5)",
    )
    return parser


def worker_settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> WorkerSettings:
    """Checks parsed flags; a bad one exits through parser.error (status 2), naming it."""
    # Checked here rather than with `choices`: argparse does not check an env-var default.
    if args.spot_notice not in SPOT_NOTICE_MODES:
        parser.error(f"--spot-notice (or NEURO_SPOT_NOTICE) must be off or imds, "
                     f"got {args.spot_notice!r}")  # fmt: skip
    if not (args.spot_poll_seconds > 0 and math.isfinite(args.spot_poll_seconds)):
        parser.error(f"--spot-poll-seconds (or NEURO_SPOT_POLL_SECONDS) must be a number > 0, "
                     f"got {args.spot_poll_seconds}")  # fmt: skip
    spot_endpoint = None
    if args.spot_notice == "imds":
        from worker.spot import metadata_endpoint

        try:
            spot_endpoint = metadata_endpoint()
        except ValueError as error:
            parser.error(str(error))
    if args.prefetch < 0:
        parser.error(f"--prefetch must be >= 0, got {args.prefetch}")
    for flag, dest in (("--decode-cache-mb", "decode_cache_mb"),
                       ("--shared-cache-mb", "shared_cache_mb")):  # fmt: skip
        # A cache can hold no more than the machine's memory: a larger bound is a typo (the
        # default always passes, even on a machine smaller than it).
        value, high = getattr(args, dest), max(_physical_memory_mb(), parser.get_default(dest))
        if not 0 <= value <= high:
            parser.error(f"{flag} must be in [0, {high}] (MB; this machine's memory), "
                         f"got {value}")  # fmt: skip
    if args.stats_file is not None:
        _check_stats_file(parser, args.stats_file)
    if args.slots < 1:
        parser.error(f"--slots must be >= 1, got {args.slots}")
    if args.atari_backend not in ATARI_BACKENDS:
        parser.error(f"--atari-backend (or NEURO_ATARI_BACKEND) must be one of "
                     f"{', '.join(ATARI_BACKENDS)}, got {args.atari_backend!r}")  # fmt: skip
    inference_engine = args.inference_engine or preferred_engine()
    try:
        check_preference(inference_engine)
    except ValueError as error:
        parser.error(f"--inference-engine (or NEURO_INFERENCE_ENGINE): {error}")
    if args.torch_threads < 1:
        parser.error(f"--torch-threads must be >= 1, got {args.torch_threads}")
    if args.envs < 0:
        parser.error(f"--envs (or NEURO_ENVS) must be >= 0, got {args.envs}")
    devices = _devices(parser, args.device)
    shares = _shares(parser, args, devices) if len(devices) > 1 else ()
    device = devices[0]
    if args.cpu is not None:
        _check_cpus(parser, args.cpu)
    cpus = len(args.cpu or allowed_cpus())
    envs = args.envs or (ENVS_PER_CPU * cpus if device.startswith("cuda") else 0)
    return WorkerSettings(
        master=args.master,
        worker_id=args.worker_id,
        prefetch=args.prefetch,
        slots=args.slots,
        atari_backend=args.atari_backend,
        inference_engine=inference_engine,
        stats_file=args.stats_file,
        torch_threads=args.torch_threads,
        noise_cache=args.noise_cache,
        decode_cache_mb=args.decode_cache_mb,
        shared_cache_mb=args.shared_cache_mb,
        give_up_after=args.give_up_after,
        log_level=args.log_level,
        token=_read_token(parser, args.token_file),
        root_certificates=_read_tls_ca(parser, args.tls_ca),
        spot_endpoint=spot_endpoint,
        spot_poll_seconds=args.spot_poll_seconds,
        device=device,
        envs=envs,
        cpus=args.cpu,
        shares=shares,
        pipeline=args.pipeline,
    )


class _DeprecatedAlias(argparse.Action):
    """A renamed flag's old name: takes its value for the new one, saying so on stderr."""

    def __init__(self, *args: Any, use: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.use = use

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:  # fmt: skip
        print(f"{parser.prog}: {option_string} is deprecated; use {self.use}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def cpu_list(text: str) -> tuple[int, ...]:
    """--cpu's value: one CPU ("3") or a kernel CPU list ("0-7,16-23")."""
    cpus = tuple(parse_cpu_list(text))
    if not cpus or min(cpus) < 0:
        raise ValueError(text)
    return cpus


def _devices(parser: argparse.ArgumentParser, value: str) -> tuple[str, ...]:
    """The devices --device names (one, or one per worker process of a fan-out); torch is
    imported only to ask about CUDA."""
    from worker.inference.devices import resolve_devices

    try:
        return resolve_devices(value)
    except ValueError as error:
        parser.error(f"--device (or NEURO_DEVICE): {error}")


def _shares(
    parser: argparse.ArgumentParser, args: argparse.Namespace, devices: tuple[str, ...]
) -> tuple[Share, ...]:
    """Each device's worker process: its CPUs and envs (worker/fanout.py's rule)."""
    from worker.fanout import plan_shares

    if args.cpu is not None:
        parser.error(f"--cpu (or NEURO_CPU) {format_cpu_list(args.cpu)} with several devices "
                     f"({','.join(devices)}): each device's worker is pinned to its share of "
                     f"the CPUs this process may use; narrow those with taskset or a "
                     f"cpuset instead")  # fmt: skip
    try:
        return plan_shares(devices, args.envs)
    except ValueError as error:
        parser.error(f"--device (or NEURO_DEVICE): {error}")


def _check_cpus(parser: argparse.ArgumentParser, cpus: tuple[int, ...]) -> None:
    named = format_cpu_list(cpus)
    if not hasattr(os, "sched_setaffinity"):
        parser.error(f"--cpu (or NEURO_CPU) {named}: pinning needs Linux (sched_setaffinity)")
    allowed = os.sched_getaffinity(0)
    outside = sorted(set(cpus) - allowed)
    if outside:
        which = "is not a CPU" if len(cpus) == 1 else f"names {format_cpu_list(outside)}, not CPUs"
        parser.error(f"--cpu (or NEURO_CPU) {named} {which} this process may run on; "
                     f"allowed: {format_cpu_list(allowed)}")  # fmt: skip


def _physical_memory_mb() -> int:
    """This machine's memory in MB (2**20 bytes); 2**20 MB (1 TiB) where it cannot be read."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    except (ValueError, OSError, AttributeError):
        return 2**20


def _check_stats_file(parser: argparse.ArgumentParser, stats_file: str) -> None:
    """Refuses a stats file the worker could not write, before it joins a master: the file is
    replaced through a temp file beside it (WorkerClient.write_stats), so that is what is
    tried here."""
    path = Path(stats_file)
    if not path.name or path.is_dir():
        parser.error(f"--stats-file {stats_file}: is a directory, not a file")
    probe = path.with_name(f".{path.name}.tmp")
    try:
        with open(probe, "w"):
            pass
        probe.unlink()
    except OSError as error:
        parser.error(f"--stats-file {stats_file}: cannot write there: "
                     f"{error.strerror or error}")  # fmt: skip


def _read_token(parser: argparse.ArgumentParser, token_file: str | None) -> str | None:
    try:
        return load_token(token_file)
    except ValueError as error:
        parser.error(str(error))


def _read_tls_ca(parser: argparse.ArgumentParser, tls_ca: str | None) -> bytes | None:
    if not tls_ca:
        return None
    try:
        return Path(tls_ca).read_bytes()
    except OSError as error:
        parser.error(f"--tls-ca {tls_ca}: {error.strerror}")
