"""Run settings: presets by kind of env, explicit overrides, clear errors."""

import dataclasses
import json

import pytest

from master.algorithms import registry
from master.algorithms.novelty import NoveltyConfig
from master.cli import _resolve_config, build_parser
from master.config import RunConfig, inspect_env_id, preset


def test_atari_gets_the_papers_settings_and_network():
    config = preset(inspect_env_id("Frostbite-v4"))
    assert (config.ga.population_size, config.ga.truncation, config.ga.mutation_power) == (
        1000, 20, 0.002
    )  # fmt: skip
    assert config.architecture == "deepga" and config.max_episode_steps == 5000
    assert config.noise_table_size == 250_000_000 and config.atari_dynamics == "paper"
    assert config.target_score is None


def test_an_explicit_none_target_disables_the_envs_threshold():
    kind = inspect_env_id("CartPole-v1")
    assert preset(kind).target_score == 475.0
    assert preset(kind, target_score=None).target_score is None
    small = preset(kind, population_size=7).ga
    assert (small.population_size, small.truncation, small.elite_candidates) == (7, 7, 3)


@pytest.mark.parametrize(
    ("env_id", "overrides", "message"),
    [
        ("Frostbyte-v4", {}, "unknown env id 'Frostbyte-v4'"),
        ("CartPole-v1", {"architecture": "deepga"}, "does not fit a vector-observation env"),
        ("Frostbite-v4", {"architecture": "mlp"}, "does not fit an Atari env"),
        ("Frostbite-v4", {"atari_dynamics": "sticky"}, "'sticky' is not one of"),
        (
            "CartPole-v1",
            {"inference_dtype": "int8-static"},
            "runs on the deepga, nature nets, not .mlp.",
        ),
        ("CartPole-v1", {"generations": 0}, "generations must be >= 1, got 0"),
    ],
)
def test_bad_settings_name_the_value(env_id, overrides, message):
    with pytest.raises(ValueError, match=message):
        preset(inspect_env_id(env_id), **overrides)


@pytest.mark.parametrize(
    ("algorithm", "sections"),
    [("ga", ()), ("es", ("es",)), ("ga-ns", ("novelty",)), ("ns-es", ("es", "novelty")),
     ("nsr-es", ("es", "novelty"))],
)  # fmt: skip
def test_each_algorithm_gets_its_sections_and_survives_config_json(algorithm, sections):
    config = preset(inspect_env_id("CartPole-v1"), algorithm=algorithm, seed=9)
    assert config.algorithm == algorithm and config.seed == 9
    assert {s for s in ("es", "novelty") if getattr(config, s) is not None} == set(sections)
    data = json.loads(json.dumps(config.to_dict()))
    assert RunConfig.from_dict(data) == config
    assert registry.get(algorithm).mutation_power(config) > 0


@pytest.mark.parametrize("algorithm", ["ga", "es"])
def test_a_config_json_written_before_the_algorithm_was_recorded_still_reads(algorithm):
    data = preset(inspect_env_id("CartPole-v1"), algorithm=algorithm).to_dict()
    del data["algorithm"], data["novelty"]
    assert RunConfig.from_dict(data).algorithm == algorithm


def test_novelty_settings_and_sections_that_do_not_fit_the_algorithm_are_refused():
    kind = inspect_env_id("CartPole-v1")
    assert preset(kind, algorithm="ga-ns", k=4, archive_capacity=50).novelty == NoveltyConfig(
        k=4, archive_capacity=50
    )
    with pytest.raises(ValueError, match=r"\['k'\] are novelty search settings \(--algo ga-ns, "):
        preset(kind, algorithm="es", k=4)
    with pytest.raises(ValueError, match=r"\['pairs'\] are ES settings \(--algo es, ns-es, nsr-es"):
        preset(kind, algorithm="ga-ns", pairs=4)
    config = preset(kind, algorithm="ga-ns")
    with pytest.raises(ValueError, match="algorithm 'ga' takes no novelty settings"):
        dataclasses.replace(config, algorithm="ga")
    with pytest.raises(ValueError, match="algorithm 'ns-es' needs es settings"):
        dataclasses.replace(config, algorithm="ns-es")
    with pytest.raises(ValueError, match="'nsga' is not one of"):
        preset(kind, algorithm="nsga")
    with pytest.raises(ValueError, match="meta_population must be >= 1, got 0"):
        preset(kind, algorithm="ns-es", meta_population=0)


def test_the_command_line_chooses_a_novelty_search_and_its_settings(tmp_path, capsys):
    parser = build_parser()
    args = parser.parse_args(["--env", "CartPole-v1", "--algo", "nsr-es", "--novelty-k", "4",
                              "--meta-population", "2", "--archive-capacity", "30",
                              "--pairs", "3"])  # fmt: skip
    config, resume = _resolve_config(parser, args, tmp_path / "new-run")
    assert resume is None and config.algorithm == "nsr-es" and config.es.pairs == 3
    assert config.novelty == NoveltyConfig(k=4, archive_capacity=30, meta_population=2)
    args = parser.parse_args(["--env", "CartPole-v1", "--algo", "ga-ns",
                              "--archive-probability", "0.25"])  # fmt: skip
    config, _ = _resolve_config(parser, args, tmp_path / "new-run")
    assert config.novelty.archive_probability == 0.25 and config.es is None
    args = parser.parse_args(["--env", "CartPole-v1", "--algo", "ga", "--novelty-k", "4"])
    with pytest.raises(SystemExit) as exit_info:
        _resolve_config(parser, args, tmp_path / "new-run")
    assert exit_info.value.code == 2 and "--algo ga-ns, ns-es, nsr-es" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["--env", "CartPole-v1", "--algo", "ga-ns", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "novelty search (--algo ga-ns, ns-es, nsr-es)" in shown
    for flag in ("--novelty-k", "--archive-probability", "--archive-capacity", "--meta-population"):
        assert flag in shown
    assert "reservoir sampling" in shown  # help comes from the field docstrings


@pytest.mark.parametrize(
    ("count", "dtype", "worker_arg", "device"),
    [
        (1, "float32", [], "auto"),  # one local worker may be a CUDA host's batched worker
        (1, "int8", [], "cpu"),  # which runs float32 only: every int8 task would fail there
        (15, "float32", [], "cpu"),  # several are one per core, not 15 batched CUDA workers
        (1, "bfloat16", ["--device", "auto"], "auto"),  # the user's own choice wins
    ],
)
@pytest.mark.parametrize("architecture", ["deepga", "mlp"])
def test_local_workers_stay_on_the_cpu_path_unless_one_float32_worker_can_batch(
    count, dtype, worker_arg, device, architecture
):
    from master.run.local_workers import local_worker_args
    from worker.cli import worker_parser

    args = local_worker_args(worker_arg, count, dtype, architecture)
    argv = ["--master", "127.0.0.1:1", *args]
    assert worker_parser().parse_args(argv).device == device
