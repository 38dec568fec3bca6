"""int8-static on torch: the integer pass of worker/inference/int8_static.py, which defines it.

Slower than ONNX Runtime's integer convolutions on a CPU (it computes the integer sums as exact
float32 ones), and the reference the ONNX Runtime pass is held to.
"""

from __future__ import annotations

import numpy as np

from worker.inference.int8_static import QuantisingForward, check_observations


class TorchStaticInt8Forward(QuantisingForward):
    """A policy's int8-static pass on torch: quantises each genome it loads."""

    def __call__(self, observations: np.ndarray) -> np.ndarray:
        if self.net is None:
            raise RuntimeError("load() a genome before the first forward pass")
        return self.calibrated.logits(self.net, check_observations(observations))
