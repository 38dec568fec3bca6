"""The torch engine's pass of a user's network: the factory's own module, its parameters made
views of the policy's flat float32 vector, so a genome's load is one copy and no rebuild."""

from __future__ import annotations

import numpy as np
import torch

from worker.inference.base import NetSpec, NetWeights


def bind_module(module: torch.nn.Module, weights: NetWeights) -> torch.nn.Module:
    """Points every parameter of `module` at its view of `weights`, in place, so a parameter
    shared by two layers (tied weights) stays shared; AssertionError where the module's
    parameters are not the layout."""
    parameters = list(module.named_parameters())
    names = [name for name, _ in parameters]
    if names != list(weights):
        raise AssertionError(f"module parameters {names} are not the layout {list(weights)}")
    with torch.no_grad():
        for name, parameter in parameters:
            view = torch.from_numpy(weights[name])
            if tuple(view.shape) != tuple(parameter.shape):
                raise AssertionError(
                    f"parameter {name}: {tuple(parameter.shape)} is not the layout"
                )
            parameter.data = view
    return module.eval()


class ModuleForward:
    """A user's module in float32 on a CPU, over a policy's weights."""

    def __init__(self, spec: NetSpec, weights: NetWeights) -> None:
        if spec.module is None:
            raise ValueError("a user's network spec comes with its module (module_spec)")
        self.module = bind_module(spec.module, weights)
        self._outputs = spec.n_outputs
        self._name = spec.policy.factory if spec.policy is not None else "the policy"
        self.layer_bytes: dict[str, int] = {}
        """Bytes of float32 parameters each submodule holds (its own, not its children's)."""
        for name, parameter in self.module.named_parameters():
            owner = name.rpartition(".")[0] or "module"
            self.layer_bytes[owner] = self.layer_bytes.get(owner, 0) + 4 * parameter.numel()

    @property
    def weight_bytes(self) -> int:
        return sum(self.layer_bytes.values())

    def load(self) -> None:
        """Nothing to refresh: the module reads the weights' views directly."""

    def __call__(self, observations: np.ndarray) -> np.ndarray:
        # A fresh float32 copy unless the batch already is one the module may read.
        if not (
            observations.dtype == np.float32
            and observations.flags.writeable
            and observations.flags.c_contiguous
        ):
            observations = np.array(observations, dtype=np.float32, order="C")
        with torch.inference_mode():
            out = self.module(torch.from_numpy(observations))
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (
            len(observations),
            self._outputs,
        ):
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(
                f"policy {self._name}'s module returned {shape} for {len(observations)} "
                f"observation(s); expected ({len(observations)}, {self._outputs})"
            )
        return out.to(torch.float32).numpy()
