"""Run settings: presets by kind of env, explicit overrides, clear errors."""

import dataclasses
import json
import math
import re

import pytest

from master.algorithms import registry
from master.algorithms.novelty import NoveltyConfig
from master.cli import _resolve_config, build_parser, main
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


# config.json as masters have written it since novelty search (json.dumps, indent 2): its keys,
# their order and its values stay, so a new master writes what an old one reads and back.
NSR_ES_CONFIG_JSON = """\
{
  "env_id": "CartPole-v1",
  "atari": false,
  "ga": {
    "population_size": 100,
    "truncation": 10,
    "mutation_power": 0.05,
    "elite_candidates": 3,
    "elite_episodes": 30,
    "seed": 0
  },
  "architecture": "mlp",
  "hidden_sizes": [
    64,
    64
  ],
  "atari_dynamics": "paper",
  "inference_dtype": "float32",
  "noise_table_seed": 123,
  "noise_table_size": 16777216,
  "max_episode_steps": 0,
  "generations": null,
  "frames": null,
  "target_score": 475.0,
  "lease_seconds": 60.0,
  "max_task_attempts": 5,
  "episodes_per_task": 1,
  "run_id": "fixed",
  "es": {
    "pairs": 25,
    "sigma": 0.1,
    "learning_rate": 0.03,
    "weight_decay": 0.005,
    "eval_episodes": 30,
    "beta1": 0.9,
    "beta2": 0.999,
    "seed": 0,
    "observation_norm": false
  },
  "novelty": {
    "k": 10,
    "archive_probability": 0.01,
    "archive_capacity": 10000,
    "meta_population": 5
  },
  "algorithm": "nsr-es"
}
"""


def test_config_json_reads_back_and_is_written_byte_for_byte_as_before():
    config = RunConfig.from_dict(json.loads(NSR_ES_CONFIG_JSON))
    kind = inspect_env_id("CartPole-v1")
    assert config == preset(kind, algorithm="nsr-es", run_id="fixed")
    assert json.dumps(config.to_dict(), indent=2) + "\n" == NSR_ES_CONFIG_JSON
    # Derived, never recorded: an old config.json has no such key, and a new one neither.
    assert "episode_step_limit" not in config.to_dict()


@pytest.mark.parametrize(
    ("env_id", "max_episode_steps", "limit"),
    [
        ("CartPole-v1", 0, 500),  # the registered TimeLimit
        ("CartPole-v1", 100, 100),  # the run's own cap, below it
        ("CartPole-v1", 1000, 500),  # the env still ends at its own
        ("Pendulum-v1", 0, 200),
        ("neuro/Memorize-K10-v0", 0, 10),
        ("Frostbite-v4", 5000, 5000),  # no TimeLimit: the Atari preset's cap
        ("Frostbite-v4", 0, 0),  # neither: no limit known
    ],
)
def test_the_episode_step_limit_is_derived_where_the_config_is_made(
    env_id, max_episode_steps, limit
):
    config = preset(inspect_env_id(env_id), max_episode_steps=max_episode_steps)
    assert config.episode_step_limit == limit
    assert RunConfig.from_dict(config.to_dict()).episode_step_limit == limit


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
    with pytest.raises(ValueError, match=r"meta_population must be in \[1, 100\], got 0"):
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


# Each refused at parse time (exit 2), naming the flag and the value, before any run dir exists.
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--lease-seconds", "0"], "--lease-seconds: lease_seconds must be a positive, finite"),
        (["--lease-seconds", "-1"], "lease_seconds must be a positive, finite .* got -1.0"),
        (["--lease-seconds", "nan"], "lease_seconds must be a positive, finite .* got nan"),
        (["--lease-seconds", "inf"], "lease_seconds must be a positive, finite .* got inf"),
        (["--max-task-attempts", "0"], "--max-task-attempts: max_task_attempts must be an "
                                       "integer >= 1, got 0"),
        (["--target-score", "nan"], "--target-score: target_score must be a finite number "
                                    r"\(--no-target sets no target\), got nan"),
        (["--target-score", "inf"], "target_score must be a finite number .* got inf"),
        (["--target-score=-inf"], "target_score must be a finite number .* got -inf"),
        (["--noise-table-seed", "-1"], r"--noise-table-seed: noise_table_seed must be in "
                                       r"\[0, 4294967295\], got -1"),
        (["--noise-table-seed", str(2**32)], "noise_table_seed must be in .* got 4294967296"),
        (["--noise-table-size", "0"], r"--noise-table-size: noise_table_size must be in "
                                      r"\[1, 268435456\], got 0"),
        (["--noise-table-size", str(2**28 + 1)], "noise_table_size must be in .* got 268435457"),
        (["--noise-table-size", "100"], r"noise_table_size 100 is smaller than the network: "
                                        r"mlp \[64, 64\] has at least 4353 parameters"),
        # Where a worker would refuse every task (neuro.task_limits), not the wire's uint32.
        (["--max-episode-steps", "10000001"], r"--max-episode-steps: max_episode_steps must be "
                                              r"in \[0, 10000000\], got 10000001"),
        (["--episodes-per-task", "10001"], r"--episodes-per-task: episodes_per_task must be in "
                                           r"\[1, 10000\], got 10001"),
        (["--algo", "ns-es", "--meta-population", "101"], r"meta_population must be in "
                                                          r"\[1, 100\], got 101"),
        (["--algo", "ga-ns", "--archive-capacity", "1000001"], r"archive_capacity must be in "
                                                               r"\[1, 1000000\], got 1000001"),
        (["--algo", "ga-ns", "--novelty-k", "1000001"], r"k must be in \[1, 1000000\]"),
        (["--checkpoint-seconds", "0"], "--checkpoint-seconds: must be a finite number of "
                                        "seconds > 0, got '0'"),
        (["--checkpoint-seconds", "-1"], "must be a finite number of seconds > 0, got '-1'"),
        (["--checkpoint-seconds", "nan"], "must be a finite number of seconds > 0, got 'nan'"),
        (["--port", "70000"], "--port: must be a port in 0-65535 .* got '70000'"),
        (["--algo", "es", "--pairs", "100000000"], r"2 x pairs \(100000000\) \+ eval_episodes "
                                                   r"\(30\) = 200000030 evaluations is more "
                                                   r"than the master holds at once \(250000"),
        (["--population", "1000000"], r"population_size \(1000000\) .* more than the master"),
    ],
)  # fmt: skip
def test_out_of_bounds_master_flags_are_refused_at_parse_time(tmp_path, capsys, flags, message):
    run_dir = tmp_path / "run"
    parser = build_parser()
    with pytest.raises(SystemExit) as exit_info:
        args = parser.parse_args(["--env", "CartPole-v1", *flags])
        _resolve_config(parser, args, run_dir)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert not run_dir.exists()


def test_a_refused_flag_leaves_no_run_dir_behind(tmp_path, capsys):
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        main(["--env", "CartPole-v1", "--run-dir", str(run_dir), "--port", "0", "--quiet",
              "--max-task-attempts", "0"])  # fmt: skip
    assert exit_info.value.code == 2
    assert "max_task_attempts must be an integer >= 1, got 0" in capsys.readouterr().err
    assert not run_dir.exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"lease_seconds": 0.0}, "lease_seconds must be a positive, finite number of seconds"),
        ({"lease_seconds": math.inf}, "lease_seconds must be a positive, finite .* got inf"),
        ({"max_task_attempts": 0}, "max_task_attempts must be an integer >= 1, got 0"),
        ({"target_score": math.nan}, "target_score must be a finite number"),
        ({"noise_table_seed": -1}, r"noise_table_seed must be in \[0, 4294967295\], got -1"),
        ({"noise_table_size": 0}, r"noise_table_size must be in \[1, 268435456\], got 0"),
        ({"episodes_per_task": 10_001}, r"episodes_per_task must be in \[1, 10000\], got 10001"),
        ({"max_episode_steps": 10**7 + 1}, r"max_episode_steps must be in \[0, 10000000\]"),
        ({"hidden_sizes": (2**16, 2**16)}, "more than the limit of 134217728"),
    ],
)
def test_run_config_holds_its_settings_to_the_same_bounds(overrides, message):
    with pytest.raises(ValueError, match=message):
        preset(inspect_env_id("CartPole-v1"), **overrides)
    config = preset(inspect_env_id("CartPole-v1"))
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(config, **overrides)


def test_run_options_refuse_a_checkpoint_interval_that_would_spin_or_never_fire():
    from master.run.start import RunOptions

    for seconds in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="checkpoint_seconds must be a finite number of "):
            RunOptions(checkpoint_seconds=seconds)
    assert RunOptions(checkpoint_seconds=0.5).checkpoint_seconds == 0.5


# What a master that did not check these values wrote into its checkpoint.
@pytest.mark.parametrize(
    ("algorithm", "section", "name", "value", "message"),
    [
        ("ga", None, "lease_seconds", 0.0, "lease_seconds must be a positive, finite"),
        ("ga", None, "max_task_attempts", 0, "max_task_attempts must be an integer >= 1"),
        ("ga", None, "noise_table_size", 0, r"noise_table_size must be in \[1, 268435456\]"),
        ("ga", None, "noise_table_seed", -1, r"noise_table_seed must be in \[0, 4294967295\]"),
        ("es", "es", "pairs", 100_000_000, r"2 x pairs \(100000000\)"),
    ],
)
def test_a_checkpoint_holding_an_out_of_bounds_setting_is_refused_on_resume(
    tmp_path, capsys, algorithm, section, name, value, message
):
    from master.run.checkpoint import save_checkpoint

    config = preset(inspect_env_id("CartPole-v1"), algorithm=algorithm).to_dict()
    (config[section] if section else config)[name] = value
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    payload = {"config": config, "algorithm": {"name": algorithm, "state": {"generation": 3}}}
    save_checkpoint(run_dir, payload)
    before = {path.name: path.read_bytes() for path in run_dir.iterdir()}
    parser = build_parser()
    args = parser.parse_args(["--env", "CartPole-v1"])
    with pytest.raises(SystemExit) as exit_info:
        _resolve_config(parser, args, run_dir)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"{run_dir} holds a checkpoint whose settings cannot run (" in err
    assert re.search(message, err) and "it cannot be resumed" in err, err
    assert "Traceback" not in err
    assert {path.name: path.read_bytes() for path in run_dir.iterdir()} == before
