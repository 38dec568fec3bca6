"""The onnxruntime inference engine: the torch pass's numbers up to the order of sums, the same
actions in play, rows independent of their batch, and clear errors for a bad engine."""

from __future__ import annotations

import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

import worker.inference.engines.onnx_runtime as onnx_runtime_engine
from neuro.decode import decode_genome
from neuro.envs.make import make_env
from neuro.noise import NoiseTableSpec, load_noise_table
from tests.support.processes import REPO, worker_env
from worker.evaluation.evaluator import Evaluator
from worker.evaluation.spec import EvaluationSpec
from worker.inference import registry
from worker.inference.base import NetSpec, NetWeights
from worker.inference.engines.onnx_runtime.atari import OnnxAtariForward
from worker.inference.engines.onnx_runtime.session import session
from worker.inference.policy import Policy, build_policy
from worker.inference.quantise import INT8_LEVELS, quantise_rows
from worker.play.rollout import run_episode
from worker.runners.per_genome import play_spec

ATARI_OBS = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
ACTIONS = gym.spaces.Discrete(18)
TRAINED_GENOME = REPO / "bench" / "results" / "frostbite-best-genome.json"


def _pair(architecture: str, dtype: str, seed: int, scale: float = 1.0) -> tuple[Policy, Policy]:
    """The same random genome (`scale` x the paper's init scale) on torch and onnxruntime."""
    on_torch = build_policy(architecture, ATARI_OBS, ACTIONS, inference_dtype=dtype,
                            inference_engine="torch")  # fmt: skip
    on_onnx = build_policy(architecture, ATARI_OBS, ACTIONS, inference_dtype=dtype,
                           inference_engine="onnxruntime")  # fmt: skip
    assert (on_torch.inference_engine, on_onnx.inference_engine) == ("torch", "onnxruntime")
    rng = np.random.default_rng(seed)
    flat = rng.standard_normal(on_torch.num_params) * on_torch.init_scale() * scale
    flat = flat.astype(np.float32)
    on_torch.load_parameters(flat)
    on_onnx.load_parameters(flat)
    return on_torch, on_onnx


def _logits(policy: Policy, observations: np.ndarray) -> np.ndarray:
    return policy.forward(observations)


def _frostbite_observations(count: int) -> np.ndarray:
    """Observations of real play (random actions), where a net's inputs are not noise."""
    handle = make_env("Frostbite-v4")
    rng = np.random.default_rng(0)
    try:
        observation, _ = handle.env.reset(seed=11)
        seen = []
        for _ in range(count):
            seen.append(observation)
            observation, _, terminated, truncated, _ = handle.env.step(int(rng.integers(18)))
            if terminated or truncated:
                observation, _ = handle.env.reset()
        return np.stack(seen).astype(np.uint8)
    finally:
        handle.env.close()


@pytest.mark.parametrize("architecture", ["deepga", "nature"])
@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_onnxruntime_computes_the_torch_pass_up_to_the_order_of_sums(
    architecture: str, dtype: str
) -> None:
    """float32: float32 rounding. int8: the same bfloat16 values and int8 integers, so the
    logits differ only where a sum's order moved a bfloat16 rounding or an input level."""
    on_torch, on_onnx = _pair(architecture, dtype, seed=3)
    observations = _frostbite_observations(48)
    expected, got = _logits(on_torch, observations), _logits(on_onnx, observations)
    assert got.shape == expected.shape == (48, 18) and got.dtype == np.float32
    spread = float(np.abs(expected).max())
    tolerance = 1e-5 if dtype == "float32" else 1e-2
    assert np.abs(got - expected).max() <= tolerance * spread
    agreement = float(np.mean(got.argmax(1) == expected.argmax(1)))
    assert agreement == 1.0 if dtype == "float32" else agreement >= 0.95


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_both_engines_play_the_trained_genome_alike(dtype: str) -> None:
    """The learning check's trained genome plays Frostbite (torch's actions drive; capped to
    keep the test short) and both engines choose an action for every observation. float32:
    the same action at every step, so the same episode. int8: its bfloat16 roundings can
    fall the other way where a sum's order moves a value across a rounding boundary, and one
    changed level of the dense layer's input range moves every logit a little, so near-ties
    flip now and then, as between an AVX2 and an AVX-512 CPU."""
    document = json.loads(TRAINED_GENOME.read_text())
    table = load_noise_table(NoiseTableSpec(**document["noise_table"]))
    policies = {}
    for engine in ("torch", "onnxruntime"):
        policies[engine] = build_policy("deepga", ATARI_OBS, ACTIONS, inference_dtype=dtype,
                                        inference_engine=engine)  # fmt: skip
        flat = decode_genome(
            table, policies[engine].init_scale(), document["mutation_power"], document["seeds"]
        )
        policies[engine].load_parameters(flat)
    chosen: dict[str, list[int]] = {"torch": [], "onnxruntime": []}
    worst = 0.0  # the largest logit difference over the episode, relative to the logits' size

    def act(observation: np.ndarray) -> int:
        nonlocal worst
        logits = {engine: _logits(policy, observation[None])[0]
                  for engine, policy in policies.items()}  # fmt: skip
        for engine, policy in policies.items():
            chosen[engine].append(policy.act(observation))
            assert chosen[engine][-1] == int(np.argmax(logits[engine]))
        spread = float(np.abs(logits["torch"]).max())
        worst = max(worst, float(np.abs(logits["torch"] - logits["onnxruntime"]).max()) / spread)
        return chosen["torch"][-1]

    handle = make_env("Frostbite-v4")
    try:
        result = run_episode(act, handle, max_steps=500, seed=21)
    finally:
        handle.env.close()
    assert len(set(chosen["torch"])) > 1 and result.total_reward > 0  # it plays, and scores
    same = float(np.mean(np.equal(chosen["torch"], chosen["onnxruntime"])))
    assert same == 1.0 if dtype == "float32" else same >= 0.99, same
    assert worst <= (1e-5 if dtype == "float32" else 1e-2), worst


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_a_row_computes_the_same_alone_or_in_a_batch(dtype: str) -> None:
    """int8 quantises each row's input over its own range, so rows of a batched elite pass do
    not change each other (the small rows would lose all their levels to a large one's)."""
    _, on_onnx = _pair("deepga", dtype, seed=5)
    observations = _frostbite_observations(6)
    observations[3:] //= 40  # much smaller inputs than their batch-mates'
    batched = on_onnx.forward(observations)
    alone = np.concatenate([on_onnx.forward(row[None]) for row in observations])
    assert np.array_equal(batched, alone)


def test_a_reload_computes_what_the_first_load_did() -> None:
    """Each load builds a new session over the new weights; nothing of the last genome stays."""
    _, policy = _pair("deepga", "int8", seed=1)
    first_genome = np.array(policy.flat_parameters)
    observations = _frostbite_observations(4)
    first = policy.forward(observations)
    other = (first_genome * -1.5).astype(np.float32)
    policy.load_parameters(other)
    assert not np.array_equal(policy.forward(observations), first)
    policy.load_parameters(first_genome)
    assert np.array_equal(policy.forward(observations), first)
    # one observation goes through the session's I/O binding: the same numbers, and a
    # returned array is the caller's (the next call does not overwrite it)
    alone = policy.forward(observations[:1])
    assert np.array_equal(alone, first[:1])
    policy.forward(observations[1:2])
    assert np.array_equal(alone, first[:1])
    policy.load_parameters(other)
    assert not np.array_equal(policy.forward(observations[:1]), first[:1])


def test_the_int8_rows_are_torchs_integers_and_scales() -> None:
    """Both engines' int8 dense layer comes from the one numpy quantiser: torch's
    quantize_per_channel rounds to the same integers, and the scales are max|w| / 127, over
    weights of many magnitudes, an all-zero row and denormal-sized entries."""
    from worker.inference.engines.torch_cpu.layers import int8_rows

    rng = np.random.default_rng(4)
    for magnitude in (1e-4, 1e-2, 1.0, 30.0):
        weight = (rng.standard_normal((512, 1000)) * magnitude).astype(np.float32)
        weight[3] = 0.0
        weight[5, :10] = np.float32(1e-30)
        weight[7, 0] = 127 * magnitude  # an exact tie of w / scale at the row's maximum
        integers, scales = quantise_rows(weight, INT8_LEVELS)
        packed = int8_rows(torch.from_numpy(weight))  # what the torch engine packs
        assert np.array_equal(integers, packed.int_repr().numpy())
        assert np.array_equal(scales.astype(np.float64), packed.q_per_channel_scales().numpy())
        # torch's own quantiser, given those scales, rounds to the same integers.
        reference = torch.quantize_per_channel(
            torch.from_numpy(weight), torch.from_numpy(scales).double(),
            torch.zeros(len(scales), dtype=torch.long), 0, torch.qint8,
        )  # fmt: skip
        assert np.array_equal(integers, reference.int_repr().numpy())
        live = np.abs(weight).max(axis=1) > 0
        expected = torch.from_numpy(weight).abs().amax(dim=1) / 127
        assert np.array_equal(scales[live], expected.numpy()[live])


def test_onnxruntime_rounds_to_bfloat16_as_torch_does() -> None:
    """The int8 pass's convolutions round their outputs to bfloat16 with two Casts: nearest,
    ties to even, as torch's .to(torch.bfloat16), including at exact ties and tiny values."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(2)
    values = np.concatenate([
        rng.standard_normal(5000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 5000),
        # exact ties: bfloat16 keeps the top 16 bits, so a low half of 0x8000 is halfway
        (np.arange(1, 2001, dtype=np.uint32) << 16 | 0x8000).view(np.float32),
    ]).astype(np.float32)  # fmt: skip
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.BFLOAT16),
             helper.make_node("Cast", ["h"], ["y"], to=TensorProto.FLOAT)]  # fmt: skip
    graph = helper.make_graph(
        nodes, "round", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [len(values)])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [len(values)])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    rounded = session(model).run(None, {"x": values})[0]
    expected = torch.from_numpy(values).to(torch.bfloat16).float().numpy()
    assert np.array_equal(rounded.view(np.uint32), expected.view(np.uint32))


def test_what_onnxruntime_does_not_compute_runs_on_torch() -> None:
    assert build_policy("deepga", ATARI_OBS, ACTIONS, inference_dtype="bfloat16",
                        inference_engine="onnxruntime").inference_engine == "torch"  # fmt: skip
    vector = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    mlp = build_policy("mlp", vector, gym.spaces.Discrete(2), inference_engine="onnxruntime")
    assert mlp.inference_engine == "torch"
    spec = NetSpec("deepga", (4, 84, 84), 18, dtype="bfloat16")
    weights = NetWeights(np.zeros(4_052_658, np.float32), spec.layout)
    with pytest.raises(ValueError, match="'bfloat16'"):
        OnnxAtariForward(spec, weights)


def test_the_engine_a_policy_got_is_recorded_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    """No silent fallback: the evaluator (what a worker runs tasks through) says which engine
    each kind of policy runs on, once, and why where it is not the preferred one; the stats
    file carries the same (WorkerClient.stats, "inference_engines")."""
    evaluator = Evaluator(inference_engine="onnxruntime")
    handle = make_env("Frostbite-v4")
    try:
        with caplog.at_level("INFO", logger="worker.evaluation.policies"):
            for dtype in ("bfloat16", "int8", "bfloat16"):
                spec = EvaluationSpec("Frostbite-v4", (1,), 0.002, NoiseTableSpec(size=2**22),
                                      "deepga", inference_dtype=dtype)  # fmt: skip
                assert evaluator.build_policy(spec, handle).inference_engine == (
                    "torch" if dtype == "bfloat16" else "onnxruntime"
                )
    finally:
        handle.env.close()
    assert evaluator.engines_used == {"deepga/bfloat16": "torch", "deepga/int8": "onnxruntime"}
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        "deepga bfloat16 policies run on torch (onnxruntime does not serve them)",
        "deepga int8 policies run on onnxruntime",
    ]


def test_the_default_engine_is_onnxruntime_unless_the_environment_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NEURO_INFERENCE_ENGINE", raising=False)
    assert registry.preferred_engine() == "onnxruntime"
    assert build_policy("deepga", ATARI_OBS, ACTIONS).inference_engine == "onnxruntime"
    monkeypatch.setenv("NEURO_INFERENCE_ENGINE", "torch")
    assert Evaluator().inference_engine == "torch"
    monkeypatch.delenv("NEURO_INFERENCE_ENGINE")
    monkeypatch.setattr(onnx_runtime_engine, "installed", lambda: False)
    assert registry.preferred_engine() == "torch"
    assert build_policy("deepga", ATARI_OBS, ACTIONS).inference_engine == "torch"


def test_a_bad_engine_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="'tpu'"):
        build_policy("deepga", ATARI_OBS, ACTIONS, inference_engine="tpu")
    with pytest.raises(ValueError, match="'tpu'"):
        Evaluator(inference_engine="tpu")
    monkeypatch.setattr(onnx_runtime_engine, "installed", lambda: False)
    with pytest.raises(ValueError, match="pip install"):
        registry.check_preference("onnxruntime")
    done = subprocess.run(
        [sys.executable, "-m", "worker", "--master", "127.0.0.1:1", "--inference-engine", "tpu"],
        cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--inference-engine" in done.stderr and "'tpu'" in done.stderr


def test_a_worker_plays_an_atari_task_on_its_engine() -> None:
    """Through the Evaluator, as a worker runs a task: the policy it keeps is onnxruntime's
    and the task's returns are those of the torch engine on the same spec."""
    spec = EvaluationSpec("Frostbite-v4", (123, 456), 0.002, NoiseTableSpec(size=2**22),
                          "deepga", inference_dtype="int8", env_seed=5,
                          max_episode_steps=200)  # fmt: skip
    returns = {}
    for engine in ("onnxruntime", "torch"):
        evaluator = Evaluator(inference_engine=engine)
        returns[engine] = play_spec(evaluator, spec).returns
        assert evaluator.engines_used == {"deepga/int8": engine}
    assert returns["onnxruntime"] == returns["torch"]
