"""The master's side of a user's network: it builds the module once to learn its parameters
(ES's theta, the noise table's check), with the user's own torch, and a run of a built-in
network loads no torch at all."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from master.config import inspect_env_id, preset
from master.run.algorithm_setup import create_algorithm, user_network_layout
from neuro.decode import decode_genome
from neuro.noise import NoiseTableSpec, load_noise_table
from neuro.policy_spec import module_init_scale
from tests.support.processes import REPO
from tests.support.user_problem import (
    CONV_FACTORY,
    MLP_FACTORY,
    MY_ENV,
    SIDES,
    env_with_user_packages,
)


@pytest.fixture(autouse=True)
def user_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.user_problem import USER_PACKAGES

    monkeypatch.syspath_prepend(str(USER_PACKAGES))


def test_the_layout_is_the_modules_own_on_the_envs_spaces() -> None:
    config = preset(
        inspect_env_id(SIDES), architecture=CONV_FACTORY, policy_options='{"channels": 2}'
    )
    assert user_network_layout(config) == [("1.weight", (2, 1, 3, 3)), ("1.bias", (2,)),
                                           ("4.weight", (2, 128)), ("4.bias", (2,))]  # fmt: skip


@pytest.mark.parametrize("algorithm", ["es", "ns-es", "nsr-es"])
def test_the_es_family_starts_from_the_first_seeds_decode_of_the_module(
    algorithm: str, tmp_path_factory
) -> None:
    config = preset(inspect_env_id(MY_ENV), algorithm=algorithm, architecture=MLP_FACTORY,
                    policy_options='{"hidden": 8}', noise_table_size=2**16)  # fmt: skip
    created = create_algorithm(config)
    parameters = created.parameters()
    assert parameters is not None and parameters.theta.shape == (58,)
    if algorithm == "es":
        # theta_0 is one seed's noise times the module's init scale, as a GA genome's first.
        layout = user_network_layout(config)
        table = load_noise_table(NoiseTableSpec(config.noise_table_seed, 2**16))
        seed = int(np.random.default_rng(config.es.seed).integers(2**32))
        expected = decode_genome(table, module_init_scale(layout), config.es.sigma, [seed])
        assert np.array_equal(parameters.theta, expected)
        assert np.all(parameters.theta[8 * 4 : 8 * 4 + 8] == 0)  # biases start at zero


def _loaded(code: str) -> set[str]:
    script = f"{textwrap.dedent(code)}\nimport sys\nprint(' '.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env_with_user_packages(),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return set(done.stdout.split())


def test_the_master_loads_torch_only_for_a_users_network() -> None:
    run = """
        from master.config import inspect_env_id, preset
        from master.fleet.tasks import task_template
        from master.run.algorithm_setup import create_algorithm
        config = preset(inspect_env_id({env!r}), algorithm="es", noise_table_size=2**16{extra})
        create_algorithm(config)
        task_template(config)
    """
    built_in = _loaded(run.format(env="CartPole-v1", extra=""))
    assert "torch" not in built_in and "master.run.algorithm_setup" in built_in
    # The check sees torch where it is: a user's network is built with it.
    user = _loaded(run.format(env=MY_ENV, extra=f", architecture={MLP_FACTORY!r}"))
    assert "torch" in user and "userpkg.nets" in user
