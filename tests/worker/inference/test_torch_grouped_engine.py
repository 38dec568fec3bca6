"""BatchedPolicies: many individuals in one forward pass, each row as its own Policy plays it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from neuro.inference import ARCHITECTURES
from neuro.observation_stats import normalise
from worker.inference.actions import actions_from_outputs
from worker.inference.base import NetSpec
from worker.inference.engines.torch_grouped.grouped import BatchedPolicies
from worker.inference.policy import Policy, build_policy

ATARI_OBS = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
VECTOR_OBS = gym.spaces.Box(-3.0, 3.0, (6,), np.float32)
BOX_ACTIONS = gym.spaces.Box(
    np.array([-1.0, -2.0, 0.0], np.float32), np.array([1.0, 0.5, 3.0], np.float32)
)
K = 5
RTOL, ATOL = 1e-4, 1e-5
# Rows' slots: repeats out of order (a gap at slot 2 inside the range), one row per slot in
# order, two slots far apart (their weights gathered, not a range view), and one slot alone.
SLOT_PATTERNS = [[3, 0, 3, 1, 3, 0], [0, 1, 2, 3, 4], [4, 0, 4], [2, 2, 2]]


@dataclass(frozen=True)
class Case:
    architecture: str
    observation_space: Any
    action_space: Any
    hidden: tuple[int, ...] = ()

    def policy(self) -> Policy:
        # The torch engine: its float32 module is the reference each row is held to.
        return build_policy(
            self.architecture, self.observation_space, self.action_space, self.hidden,
            inference_engine="torch",
        )  # fmt: skip


CASES = {
    "deepga": Case("deepga", ATARI_OBS, gym.spaces.Discrete(18)),
    "nature": Case("nature", ATARI_OBS, gym.spaces.Discrete(18)),
    # start=-2: the head adds space.start.
    "mlp-discrete": Case("mlp", VECTOR_OBS, gym.spaces.Discrete(5, start=-2), (32, 16, 8)),
    "mlp-box": Case("mlp", VECTOR_OBS, BOX_ACTIONS),
}


def test_the_cases_cover_every_architecture() -> None:
    assert {case.architecture for case in CASES.values()} == set(ARCHITECTURES)


def individuals(policy: Policy, count: int, seed: int) -> list[np.ndarray]:
    """Init-scale weights plus a few mutations' worth of noise (so biases are not all zero)."""
    rng = np.random.default_rng(seed)
    scale = policy.init_scale()
    return [
        scale * rng.standard_normal(policy.num_params, dtype=np.float32)
        + np.float32(0.01) * rng.standard_normal(policy.num_params, dtype=np.float32)
        for _ in range(count)
    ]


def observations(space: Any, rows: int, rng: np.random.Generator) -> np.ndarray:
    if space.dtype == np.uint8:
        return rng.integers(0, 256, (rows, *space.shape), dtype=np.uint8)
    return rng.uniform(-3.0, 3.0, (rows, *space.shape)).astype(np.float32)


def reference(
    policy: Policy, flats: list[np.ndarray], slots: list[int], obs: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(raw outputs, actions) of every row from its own individual's Policy."""
    outputs: list[np.ndarray | None] = [None] * len(slots)
    actions: list[np.ndarray | None] = [None] * len(slots)
    for slot in sorted(set(slots)):
        rows = [i for i, s in enumerate(slots) if s == slot]
        policy.load_parameters(flats[slot])
        net_input = obs[rows]
        if policy.observation_norm is not None:
            net_input = normalise(net_input, *policy.observation_norm).reshape(net_input.shape)
        with torch.inference_mode():
            raw = policy.forward.module(torch.from_numpy(np.ascontiguousarray(net_input))).numpy()
        played = policy.act_batch(obs[rows])
        for j, row in enumerate(rows):
            outputs[row], actions[row] = raw[j], played[j]
    return np.stack(outputs), np.stack(actions)


def assert_plays_like_policies(
    batched: BatchedPolicies, policy: Policy, flats: list[np.ndarray], slots: list[int], seed: int
) -> None:
    """Random observations, one per slot in `slots`: batched outputs and actions == Policy's."""
    space = gym.spaces.Box(-3.0, 3.0, policy.observation_shape, np.float32)
    if policy.observation_shape == ATARI_OBS.shape:
        space = ATARI_OBS
    obs = observations(space, len(slots), np.random.default_rng(seed))
    expected_raw, expected_actions = reference(policy, flats, slots, obs)
    raw = batched.forward(slots, obs).cpu().numpy()
    actions = actions_from_outputs(batched(slots, obs), policy.action_space)
    assert raw.dtype == np.float32 and raw.shape == expected_raw.shape
    np.testing.assert_allclose(raw, expected_raw, rtol=RTOL, atol=ATOL)
    assert actions.shape == expected_actions.shape and actions.dtype == expected_actions.dtype
    if isinstance(policy.action_space, gym.spaces.Discrete):
        assert np.mean(actions == expected_actions) >= 0.99, (actions, expected_actions)
    else:
        np.testing.assert_allclose(actions, expected_actions, rtol=RTOL, atol=ATOL)


@dataclass
class Loaded:
    batched: BatchedPolicies
    policy: Policy
    flats: list[np.ndarray]


def load_case(name: str, device: str) -> Loaded:
    case = CASES[name]
    template, policy = case.policy(), case.policy()
    flats = individuals(template, K, seed=sorted(CASES).index(name))
    batched = BatchedPolicies(template.spec, K, device)
    for slot, flat in enumerate(flats):
        batched.load(slot, flat)
    return Loaded(batched, policy, flats)


@pytest.fixture(scope="module", params=sorted(CASES))
def loaded(request: pytest.FixtureRequest) -> Loaded:
    return load_case(request.param, "cpu")


@pytest.mark.parametrize("slots", SLOT_PATTERNS, ids=lambda s: "-".join(map(str, s)))
def test_each_row_plays_as_its_own_policy(loaded: Loaded, slots: list[int]) -> None:
    assert_plays_like_policies(loaded.batched, loaded.policy, loaded.flats, slots, seed=len(slots))


def test_every_slot_with_uneven_repeats_mlp() -> None:
    # Many rows, every slot, uneven counts: the grid's zero padding must never leak into a row.
    data = load_case("mlp-box", "cpu")
    slots = [int(s) for s in np.random.default_rng(7).integers(0, K, 200)]
    assert_plays_like_policies(data.batched, data.policy, data.flats, slots, seed=7)


def test_load_replaces_a_slot_and_accepts_a_tensor() -> None:
    data = load_case("mlp-discrete", "cpu")
    swapped = [data.flats[1], data.flats[0], *data.flats[2:]]
    data.batched.load(0, torch.from_numpy(swapped[0]))
    data.batched.load(1, swapped[1])
    assert_plays_like_policies(data.batched, data.policy, swapped, [0, 1, 0, 1, 4], seed=3)


def test_read_only_parameters_load_without_warnings(recwarn: pytest.WarningsRecorder) -> None:
    data = load_case("mlp-box", "cpu")
    flat = data.flats[2].copy()
    flat.flags.writeable = False  # as GenomeDecoder returns them
    data.batched.load(0, flat)
    assert not recwarn.list
    assert_plays_like_policies(data.batched, data.policy, [flat, *data.flats[1:]], [0, 1], seed=4)


def test_one_observation_norm_applies_to_every_slot() -> None:
    case = CASES["mlp-discrete"]
    template, policy = case.policy(), case.policy()
    norm = (np.linspace(-1, 1, 6).astype(np.float32), np.linspace(0.5, 2, 6).astype(np.float32))
    policy.observation_norm = norm
    flats = individuals(template, 3, seed=11)
    batched = BatchedPolicies(template.spec, 3)
    batched.observation_norm = norm
    for slot, flat in enumerate(flats):
        batched.load(slot, flat)
    assert_plays_like_policies(batched, policy, flats, [2, 0, 1, 2, 2], seed=5)


def test_an_empty_batch() -> None:
    data = load_case("mlp-box", "cpu")
    assert data.batched([], np.zeros((0, 6), np.float32)).shape == (0, 3)
    assert data.batched.forward([], np.zeros((0, 6), np.float32)).shape == (0, 3)


def test_validation_errors_name_the_bad_value() -> None:
    case = CASES["mlp-discrete"]
    template = case.policy()
    with pytest.raises(ValueError, match="capacity must be >= 1, got 0"):
        BatchedPolicies(template.spec, 0)
    with pytest.raises(ValueError, match="bfloat16"):
        BatchedPolicies(
            build_policy("mlp", VECTOR_OBS, case.action_space, inference_dtype="bfloat16").spec, 2
        )
    batched = BatchedPolicies(template.spec, 3)
    flat = individuals(template, 1, seed=0)[0]
    for slot in (3, -1):
        with pytest.raises(ValueError, match=rf"slot {slot} is outside \[0, 3\)"):
            batched.load(slot, flat)
    with pytest.raises(ValueError, match=r"slot must be an int, got 1\.0"):
        batched.load(1.0, flat)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=rf"\({flat.size + 1},\), expected \({flat.size},\)"):
        batched.load(0, np.zeros(flat.size + 1, np.float32))
    with pytest.raises(ValueError, match="float64"):
        batched.load(0, flat.astype(np.float64))
    with pytest.raises(ValueError, match=r"torch\.float16"):
        batched.load(0, torch.zeros(flat.size, dtype=torch.float16))
    with pytest.raises(ValueError, match="list"):
        batched.load(0, flat.tolist())  # type: ignore[arg-type]
    batched.load(0, flat)
    batched.load(1, flat)
    obs = np.zeros((2, 6), np.float32)
    with pytest.raises(ValueError, match=r"\(2, 7\)"):
        batched([0, 1], np.zeros((2, 7), np.float32))
    with pytest.raises(ValueError, match=r"shape \(6,\) does not match"):
        batched([0], np.zeros(6, np.float32))  # one observation without its batch axis
    with pytest.raises(ValueError, match="1 slots given for 2 observations"):
        batched([0], obs)
    with pytest.raises(ValueError, match=r"slot 7 is outside \[0, 3\)"):
        batched([0, 7], obs)
    with pytest.raises(ValueError, match="slot 2 holds no parameters"):
        batched([2, 0], obs)


def test_an_unknown_network_is_refused() -> None:
    spec = NetSpec("resnet", (6,), 4)
    with pytest.raises(ValueError, match="'resnet'"):
        BatchedPolicies(spec, 2)


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_row_plays_as_its_own_policy_on_cuda(name: str) -> None:
    data = load_case(name, "cuda")
    # TF32 would round conv and matmul inputs to 10 bits: a genome would play differently.
    assert not torch.backends.cuda.matmul.allow_tf32
    assert not torch.backends.cudnn.allow_tf32
    for slots in SLOT_PATTERNS:
        assert_plays_like_policies(data.batched, data.policy, data.flats, slots, seed=len(slots))
