"""What a genome means for a user's network, pinned: the same seeds decode to the same weights
on every worker, in the order the module defines its parameters (golden digests, as
tests/neuro/test_decode.py pins the built-in networks)."""

from __future__ import annotations

import hashlib

import gymnasium as gym
import numpy as np
import pytest

from neuro.decode import GenomeDecoder, decode_genome
from neuro.noise import NoiseTableSpec, load_noise_table
from neuro.policy_spec import module_init_scale, user_policy
from tests.support.goldens import SEEDS, SIGMA
from tests.support.user_problem import MLP_FACTORY, USER_PACKAGES
from worker.evaluation.decoders import Decoders
from worker.evaluation.spec import EvaluationSpec
from worker.inference.policy import build_policy

TABLE = NoiseTableSpec(seed=123, size=2**22)
POLICY = user_policy(MLP_FACTORY, {"hidden": 8})
"""userpkg's tanh MLP on CartPole's spaces: 1.weight (8, 4), 1.bias, 3.weight (2, 8), 3.bias."""

# Changing these breaks every saved genome of a user's network: the same seeds would decode
# to other weights.
GOLDEN_USER_MLP = "f48a5e56eb90910a52e544734453922bd6c573cb61a325c32ce2e8839abcfec2"
GOLDEN_USER_PARAMETERS = {
    "1.weight": "dc4052e36d4d55ab8cfddcebc740c20b6dc77a4c9bbd78403a236875b5e75e12",
    "1.bias": "75c69f5b22b9b958197a6969a0bb416b1c91a65f19b94db27937b64ac7f7183c",
    "3.weight": "043988d5e63d445c0ea1f87b508c4d6972a1fe5c51f7baf5362d0a11aad6b3d4",
    "3.bias": "2bdd050a1930885c1fcdbfe08f461452335f54292f0a240ecc09b01c2f2c473b",
}


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> np.ndarray:
    return load_noise_table(TABLE, tmp_path_factory.mktemp("noise"))


@pytest.fixture
def policy(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(USER_PACKAGES))
    env = gym.make("userpkg:MyEnv-v0")
    return build_policy("module", env.observation_space, env.action_space, policy=POLICY)


def _sha(values: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(values, np.float32).tobytes()).hexdigest()


def test_golden_user_module(table: np.ndarray, policy) -> None:
    assert policy.num_params == 58
    scale = policy.init_scale()
    assert scale.tobytes() == module_init_scale(policy.parameter_layout).tobytes()
    theta = decode_genome(table, scale, SIGMA, SEEDS)
    assert _sha(theta) == GOLDEN_USER_MLP
    # Loaded into the module, each parameter holds its slice, in the module's own order.
    policy.load_parameters(theta)
    parameters = {name: _sha(p.detach().numpy()) for name, p in
                  policy.forward.module.named_parameters()}  # fmt: skip
    assert parameters == GOLDEN_USER_PARAMETERS


def test_the_worker_decodes_a_user_genome_as_the_definition(tmp_path, table, policy) -> None:
    """The worker's decoder (its parent cache, its init scale) gives the golden vector too."""
    spec = EvaluationSpec(
        env_id="userpkg:MyEnv-v0", seeds=tuple(SEEDS), mutation_power=SIGMA, noise_table=TABLE,
        architecture="module", policy=POLICY,
    )  # fmt: skip
    decoder = Decoders(str(tmp_path)).decoder(spec, policy.spec)
    assert isinstance(decoder, GenomeDecoder)
    decoder.decode(SEEDS[:2])  # through a cached parent, then the child
    assert _sha(decoder.decode(SEEDS)) == GOLDEN_USER_MLP
