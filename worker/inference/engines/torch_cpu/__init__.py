"""The torch engine: every dtype on every built-in network, and a user's module in float32, on a
CPU (float32 is PyTorch's own pass; bfloat16 and int8 run on oneDNN and fbgemm kernels;
int8-static on exact float32 sums).

The fallback of the per-genome runner where ONNX Runtime is not installed or does not serve a
dtype (bfloat16, the mlp), and the reference the other engines are tested against.
"""

from __future__ import annotations

import importlib.util

from neuro.inference import CPU, INT8_STATIC, MODULE_ARCHITECTURE, TORCH, engine_row
from worker.inference.base import Engine, Forward, NetSpec, NetWeights


def _available(device: str) -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "the torch engine needs torch (pip install 'neuro[worker]')"
    return None if device == CPU else f"the torch engine runs on a CPU, not {device!r}"


def _build(spec: NetSpec, weights: NetWeights) -> Forward:
    # Loaded here, not at import: the registry (and so `neuro-worker --help`) needs no torch.
    if spec.architecture == MODULE_ARCHITECTURE:
        from worker.inference.engines.torch_cpu.module_pass import ModuleForward

        return ModuleForward(spec, weights)
    if spec.dtype == INT8_STATIC:
        from worker.inference.engines.torch_cpu.int8_static_pass import TorchStaticInt8Forward

        return TorchStaticInt8Forward(spec, weights)
    from worker.inference.engines.torch_cpu.passes import TorchForward

    return TorchForward(spec, weights)


ENGINE = Engine(engine_row(TORCH), _available, _build)
