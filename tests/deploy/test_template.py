"""The CloudFormation template: lint-clean, and holding the properties the deployment relies on.

Structure is read with cfn-lint's own loader (it understands !Ref and friends); the boot
scripts run for real under bash with the AWS, docker and package tools replaced by stubs that
record their arguments; moto checks that the stack goes up, scales and comes down.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cfnlint.decode import decode_str

from master.cli import build_parser as master_parser
from tests.support.processes import REPO
from worker.cli import worker_main, worker_parser

TEMPLATES = sorted((REPO / "deploy").glob("*.yaml"))
TEMPLATE = REPO / "deploy" / "neuro.yaml"
CFN_LINT = Path(sys.executable).with_name("cfn-lint")
MODES = ("fargate-spot", "ec2-spot")
# (capacity mode, WorkerGpu): GPU workers exist on EC2 spot hosts only.
VARIANTS = [("fargate-spot", False), ("ec2-spot", False), ("ec2-spot", True)]
VARIANT_IDS = ["fargate-spot", "ec2-spot", "ec2-spot-gpu"]
NO_VALUE = {"Ref": "AWS::NoValue"}

CONTRACT_PARAMETERS: dict[str, tuple[str, Any]] = {
    "EnvId": ("String", "Frostbite-v4"),
    "Study": ("String", ""),
    "StudyFileSha256": ("String", ""),
    "WorkerCount": ("Number", 16),
    "WorkerCapacity": ("String", "fargate-spot"),
    "WorkerMemory": ("Number", 4096),
    "WorkerInstanceTypes": ("CommaDelimitedList", "c5.9xlarge,c5a.8xlarge,c6i.8xlarge,c6a.8xlarge"),
    "WorkerGpu": ("String", "false"),
    "WorkerGpuInstanceTypes": ("CommaDelimitedList", "g5.xlarge,g4dn.xlarge,g6.xlarge"),
    "MasterInstanceType": ("String", "c5.large"),
    "MasterImage": ("String", None),
    "WorkerImage": ("String", None),
    "VpcId": ("AWS::EC2::VPC::Id", None),
    "SubnetIds": ("List<AWS::EC2::Subnet::Id>", None),
    "AssignPublicIp": ("String", "ENABLED"),
    "Population": ("Number", 1000),
    "Truncation": ("Number", 20),
    "MutationPower": ("Number", 0.002),
    "FrameBudget": ("Number", 1000000000),
    "LogRetentionDays": ("Number", 30),
    "MasterAmi": (
        "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>",
        "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64",
    ),
    "WorkerAmi": (
        "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>",
        "/aws/service/ecs/optimized-ami/amazon-linux-2023/recommended/image_id",
    ),
    "WorkerGpuAmi": (
        "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>",
        "/aws/service/ecs/optimized-ami/amazon-linux-2023/gpu/recommended/image_id",
    ),
}
CONTRACT_OUTPUTS = {"MasterAddress", "MasterInstanceId", "LogGroupName", "RunBucket", "RunS3Uri",
                    "ClusterName", "WorkerServiceName", "TokenSecretArn"}  # fmt: skip


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    loaded, errors = decode_str(TEMPLATE.read_text())
    assert not errors, errors
    return loaded


def of_type(template: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {name: r for name, r in template["Resources"].items() if r["Type"] == kind}


def stack_parameters(
    template: dict[str, Any], mode: str, gpu: bool = False, **values: str
) -> dict[str, Any]:
    """Parameter values of a stack in capacity `mode`: the defaults, a list for each
    CommaDelimitedList, and `values` over them."""
    parameters: dict[str, Any] = {}
    for name, spec in template["Parameters"].items():
        value = values.get(name, spec.get("Default"))
        if spec["Type"] == "CommaDelimitedList" and value is not None:
            value = str(value).split(",")
        parameters[name] = value
    parameters.update(WorkerCapacity=mode, WorkerGpu="true" if gpu else "false")
    return parameters


def evaluate(template: dict[str, Any], node: Any, parameters: dict[str, Any]) -> Any:
    """The value of an intrinsic-function expression (the ones this template's Conditions and
    instance types use), as CloudFormation computes it from `parameters`."""
    if not isinstance(node, dict):
        return node
    ((function, args),) = node.items()

    def value(item: Any) -> Any:
        return evaluate(template, item, parameters)

    if function == "Ref":
        return parameters[args]
    if function == "Condition":
        return value(template["Conditions"][args])
    if function == "Fn::Equals":
        return str(value(args[0])) == str(value(args[1]))
    if function == "Fn::Not":
        return not value(args[0])
    if function == "Fn::And":
        return all(value(a) for a in args)
    if function == "Fn::Or":
        return any(value(a) for a in args)
    if function == "Fn::Contains":
        return str(value(args[1])) in [str(value(a)) for a in args[0]]
    if function == "Fn::Join":
        return args[0].join(value(args[1]))
    if function == "Fn::Split":
        return value(args[1]).split(args[0])
    if function == "Fn::Select":
        return value(args[1])[int(args[0])]
    if function == "Fn::Sub":
        text, names = args
        names = {k: value(v) for k, v in names.items()}
        return re.sub(r"\$\{(\w+)\}", lambda m: str(names[m[1]]), text)
    raise AssertionError(f"evaluate() does not know {function}")


def resolve(
    node: Any, mode: str, gpu: bool = False, template: dict[str, Any] | None = None, **values: str
) -> Any:
    """`node` with every Fn::If decided as a stack in capacity `mode` with WorkerGpu `gpu` and
    the default parameters (16 workers, public IPs) or `values`; the conditions are evaluated
    from the template's own Conditions."""
    template = template or decode_str(TEMPLATE.read_text())[0]
    parameters = stack_parameters(template, mode, gpu, **values)

    def decide(node: Any) -> Any:
        if isinstance(node, dict):
            if set(node) == {"Fn::If"}:
                name, if_true, if_false = node["Fn::If"]
                chosen = evaluate(template, {"Condition": name}, parameters)
                return decide(if_true if chosen else if_false)
            resolved = {k: decide(v) for k, v in node.items()}
            return {k: v for k, v in resolved.items() if v != NO_VALUE}
        if isinstance(node, list):
            return [v for v in map(decide, node) if v != NO_VALUE]
        return node

    return decide(node)


def in_mode(template: dict[str, Any], kind: str, mode: str) -> dict[str, dict[str, Any]]:
    """Resources of `kind` that a stack in capacity `mode` creates."""
    wanted = {"fargate-spot": {None, "IsFargate"}, "ec2-spot": {None, "IsEc2"}}[mode]
    return {n: r for n, r in of_type(template, kind).items() if r.get("Condition") in wanted}


def test_cfn_lint_reports_nothing_for_any_template() -> None:
    assert TEMPLATES, "no template under deploy/"
    done = subprocess.run(
        [str(CFN_LINT), *map(str, TEMPLATES)], capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_cfn_lint_catches_a_broken_template(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(TEMPLATE.read_text().replace("HttpTokens: required", "HttpTokens: maybe"))
    done = subprocess.run([str(CFN_LINT), str(broken)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "E3030" in done.stdout


def test_parameters_and_outputs_are_the_contract(template: dict[str, Any]) -> None:
    found = {name: (p["Type"], p.get("Default")) for name, p in template["Parameters"].items()}
    assert found == CONTRACT_PARAMETERS
    assert set(template["Outputs"]) == CONTRACT_OUTPUTS
    outputs = {name: o["Value"] for name, o in template["Outputs"].items()}
    assert outputs["MasterAddress"] == {"Fn::Sub": "${Master.PrivateIp}:8080"}
    assert outputs["RunS3Uri"] == {"Fn::Sub": "s3://${RunBucket}/${AWS::StackName}"}
    assert outputs["WorkerServiceName"] == {"Fn::GetAtt": ["WorkerService", "Name"]}


def rules_hold(template: dict[str, Any], mode: str, gpu: bool, **values: str) -> bool:
    """Whether CloudFormation's rules accept WorkerGpu `gpu` in capacity `mode`, and `values`."""
    parameters = stack_parameters(template, mode, gpu, **values)
    return all(
        evaluate(template, check["Assert"], parameters)
        for rule in template["Rules"].values()
        if evaluate(template, rule.get("RuleCondition", True), parameters)
        for check in rule["Assertions"]
    )


def test_gpu_workers_need_ec2_spot_hosts(template: dict[str, Any]) -> None:
    def holds(mode: str, gpu: bool) -> bool:
        return rules_hold(template, mode, gpu)

    assert holds("fargate-spot", False) and holds("ec2-spot", False) and holds("ec2-spot", True)
    assert not holds("fargate-spot", True)  # Fargate has no GPUs: refused before anything
    # And were the rule bypassed, a Fargate stack would still have no GPU part.
    is_gpu = {"Condition": "IsGpu"}
    assert not evaluate(template, is_gpu, stack_parameters(template, "fargate-spot", True))
    assert evaluate(template, is_gpu, stack_parameters(template, "ec2-spot", True))
    assert not evaluate(template, is_gpu, stack_parameters(template, "ec2-spot", False))


SHA256 = "0123456789abcdef" * 4


def test_a_stack_serves_one_study_and_gpu_workers_no_ready_one(template: dict[str, Any]) -> None:
    assert template["Parameters"]["Study"]["AllowedValues"][0] == ""  # "": one run
    assert rules_hold(template, "fargate-spot", False, Study="paper")
    assert rules_hold(template, "fargate-spot", False, StudyFileSha256=SHA256)
    # A study file may set float32, the one dtype GPU workers run; a ready study does not.
    assert rules_hold(template, "ec2-spot", True, StudyFileSha256=SHA256)
    assert not rules_hold(template, "ec2-spot", True, Study="laptop")
    assert not rules_hold(template, "fargate-spot", False, Study="paper", StudyFileSha256=SHA256)
    pattern = re.compile(template["Parameters"]["StudyFileSha256"]["AllowedPattern"])
    assert pattern.fullmatch("") and pattern.fullmatch(SHA256)
    assert not pattern.fullmatch(SHA256.upper()) and not pattern.fullmatch(SHA256[:-1] + "'")


@pytest.mark.parametrize("sha256", ["", SHA256], ids=["no-study-file", "study-file"])
def test_the_master_reads_its_own_study_file_and_no_other(
    template: dict[str, Any], sha256: str
) -> None:
    role = resolve(template["Resources"]["MasterRole"], "fargate-spot", template=template,
                   StudyFileSha256=sha256)  # fmt: skip
    (policy,) = role["Properties"]["Policies"]
    reads = [s for s in policy["PolicyDocument"]["Statement"] if s["Sid"] == "ReadStudyFile"]
    if not sha256:
        assert reads == []
        return
    (read,) = reads
    assert read["Action"] == "s3:GetObject"
    assert read["Resource"] == {
        "Fn::Sub": "${RunBucket.Arn}/inputs/${AWS::StackName}/study-${StudyFileSha256}.toml"
    }


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
def test_worker_hosts_boot_the_ami_of_their_kind(template: dict[str, Any], gpu: bool) -> None:
    data = template["Resources"]["WorkerLaunchTemplate"]["Properties"]["LaunchTemplateData"]
    data = resolve(data, "ec2-spot", gpu, template)
    assert data["ImageId"] == {"Ref": "WorkerGpuAmi" if gpu else "WorkerAmi"}
    # The CUDA image is several GB more than the CPU one.
    (disk,) = data["BlockDeviceMappings"]
    assert disk["Ebs"]["VolumeSize"] == (60 if gpu else 30)


def test_instances_require_imdsv2_and_encrypted_disks(template: dict[str, Any]) -> None:
    launch_templates = of_type(template, "AWS::EC2::LaunchTemplate")
    assert set(launch_templates) == {"MasterLaunchTemplate", "WorkerLaunchTemplate"}
    for lt in launch_templates.values():
        data = lt["Properties"]["LaunchTemplateData"]
        assert data["MetadataOptions"]["HttpTokens"] == "required"
        assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 2
        (disk,) = data["BlockDeviceMappings"]
        assert disk["Ebs"]["Encrypted"] is True and disk["Ebs"]["VolumeType"] == "gp3"
    master = template["Resources"]["Master"]
    assert master["Type"] == "AWS::EC2::Instance"
    assert master["Properties"]["LaunchTemplate"]["LaunchTemplateId"] == {
        "Ref": "MasterLaunchTemplate"
    }


def test_master_port_is_open_to_the_workers_only(template: dict[str, Any]) -> None:
    ingress = template["Resources"]["MasterSecurityGroup"]["Properties"]["SecurityGroupIngress"]
    assert len(ingress) == 1
    (rule,) = ingress
    assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", 8080, 8080)
    assert rule["SourceSecurityGroupId"] == {"Ref": "WorkerSecurityGroup"}
    # No ingress added elsewhere, and nothing anywhere open to the internet.
    assert not of_type(template, "AWS::EC2::SecurityGroupIngress")
    worker_sg = template["Resources"]["WorkerSecurityGroup"]["Properties"]
    assert "SecurityGroupIngress" not in worker_sg
    for group in of_type(template, "AWS::EC2::SecurityGroup").values():
        for rule in group["Properties"].get("SecurityGroupIngress", []):
            assert rule.get("CidrIp") != "0.0.0.0/0" and rule.get("CidrIpv6") != "::/0"


def test_spot_capacity_uses_current_mechanisms(template: dict[str, Any]) -> None:
    assert not of_type(template, "AWS::EC2::SpotFleet")
    (asg,) = of_type(template, "AWS::AutoScaling::AutoScalingGroup").values()
    props = asg["Properties"]
    distribution = props["MixedInstancesPolicy"]["InstancesDistribution"]
    assert distribution["OnDemandPercentageAboveBaseCapacity"] == 0
    assert distribution["OnDemandBaseCapacity"] == 0
    assert distribution["SpotAllocationStrategy"] == "price-capacity-optimized"
    assert props["CapacityRebalance"] is True and props["MinSize"] == "0"
    overrides = props["MixedInstancesPolicy"]["LaunchTemplate"]["Overrides"]
    for gpu, listed in ((False, "WorkerInstanceTypes"), (True, "WorkerGpuInstanceTypes")):
        # The hosts' types are the list of their kind, one override each, up to 8 of them.
        for types in (CONTRACT_PARAMETERS[listed][1], "a.1", ",".join(f"t{i}.2" for i in range(9))):
            parameters = stack_parameters(template, "ec2-spot", gpu, **{listed: types})
            chosen = resolve(overrides, "ec2-spot", gpu, template, **{listed: types})
            found = [evaluate(template, o["InstanceType"], parameters) for o in chosen]
            assert found == types.split(",")[:8], (gpu, types)
    (provider,) = of_type(template, "AWS::ECS::CapacityProvider").values()
    group = provider["Properties"]["AutoScalingGroupProvider"]
    assert group["ManagedScaling"]["Status"] == "ENABLED"
    # Unprotected hosts that ECS drains before scale-in: the consistent pair.
    assert group["ManagedTerminationProtection"] == "DISABLED"
    assert group["ManagedDraining"] == "ENABLED"
    assert props["NewInstancesProtectedFromScaleIn"] is False


@pytest.mark.parametrize("mode", MODES)
def test_worker_service(template: dict[str, Any], mode: str) -> None:
    (service,) = in_mode(template, "AWS::ECS::Service", mode).values()
    props = resolve(service["Properties"], mode)
    (strategy,) = props["CapacityProviderStrategy"]
    expected = "FARGATE_SPOT" if mode == "fargate-spot" else {"Ref": "WorkerCapacityProvider"}
    assert strategy["CapacityProvider"] == expected
    assert props["DesiredCount"] == {"Ref": "WorkerCount"}
    (task_definition,) = in_mode(template, "AWS::ECS::TaskDefinition", mode)
    assert props["TaskDefinition"] == {"Ref": task_definition}
    assert ("NetworkConfiguration" in props) == (mode == "fargate-spot")
    deployment = props["DeploymentConfiguration"]
    assert deployment["MaximumPercent"] == 100 and 0 < deployment["MinimumHealthyPercent"] < 100
    assert deployment["DeploymentCircuitBreaker"] == {"Enable": True, "Rollback": True}


@pytest.mark.parametrize(("mode", "gpu"), VARIANTS, ids=VARIANT_IDS)
def test_worker_task_definition(template: dict[str, Any], mode: str, gpu: bool) -> None:
    (task,) = in_mode(template, "AWS::ECS::TaskDefinition", mode).values()
    props = resolve(task["Properties"], mode, gpu, template)
    assert "TaskRoleArn" not in props  # workers only speak gRPC
    if gpu:
        # One worker per GPU, free to step its envs on all the host's vCPUs.
        assert "Cpu" not in props and props["Memory"] == {"Ref": "WorkerMemory"}
    else:
        assert (props["Cpu"], props["Memory"]) == ("1024", {"Ref": "WorkerMemory"})
    fargate = mode == "fargate-spot"
    assert props["RequiresCompatibilities"] == (["FARGATE"] if fargate else ["EC2"])
    assert props["NetworkMode"] == ("awsvpc" if fargate else "bridge")
    (container,) = props["ContainerDefinitions"]
    assert container["Name"] == "worker" and container["Image"] == {"Ref": "WorkerImage"}
    assert 100 <= container["StopTimeout"] <= 120
    logging = container["LogConfiguration"]
    assert logging["LogDriver"] == "awslogs"
    assert logging["Options"]["awslogs-stream-prefix"] == "worker"
    assert logging["Options"]["awslogs-group"] == {"Ref": "LogGroup"}
    env = {e["Name"]: e["Value"] for e in container["Environment"]}
    assert env["NEURO_MASTER"] == {"Fn::Sub": "${Master.PrivateIp}:8080"}
    assert container["Secrets"] == [{"Name": "NEURO_TOKEN", "ValueFrom": {"Ref": "TokenSecret"}}]
    if gpu:
        assert container["ResourceRequirements"] == [{"Type": "GPU", "Value": "1"}]
        assert container["Command"][-2:] == ["--device", "cuda"]
    else:
        assert "ResourceRequirements" not in container and "--device" not in container["Command"]
    if fargate:
        assert container["Command"][-2:] == ["--shared-cache-mb", "0"]
    else:
        assert env["NEURO_SPOT_NOTICE"] == "imds"
        volumes = {v["Name"]: v["Host"]["SourcePath"] for v in props["Volumes"]}
        mounts = {volumes[m["SourceVolume"]]: m["ContainerPath"] for m in container["MountPoints"]}
        assert mounts == {
            "/var/cache/neuro": env["NEURO_CACHE_DIR"],
            "/var/lib/neuro-shared": env["NEURO_SHARED_DIR"],
        }


@pytest.mark.parametrize(("mode", "gpu"), VARIANTS, ids=VARIANT_IDS)
def test_worker_commands_use_real_worker_flags(
    template: dict[str, Any], capsys: pytest.CaptureFixture[str], mode: str, gpu: bool
) -> None:
    with pytest.raises(SystemExit):
        worker_main(["--help"])
    known = set(re.findall(r"--[a-z][a-z-]+", capsys.readouterr().out))
    (task,) = in_mode(template, "AWS::ECS::TaskDefinition", mode).values()
    (container,) = resolve(task["Properties"], mode, gpu, template)["ContainerDefinitions"]
    flags = {arg for arg in container["Command"] if arg.startswith("--")}
    assert flags and flags <= known, f"neuro-worker has no {sorted(flags - known)}"
    # And their values parse (a choice such as --device cuda among them).
    worker_parser().parse_args(container["Command"])


def test_results_and_logs_are_kept(template: dict[str, Any]) -> None:
    bucket = template["Resources"]["RunBucket"]
    assert bucket["DeletionPolicy"] == bucket["UpdateReplacePolicy"] == "Retain"
    props = bucket["Properties"]
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert all(props["PublicAccessBlockConfiguration"].values())
    assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    (statement,) = template["Resources"]["RunBucketPolicy"]["Properties"]["PolicyDocument"][
        "Statement"
    ]
    assert statement["Effect"] == "Deny"
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    log_group = template["Resources"]["LogGroup"]["Properties"]
    assert log_group["RetentionInDays"] == {"Ref": "LogRetentionDays"}
    secret = template["Resources"]["TokenSecret"]["Properties"]["GenerateSecretString"]
    assert secret["ExcludePunctuation"] is True and secret["PasswordLength"] >= 32


def test_only_the_ecr_login_names_every_resource(template: dict[str, Any]) -> None:
    roles = of_type(template, "AWS::IAM::Role")
    assert {"MasterRole", "WorkerExecutionRole", "WorkerInstanceRole"} == set(roles)
    for role in roles.values():
        role = resolve(role, "ec2-spot", template=template, StudyFileSha256=SHA256)
        for policy in role["Properties"].get("Policies", []):
            for statement in policy["PolicyDocument"]["Statement"]:
                if statement["Resource"] == "*":
                    assert statement["Action"] == "ecr:GetAuthorizationToken"
                assert "*" not in str(statement["Action"])


# ---------------------------------------------------------------- the boot scripts, run
# One write per record: the tools of a pipeline (`aws ... | docker login`) run at once, and
# records written in pieces would interleave in the shared log.
STUB = """#!/bin/bash
record="$(basename "$0")$(printf '\\t%s' "$@")"
printf '%s\\n' "$record" >> "$STUB_LOG"
{body}
"""
STUBS = {
    # `aws s3 cp ... SOURCE DEST` copies $FAKE_S3/<the key's last part>, failing without it.
    "aws": 'case "$1" in secretsmanager) echo "$FAKE_TOKEN";; ecr) echo ecr-password;;'
    ' s3) source="${{@: -2:1}}"; cp "$FAKE_S3/${{source##*/}}" "${{@: -1}}";; esac',
    "docker": 'case "$1" in login) cat >/dev/null;; inspect) echo "$FAKE_DOCKER_STATE";;'
    ' logs) echo "neuro-master: error: unrecognized arguments";; esac',
    # The real install, less the ownership that only root may give (the log keeps it).
    "install": 'args=(); while [ $# -gt 0 ]; do case "$1" in -o|-g) shift 2;;'
    ' *) args+=("$1"); shift;; esac; done; exec {install} "${{args[@]}}"',
    "chown": "",
    "dnf": "",
    "systemctl": "",
    "cfn-signal": "",
    "sleep": "",
}
SUB_VALUES = {
    "AWS::Region": "us-east-1",
    "AWS::StackName": "run1",
    "EnvId": "Frostbite-v4",
    "TokenSecret": "arn:aws:secretsmanager:us-east-1:123456789012:secret:token-AbCdEf",
    "MasterImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/neuro-master:1",
    "LogGroup": "/neuro/run1",
    "RunBucket": "run1-runbucket-x",
    "Population": "1000",
    "Truncation": "20",
    "MutationPower": "0.002",
    "FrameBudget": "1000000000",
    "Cluster": "run1-Cluster-X",
    "WorkerGpu": "false",
    "Study": "",
    "StudyFileSha256": "",
}


def boot_script(
    template: dict[str, Any], name: str, root: Path, **values: str
) -> str:  # fmt: skip
    """A launch template's user data with its ${...} filled in (SUB_VALUES, then `values`) and
    its paths moved to root; ${!x} becomes ${x}, as Fn::Sub writes it."""
    text = template["Resources"][name]["Properties"]["LaunchTemplateData"]["UserData"]
    filled = {**SUB_VALUES, **values}
    text = re.sub(r"\$\{([\w:]+)\}", lambda m: filled[m[1]], text["Fn::Base64"]["Fn::Sub"])
    text = text.replace("${!", "${")
    text = text.replace("/opt/aws/bin/cfn-signal", "cfn-signal")
    for path in ("/etc/neuro", "/var/lib/neuro", "/etc/ecs/", "/var/cache/neuro"):
        text = text.replace(path, f"{root}{path}")
    # Never let the script touch this machine's own /etc, /var or /opt.
    masked = text.replace(str(root), "\0" * len(str(root)))
    for system in re.finditer(r"/(etc|var|opt)/", masked):
        assert masked[system.start() - 1] == "\0", f"unmoved path in {text[system.start() :]!r}"
    return text


def run_boot(script: str, tmp_path: Path, **env: str) -> tuple[int, list[list[str]]]:
    """Runs `script` under bash with stubbed tools; its exit code and every stub call."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    real_install = shutil.which("install")
    assert real_install
    for tool, body in STUBS.items():
        path = bin_dir / tool
        path.write_text(STUB.format(body=body.format(install=real_install)))
        path.chmod(0o755)
    (tmp_path / "boot.sh").write_text(script)
    done = subprocess.run(
        ["bash", str(tmp_path / "boot.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_LOG": str(log), **env},
    )
    calls = [line.split("\t") for line in log.read_text().splitlines()] if log.exists() else []
    return done.returncode, calls


def test_master_boot_starts_the_master_and_signals_success(
    template: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    (root / "var/lib").mkdir(parents=True)
    code, calls = run_boot(
        boot_script(template, "MasterLaunchTemplate", root),
        tmp_path,
        FAKE_TOKEN="t0ken",
        FAKE_DOCKER_STATE="running 0 healthy",
    )
    assert code == 0
    token = root / "etc/neuro/token"
    assert token.read_text().strip() == "t0ken"
    assert stat.S_IMODE(token.stat().st_mode) == 0o400
    assert ["chown", "10001:10001", str(token)] in calls
    assert any(c[0] == "install" and "10001" in c and c[-1].endswith("/run") for c in calls)
    registry = SUB_VALUES["MasterImage"].split("/")[0]
    assert ["docker", "login", "--username", "AWS", "--password-stdin", registry] in calls
    (run,) = [c[2:] for c in calls if c[:2] == ["docker", "run"]]
    image = run.index(SUB_VALUES["MasterImage"])
    options, flags = " ".join(run[:image]), run[image + 1 :]
    for expected in (
        "--restart unless-stopped",
        "--name neuro-master",
        "-p 8080:8080",
        "--log-driver awslogs",
        "--log-opt awslogs-group=/neuro/run1",
        "--log-opt awslogs-stream=master",
        f"-v {root}/var/lib/neuro:/data",
        f"-v {token}:/run/secrets/neuro-token:ro",
        "-e NEURO_ENV=Frostbite-v4",
        "-e NEURO_TOKEN_FILE=/run/secrets/neuro-token",
        "-e NEURO_S3_URI=s3://run1-runbucket-x/run1",
    ):
        assert expected in options
    monkeypatch.setenv("NEURO_ENV", "Frostbite-v4")
    args = vars(master_parser().parse_args(flags))
    expected_args = {"population_size": 1000, "truncation": 20, "mutation_power": 0.002,
                     "frames": 1000000000, "quiet": False}  # fmt: skip
    assert {name: args[name] for name in expected_args} == expected_args
    (signal,) = [c for c in calls if c[0] == "cfn-signal"]
    assert signal[1:5] == ["--exit-code", "0", "--reason", "neuro-master is serving"]
    assert "--resource" in signal and signal[signal.index("--resource") + 1] == "Master"
    # One run: no study reaches the master, and no study file is fetched.
    assert "NEURO_STUDY" not in options
    assert not [c for c in calls if c[:2] == ["aws", "s3"]]


@pytest.mark.parametrize(("gpu", "dtype"), [("false", None), ("true", "float32")])
def test_the_master_runs_float32_for_gpu_workers_and_its_default_for_cpu_ones(
    template: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu: str,
    dtype: str | None,
) -> None:  # fmt: skip
    root = tmp_path / "root"
    (root / "var/lib").mkdir(parents=True)
    script = boot_script(template, "MasterLaunchTemplate", root, WorkerGpu=gpu)
    code, calls = run_boot(script, tmp_path, FAKE_TOKEN="t0ken",
                           FAKE_DOCKER_STATE="running 0 healthy")  # fmt: skip
    assert code == 0
    (run,) = [c[2:] for c in calls if c[:2] == ["docker", "run"]]
    flags = run[run.index(SUB_VALUES["MasterImage"]) + 1 :]
    monkeypatch.setenv("NEURO_ENV", "Frostbite-v4")
    # None: not given, so the master's default for its env applies.
    assert master_parser().parse_args(flags).inference_dtype == dtype


# A study of two tiny CartPole runs, as a user writes one.
STUDY = """name = "mine"
max_concurrent_runs = 2

[budget]
generations = 2

[[grid]]
envs = ["CartPole-v1"]
seeds = 2
"""


def master_container(run: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The environment (-e) and the mounts (container path: host path) of a `docker run`."""
    env, mounts = {}, {}
    for option, value in itertools.pairwise(run):
        if option == "-e":
            key, _, env[key] = value.partition("=")
            env[key] = env[key].strip("'")
        elif option == "-v":
            host, container = value.split(":")[:2]
            mounts[container] = host
    return env, mounts


def on_host(path: str, mounts: dict[str, str]) -> str:
    """Where a container path lies on the host, through the deepest mount that holds it."""
    holding = [c for c in mounts if path == c or path.startswith(c + "/")]
    assert holding, f"{path} is on no mount"
    deepest = max(holding, key=len)
    return mounts[deepest] + path[len(deepest) :]


def dry_run_in(env: dict[str, str], mounts: dict[str, str], cwd: Path) -> str:
    """neuro-master --dry-run configured by the container's environment alone, as the image's
    entrypoint is (the image's own NEURO_RUN_DIR and the container's paths moved to the host)."""
    moved = {k: on_host(v, mounts) if v.startswith("/") else v
             for k, v in {"NEURO_RUN_DIR": "/data/run", **env}.items()
             if k.startswith("NEURO_") and k != "NEURO_S3_URI"}  # fmt: skip
    local = {k: v for k, v in os.environ.items() if not k.startswith("NEURO_")}
    done = subprocess.run([sys.executable, "-m", "master", "--dry-run"], cwd=cwd,
                          env={**local, **moved, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("stored", ["the file", "none", "another file"])
def test_master_boot_serves_the_study_file_it_fetches_and_checks(
    template: dict[str, Any], tmp_path: Path, stored: str
) -> None:
    root, s3 = tmp_path / "root", tmp_path / "s3"
    (root / "var/lib").mkdir(parents=True)
    s3.mkdir()
    sha256 = hashlib.sha256(STUDY.encode()).hexdigest()
    if stored != "none":
        (s3 / f"study-{sha256}.toml").write_text(STUDY + ("" if stored == "the file" else "#\n"))
    script = boot_script(template, "MasterLaunchTemplate", root, StudyFileSha256=sha256)
    code, calls = run_boot(script, tmp_path, FAKE_TOKEN="t0ken", FAKE_S3=str(s3),
                           FAKE_DOCKER_STATE="running 0 healthy")  # fmt: skip
    fetches = [c for c in calls if c[:3] == ["aws", "s3", "cp"]]
    where = f"s3://run1-runbucket-x/inputs/run1/study-{sha256}.toml"
    assert fetches and {tuple(c[-2:]) for c in fetches} == {(where, f"{root}/etc/neuro/study.part")}
    runs = [c[2:] for c in calls if c[:2] == ["docker", "run"]]
    (signal,) = [c for c in calls if c[0] == "cfn-signal"]
    if stored != "the file":
        # The stack fails at once, saying why; no master serves something else.
        assert code == 1 and runs == [] and signal[1:3] == ["--exit-code", "1"]
        if stored == "none":
            assert len(fetches) == 60  # a try every 10 s for 10 minutes
            assert signal[4] == f"no study file at {where} after 10 minutes (neuro-deploy up " \
                "--study uploads it)"  # fmt: skip
        else:
            assert signal[4] == f"the study file at {where} is not the one of StudyFileSha256"
        return
    assert code == 0 and len(fetches) == 1, calls
    study = root / "etc/neuro/study.toml"
    assert study.read_text() == STUDY and stat.S_IMODE(study.stat().st_mode) == 0o444
    (run,) = runs
    image = run.index(SUB_VALUES["MasterImage"])
    assert run[image + 1 :] == [], "a study's runs take their settings from the study"
    env, mounts = master_container(run[:image])
    assert mounts["/run/neuro/study.toml"] == str(study)
    assert f"{study}:/run/neuro/study.toml:ro" in run, "mounted read-only"
    assert env["NEURO_STUDY"] == "/run/neuro/study.toml"
    assert env["NEURO_STUDY_DIR"] == "/data/study"
    (made,) = [c for c in calls if c[0] == "install" and c[-1] == str(root / "var/lib/neuro/study")]
    assert made[:6] == ["install", "-d", "-o", "10001", "-g", "10001"]
    listing = dry_run_in(env, mounts, tmp_path)
    assert "study mine (" in listing and f"study dir {root}/var/lib/neuro/study\n" in listing


def test_master_boot_serves_a_ready_study_by_name(template: dict[str, Any], tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "var/lib").mkdir(parents=True)
    script = boot_script(template, "MasterLaunchTemplate", root, Study="laptop")
    code, calls = run_boot(script, tmp_path, FAKE_TOKEN="t0ken",
                           FAKE_DOCKER_STATE="running 0 healthy")  # fmt: skip
    assert code == 0
    assert not [c for c in calls if c[:2] == ["aws", "s3"]], "a ready study has no file"
    (run,) = [c[2:] for c in calls if c[:2] == ["docker", "run"]]
    image = run.index(SUB_VALUES["MasterImage"])
    assert run[image + 1 :] == []
    env, mounts = master_container(run[:image])
    assert env["NEURO_STUDY"] == "laptop" and env["NEURO_STUDY_DIR"] == "/data/study"
    listing = dry_run_in(env, mounts, tmp_path)
    assert "study laptop: 6 runs" in listing
    assert f"study dir {root}/var/lib/neuro/study\n" in listing


def test_master_boot_fails_the_stack_when_the_master_restarts(
    template: dict[str, Any], tmp_path: Path
) -> None:
    root = tmp_path / "root"
    (root / "var/lib").mkdir(parents=True)
    code, calls = run_boot(
        boot_script(template, "MasterLaunchTemplate", root),
        tmp_path,
        FAKE_TOKEN="t0ken",
        FAKE_DOCKER_STATE="restarting 1 starting",
    )
    assert code == 1
    (signal,) = [c for c in calls if c[0] == "cfn-signal"]
    assert signal[1:3] == ["--exit-code", "1"]
    assert "restarting 1" in signal[4] and "unrecognized arguments" in signal[4]


def test_worker_host_boot_joins_the_cluster(template: dict[str, Any], tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc/ecs").mkdir(parents=True)
    (root / "var/lib").mkdir(parents=True)
    code, calls = run_boot(boot_script(template, "WorkerLaunchTemplate", root), tmp_path)
    assert code == 0
    config = dict(line.split("=", 1) for line in (root / "etc/ecs/ecs.config").read_text().split())
    assert config == {
        "ECS_CLUSTER": "run1-Cluster-X",
        "ECS_ENABLE_SPOT_INSTANCE_DRAINING": "true",
        "ECS_CONTAINER_STOP_TIMEOUT": "110s",
    }
    for directory in ("var/cache/neuro", "var/lib/neuro-shared"):
        assert (root / directory).is_dir()
        (made,) = [c for c in calls if c[-1] == str(root / directory)]
        assert made[:6] == ["install", "-d", "-o", "10001", "-g", "10001"]


# ---------------------------------------------------------------- the stack's life under moto
# moto skips (with a warning) the resource types it cannot create: bucket policy, secret,
# standalone egress rule, capacity provider and its association.
@pytest.mark.filterwarnings("ignore:Tried to parse AWS::")
@pytest.mark.parametrize(("mode", "gpu"), VARIANTS, ids=VARIANT_IDS)
def test_stack_goes_up_scales_and_leaves_its_bucket(
    aws_endpoint: str, mode: str, gpu: bool
) -> None:
    import boto3

    ec2 = boto3.client("ec2")
    vpc = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]
    subnets = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc["VpcId"]]}])
    parameters = {name: str(default) for name, (_, default) in CONTRACT_PARAMETERS.items()}
    parameters.update(
        VpcId=vpc["VpcId"],
        WorkerCapacity=mode,
        WorkerGpu="true" if gpu else "false",
        WorkerCount="4",
        SubnetIds=",".join(s["SubnetId"] for s in subnets["Subnets"][:2]),
        MasterImage="neuro-master:1",
        WorkerImage="neuro-worker:1",
    )
    cloudformation = boto3.client("cloudformation")
    cloudformation.create_stack(
        StackName="run1",
        TemplateBody=TEMPLATE.read_text(),
        Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in parameters.items()],
        Capabilities=["CAPABILITY_IAM"],
    )
    stack = cloudformation.describe_stacks(StackName="run1")["Stacks"][0]
    assert stack["StackStatus"] == "CREATE_COMPLETE"
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack["Outputs"]}
    # moto creates no Secrets Manager secret from a template, so it has no TokenSecretArn.
    assert CONTRACT_OUTPUTS - {"TokenSecretArn"} <= set(outputs)
    assert outputs["RunS3Uri"] == f"s3://{outputs['RunBucket']}/run1"

    # neuro-deploy scale: the previous template, a new WorkerCount, every other value kept.
    cloudformation.update_stack(
        StackName="run1",
        UsePreviousTemplate=True,
        Parameters=[
            {"ParameterKey": k, "ParameterValue": "7"}
            if k == "WorkerCount"
            else {"ParameterKey": k, "UsePreviousValue": True}
            for k in parameters
        ],
        Capabilities=["CAPABILITY_IAM"],
    )
    assert cloudformation.describe_stacks(StackName="run1")["Stacks"][0]["StackStatus"] == (
        "UPDATE_COMPLETE"
    )
    (service,) = boto3.client("ecs").describe_services(
        cluster=outputs["ClusterName"], services=[outputs["WorkerServiceName"]]
    )["services"]
    assert service["desiredCount"] == 7

    cloudformation.delete_stack(StackName="run1")
    names = [b["Name"] for b in boto3.client("s3").list_buckets()["Buckets"]]
    assert outputs["RunBucket"] in names
