"""The master capacity benchmark runs end to end at a tiny size (figures are not checked)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.processes import REPO, worker_env

pytestmark = pytest.mark.slow

ROW_KEYS = {"batch", "master_results_per_s", "echo_results_per_s", "master_over_echo",
            "master_lease_p99_ms", "echo_lease_p99_ms", "master_cpu_per_wall"}  # fmt: skip
CELL_KEYS = {"server", "batch", "results_per_s", "accepted", "not_accepted", "duplicates",
             "attached", "lease_p50_ms",
             "lease_p99_ms", "server_cpu_per_wall", "client_cpu_per_wall"}  # fmt: skip


def test_benchmark_reports_results_for_master_and_echo(tmp_path):
    out = tmp_path / "capacity.json"
    command = [sys.executable, "-m", "bench.master_capacity", "--seconds", "2", "--warmup", "0.5",
               "--clients", "2", "--batch", "8", "--population", "20",
               "--attached", "5", "--json", str(out)]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, env=worker_env(), capture_output=True, timeout=180)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    report = json.loads(out.read_text())
    [row] = report["rows"]
    assert set(row) >= ROW_KEYS and row["batch"] == 8
    cells = {c["server"]: c for c in report["cells"]}
    assert set(cells) == {"master", "echo"}
    for cell in cells.values():
        assert set(cell) >= CELL_KEYS
        assert cell["accepted"] > 0 and cell["results_per_s"] > 0
        assert cell["not_accepted"] == 0  # duplicates: backup copies, counted apart
    assert cells["master"]["generations"] >= 1
    # Every idle worker stayed watched through the window; the echo has no Attach.
    assert (cells["master"]["attached"], cells["echo"]["attached"]) == (5, 0)


def test_fleet_load_runs_a_whole_fleet_s_calls_against_the_master(tmp_path):
    out = tmp_path / "fleet.json"
    command = [sys.executable, "-m", "bench.master_fleet_load", "--workers", "30",
               "--client-procs", "1", "--seconds", "4", "--warmup", "2",
               "--json", str(out)]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, env=worker_env(), capture_output=True, timeout=180)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    [row] = json.loads(out.read_text())["rows"]
    assert row["workers"] == 30 and row["present_at_end"] == 30  # every presence held
    assert row["calls_per_s"]["lease"] > 0 and row["calls_per_s"]["report"] > 0
    assert row["results_per_s"] > 0 and 0 < row["server_cpu_per_wall"] <= 1.05
    assert 0 < row["client_cpu_per_wall"] <= 1.05
    # Only the holder's results count: a simulated worker reports only what it still holds.
    assert set(row["acks"]) <= {"RESULT_DISPOSITION_ACCEPTED", "RESULT_DISPOSITION_DUPLICATE"}
