"""bench/mutation_effects.py end to end at a tiny size: a study run's plateau elite as the
parent, a few offspring, each played under float32 and int8-static."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.bench import run_bench


@pytest.mark.slow
def test_mutation_effects_at_a_tiny_size(tmp_path: Path, noise_cache: Path) -> None:
    study = tmp_path / "study"
    study.mkdir()
    run = {"replays": {"final": {"elite_sha256": "ab"}}, "elite_seeds": {"ab": [17, 4]}}
    (study / "run.json").write_text(json.dumps(run))
    result = run_bench("mutation_effects.py", "--runs", "run.json", "--study-dir", str(study),
                       "--offspring", "3", "--max-steps", "30",
                       "--noise-table-size", str(2**23), out=tmp_path / "m.json")  # fmt: skip
    entry = result["parents"]["run.json"]
    assert entry["seeds"] == [17, 4]
    for layer in ("conv1.weight", "conv2.weight", "conv3.weight", "fc.weight"):
        # A mutation moves every float32 weight; some of the 7-bit codes stay.
        assert 0 < entry["weights"][layer]["codes_changed"] < 1
        assert entry["weights"][layer]["step_over_sigma"] > 0
    for dtype in ("float32", "int8-static"):
        played = entry[dtype]
        assert played["parent"]["frames"] == 30 * 4  # the cap, in frames
        assert played["neutral"] + played["better"] + played["worse"] <= 3
        assert 1 <= played["distinct_outcomes"] <= 3
