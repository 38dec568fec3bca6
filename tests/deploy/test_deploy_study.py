"""neuro-deploy up --study against a moto server on loopback: a ready study by name goes to the
template's Study parameter, a study file to the stack's bucket (its digest to StudyFileSha256)
as the stack is created, where the master's boot fetches it; status counts the study's runs;
a study that cannot be served is refused, naming the value, before anything reaches AWS."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from deploy import cli, stack, stack_study
from master.study.file import MAX_STUDY_BYTES, load_study, ready_studies
from master.study.studydir import StudyDir
from tests.deploy.test_deploy_cli import IMAGES, run_cli, stack_parameters
from tests.support.processes import REPO, worker_env

pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse:UserWarning")
# A study of two tiny CartPole runs, as a user writes one.
STUDY = """name = "mine"
max_concurrent_runs = 2

[budget]
generations = 2

[[grid]]
envs = ["CartPole-v1"]
seeds = 2
"""
GPU_STUDY = (
    STUDY
    + """
[settings]
inference_dtype = "float32"
"""
)


def test_the_stack_takes_the_masters_ready_studies_and_file_size() -> None:
    """deploy/ imports nothing of the master: its copies of these two facts are held here."""
    assert stack.ready_studies() == ready_studies()
    assert stack_study.MAX_STUDY_BYTES == MAX_STUDY_BYTES


@pytest.fixture
def no_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a refused study must not reach AWS")

    monkeypatch.setattr(cli.Clients, "connect", refuse)


def test_a_study_that_cannot_be_served_is_refused_by_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, no_aws: None
) -> None:
    big = tmp_path / "big.toml"
    big.write_bytes(b"#" * (MAX_STUDY_BYTES + 1))
    int8 = tmp_path / "int8.toml"
    int8.write_text(STUDY)
    mixed = tmp_path / "mixed.toml"
    mixed.write_text(GPU_STUDY + '\n[[run]]\nenv = "Pong-v4"\nseed = 0\n'
                     'settings = { inference_dtype = "int8-static" }\n')  # fmt: skip
    cases = [
        (["--study", "paper-v2"],
         "no study file 'paper-v2', and no ready study of that name (laptop, paper)"),
        (["--study", str(tmp_path / "missing.toml")], f"no study file '{tmp_path}/missing.toml'"),
        (["--study", str(big)], f"study file {big} is over 1,048,576 bytes"),
        (["--study", "laptop", "--env", "Pong-v4"], "--env: a study's runs take their envs"),
        (["--study", "laptop", "--frames", "1000"], "--frames: a study's runs take their envs"),
        (["--study", "laptop", "--worker-gpu"], "--study laptop with --worker-gpu: a ready "
         "study's Atari runs are int8-static"),
        (["--study", str(int8), "--worker-gpu"], f"study file {int8}: [[grid]] 1 runs "
         "inference_dtype the fleet's default (int8-static on Atari)"),
        (["--study", str(mixed), "--worker-gpu"], f"study file {mixed}: [[run]] 1 runs "
         "inference_dtype 'int8-static'"),
    ]  # fmt: skip
    for flags, message in cases:
        with pytest.raises(SystemExit) as exited:
            run_cli(capsys, "up", *IMAGES, *flags)
        assert exited.value.code == 2, flags
        err = capsys.readouterr().err
        assert f"neuro-deploy: error: {message}" in err, (flags, err)


def test_up_uploads_a_study_file_for_the_master(
    aws_endpoint: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text(GPU_STUDY)
    sha256 = hashlib.sha256(mine.read_bytes()).hexdigest()
    code, out, err = run_cli(capsys, "up", *IMAGES, "--study", str(mine), "--worker-gpu",
                             "--poll-seconds", "0.1")  # fmt: skip
    assert code == 0, err
    parameters = stack_parameters()
    assert (parameters["Study"], parameters["StudyFileSha256"]) == ("", sha256)
    outputs = stack.describe(cli.Clients.connect(), "run1").outputs
    key = f"inputs/run1/study-{sha256}.toml"
    assert f"study file: s3://{outputs['RunBucket']}/{key}" in out
    # The stack's events while `up` waited for its bucket are shown, each once (moto reports the
    # stack's own events only).
    event = "CREATE_COMPLETE      run1 (AWS::CloudFormation::Stack)"
    assert out.count(event) == 1 and out.index(event) < out.index("study file: "), out
    s3 = boto3.client("s3")
    uploaded = s3.get_object(Bucket=outputs["RunBucket"], Key=key)["Body"].read()
    assert uploaded == mine.read_bytes()
    # The master may read that one object, and no other input.
    policy = _master_policy()
    assert f"{outputs['RunBucket']}/{key}" in policy and "inputs/run1/*" not in policy
    # What the master's boot fetches is a study the master serves: as the file reached it.
    fetched = tmp_path / "fetched.toml"
    fetched.write_bytes(uploaded)
    command = [sys.executable, "-m", "master", "--study", str(fetched),
               "--study-dir", str(tmp_path / "study"), "--dry-run"]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, env=worker_env(), capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "study mine" in done.stdout and "cartpole-v1-s1" in done.stdout

    code, out, err = run_cli(capsys, "status")
    assert code == 0, err
    assert (
        f"study file s3://{outputs['RunBucket']}/{key} (sha256 {sha256[:12]}...): no "
        "study.json under the run dir yet" in out
    ), out
    # The master's study.json, as its study dir holds it, under the run's S3 prefix.
    study_dir = StudyDir(tmp_path / "study")
    study_dir.open(load_study(str(mine)))
    study_dir.set_state("cartpole-v1-s0", "complete")
    bucket, prefix = stack.split_s3_uri(outputs["RunS3Uri"])
    s3.put_object(Bucket=bucket, Key=f"{prefix}/study.json", Body=study_dir.state_file.read_bytes())
    code, out, err = run_cli(capsys, "status")
    assert code == 0, err
    assert "(sha256 " + sha256[:12] + "...): 2 runs: 1 complete, 1 queued" in out, out
    code, out, err = run_cli(capsys, "status", "--json")
    assert code == 0, err
    assert json.loads(out)["study"] == {
        "sha256": sha256, "file": f"s3://{outputs['RunBucket']}/{key}",
        "runs": {"complete": 1, "queued": 1},
    }  # fmt: skip


def _master_policy() -> str:
    """The master role's inline policy, as the stack made it."""
    iam = boto3.client("iam")
    (role,) = [r["RoleName"] for r in iam.list_roles()["Roles"] if "MasterRole" in r["RoleName"]]
    return json.dumps(iam.get_role_policy(RoleName=role, PolicyName="neuro-master"))


def test_up_names_a_ready_study_and_uploads_nothing(
    aws_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "up", *IMAGES, "--study", "laptop", "--poll-seconds", "0.1")
    assert code == 0, err
    parameters = stack_parameters()
    assert (parameters["Study"], parameters["StudyFileSha256"]) == ("laptop", "")
    assert "study file:" not in out
    outputs = stack.describe(cli.Clients.connect(), "run1").outputs
    listed = boto3.client("s3").list_objects_v2(Bucket=outputs["RunBucket"])
    assert listed.get("KeyCount", 0) == 0
    policy = _master_policy()
    assert "inputs/" not in policy, "no study file: no grant to read one"
    code, out, err = run_cli(capsys, "status")
    assert code == 0, err
    assert "study laptop: no study.json under the run dir yet" in out
