"""neuro-deploy end to end against a moto server on loopback: up, status, scale, logs, fetch, down.

moto creates the stack's resources with low fidelity (no ECS task ever runs), so the master's
side of the S3 run dir comes from a real `neuro-master --s3-uri` run against the same endpoint.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest
from cfnlint.decode import decode_str
from moto.cloudformation.models import Event, Stack
from moto.core import DEFAULT_ACCOUNT_ID
from moto.ssm.models import ssm_backends

from deploy import cli
from deploy.stack import template_body
from tests.support.aws import aws_test_env
from tests.support.processes import REPO, worker_env

PUBLIC_AMI = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
PUBLIC_GPU_AMI = "/aws/service/ecs/optimized-ami/amazon-linux-2023/gpu/recommended/image_id"
# moto warns of each resource type it cannot create; cfn-lint, not moto, checks the template.
pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse:UserWarning")
IMAGES = ["--master-image", "example.org/neuro-master:1", "--worker-image", "example.org/w:1"]


def template_parameter_names() -> set[str]:
    template, errors = decode_str(template_body())
    assert not errors, errors
    return set(template["Parameters"])


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["--stack-name", "run1", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_every_template_parameter_has_exactly_one_flag() -> None:
    assert set(cli.TEMPLATE_PARAMETERS) == template_parameter_names()
    assert len(set(cli.TEMPLATE_PARAMETERS.values())) == len(cli.TEMPLATE_PARAMETERS)


def test_up_with_every_flag_passes_every_template_parameter() -> None:
    argv = ["up", *IMAGES, "--env", "Pong-v4", "--workers", "3", "--capacity", "ec2-spot",
            "--worker-memory", "3072", "--worker-instance-types", "c5.9xlarge,c6i.8xlarge",
            "--master-instance-type", "c5.xlarge", "--vpc-id", "vpc-1", "--subnet-ids", "s-1,s-2",
            "--assign-public-ip", "DISABLED", "--population", "200", "--truncation", "10",
            "--mutation-power", "0.005", "--frames", "5000000", "--log-retention-days", "7",
            "--master-ami", "ami-1", "--worker-ami", "ami-2", "--worker-gpu",
            "--worker-gpu-instance-types", "g5.xlarge,g6.xlarge",
            "--worker-gpu-ami", "ami-3"]  # fmt: skip
    parameters = cli.template_parameters(cli.build_parser().parse_args(argv))
    assert set(parameters) == template_parameter_names()
    assert parameters["WorkerCapacity"] == "ec2-spot"
    # The template's AllowedValues are the strings "true" and "false", not Python's True.
    assert parameters["WorkerGpu"] == "true"
    assert parameters["WorkerGpuInstanceTypes"] == "g5.xlarge,g6.xlarge"
    assert parameters["SubnetIds"] == "s-1,s-2"
    assert parameters["MutationPower"] == "0.005"


def publish_public_parameter(name: str, value: str) -> None:
    """A new version of an AWS-owned SSM parameter (moto refuses put_parameter on /aws/ names)."""
    versions = ssm_backends[DEFAULT_ACCOUNT_ID]["us-east-1"]._parameters[name]
    newest = copy.copy(versions[-1])
    newest.value, newest.version = value, versions[-1].version + 1
    versions.append(newest)


def run_master_against(run_s3_uri: str, run_dir: Path, generations: int) -> None:
    """A tiny real CartPole run that mirrors its run dir to the stack's S3 prefix."""
    command = [sys.executable, "-m", "master", "--env", "CartPole-v1", "--local-workers", "1",
               "--generations", str(generations), "--population", "10", "--elite-candidates", "2",
               "--elite-episodes", "2", "--no-target", "--port", "0", "--quiet",
               "--run-dir", str(run_dir), "--s3-uri", run_s3_uri]  # fmt: skip
    done = subprocess.run(command, env={**worker_env(), **os.environ}, cwd=REPO,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_up_status_scale_logs_fetch_down(
    aws_endpoint: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, noise_cache: Path
) -> None:
    code, out, err = run_cli(capsys, "up", *IMAGES, "--env", "CartPole-v1", "--workers", "4",
                             "--poll-seconds", "0.1")  # fmt: skip
    assert code == 0, err
    assert "network: default VPC vpc-" in out
    outputs = {
        o["OutputKey"]: o["OutputValue"]
        for o in boto3.client("cloudformation").describe_stacks(StackName="run1")["Stacks"][0][
            "Outputs"
        ]
    }
    assert f"master: {outputs['MasterAddress']}" in out
    assert outputs["MasterAddress"].endswith(":8080")
    assert f"run dir: {outputs['RunS3Uri']}" in out
    # The AMIs are resolved once and pinned, so no later update re-resolves them.
    ssm = boto3.client("ssm")
    latest = ssm.get_parameter(Name=PUBLIC_AMI)["Parameter"]["Value"]
    assert ssm.get_parameter(Name="/neuro/run1/master-ami")["Parameter"]["Value"] == latest
    assert f"MasterAmi: {latest}, pinned as /neuro/run1/master-ami" in out

    code, out, err = run_cli(capsys, "status")
    assert code == 0, err
    assert "stack run1: CREATE_COMPLETE" in out
    assert "4 desired" in out
    assert "no status in s3://" in out

    # The master's side: a real master uploads its run dir to the stack's bucket.
    run_dir = tmp_path / "master-run"
    run_master_against(outputs["RunS3Uri"], run_dir, generations=2)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    code, out, err = run_cli(capsys, "status", "--json")
    assert code == 0, err
    status = json.loads(out)
    assert status["stack_status"] == "CREATE_COMPLETE"
    assert status["workers"]["desired"] == 4
    # The master's generation counter: after a finished run, the number of generations done.
    assert status["run"]["generation"] == len(lines) == last["generation"] + 1
    assert status["run"]["run_complete"] is True
    assert status["run"]["frames"] == last["frames"]
    assert status["run"]["env_id"] == "CartPole-v1"
    code, out, err = run_cli(capsys, "status")
    assert f"generation {len(lines)} (complete)" in out

    # AWS publishes a newer AMI; a scale must not move the master onto it (a replacement).
    ec2 = boto3.client("ec2")
    newer = ec2.describe_images(Owners=["amazon"])["Images"][-1]["ImageId"]
    assert newer != latest
    publish_public_parameter(PUBLIC_AMI, newer)
    assert ssm.get_parameter(Name=PUBLIC_AMI)["Parameter"]["Value"] == newer
    code, out, err = run_cli(capsys, "scale", "7", "--poll-seconds", "0.1")
    assert code == 0, err
    described = boto3.client("cloudformation").describe_stacks(StackName="run1")["Stacks"][0]
    parameters = {p["ParameterKey"]: p["ParameterValue"] for p in described["Parameters"]}
    assert parameters["WorkerCount"] == "7"
    assert parameters["EnvId"] == "CartPole-v1"
    assert parameters["MasterImage"] == IMAGES[1]
    master = ec2.describe_instances(InstanceIds=[outputs["MasterInstanceId"]])
    assert master["Reservations"][0]["Instances"][0]["ImageId"] == latest
    assert parameters["MasterAmi"] in ("/neuro/run1/master-ami", latest)  # name, or resolved
    code, out, err = run_cli(capsys, "status", "--json")
    assert json.loads(out)["workers"]["desired"] == 7
    code, out, err = run_cli(capsys, "scale", "7")
    assert code == 0 and "already has 7 workers" in out

    logs = boto3.client("logs")
    now_ms = int(time.time() * 1000)
    for stream, message in (("master", "generation 2 done"), ("worker/worker/abc", "leased 8")):
        logs.create_log_stream(logGroupName=outputs["LogGroupName"], logStreamName=stream)
        logs.put_log_events(
            logGroupName=outputs["LogGroupName"],
            logStreamName=stream,
            logEvents=[{"timestamp": now_ms, "message": message}],
        )
    code, out, err = run_cli(capsys, "logs")
    assert code == 0, err
    assert "master: generation 2 done" in out and "leased 8" not in out
    code, out, err = run_cli(capsys, "logs", "--stream", "workers")
    assert "worker/worker/abc: leased 8" in out and "generation 2 done" not in out

    fetched = tmp_path / "fetched"
    code, out, err = run_cli(capsys, "fetch", "--to", str(fetched))
    assert code == 0, err
    for name in ("metrics.jsonl", "best_genome.json", "checkpoint.json", "config.json"):
        assert (fetched / name).read_bytes() == (run_dir / name).read_bytes(), name
    assert json.loads((fetched / "status.json").read_text())["generation"] == len(lines)

    code, out, err = run_cli(capsys, "down", "--yes", "--poll-seconds", "0.1")
    assert code == 0, err
    assert "stack run1 deleted" in out
    assert ssm.get_parameters_by_path(Path="/neuro/run1")["Parameters"] == []
    code, out, err = run_cli(capsys, "status")
    assert code == 1 and "no stack named 'run1'" in err


def stack_parameters() -> dict[str, str]:
    described = boto3.client("cloudformation").describe_stacks(StackName="run1")["Stacks"][0]
    return {p["ParameterKey"]: p["ParameterValue"] for p in described["Parameters"]}


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
def test_up_worker_gpu_sets_the_gpu_parameters(
    aws_endpoint: str, capsys: pytest.CaptureFixture[str], gpu: bool
) -> None:
    flags = ["--worker-gpu", "--worker-gpu-instance-types", "g6.xlarge,g5.xlarge"] if gpu else []
    code, out, err = run_cli(capsys, "up", *IMAGES, *flags, "--poll-seconds", "0.1")
    assert code == 0, err
    parameters = stack_parameters()
    assert parameters["WorkerGpu"] == ("true" if gpu else "false")
    # GPU workers need EC2 hosts, so the flag alone picks ec2-spot; without it, the default.
    assert parameters["WorkerCapacity"] == ("ec2-spot" if gpu else "fargate-spot")
    # The GPU AMI is pinned like the others, so a later update cannot replace the hosts.
    ssm = boto3.client("ssm")
    gpu_ami = ssm.get_parameter(Name=PUBLIC_GPU_AMI)["Parameter"]["Value"]
    assert ssm.get_parameter(Name="/neuro/run1/worker-gpu-ami")["Parameter"]["Value"] == gpu_ami
    assert f"WorkerGpuAmi: {gpu_ami}, pinned as /neuro/run1/worker-gpu-ami" in out

    # What the stack made of it: one GPU per worker, told to use it.
    ecs = boto3.client("ecs")
    (arn,) = ecs.list_task_definitions()["taskDefinitionArns"]
    (container,) = ecs.describe_task_definition(taskDefinition=arn)["taskDefinition"][
        "containerDefinitions"
    ]
    assert container.get("resourceRequirements", []) == (
        [{"type": "GPU", "value": "1"}] if gpu else []
    )
    assert (container["command"][-2:] == ["--device", "cuda"]) == gpu
    groups = boto3.client("autoscaling").describe_auto_scaling_groups()["AutoScalingGroups"]
    if gpu:
        (group,) = groups
        policy = group["MixedInstancesPolicy"]["LaunchTemplate"]
        types = [o["InstanceType"] for o in policy["Overrides"]]
        assert types == ["g6.xlarge", "g5.xlarge"]
        template_id = policy["LaunchTemplateSpecification"]["LaunchTemplateId"]
        (version,) = boto3.client("ec2").describe_launch_template_versions(
            LaunchTemplateId=template_id
        )["LaunchTemplateVersions"]
        assert version["LaunchTemplateData"]["ImageId"] == gpu_ami
    else:
        assert groups == []  # Fargate Spot: no hosts at all

    # A master's first status.json, so that `status` has frames to put a cost on.
    outputs = boto3.client("cloudformation").describe_stacks(StackName="run1")["Stacks"][0]
    uri = {o["OutputKey"]: o["OutputValue"] for o in outputs["Outputs"]}["RunS3Uri"]
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    status_json = {"generation": 1, "frames": 4_000_000, "updated_at": time.time()}
    boto3.client("s3").put_object(
        Bucket=bucket, Key=f"{prefix}/status.json", Body=json.dumps(status_json).encode()
    )
    code, out, err = run_cli(capsys, "status", "--price", "0.02")
    assert code == 0, err
    assert ("one per GPU" in out) == gpu
    # The cost model is CPU frames per vCPU-hour: a GPU stack's frames are not priced with it.
    assert ("GPU workers are not priced" in out) == gpu
    assert ("vCPU-hours" in out) == (not gpu)
    code, out, err = run_cli(capsys, "status", "--json", "--price", "0.02")
    assert code == 0, err
    status = json.loads(out)
    assert ("cost_unpriced" in status) == gpu
    assert (status["cost"] is None) == gpu


def test_worker_gpu_flags_that_cannot_work_are_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_aws(*args: object) -> None:
        raise AssertionError("refused flags must not reach AWS")

    monkeypatch.setattr(cli.Clients, "connect", no_aws)
    monkeypatch.setattr(cli.stack, "default_network", no_aws)
    for argv, message in (
        (["up", *IMAGES, "--worker-gpu", "--capacity", "fargate-spot"], "Fargate Spot has no GPUs"),
        (["up", *IMAGES, "--worker-gpu-instance-types", "g5.xlarge"], "goes with --worker-gpu"),
        (["estimate", "--worker-gpu"], "GPU workers are not priced"),
    ):
        args = cli.build_parser().parse_args(argv)
        with pytest.raises(cli.DeployError, match=message):
            cli.COMMANDS[args.command](None, args, print)
    # Through main, estimate refuses before asking for credentials.
    code, _, err = run_cli(capsys, "estimate", "--worker-gpu")
    assert code == 1 and "deploy/throughput.json has no measured GPU" in err


def test_up_refuses_a_stack_that_exists(aws_endpoint: str, capsys) -> None:
    code, _, err = run_cli(capsys, "up", *IMAGES, "--poll-seconds", "0.1")
    assert code == 0, err
    code, _, err = run_cli(capsys, "up", *IMAGES)
    assert code == 1
    assert "stack 'run1' already exists (CREATE_COMPLETE)" in err


def test_a_failed_create_names_the_resource_and_reason(
    aws_endpoint: str, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    reason = "We currently do not have sufficient c5.large capacity in us-east-1a."

    def fail_like_cloudformation(self: Stack) -> None:
        # What CloudFormation reports when the instance cannot launch and the stack rolls back.
        for logical_id, kind, status, why in (
            ("MasterInstance", "AWS::EC2::Instance", "CREATE_FAILED", reason),
            ("WorkerService", "AWS::ECS::Service", "CREATE_FAILED", "Resource creation cancelled"),
        ):
            self.events.append(
                Event(self.stack_id, self.name, logical_id, "", kind, status, why, None)
            )
        self.status = "ROLLBACK_COMPLETE"
        self._add_stack_event("ROLLBACK_COMPLETE")

    monkeypatch.setattr(Stack, "create_resources", fail_like_cloudformation)
    code, _, err = run_cli(capsys, "up", *IMAGES, "--poll-seconds", "0.1")
    assert code == 1
    assert "ended ROLLBACK_COMPLETE" in err
    first, second = err.index("MasterInstance (AWS::EC2::Instance)"), err.index("WorkerService")
    assert first < second
    assert reason in err
    code, _, err = run_cli(capsys, "up", *IMAGES)
    assert code == 1 and "delete it with `neuro-deploy down`" in err


@pytest.mark.slow
def test_commands_on_a_missing_stack_say_so(aws_endpoint: str, capsys) -> None:
    for argv in (["status"], ["scale", "3"], ["fetch"], ["logs"], ["down", "--yes"]):
        code, _, err = run_cli(capsys, *argv)
        assert code == 1, argv
        assert "no stack named 'run1' in us-east-1" in err, argv


@pytest.mark.slow
def test_fetch_before_the_first_upload_and_down_without_yes(aws_endpoint: str, capsys) -> None:
    assert run_cli(capsys, "up", *IMAGES, "--poll-seconds", "0.1")[0] == 0
    code, _, err = run_cli(capsys, "fetch")
    assert code == 1 and "nothing under s3://" in err
    code, _, err = run_cli(capsys, "down")  # pytest's stdin is not a terminal
    assert code == 1 and "without --yes" in err
    assert run_cli(capsys, "status")[0] == 0


def test_missing_credentials_and_region_are_clear(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(aws_test_env("http://127.0.0.1:9"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        env.pop(name)
    command = [sys.executable, "-m", "deploy.cli", "status"]
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "no AWS credentials found" in done.stderr
    env.pop("AWS_DEFAULT_REGION")
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "no AWS region" in done.stderr


def test_bad_flags_name_the_value(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["scale", "-3"])
    assert "expected 0 or more, got -3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["logs", "--since", "soon"])
    assert "'soon'" in capsys.readouterr().err
