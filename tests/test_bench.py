"""The benchmarks run end to end at a tiny size, so they cannot rot (no timing thresholds)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, worker_env

pytestmark = pytest.mark.slow


def run_bench(script: str, *args: str, out: Path) -> dict:
    command = [sys.executable, str(REPO / "bench" / script), *args, "--json", str(out)]
    done = subprocess.run(command, env=worker_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def test_throughput_benchmark_at_a_tiny_size(tmp_path: Path, noise_cache: Path) -> None:
    result = run_bench("throughput.py", "--population", "2", "--elite-episodes", "1",
                       "--max-episode-steps", "40", "--emulator-seconds", "0.5",
                       "--noise-table-size", str(2**23), out=tmp_path / "t.json")  # fmt: skip
    assert result["emulator"]["frames_per_s"] > 0
    assert result["forward"]["deepga"]["params"] == 4_052_658
    assert set(result["forward"]["nature"]["layer_ms"]) == {"conv1", "conv2", "conv3", "fc", "out"}
    training = result["training"]
    assert training["generations"] == 1 and training["evaluations"] == 2 + 1
    assert 0 < training["frames"] <= 3 * 40 * 4
    assert result["ratio"] == pytest.approx(
        training["frames_per_s_per_core"] / result["emulator"]["frames_per_s"]
    )
    parts = {"env", "forward", "decode", "wait", "other"}
    assert set(training["breakdown"]["ms_per_step"]) == parts
    assert {"master", "worker-0"} <= training["memory_mib"].keys()
    assert all(m["pss_mib"] > 0 for m in training["memory_mib"].values())


def test_decode_benchmark_at_a_tiny_size(tmp_path: Path, noise_cache: Path) -> None:
    result = run_bench("decode.py", "--generations", "6", "--repeats", "2", "--policy", "mlp",
                       "--noise-table-size", str(2**16), out=tmp_path / "d.json")  # fmt: skip
    assert result["params"] == 4610
    assert result["child_cost_ratio"] == pytest.approx(
        result["child_generation_6_ms"] / result["child_generation_1_ms"]
    )
    assert result["cold_decode_6_entries_s"] > 0
    assert "worker_memory_mib" not in result  # the mlp run skips it; the next test covers it
    assert set(result["mutation"]) == {"noise_table_slice_add_ms", "torch_randn_per_seed_ms",
                                       "numpy_generator_per_seed_ms"}  # fmt: skip


def test_decode_benchmark_measures_shared_parent_memory(tmp_path: Path, noise_cache: Path) -> None:
    result = run_bench("decode.py", "--generations", "3", "--repeats", "1", "--policy", "nature",
                       "--memory-children", "3", "--noise-table-size", str(2**22),
                       out=tmp_path / "m.json")  # fmt: skip
    memory = result["worker_memory_mib"]
    assert set(memory) == {"private", "shared"}
    assert all(len(m) == 2 and all(w["private_dirty_mib"] > 0 for w in m) for m in memory.values())
