"""A policy: one network's flat float32 parameters, its engine's forward pass, the action head.

The genome contract: a flat parameter vector is laid out layer by layer, weight then bias, in
the order neuro/layout.py lists them (a user's module: its named_parameters() order,
neuro/policy_spec.py). Conv weights are (out, in, kh, kw) and linear weights are (out, in),
both row-major, as torch stores them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from neuro.inference import ALL_ARCHITECTURES, FLOAT32, MLP_ARCHITECTURE, MODULE_ARCHITECTURE
from neuro.layout import ATARI_SHAPE, DEFAULT_MLP_HIDDEN, check_parameter_count, parameter_count
from neuro.observation_stats import normalise
from neuro.policy_spec import UserPolicy
from worker.inference.actions import actions_from_outputs
from worker.inference.base import Engine, Forward, NetSpec, NetWeights
from worker.inference.registry import check_preference, preferred_engine, select
from worker.inference.user_policy import module_spec

__all__ = ["Policy", "actions_from_outputs", "build_policy"]


class Policy:
    """A network and its action head, its parameters in one contiguous float32 buffer.

    `inference_dtype` is the precision of the forward pass after the exact float32 decode, so
    a genome is the same policy for every worker of a run (neuro/inference.py lists them);
    `inference_engine` is the engine the registry chose for it, which computes that pass.
    Loading a genome is one copy into the buffer, then the engine's load().
    """

    def __init__(self, spec: NetSpec, action_space: Any, engine: Engine) -> None:
        self.spec = spec
        self.inference_dtype = spec.dtype
        self.inference_engine = engine.name
        self.observation_shape = spec.observation_shape
        self.action_space = action_space
        self.observation_norm: tuple[np.ndarray, np.ndarray] | None = None
        """(mean, std): observations are fed as clip((x - mean) / std, +-5) (ES runs)."""
        self.parameter_layout = spec.layout
        self.num_params: int = parameter_count(self.parameter_layout)
        self._flat = np.zeros(self.num_params, dtype=np.float32)
        self.weights = NetWeights(self._flat, self.parameter_layout)
        self.forward: Forward = engine.forward(spec, self.weights)
        """The engine's pass over `weights`: (batch, n_outputs) float32 outputs."""
        self.forward.load()

    def __repr__(self) -> str:
        network = self.spec.policy.factory if self.spec.policy else self.spec.architecture
        return (
            f"Policy({network!r}, {self.inference_dtype}, "
            f"on {self.inference_engine}, num_params={self.num_params})"
        )

    def weight_bytes_per_forward(self) -> int:
        """Bytes of weights one forward pass reads, in the dtypes it computes in."""
        return self.forward.weight_bytes

    @property
    def flat_parameters(self) -> np.ndarray:
        """Read-only view of the parameter buffer."""
        view = self._flat.view()
        view.flags.writeable = False
        return view

    def init_scale(self) -> np.ndarray:
        """Per-parameter init scale: std / sqrt(fan_in) for weights, 0 for biases."""
        return self.spec.init_scale()

    def load_parameters(self, flat: np.ndarray) -> None:
        """Copy a float32 vector of length num_params into the network."""
        if not isinstance(flat, np.ndarray) or flat.dtype != np.float32:
            raise ValueError(
                f"parameters must be a float32 ndarray, got {getattr(flat, 'dtype', type(flat))}"
            )
        if flat.shape != (self.num_params,):
            raise ValueError(f"parameters have shape {flat.shape}, expected ({self.num_params},)")
        np.copyto(self._flat, flat)
        self.forward.load()

    def act(self, observation: np.ndarray) -> int | np.ndarray:
        """Action for one observation: int for Discrete, array for Box."""
        action = self.act_batch(np.asarray(observation)[None])[0]
        if isinstance(self.action_space, gym.spaces.Discrete):
            return int(action)
        return action

    def act_batch(self, observations: np.ndarray) -> np.ndarray:
        """Actions for a batch of observations (leading axis is the batch)."""
        obs = np.asarray(observations)
        if obs.shape[1:] != self.observation_shape:
            raise ValueError(
                f"observation batch shape {obs.shape} does not match {self.observation_shape}"
            )
        if self.observation_norm is not None:
            mean, std = self.observation_norm
            obs = normalise(obs, mean, std).reshape(obs.shape)
        return actions_from_outputs(self.forward(obs), self.action_space)


def network_spec(
    architecture: str,
    observation_space: Any,
    action_space: Any,
    hidden_sizes: Sequence[int] = (),
    inference_dtype: str = FLOAT32,
    calibration: np.ndarray | None = None,
    policy: UserPolicy | None = None,
) -> NetSpec:
    """The network build_policy builds for these spaces; ValueError naming what does not fit.

    Counted before anything is allocated: sizes from a master must not take 64 GiB. A user's
    network ("module", `policy` naming its factory) is built here, once, to learn its layout;
    ModuleUnavailable (a ValueError) where its module cannot be imported."""
    if architecture not in ALL_ARCHITECTURES:
        raise ValueError(
            f"unknown architecture {architecture!r}; valid: {', '.join(ALL_ARCHITECTURES)}"
        )
    if (architecture == MODULE_ARCHITECTURE) != (policy is not None):
        raise ValueError(
            f"architecture {architecture!r} with policy {policy!r}: a user's policy is the "
            f"{MODULE_ARCHITECTURE!r} architecture, and that architecture needs one"
        )
    if policy is not None:
        if hidden_sizes:
            raise ValueError(f"policy {policy.factory} takes options, not hidden_sizes")
        return module_spec(policy, observation_space, action_space, inference_dtype)
    obs_shape = tuple(getattr(observation_space, "shape", None) or ())
    if isinstance(action_space, gym.spaces.Discrete):
        n_out = int(action_space.n)
    elif isinstance(action_space, gym.spaces.Box) and architecture == MLP_ARCHITECTURE:
        if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
            raise ValueError(f"Box action space needs finite bounds, got {action_space}")
        n_out = math.prod(action_space.shape)
    else:
        raise ValueError(f"unsupported action space {action_space} for {architecture!r}")
    if architecture == MLP_ARCHITECTURE:
        if not isinstance(observation_space, gym.spaces.Box):
            raise ValueError(f"mlp needs a Box observation space, got {observation_space}")
        hidden = tuple(int(h) for h in (tuple(hidden_sizes) or DEFAULT_MLP_HIDDEN))
        if any(h < 1 for h in hidden):
            raise ValueError(f"hidden sizes must be >= 1, got {hidden}")
    else:
        if obs_shape != ATARI_SHAPE:
            raise ValueError(
                f"{architecture!r} needs observation shape {ATARI_SHAPE}, got {obs_shape}"
            )
        if hidden_sizes:
            raise ValueError(
                f"{architecture!r} has fixed layers; hidden_sizes {hidden_sizes} given"
            )
        hidden = ()
    spec = NetSpec(architecture, obs_shape, n_out, hidden, inference_dtype, calibration)
    check_parameter_count(parameter_count(spec.layout))
    return spec


def build_policy(
    architecture: str,
    observation_space: Any,
    action_space: Any,
    hidden_sizes: Sequence[int] = (),
    inference_dtype: str = FLOAT32,
    inference_engine: str | None = None,
    calibration: np.ndarray | None = None,
    policy: UserPolicy | None = None,
) -> Policy:
    """Build the named network for these spaces with zeroed parameters (`policy`: a user's
    network, architecture "module").

    `inference_engine`: the engine to prefer (None: preferred_engine(), onnxruntime where it
    is installed); a dtype or network it does not serve runs on the next engine that does, and
    Policy.inference_engine names it. `calibration`: the uint8 observations an int8-static
    policy sets its activation scales on (worker/play/calibration.py); other dtypes take
    none."""
    spec = network_spec(architecture, observation_space, action_space, hidden_sizes,
                        inference_dtype, calibration, policy)  # fmt: skip
    prefer = check_preference(preferred_engine() if inference_engine is None else inference_engine)
    return Policy(spec, action_space, select(spec.dtype, architecture, prefer=prefer))
