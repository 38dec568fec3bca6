"""docs/examples runs as docs/your-own-problem.md says: the package on PYTHONPATH, neuro-master
training its env with its network on two local workers, neuro-eval replaying the best genome,
neuro-export writing it with its check against neuro-eval, and the Python script doing the same
through neuro.train."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import REPO, worker_env

pytestmark = pytest.mark.slow

EXAMPLES = REPO / "docs" / "examples"
PACKAGE = EXAMPLES / "mypkg"


def example_env() -> dict[str, str]:
    env = worker_env()
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE), env["PYTHONPATH"]])
    return env


def run(*command: str, timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run(command, env=example_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def console(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def test_the_example_trains_replays_and_exports_from_the_command_line(
    tmp_path: Path, noise_cache
) -> None:
    run_dir = tmp_path / "mypkg"
    run(console("neuro-master"), "--env", "mypkg:MyEnv-v0", "--policy", "mypkg.nets:make_policy",
        "--local-workers", "2", "--generations", "4", "--population", "30", "--no-target",
        "--port", "0", "--quiet", "--run-dir", str(run_dir))  # fmt: skip
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["generation"] for r in records] == [0, 1, 2, 3]
    best = json.loads((run_dir / "best_genome.json").read_text())
    assert best["policy"] == {"factory": "mypkg.nets:make_policy", "options": {}}

    replay = run(console("neuro-eval"), str(run_dir), "--episodes", "5", "--seed", "1")
    (scores,) = [line for line in replay.stdout.splitlines() if line.startswith("scores: ")]
    assert len(scores.split()) == 6 and all(0 < float(s) <= 300 for s in scores.split()[1:])

    export = run(console("neuro-export"), str(run_dir), "--format", "onnx", "--check", "1500")
    assert f"wrote {run_dir}/best_genome.onnx: mypkg:MyEnv-v0 mypkg.nets:make_policy" in (
        export.stdout
    )
    check = re.search(r"check: (\d+) of (\d+) steps \(100\.00%\)", export.stdout)
    assert check and check[1] == check[2] and int(check[2]) >= 1500, export.stdout


def test_the_example_script_trains_through_the_python_api(tmp_path: Path, noise_cache) -> None:
    done = run(sys.executable, str(EXAMPLES / "train_mypkg.py"), str(tmp_path / "run"))
    assert "10 generations, best elite score" in done.stdout
    assert re.search(r"greedy actions of three observations: \[[01] [01] [01]\]", done.stdout)
