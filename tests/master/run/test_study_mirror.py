"""A study's S3 mirror: moto on loopback stands in for S3, the master runs for real.

The study dir goes up as it is laid out (study.toml, study.json, runs/<name>/ each as a run's
mirror keeps it); a replacement machine with an empty study dir and the same command gets it
back and goes on: runs complete there stay complete, the others resume from their
checkpoints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3

from master.run.rundir import read_metrics
from tests.support.processes import REPO, worker_env

STUDY = """
name = "mirrored"
max_concurrent_runs = 1
test_episodes = 2
[budget]
no_target = true
generations = {generations}
[[grid]]
envs = ["CartPole-v1", "neuro/Memorize-K10-v0"]
seeds = [4]
settings = {{ population_size = 6, truncation = 2, elite_candidates = 2, elite_episodes = 2 }}
"""
URI = "s3://bucket/studies/mirrored"
NAMES = ("cartpole-v1-s4", "neuro-memorize-k10-v0-s4")


def objects(prefix: str) -> dict[str, bytes]:
    client = boto3.client("s3")
    listing = client.list_objects_v2(Bucket="bucket", Prefix=prefix).get("Contents", [])
    return {item["Key"][len(prefix) :]: client.get_object(Bucket="bucket", Key=item["Key"])[
        "Body"].read() for item in listing}  # fmt: skip


def serve(folder: Path, study_dir: Path, generations: int) -> subprocess.CompletedProcess[Any]:
    (folder / "study.toml").write_text(STUDY.format(generations=generations))
    command = [sys.executable, "-m", "master", "--study", str(folder / "study.toml"),
               "--study-dir", str(study_dir), "--local-workers", "2", "--port", "0",
               "--s3-uri", URI, "--quiet"]  # fmt: skip
    return subprocess.run(command, cwd=REPO, env=worker_env(), capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip


def test_a_study_goes_to_s3_and_a_replacement_machine_goes_on_from_there(
    aws_endpoint: str, tmp_path: Path, noise_cache: Path
) -> None:
    boto3.client("s3").create_bucket(Bucket="bucket")
    first, second = tmp_path / "first", tmp_path / "second"
    done = serve(tmp_path, first, generations=2)
    assert done.returncode == 0, done.stderr[-3000:]
    stored = objects("studies/mirrored/")
    states = json.loads(stored["study.json"])
    assert {r["name"]: r["state"] for r in states["runs"]} == dict.fromkeys(NAMES, "complete")
    assert stored["study.toml"] == (first / "study.toml").read_bytes()
    for name in NAMES:
        for file in ("config.json", "metrics.jsonl", "checkpoint.json", "final_test.json"):
            key = f"runs/{name}/{file}"
            assert stored[key] == (first / "runs" / name / file).read_bytes(), key
    # The machine is replaced: an empty study dir, the same URI, a bigger budget. The final
    # tests came back with the runs: they stay complete, as on the first machine.
    done = serve(tmp_path, second, generations=3)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "restored 2 run(s) of the study" in done.stderr
    for name in NAMES:
        lines = read_metrics(second / "runs" / name / "metrics.jsonl")
        assert [line["generation"] for line in lines] == [0, 1], name
    assert (second / "study.json").is_file()


def test_an_unfinished_study_resumes_on_the_replacement_from_its_checkpoints(
    aws_endpoint: str, tmp_path: Path, noise_cache: Path
) -> None:
    boto3.client("s3").create_bucket(Bucket="bucket")
    first, second = tmp_path / "first", tmp_path / "second"
    done = serve(tmp_path, first, generations=2)
    assert done.returncode == 0, done.stderr[-3000:]
    # As if the first machine died during the second run's final test: S3 has the run's
    # checkpoint of its spent budget, no final test, and the run running in study.json.
    client = boto3.client("s3")
    prefix = f"studies/mirrored/runs/{NAMES[1]}/"
    client.delete_object(Bucket="bucket", Key=prefix + "final_test.json")
    record = json.loads((first / "study.json").read_text())
    for run in record["runs"]:
        run["state"] = "running" if run["name"] == NAMES[1] else run["state"]
    client.put_object(Bucket="bucket", Key="studies/mirrored/study.json",
                      Body=json.dumps(record).encode())  # fmt: skip
    done = serve(tmp_path, second, generations=2)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"run {NAMES[1]} resumes from its checkpoint at generation 2" in done.stderr
    assert (second / "runs" / NAMES[1] / "final_test.json").is_file()
    states = json.loads(objects("studies/mirrored/")["study.json"])
    assert {r["name"]: r["state"] for r in states["runs"]} == dict.fromkeys(NAMES, "complete")
