"""--inference-dtype: recorded, sent to workers, replayed, and close to float32's actions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from master.config import RunConfig
from master.fleet.tasks import task_template
from master.run.start import resume_config
from neuro.genome import Genome
from neuro.inference import engines_for
from neuro.noise import NoiseTableSpec
from neuro.v1 import evolution_pb2 as pb
from tests.support.bench import run_bench
from tests.support.processes import REPO, worker_env
from tests.support.tiny import LOCAL_CARTPOLE_ARGS, tiny_cartpole
from worker import evaluate_policy, load_genome_file
from worker.client.wire import spec_from_task
from worker.evaluation.evaluator import Evaluator
from worker.evaluation.spec import EvaluationSpec
from worker.inference.policy import build_policy
from worker.limits import check_spec

ATARI_OBS = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
VECTOR_OBS = gym.spaces.Box(-np.inf, np.inf, (8,), np.float32)


def test_the_setting_round_trips_config_json_and_a_resume() -> None:
    config = tiny_cartpole(inference_dtype="bfloat16")
    saved = json.loads(json.dumps(config.to_dict()))
    assert saved["inference_dtype"] == "bfloat16"
    assert RunConfig.from_dict(saved) == config
    assert resume_config({"config": saved}, generations=9).inference_dtype == "bfloat16"
    assert tiny_cartpole().inference_dtype == "float32"
    # A config.json from before the field ran float32.
    del saved["inference_dtype"]
    assert RunConfig.from_dict(saved).inference_dtype == "float32"


def test_an_invalid_dtype_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'float16'"):
        tiny_cartpole(inference_dtype="float16")
    spec = EvaluationSpec("CartPole-v1", (1,), 0.05, NoiseTableSpec(size=2**16), "mlp",
                          (8,), inference_dtype="int4")  # fmt: skip
    with pytest.raises(ValueError, match="'int4'"):
        check_spec(spec)
    with pytest.raises(ValueError, match="'fp8'"):
        build_policy("mlp", VECTOR_OBS, gym.spaces.Discrete(2), (8,), inference_dtype="fp8")


def test_tasks_and_genome_documents_carry_the_dtype() -> None:
    config = tiny_cartpole(inference_dtype="bfloat16")
    template = task_template(config)
    assert template.policy.inference_dtype == "bfloat16"
    task = pb.Task(env=template.env, policy=template.policy, episodes=1,
                   genome=pb.Genome(seeds=[1], noise_table=template.noise_table))  # fmt: skip
    assert spec_from_task(task).inference_dtype == "bfloat16"
    task.policy.inference_dtype = ""  # a master from before the field
    assert spec_from_task(task).inference_dtype == "float32"
    task.policy.inference_dtype = "float64"
    with pytest.raises(ValueError, match="'float64'"):
        spec_from_task(task)
    assert config.genome_document(Genome((1, 2)))["inference_dtype"] == "bfloat16"


def test_replay_uses_the_genome_documents_dtype(tmp_path: Path, noise_cache: Path) -> None:
    document = tiny_cartpole(inference_dtype="bfloat16").genome_document(Genome((7, 8)))
    path = tmp_path / "genome.json"
    path.write_text(json.dumps(document))
    assert load_genome_file(path).inference_dtype == "bfloat16"
    evaluator = Evaluator()
    evaluate_policy(path, episodes=1, evaluator=evaluator)
    assert list(evaluator.engines_used) == ["mlp/bfloat16"]
    del document["inference_dtype"]  # a genome file from before the field
    path.write_text(json.dumps(document))
    assert load_genome_file(path).inference_dtype == "float32"


# Measured (bench/inference_dtype.py's method on random genomes and random observations): the
# lowest agreement over these seeds was 0.977 (deepga), 0.992 (nature), 0.996 (mlp) in
# bfloat16 and 0.977 (deepga, nature) in int8, whose 255-level weights round more; a genome
# whose top two logits are within the reduced precision's rounding flips, so agreement is
# never exactly 1 (over 80 random deepga genomes in bfloat16: mean 0.996, lowest 0.977).
# Uniform-noise frames are harder than a game's: on Frostbite's own frames the bench measures
# more (docs/performance.md).
AGREEMENT_FLOOR = {"bfloat16": 0.97, "int8": 0.95}


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
@pytest.mark.parametrize("architecture", ["deepga", "nature", "mlp"])
def test_reduced_precision_actions_agree_with_float32(architecture: str, dtype: str) -> None:
    if architecture == "mlp":
        spaces, hidden = (VECTOR_OBS, gym.spaces.Discrete(4)), (64, 64)
    else:
        spaces, hidden = (ATARI_OBS, gym.spaces.Discrete(18)), ()
    reference = build_policy(architecture, *spaces, hidden)
    reduced = build_policy(architecture, *spaces, hidden, inference_dtype=dtype)
    rng = np.random.default_rng(0)
    if architecture == "mlp":
        observations = rng.standard_normal((512, 8)).astype(np.float32)
    else:
        observations = rng.integers(0, 256, (128, *ATARI_OBS.shape), dtype=np.uint8)
    agreeing = []
    for _ in range(4):
        theta = rng.standard_normal(reference.num_params) * reference.init_scale()
        theta = theta.astype(np.float32)
        reference.load_parameters(theta)
        reduced.load_parameters(theta)
        # The float32 buffer is the genome's exact decode, untouched by the reduced copy.
        assert np.array_equal(reduced.flat_parameters, theta)
        agreeing.append(
            np.mean(reference.act_batch(observations) == reduced.act_batch(observations))
        )
    assert min(agreeing) >= AGREEMENT_FLOOR[dtype], agreeing


@pytest.mark.slow
def test_a_bfloat16_run_trains_and_replays_end_to_end(tmp_path: Path, noise_cache: Path) -> None:
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "master", *LOCAL_CARTPOLE_ARGS, "--generations", "2",
               "--population", "6", "--inference-dtype", "bfloat16", "--quiet",
               "--run-dir", str(run_dir)]  # fmt: skip
    done = subprocess.run(command, env=worker_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((run_dir / "config.json").read_text())["inference_dtype"] == "bfloat16"
    best = json.loads((run_dir / "best_genome.json").read_text())
    assert best["inference_dtype"] == "bfloat16"
    # The worker ran the tasks in bfloat16: a replay in that dtype scores what the run did.
    scores = evaluate_policy(run_dir, episodes=2, inference_dtype="bfloat16")
    assert all(np.isfinite(scores))


@pytest.mark.slow
def test_inference_dtype_benchmark_at_a_tiny_size(tmp_path: Path, noise_cache: Path) -> None:
    result = run_bench("inference_dtype.py", "--noise-table-size", str(2**23),
                       "--forward-repeats", "3", "--load-repeats", "2", "--genomes", "2",
                       "--episodes", "1", "--max-steps", "20", "--trained-genome", "none",
                       out=tmp_path / "i.json")  # fmt: skip
    assert result["params"] == 4_052_658
    assert set(result["dtypes"]) == {"float32", "bfloat16", "int8", "int8-static"}
    f32, bf16 = result["dtypes"]["float32"], result["dtypes"]["bfloat16"]
    assert bf16["weight_bytes_per_step"] < f32["weight_bytes_per_step"] == 4 * 4_052_658
    # int8-static reads one byte per weight and float32 scales, biases and output layer.
    assert result["dtypes"]["int8-static"]["weight_bytes_per_step"] < 4_052_658 * 1.01
    assert result["agreement"]["fraction_agreeing"]["float32"] == 1.0
    assert 0 < result["agreement"]["steps"] <= 2 * 20


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_every_dtype_runs_the_genome_last_loaded(dtype: str) -> None:
    """The inference copies (channels-last convolutions, bfloat16 or int8 layers) follow every
    load: a policy reused for a second genome acts as one built for it alone."""
    spaces = (ATARI_OBS, gym.spaces.Discrete(18))
    reused = build_policy("deepga", *spaces, inference_dtype=dtype)
    fresh = build_policy("deepga", *spaces, inference_dtype=dtype)
    rng = np.random.default_rng(3)
    observations = rng.integers(0, 256, (16, *ATARI_OBS.shape), dtype=np.uint8)
    first, second = (
        (rng.standard_normal(reused.num_params) * reused.init_scale()).astype(np.float32)
        for _ in range(2)
    )
    reused.load_parameters(first)
    before = reused.act_batch(observations)
    reused.load_parameters(second)
    fresh.load_parameters(second)
    after = reused.act_batch(observations)
    assert np.array_equal(after, fresh.act_batch(observations))
    assert not np.array_equal(before, after)  # the second genome is a different policy


@pytest.mark.parametrize("engine", engines_for("int8", "deepga", "per-genome", "cpu"))
def test_int8_reads_a_quarter_of_the_dense_bytes(engine: str) -> None:
    """The bytes a pass reads come from the pass the engine built: the dense layer in int8 on
    every engine and CPU; the convolutions in whatever that engine stores (bfloat16, or
    float32 holding bfloat16 values where a CPU cannot pack bfloat16 convolutions)."""
    spaces = (ATARI_OBS, gym.spaces.Discrete(18))
    built = {d: build_policy("deepga", *spaces, inference_dtype=d, inference_engine=engine)
             for d in ("float32", "bfloat16", "int8")}  # fmt: skip
    assert built["int8"].inference_engine == engine
    sizes = {d: policy.weight_bytes_per_forward() for d, policy in built.items()}
    assert sizes["float32"] == 4 * 4_052_658
    layers = built["int8"].forward.layer_bytes
    assert sum(layers.values()) == sizes["int8"]
    # The 7744x512 dense layer is 98% of the weights: int8 with a float32 scale and bias per
    # unit; the 512x18 output layer in float32.
    assert layers["fc"] == 7744 * 512 + 8 * 512
    assert layers["out"] == 4 * (512 * 18 + 18)
    convolutions = 4_052_658 - (7744 * 512 + 512) - (512 * 18 + 18)
    conv_bytes = sum(layers[f"conv{i}"] for i in (1, 2, 3))
    assert conv_bytes in (2 * convolutions, 4 * convolutions)
    assert sizes["int8"] < sizes["bfloat16"] < sizes["float32"]


def test_an_int8_row_acts_the_same_whatever_shares_its_batch() -> None:
    """Per-call input quantisation would tie a row's range to its batch-mates'."""
    policy = build_policy(
        "deepga",
        ATARI_OBS,
        gym.spaces.Discrete(18),
        inference_dtype="int8",
        inference_engine="torch",
    )
    rng = np.random.default_rng(5)
    policy.load_parameters(
        (rng.standard_normal(policy.num_params) * policy.init_scale()).astype(np.float32)
    )
    dense = policy.forward.inference_module.fc
    rows = torch.from_numpy(np.abs(rng.standard_normal((6, 7744))).astype(np.float32))
    rows[3:] /= 50  # a much smaller input range than their batch-mates'
    with torch.inference_mode():
        assert torch.equal(dense(rows), torch.cat([dense(row[None]) for row in rows]))


@pytest.mark.parametrize("architecture", ["deepga", "nature"])
def test_the_reordered_int8_dense_layer_computes_what_the_plain_order_does(
    architecture: str,
) -> None:
    """The int8 dense layer takes its columns in the channels-last conv output's order, so the
    flatten before it is a view: per-row scales, the input's range and int32 sums do not
    depend on the column order, so the outputs are those of the plain order bit for bit."""
    from worker.inference.engines.torch_cpu.layers import Int8Linear

    policy = build_policy(
        architecture, ATARI_OBS, gym.spaces.Discrete(18), inference_dtype="int8",
        inference_engine="torch",
    )  # fmt: skip
    rng = np.random.default_rng(8)
    policy.load_parameters(
        (rng.standard_normal(policy.num_params) * policy.init_scale()).astype(np.float32)
    )
    net = policy.forward.inference_module
    assert net.fc_input_nhwc and net.fc.fused_relu
    plain = Int8Linear(net.fc.in_features, net.fc.out_features, relu=True)
    plain.pack(policy.forward.module.fc.weight, policy.forward.module.fc.bias)
    conv_output = torch.from_numpy(np.abs(rng.standard_normal((3, *net.conv_output_shape))))
    conv_output = conv_output.float().contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        reordered = net.fc(conv_output.permute(0, 2, 3, 1).flatten(1))
        expected = plain(conv_output.flatten(1))
    assert torch.equal(reordered, expected)
    assert (expected == 0).any() and (expected > 0).any()  # the ReLU is applied, not all zeros
