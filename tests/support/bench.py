"""Running a benchmark script end to end, as its user would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.processes import REPO, worker_env


def run_bench(script: str, *args: str, out: Path) -> dict:
    """Runs bench/<script> (e.g. "decode.py") as `python -m bench.<name>` from the repository
    root, writing its JSON to `out`; the JSON."""
    module = f"bench.{script.removesuffix('.py')}"
    command = [sys.executable, "-m", module, *args, "--json", str(out)]
    done = subprocess.run(command, env=worker_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())
