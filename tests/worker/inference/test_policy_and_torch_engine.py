"""The policy (flat parameter buffer, action head) and the torch engine's passes."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from worker.inference.engines.torch_cpu import layers as torch_layers
from worker.inference.policy import build_policy

ATARI_OBS = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
CARTPOLE_OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)


def _atari(arch: str, n_actions: int = 18, engine: str = "torch"):
    return build_policy(arch, ATARI_OBS, gym.spaces.Discrete(n_actions), inference_engine=engine)


def _random_params(policy, seed: int = 0, scale: float = 0.05) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(policy.num_params) * scale).astype(np.float32)


def _conv_shapes(policy, obs: np.ndarray) -> list[tuple[int, ...]]:
    """The conv layers' output shapes in the network's own forward pass."""
    net = policy.forward.module
    shapes = []
    hooks = [conv.register_forward_hook(lambda _m, _i, out: shapes.append(tuple(out.shape[1:])))
             for conv in (net.conv1, net.conv2, net.conv3)]  # fmt: skip
    try:
        with torch.inference_mode():
            net(torch.from_numpy(obs[None]))
    finally:
        for hook in hooks:
            hook.remove()
    return shapes


@pytest.mark.parametrize(("arch", "count"), [("deepga", 4_052_658), ("nature", 1_693_362)])
def test_atari_parameter_counts(arch, count):
    policy = _atari(arch)
    assert policy.num_params == count
    assert sum(math.prod(shape) for _, shape in policy.parameter_layout) == count


@pytest.mark.parametrize(
    ("arch", "shapes"),
    [
        ("deepga", [(32, 21, 21), (64, 11, 11), (64, 11, 11)]),
        ("nature", [(32, 20, 20), (64, 9, 9), (64, 7, 7)]),
    ],
)
def test_conv_output_shapes(arch, shapes):
    policy = _atari(arch)
    assert _conv_shapes(policy, np.zeros((4, 84, 84), np.uint8)) == shapes
    assert policy.forward.module.conv_output_shape == shapes[-1]


def test_deepga_same_padding_puts_extra_pixel_after():
    # TF SAME: conv2 on 21x21 with k=4, s=2 pads 1 before and 2 after.
    assert _atari("deepga").forward.module.pads == [(2, 2, 2, 2), (1, 2, 1, 2), (1, 1, 1, 1)]


def test_parameter_layout_order():
    names = [name for name, _ in _atari("nature").parameter_layout]
    assert names == [
        "conv1.weight",
        "conv1.bias",
        "conv2.weight",
        "conv2.bias",
        "conv3.weight",
        "conv3.bias",
        "fc.weight",
        "fc.bias",
        "out.weight",
        "out.bias",
    ]
    mlp = build_policy("mlp", CARTPOLE_OBS, gym.spaces.Discrete(2))
    assert mlp.parameter_layout == [
        ("hidden.0.weight", (64, 4)),
        ("hidden.0.bias", (64,)),
        ("hidden.1.weight", (64, 64)),
        ("hidden.1.bias", (64,)),
        ("out.weight", (2, 64)),
        ("out.bias", (2,)),
    ]


def test_load_parameters_shares_one_buffer():
    policy = build_policy("mlp", CARTPOLE_OBS, gym.spaces.Discrete(2), hidden_sizes=(8, 8))
    params = [p for _, p in policy.forward.module.named_parameters()]
    flat = _random_params(policy)
    policy.load_parameters(flat)
    joined = torch.cat([p.detach().reshape(-1) for p in params]).numpy()
    np.testing.assert_array_equal(joined, flat)
    # The same Parameter objects see a second load: they are views, not copies.
    policy.load_parameters(flat * np.float32(2))
    np.testing.assert_array_equal(params[0].detach().numpy().ravel(), flat[:32] * 2)
    assert all(not p.requires_grad for p in params)
    assert policy.flat_parameters.ctypes.data == params[0].data_ptr()
    assert not policy.flat_parameters.flags.writeable


def test_load_parameters_validation():
    policy = build_policy("mlp", CARTPOLE_OBS, gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match="float64"):
        policy.load_parameters(np.zeros(policy.num_params))
    with pytest.raises(ValueError, match="4609"):
        policy.load_parameters(np.zeros(policy.num_params - 1, np.float32))


def test_init_scale_values():
    policy = _atari("nature")
    scale = policy.init_scale()
    assert scale.dtype == np.float32 and scale.shape == (policy.num_params,)
    conv1_w = 32 * 4 * 8 * 8
    assert np.all(scale[:conv1_w] == np.float32(1.0 / math.sqrt(4 * 8 * 8)))
    assert np.all(scale[conv1_w : conv1_w + 32] == 0.0)
    fc_start = policy.num_params - (3136 * 512 + 512) - (512 * 18 + 18)
    assert scale[fc_start] == np.float32(1.0 / math.sqrt(3136))
    out_w = slice(policy.num_params - (512 * 18 + 18), policy.num_params - 18)
    assert np.all(scale[out_w] == np.float32(0.1 / math.sqrt(512)))
    assert np.all(scale[-18:] == 0.0)


def test_atari_act_is_valid_and_deterministic():
    policy = _atari("deepga")
    policy.load_parameters(_random_params(policy))
    rng = np.random.default_rng(1)
    obs = rng.integers(0, 256, (3, 4, 84, 84), dtype=np.uint8)
    action = policy.act(obs[0])
    assert isinstance(action, int) and 0 <= action < 18
    assert policy.act(obs[0]) == action
    batch = policy.act_batch(obs)
    assert batch.shape == (3,) and batch[0] == action


def test_discrete_ties_pick_lowest_index():
    policy = build_policy("mlp", CARTPOLE_OBS, gym.spaces.Discrete(3))
    # All-zero weights give equal outputs for every action.
    assert policy.act(np.ones(4, np.float32)) == 0
    start = build_policy("mlp", CARTPOLE_OBS, gym.spaces.Discrete(3, start=5))
    assert start.act(np.ones(4, np.float32)) == 5


def test_box_actions_are_in_bounds():
    action_space = gym.spaces.Box(
        np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32), dtype=np.float32
    )
    policy = build_policy("mlp", gym.spaces.Box(-1, 1, (3,)), action_space, hidden_sizes=(16,))
    policy.load_parameters(_random_params(policy, scale=3.0))
    obs = np.random.default_rng(2).standard_normal((64, 3)).astype(np.float32)
    actions = policy.act_batch(obs)
    assert actions.shape == (64, 2) and actions.dtype == np.float32
    assert np.all(actions >= action_space.low) and np.all(actions <= action_space.high)
    single = policy.act(obs[0])
    assert single.shape == (2,) and action_space.contains(single)
    # Zero parameters map to the middle of the box.
    policy.load_parameters(np.zeros(policy.num_params, np.float32))
    np.testing.assert_allclose(policy.act(obs[0]), [0.0, 0.5])


def test_mlp_default_hidden_sizes():
    policy = build_policy("mlp", CARTPOLE_OBS, gym.spaces.Discrete(2))
    assert policy.num_params == (4 * 64 + 64) + (64 * 64 + 64) + (64 * 2 + 2)


def test_unknown_architecture_lists_valid_ones():
    with pytest.raises(ValueError, match=r"'resnet'.*deepga, nature, mlp"):
        build_policy("resnet", ATARI_OBS, gym.spaces.Discrete(18))


def test_atari_requires_stacked_frames():
    with pytest.raises(ValueError, match=r"\(84, 84, 4\)"):
        build_policy(
            "nature", gym.spaces.Box(0, 255, (84, 84, 4), np.uint8), gym.spaces.Discrete(4)
        )


def test_unsupported_action_spaces():
    with pytest.raises(ValueError, match="MultiDiscrete"):
        build_policy("mlp", CARTPOLE_OBS, gym.spaces.MultiDiscrete([2, 2]))
    with pytest.raises(ValueError, match="Box"):
        build_policy("deepga", ATARI_OBS, gym.spaces.Box(-1, 1, (2,)))


@pytest.mark.parametrize("arch", ["deepga", "nature"])
def test_packed_convolutions_compute_what_the_plain_network_does(arch):
    """The inference module's convolutions (pre-packed oneDNN weights with a fused ReLU, where
    this torch has them) against the plain float32 module: same outputs up to float32
    rounding, same actions, and each row the same whatever batch it is in."""
    policy = _atari(arch, engine="torch")
    policy.load_parameters(_random_params(policy, seed=4) * policy.init_scale() * 20)
    if torch.float32 in torch_layers.FUSED_CONV_DTYPES:
        assert isinstance(policy.forward.inference_module.conv2, torch_layers.FusedConv2dReLU)
    obs = np.random.default_rng(6).integers(0, 256, (8, *ATARI_OBS.shape), dtype=np.uint8)
    with torch.inference_mode():
        plain = policy.forward.module(torch.from_numpy(obs))
        packed = policy.forward.inference_module(torch.from_numpy(obs))
        conv1 = policy.forward.inference_module.conv1
        # The inference copy's conv1 takes the observation unscaled (its weights carry 1/255).
        raw = torch.from_numpy(obs).float().contiguous(memory_format=torch.channels_last)
        batch = conv1(raw)
        rows = torch.cat([conv1(row[None]) for row in raw])
    assert torch.allclose(packed, plain, rtol=1e-4, atol=1e-5)
    assert torch.equal(packed.argmax(1), plain.argmax(1))
    assert torch.equal(rows, batch)  # packed for batch 1, exact for any batch
    assert plain.abs().max() > 1e-2 and not torch.equal(plain[0], plain[1])  # not all zeros


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("arch", ["deepga", "nature"])
def test_the_bound_forward_pass_is_the_modules_bit_for_bit(arch, dtype):
    """act_batch runs the inference module's pass bound into one function (bound_forward):
    the same ops on the same weights, so the same bits, for every load and batch size."""
    policy = build_policy(
        arch, ATARI_OBS, gym.spaces.Discrete(18), inference_dtype=dtype, inference_engine="torch"
    )
    rng = np.random.default_rng(9)
    for genome in range(2):
        policy.load_parameters(_random_params(policy, seed=genome) * policy.init_scale() * 20)
        if torch.float32 in torch_layers.FUSED_CONV_DTYPES:
            assert policy.forward._forward is not policy.forward.inference_module
        for batch in (1, 3):
            obs = torch.from_numpy(rng.integers(0, 256, (batch, *ATARI_OBS.shape), np.uint8))
            with torch.inference_mode():
                bound = policy.forward._forward(obs)
                module = policy.forward.inference_module(obs)
            assert bound.dtype == torch.float32
            assert torch.equal(bound, module.float())
            assert bound.abs().max() > 1e-2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("arch", ["deepga", "nature"])
def test_single_observation_passes_reuse_buffers_without_mixing_steps(arch, dtype):
    """A pass over one observation copies between layers into buffers kept for the load: step
    after step, each result is the module's for that step alone, and no later step changes
    a result already returned."""
    policy = build_policy(
        arch, ATARI_OBS, gym.spaces.Discrete(18), inference_dtype=dtype, inference_engine="torch"
    )
    policy.load_parameters(_random_params(policy, seed=3) * policy.init_scale() * 20)
    observations = np.random.default_rng(4).integers(0, 256, (4, *ATARI_OBS.shape), np.uint8)
    with torch.inference_mode():
        returned = [policy.forward._forward(torch.from_numpy(obs[None])) for obs in observations]
        kept = [result.clone() for result in returned]
        policy.forward._forward(torch.from_numpy(observations))  # a batched pass in between
        again = policy.forward._forward(torch.from_numpy(observations[:1]))
        expected = [
            policy.forward.inference_module(torch.from_numpy(o[None])) for o in observations
        ]
    for result, copy_, reference in zip(returned, kept, expected, strict=True):
        assert torch.equal(result, copy_)
        assert torch.equal(result, reference.float())
    assert torch.equal(again, kept[0])
    assert not torch.equal(kept[0], kept[1])


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_bfloat16_convolutions_emulated_on_float32_ones_compute_what_bfloat16_ones_do(
    monkeypatch, dtype
):
    """On a CPU that cannot pack bfloat16 convolutions (AVX2), a reduced-precision policy runs
    them as float32 ones on bfloat16 values, each output rounded to bfloat16. Against torch's
    own bfloat16 convolutions on the same genome: the same actions and outputs equal up to
    bfloat16 rounding of sums taken in another order; and the bound pass is the module's."""

    def on_torch():
        return build_policy("deepga", ATARI_OBS, gym.spaces.Discrete(18), inference_dtype=dtype,
                            inference_engine="torch")  # fmt: skip

    monkeypatch.setattr(torch_layers, "FUSED_CONV_DTYPES", frozenset({torch.float32}))
    emulated = on_torch()
    monkeypatch.setattr(torch_layers, "FUSED_CONV_DTYPES", frozenset())
    plain = on_torch()
    conv2 = emulated.forward.inference_module.conv2
    assert isinstance(conv2, torch_layers.FusedConv2dReLU)
    assert conv2.output_dtype == torch.bfloat16 and conv2.weight.dtype == torch.float32
    assert plain.forward.inference_module.conv2.weight.dtype == torch.bfloat16
    rng = np.random.default_rng(12)
    for genome in range(2):
        theta = _random_params(emulated, seed=genome) * emulated.init_scale() * 20
        emulated.load_parameters(theta)
        plain.load_parameters(theta)
        # Every weight of the emulated layers is a bfloat16 value, and the same one.
        weight = emulated.forward.inference_module.conv3.weight
        assert torch.equal(weight, weight.to(torch.bfloat16).float())
        assert torch.equal(weight, plain.forward.inference_module.conv3.weight.float())
        obs = torch.from_numpy(rng.integers(0, 256, (16, *ATARI_OBS.shape), dtype=np.uint8))
        with torch.inference_mode():
            bound = emulated.forward._forward(obs)
            one_by_one = [emulated.forward._forward(row[None]) for row in obs[:4]]
            module_one_by_one = [
                emulated.forward.inference_module(row[None]).float() for row in obs[:4]
            ]
            module = emulated.forward.inference_module(obs).float()
            reference = plain.forward.inference_module(obs).float()
        assert emulated.forward._forward is not emulated.forward.inference_module
        assert torch.equal(bound, module)
        assert torch.equal(torch.cat(one_by_one), torch.cat(module_one_by_one))
        assert torch.allclose(bound, reference, rtol=0.05, atol=0.05 * reference.abs().max())
        assert torch.equal(bound.argmax(1), reference.argmax(1))
        assert reference.abs().max() > 1e-2 and not torch.equal(reference[0], reference[1])


def test_bfloat16_on_a_cpu_without_it_says_int8_is_faster(monkeypatch, caplog):
    monkeypatch.setattr(torch_layers, "FUSED_CONV_DTYPES", frozenset({torch.float32}))
    torch_layers.warn_if_bfloat16_is_slow.cache_clear()
    with caplog.at_level("WARNING", logger="worker.inference.engines.torch_cpu.layers"):
        build_policy("deepga", ATARI_OBS, gym.spaces.Discrete(18), inference_dtype="int8")
        assert not caplog.records
        for _ in range(2):
            build_policy("deepga", ATARI_OBS, gym.spaces.Discrete(18), inference_dtype="bfloat16")
    assert len(caplog.records) == 1  # once per process
    assert "bfloat16" in caplog.text and "int8 is the faster choice" in caplog.text
    torch_layers.warn_if_bfloat16_is_slow.cache_clear()
