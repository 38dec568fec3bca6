"""neuro-master: serve a neuroevolution run (the algorithm --algo names) over gRPC, optionally
with local worker processes; `neuro-master status` asks a running master where it stands and
`neuro-master report` sets a study's results beside the paper's."""

from __future__ import annotations

import argparse
import ast
import asyncio
import contextlib
import dataclasses
import functools
import inspect
import itertools
import logging
import math
import os
import sys
import textwrap
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from master.algorithms import registry
from master.algorithms.settings import SettingsSection
from master.config import (
    ALGORITHMS,
    ATARI_DYNAMICS,
    FLAG_NAMES,
    INFERENCE_DTYPES,
    NOT_SETTINGS,
    SECTIONS,
    RunConfig,
    check_setting,
    inspect_env_id,
    preset,
)

if TYPE_CHECKING:
    from master.run.s3_mirror import RunDirMirror
    from master.run.study_mirror import StudyMirror


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


def _seconds(text: str, source: str = "") -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        where = f" ({source})" if source else ""
        raise argparse.ArgumentTypeError(
            f"must be a finite number of seconds > 0{where}, got {text!r}"
        )
    return seconds


def _positive_seconds(text: str) -> float:
    return _seconds(text, "flag or NEURO_S3_SYNC_SECONDS")


def _checkpoint_seconds(text: str) -> float:
    # 0 or less would checkpoint (and fsync) in a busy loop; NaN would never checkpoint.
    return _seconds(text)


def _test_episodes(text: str) -> int:
    from master.study.file import MAX_TEST_EPISODES

    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_TEST_EPISODES:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, {MAX_TEST_EPISODES}], "
                                         f"got {text!r}")  # fmt: skip
    return value


def _port(source: str) -> Callable[[str], int]:
    def port(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = -1
        if not 0 <= value <= 65535:
            raise argparse.ArgumentTypeError(f"must be a port in 0-65535 ({source}), got {text!r}")
        return value

    return port


_metrics_port = _port("flag or NEURO_METRICS_PORT")


def _checked(name: str, convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """A flag type that converts, then holds the value to the RunConfig setting's bounds, so a
    bad value is refused at parse time, naming the flag, before anything is written."""

    def checked(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"invalid {getattr(convert, '__name__', 'value')} value: {text!r}"
            ) from None
        try:
            check_setting(name, value)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        return value

    checked.__name__ = getattr(convert, "__name__", name)
    return checked


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="neuro-master",
        description="Serve a neuroevolution run (--algo: the Deep GA by default, ES or novelty "
        "search): hands evaluations out as leases over gRPC.",
        epilog="neuro-master status --master HOST:PORT shows where a running master stands "
        "(neuro-master status --help); neuro-master report STUDY_DIR reports a study's runs "
        "beside the paper's figures (neuro-master report --help).",
    )
    _add_serving_flags(p)
    p.add_argument(
        "--algo",
        choices=ALGORITHMS,
        dest="algorithm",
        help=f"{_algorithms_help()} (a resumed run keeps its own)",
    )
    groups = {None: p}
    for setting in _settings():
        if setting.group not in groups:
            groups[setting.group] = p.add_argument_group(setting.group)
        groups[setting.group].add_argument(setting.flag, dest=setting.name, **setting.options)
    groups[_BUDGET].add_argument(
        "--no-target",
        action="store_true",
        help="never stop at a target score; run the other budgets out",
    )
    groups[_BUDGET].add_argument(
        "--test-episodes",
        type=_test_episodes,
        default=0,
        metavar="N",
        help="once the budget is spent, the run's best elite plays N fresh episodes, not "
        "counted in the budget, written to RUN_DIR/final_test.json (default 0: none; a study "
        "takes its own, 30 unless its file says)",
    )
    groups[_FLEET].add_argument(
        "--worker-arg",
        action="append",
        default=[],
        help="extra argument for local workers (repeatable)",
    )
    groups[_FLEET].add_argument(
        "--no-overlap",
        dest="overlap",
        action="store_false",
        help="keep the barrier between phases: by default the GA's next offspring play while "
        "its elite phase runs, with the same results",
    )
    _add_study_flags(p)
    _add_s3_flags(p)
    _add_monitoring_flags(p)
    _add_security_flags(p)
    return p


def _algorithms_help() -> str:
    """Each registered algorithm and what it is; entries that share a summary share a line."""
    parts: list[tuple[list[str], str]] = []
    for name, entry in registry.REGISTRY.items():
        shown = f"{name} (default)" if name == registry.DEFAULT_ALGORITHM else name
        if parts and parts[-1][1] == entry.summary:
            parts[-1][0].append(shown)
        else:
            parts.append(([shown], entry.summary))
    return "; ".join(f"{', '.join(names)}: {summary}" for names, summary in parts)


_BUDGET = "budget (the run stops at the first one reached)"
_FLEET = "fleet"
# RunConfig's own fields that become flags, by help group and order; each settings section of
# the registry is a group of its own after the budget, all its fields flags unless it names
# them fixed (the first section with a field gives its flag: the GA's --seed is the ES's too).
# A RunConfig field no group names lands among the general options, so a new field is a flag
# at once.
_RUN_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("policy and env", ("architecture", "hidden_sizes", "policy_options", "atari_dynamics",
                        "inference_dtype", "max_episode_steps", "noise_table_size",
                        "noise_table_seed")),
    (_FLEET, ("lease_seconds", "max_task_attempts", "episodes_per_task")),
)  # fmt: skip
_BUDGET_FIELDS = ("generations", "frames", "target_score")
# RunConfig's fields that are no flag (NOT_SETTINGS: set from --env, --algo or by the run) and
# the flag names kept from before the flags were generated (FLAG_NAMES) are master.config's,
# which a study file's setting names follow too.
_TYPES: dict[str, Callable[[str], Any]] = {"hidden_sizes": _hidden_sizes}
# --policy takes a user's factory too (package.module:callable): held to master.config's check.
_CHOICES = {"atari_dynamics": ATARI_DYNAMICS, "inference_dtype": INFERENCE_DTYPES}


@dataclass(frozen=True)
class _Setting:
    """A config field as a flag: its default None means "not given", so presets apply."""

    name: str
    flag: str
    group: str | None
    section: str | None
    """The settings section that holds it ("ga", "es", "novelty"), or None for RunConfig's own."""
    options: dict[str, Any]


@functools.cache
def _settings() -> tuple[_Setting, ...]:
    """Every run setting the command line may give, generated from RunConfig and the
    registry's settings sections."""
    settings: dict[str, _Setting] = {}
    grouped = {*_BUDGET_FIELDS, *(name for _, names in _RUN_GROUPS for name in names)}
    leftover = tuple(f.name for f in dataclasses.fields(RunConfig)
                     if f.init and f.name not in grouped | NOT_SETTINGS)  # fmt: skip
    groups: list[tuple[str | None, type, tuple[str, ...], SettingsSection[Any] | None]] = [
        (_BUDGET, RunConfig, _BUDGET_FIELDS, None),
        *((_section_title(s), s.settings, _section_flags(s), s) for s in SECTIONS),
        *((title, RunConfig, names, None) for title, names in _RUN_GROUPS),
        (None, RunConfig, leftover, None),
    ]
    for group, cls, names, section in groups:
        docs, hints = _field_docs(cls), typing.get_type_hints(cls)
        flag_names = FLAG_NAMES if section is None else section.flag_names
        for name in names:
            if name in settings:
                continue  # the ES's seed is the GA's --seed
            # argparse formats help with %: a literal one in a docstring must be doubled.
            help_text = docs.get(name, "").replace("%", "%%") or None
            options: dict[str, Any] = (
                {"action": argparse.BooleanOptionalAction, "help": help_text}
                if hints[name] is bool
                else {"type": _TYPES.get(name) or _scalar(hints[name]), "help": help_text}
            )
            if cls is RunConfig and "type" in options:
                options["type"] = _checked(name, options["type"])
            if name in _CHOICES:
                options["choices"] = _CHOICES[name]
            flag = flag_names.get(name, "--" + name.replace("_", "-"))
            where = None if section is None else section.name
            settings[name] = _Setting(name, flag, group, where, options)
    return tuple(settings.values())


def _section_title(section: SettingsSection[Any]) -> str:
    """Its help group's title, naming the --algo values that use it where it asks to."""
    return section.title.format(algorithms=", ".join(registry.algorithms_using(section)))


def _section_flags(section: SettingsSection[Any]) -> tuple[str, ...]:
    return tuple(name for name in section.field_names if name not in section.fixed)


def _scalar(hint: Any) -> type:
    """The flag type of a field annotated T or T | None."""
    types = [t for t in typing.get_args(hint) or (hint,) if t is not type(None)]
    if len(types) != 1 or types[0] not in (int, float, str):
        raise TypeError(f"no flag type for {hint!r}: add it to _TYPES")
    return types[0]


def _field_docs(cls: type) -> dict[str, str]:
    """The docstrings under a dataclass's fields (the string right after each annotation)."""
    (node,) = ast.parse(textwrap.dedent(inspect.getsource(cls))).body
    assert isinstance(node, ast.ClassDef)
    docs = {}
    for field, doc in itertools.pairwise(node.body):
        if (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
                and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
                and isinstance(doc.value.value, str)):  # fmt: skip
            docs[field.target.id] = " ".join(doc.value.value.split())
    return docs


def _add_serving_flags(p: argparse.ArgumentParser) -> None:
    """Where the master listens, writes and what it starts beside itself."""
    p.add_argument(
        "--env",
        default=os.environ.get("NEURO_ENV"),
        help="gymnasium id: Frostbite-v4, ALE/Frostbite-v5, CartPole-v1, "
        "neuro/Memorize-K10-v0, mypkg:MyEnv-v0 (mypkg is imported first, on the master and "
        "every worker), ... (env NEURO_ENV); required unless --study",
    )
    p.add_argument(
        "--host",
        default=os.environ.get("NEURO_HOST", "127.0.0.1"),
        help="address to listen on (default %(default)s; 0.0.0.0 for a fleet)",
    )
    p.add_argument(
        "--port",
        type=_port("flag or NEURO_PORT"),
        default=os.environ.get("NEURO_PORT", "8080"),
        help="gRPC port (default %(default)s; 0 picks a free one; env NEURO_PORT). Another "
        "process listening there makes the master exit",
    )
    p.add_argument("--local-workers", type=int, default=0, metavar="W",
                   help="also start W worker processes on this machine, each pinned to a core "
                   "of its own where W <= the cores this process may use; 1 on a CUDA host: "
                   "the batched worker, one process per GPU, each on its share of the "
                   "cores")  # fmt: skip
    p.add_argument("--no-pin-workers", dest="pin_workers", action="store_false",
                   help="leave the local workers to the scheduler (for a host shared with "
                   "other runs)")  # fmt: skip
    p.add_argument(
        "--run-dir",
        default=os.environ.get("NEURO_RUN_DIR"),
        help="where metrics and genomes go (default runs/ENV-TIMESTAMP); one master at a time: "
        "another master on it makes this one exit",
    )
    p.add_argument(
        "--checkpoint-seconds",
        type=_checkpoint_seconds,
        default=30.0,
        help="checkpoint this often within a generation (and after each one)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines on stdout")


def _add_study_flags(p: argparse.ArgumentParser) -> None:
    from master.study.file import ready_studies

    study = p.add_argument_group("study: many runs from one file (docs/algorithms.md, Studies)")
    study.add_argument(
        "--study",
        default=os.environ.get("NEURO_STUDY") or None,
        metavar="FILE|NAME",
        help="a study file (TOML: envs x seeds x settings), or a ready study by name ("
        f"{', '.join(ready_studies())}): its runs, each with its env, settings and budget, "
        "checked whole before anything starts (env NEURO_STUDY)",
    )
    study.add_argument(
        "--study-dir",
        default=os.environ.get("NEURO_STUDY_DIR") or None,
        metavar="DIR",
        help="the study's dir: study.toml, study.json and runs/NAME/ for each run (default "
        "studies/STUDY; env NEURO_STUDY_DIR); the same command again resumes the study",
    )
    study.add_argument(
        "--dry-run",
        action="store_true",
        help="with --study: check the study (and its dir, if it exists, by the resume rules), "
        "print its runs (name, env, seed, budget, state) and exit",
    )


def _add_s3_flags(p: argparse.ArgumentParser) -> None:
    s3 = p.add_argument_group("S3 mirror (needs pip install 'neuro[aws]')")
    s3.add_argument(
        "--s3-uri",
        default=os.environ.get("NEURO_S3_URI") or None,
        metavar="s3://BUCKET/PREFIX",
        help="mirror the run dir there (a study: its study dir, each run under runs/NAME/), "
        "and resume from there when the run dir holds no checkpoint (env NEURO_S3_URI)",
    )
    s3.add_argument(
        "--s3-sync-seconds",
        type=_positive_seconds,
        default=os.environ.get("NEURO_S3_SYNC_SECONDS", "60"),
        metavar="SECONDS",
        help="also sync this often, besides after each checkpoint (default 60; env "
        "NEURO_S3_SYNC_SECONDS)",
    )


def _add_monitoring_flags(p: argparse.ArgumentParser) -> None:
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


def _add_security_flags(p: argparse.ArgumentParser) -> None:
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


def _setting(config: RunConfig, setting: _Setting) -> Any:
    """A run setting's value in a config, None where its section is absent (ES on a GA run)."""
    section = config.sections.get(setting.section) if setting.section else config
    if setting.name == "architecture" and config.policy_factory:
        return config.policy_factory  # as --policy gave it
    return getattr(section, setting.name, None)


def _dir_name(env_id: str) -> str:
    """An env id as a run dir's name: ALE/Pong-v5 -> ALE_Pong-v5, mypkg:Env-v0 -> mypkg_Env-v0."""
    return env_id.replace("/", "_").replace(":", "_")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["status"]:
        from master.observe.status import main as status_main

        return status_main(argv[1:])
    if argv[:1] == ["report"]:
        from master.observe.report_output import main as report_main

        return report_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s master %(message)s")
    from master.run.local_workers import count_problem

    if (problem := count_problem(args.local_workers)) is not None:
        parser.error(problem)
    if args.study is not None or args.dry_run:
        return _study_main(parser, args)
    if args.env is None:
        parser.error("the following arguments are required: --env (or --study)")
    run_dir = Path(args.run_dir or f"runs/{_dir_name(args.env)}-{time.strftime('%Y%m%d-%H%M%S')}")
    mirror = _s3_mirror(parser, args.s3_uri) if args.s3_uri is not None else None
    if mirror is None and not run_dir.exists():
        # A new run: its settings are refused (exit 2) before the lock makes the run dir.
        _resolve_config(parser, args, run_dir)
    token, tls = _security(parser, args)
    return _locked_run(parser, args, run_dir, mirror, token, tls)


def _locked_run(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    run_dir: Path,
    mirror: RunDirMirror | None,
    token: str | None,
    tls: tuple[bytes, bytes] | None,
) -> int:
    """Restores, resolves and serves the run holding the run dir's lock; 1 if another has it."""
    from master.run.rundir import RunDirInUse, run_dir_lock

    with contextlib.ExitStack() as held:
        try:
            # Held until the master has stopped: one master per run dir.
            held.enter_context(run_dir_lock(run_dir))
        except (RunDirInUse, OSError) as error:
            print(f"neuro-master: {_lock_error(run_dir, error)}", file=sys.stderr)
            return 1
        # Before resume-or-new: a replacement machine continues the run S3 holds.
        if mirror is not None and not _restore(mirror, run_dir):
            return 1
        # Decided under the lock: the master that held it may have left a checkpoint.
        config, resume = _resolve_config(parser, args, run_dir)
        return _serve(args, config, run_dir, resume, mirror, token, tls)


def _lock_error(run_dir: Path, error: Exception) -> str:
    if isinstance(error, OSError) and error.strerror:
        return f"cannot lock run dir {run_dir}: {error.strerror}"
    return str(error)


def _study_main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """--study: the study file and its dir checked (exit 2, naming the run and the value); with
    --dry-run its runs are printed, else served (master.run.study_master) holding the study
    dir's lock: 0 once every run is complete, 1 if one failed or the master could not serve,
    128 + N on signal N (the same command resumes the study)."""
    from master.run.local_workers import batched_local_workers, listed_gpus
    from master.run.rundir import RunDirInUse, run_dir_lock
    from master.study.file import StudyError, load_study
    from master.study.listing import study_listing
    from master.study.studydir import StudyDir, StudyDirError

    if args.study is None:
        parser.error("--dry-run goes with --study FILE|NAME")
    _refuse_run_flags(parser, args)
    batched = batched_local_workers(args.worker_arg, args.local_workers, listed_gpus())
    try:
        study = load_study(args.study, batched)
        study_dir = StudyDir(args.study_dir or Path("studies") / study.name)
        plan = study_dir.plan(study)
    except (StudyError, StudyDirError) as error:
        parser.error(str(error))
    if args.dry_run:
        print("\n".join(study_listing(study, study_dir, plan)))
        return 0
    mirror = _study_mirror(parser, args.s3_uri, study_dir.path) if args.s3_uri else None
    token, tls = _security(parser, args)
    with contextlib.ExitStack() as held:
        try:
            # Held while the study is served: one master per study dir.
            held.enter_context(run_dir_lock(study_dir.path))
        except (RunDirInUse, OSError) as error:
            print(f"neuro-master: {_lock_error(study_dir.path, error)}", file=sys.stderr)
            return 1
        # Before the plan: a replacement machine continues the study S3 holds.
        if mirror is not None and not _restore_study(mirror, [run.name for run in study.runs]):
            return 1
        try:
            # Decided under the lock: the master that held it may have moved runs on.
            plan = study_dir.open(study)
        except OSError as error:
            print(f"neuro-master: cannot write {study_dir.path}: {error}", file=sys.stderr)
            return 1
        except StudyDirError as error:
            parser.error(str(error))
        return _serve_study(args, study, study_dir, plan, token, tls, mirror)


def _study_mirror(parser: argparse.ArgumentParser, uri: str, study_dir: Path) -> StudyMirror:
    """The study dir's S3 mirror, or a usage error (exit 2) naming the URI."""
    from master.run.s3_mirror import MirrorError
    from master.run.study_mirror import StudyMirror

    try:
        return StudyMirror(uri, study_dir)
    except (ValueError, MirrorError) as error:
        parser.error(f"--s3-uri: {error}")


def _restore_study(mirror: StudyMirror, names: list[str]) -> bool:
    """Fetches the runs S3 holds that the study dir does not; False (said on stderr) if S3
    failed."""
    from master.observe.progress import notice_stream
    from master.run.s3_mirror import MirrorError

    try:
        restored = mirror.restore(names)
    except MirrorError as error:
        print(f"neuro-master: {error}\nneuro-master: not starting: the S3 prefix must be "
              "readable at start, since a study over a prefix that holds one would fork it",
              file=sys.stderr)  # fmt: skip
        return False
    if restored:
        print(f"neuro master: restored {len(restored)} run(s) of the study from {mirror.uri}: "
              f"{', '.join(restored)}", file=notice_stream(sys.stdout), flush=True)  # fmt: skip
    return True


def _serve_study(
    args: argparse.Namespace,
    study: Any,
    study_dir: Any,
    plan: Any,
    token: str | None,
    tls: tuple[bytes, bytes] | None,
    mirror: StudyMirror | None,
) -> int:
    """Serves the opened study to its end; the exit status _study_main describes."""
    from master.run import start
    from master.run.local_workers import study_placement
    from master.run.study import StudyRunPlan
    from master.run.study_master import StudyServing, run_study

    plans = [
        StudyRunPlan(run.name, run.env, run.seed, run.label, run.config, run.test_episodes,
                     study_dir.run_dir(run.name), plan.states[run.name])
        for run in study.runs
    ]  # fmt: skip
    networks = [(run.config.inference_dtype, run.config.architecture) for run in study.runs]
    options = _run_options(args, *study_placement(networks))
    serving = StudyServing(study.name, plans, study_dir, study.max_concurrent_runs,
                           study_dir.path, mirror)  # fmt: skip
    serve = start.ServeOptions(args.host, args.port, token, tls)
    try:
        states = asyncio.run(run_study(serving, serve, options))
    except (OSError, RuntimeError) as error:
        print(f"neuro-master: {error}", file=sys.stderr)
        return getattr(error, "exit_code", 1)  # stopped unfinished: start.RunStopped
    failed = [name for name, state in states.items() if state == "failed"]
    if failed:
        errors = "; ".join(f"{name}: {study_dir.error(name) or 'failed'}" for name in failed)
        print(f"neuro-master: {len(failed)} of the study's {len(states)} runs failed ({errors}); "
              "the others are complete. A failed run stays failed while its run dir exists: "
              "remove it and start the study again to run it anew", file=sys.stderr)  # fmt: skip
        return 1
    return 0


def _refuse_run_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A study's runs take their env, algorithm, settings and run dirs from the study: a flag
    that would set them is refused, naming it (their environment variables are left alone)."""
    given = [s.flag for s in _settings() if getattr(args, s.name) is not None]
    flags = (("--algo", args.algorithm is not None), ("--no-target", args.no_target),
             ("--test-episodes", args.test_episodes != 0))  # fmt: skip
    given += [flag for flag, on in flags if on]
    for flag, value, variable in (("--env", args.env, "NEURO_ENV"),
                                  ("--run-dir", args.run_dir, "NEURO_RUN_DIR")):  # fmt: skip
        if value is not None and value != os.environ.get(variable):
            given.append(flag)
    if given:
        parser.error(f"{given[0]}: a study's runs take their envs, settings and run dirs from "
                     "the study file and its dir (--study-dir)")  # fmt: skip


def _resolve_config(
    parser: argparse.ArgumentParser, args: argparse.Namespace, run_dir: Path
) -> tuple[RunConfig, dict[str, Any] | None]:
    """The run's config and the checkpoint it resumes from (None: a new run), or exit 2."""
    from master.run.checkpoint import CheckpointError, load_checkpoint
    from master.run.local_workers import batched_local_workers, listed_gpus

    settings = {s.name: s for s in _settings()}
    overrides = {k: getattr(args, k) for k in settings if getattr(args, k) is not None}
    if args.no_target:
        overrides["target_score"] = None
    try:
        # A run dir with a checkpoint is continued, never overwritten.
        resume = load_checkpoint(run_dir) if run_dir.exists() else None
        if resume is None:
            kind = inspect_env_id(args.env)
            batched = batched_local_workers(args.worker_arg, args.local_workers, listed_gpus())
            algorithm = args.algorithm or registry.DEFAULT_ALGORITHM
            config = preset(kind, batched, algorithm=algorithm, **overrides)
            if config.policy is not None:
                from master.run.algorithm_setup import user_network_layout

                user_network_layout(config)  # the factory, built once here: refused now if bad
            return config, None
        return _resumed_config(args, run_dir, resume, overrides, settings), resume
    except (ValueError, TypeError, CheckpointError) as error:
        parser.error(str(error))


def _resumed_config(
    args: argparse.Namespace,
    run_dir: Path,
    resume: dict[str, Any],
    overrides: dict[str, Any],
    settings: dict[str, _Setting],
) -> RunConfig:
    """The checkpoint's config with a new budget; ValueError if any other flag changes it."""
    from master.observe.progress import notice_stream
    from master.run.checkpoint import algorithm_section
    from master.run.start import resume_config
    from neuro.policy_spec import ModuleUnavailable

    budget = {k: overrides.pop(k) for k in ("generations", "frames", "target_score")
              if k in overrides}  # fmt: skip
    try:
        saved = resume_config(resume)
    except ModuleUnavailable:
        raise  # the env's package is missing here: the checkpoint is fine, named as it is
    except (ValueError, TypeError, KeyError) as error:
        # E.g. a bad value an older master accepted (lease_seconds 0): refused, never run.
        why = f"no {error.args[0]!r} setting" if isinstance(error, KeyError) else str(error)
        raise ValueError(
            f"{run_dir} holds a checkpoint whose settings cannot run ({why}); it cannot be "
            "resumed: start the run in a new --run-dir"
        ) from None
    changed = sorted(k for k, v in overrides.items() if _setting(saved, settings[k]) != v)
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
    generation = algorithm_section(resume)[1]["generation"]
    print(f"neuro master: resuming {run_dir} at generation {generation}",
          file=notice_stream(sys.stdout))  # fmt: skip
    return config


def _serve(
    args: argparse.Namespace,
    config: RunConfig,
    run_dir: Path,
    resume: dict[str, Any] | None,
    mirror: RunDirMirror | None,
    token: str | None,
    tls: tuple[bytes, bytes] | None,
) -> int:
    """Runs the master to the end; 1 (said on stderr) if it could not listen or start."""
    from master.run import start

    serve = start.ServeOptions(args.host, args.port, token, tls)
    options = _run_options(args, config.inference_dtype, config.architecture, mirror=mirror,
                           test_episodes=args.test_episodes)  # fmt: skip
    try:
        asyncio.run(start.run_master(config, run_dir, serve, options, resume=resume))
    except (OSError, RuntimeError) as error:
        print(f"neuro-master: {error}", file=sys.stderr)
        return getattr(error, "exit_code", 1)  # a run stopped unfinished: start.RunStopped
    return 0


def _run_options(args: argparse.Namespace, *network: Any, **run_only: Any) -> Any:
    """start.RunOptions from the flags a run and a study share: the local workers placed for
    the `network` (dtype, architecture) they will run, the output, checkpoints, S3 pacing,
    /metrics and the overlap; `run_only`: a single run's (its mirror, its final test)."""
    from master.run import start
    from master.run.local_workers import (
        describe_local_workers,
        listed_gpus,
        local_worker_args,
        pinned_cpus,
    )

    placement = (args.worker_arg, args.local_workers, *network)
    worker_cpus = pinned_cpus(args.pin_workers, *placement)
    if args.local_workers:
        logging.info(describe_local_workers(*placement, worker_cpus, listed_gpus()))
    return start.RunOptions(
        local_workers=args.local_workers,
        worker_args=local_worker_args(*placement),
        worker_cpus=worker_cpus,
        out=None if args.quiet else sys.stdout,
        checkpoint_seconds=args.checkpoint_seconds,
        s3_sync_seconds=args.s3_sync_seconds,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        overlap=args.overlap,
        **run_only,
    )


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
