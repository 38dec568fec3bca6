"""Run settings: presets by kind of env, explicit overrides, clear errors."""

import pytest

from master.config import inspect_env_id, preset


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
        ("CartPole-v1", {"generations": 0}, "generations must be >= 1, got 0"),
    ],
)
def test_bad_settings_name_the_value(env_id, overrides, message):
    with pytest.raises(ValueError, match=message):
        preset(inspect_env_id(env_id), **overrides)
