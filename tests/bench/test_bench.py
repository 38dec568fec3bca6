"""The benchmarks run end to end at a tiny size, so they cannot rot (no timing thresholds)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.support.bench import run_bench
from tests.support.processes import REPO

pytestmark = pytest.mark.slow


def test_throughput_benchmark_with_one_batched_worker(tmp_path: Path, noise_cache: Path) -> None:
    result = run_bench("throughput.py", "--population", "6", "--elite-episodes", "2",
                       "--max-episode-steps", "30", "--emulator-seconds", "0.5",
                       "--noise-table-size", str(2**23), "--forward-repeats", "3",
                       "--loaded-sets", "2", "--bandwidth-mb", "8", "--matrix", "128",
                       "--skip-gym", "--batched-envs", "4", "--device", "cpu",
                       out=tmp_path / "b.json")  # fmt: skip
    training = result["runs"]["float32"]["training"]
    assert training["batched_envs"] == 4 and training["device"] == "cpu"
    assert training["evaluations"] == 6 + 2 and training["frames"] > 0
    # One worker process did it all, several genomes per forward pass.
    assert len(training["memory_mib"]) == 2 and training["breakdown"]["samples_per_forward"] > 1
    assert training["gpu_utilisation_percent"] is None
    assert training["hours_per_1b_frames_on_this_host"] == pytest.approx(
        1e9 / (training["frames"] / training["wall_s"]) / 3600
    )


def test_throughput_benchmark_at_a_tiny_size(tmp_path: Path, noise_cache: Path) -> None:
    result = run_bench("throughput.py", "--population", "2", "--elite-episodes", "1",
                       "--max-episode-steps", "40", "--emulator-seconds", "0.5",
                       "--noise-table-size", str(2**23), "--forward-repeats", "3",
                       "--loaded-sets", "2", "--bandwidth-mb", "8", "--matrix", "128",
                       out=tmp_path / "t.json")  # fmt: skip
    workers = result["machine"]["cpus"]
    for engine in ("ceiling", "gym_reference"):
        figures = result[engine]
        assert len(figures["per_process"]) == figures["processes"] == workers
        assert figures["frames_per_s_total"] == pytest.approx(
            sum(p["frames_per_s"] for p in figures["per_process"])
        )
        assert figures["frames_per_s_per_core"] > 0
    assert result["host"]["bytes_per_s"] > 0 and result["host"]["peak_flop_per_s"]["float32"] > 0
    assert set(result["runs"]) == {"float32"}
    run = result["runs"]["float32"]
    forward = run["forward"]
    assert forward["params"] == 4_052_658 and forward["bytes_per_forward"] >= 4 * 4_052_658
    layers = {"conv1", "conv2", "conv3", "fc", "out"}
    # onnxruntime adds its re-blocking of the convolutions' layout, which is no one layer's
    assert set(forward["layer_ms"]) in (layers, layers | {"layout"})
    assert forward["engine"] == "onnxruntime"  # a worker's default where it is installed
    # Timed by hooks on the layers: a pass that went around the modules would leave zeros.
    assert all(ms > 0 for ms in forward["layer_ms"].values())
    assert forward["flops_per_forward"] > 2 * 4_000_000
    l3 = result["machine"]["l3"]["bytes"]
    assert l3 is None or forward["loaded_bytes_cycled"] >= 4 * l3
    training = run["training"]
    assert training["generations"] == 1 and training["evaluations"] == 2 + 1
    assert 0 < training["frames"] <= 3 * 40 * 4
    phases = training["phases"]
    assert set(phases) == {"offspring", "elite"}
    assert sum(p["frames"] for p in phases.values()) == training["frames"]
    assert phases["offspring"]["episodes"] == 2 and phases["elite"]["episodes"] == 1
    mix = run["paper_mix"]
    assert mix["offspring_frame_share"] + mix["elite_frame_share"] == pytest.approx(1.0)
    ratios = run["ratio_to_ceiling"]
    assert set(ratios) == {"offspring", "elite", "run", "paper_mix_idle", "paper_mix_loaded"}
    assert all(math.isfinite(r) and r > 0 for r in ratios.values())
    # Each run is divided by the mean of the ceilings measured just before and after it.
    bracket = run["ceiling"]
    after = result["ceiling_after_each_run"]
    assert len(after) == 1 and after[0]["processes"] == workers
    assert bracket["frames_per_s_per_core"] == pytest.approx(
        (result["ceiling"]["frames_per_s_per_core"] + after[0]["frames_per_s_per_core"]) / 2
    )
    assert ratios["offspring"] == pytest.approx(
        phases["offspring"]["frames_per_s_per_core"] / bracket["frames_per_s_per_core"]
    )
    assert ratios["run"] == pytest.approx(
        training["frames_per_s_per_core"] / bracket["frames_per_s_per_core"]
    )
    cost = run["core_hours"]
    for mode in ("idle", "loaded"):
        hours = cost[mode]["core_hours_per_1b_frames"]
        assert hours == pytest.approx(1e9 / mix[f"{mode}_frames_per_s_per_core"] / 3600)
        assert cost[mode]["usd_per_1b_frames"] == pytest.approx(
            hours * result["price"]["usd_per_vcpu_hour"]
        )
    assert run["floor"]["step_floor_ms"] > run["floor"]["emulator_ms_per_step"] > 0
    assert result["host"]["read_bytes_per_s"] > 0
    assert run["floor"]["loaded_step_floor_ms"] > run["floor"]["emulator_ms_per_step"]
    offspring_ms = phases["offspring"]["ms_per_step_per_core"]
    assert run["floor"]["offspring_loaded_ms_per_step"] >= offspring_ms
    parts = {"env", "forward", "decode", "wait", "reset", "other"}
    assert set(training["breakdown"]["ms_per_step"]) == parts
    assert training["breakdown"]["ms_per_step"]["reset"] > 0  # every task starts seeded
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


def test_the_floor_prices_no_dtype_below_float32_and_int8_on_the_workers_kernel() -> None:
    """On an AVX2 CPU torch's bfloat16 matmul and `_int_mm` crawl (~1 GFLOP/s), which made the
    int8 and bfloat16 floors slower than the measured pass; the floor takes no dtype's peak
    below float32's, and int8's is timed on fbgemm's linear, which the dense layer runs."""
    import torch

    from bench.hostcost import matmul_peak
    from bench.throughput import floor

    torch.set_num_threads(1)
    float32, int8 = (matmul_peak(torch, 256, dtype) for dtype in ("float32", "int8"))
    assert float32 and int8 and int8 > float32 / 4
    host = {"bytes_per_s": 1e9, "peak_flop_per_s": {"float32": 1e11, "bfloat16": 1e8}}
    forward = {"bytes_per_forward": 1_000, "flops_by_dtype": {"bfloat16": 10**9}, "idle_ms": 20,
               "loaded_ms": 25}  # fmt: skip
    training = {"phases": {"offspring": {"ms_per_step_per_core": 12.0}}}
    result = floor({"ms_per_env_step": 0.5}, host, forward, training)
    assert result["forward_compute_ms"] == pytest.approx(10.0)  # at float32's 1e11, not 1e8
    assert result["forward_bound"] == "compute" and result["step_floor_ms"] == pytest.approx(10.5)
    # Loaded: the bytes at the read bandwidth where that is the slower, and the loaded pass's
    # extra on top of the measured offspring step.
    host["read_bytes_per_s"] = 1e5  # 1,000 bytes: 10 ms, the same as the compute floor
    forward["bytes_per_forward"] = 2_000
    result = floor({"ms_per_env_step": 0.5}, host, forward, training)
    assert result["forward_loaded_memory_ms"] == pytest.approx(20.0)
    assert result["loaded_step_floor_ms"] == pytest.approx(20.5)
    assert result["offspring_loaded_ms_per_step"] == pytest.approx(17.0)
    assert result["loaded_floor_over_offspring_loaded"] == pytest.approx(20.5 / 17.0)


def test_inference_engine_benchmark_at_a_tiny_size(tmp_path: Path) -> None:
    result = run_bench("inference_engines.py", "--processes", "1", "--steps", "20",
                       "--rounds", "1", "--agreement-genomes", "1", "--agreement-steps", "30",
                       out=tmp_path / "engines.json")  # fmt: skip
    assert set(result["summary"]) == {
        f"{dtype}/{engine}" for dtype in ("float32", "int8") for engine in ("torch", "onnxruntime")
    }
    for figures in result["summary"].values():
        assert figures["forward_ms"] > 0 and figures["emulator_ms"] > 0
    assert result["machine"]["onnxruntime"]
    for figures in result["agreement"].values():
        assert figures["steps"] == 30 and 0 <= figures["same_action"] <= 1


def test_pinning_benchmark_at_a_tiny_size(tmp_path: Path) -> None:
    result = run_bench("pinning.py", "--steps", "20", "--rounds", "1",
                       out=tmp_path / "pinning.json")  # fmt: skip
    assert set(result["summary"]) == {"scheduler", "pinned"}
    for figures in result["summary"].values():
        assert figures["forward_ms"] > 0 and figures["emulator_ms"] > 0
        assert figures["step_ms"] == pytest.approx(figures["forward_ms"] + figures["emulator_ms"])
    assert result["pinned_over_scheduler"] == pytest.approx(
        result["summary"]["pinned"]["step_ms"] / result["summary"]["scheduler"]["step_ms"]
    )
    assert result["settings"]["processes"] == 1 and len(result["rounds"]) == 1


def test_revision_comparison_at_a_tiny_size(tmp_path: Path) -> None:
    """Both trees build every engine's policies with their own code and step Frostbite; here
    the revision is this tree's own commit, so the same keys come back from both sides."""
    result = run_bench("compare_revisions.py", "--before", "HEAD", "--processes", "1",
                       "--steps", "5", "--rounds", "1", out=tmp_path / "c.json")  # fmt: skip
    summary = result["summary"]
    keys = {f"{d}/{e}" for d in ("float32", "int8", "int8-static")
            for e in ("torch", "onnxruntime")}  # fmt: skip
    assert set(summary["before"]) == set(summary["after"]) == set(summary["ratio"]) == keys
    for side in ("before", "after"):
        for figures in summary[side].values():
            assert figures["forward_ms"] > 0 and figures["emulator_ms"] > 0
    assert len(result["before"]) == 40 and result["after"].startswith(result["before"])


def test_replay_engines_at_a_tiny_size(tmp_path: Path, noise_cache: Path) -> None:
    genome = REPO / "bench" / "results" / "frostbite-best-genome.json"
    result = run_bench("replay_engines.py", str(genome), "--episodes", "1",
                       out=tmp_path / "r.json")  # fmt: skip
    dtypes = ("float32", "bfloat16", "int8", "int8-static")
    assert set(result["scores"]) == {f"{d}/{e}" for d in dtypes for e in ("torch", "onnxruntime")}
    assert all(len(scores) == 1 for scores in result["scores"].values())
    # What onnxruntime does not serve ran on torch, and says so.
    assert result["engines"]["bfloat16/onnxruntime"] == ["torch"]
    assert result["engines"]["int8-static/onnxruntime"] == ["onnxruntime"]


def test_fleet_simulation_at_a_tiny_size(tmp_path: Path) -> None:
    """Virtual time: the figures depend on the seeds and the recorded episode lengths only,
    not on how fast this machine runs."""
    result = run_bench("fleet_sim.py", "--workers", "20", "--generations", "1",
                       "--offspring", "50", "--elite", "2x5", out=tmp_path / "f")  # fmt: skip
    rows = {(r["workers"], r["deaths_per_generation"], r["mode"], r["detect_s"]): r
            for r in result["runs"]}  # fmt: skip
    modes = [("before", None), ("after", 1.0), ("after", 20.0)]
    expected = {(20, 0, "before", None), (20, 0, "after", None)}
    expected |= {(20, deaths, mode, detect) for deaths in (1, 5) for mode, detect in modes}
    assert set(rows) == expected
    lease_s = result["settings"]["lease_s"]
    for (_, deaths, mode, _), row in rows.items():
        assert row["generation_s"] >= row["ideal_s"] > 0
        assert row["generation_s"] == pytest.approx(row["offspring_s"] + row["elite_s"], abs=2e-3)
        # Every task recorded exactly once; nothing came from a worker after its death.
        assert row["tasks"] == row["accepted"] == 50 + 2 * 5 and row["accepted_exactly_once"]
        assert row["accepted_from_dead_workers"] == 0 and row["rejected"] == 0
        assert 1 <= row["deaths"] <= deaths or row["deaths"] == deaths == 0
        if mode == "before":
            assert row["backups_granted"] == 0
        if deaths:
            assert row["generation_s"] <= rows[(20, deaths, "before", None)]["generation_s"]
    # Before: a dead worker's task comes back only when its lease lapses.
    assert rows[(20, 1, "before", None)]["generation_s"] > lease_s
    assert rows[(20, 1, "before", None)]["reissued"] >= 1
    assert rows[(20, 0, "after", None)]["backups_granted"] > 0


def test_random_play_at_a_tiny_size_records_how_it_was_made(tmp_path: Path) -> None:
    result = run_bench("random_play.py", "--episodes", "2", "--max-episode-steps", "30",
                       out=tmp_path / "r.json")  # fmt: skip
    assert result["episodes"] == 2 and result["min"] <= result["mean"] <= result["max"]
    # Every benchmark's JSON says how it was made (bench/common.py's provenance).
    assert result["command"].startswith("python -m bench.random_play --episodes 2")
    assert result["revision"] and len(result["date"]) == len("2026-11-28")


def test_batched_forward_at_a_tiny_size(tmp_path: Path) -> None:
    result = run_bench("batched_forward.py", "--arch", "mlp", "--device", "cpu", "--repeats", "1",
                       "--batches", "1", "3", "--threads", "1", out=tmp_path / "f")  # fmt: skip
    assert set(result["ms_per_step"]) == {"1", "3"}
    assert all(ms > 0 for row in result["ms_per_step"].values() for ms in row.values())
