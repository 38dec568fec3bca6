"""The Atari default dtype: int8-static for a new GA run on CPU workers, float32 for the
batched (GPU) runner, an ES, a vector-observation net, or a run that said so; config.json
records it and a resumed run keeps the dtype it started with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from master.cli import _resolve_config, build_parser
from master.config import RunConfig, inspect_env_id, preset
from master.run.local_workers import batched_local_workers
from neuro.inference import BATCHED, PER_GENOME, default_dtype


def _resolved(tmp_path: Path, *argv: str) -> RunConfig:
    parser = build_parser()
    config, resume = _resolve_config(parser, parser.parse_args(list(argv)), tmp_path / "run")
    assert resume is None
    return config


@pytest.mark.parametrize(
    ("argv", "gpus", "dtype"),
    [
        (["--env", "Frostbite-v4"], None, "int8-static"),  # a fleet of CPU workers
        (["--env", "Frostbite-v4", "--local-workers", "2"], None, "int8-static"),
        (["--env", "Frostbite-v4", "--local-workers", "1"], None, "int8-static"),
        # One local worker on a host with a GPU is the batched worker, which runs float32.
        (["--env", "Frostbite-v4", "--local-workers", "1"], 1, "float32"),
        (["--env", "Frostbite-v4", "--local-workers", "2"], 1, "int8-static"),  # one per core
        (["--env", "Frostbite-v4", "--local-workers", "1", "--worker-arg=--device",
          "--worker-arg=cpu"], 1, "int8-static"),
        (["--env", "Frostbite-v4", "--local-workers", "1", "--worker-arg=--envs=8"], None,
         "float32"),
        (["--env", "Frostbite-v4", "--policy", "nature"], None, "int8-static"),
        (["--env", "Frostbite-v4", "--inference-dtype", "float32"], None, "float32"),
        (["--env", "Frostbite-v4", "--algo", "es"], None, "float32"),  # never measured for ES
        (["--env", "Frostbite-v4", "--algo", "ga-ns"], None, "int8-static"),
        (["--env", "CartPole-v1"], None, "float32"),  # an mlp has no int8-static
    ],
)  # fmt: skip
def test_a_new_runs_default_dtype(tmp_path, monkeypatch, argv, gpus, dtype) -> None:
    monkeypatch.setattr("master.run.local_workers.listed_gpus", lambda: gpus)
    assert _resolved(tmp_path, *argv).inference_dtype == dtype


def test_the_default_is_recorded_in_config_json_and_a_resumed_run_keeps_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from master.run.checkpoint import save_checkpoint

    monkeypatch.setattr("master.run.local_workers.listed_gpus", lambda: None)
    config = _resolved(tmp_path, "--env", "Frostbite-v4")
    recorded = config.to_dict()
    assert recorded["inference_dtype"] == "int8-static"
    assert RunConfig.from_dict(json.loads(json.dumps(recorded))).inference_dtype == "int8-static"
    # A run started in float32 (before the default changed) resumes in float32.
    old = preset(inspect_env_id("Frostbite-v4"), inference_dtype="float32").to_dict()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save_checkpoint(
        run_dir, {"config": old, "algorithm": {"name": "ga", "state": {"generation": 3}}}
    )
    parser = build_parser()
    args = parser.parse_args(["--env", "Frostbite-v4"])
    resumed, resume = _resolve_config(parser, args, run_dir)
    assert resume is not None and resumed.inference_dtype == "float32"
    # A config.json from before the dtype was recorded is float32's, the only one there was.
    del old["inference_dtype"]
    assert RunConfig.from_dict(old).inference_dtype == "float32"


@pytest.mark.parametrize(
    ("worker_arg", "count", "gpus", "batched"),
    [
        ([], 0, 1, False),  # no local workers
        ([], 1, None, False),
        ([], 1, 2, True),
        ([], 3, 2, False),
        (["--device", "cuda:1"], 2, None, True),
        (["--device=cpu"], 1, 1, False),
        (["--envs", "0"], 1, None, False),
        (["--envs", "16", "--device", "cpu"], 1, None, True),
    ],
)
def test_which_local_workers_are_the_batched_runner(worker_arg, count, gpus, batched) -> None:
    assert batched_local_workers(worker_arg, count, gpus) is batched


def test_default_dtype_by_network_and_runner() -> None:
    assert default_dtype("deepga", PER_GENOME) == default_dtype("nature", PER_GENOME)
    assert default_dtype("deepga", PER_GENOME) == "int8-static"
    assert default_dtype("deepga", BATCHED) == "float32"
    assert default_dtype("mlp", PER_GENOME) == "float32"
    with pytest.raises(ValueError, match="'resnet'"):
        default_dtype("resnet", PER_GENOME)


def test_the_cost_estimate_prices_the_masters_default() -> None:
    from deploy import cost

    assert cost.throughput_table()["default"] == f"deepga/{default_dtype('deepga', PER_GENOME)}"
    assert cost.throughput().key == "deepga/int8-static"
