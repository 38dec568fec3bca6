"""neuro-master: serve a GA run over gRPC, optionally with local worker processes."""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from master.config import ALGORITHMS, ARCHITECTURES, ATARI_DYNAMICS, inspect_env_id, preset

if TYPE_CHECKING:
    from master.run.s3_mirror import RunDirMirror


def _hidden_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"hidden sizes must look like 64,64, got {text!r}"
        ) from None
    if not sizes or any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"hidden sizes must be positive integers, got {text!r}")
    return sizes


def _positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds > 0 (flag or NEURO_S3_SYNC_SECONDS), got {text!r}"
        )
    return seconds


def _metrics_port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(
            f"must be a port in 0-65535 (flag or NEURO_METRICS_PORT), got {text!r}"
        )
    return port


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="neuro-master",
        description="Run the Deep GA (or ES) master: hands evaluations out as leases over gRPC.",
        epilog="neuro-master status --master HOST:PORT shows where a running master stands "
        "(neuro-master status --help).",
    )
    p.add_argument(
        "--env",
        default=os.environ.get("NEURO_ENV"),
        required="NEURO_ENV" not in os.environ,
        help="gymnasium id: Frostbite-v4, ALE/Frostbite-v5, CartPole-v1, "
        "neuro/Memorize-K10-v0, ... (env NEURO_ENV)",
    )
    p.add_argument(
        "--host",
        default=os.environ.get("NEURO_HOST", "127.0.0.1"),
        help="address to listen on (default %(default)s; 0.0.0.0 for a fleet)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("NEURO_PORT", "8080")),
        help="gRPC port (default %(default)s; 0 picks a free one)",
    )
    p.add_argument(
        "--local-workers",
        type=int,
        default=0,
        metavar="W",
        help="also start W worker processes on this machine",
    )
    p.add_argument(
        "--run-dir",
        default=os.environ.get("NEURO_RUN_DIR"),
        help="where metrics and genomes go (default runs/ENV-TIMESTAMP)",
    )
    budget = p.add_argument_group("budget (the run stops at the first one reached)")
    budget.add_argument("--generations", type=int)
    budget.add_argument("--frames", type=int, help="emulator frames (4 per Atari step)")
    budget.add_argument(
        "--target-score",
        type=float,
        help="stop once the elite's re-evaluated mean reaches this "
        "(default: the env's reward threshold, if it has one)",
    )
    budget.add_argument(
        "--no-target",
        action="store_true",
        help="never stop at a target score; run the other budgets out",
    )
    p.add_argument(
        "--algo",
        choices=ALGORITHMS,
        dest="algorithm",
        help="ga (default): the Deep GA; es: Evolution Strategies on the same fleet (a resumed "
        "run keeps its own)",
    )
    es = p.add_argument_group("evolution strategies (--algo es)")
    es.add_argument("--pairs", type=int, help="antithetic pairs per update")
    es.add_argument("--sigma", type=float, help="parameter noise standard deviation")
    es.add_argument("--learning-rate", type=float, help="Adam step size")
    es.add_argument("--weight-decay", type=float, help="L2 coefficient")
    es.add_argument(
        "--eval-episodes", type=int, help="episodes of the unperturbed parameters per update"
    )
    ga = p.add_argument_group("genetic algorithm (defaults: the paper's for Atari)")
    ga.add_argument("--population", type=int, dest="population_size")
    ga.add_argument("--truncation", type=int, help="parents per generation; 0 = random search")
    ga.add_argument("--mutation-power", type=float)
    ga.add_argument("--elite-candidates", type=int)
    ga.add_argument("--elite-episodes", type=int)
    ga.add_argument("--seed", type=int, help="seeds the whole run (default 0)")
    policy = p.add_argument_group("policy and env")
    policy.add_argument(
        "--policy",
        choices=ARCHITECTURES,
        dest="architecture",
        help="deepga (paper, 4M params), nature (1.7M), mlp (vector observations)",
    )
    policy.add_argument(
        "--hidden", type=_hidden_sizes, dest="hidden_sizes", help="mlp sizes, e.g. 64,64"
    )
    policy.add_argument(
        "--atari-dynamics",
        choices=ATARI_DYNAMICS,
        help="paper (default): the paper's protocol; registered: the env's own",
    )
    policy.add_argument(
        "--max-episode-steps",
        type=int,
        help="agent steps per training episode (Atari default 5000; 0 = env's own)",
    )
    policy.add_argument("--noise-table-size", type=int)
    policy.add_argument("--noise-table-seed", type=int)
    fleet = p.add_argument_group("fleet")
    fleet.add_argument("--lease-seconds", type=float, help="a lease lapses after this (default 60)")
    fleet.add_argument(
        "--max-task-attempts",
        type=int,
        help="failures before an evaluation is recorded as failed (default 5)",
    )
    fleet.add_argument("--episodes-per-task", type=int)
    p.add_argument(
        "--checkpoint-seconds",
        type=float,
        default=30.0,
        help="checkpoint this often within a generation (and after each one)",
    )
    fleet.add_argument(
        "--worker-arg",
        action="append",
        default=[],
        help="extra argument for local workers (repeatable)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines on stdout")
    s3 = p.add_argument_group("S3 mirror (needs pip install 'neuro[aws]')")
    s3.add_argument(
        "--s3-uri",
        default=os.environ.get("NEURO_S3_URI") or None,
        metavar="s3://BUCKET/PREFIX",
        help="mirror the run dir there, and resume from there when the run dir holds no "
        "checkpoint (env NEURO_S3_URI)",
    )
    s3.add_argument(
        "--s3-sync-seconds",
        type=_positive_seconds,
        default=os.environ.get("NEURO_S3_SYNC_SECONDS", "60"),
        metavar="SECONDS",
        help="also sync this often, besides after each checkpoint (default 60; env "
        "NEURO_S3_SYNC_SECONDS)",
    )
    monitoring = p.add_argument_group("monitoring")
    monitoring.add_argument(
        "--metrics-port",
        type=_metrics_port,
        default=os.environ.get("NEURO_METRICS_PORT") or None,
        metavar="PORT",
        help="serve Prometheus metrics on http://METRICS_HOST:PORT/metrics (env "
        "NEURO_METRICS_PORT; default: off; 0 picks a free port)",
    )
    monitoring.add_argument(
        "--metrics-host",
        default=os.environ.get("NEURO_METRICS_HOST", "127.0.0.1"),
        help="address the metrics endpoint listens on (env NEURO_METRICS_HOST; default "
        "%(default)s). It has no token: serving it beyond loopback shows the run's figures "
        "and worker ids to anyone who reaches the port",
    )
    security = p.add_argument_group("security (see README: Security)")
    # The token itself is never a flag: argv is visible to every user of the host in ps.
    security.add_argument(
        "--token-file",
        default=os.environ.get("NEURO_TOKEN_FILE"),
        help="file holding the shared worker token (env NEURO_TOKEN_FILE, or the token "
        "itself in env NEURO_TOKEN)",
    )
    security.add_argument("--tls-cert", help="PEM certificate chain: serve TLS only")
    security.add_argument("--tls-key", help="PEM private key for --tls-cert")
    security.add_argument(
        "--insecure-no-token",
        action="store_true",
        help="allow a non-loopback --host without a token (anyone who reaches the port can "
        "lease and report)",
    )
    return p


GA_FLAGS = ("population_size", "truncation", "mutation_power", "elite_candidates", "elite_episodes",
            "seed")  # fmt: skip
ES_FLAGS = ("pairs", "sigma", "learning_rate", "weight_decay", "eval_episodes")
RUN_FLAGS = ("generations", "frames", "target_score", "architecture", "hidden_sizes",
             "atari_dynamics", "max_episode_steps", "noise_table_size", "noise_table_seed",
             "lease_seconds", "max_task_attempts", "episodes_per_task")  # fmt: skip


def _setting(config, name: str):
    if name in ES_FLAGS:
        return getattr(config.es, name, None)
    return getattr(config.ga, name) if hasattr(config.ga, name) else getattr(config, name)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["status"]:
        from master.observe.status import main as status_main

        return status_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s master %(message)s")
    if args.local_workers < 0:
        parser.error(f"--local-workers must be >= 0, got {args.local_workers}")
    run_dir = Path(
        args.run_dir or f"runs/{args.env.replace('/', '_')}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    from master.observe.progress import notice_stream
    from master.run.checkpoint import CheckpointError, load_checkpoint
    from master.run.start import resume_config, run_master

    mirror = None
    if args.s3_uri is not None:
        mirror = _s3_mirror(parser, args.s3_uri)
        # Before resume-or-new: a replacement machine continues the run S3 holds.
        if not _restore(mirror, run_dir):
            return 1
    flags = GA_FLAGS + ES_FLAGS + RUN_FLAGS
    overrides = {k: getattr(args, k) for k in flags if getattr(args, k) is not None}
    if args.no_target:
        overrides["target_score"] = None
    try:
        # A run dir with a checkpoint is continued, never overwritten.
        resume = load_checkpoint(run_dir) if run_dir.exists() else None
        if resume is not None:
            budget = {k: overrides.pop(k) for k in ("generations", "frames", "target_score")
                      if k in overrides}  # fmt: skip
            saved = resume_config(resume)
            changed = sorted(k for k, v in overrides.items() if _setting(saved, k) != v)
            if changed:
                raise ValueError(
                    f"{run_dir} holds a checkpoint and resumes with its own settings; "
                    f"only the budget may change, not {changed}"
                )
            config = resume_config(resume, **budget)
            if args.algorithm not in (None, config.algorithm):
                raise ValueError(f"{run_dir} is a {config.algorithm} run, not {args.algorithm}")
            if config.env_id != args.env:
                raise ValueError(f"{run_dir} is a run on {config.env_id}, not {args.env}")
            print(f"neuro master: resuming {run_dir} at generation {resume['ga']['generation']}",
                  file=notice_stream(sys.stdout))  # fmt: skip
        else:
            config = preset(inspect_env_id(args.env), algorithm=args.algorithm or "ga", **overrides)
    except (ValueError, TypeError, CheckpointError) as error:
        parser.error(str(error))
    token, tls = _security(parser, args)

    try:
        asyncio.run(
            run_master(
                config,
                run_dir,
                args.host,
                args.port,
                local_workers=args.local_workers,
                worker_args=(*args.worker_arg, "--give-up-after", "30"),
                out=None if args.quiet else sys.stdout,
                resume=resume,
                checkpoint_seconds=args.checkpoint_seconds,
                token=token,
                tls=tls,
                mirror=mirror,
                s3_sync_seconds=args.s3_sync_seconds,
                metrics_host=args.metrics_host,
                metrics_port=args.metrics_port,
            )
        )
    except (OSError, RuntimeError) as error:
        print(f"neuro-master: {error}", file=sys.stderr)
        return 1
    return 0


def _s3_mirror(parser: argparse.ArgumentParser, uri: str) -> RunDirMirror:
    """The run dir's S3 mirror, or a usage error (exit 2) naming the URI."""
    from master.run.s3_mirror import MirrorError, RunDirMirror

    try:
        return RunDirMirror(uri)
    except (ValueError, MirrorError) as error:
        parser.error(f"--s3-uri: {error}")


def _restore(mirror: RunDirMirror, run_dir: Path) -> bool:
    """Fetches the run from S3 if the run dir holds none; False (said on stderr) if S3 failed."""
    from master.observe.progress import notice_stream
    from master.run.s3_mirror import MirrorError, OtherRunError

    try:
        restored = mirror.restore(run_dir)
    except OtherRunError as error:
        print(f"neuro-master: {error}", file=sys.stderr)
        return False
    except MirrorError as error:
        print(
            f"neuro-master: {error}\nneuro-master: not starting: the S3 prefix must be readable "
            "at start, since a new run over a prefix that holds a run would fork it",
            file=sys.stderr,
        )
        return False
    if restored:
        print(f"neuro master: restored {run_dir} from {mirror.uri}", file=notice_stream(sys.stdout),
              flush=True)  # fmt: skip
    return True


def _security(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[str | None, tuple[bytes, bytes] | None]:
    """The token and TLS material, or a usage error (exit 2) naming the flag or file at fault."""
    from master.fleet.auth import is_loopback, load_token

    try:
        token = load_token(args.token_file)
    except ValueError as error:
        parser.error(str(error))
    if token is None and not is_loopback(args.host):
        if not args.insecure_no_token:
            parser.error(
                f"--host {args.host} accepts connections from other machines: give a token "
                "(--token-file, NEURO_TOKEN_FILE or NEURO_TOKEN) or pass --insecure-no-token"
            )
        logging.warning("listening on %s without a token (--insecure-no-token)", args.host)
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    if args.tls_cert is None:
        return token, None
    if args.local_workers:
        # Local workers dial 127.0.0.1, a name the certificate rarely carries.
        parser.error("--local-workers cannot be combined with --tls-cert; start neuro-worker "
                     "--tls-ca CERT on this machine instead")  # fmt: skip
    tls = []
    for flag, path in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)):
        try:
            tls.append(Path(path).read_bytes())
        except OSError as error:
            parser.error(f"{flag} {path}: {error.strerror}")
    return token, (tls[0], tls[1])
