"""bench/offspring_budget.py end to end at a tiny size: the runner plays capped offspring of
one parent on Frostbite, and the budget's parts add up to the step it measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.bench import run_bench


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["int8-static", "float32"])
def test_offspring_budget_at_a_tiny_size(tmp_path: Path, noise_cache: Path, dtype: str) -> None:
    result = run_bench("offspring_budget.py", "--dtype", dtype, "--tasks", "2",
                       "--max-episode-steps", "40", "--seconds", "0.3", "--genomes", "2",
                       "--resets", "2", "--noise-table-size", str(2**23),
                       out=tmp_path / "budget.json")  # fmt: skip
    runner = result["runner"]
    assert runner["steps"] == 2 * 40 and runner["episodes"] == 2
    assert result["engine"] == "onnxruntime"
    # The dense layer's weights: 7-bit integers (one byte) or float32, 7744 x 512 either way.
    width = 1 if dtype == "int8-static" else 4
    assert result["dense_weight_bytes"] >= 7744 * 512 * width
    budget = result["budget"]
    parts = budget["ms_per_step"]
    # The parts are the runner's step split up: they add back to it.
    assert sum(parts.values()) == pytest.approx(runner["ms_per_step"], rel=1e-9)
    for name in ("emulator", "dense_weights", "seeded_reset", "decode_and_load"):
        assert parts[name] > 0, name
    assert budget["ratio_measured"] == pytest.approx(parts["emulator"] / runner["ms_per_step"])
    emulator, read = parts["emulator"], budget["weights_read_ms"]
    assert budget["ratio_floor"] == pytest.approx(emulator / (emulator + read))
    assert budget["dense_over_read"] == pytest.approx(parts["dense_weights"] / read)
    assert budget["ratio_without"]["dense_weights"] > budget["ratio_measured"]
    # A seeded reset reloads the ROM; an unseeded one does not.
    assert budget["seeded_reset_ms"] > budget["unseeded_reset_ms"] > 0
