"""A user's network (`--policy package.module:callable`) as a worker builds it: the factory's
nn.Module, checked against the env's spaces before any genome is loaded into it.

The genome contract (parameter order, initialisation, what the module is fed and must return)
is neuro/policy_spec.py's; the torch engine runs the module (engines/torch_cpu/module_pass.py).
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

from neuro.inference import FLOAT32, MODULE_ARCHITECTURE
from neuro.layout import check_parameter_count, parameter_count
from neuro.policy_spec import UserPolicy, make_module, module_layout
from worker.inference.base import NetSpec

__all__ = ["build_module", "load_parameters", "module_outputs", "module_spec"]


def module_outputs(action_space: Any) -> int:
    """Outputs a network needs for this action space: one per action of a Discrete space, one
    per dimension of a Box with finite bounds; ValueError naming any other space."""
    if isinstance(action_space, gym.spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, gym.spaces.Box):
        if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
            raise ValueError(f"Box action space needs finite bounds, got {action_space}")
        return math.prod(action_space.shape)
    raise ValueError(f"unsupported action space {action_space}: Discrete or a bounded Box")


def build_module(policy: UserPolicy, observation_space: Any, action_space: Any) -> Any:
    """The user's nn.Module for these spaces, ready to run: in eval mode, no gradients, its
    parameters float32, and one observation in gives one row of the outputs the action space
    needs. ModuleUnavailable naming the module if it cannot be imported here; ValueError
    naming the factory if it fails or its module does not fit the spaces."""
    import torch

    if not isinstance(observation_space, gym.spaces.Box):
        raise ValueError(
            f"policy {policy.factory} needs a Box observation space, got {observation_space}"
        )
    outputs = module_outputs(action_space)
    module = make_module(policy, observation_space, action_space)
    if not isinstance(module, torch.nn.Module):
        raise ValueError(
            f"policy factory {policy.factory} returned a {type(module).__name__}, not a torch "
            "nn.Module"
        )
    module_layout(module, f"policy {policy.factory}")
    module.eval()
    module.requires_grad_(False)
    probe = torch.zeros((1, *observation_space.shape), dtype=torch.float32)
    try:
        with torch.inference_mode():
            out = module(probe)
    except Exception as error:  # the user's forward: named, never a crash
        raise ValueError(
            f"policy {policy.factory}'s module fails on one observation of shape "
            f"{tuple(observation_space.shape)}: {type(error).__name__}: {error}"
        ) from error
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    if shape != (1, outputs):
        raise ValueError(
            f"policy {policy.factory}'s module returns {shape} for one observation; the action "
            f"space {action_space} needs (1, {outputs})"
        )
    return module


def module_spec(
    policy: UserPolicy, observation_space: Any, action_space: Any, dtype: str = FLOAT32
) -> NetSpec:
    """The NetSpec of a user's network on these spaces, its module built (build_module)."""
    module = build_module(policy, observation_space, action_space)
    layout = module_layout(module, f"policy {policy.factory}")
    check_parameter_count(parameter_count(layout))
    return NetSpec(
        MODULE_ARCHITECTURE, tuple(observation_space.shape), module_outputs(action_space),
        dtype=dtype, policy=policy, module_layout=tuple(layout), module=module,
    )  # fmt: skip


def load_parameters(module: Any, flat: np.ndarray) -> Any:
    """Copies a genome's float32 vector into a module's parameters, in named_parameters() order
    (a module to hand on: export, a notebook); returns the module. ValueError naming the sizes
    where the vector does not fill them."""
    import torch

    layout = module_layout(module)
    expected = parameter_count(layout)
    if not isinstance(flat, np.ndarray) or flat.dtype != np.float32 or flat.shape != (expected,):
        got = (getattr(flat, "dtype", type(flat)), getattr(flat, "shape", None))
        raise ValueError(f"parameters must be float32 of shape ({expected},), got {got}")
    offset = 0
    with torch.no_grad():
        for (_, shape), parameter in zip(layout, module.parameters(), strict=True):
            size = math.prod(shape)
            parameter.copy_(torch.tensor(flat[offset : offset + size].reshape(shape)))
            offset += size
    return module
