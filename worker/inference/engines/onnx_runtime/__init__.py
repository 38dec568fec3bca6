"""The ONNX Runtime engine: the Atari nets' float32, int8 and int8-static passes on a CPU, the
per-genome runner's first choice where onnxruntime is installed (the same numbers as torch's
passes up to the order of sums, and less time a step: docs/performance.md)."""

from __future__ import annotations

from neuro.inference import CPU, INT8_STATIC, ONNXRUNTIME, engine_row
from worker.inference.base import Engine, Forward, NetSpec, NetWeights
from worker.inference.engines.onnx_runtime.session import installed


def _available(device: str) -> str | None:
    if not installed():
        return (
            "inference engine 'onnxruntime' needs the onnxruntime and onnx packages "
            "(pip install 'neuro[worker]'), or choose 'torch'"
        )
    return None if device == CPU else f"the onnxruntime engine runs on a CPU, not {device!r}"


def _build(spec: NetSpec, weights: NetWeights) -> Forward:
    if spec.dtype == INT8_STATIC:
        from worker.inference.engines.onnx_runtime.int8_static_graph import OnnxStaticInt8Forward

        return OnnxStaticInt8Forward(spec, weights)
    from worker.inference.engines.onnx_runtime.atari import OnnxAtariForward

    return OnnxAtariForward(spec, weights)


ENGINE = Engine(engine_row(ONNXRUNTIME), _available, _build)
