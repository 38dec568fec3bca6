"""neuro-export: the written files act as neuro-eval does on the same observations of real
episodes (Atari and vector envs, seed genomes and ES genomes with observation normalisation),
and say what they expect beside them."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from master.algorithms.base import Parameters
from master.config import inspect_env_id, preset
from master.run.algorithm_setup import create_algorithm
from master.run.rundir import RunDirectory
from neuro.genome import Genome
from neuro.observation_stats import ObservationStats
from tests.support.processes import REPO, worker_env
from tests.support.tiny import tiny_cartpole
from tests.support.user_problem import CONV_FACTORY, MLP_FACTORY, MY_ENV, SIDES, USER_PACKAGES
from worker import evaluate_policy
from worker.offline.export import export_genome, preprocessing_path
from worker.offline.export_check import check_export
from worker.offline.loading import load_genome

TRAINED_GENOME = REPO / "bench" / "results" / "frostbite-best-genome.json"
"""The learning check's best Frostbite genome (deepga, float32)."""


def seed_genome(directory: Path, config, seeds: tuple[int, ...] = (5, 7, 9)) -> Path:
    """A genome file as the master writes it for `config`'s run."""
    path = directory / "genome.json"
    path.write_text(json.dumps(config.genome_document(Genome(seeds))))
    return path


def es_genome(directory: Path, env_id: str) -> Path:
    """An ES run's best_genome.json with its observation normaliser, as the master writes it:
    the parameters and the normaliser of observations the algorithm was told of."""
    config = preset(inspect_env_id(env_id), algorithm="es", observation_norm=True, pairs=3,
                    eval_episodes=2, hidden_sizes=(16,), noise_table_size=2**16)  # fmt: skip
    es = create_algorithm(config)
    rng = np.random.default_rng(3)
    size = int(np.prod(config_observation_shape(env_id)))
    seen = ObservationStats.of(rng.normal(0.5, 3.0, (200, size)))
    es.tell({r.key: [1.0] * r.episodes for r in es.ask()}, observation_stats=seen)
    parameters = es.parameters()
    mean, std = parameters.observation_norm
    assert np.abs(mean).max() > 0.1 and np.abs(std - 1).max() > 0.1  # a normaliser that matters
    document = config.parameters_document(Parameters(parameters.version, parameters.theta,
                                                     observation_norm=(mean, std)))  # fmt: skip
    run_dir = RunDirectory(directory / "es-run")
    run_dir.save_elite(document, 1.0)
    return run_dir.best_genome_path


def config_observation_shape(env_id: str) -> tuple[int, ...]:
    import gymnasium as gym

    env = gym.make(env_id)
    try:
        return env.observation_space.shape
    finally:
        env.close()


@pytest.mark.parametrize("model_format", ["onnx", "safetensors"])
def test_cartpole_export_acts_as_neuro_eval(
    tmp_path: Path, noise_cache: Path, model_format: str
) -> None:
    genome = seed_genome(tmp_path, tiny_cartpole(noise_table_size=2**16))
    exported = export_genome(genome, model_format)
    assert exported.model == genome.with_suffix(f".{model_format}")
    assert exported.preprocessing == preprocessing_path(exported.model)
    agreement = check_export(exported.model, genome, steps=3000, seed=4)
    assert agreement.steps >= 3000 and agreement.differing == 0
    # The check played what neuro-eval plays: the same episodes, the same returns.
    assert agreement.returns[:3] == evaluate_policy(genome, episodes=3, env_seed=4)
    assert len(set(agreement.returns)) > 1
    document = json.loads(exported.preprocessing.read_text())
    assert document == exported.document
    assert document["format"] == "neuro.export/1"
    model = document["model"]
    assert model["sha256"] == hashlib.sha256(exported.model.read_bytes()).hexdigest()
    assert document["observation"] == {"shape": [4], "dtype": "float32", "preprocessing": None}
    assert document["observation_normaliser"] is None
    assert document["action"] == {"rule": "argmax", "n": 2, "start": 0,
                                  "ties": "the lowest index",
                                  "in_model": model_format == "onnx"}  # fmt: skip
    layout = [name for name, _ in load_genome(genome).policy.parameter_layout]
    assert [name for name, _ in document["network"]["parameters"]] == layout


def test_safetensors_holds_the_decoded_parameters_by_name(tmp_path: Path, noise_cache) -> None:
    genome = seed_genome(tmp_path, tiny_cartpole(noise_table_size=2**16))
    exported = export_genome(genome, "safetensors", tmp_path / "out" / "policy.safetensors")
    tensors = load_file(exported.model)
    weights = load_genome(genome).policy.weights
    assert sorted(tensors) == sorted(weights)
    for name in weights:
        assert tensors[name].dtype == np.float32 and np.array_equal(tensors[name], weights[name])
    assert exported.document["model"]["tensors"] == list(weights)
    assert exported.preprocessing == tmp_path / "out" / "policy.safetensors.json"


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("model_format", ["onnx", "safetensors"])
def test_es_genome_exports_with_its_observation_normaliser(
    tmp_path: Path, noise_cache: Path, env_id: str, model_format: str
) -> None:
    """The normaliser is in the ONNX graph (and in the JSON for both); Pendulum's box action
    is the tanh head inside the ONNX graph too."""
    genome = es_genome(tmp_path, env_id)
    exported = export_genome(genome, model_format)
    agreement = check_export(exported.model, genome, steps=2000, seed=1)
    assert agreement.steps >= 2000 and agreement.differing == 0
    assert agreement.returns[:2] == evaluate_policy(genome, episodes=2, env_seed=1)
    normaliser = exported.document["observation_normaliser"]
    stored = np.load(genome.parent / "best_params.npy")
    size = len(normaliser["mean"])
    assert np.array_equal(np.float32(normaliser["mean"]), stored[-2 * size : -size])
    assert np.array_equal(np.float32(normaliser["std"]), stored[-size:])
    assert normaliser["clip"] == 5.0 and normaliser["in_model"] == (model_format == "onnx")
    action = exported.document["action"]
    if env_id == "Pendulum-v1":
        assert action["rule"] == "tanh" and action["low"] == [-2.0] and action["high"] == [2.0]
    else:
        assert action["rule"] == "argmax"


def test_nature_net_export_acts_as_neuro_eval(tmp_path: Path, noise_cache: Path) -> None:
    config = preset(inspect_env_id("Frostbite-v4"), architecture="nature",
                    noise_table_size=2**22, inference_dtype="float32",
                    max_episode_steps=150)  # fmt: skip
    genome = seed_genome(tmp_path, config, seeds=(11, 12))
    exported = export_genome(genome, "onnx")
    agreement = check_export(exported.model, genome, steps=300, seed=2)
    assert agreement.steps >= 300 and agreement.differing == 0
    preprocessing = exported.document["observation"]["preprocessing"]
    steps = [step["step"] for step in preprocessing["steps"]]
    assert steps == ["emulator", "noop_reset", "frame_skip", "grayscale", "resize",
                     "fire_on_reset", "frame_stack"]  # fmt: skip
    assert preprocessing["built_by"] == "neuro.envs.make.make_env('Frostbite-v4', 'paper')"
    assert exported.document["observation"]["shape"] == [4, 84, 84]
    assert exported.document["observation"]["dtype"] == "uint8"


@pytest.mark.slow
def test_trained_atari_genome_onnx_acts_as_neuro_eval_for_thousands_of_steps(
    tmp_path: Path,
) -> None:
    """The onnxruntime engine's own graph: the same action at every step of 3,000."""
    genome = tmp_path / "frostbite.json"
    genome.write_text(TRAINED_GENOME.read_text())
    exported = export_genome(genome, "onnx")
    agreement = check_export(exported.model, genome, steps=3000, seed=0)
    assert agreement.steps >= 3000 and agreement.differing == 0
    assert max(agreement.returns) > 0  # it plays the game, and scores


@pytest.mark.slow
def test_trained_atari_genome_safetensors_in_the_torch_module(tmp_path: Path) -> None:
    """The safetensors file in load_policy's torch module: its pass divides by 255 where the
    onnxruntime engine scales conv1's weights, so a near-tie may fall the other way, as
    between two engines (tests/worker/inference/test_onnxruntime_engine.py)."""
    import torch

    genome = tmp_path / "frostbite.json"
    genome.write_text(TRAINED_GENOME.read_text())
    exported = export_genome(genome, "safetensors")
    threads = torch.get_num_threads()
    # One thread, as a worker runs: batch-1 passes gain nothing from more, and on a loaded
    # host torch's spinning threads made this test ten times as long.
    torch.set_num_threads(1)
    try:
        agreement = check_export(exported.model, genome, steps=1000, seed=0)
    finally:
        torch.set_num_threads(threads)
    assert agreement.steps >= 1000 and agreement.agreeing >= 0.99, agreement


@pytest.mark.slow
def test_int8_static_genome_exports_its_float32_weights(tmp_path: Path) -> None:
    """The file is the float32 policy's, byte for byte; against the int8-static replay the
    greedy action differs on some steps (6.3% of 3,015 when measured: docs/api.md)."""
    document = json.loads(TRAINED_GENOME.read_text())
    float32 = tmp_path / "float32.json"
    float32.write_text(json.dumps(document))
    int8_static = tmp_path / "int8-static.json"
    int8_static.write_text(json.dumps({**document, "inference_dtype": "int8-static"}))
    plain, quantised = export_genome(float32, "onnx"), export_genome(int8_static, "onnx")
    assert quantised.model.read_bytes() == plain.model.read_bytes()
    genome = quantised.document["genome"]
    assert (genome["trained_dtype"], genome["exported_dtype"]) == ("int8-static", "float32")
    assert "may differ" in genome["note"] and "note" not in plain.document["genome"]
    agreement = check_export(quantised.model, int8_static, steps=1500, seed=0)
    assert agreement.replay_dtype == "int8-static"
    assert 0.85 <= agreement.agreeing < 1.0, agreement


def neuro_export(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", "import sys; from worker.cli.export import main; "
               "sys.exit(main())", *args]  # fmt: skip
    return subprocess.run(command, env=worker_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_command_writes_both_files_and_checks_them(tmp_path: Path, noise_cache: Path) -> None:
    run_dir = RunDirectory(tmp_path / "run")
    run_dir.save_elite(tiny_cartpole(noise_table_size=2**16).genome_document(Genome((3, 4))),
                       200.0)  # fmt: skip
    done = neuro_export(str(run_dir.path), "--format", "onnx", "--check", "600", "--seed", "2")
    assert done.returncode == 0, done.stderr
    model = run_dir.path / "best_genome.onnx"
    assert f"wrote {model}: CartPole-v1 mlp policy, float32, as onnx" in done.stdout
    assert f"wrote {model}.json: its observation preprocessing and action rule" in done.stdout
    assert "check: " in done.stdout and "(100.00%) chose neuro-eval's action" in done.stdout
    assert json.loads(Path(f"{model}.json").read_text())["model"]["file"] == "best_genome.onnx"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.json", "--format", "onnx"], "cannot read genome file 'missing.json'"),
        (["{run_dir}", "--format", "onnx"], "has no best_genome.json"),
        (["{run_dir}"], "the following arguments are required: --format"),
        (["{run_dir}", "--format", "tflite"], "invalid choice: 'tflite'"),
        (["{run_dir}", "--format", "onnx", "--check", "-1"], "--check must be >= 0 steps, got -1"),
    ],
)
def test_command_refuses_bad_input_naming_it(
    tmp_path: Path, args: list[str], message: str, capsys
) -> None:
    from worker.cli.export import main

    argv = [arg.format(run_dir=tmp_path) for arg in args]
    try:
        code = main(argv)
    except SystemExit as exit_info:
        code = exit_info.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("env_id", "factory", "options"),
    [(MY_ENV, MLP_FACTORY, {"hidden": 8}), (SIDES, CONV_FACTORY, {})],
    ids=["vector", "image"],
)
@pytest.mark.parametrize("model_format", ["onnx", "safetensors"])
def test_a_users_env_and_network_export_and_act_as_neuro_eval(
    tmp_path: Path,
    noise_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    env_id: str,
    factory: str,
    options: dict,
    model_format: str,
) -> None:
    """A module:Env-id and a --policy factory's module (traced by torch's exporter for ONNX),
    on a vector env and on an image env that is not Atari (its pixels unscaled, as the env
    gives them)."""
    monkeypatch.syspath_prepend(str(USER_PACKAGES))
    config = preset(inspect_env_id(env_id), architecture=factory, noise_table_size=2**16,
                    policy_options=json.dumps(options))  # fmt: skip
    genome = seed_genome(tmp_path, config, seeds=(21, 22))
    exported = export_genome(genome, model_format)
    agreement = check_export(exported.model, genome, steps=1500, seed=3)
    assert agreement.steps >= 1500 and agreement.differing == 0
    assert agreement.returns[:2] == evaluate_policy(genome, episodes=2, env_seed=3)
    document = exported.document
    assert document["genome"]["policy"] == {"factory": factory, "options": options}
    assert document["genome"]["architecture"] == "module"
    assert document["network"]["module"].startswith(f"{factory}(observation_space")
    layout = [name for name, _ in load_genome(genome).policy.parameter_layout]
    assert [name for name, _ in document["network"]["parameters"]] == layout
    assert document["observation"]["preprocessing"] is None
    if env_id == SIDES:
        assert document["observation"]["dtype"] == "uint8"
