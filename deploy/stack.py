"""The neuro stack on AWS through boto3: create, watch, scale, inspect, fetch and delete it.

Every function takes a `Session`-made client set so tests can point boto3 at a local endpoint
(AWS_ENDPOINT_URL) and nothing here reads flags or prints; deploy/cli.py does that.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions

TEMPLATE_NAME = "neuro.yaml"
PRICING_REGION = "us-east-1"
"""The Price List API answers in a few regions only, with every region's prices."""
# A stack that creates IAM roles must acknowledge it; named roles would need CAPABILITY_NAMED_IAM.
CAPABILITIES = ["CAPABILITY_IAM"]
FAILED_STATES = {
    "CREATE_FAILED",
    "ROLLBACK_IN_PROGRESS",
    "ROLLBACK_COMPLETE",
    "ROLLBACK_FAILED",
    "DELETE_FAILED",
    "UPDATE_ROLLBACK_IN_PROGRESS",
    "UPDATE_ROLLBACK_COMPLETE",
    "UPDATE_ROLLBACK_FAILED",
    "UPDATE_FAILED",
}
# Ends of an operation: create, update or delete has finished, well or not.
SETTLED_STATES = {
    "CREATE_COMPLETE",
    "UPDATE_COMPLETE",
    "DELETE_COMPLETE",
    "CREATE_FAILED",
    "ROLLBACK_COMPLETE",
    "ROLLBACK_FAILED",
    "DELETE_FAILED",
    "UPDATE_ROLLBACK_COMPLETE",
    "UPDATE_ROLLBACK_FAILED",
    "UPDATE_FAILED",
}


class DeployError(Exception):
    """A deployment step failed; the message says what and, where AWS told us, why."""


STUDY_JSON = "study.json"
"""A study dir's resolved runs and their states (neuro/runfiles.py's name, which deploy/ does
not import), under the run's S3 prefix where the master mirrors its study dir."""
MAX_STUDY_JSON_BYTES = 16 << 20


def template_body() -> str:
    """The packaged CloudFormation template."""
    return resources.files("deploy").joinpath(TEMPLATE_NAME).read_text()


def ready_studies() -> tuple[str, ...]:
    """The ready studies the template's Study parameter takes (AllowedValues, less "")."""
    block = re.search(r"^  Study:\n((?:    .*\n)+)", template_body(), re.MULTILINE)
    allowed = block and re.search(r"^    AllowedValues: \[(.*)\]$", block.group(1), re.MULTILINE)
    if not allowed:
        raise DeployError("the template's Study parameter lists no AllowedValues")
    names = (value.strip().strip("\"'") for value in allowed.group(1).split(","))
    return tuple(name for name in names if name)


def study_key(stack_name: str, sha256: str) -> str:
    """Where in the stack's bucket its study file goes, and the master's boot fetches it."""
    return f"inputs/{stack_name}/study-{sha256}.toml"


@dataclass
class Clients:
    """The boto3 clients one command needs, from one session (profile and region)."""

    cloudformation: Any
    ec2: Any
    ecs: Any
    logs: Any
    s3: Any
    ssm: Any
    region: str
    # Prices for `estimate` and `status`; the Price List API lives in a few regions only.
    pricing: Any = None

    @classmethod
    def connect(cls, region: str | None = None, profile: str | None = None) -> Clients:
        try:
            session = boto3.Session(region_name=region, profile_name=profile)
        except botocore.exceptions.ProfileNotFound as error:
            raise DeployError(f"AWS profile {profile!r} not found: {error}") from None
        if session.region_name is None:
            raise DeployError(
                "no AWS region: pass --region, set AWS_REGION, or configure a default region"
            )
        if session.get_credentials() is None:
            raise DeployError(
                "no AWS credentials found: set AWS_PROFILE (or pass --profile), "
                "export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or run `aws configure`"
            )

        def client(name: str) -> Any:
            return session.client(name)

        return cls(
            cloudformation=client("cloudformation"),
            ec2=client("ec2"),
            ecs=client("ecs"),
            logs=client("logs"),
            s3=client("s3"),
            ssm=client("ssm"),
            region=session.region_name,
            pricing=session.client("pricing", region_name=PRICING_REGION),
        )


@dataclass
class StackInfo:
    """What describe_stacks says about one stack, flattened."""

    name: str
    status: str
    reason: str | None
    parameters: dict[str, str]
    outputs: dict[str, str] = field(default_factory=dict)
    created: datetime | None = None


def describe(clients: Clients, stack_name: str) -> StackInfo | None:
    """The stack, or None when no stack of that name exists (deleted stacks do not count)."""
    try:
        stacks = clients.cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
    except botocore.exceptions.ClientError as error:
        if "does not exist" in str(error):
            return None
        raise
    if not stacks or stacks[0]["StackStatus"] == "DELETE_COMPLETE":
        return None
    stack = stacks[0]
    return StackInfo(
        name=stack["StackName"],
        status=stack["StackStatus"],
        reason=stack.get("StackStatusReason"),
        parameters={
            p["ParameterKey"]: p.get("ParameterValue", "") for p in stack.get("Parameters", [])
        },
        outputs={o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])},
        created=stack.get("CreationTime"),
    )


def require(clients: Clients, stack_name: str) -> StackInfo:
    """The stack, or a DeployError saying it does not exist in this region."""
    info = describe(clients, stack_name)
    if info is None:
        raise DeployError(f"no stack named {stack_name!r} in {clients.region}")
    return info


def default_network(clients: Clients) -> tuple[str, list[str]]:
    """The region's default VPC and its default subnets (one per availability zone)."""
    vpcs = clients.ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"]
    if not vpcs:
        raise DeployError(
            f"no default VPC in {clients.region}: pass --vpc-id and --subnet-ids "
            "(subnets that can reach the internet to pull images)"
        )
    vpc_id = vpcs[0]["VpcId"]
    subnets = clients.ec2.describe_subnets(
        Filters=[
            {"Name": "vpc-id", "Values": [vpc_id]},
            {"Name": "default-for-az", "Values": ["true"]},
        ]
    )["Subnets"]
    if not subnets:
        raise DeployError(f"the default VPC {vpc_id} has no default subnets: pass --subnet-ids")
    return vpc_id, sorted(s["SubnetId"] for s in subnets)


# CloudFormation resolves SSM-typed parameters again on every update, even with UsePreviousValue:
# a `scale` after AWS published a newer AMI would replace the master. `up` therefore resolves
# each AMI once and points the stack at a parameter of its own that never moves.
AMI_PARAMETERS = {
    "MasterAmi": "master-ami",
    "WorkerAmi": "worker-ami",
    "WorkerGpuAmi": "worker-gpu-ami",
}


def pinned_ami_name(stack_name: str, parameter: str) -> str:
    return f"/neuro/{stack_name}/{AMI_PARAMETERS[parameter]}"


def pin_amis(clients: Clients, stack_name: str, parameters: dict[str, str]) -> dict[str, str]:
    """Replaces each AMI parameter (an id or an SSM path) by a stack-owned pinned SSM name.

    Returns {parameter: ami id}.
    """
    pinned = {}
    for parameter in AMI_PARAMETERS:
        value = parameters[parameter]
        if not value.startswith("ami-"):
            try:
                value = clients.ssm.get_parameter(Name=value)["Parameter"]["Value"]
            except botocore.exceptions.ClientError as error:
                raise DeployError(f"{parameter} {value!r}: {_message(error)}") from None
        name = pinned_ami_name(stack_name, parameter)
        clients.ssm.put_parameter(
            Name=name, Value=value, Type="String", DataType="aws:ec2:image", Overwrite=True
        )
        parameters[parameter] = name
        pinned[parameter] = value
    return pinned


def unpin_amis(clients: Clients, stack_name: str) -> None:
    for parameter in AMI_PARAMETERS:
        try:
            clients.ssm.delete_parameter(Name=pinned_ami_name(stack_name, parameter))
        except botocore.exceptions.ClientError as error:
            if _code(error) != "ParameterNotFound":
                raise


def template_defaults(clients: Clients) -> dict[str, str | None]:
    """Each template parameter and its default (None where it has none), read by CloudFormation."""
    summary = clients.cloudformation.get_template_summary(TemplateBody=template_body())
    return {p["ParameterKey"]: p.get("DefaultValue") for p in summary["Parameters"]}


def create(clients: Clients, stack_name: str, parameters: dict[str, str]) -> None:
    """Starts creating the stack; a clear error if it exists already."""
    existing = describe(clients, stack_name)
    if existing is not None:
        raise DeployError(_exists_message(stack_name, existing.status))
    try:
        clients.cloudformation.create_stack(
            StackName=stack_name,
            TemplateBody=template_body(),
            Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in parameters.items()],
            Capabilities=CAPABILITIES,
            Tags=[{"Key": "neuro:stack", "Value": stack_name}],
        )
    except botocore.exceptions.ClientError as error:
        if _code(error) == "AlreadyExistsException":
            raise DeployError(_exists_message(stack_name, "being created")) from None
        raise DeployError(f"create_stack {stack_name!r} refused: {_message(error)}") from None


def _exists_message(stack_name: str, status: str) -> str:
    hint = (
        "delete it with `neuro-deploy down` before creating it again"
        if status in FAILED_STATES
        else "use `neuro-deploy status`, `scale` or `down`, or pick another --stack-name"
    )
    return f"stack {stack_name!r} already exists ({status}): {hint}"


def update_worker_count(clients: Clients, stack_name: str, workers: int) -> bool:
    """Starts an update that changes WorkerCount only; False when it already has that count."""
    info = require(clients, stack_name)
    if info.parameters.get("WorkerCount") == str(workers):
        return False
    parameters = [
        {"ParameterKey": key, "ParameterValue": str(workers)}
        if key == "WorkerCount"
        else {"ParameterKey": key, "UsePreviousValue": True}
        for key in info.parameters
    ]
    try:
        clients.cloudformation.update_stack(
            StackName=stack_name,
            UsePreviousTemplate=True,
            Parameters=parameters,
            Capabilities=CAPABILITIES,
        )
    except botocore.exceptions.ClientError as error:
        if "No updates are to be performed" in _message(error):
            return False
        raise DeployError(f"update_stack {stack_name!r} refused: {_message(error)}") from None
    return True


def delete(clients: Clients, stack_name: str) -> None:
    require(clients, stack_name)
    clients.cloudformation.delete_stack(StackName=stack_name)


def wait(
    clients: Clients,
    stack_name: str,
    timeout_s: float,
    poll_s: float,
    on_event: Callable[[dict[str, Any]], None] = lambda event: None,
    seen: set[str] | None = None,
) -> str:
    """Polls until the stack's operation settles; returns the final status.

    Raises DeployError on failure, naming the first resource that failed and AWS's reason.
    `seen`: the events already reported (default: every event so far).
    """
    if seen is None:
        seen = {e["EventId"] for e in _events(clients, stack_name)}
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            stack = clients.cloudformation.describe_stacks(StackName=stack_name)["Stacks"][0]
        except botocore.exceptions.ClientError as error:
            if "does not exist" in str(error):
                return "DELETE_COMPLETE"
            raise
        _report_events(clients, stack_name, seen, on_event)
        status = stack["StackStatus"]
        if status in SETTLED_STATES:
            if status in FAILED_STATES:
                raise DeployError(failure_report(clients, stack_name, status))
            return status
        if time.monotonic() > deadline:
            raise DeployError(
                f"stack {stack_name!r} still {status} after {timeout_s:.0f} s; "
                "`neuro-deploy status` shows how it goes on"
            )
        time.sleep(poll_s)


def upload_study(
    clients: Clients,
    stack_name: str,
    data: bytes,
    sha256: str,
    timeout_s: float,
    poll_s: float,
    on_event: Callable[[dict[str, Any]], None] = lambda event: None,
    seen: set[str] | None = None,
) -> str:
    """Waits for the stack being created to make its bucket, then puts the study file where the
    master's boot fetches it (study_key); returns its s3:// URI.

    The bucket is the stack's, so the file can only go there once CloudFormation has made it;
    the master, created after its role and so after the bucket, waits for the file. Events are
    reported as `wait` reports them, into `seen`. DeployError if the stack fails first.
    """
    seen = set() if seen is None else seen
    deadline = time.monotonic() + timeout_s
    while True:
        _report_events(clients, stack_name, seen, on_event)
        try:
            resource = clients.cloudformation.describe_stack_resource(
                StackName=stack_name, LogicalResourceId="RunBucket"
            )["StackResourceDetail"]
        except botocore.exceptions.ClientError as error:
            if "does not exist" not in _message(error):
                raise
            resource = {}
        if resource.get("ResourceStatus") == "CREATE_COMPLETE":
            bucket, key = resource["PhysicalResourceId"], study_key(stack_name, sha256)
            clients.s3.put_object(Bucket=bucket, Key=key, Body=data, ContentType="application/toml")
            return f"s3://{bucket}/{key}"
        status = require(clients, stack_name).status
        if status in FAILED_STATES:
            raise DeployError(failure_report(clients, stack_name, status))
        if time.monotonic() > deadline:
            raise DeployError(
                f"stack {stack_name!r} made no bucket within {timeout_s:.0f} s, so its study "
                "file is not uploaded; the master waits 10 minutes for it, then fails the stack"
            )
        time.sleep(poll_s)


def _report_events(
    clients: Clients,
    stack_name: str,
    seen: set[str],
    on_event: Callable[[dict[str, Any]], None],
) -> None:
    """Hands each event not in `seen` to on_event, oldest first, and adds it to `seen`."""
    for event in reversed(list(_events(clients, stack_name))):
        if event["EventId"] not in seen:
            seen.add(event["EventId"])
            on_event(event)


def failure_report(clients: Clients, stack_name: str, status: str) -> str:
    """Names the resources that failed first, with CloudFormation's reasons."""
    failed = [
        e
        for e in reversed(list(_events(clients, stack_name)))
        if e.get("ResourceStatus", "").endswith("_FAILED")
        and e.get("ResourceType") != "AWS::CloudFormation::Stack"
    ]
    # The first failure causes the rest ("Resource creation cancelled"); list it first.
    lines = [
        f"  {e['LogicalResourceId']} ({e['ResourceType']}): "
        f"{e.get('ResourceStatusReason') or 'no reason given'}"
        for e in failed
    ]
    detail = "\n".join(lines) if lines else "  (no resource reported a failure)"
    return f"stack {stack_name!r} ended {status}; failed resources:\n{detail}"


def _events(clients: Clients, stack_name: str) -> Iterator[dict[str, Any]]:
    """Events newest first, as describe_stack_events gives them."""
    try:
        pages = clients.cloudformation.get_paginator("describe_stack_events").paginate(
            StackName=stack_name
        )
        for page in pages:
            yield from page["StackEvents"]
    except botocore.exceptions.ClientError as error:
        if "does not exist" not in str(error):
            raise


def worker_counts(clients: Clients, info: StackInfo) -> dict[str, int] | None:
    """The ECS service's desired, running and pending task counts, or None if not found."""
    cluster = info.outputs.get("ClusterName")
    service = info.outputs.get("WorkerServiceName")
    if not cluster or not service:
        return None
    found = clients.ecs.describe_services(cluster=cluster, services=[service])["services"]
    if not found:
        return None
    return {
        "desired": found[0].get("desiredCount", 0),
        "running": found[0].get("runningCount", 0),
        "pending": found[0].get("pendingCount", 0),
    }


def split_s3_uri(uri: str) -> tuple[str, str]:
    """('bucket', 'prefix') from s3://bucket/prefix."""
    if not uri.startswith("s3://") or len(uri) <= len("s3://"):
        raise DeployError(f"not an s3:// URI: {uri!r}")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    return bucket, prefix.strip("/")


def run_status(clients: Clients, info: StackInfo) -> dict[str, Any] | None:
    """The master's own status.json from the run's S3 prefix, or None before its first upload."""
    uri = info.outputs.get("RunS3Uri")
    if not uri:
        return None
    bucket, prefix = split_s3_uri(uri)
    try:
        body = clients.s3.get_object(Bucket=bucket, Key=_key(prefix, "status.json"))["Body"]
    except botocore.exceptions.ClientError as error:
        if _code(error) in {"NoSuchKey", "404", "NoSuchBucket"}:
            return None
        raise
    where = f"s3://{bucket}/{_key(prefix, 'status.json')}"
    try:
        # NaN, Infinity and numbers beyond a float read as null: what status prints and its
        # --json output (which must stay JSON) never carry a value that is no number.
        run = json.loads(body.read(), parse_constant=lambda _: None, parse_float=_finite_or_none)
    except json.JSONDecodeError as error:
        raise DeployError(f"{where}: {error}") from None
    if not isinstance(run, dict):
        raise DeployError(f"{where}: expected a JSON object, got {type(run).__name__}")
    return run


def study_states(clients: Clients, info: StackInfo) -> dict[str, int] | None:
    """How many of the study's runs are in each state (queued, running, complete, failed), from
    the study.json under the run's S3 prefix; None before there is one."""
    uri = info.outputs.get("RunS3Uri")
    if not uri:
        return None
    bucket, prefix = split_s3_uri(uri)
    key = _key(prefix, STUDY_JSON)
    try:
        body = clients.s3.get_object(Bucket=bucket, Key=key)["Body"]
    except botocore.exceptions.ClientError as error:
        if _code(error) in {"NoSuchKey", "404", "NoSuchBucket"}:
            return None
        raise
    where = f"s3://{bucket}/{key}"
    data = body.read(MAX_STUDY_JSON_BYTES + 1)
    if len(data) > MAX_STUDY_JSON_BYTES:
        raise DeployError(f"{where} is over {MAX_STUDY_JSON_BYTES:,} bytes")
    try:
        runs = json.loads(data)["runs"]
        states = [str(run["state"]) for run in runs]
    except (ValueError, TypeError, KeyError) as error:
        raise DeployError(f"{where} holds no study's runs: {error!r}") from None
    return {state: states.count(state) for state in sorted(set(states))}


def _finite_or_none(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def fetch_run(clients: Clients, info: StackInfo, destination: Path) -> list[tuple[Path, int]]:
    """Downloads every object of the run's S3 prefix under `destination`; returns (path, size)."""
    uri = info.outputs.get("RunS3Uri")
    if not uri:
        raise DeployError(f"stack {info.name!r} has no RunS3Uri output (status {info.status})")
    bucket, prefix = split_s3_uri(uri)
    listed = []
    for page in clients.s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=f"{prefix}/" if prefix else ""
    ):
        # Zero-byte folder markers (the S3 console's "Create folder") are no files: each
        # folder comes with the files in it.
        listed.extend(
            item
            for item in page.get("Contents", [])
            if not (item["Key"].endswith("/") and item["Size"] == 0)
        )
    if not listed:
        raise DeployError(f"nothing under {uri} yet: the master uploads after its first generation")
    fetched = []
    for item in listed:
        if item["Key"].endswith("/"):
            # Not a marker (it has content), and no file can take its name: refused, not dropped.
            raise DeployError(
                f"{item['Key']!r} under {uri} ends in '/' but holds {item['Size']} bytes: "
                "no file can have that name; rename or delete it in S3"
            )
        relative = item["Key"][len(prefix) :].lstrip("/") if prefix else item["Key"]
        target = (destination / relative).resolve()
        if destination.resolve() not in target.parents:
            raise DeployError(f"refusing to write {item['Key']!r} outside {destination}")
        partial = target.with_name(target.name + ".part")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            clients.s3.download_file(bucket, item["Key"], str(partial))
            partial.replace(target)
        except OSError as error:
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)
            # E.g. a key `a` and a key `a/b`: one name cannot be a file and a folder.
            raise DeployError(
                f"cannot write {item['Key']!r} to {target}: {error.strerror or error}"
            ) from None
        fetched.append((target, item["Size"]))
    return fetched


def log_events(
    clients: Clients, info: StackInfo, stream_prefix: str | None, start_ms: int
) -> Iterator[dict[str, Any]]:
    """Log events of the stack's log group since `start_ms`, oldest first."""
    group = info.outputs.get("LogGroupName")
    if not group:
        raise DeployError(f"stack {info.name!r} has no LogGroupName output (status {info.status})")
    kwargs: dict[str, Any] = {"logGroupName": group, "startTime": start_ms}
    if stream_prefix:
        kwargs["logStreamNamePrefix"] = stream_prefix
    try:
        for page in clients.logs.get_paginator("filter_log_events").paginate(**kwargs):
            # The prefix is also checked here: not every CloudWatch Logs endpoint applies it.
            yield from (
                event
                for event in page.get("events", [])
                if not stream_prefix or event["logStreamName"].startswith(stream_prefix)
            )
    except botocore.exceptions.ClientError as error:
        if _code(error) == "ResourceNotFoundException":
            raise DeployError(f"log group {group} not found") from None
        raise


def _key(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


def _code(error: botocore.exceptions.ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _message(error: botocore.exceptions.ClientError) -> str:
    return str(error.response.get("Error", {}).get("Message", error))
