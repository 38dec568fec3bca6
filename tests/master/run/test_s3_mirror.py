"""The S3 mirror of the run dir: moto on loopback stands in for S3, the master runs for real."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest

import master.run.start
from master.cli import main
from master.config import inspect_env_id, preset
from master.observe.events import RunSnapshot
from master.run.checkpoint import load_checkpoint, save_checkpoint, save_sidecar
from master.run.rundir import read_metrics
from master.run.s3_mirror import (
    STATUS_FIELDS,
    MirrorError,
    RunDirMirror,
    parse_s3_uri,
    status_document,
)
from master.run.start import RunOptions, ServeOptions, run_master
from tests.support.aws import aws_test_env
from tests.support.processes import REPO, free_port, worker_env
from tests.support.tiny import LOCAL_CARTPOLE_ARGS

RUN_FILES = ("config.json", "metrics.jsonl", "best_genome.json", "elite_genome.json",
             "checkpoint.json", "checkpoint.prev.json")  # fmt: skip
CONTRACT_STATUS = {"run_id", "env_id", "generation", "phase", "frames", "evaluations",
                   "elite_score", "workers", "tasks_pending", "tasks_leased", "tasks_done",
                   "leases_reissued", "run_complete", "updated_at"}  # fmt: skip
MASTER = [sys.executable, "-c", "import sys; from master.cli import main; sys.exit(main())"]
SMALL_RUN = [*LOCAL_CARTPOLE_ARGS, "--population", "20", "--seed", "1"]


@pytest.mark.parametrize(
    ("text", "bucket", "prefix"),
    [
        ("s3://bucket", "bucket", ""),
        ("s3://bucket/", "bucket", ""),
        ("s3://my.bucket-1/runs/a", "my.bucket-1", "runs/a"),
        ("s3://abc/runs/a/", "abc", "runs/a"),
        ("s3://b0b/Stack-Name_1", "b0b", "Stack-Name_1"),
    ],
)
def test_good_uris(text: str, bucket: str, prefix: str) -> None:
    uri = parse_s3_uri(text)
    assert (uri.bucket, uri.prefix) == (bucket, prefix)
    assert parse_s3_uri(str(uri)) == uri
    assert uri.key("status.json") == (f"{prefix}/status.json" if prefix else "status.json")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("bucket/runs", "must start with s3://"),
        ("S3://bucket/runs", "must start with s3://"),
        ("https://bucket.s3.amazonaws.com/x", "must start with s3://"),
        ("s3://", "no bucket"),
        ("s3:///runs", "no bucket"),
        ("s3://ab", "3-63 characters"),
        ("s3://" + "a" * 64, "3-63 characters"),
        ("s3://My-Bucket", "lowercase"),
        ("s3://-bucket", "begin and end"),
        ("s3://bucket-", "begin and end"),
        ("s3://bu_cket", "lowercase"),
        ("s3://a..b", "adjacent dots"),
        ("s3://192.168.1.10", "IP address"),
        ("s3://xn--bucket", "reserves"),
        ("s3://bucket-s3alias", "reserves"),
        ("s3://bucket//runs", "empty"),
        ("s3://bucket/runs/../a", "'..'"),
        ("s3://bucket/runs\n", "control characters"),
        ("s3://bucket/" + "p" * 901, "900 bytes"),
    ],
)
def test_bad_uris_are_refused_naming_the_value(text: str, why: str) -> None:
    with pytest.raises(ValueError, match="is not s3://bucket") as error:
        parse_s3_uri(text)
    assert repr(text) in str(error.value) and why in str(error.value)


def test_status_document_has_the_contracts_fields_from_a_run_snapshot() -> None:
    snapshot = RunSnapshot(run_id="r", env_id="CartPole-v1", generation=3, phase="elite",
                           frames=10, evaluations=0, elite_score=math.nan, elite_seeds=(),
                           tasks_pending=0, tasks_leased=0, tasks_done=0, workers=0,
                           leases_reissued=0, run_complete=True, wall_s=1.0)  # fmt: skip
    document = status_document(snapshot)
    assert set(document) == set(STATUS_FIELDS) == CONTRACT_STATUS - {"updated_at"}
    assert document["elite_score"] is None and document["generation"] == 3
    json.dumps(document, allow_nan=False)


def s3() -> Any:
    return boto3.client("s3")


def event_files(run_dir: Path) -> list[str]:
    return sorted(f"tensorboard/{p.name}" for p in (run_dir / "tensorboard").glob("events.*"))


def objects(bucket: str, prefix: str) -> dict[str, bytes]:
    client = s3()
    listing = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {
        item["Key"][len(prefix) :]: client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
        for item in listing
    }


class Recording:
    """A real S3 client that also notes the key of every object put."""

    def __init__(self, client: Any) -> None:
        self.client, self.puts = client, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def put_object(self, **kwargs: Any) -> Any:
        self.puts.append(kwargs["Key"])
        return self.client.put_object(**kwargs)


def write_run_files(run_dir: Path, tag: str) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        (run_dir / name).write_text(f'{{"file": "{name}", "tag": "{tag}"}}\n')


def test_sync_uploads_what_changed_data_before_checkpoints_and_restore_brings_it_back(
    aws_endpoint: str, tmp_path: Path
) -> None:
    s3().create_bucket(Bucket="runs")
    client = Recording(s3())
    mirror = RunDirMirror("s3://runs/a/b", client=client)
    run_dir = tmp_path / "run"
    write_run_files(run_dir, "one")
    assert mirror.sync(run_dir, {"generation": 1})
    keys = [key.removeprefix("a/b/") for key in client.puts]
    assert keys[:4] == ["config.json", "metrics.jsonl", "best_genome.json", "elite_genome.json"]
    assert keys[4:] == ["checkpoint.prev.json", "checkpoint.json", "status.json"]
    client.puts.clear()
    (run_dir / "metrics.jsonl").write_text('{"generation": 0}\n{"generation": 1}\n{"gen')
    (run_dir / "config.json").write_text((run_dir / "config.json").read_text())  # same bytes
    assert mirror.sync(run_dir, {"generation": 2})
    assert client.puts == ["a/b/metrics.jsonl", "a/b/status.json"]
    stored = objects("runs", "a/b/")
    # A line still being written stays out of S3 until it is complete.
    assert stored["metrics.jsonl"] == b'{"generation": 0}\n{"generation": 1}\n'
    status = json.loads(stored["status.json"])
    assert status["generation"] == 2 and abs(status["updated_at"] - time.time()) < 60
    # A replaced machine: an empty run dir gets every run file back, byte for byte.
    fresh = tmp_path / "fresh"
    assert mirror.restore(fresh)
    for name in RUN_FILES:
        assert (fresh / name).read_bytes() == stored[name], name
    assert not [p for p in fresh.iterdir() if p.name.startswith(".")]  # no temp files left
    # A run dir with its own checkpoint keeps it; a prefix without a run restores nothing.
    (fresh / "checkpoint.json").write_text("local")
    assert not mirror.restore(fresh)
    assert (fresh / "checkpoint.json").read_text() == "local"
    assert not RunDirMirror("s3://runs/other", client=s3()).restore(tmp_path / "empty")
    assert not (tmp_path / "empty").exists()


def test_es_state_files_no_checkpoint_names_are_neither_restored_nor_kept_in_s3(
    aws_endpoint: str, tmp_path: Path
) -> None:
    """An earlier master process's ES state files: restore() fetched every one of them, and
    no later process ever deleted them."""
    s3().create_bucket(Bucket="runs")
    first, fresh = tmp_path / "first", tmp_path / "fresh"
    write_run_files(first, "one")
    state = np.arange(4, dtype=np.float32)
    for generation in (2, 3):  # checkpoint.prev.json names the first, checkpoint.json the next
        save_checkpoint(first, {"sidecar": save_sidecar(first, generation, state)})
    (first / "elite_params.npy").write_bytes(b"not a state file")
    named = sorted(p.name for p in first.glob("es_state-*.npy"))
    assert len(named) == 2
    assert RunDirMirror("s3://runs/es", client=s3()).sync(first, {})
    stale = ["es_state-0-0.npy", "es_state-1-7.npy"]  # left by a master process before
    for name in stale:
        s3().put_object(Bucket="runs", Key=f"es/{name}", Body=b"old state")

    replacement = RunDirMirror("s3://runs/es", client=s3())
    assert replacement.restore(fresh)
    assert sorted(p.name for p in fresh.glob("*.npy")) == sorted([*named, "elite_params.npy"])
    assert load_checkpoint(fresh) == load_checkpoint(first)
    assert replacement.sync(fresh, {})
    stored = objects("runs", "es/")
    assert sorted(name for name in stored if name.endswith(".npy")) == sorted(
        [*named, "elite_params.npy"]
    )


def test_a_refused_sync_warns_once_and_the_next_one_uploads_everything(
    aws_endpoint: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    client = s3()
    mirror = RunDirMirror("s3://later/x", client=client)
    write_run_files(tmp_path, "one")
    with caplog.at_level(logging.WARNING, logger="master.run.s3_mirror"):
        assert not mirror.sync(tmp_path, {})  # the bucket is not there (yet)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "s3://later/x" in warnings[0] and "does not exist" in warnings[0]
    client.create_bucket(Bucket="later")
    assert mirror.sync(tmp_path, {})
    assert set(objects("later", "x/")) == {*RUN_FILES, "status.json"}


def test_a_dead_endpoint_fails_sync_quickly_and_restore_with_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for name, value in aws_test_env(f"http://127.0.0.1:{free_port()}").items():
        monkeypatch.setenv(name, value)
    mirror = RunDirMirror("s3://bucket/dead")
    write_run_files(tmp_path / "run", "one")
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="master.run.s3_mirror"):
        assert not mirror.sync(tmp_path / "run", {})
    assert time.monotonic() - started < 20  # three attempts with backoff, not a hang
    assert "s3://bucket/dead" in caplog.text and "cannot reach S3" in caplog.text
    with pytest.raises(MirrorError, match=r"s3://bucket/dead: .*cannot reach S3"):
        mirror.restore(tmp_path / "empty")


@pytest.mark.slow
def test_a_blackholed_s3_neither_slows_the_ga_nor_hangs_the_exit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, noise_cache: Path, caplog
) -> None:
    # A port that accepts connections and never answers: every S3 call waits out its timeout.
    with socket.socket() as blackhole:
        blackhole.bind(("127.0.0.1", 0))
        blackhole.listen(16)
        for name, value in aws_test_env(f"http://127.0.0.1:{blackhole.getsockname()[1]}").items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("PYTHONPATH", str(REPO))
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        monkeypatch.setattr(master.run.start, "FINAL_SYNC_TIMEOUT_S", 1.0)
        config = preset(inspect_env_id("CartPole-v1"), population_size=20, elite_candidates=2,
                        elite_episodes=2, generations=3, target_score=None, seed=1)  # fmt: skip
        mirror = RunDirMirror("s3://bucket/hole")
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="master.run.s3_mirror"):
            options = RunOptions(local_workers=1, worker_args=("--give-up-after", "30"), out=None,
                                 mirror=mirror, s3_sync_seconds=0.2)  # fmt: skip
            run = run_master(config, tmp_path / "run", ServeOptions(), options)
            records = asyncio.run(run)
        elapsed = time.monotonic() - started
    assert [r.generation for r in records] == [0, 1, 2]
    # The first sync alone waits 3 x 10 s for an answer; the run did not wait for it.
    assert elapsed < 25, elapsed
    assert "s3://bucket/hole skipped: the previous one is still running" in caplog.text
    assert "final sync to s3://bucket/hole did not complete within 1 s" in caplog.text


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*MASTER, *SMALL_RUN, *args], env=worker_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


@pytest.mark.slow
def test_the_master_mirrors_its_run_and_a_replacement_resumes_from_s3(
    aws_endpoint: str, tmp_path: Path, noise_cache: Path
) -> None:
    s3().create_bucket(Bucket="bucket")
    uri = "s3://bucket/runs/a"
    first, second = tmp_path / "first", tmp_path / "second"
    started = time.time()
    done = run_cli("--run-dir", str(first), "--generations", "2", "--s3-uri", uri)
    assert done.returncode == 0, done.stderr[-3000:]
    stored = objects("bucket", "runs/a/")
    events = event_files(first)
    assert len(events) == 1
    genomes = sorted(f"genomes/{p.name}" for p in (first / "genomes").glob("*.json"))
    assert len(genomes) >= 1
    assert set(stored) == {*RUN_FILES, *events, *genomes, "status.json"}
    for name in (*RUN_FILES, *events, *genomes):
        assert stored[name] == (first / name).read_bytes(), name
    metrics = read_metrics(first / "metrics.jsonl")
    status = json.loads(stored["status.json"])
    assert set(status) == CONTRACT_STATUS
    last = metrics[-1]
    assert (status["generation"], status["frames"], status["evaluations"]) == (
        last["generation"] + 1, last["frames"], last["evaluations"])  # fmt: skip
    assert status["elite_score"] == last["elite_score"] and status["run_complete"] is True
    assert status["run_id"] == json.loads(stored["config.json"])["run_id"]
    assert started <= status["updated_at"] <= time.time()
    # The machine is replaced: a new, empty run dir and the same URI continue the run.
    done = run_cli("--run-dir", str(second), "--generations", "3", "--s3-uri", uri)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"neuro master: restored {second} from {uri}" in done.stderr
    assert f"resuming {second} at generation 2" in done.stderr
    stored = objects("bucket", "runs/a/")
    resumed = [json.loads(line) for line in stored["metrics.jsonl"].splitlines()]
    assert [r["generation"] for r in resumed] == [0, 1, 2]
    assert resumed[:2] == metrics
    assert json.loads(stored["status.json"])["generation"] == 3
    for name in RUN_FILES:
        assert stored[name] == (second / name).read_bytes(), name
    # The curves came back with the run, and the resumed process added a file of its own.
    assert set(events) < set(event_files(second))
    assert {name for name in stored if name.startswith("tensorboard/")} == set(event_files(second))


def checkpoint_generation(text: str) -> int:
    """The generation a checkpoint.json's algorithm state is at."""
    return json.loads(text)["payload"]["algorithm"]["state"]["generation"]


@pytest.mark.slow
def test_a_master_killed_outright_leaves_a_resumable_run_in_s3(
    aws_endpoint: str, tmp_path: Path, noise_cache: Path
) -> None:
    """No SIGTERM, no final sync: what each checkpoint's sync put up is enough to go on."""
    s3().create_bucket(Bucket="bucket")
    uri = "s3://bucket/killed"
    command = [*MASTER, *SMALL_RUN, "--run-dir", str(tmp_path / "first"), "--generations", "40",
               "--s3-uri", uri, "--s3-sync-seconds", "3600"]  # fmt: skip
    # A session of its own, so its local worker dies with it.
    process = subprocess.Popen(command, env=worker_env(), cwd=REPO, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        generation, deadline = 0, time.monotonic() + 60
        while generation < 2 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.1)
            stored = objects("bucket", "killed/")
            if "checkpoint.json" in stored:
                generation = checkpoint_generation(stored["checkpoint.json"])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
    assert generation >= 2, "no checkpoint of generation 2 reached S3 in time"
    stored = objects("bucket", "killed/")
    generation = checkpoint_generation(stored["checkpoint.json"])
    assert generation < 40, "the run ended before it could be killed"
    # Metrics go up before the checkpoint they belong to.
    assert len(stored["metrics.jsonl"].splitlines()) >= generation
    done = run_cli("--run-dir", str(tmp_path / "second"), "--generations", str(generation + 1),
                   "--s3-uri", uri)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming {tmp_path / 'second'} at generation {generation}" in done.stderr
    metrics = read_metrics(tmp_path / "second" / "metrics.jsonl")
    assert [r["generation"] for r in metrics] == list(range(generation + 1))


def test_a_missing_bucket_or_unreachable_s3_stops_the_master_at_startup(
    aws_endpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch
) -> None:
    args = ["--env", "CartPole-v1", "--run-dir", str(tmp_path / "run")]
    assert main([*args, "--s3-uri", "s3://no-such-bucket/runs/a"]) == 1
    error = capsys.readouterr().err
    assert "s3://no-such-bucket/runs/a" in error and "'no-such-bucket' does not exist" in error
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    assert main([*args, "--s3-uri", "s3://bucket/runs/a"]) == 1
    error = capsys.readouterr().err
    assert "s3://bucket/runs/a" in error and "cannot reach S3" in error and "fork" in error
    assert not (tmp_path / "run").exists()  # nothing started


@pytest.mark.slow
def test_a_run_is_never_mirrored_over_another_runs_prefix(
    aws_endpoint: str, tmp_path: Path, noise_cache: Path
) -> None:
    s3().create_bucket(Bucket="bucket")
    first = run_cli("--run-dir", str(tmp_path / "a"), "--generations", "1",
                    "--s3-uri", "s3://bucket/runs/a")  # fmt: skip
    other = run_cli("--run-dir", str(tmp_path / "b"), "--generations", "1")
    assert first.returncode == 0 and other.returncode == 0, first.stderr + other.stderr
    before = objects("bucket", "runs/a/")
    # Run b, resumed with run a's prefix by mistake, stops before touching it.
    done = run_cli("--run-dir", str(tmp_path / "b"), "--generations", "2",
                   "--s3-uri", "s3://bucket/runs/a")  # fmt: skip
    ours = json.loads((tmp_path / "b" / "config.json").read_text())["run_id"]
    theirs = json.loads(before["config.json"])["run_id"]
    assert done.returncode == 1
    assert f"s3://bucket/runs/a holds run {theirs}, but {tmp_path / 'b'} is run {ours}" in (
        done.stderr
    )
    assert objects("bucket", "runs/a/") == before
    assert len(read_metrics(tmp_path / "b" / "metrics.jsonl")) == 1


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--s3-uri", "s3://Bad_Bucket/x"], "S3 URI 's3://Bad_Bucket/x' is not s3://bucket"),
        (["--s3-uri", "bucket/x"], "S3 URI 'bucket/x' is not s3://bucket"),
        (["--s3-uri", "s3://bucket/x", "--s3-sync-seconds", "0"], "got '0'"),
        (["--s3-uri", "s3://bucket/x", "--s3-sync-seconds", "nan"], "got 'nan'"),
    ],
)
def test_bad_s3_flags_exit_2_naming_the_value(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--env", "CartPole-v1", "--run-dir", str(tmp_path / "run"), *flags])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_the_master_needs_boto3_only_for_the_mirror(tmp_path: Path) -> None:
    # boto3 and botocore made unimportable: the master still imports; --s3-uri says what to do.
    script = (
        "import sys; sys.modules['boto3'] = sys.modules['botocore'] = None\n"
        "import master.cli, master.run.start, master.run.s3_mirror\n"
        "sys.exit(master.cli.main(sys.argv[1:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, "--env", "CartPole-v1", "--run-dir", str(tmp_path),
         "--s3-uri", "s3://bucket/x"],
        env=worker_env(), cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "s3://bucket/x needs boto3" in done.stderr
    assert "pip install 'neuro[aws]'" in done.stderr
