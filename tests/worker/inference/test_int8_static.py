"""int8-static: the Atari net in integers, calibrated per genome on the game's own frames."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from tests.support.processes import REPO, worker_env
from worker import evaluate_policy
from worker.evaluation.evaluator import Evaluator
from worker.inference.engines.onnx_runtime.session import installed as onnxruntime_installed
from worker.inference.int8_static import (
    ACTIVATION_LEVELS,
    WEIGHT_LEVELS,
    QuantisedAtariNet,
    quantised_rows,
)
from worker.inference.policy import build_policy
from worker.play.calibration import calibration_observations

ATARI_OBS = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
ACTIONS = gym.spaces.Discrete(18)
STATIC = "int8-static"


@pytest.fixture(scope="module")
def frostbite_frames() -> np.ndarray:
    return calibration_observations("Frostbite-v4", "paper")


def genomes(policy, count: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    scale = policy.init_scale()
    return [
        (rng.standard_normal(policy.num_params) * scale).astype(np.float32) for _ in range(count)
    ]


def test_calibration_frames_are_the_games_and_the_same_on_every_build(frostbite_frames):
    again = calibration_observations.__wrapped__("Frostbite-v4", "paper")  # a fresh env
    assert np.array_equal(frostbite_frames, again)
    assert frostbite_frames.shape == (16, *ATARI_OBS.shape)
    assert frostbite_frames.dtype == np.uint8 and not frostbite_frames.flags.writeable
    # Frames of play, not one frame repeated: the random actions moved the game along.
    assert len({frame.tobytes() for frame in frostbite_frames}) > 8


def test_weights_are_seven_bit_rows_rounded_half_to_even():
    weight = np.array([[0.63, -0.315, 0.001, 0.005], [0.0, 0.0, 0.0, 0.0]], np.float32)
    integers, scales = quantised_rows(weight)
    assert scales[0] == np.float32(0.63) / np.float32(63)
    assert integers[0].tolist() == [63, -32, 0, 0]  # -31.5 -> -32, 0.5 -> 0 (to even)
    assert integers[1].tolist() == [0, 0, 0, 0] and np.isfinite(scales[1]) and scales[1] > 0
    # AVX2's u8 x s8 dot product adds pairs of products in saturating int16: a byte times a
    # 7-bit weight, twice, must fit, or CPUs with and without it would sum different integers.
    assert 2 * ACTIVATION_LEVELS * WEIGHT_LEVELS < 2**15 <= 2 * ACTIVATION_LEVELS * 127


def test_each_layers_scale_is_set_by_its_largest_calibration_output(frostbite_frames):
    policy = build_policy("deepga", ATARI_OBS, ACTIONS, inference_dtype=STATIC,
                          inference_engine="torch", calibration=frostbite_frames)  # fmt: skip
    for theta in genomes(policy, 2, seed=5):
        policy.load_parameters(theta)
        static = policy.forward
        layers = static.calibrated.layer_bytes(static.net, frostbite_frames)
        for outputs in layers:
            values = outputs.numpy()
            assert values.max() == ACTIVATION_LEVELS  # the calibration's peak is the top byte
            assert np.array_equal(values, np.round(values)) and values.min() == 0
            assert 0.05 < np.mean(values > 0) < 0.95  # the bytes carry the ReLU's pattern


@pytest.mark.skipif(not onnxruntime_installed(), reason="onnxruntime is not installed")
@pytest.mark.parametrize("architecture", ["deepga", "nature"])
def test_onnxruntime_and_torch_compute_the_same_integers(frostbite_frames, architecture):
    """Every convolution's bytes and the dense layer's sums are exact on both engines, so the
    logits differ only in the float32 output layer's order of sums."""
    engines = {
        engine: build_policy(
            architecture,
            ATARI_OBS,
            ACTIONS,
            inference_dtype=STATIC,
            inference_engine=engine,
            calibration=frostbite_frames,
        )
        for engine in ("torch", "onnxruntime")
    }
    assert {e: p.inference_engine for e, p in engines.items()} == {
        "torch": "torch", "onnxruntime": "onnxruntime"
    }  # fmt: skip
    noise = np.random.default_rng(0).integers(0, 256, (24, *ATARI_OBS.shape), dtype=np.uint8)
    observations = np.concatenate([frostbite_frames, noise])
    for theta in genomes(engines["torch"], 3, seed=1):
        for policy in engines.values():
            policy.load_parameters(theta)
        on_torch = engines["torch"].forward(observations)
        on_onnx = engines["onnxruntime"].forward(observations)
        one_by_one = np.concatenate([engines["onnxruntime"].forward(o[None]) for o in observations])
        # One byte off anywhere would move a logit by ~1e-3 of its size.
        np.testing.assert_allclose(on_onnx, on_torch, rtol=1e-5, atol=1e-6 * np.abs(on_torch).max())
        assert np.array_equal(one_by_one, on_onnx)
        assert np.array_equal(
            engines["torch"].act_batch(observations), engines["onnxruntime"].act_batch(observations)
        )


def test_a_policy_runs_the_genome_last_loaded(frostbite_frames):
    reused = build_policy("deepga", ATARI_OBS, ACTIONS, inference_dtype=STATIC,
                          calibration=frostbite_frames)  # fmt: skip
    fresh = build_policy("deepga", ATARI_OBS, ACTIONS, inference_dtype=STATIC,
                         calibration=frostbite_frames)  # fmt: skip
    first, second = genomes(reused, 2, seed=3)
    reused.load_parameters(first)
    before = reused.forward(frostbite_frames)
    reused.load_parameters(second)
    fresh.load_parameters(second)
    after = reused.forward(frostbite_frames)
    assert np.array_equal(after, fresh.forward(frostbite_frames))
    assert not np.array_equal(before, after)


# Measured over 20 random deepga genomes (init scale): the same greedy action as float32 on
# every calibration frame; on 100 frames of random play, 0.976 on average, 0.91 the lowest
# (int8: 0.989 and 0.93). A genome whose top two logits nearly tie flips under any rounding.
AGREEMENT_FLOOR = 0.85


def test_its_actions_agree_with_float32_on_the_games_frames(frostbite_frames):
    reference = build_policy("deepga", ATARI_OBS, ACTIONS)
    static = build_policy("deepga", ATARI_OBS, ACTIONS, inference_dtype=STATIC,
                          calibration=frostbite_frames)  # fmt: skip
    agreeing = []
    for theta in genomes(reference, 6, seed=11):
        reference.load_parameters(theta)
        static.load_parameters(theta)
        assert np.array_equal(static.flat_parameters, theta)  # the exact decode is untouched
        same = reference.act_batch(frostbite_frames) == static.act_batch(frostbite_frames)
        agreeing.append(float(np.mean(same)))
    assert min(agreeing) >= AGREEMENT_FLOOR, agreeing


def quantised_digest(net: QuantisedAtariNet) -> str:
    digest = hashlib.sha256()
    for array in (*net.conv_integers, *net.conv_scales, *net.conv_biases, *net.fc):
        digest.update(np.ascontiguousarray(array).tobytes())
    for scale in (*net.input_scales, *net.output_scales):
        digest.update(np.float32(scale).tobytes())
    return digest.hexdigest()


def test_golden_a_genome_quantises_to_the_same_net_in_every_release():
    """Synthetic calibration frames and a seeded parameter vector: every integer and scale
    is exact arithmetic (float32 sums of integers below 2**24, elementwise float32 ops), so
    the digest is the same on every CPU. A change here changes what int8-static runs."""
    frames = np.random.default_rng(2026).integers(0, 256, (4, *ATARI_OBS.shape), dtype=np.uint8)
    policy = build_policy("deepga", ATARI_OBS, ACTIONS, inference_dtype=STATIC,
                          inference_engine="torch", calibration=frames)  # fmt: skip
    policy.load_parameters(genomes(policy, 1, seed=7)[0])
    net = policy.forward.net
    assert [float(s) for s in net.output_scales] == pytest.approx(GOLDEN_SCALES, rel=1e-6)
    assert quantised_digest(net) == GOLDEN_DIGEST


GOLDEN_SCALES = [0.008082271553575993, 0.004348903428763151, 0.0027225790545344353]
GOLDEN_DIGEST = "9919ce250211c0ba4dc3aad86696ff7d98021a355fabb8f4e581a9bef577655c"


def test_what_it_cannot_quantise_is_refused_by_name(frostbite_frames):
    with pytest.raises(
        ValueError, match="'int8-static' runs on the deepga, nature nets, not 'mlp'"
    ):
        build_policy("mlp", gym.spaces.Box(-1, 1, (8,), np.float32), gym.spaces.Discrete(4),
                     (16,), inference_dtype=STATIC, calibration=frostbite_frames)  # fmt: skip
    with pytest.raises(ValueError, match="needs calibration observations"):
        build_policy("deepga", ATARI_OBS, ACTIONS, inference_dtype=STATIC)
    with pytest.raises(ValueError, match="uint8 array, got float32"):
        build_policy("deepga", ATARI_OBS, ACTIONS, inference_dtype=STATIC,
                     calibration=frostbite_frames.astype(np.float32))  # fmt: skip
    with pytest.raises(ValueError, match=r"shape \(4, 84, 42\) do not match"):
        build_policy("deepga", ATARI_OBS, ACTIONS, inference_dtype=STATIC,
                     calibration=frostbite_frames[..., :42])  # fmt: skip
    policy = build_policy("deepga", ATARI_OBS, ACTIONS, inference_dtype=STATIC,
                          calibration=frostbite_frames)  # fmt: skip
    policy.load_parameters(genomes(policy, 1, seed=0)[0])
    with pytest.raises(ValueError, match="uint8 observations"):
        policy.act_batch(frostbite_frames[:2].astype(np.float32))


@pytest.mark.slow
def test_an_int8_static_frostbite_run_trains_and_replays_through_the_clis(
    tmp_path: Path, noise_cache: Path
) -> None:
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "master", "--env", "Frostbite-v4", "--local-workers", "2",
               "--port", "0", "--population", "6", "--truncation", "3", "--elite-candidates",
               "2", "--elite-episodes", "2", "--generations", "2", "--max-episode-steps", "60",
               "--inference-dtype", STATIC, "--noise-table-size", str(2**23), "--quiet",
               "--run-dir", str(run_dir)]  # fmt: skip
    done = subprocess.run(command, env=worker_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((run_dir / "config.json").read_text())["inference_dtype"] == STATIC
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["failed_evaluations"] for line in lines] == [0, 0]
    # A replay builds the run's policy: int8-static, calibrated as the workers calibrated it.
    evaluator = Evaluator()
    scores = evaluate_policy(run_dir, episodes=1, evaluator=evaluator)
    assert all(np.isfinite(scores))
    assert list(evaluator.engines_used) == [f"deepga/{STATIC}"]
