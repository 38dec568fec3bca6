"""int8-static on torch: the integer pass of worker/inference/static_int8.py, which defines it.

Slower than ONNX Runtime's integer convolutions on a CPU (it computes the integer sums as exact
float32 ones), and the reference the ONNX Runtime pass is held to.
"""

from __future__ import annotations

import numpy as np

from worker.inference.base import NetSpec, NetWeights
from worker.inference.static_int8 import (
    QuantisedAtariNet,
    StaticInt8Pass,
    check_calibration,
    check_observations,
)


class TorchStaticInt8Forward:
    """A policy's int8-static pass on torch: quantises each genome it loads."""

    def __init__(self, spec: NetSpec, weights: NetWeights) -> None:
        self.calibrated = StaticInt8Pass.for_spec(spec, check_calibration(spec))
        self.weights = weights
        self.net: QuantisedAtariNet | None = None

    @property
    def layer_bytes(self) -> dict[str, int]:
        return {} if self.net is None else self.net.layer_bytes

    @property
    def weight_bytes(self) -> int:
        return 0 if self.net is None else self.net.weight_bytes

    def load(self) -> None:
        self.net = self.calibrated.quantise_weights(self.weights)

    def __call__(self, observations: np.ndarray) -> np.ndarray:
        if self.net is None:
            raise RuntimeError("load() a genome before the first forward pass")
        return self.calibrated.logits(self.net, check_observations(observations))
