"""`neuro-deploy fetch` against a moto server on loopback: folder-marker keys are skipped."""

from __future__ import annotations

import re
from pathlib import Path

import boto3
import pytest

from deploy import cli, stack
from deploy.stack import Clients, DeployError, StackInfo

# moto warns of each resource type it cannot create; cfn-lint, not moto, checks the template.
pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse:UserWarning")
IMAGES = ["--master-image", "example.org/neuro-master:1", "--worker-image", "example.org/w:1"]
MARKERS = ("", "tensorboard/", "genomes/")
"""Zero-byte keys ending in "/" that the S3 console's "Create folder" leaves under a prefix."""
FILES = {
    "metrics.jsonl": b'{"generation": 0}\n',
    "tensorboard/events.out.tfevents.1.host": b"\x00events",
    "genomes/ab12.json": b'{"seeds": [1]}\n',
}


def run_prefix(bucket: str, prefix: str) -> StackInfo:
    return StackInfo("run1", "CREATE_COMPLETE", None, {}, {"RunS3Uri": f"s3://{bucket}/{prefix}"})


def put(bucket: str, prefix: str, names: dict[str, bytes]) -> None:
    client = boto3.client("s3")
    for name, body in names.items():
        client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=body)


@pytest.mark.slow
def test_fetch_skips_folder_markers_through_the_cli(
    aws_endpoint: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert cli.main(["--stack-name", "run1", "up", *IMAGES, "--poll-seconds", "0.1"]) == 0
    uri = stack.require(Clients.connect(), "run1").outputs["RunS3Uri"]
    bucket, prefix = stack.split_s3_uri(uri)
    put(bucket, prefix, {**dict.fromkeys(MARKERS, b""), **FILES})
    capsys.readouterr()
    code = cli.main(["--stack-name", "run1", "fetch", "--to", str(tmp_path / "fetched")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"fetched {len(FILES)} files" in out
    for name, body in FILES.items():
        assert (tmp_path / "fetched" / name).read_bytes() == body, name


def test_a_folder_marker_before_its_files_is_no_file(aws_endpoint: str, tmp_path: Path) -> None:
    boto3.client("s3").create_bucket(Bucket="runs")
    put("runs", "run1", {"tensorboard/": b"", "tensorboard/events.out.tfevents.1.host": b"e"})
    fetched = stack.fetch_run(Clients.connect(), run_prefix("runs", "run1"), tmp_path / "out")
    assert [(path.relative_to(tmp_path / "out").as_posix(), size) for path, size in fetched] == [
        ("tensorboard/events.out.tfevents.1.host", 1)
    ]
    assert (tmp_path / "out" / "tensorboard").is_dir()
    assert not list((tmp_path / "out").rglob("*.part"))


def test_a_key_no_file_can_be_named_after_is_refused_naming_it(
    aws_endpoint: str, tmp_path: Path
) -> None:
    boto3.client("s3").create_bucket(Bucket="runs")
    put("runs", "run1", {"notes/": b"not empty", "metrics.jsonl": b"{}\n"})
    with pytest.raises(DeployError, match=r"'run1/notes/'.*9 bytes"):
        stack.fetch_run(Clients.connect(), run_prefix("runs", "run1"), tmp_path / "out")
    # A file where the run dir needs a folder: refused naming the key, not a traceback.
    boto3.client("s3").create_bucket(Bucket="clash")
    put("clash", "run1", {"tensorboard": b"x", "tensorboard/events.out.tfevents.1": b"e"})
    with pytest.raises(DeployError, match=re.escape("'run1/tensorboard/events.out.tfevents.1'")):
        stack.fetch_run(Clients.connect(), run_prefix("clash", "run1"), tmp_path / "clash")


def test_a_prefix_holding_only_folder_markers_has_nothing_to_fetch(
    aws_endpoint: str, tmp_path: Path
) -> None:
    boto3.client("s3").create_bucket(Bucket="runs")
    put("runs", "run1", dict.fromkeys(MARKERS, b""))
    with pytest.raises(DeployError, match="nothing under s3://runs/run1 yet"):
        stack.fetch_run(Clients.connect(), run_prefix("runs", "run1"), tmp_path / "out")
