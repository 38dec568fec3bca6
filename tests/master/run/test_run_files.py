"""metrics.jsonl lines stay bounded: each names its elite by sha256, and the elites' seed lists
live once each in genomes/<sha256>.json, which replay, the S3 mirror and the checks read."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest

from master.config import inspect_env_id, preset
from master.observe.plot import load_run
from master.run.rundir import GenerationRecord, RunDirectory, read_metrics
from master.run.s3_mirror import RunDirMirror
from tests.support.processes import REPO, worker_env
from tests.support.tiny import LOCAL_CARTPOLE_ARGS

LINE_BOUND = 730
"""Bytes a GA metrics line may take at most, whatever the generation (rundir.GenerationRecord)."""
BIGGEST_INT = 2**63 - 1
LONGEST_FLOAT = -2.2250738585072014e-308


def canonical_sha256(seeds: list[int]) -> str:
    return hashlib.sha256(json.dumps(seeds, separators=(",", ":")).encode()).hexdigest()


def record(generation: int, seeds: list[int], **fields: Any) -> GenerationRecord:
    values: dict[str, Any] = dict(
        generation=generation, frames=1000 * (generation + 1), evaluations=14 * (generation + 1),
        wall_s=2.0 * (generation + 1), score_mean=61.7, score_max=500.0, elite_score=487.25,
        elite_seeds=seeds, generation_evaluations=14, generation_frames=1000,
        failed_evaluations=0, leases_reissued=0,
    )  # fmt: skip
    values.update(fields)
    return GenerationRecord(**values)


def run_directory(path: Path) -> RunDirectory:
    directory = RunDirectory(path)
    directory.write_config(preset(inspect_env_id("CartPole-v1")).to_dict())
    return directory


def genome_files(run_dir: Path) -> list[str]:
    return sorted(f"genomes/{p.name}" for p in (run_dir / "genomes").glob("*.json"))


def elite_chain(run_dir: Path) -> list[list[int]]:
    """Each generation's elite seed list, read through the genome file its line names."""
    chain = []
    for line in read_metrics(run_dir / "metrics.jsonl"):
        genome = json.loads((run_dir / "genomes" / f"{line['elite_sha256']}.json").read_text())
        assert canonical_sha256(genome["seeds"]) == line["elite_sha256"]
        assert len(genome["seeds"]) == line["elite_length"]
        chain.append(genome["seeds"])
    return chain


def test_a_metrics_line_is_bounded_however_long_the_elite(tmp_path: Path) -> None:
    directory = run_directory(tmp_path)
    seeds = list(range(2**32 - 100_000, 2**32))  # the longest seeds, 100,000 generations deep
    counters = ("frames", "evaluations", "generation_evaluations", "generation_frames",
                "failed_evaluations", "leases_reissued", "backup_tasks", "backup_wins",
                "workers_lost")  # fmt: skip
    figures = ("wall_s", "score_mean", "score_max", "elite_score", "tail_s", "worker_s")
    worst = record(BIGGEST_INT, seeds, **dict.fromkeys(counters, BIGGEST_INT),
                   **dict.fromkeys(figures, LONGEST_FLOAT))  # fmt: skip
    directory.append_metrics(worst)
    directory.append_metrics(worst)  # the same elite again: no second file
    lines = (tmp_path / "metrics.jsonl").read_bytes().splitlines()
    assert len(lines) == 2 and all(len(line) <= LINE_BOUND for line in lines)
    (line,) = read_metrics(tmp_path / "metrics.jsonl")[:1]
    assert "elite_seeds" not in line
    assert (line["elite_sha256"], line["elite_length"]) == (canonical_sha256(seeds), len(seeds))
    assert genome_files(tmp_path) == [f"genomes/{canonical_sha256(seeds)}.json"]
    assert elite_chain(tmp_path) == [seeds, seeds]


def test_an_elite_less_line_names_no_genome(tmp_path: Path) -> None:
    directory = run_directory(tmp_path)
    directory.append_metrics(record(0, []))
    (line,) = read_metrics(tmp_path / "metrics.jsonl")
    assert (line["elite_sha256"], line["elite_length"]) == (None, 0)
    assert genome_files(tmp_path) == []


@pytest.fixture(scope="module")
def ga_run(tmp_path_factory: pytest.TempPathFactory, noise_cache: Path) -> Path:
    run_dir = tmp_path_factory.mktemp("run-files") / "run"
    command = [sys.executable, "-m", "master", *LOCAL_CARTPOLE_ARGS,
               "--generations", "4", "--population", "10", "--seed", "2",
               "--run-dir", str(run_dir)]  # fmt: skip
    done = subprocess.run(command, env=worker_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # Piped, progress is metrics.jsonl's fields: bounded too.
    assert all("elite_seeds" not in json.loads(line) for line in done.stdout.splitlines())
    return run_dir


@pytest.mark.slow
def test_a_real_run_keeps_each_distinct_elite_once_and_each_replays(ga_run: Path) -> None:
    from worker import evaluate_policy, load_genome_file

    chain = elite_chain(ga_run)
    assert len(chain) == 4 and all(chain)
    assert genome_files(ga_run) == sorted({f"genomes/{canonical_sha256(s)}.json" for s in chain})
    latest = json.loads((ga_run / "elite_genome.json").read_text())
    assert latest["seeds"] == chain[-1]
    # A genome file is a whole genome document: neuro-eval replays it like elite_genome.json.
    path = ga_run / "genomes" / f"{canonical_sha256(chain[-1])}.json"
    assert load_genome_file(path) == load_genome_file(ga_run / "elite_genome.json")
    assert evaluate_policy(path, episodes=2, env_seed=5) == evaluate_policy(
        ga_run / "elite_genome.json", episodes=2, env_seed=5
    )
    # neuro-plot reads the new lines as before.
    assert [r["generation"] for r in load_run(ga_run).records] == [0, 1, 2, 3]


def test_the_s3_mirror_carries_the_genomes_and_restores_them(
    aws_endpoint: str, tmp_path: Path
) -> None:
    boto3.client("s3").create_bucket(Bucket="runs")
    run_dir = tmp_path / "run"
    directory = run_directory(run_dir)
    for generation, seeds in enumerate(([5], [5, 9], [5, 9])):
        directory.append_metrics(record(generation, seeds))
    (run_dir / "checkpoint.json").write_text("{}")
    mirror = RunDirMirror("s3://runs/a", client=boto3.client("s3"))
    assert mirror.sync(run_dir, {"generation": 3})
    client = boto3.client("s3")
    names = genome_files(run_dir)
    assert len(names) == 2
    for name in names:
        stored = client.get_object(Bucket="runs", Key=f"a/{name}")
        assert stored["Body"].read() == (run_dir / name).read_bytes()
        assert stored["ContentType"] == "application/json"
    fresh = tmp_path / "fresh"
    replacement = RunDirMirror("s3://runs/a", client=Recording(client))
    assert replacement.restore(fresh)
    assert genome_files(fresh) == names
    assert elite_chain(fresh) == [[5], [5, 9], [5, 9]]
    # Named by their content, the genomes S3 holds are never uploaded again; new ones are.
    run_directory(fresh).append_metrics(record(3, [5, 9, 2]))
    assert replacement.sync(fresh, {"generation": 4})
    uploaded = [key for key in replacement.client.puts if key.startswith("a/genomes/")]
    assert uploaded == [f"a/genomes/{canonical_sha256([5, 9, 2])}.json"]


class Recording:
    """A real S3 client that also notes the key of every object put."""

    def __init__(self, client: Any) -> None:
        self.client, self.puts = client, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def put_object(self, **kwargs: Any) -> Any:
        self.puts.append(kwargs["Key"])
        return self.client.put_object(**kwargs)


NOVELTY_LINE_BOUND = 890
"""GA-NS adds its archive and novelty figures to a GA line (NS-ES to an ES line: 1040)."""


@pytest.mark.parametrize(
    ("extra", "bound"),
    [
        ({"archive_size": BIGGEST_INT, "archive_added": BIGGEST_INT,
          "novelty_mean": LONGEST_FLOAT, "novelty_max": LONGEST_FLOAT}, NOVELTY_LINE_BOUND),
        ({"theta_rank": BIGGEST_INT, "population": BIGGEST_INT, "grad_norm": LONGEST_FLOAT,
          "observation_count": LONGEST_FLOAT, "member": BIGGEST_INT, "archive_size": BIGGEST_INT,
          "novelty_mean": LONGEST_FLOAT, "novelty_max": LONGEST_FLOAT}, 1040),
    ],
)  # fmt: skip
def test_a_novelty_search_line_is_bounded_too(tmp_path: Path, extra, bound) -> None:
    directory = run_directory(tmp_path)
    counters = ("frames", "evaluations", "generation_evaluations", "generation_frames",
                "failed_evaluations", "leases_reissued", "backup_tasks", "backup_wins",
                "workers_lost")  # fmt: skip
    figures = ("wall_s", "score_mean", "score_max", "elite_score", "tail_s", "worker_s")
    seeds = list(range(2**32 - 100_000, 2**32))
    worst = record(BIGGEST_INT, seeds, **dict.fromkeys(counters, BIGGEST_INT),
                   **dict.fromkeys(figures, LONGEST_FLOAT), extra=extra)  # fmt: skip
    directory.append_metrics(worst)
    (line,) = (tmp_path / "metrics.jsonl").read_bytes().splitlines()
    assert len(line) <= bound, len(line)
