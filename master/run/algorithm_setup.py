"""The run's algorithm, and the I/O it is made from: the noise table and the env's spaces.

master.algorithms does no I/O (an import-linter contract keeps env builders out of it): the
master builds the env here, once, only to learn its spaces (no torch on this side), and loads
the noise table here, and hands both to the registry entry as plain values.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from master.algorithms import registry
from master.algorithms.base import Algorithm
from master.algorithms.registry import EnvSpaces
from master.config import RunConfig
from master.run.checkpoint import algorithm_section, load_sidecar
from neuro.layout import Layout


def noise_table(config: RunConfig) -> np.ndarray:
    """The run's noise table, read-only (built into this host's cache on first use)."""
    from neuro.noise import NoiseTableSpec, load_noise_table

    return load_noise_table(NoiseTableSpec(config.noise_table_seed, config.noise_table_size))


def env_spaces(config: RunConfig) -> EnvSpaces:
    """The run's observation shape and action count, from an env built for the purpose (and a
    user's network's layout: user_network_layout)."""
    from neuro.envs.make import make_env

    env = make_env(config.env_id, config.atari_dynamics).env
    try:
        space = env.action_space
        outputs = int(space.n) if hasattr(space, "n") else int(np.prod(space.shape))
        layout = _module_layout(config, env) if config.policy is not None else None
        return EnvSpaces(tuple(env.observation_space.shape), outputs, layout)
    finally:
        env.close()


def user_network_layout(config: RunConfig) -> Layout:
    """The parameters (names and shapes, the genome's layout) of the run's user network, whose
    factory the master calls once, on the env's spaces. ValueError naming the factory where it
    cannot be imported here (a user's network needs torch on the master too), fails, or does
    not fit the noise table."""
    from neuro.envs.make import make_env

    env = make_env(config.env_id, config.atari_dynamics).env
    try:
        return _module_layout(config, env)
    finally:
        env.close()


def _module_layout(config: RunConfig, env: Any) -> Layout:
    # The factory imports torch itself: this module (and the master) never names it, and a
    # run of a built-in network never gets here (tests/master/run/test_user_network_setup.py).
    from neuro.layout import check_parameter_count, parameter_count
    from neuro.policy_spec import ModuleUnavailable, make_module, module_layout

    policy = config.policy
    assert policy is not None, "only a user's network has a factory to build"
    try:
        module = make_module(policy, env.observation_space, env.action_space)
    except ModuleUnavailable as error:
        raise ValueError(
            f"{error}; the master builds a user's network once to learn its parameters, so "
            "the package and torch must be importable here too (pip install 'neuro[worker]')"
        ) from None
    layout = module_layout(module, f"policy {policy.factory}")
    try:
        check_parameter_count(parameter_count(layout), config.noise_table_size)
    except ValueError as error:
        raise ValueError(f"policy {policy.factory}: {error} (--noise-table-size)") from None
    return layout


def behaviour_size_of(config: RunConfig) -> int:
    """The size of the run's behaviour characterisations (the master builds the env once)."""
    from neuro.envs.behaviour import behaviour_size
    from neuro.envs.make import make_env

    handle = make_env(config.env_id, config.atari_dynamics)
    try:
        return behaviour_size(handle.env, handle.atari)
    finally:
        handle.env.close()


def create_algorithm(config: RunConfig) -> Algorithm:
    """A new instance of the run's algorithm (registry entry config.algorithm), generation 0."""
    entry = registry.get(config.algorithm)
    table = noise_table(config) if entry.needs_noise_table else None
    spaces = env_spaces(config) if entry.needs_env_spaces else None
    return entry.create(config, table, spaces)


def restore_algorithm(
    config: RunConfig, document: Mapping[str, Any], arrays: np.ndarray | None
) -> Algorithm:
    """The run's algorithm as a checkpoint's state document (and sidecar arrays) describe it."""
    entry = registry.get(config.algorithm)
    table = noise_table(config) if entry.needs_noise_table else None
    return entry.restore(config, table, document, arrays)


def build_algorithm(config: RunConfig, run_dir: Path, resume: dict[str, Any] | None) -> Algorithm:
    """The run's algorithm: new, or as the checkpoint `resume` (a payload) left it."""
    if resume is None:
        return create_algorithm(config)
    name, state = algorithm_section(resume)
    if name != config.algorithm:
        raise ValueError(f"the checkpoint holds a {name} run, its config a {config.algorithm} run")
    # A sidecar holds the state too big for JSON (the ES's theta and Adam moments).
    arrays = load_sidecar(run_dir, resume["sidecar"]) if "sidecar" in resume else None
    return restore_algorithm(config, state, arrays)
