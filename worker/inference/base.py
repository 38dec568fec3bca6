"""The inference seam: what an engine is told to build, what it builds, and its registry record.

An engine turns one network's float32 parameters (the genome's exact decode) into logits, in
one of the inference dtypes. Engines differ in how (torch's oneDNN and fbgemm kernels, ONNX
Runtime's MLAS, grouped convolutions on a GPU), never in what a genome means: tests hold every
engine of a dtype to the same outputs up to the order of float sums.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from neuro.inference import BATCHED, CPU, FLOAT32, MODULE_ARCHITECTURE, PER_GENOME, EngineRow
from neuro.layout import Layout, parameter_layout
from neuro.policy_spec import UserPolicy, init_scale_of

__all__ = ["Engine", "Forward", "GroupedForward", "NetSpec", "NetWeights"]


@dataclass(frozen=True)
class NetSpec:
    """The network an engine builds a forward pass for."""

    architecture: str
    observation_shape: tuple[int, ...]
    n_outputs: int
    hidden_sizes: tuple[int, ...] = ()
    dtype: str = FLOAT32
    calibration: np.ndarray | None = field(default=None, compare=False, repr=False)
    """int8-static: the (frames, *observation_shape) uint8 observations its activation scales
    are calibrated on (worker/play/calibration.py); None for other dtypes."""
    policy: UserPolicy | None = None
    """A user's network (architecture "module"): its factory and options."""
    module_layout: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """A user's network: its parameters' names and shapes, the genome's layout."""
    module: Any = field(default=None, compare=False, repr=False)
    """A user's network: the nn.Module its factory built, which the torch engine's pass binds to
    the policy's weights (one pass per module: build another spec for another policy)."""

    @property
    def layout(self) -> Layout:
        """(name, shape) of every parameter, in the genome's order (neuro/layout.py, or a
        user's module's own: neuro/policy_spec.py)."""
        if self.architecture == MODULE_ARCHITECTURE:
            return list(self.module_layout)
        return parameter_layout(
            self.architecture, self.observation_shape, self.n_outputs, self.hidden_sizes
        )

    def init_scale(self) -> np.ndarray:
        """Per-parameter init scale of the genome's first seed (neuro/policy_spec.py's rule for
        a user's module, neuro/layout.py's for the built-in networks)."""
        return init_scale_of(self.architecture, self.layout)


class NetWeights:
    """One network's parameters: a flat float32 vector in the genome's layout, read by layer.

    Every array it hands out is a view of the vector, so an engine that keeps them (torch's
    modules do) sees each new genome without a copy.
    """

    def __init__(self, flat: np.ndarray, layout: Layout) -> None:
        if flat.dtype != np.float32 or flat.ndim != 1:
            raise ValueError(
                f"weights must be a flat float32 vector, got {flat.dtype} {flat.shape}"
            )
        if flat.size != sum(math.prod(shape) for _, shape in layout):
            raise ValueError(f"{flat.size} weights do not fill the layout {layout}")
        self.flat = flat
        self.layout = layout
        self._views: dict[str, np.ndarray] = {}
        offset = 0
        for name, shape in layout:
            size = math.prod(shape)
            self._views[name] = flat[offset : offset + size].reshape(shape)
            offset += size

    def __getitem__(self, name: str) -> np.ndarray:
        return self._views[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._views)

    def layer(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(weight, bias) of a layer, e.g. layer("conv1")."""
        return self._views[f"{name}.weight"], self._views[f"{name}.bias"]


class Forward(Protocol):
    """One network's forward pass on one engine, built over a policy's NetWeights."""

    @property
    def layer_bytes(self) -> dict[str, int]:
        """Bytes of weights each layer ("conv1", "fc", "out", "hidden.0", ...) reads in one
        pass, in the dtypes this engine computes it in (empty before the first load)."""
        ...

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one pass reads: the sum of layer_bytes."""
        ...

    def load(self) -> None:
        """Re-reads the weights it was built over, after they changed (once per genome)."""

    def __call__(self, observations: np.ndarray) -> np.ndarray:
        """(batch, n_outputs) float32 outputs of (batch, *observation_shape) observations."""


class GroupedForward(Protocol):
    """Many networks of one spec in one pass: slot i holds one individual's weights."""

    capacity: int

    def load(self, slot: int, flat: object) -> None:
        """Copies one individual's float32 vector (an ndarray, or a tensor on the device)."""

    def __call__(self, slots: Sequence[int], observations: np.ndarray) -> np.ndarray:
        """(batch, n_outputs) float32: row i under the weights of slots[i]."""


@dataclass(frozen=True)
class Engine:
    """A registry entry: its row of the shared table (what it serves, declared once in
    neuro/inference.py), whether it can run here, and its builder.

    A per-genome engine builds a Forward over a policy's NetWeights; the batched runner's
    engine builds a GroupedForward of `capacity` slots on a device.
    """

    row: EngineRow
    available: Callable[[str], str | None]
    """None where it runs on this device here; else why not (what to install, say)."""
    build: Callable[..., Any]
    """Its pass, for the runner its row names: per-genome, (NetSpec, NetWeights) -> Forward;
    batched, (NetSpec, capacity, device) -> GroupedForward."""

    @property
    def name(self) -> str:
        return self.row.engine

    @property
    def runner(self) -> str:
        return self.row.runner

    def forward(self, spec: NetSpec, weights: NetWeights) -> Forward:
        """Its per-genome pass of `spec` over `weights`; ValueError naming what it does not
        serve."""
        self._check(spec, PER_GENOME, CPU)
        return self.build(spec, weights)

    def grouped(self, spec: NetSpec, capacity: int, device: str) -> GroupedForward:
        """Its batched pass of `capacity` slots of `spec` on `device`; ValueError naming what
        it does not serve."""
        self._check(spec, BATCHED, device)
        return self.build(spec, capacity, device)

    def _check(self, spec: NetSpec, runner: str, device: str) -> None:
        row = self.row
        if not row.serves(spec.dtype, spec.architecture, runner, device):
            raise ValueError(
                f"inference engine {self.name!r} does not serve {spec.architecture} "
                f"{spec.dtype!r} on the {runner} runner on {device} (it serves "
                f"{', '.join(sorted(row.dtypes))} on {', '.join(sorted(row.architectures))}, "
                f"the {row.runner} runner, {', '.join(sorted(row.devices))})"
            )
        missing = self.available(device)
        if missing is not None:
            raise ValueError(missing)
