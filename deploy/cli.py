"""neuro-deploy: run neuro on AWS (master on EC2, workers on Spot) from one CloudFormation stack."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import botocore.exceptions

from deploy import cost, fleet, stack
from deploy.cost_commands import cost_so_far, describe_cost_so_far
from deploy.estimate import cmd_estimate
from deploy.stack import Clients, DeployError, StackInfo
from deploy.stack_study import StackStudy, resolve_study

DEFAULT_STACK = "neuro"
# Every template parameter has exactly one flag; tests hold this table and the template equal.
TEMPLATE_PARAMETERS: dict[str, str] = {
    "EnvId": "env",
    # Both from --study: a ready study's name, or a study file's digest (deploy/stack_study.py).
    "Study": "study_name",
    "StudyFileSha256": "study_file_sha256",
    "WorkerCount": "workers",
    "WorkerCapacity": "capacity",
    "WorkerMemory": "worker_memory",
    "WorkerInstanceTypes": "worker_instance_types",
    "WorkerGpu": "worker_gpu",
    "WorkerGpuInstanceTypes": "worker_gpu_instance_types",
    "MasterInstanceType": "master_instance_type",
    "MasterImage": "master_image",
    "WorkerImage": "worker_image",
    "VpcId": "vpc_id",
    "SubnetIds": "subnet_ids",
    "AssignPublicIp": "assign_public_ip",
    "Population": "population",
    "Truncation": "truncation",
    "MutationPower": "mutation_power",
    "FrameBudget": "frames",
    "LogRetentionDays": "log_retention_days",
    "MasterAmi": "master_ami",
    "WorkerAmi": "worker_ami",
    "WorkerGpuAmi": "worker_gpu_ami",
}
LOG_STREAMS = {"master": "master", "workers": "worker/", "all": None}
# deploy/throughput.json holds figures measured on CPU workers only.
GPU_UNPRICED = (
    "GPU workers are not priced: deploy/throughput.json has no measured GPU worker throughput, "
    "so frames cannot be turned into GPU-hours"
)


def _nonnegative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


def _whole(low: int, high: int, why: str) -> Callable[[str], int]:
    """A whole number in [low, high]; `why` says where the upper bound comes from."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected {low} or more, got {text!r}")
        if value > high:
            raise argparse.ArgumentTypeError(f"expected at most {high} ({why}), got {text!r}")
        return value

    return parse


def _positive(high: float, why: str) -> Callable[[str], float]:
    """A finite number above 0 and at most `high`; 1e9 and 1_000_000_000 both read as a
    billion."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"expected a number above 0, got {text!r}")
        if value > high:
            raise argparse.ArgumentTypeError(f"expected at most {high:g} ({why}), got {text!r}")
        return value

    return parse


def _price(high: float, unit: str) -> Callable[[str], float]:
    """A finite price in USD per `unit`, from 0 (capacity already paid for) to `high`."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a price in USD, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite price in USD, got {text!r}")
        if value < 0:
            raise argparse.ArgumentTypeError(f"a price cannot be negative, got {text!r}")
        if value > high:
            raise argparse.ArgumentTypeError(
                f"expected at most {high:g} USD per {unit} (no AWS price comes near), got {text!r}"
            )
        return value

    return parse


def _duration(text: str) -> float:
    """Seconds from '90', '90s', '15m', '2h' or '1d'."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "s")
    try:
        seconds = float(number) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a duration like 15m or 2h, got {text!r}"
        ) from None
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"a duration cannot be negative, got {text!r}")
    return seconds


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="neuro-deploy",
        description="Run neuro on AWS: the master on an on-demand EC2 instance, 1-vCPU workers "
        "on Spot, the run dir in S3 (see README: Run on AWS).",
    )
    parser.add_argument(
        "--stack-name",
        default=os.environ.get("NEURO_STACK", DEFAULT_STACK),
        help="CloudFormation stack (env NEURO_STACK, default %(default)s)",
    )
    parser.add_argument("--region", help="AWS region (default: AWS_REGION or your profile's)")
    parser.add_argument("--profile", help="AWS profile (default: AWS_PROFILE or default)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    estimate = commands.add_parser(
        "estimate",
        help="vCPU-hours, wall clock and dollars of a run or a study, and which fleet size "
        "finishes soonest for the money, before `up` (README: What a run costs)",
    )
    budget = estimate.add_mutually_exclusive_group()
    budget.add_argument(
        "--frames",
        type=_positive(cost.MAX_FRAMES, "more than the largest fleet plays in a year"),
        help="frame budget (default the paper's 1e9 Atari frames)",
    )
    budget.add_argument(
        "--generations",
        type=_whole(1, cost.MAX_GENERATIONS, "a plan, not a typo"),
        help="a budget in generations (needs --episode-steps)",
    )
    budget.add_argument(
        "--study",
        metavar="FILE",
        help="a study file (TOML, as neuro-master --study takes): its runs' budgets, "
        "generations and max_concurrent_runs",
    )
    estimate.add_argument(
        "--population",
        type=_whole(1, cost.MAX_POPULATION, "a plan, not a typo"),
        help="with --generations (1000)",
    )
    estimate.add_argument(
        "--episode-steps",
        type=_positive(cost.MAX_EPISODE_STEPS, "a worker's cap on an episode"),
        help="mean episode length in agent steps (4 frames each), with --generations; "
        "with --study, for runs budgeted in generations and the final tests",
    )
    estimate.add_argument(
        "--elite-candidates",
        type=_whole(1, cost.MAX_ELITE, "a plan, not a typo"),
        default=cost.ELITE_CANDIDATES,
        help="with --generations (default %(default)s)",
    )
    estimate.add_argument(
        "--elite-episodes",
        type=_whole(1, cost.MAX_ELITE, "a plan, not a typo"),
        default=cost.ELITE_EPISODES,
        help="with --generations (default %(default)s)",
    )
    estimate.add_argument(
        "--workers",
        type=_whole(1, cost.MAX_WORKERS, "ECS's quota of tasks per service"),
        help="1-vCPU workers (default 16)",
    )
    estimate.add_argument(
        "--capacity", choices=cost.CAPACITIES, help="as for up (default fargate-spot)"
    )
    low, high = cost.WORKER_MEMORY_MIB
    estimate.add_argument(
        "--worker-memory",
        type=_whole(low, high, "the template's WorkerMemory range"),
        help="MiB per worker (4096; fargate-spot: 2048-8192 in steps of 1024)",
    )
    estimate.add_argument("--worker-instance-types", help="Spot host types for ec2-spot")
    estimate.add_argument(
        "--worker-gpu",
        action="store_true",
        help="as for up; refused: only CPU workers have a measured throughput to price",
    )
    estimate.add_argument(
        "--fleet-sizes",
        nargs="+",
        metavar="N",
        type=_whole(1, cost.MAX_WORKERS, "ECS's quota of tasks per service"),
        help=f"fleet sizes to compare (default: {', '.join(f'{n:,}' for n in fleet.FLEET_SIZES)})",
    )
    estimate.add_argument("--master-instance-type", help="default c5.large")
    estimate.add_argument(
        "--network", choices=("deepga", "nature"), help="measured network (default deepga)"
    )
    estimate.add_argument(
        "--inference-dtype",
        choices=("float32", "bfloat16", "int8", "int8-static"),
        help="default int8-static, the master's on CPU workers",
    )
    _price_flags(estimate)
    estimate.add_argument("--json", action="store_true", help="print one JSON object")

    up = commands.add_parser("up", help="create the stack, wait, print the master's address")
    up.add_argument("--env", help="gymnasium id, e.g. Frostbite-v4 (template default)")
    up.add_argument(
        "--study",
        metavar="FILE|NAME",
        help="serve a study instead of one run: a study file (TOML, up to 1 MiB, uploaded to "
        "the stack's bucket as it is created) or a ready study by name (paper, laptop); its "
        "runs take their envs, settings and budgets from it, so --env, --population, "
        "--truncation, --mutation-power and --frames go without it",
    )
    # Set from --study by check_up; "" passes the template's empty default: one run.
    up.set_defaults(study_name="", study_file_sha256="", stack_study=None)
    up.add_argument(
        "--workers",
        type=_nonnegative,
        help="worker containers: 1 vCPU each, or 1 GPU each with --worker-gpu",
    )
    up.add_argument("--master-image", required=True, help="image URI built from Dockerfile.master")
    up.add_argument("--worker-image", required=True, help="image URI built from Dockerfile.worker")
    up.add_argument(
        "--capacity",
        choices=("fargate-spot", "ec2-spot"),
        help="fargate-spot (default): ECS on Fargate Spot; ec2-spot: ECS on an Auto Scaling "
        "group of Spot hosts (cheaper per vCPU, shares the noise table per host)",
    )
    up.add_argument("--worker-memory", type=int, help="MiB per worker (default 4096)")
    up.add_argument("--worker-instance-types", help="Spot host types for ec2-spot, comma-separated")
    # "true" rather than a bool: the template parameter takes the strings true and false, and
    # leaving the flag out keeps the template's default.
    up.add_argument(
        "--worker-gpu",
        action="store_const",
        const="true",
        help="one worker per GPU (neuro-worker --device cuda) on EC2 Spot GPU hosts; implies "
        "--capacity ec2-spot; --worker-image must then be the CUDA build of Dockerfile.worker "
        "(--build-arg TORCH_INDEX=cu128)",
    )
    up.add_argument(
        "--worker-gpu-instance-types",
        help="Spot GPU host types with --worker-gpu, comma-separated "
        "(default g5.xlarge,g4dn.xlarge,g6.xlarge)",
    )
    up.add_argument("--master-instance-type", help="default c5.large")
    up.add_argument("--vpc-id", help="default: the region's default VPC")
    up.add_argument("--subnet-ids", help="comma-separated; default: the default VPC's subnets")
    up.add_argument(
        "--assign-public-ip",
        choices=("ENABLED", "DISABLED"),
        help="DISABLED for private subnets with a NAT gateway (default ENABLED)",
    )
    up.add_argument("--population", type=int, help="GA population N (default 1000)")
    up.add_argument("--truncation", type=int, help="GA parents T (default 20)")
    up.add_argument("--mutation-power", type=float, help="GA sigma (default 0.002)")
    up.add_argument("--frames", type=int, help="frame budget (default 1,000,000,000)")
    up.add_argument("--log-retention-days", type=int, help="CloudWatch retention (default 30)")
    up.add_argument("--master-ami", help="AMI id or SSM parameter path for the master")
    up.add_argument("--worker-ami", help="ECS-optimized AMI id or SSM path for ec2-spot hosts")
    up.add_argument(
        "--worker-gpu-ami", help="ECS GPU-optimized AMI id or SSM path for --worker-gpu hosts"
    )
    _wait_flags(up)

    status = commands.add_parser("status", help="stack state, workers and the run's progress")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.add_argument(
        "--cost",
        action="store_true",
        help="price the cost so far at the region's current prices (Spot price history or "
        "the Price List; needs pricing:GetProducts)",
    )
    _price_flags(status)

    scale = commands.add_parser("scale", help="change the number of workers")
    scale.add_argument("workers", type=_nonnegative)
    _wait_flags(scale)

    logs = commands.add_parser("logs", help="print the master's or workers' logs")
    logs.add_argument("--stream", choices=tuple(LOG_STREAMS), default="master")
    logs.add_argument("--since", type=_duration, default=600.0, help="e.g. 15m (default 10m)")
    logs.add_argument("--follow", action="store_true", help="keep printing new lines")
    logs.add_argument(
        "--follow-for", type=_duration, default=None, help="stop following after this long"
    )

    fetch = commands.add_parser(
        "fetch", help="download the run dir (metrics, checkpoints, genomes)"
    )
    fetch.add_argument("--to", type=Path, help="destination (default ./STACK-NAME)")

    down = commands.add_parser("down", help="delete the stack (the run's S3 bucket is kept)")
    down.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    _wait_flags(down)
    return parser


def _price_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--price",
        type=_price(cost.MAX_PRICE_PER_VCPU_HOUR, "vCPU-hour"),
        metavar="USD_PER_VCPU_HOUR",
        help="worker price instead of the region's current one (estimate: then asks AWS nothing)",
    )
    parser.add_argument(
        "--master-price",
        type=_price(cost.MAX_PRICE_PER_HOUR, "hour"),
        metavar="USD_PER_HOUR",
        help="the master instance's price instead of the Price List's on-demand one",
    )


def _wait_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-wait", action="store_true", help="return once AWS accepts it")
    parser.add_argument("--timeout", type=_duration, default=3600.0, help="default 1h")
    parser.add_argument(
        "--poll-seconds",
        type=float,
        default=float(os.environ.get("NEURO_DEPLOY_POLL_SECONDS", "10")),
        help=argparse.SUPPRESS,
    )


def template_parameters(
    args: argparse.Namespace, defaults: dict[str, str | None] | None = None
) -> dict[str, str]:
    """The flags given, and the template's defaults for the rest: `up` passes every parameter.

    Passing all of them pins the defaults of this release into the stack, so a later `scale`
    (UsePreviousValue) never changes a setting the user did not touch.
    """
    parameters = {}
    for key, dest in TEMPLATE_PARAMETERS.items():
        value = getattr(args, dest, None)
        if value is None and defaults is not None:
            value = defaults.get(key)
        if value is None and defaults is not None:
            raise DeployError(f"--{dest.replace('_', '-')} is needed: the template has no default")
        if value is not None:
            parameters[key] = str(value)
    return parameters


def gpu_capacity(args: argparse.Namespace) -> None:
    """Checks the GPU flags of `up` and sets the capacity GPU workers need (ec2-spot)."""
    if args.worker_gpu is None:
        if args.worker_gpu_instance_types is not None:
            raise DeployError("--worker-gpu-instance-types goes with --worker-gpu")
        return
    if args.capacity == "fargate-spot":
        raise DeployError("--worker-gpu needs --capacity ec2-spot: Fargate Spot has no GPUs")
    args.capacity = "ec2-spot"


def cmd_up(clients: Clients, args: argparse.Namespace, out: Callable[[str], None]) -> int:
    if (args.vpc_id is None) != (args.subnet_ids is None):
        raise DeployError("--vpc-id and --subnet-ids go together")
    gpu_capacity(args)
    if args.vpc_id is None:
        args.vpc_id, subnets = stack.default_network(clients)
        args.subnet_ids = ",".join(subnets)
        out(f"network: default VPC {args.vpc_id}, subnets {args.subnet_ids}")
    defaults = stack.template_defaults(clients)
    unknown = set(defaults) ^ set(TEMPLATE_PARAMETERS)
    if unknown:
        raise DeployError(f"this neuro-deploy and its template disagree on {sorted(unknown)}")
    parameters = template_parameters(args, defaults)
    if stack.describe(clients, args.stack_name) is None:  # never re-pin a live stack's AMIs
        for parameter, ami in stack.pin_amis(clients, args.stack_name, parameters).items():
            out(f"{parameter}: {ami}, pinned as {parameters[parameter]}")
    stack.create(clients, args.stack_name, parameters)
    out(f"creating stack {args.stack_name} in {clients.region}")
    seen: set[str] = set()
    study: StackStudy | None = args.stack_study
    if study is not None and study.data is not None:
        uri = stack.upload_study(
            clients, args.stack_name, study.data, study.sha256, args.timeout,
            args.poll_seconds, _event_printer(out), seen,
        )  # fmt: skip
        out(f"study file: {uri}")
    if args.no_wait:
        return 0
    stack.wait(clients, args.stack_name, args.timeout, args.poll_seconds, _event_printer(out), seen)
    info = stack.require(clients, args.stack_name)
    out(f"master: {info.outputs.get('MasterAddress', '?')} (inside the VPC)")
    out(f"run dir: {info.outputs.get('RunS3Uri', '?')}")
    out(f"logs: {info.outputs.get('LogGroupName', '?')}  (neuro-deploy logs)")
    return 0


def check_up(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """`up --study`: the study resolved into the template's parameters before anything is asked
    of AWS, and the one-run flags it replaces refused; parser.error (exit 2) names the value."""
    if args.study is None:
        return
    given = [flag for flag, dest in (("--env", "env"), ("--population", "population"),
                                     ("--truncation", "truncation"),
                                     ("--mutation-power", "mutation_power"), ("--frames", "frames"))
             if getattr(args, dest) is not None]  # fmt: skip
    if given:
        parser.error(f"{given[0]}: a study's runs take their envs, settings and budgets from "
                     f"the study (--study {args.study})")  # fmt: skip
    try:
        study = resolve_study(args.study, stack.ready_studies(), gpu=args.worker_gpu is not None)
    except DeployError as error:
        parser.error(str(error))
    args.stack_study = study
    args.study_name, args.study_file_sha256 = study.name, study.sha256


def cmd_estimate_cpu(
    clients: Clients | None, args: argparse.Namespace, out: Callable[[str], None]
) -> int:
    """`estimate`, which prices CPU workers only: a GPU run is refused rather than priced as
    if each GPU worker were a 1-vCPU one."""
    if args.worker_gpu:
        raise DeployError(GPU_UNPRICED)
    return cmd_estimate(clients, args, out)


def cmd_status(clients: Clients, args: argparse.Namespace, out: Callable[[str], None]) -> int:
    info = stack.require(clients, args.stack_name)
    workers = stack.worker_counts(clients, info)
    run = stack.run_status(clients, info)
    gpu = info.parameters.get("WorkerGpu") == "true"
    study = _stack_study(info)
    studied = None if study is None else stack.study_states(clients, info)
    # The cost model charges measured CPU frames per vCPU-hour: no figure for GPU workers.
    spent = None if gpu else cost_so_far(clients, args, info, run)
    if args.json:
        out(
            json.dumps(
                {
                    "stack": info.name,
                    "stack_status": info.status,
                    "outputs": info.outputs,
                    "workers": workers,
                    "run": run,
                    **({} if study is None else {"study": {**study, "runs": studied}}),
                    "cost": spent,
                    **({"cost_unpriced": GPU_UNPRICED} if gpu else {}),
                },
                sort_keys=True,
                default=str,
                allow_nan=False,
            )
        )
        return 0
    out(f"stack {info.name}: {info.status}" + (f" ({info.reason})" if info.reason else ""))
    master, instance = (info.outputs.get(k, "-") for k in ("MasterAddress", "MasterInstanceId"))
    out(f"master: {master} ({instance})")
    if workers is None:
        out("workers: no ECS service yet")
    else:
        out(
            f"workers: {workers['running']} running, {workers['pending']} pending, "
            f"{workers['desired']} desired ({info.parameters.get('WorkerCapacity', '?')}"
            + (", one per GPU)" if gpu else ")")
        )
    out(_describe_run(run, info.outputs.get("RunS3Uri", "-")))
    if study is not None:
        out(_describe_study(study, studied))
    for line in [f"cost so far: {GPU_UNPRICED}"] if gpu else describe_cost_so_far(spent):
        out(line)
    return 0


def _stack_study(info: StackInfo) -> dict[str, str] | None:
    """The stack's study: {"name": ...} or {"sha256": ..., "file": s3 URI}; None for one run."""
    name, sha256 = info.parameters.get("Study"), info.parameters.get("StudyFileSha256")
    if name:
        return {"name": name}
    if sha256:
        bucket = info.outputs.get("RunBucket", "?")
        return {"sha256": sha256, "file": f"s3://{bucket}/{stack.study_key(info.name, sha256)}"}
    return None


def _describe_study(study: dict[str, str], states: dict[str, int] | None) -> str:
    which = study.get("name") or f"file {study['file']} (sha256 {study['sha256'][:12]}...)"
    if states is None:
        return f"study {which}: no study.json under the run dir yet"
    counts = ", ".join(f"{count} {state}" for state, count in states.items())
    return f"study {which}: {sum(states.values())} runs: {counts}"


def _describe_run(run: dict[str, Any] | None, uri: str) -> str:
    if run is None:
        return f"run: no status in {uri} yet (the master uploads one within a minute of starting)"
    # Each figure as the master wrote it, or "?" where status.json holds no number there: a
    # damaged file must not end `status` with a traceback.
    updated = _number(run.get("updated_at"))
    age = "?" if updated is None else f"{time.time() - updated:.0f}"
    state = "complete" if run.get("run_complete") else f"{run.get('phase', '?')} phase"
    elite = _number(run.get("elite_score"))
    elite_text = "-" if elite is None else f"{elite:,.1f}"
    return (
        f"run {run.get('env_id', '?')}: generation {_count(run, 'generation', '?')} ({state}), "
        f"{_count(run, 'frames')} frames, elite {elite_text}, "
        f"{_count(run, 'workers')} workers connected, {_count(run, 'leases_reissued')} leases "
        f"re-issued; as of {age} s ago\nrun dir: {uri}"
    )


def _number(value: Any) -> float | None:
    """A finite number of status.json, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if -1e300 < value < 1e300 else None


def _count(run: dict[str, Any], key: str, missing: str = "0") -> str:
    """status.json's count under `key`, with thousands separators; `missing` if absent."""
    if key not in run:
        return missing
    value = run[key]
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    number = _number(value)
    if number is None:
        return "?"
    return f"{int(number):,}" if number.is_integer() else f"{number:,.1f}"


def cmd_scale(clients: Clients, args: argparse.Namespace, out: Callable[[str], None]) -> int:
    if not stack.update_worker_count(clients, args.stack_name, args.workers):
        out(f"stack {args.stack_name} already has {args.workers} workers")
        return 0
    out(f"scaling {args.stack_name} to {args.workers} workers")
    if not args.no_wait:
        stack.wait(clients, args.stack_name, args.timeout, args.poll_seconds, _event_printer(out))
        out(f"stack {args.stack_name}: {args.workers} workers")
    return 0


def cmd_logs(clients: Clients, args: argparse.Namespace, out: Callable[[str], None]) -> int:
    info = stack.require(clients, args.stack_name)
    start_ms = int((time.time() - args.since) * 1000)
    prefix = LOG_STREAMS[args.stream]
    seen: set[str] = set()
    stop_at = None if args.follow_for is None else time.monotonic() + args.follow_for
    while True:
        for event in stack.log_events(clients, info, prefix, start_ms):
            if event["eventId"] in seen:
                continue
            seen.add(event["eventId"])
            start_ms = max(start_ms, event["timestamp"])
            stamp = datetime.fromtimestamp(event["timestamp"] / 1000, UTC).strftime("%H:%M:%S")
            out(f"{stamp} {event['logStreamName']}: {event['message'].rstrip()}")
        if not args.follow or (stop_at is not None and time.monotonic() >= stop_at):
            return 0
        time.sleep(2.0)


def cmd_fetch(clients: Clients, args: argparse.Namespace, out: Callable[[str], None]) -> int:
    info = stack.require(clients, args.stack_name)
    destination = args.to or Path(args.stack_name)
    fetched = stack.fetch_run(clients, info, destination)
    total = sum(size for _, size in fetched)
    out(f"fetched {len(fetched)} files ({total:,} bytes) from {info.outputs['RunS3Uri']} "
        f"to {destination}")  # fmt: skip
    if _stack_study(info) is not None:
        out(f"report the study: neuro-master report {destination}")
    else:
        out(f"replay the best genome: neuro-eval {destination / 'best_genome.json'} --episodes 30")
    return 0


def cmd_down(clients: Clients, args: argparse.Namespace, out: Callable[[str], None]) -> int:
    info = stack.require(clients, args.stack_name)
    if not args.yes:
        if not sys.stdin.isatty():
            raise DeployError("refusing to delete without --yes when not on a terminal")
        answer = input(f"delete stack {args.stack_name} and stop its run? type its name: ")
        if answer.strip() != args.stack_name:
            out("not deleted")
            return 1
    stack.delete(clients, args.stack_name)
    out(f"deleting stack {args.stack_name}")
    if not args.no_wait:
        stack.wait(clients, args.stack_name, args.timeout, args.poll_seconds, _event_printer(out))
        stack.unpin_amis(clients, args.stack_name)
        out(f"stack {args.stack_name} deleted")
    bucket = info.outputs.get("RunBucket")
    if bucket:
        out(f"the run's bucket s3://{bucket} is kept; `neuro-deploy fetch` before deleting it")
    return 0


def _event_printer(out: Callable[[str], None]) -> Callable[[dict[str, Any]], None]:
    def show(event: dict[str, Any]) -> None:
        reason = event.get("ResourceStatusReason")
        out(
            f"  {event.get('ResourceStatus', '?'):<20} {event.get('LogicalResourceId', '?')} "
            f"({event.get('ResourceType', '?')})" + (f": {reason}" if reason else "")
        )

    return show


COMMANDS: dict[str, Callable[..., int]] = {
    "estimate": cmd_estimate_cpu,
    "up": cmd_up,
    "status": cmd_status,
    "scale": cmd_scale,
    "logs": cmd_logs,
    "fetch": cmd_fetch,
    "down": cmd_down,
}


def check_estimate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What `estimate`'s flags must satisfy together; parser.error (exit 2) names them."""
    defaults = cost.template_parameter_defaults(stack.template_body())
    capacity = args.capacity or defaults["WorkerCapacity"]
    memory = args.worker_memory
    fargate = cost.FARGATE_WORKER_MEMORY_MIB
    if capacity == "fargate-spot" and memory is not None and memory not in fargate:
        parser.error(f"--worker-memory {memory}: a 1-vCPU Fargate Spot worker takes "
                     f"{fargate[0]}-{fargate[-1]} MiB in steps of 1024 (or --capacity "
                     "ec2-spot)")  # fmt: skip
    if args.fleet_sizes is not None and len(args.fleet_sizes) > fleet.MAX_FLEET_SIZES:
        parser.error(f"--fleet-sizes: at most {fleet.MAX_FLEET_SIZES} sizes, got "
                     f"{len(args.fleet_sizes)}")  # fmt: skip
    if args.generations is not None and args.episode_steps is not None:
        population = args.population or int(defaults["Population"])
        frames = cost.frames_for_generations(
            args.generations, population, args.episode_steps, args.elite_candidates,
            args.elite_episodes,
        )  # fmt: skip
        if frames > cost.MAX_FRAMES:
            parser.error(
                f"--generations {args.generations} x (--population {population} + "
                f"--elite-candidates {args.elite_candidates} x --elite-episodes "
                f"{args.elite_episodes}) x --episode-steps {args.episode_steps:g} is "
                f"{frames:.3g} frames, more than {cost.MAX_FRAMES:.0e} (more than the largest "
                "fleet plays in a year)"
            )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "estimate":
        check_estimate(parser, args)
    if args.command == "up":
        check_up(parser, args)

    def out(line: str) -> None:
        print(line, flush=True)

    try:
        # A GPU estimate is refused before any AWS call, so it needs no credentials either.
        offline = args.command == "estimate" and (args.price is not None or args.worker_gpu)
        clients = None if offline else Clients.connect(args.region, args.profile)
        return COMMANDS[args.command](clients, args, out)
    except DeployError as error:
        print(f"neuro-deploy: {error}", file=sys.stderr)
        return 1
    except botocore.exceptions.NoCredentialsError:
        print("neuro-deploy: no AWS credentials found (see --profile)", file=sys.stderr)
        return 1
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as error:
        print(f"neuro-deploy {args.command}: AWS said: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
