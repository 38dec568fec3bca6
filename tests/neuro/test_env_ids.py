"""Env ids beyond gymnasium's own: `module:Env-id` (the module imported first, as gymnasium
does), ids registered by installed packages' entry points, neuro's own ids registered by
importing neuro.envs, and an image env that is not Atari played by the built-in mlp."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from neuro.envs.ids import env_module, registered_id
from neuro.envs.make import inspect_env_id, is_atari, make_env
from neuro.noise import NoiseTableSpec
from neuro.policy_spec import ModuleUnavailable
from tests.support.processes import REPO, worker_env
from tests.support.user_problem import MY_ENV, SIDES, USER_PACKAGES
from worker.evaluation.evaluator import Evaluator
from worker.evaluation.spec import EvaluationSpec
from worker.runners.per_genome import play_spec


@pytest.fixture
def user_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(USER_PACKAGES))


def test_a_module_env_id_imports_its_module_first(user_packages: None) -> None:
    assert (env_module(MY_ENV), registered_id(MY_ENV)) == ("userpkg", "MyEnv-v0")
    assert (env_module("CartPole-v1"), registered_id("CartPole-v1")) == (None, "CartPole-v1")
    kind = inspect_env_id(MY_ENV)
    assert (kind.env_id, kind.atari, kind.reward_threshold) == (MY_ENV, False, 195.0)
    assert not is_atari(MY_ENV)
    handle = make_env(MY_ENV)
    assert type(handle.env.unwrapped).__name__ == "MyEnv"
    assert handle.env.spec.max_episode_steps == 200  # the package's registration holds


def test_a_module_that_cannot_be_imported_is_named() -> None:
    with pytest.raises(ModuleUnavailable) as caught:
        inspect_env_id("not_installed_pkg.envs:Thing-v0")
    assert caught.value.module == "not_installed_pkg.envs"
    assert (
        "cannot import module 'not_installed_pkg.envs' (env not_installed_pkg.envs:Thing-v0)"
        in (str(caught.value))
    )
    with pytest.raises(ModuleUnavailable, match="'not_installed_pkg'"):
        make_env("not_installed_pkg:Thing-v0")


def test_an_unknown_id_in_a_module_and_a_bad_module_path_are_named(user_packages: None) -> None:
    with pytest.raises(ValueError, match="unknown env id 'userpkg:Nope-v0'"):
        inspect_env_id("userpkg:Nope-v0")
    with pytest.raises(ValueError, match="'my-pkg' before ':' is not a module path"):
        inspect_env_id("my-pkg:Thing-v0")


def _fresh(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                          env={**worker_env(), **env}, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_importing_neuro_envs_registers_its_ids() -> None:
    done = _fresh("""
        import gymnasium as gym
        assert "neuro/Memorize-v0" not in gym.registry
        import neuro.envs
        print(gym.spec("neuro/Memorize-v0").id, gym.spec("neuro/DeceptiveMaze-v0").id)
        env = gym.make("neuro.envs:neuro/MemorizeUntilMistake-v0")
        print(env.observation_space.shape)
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["neuro/Memorize-v0", "neuro/DeceptiveMaze-v0", "(16,)"]


def _plugin(root: Path, name: str, entry_points: str, module: str) -> None:
    """An installed distribution as importlib.metadata finds one: a dist-info folder on the
    path, with its entry points, and the module they name."""
    info = root / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)
    (root / f"{name}_envs.py").write_text(textwrap.dedent(module))


def test_an_installed_packages_entry_point_registers_its_ids(tmp_path: Path) -> None:
    _plugin(tmp_path, "plugged", "[gymnasium.envs]\nplugged = plugged_envs:register\n", """
        import gymnasium as gym

        def register():
            gym.register("Plugged-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv",
                         max_episode_steps=50)
    """)  # fmt: skip
    _plugin(tmp_path, "broken", "[gymnasium.envs]\n__root__ = broken_envs:register\n", """
        def register():
            raise RuntimeError("this plugin is broken")
    """)  # fmt: skip
    done = _fresh(
        """
        from neuro.envs.make import inspect_env_id, make_env
        kind = inspect_env_id("plugged/Plugged-v0")
        handle = make_env("plugged/Plugged-v0")
        print(kind.env_id, kind.atari, handle.env.spec.max_episode_steps)
        """,
        PYTHONPATH=f"{tmp_path}:{REPO}",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["plugged/Plugged-v0", "False", "50"]
    # The broken package is named in the log; the other's ids work regardless.
    assert "broken_envs:register failed: RuntimeError: this plugin is broken" in done.stderr


def test_an_image_env_that_is_not_atari_plays_on_the_built_in_mlp(user_packages: None) -> None:
    handle = make_env(SIDES)
    observation, _ = handle.env.reset(seed=0)
    assert observation.shape == (1, 8, 8) and observation.dtype == np.uint8
    assert not handle.atari and not inspect_env_id(SIDES).atari
    spec = EvaluationSpec(env_id=SIDES, seeds=(7, 8), mutation_power=0.02,
                          noise_table=NoiseTableSpec(size=2**16), architecture="mlp",
                          hidden_sizes=(8,), episodes=3, env_seed=1)  # fmt: skip
    evaluation = play_spec(Evaluator(), spec)
    assert len(evaluation.returns) == 3
    assert all(0 <= r <= 16 for r in evaluation.returns)
    assert evaluation.frames == [16, 16, 16]
