"""The Atari net's forward pass on ONNX Runtime, the CPU worker's default engine.

Why a second engine: at batch 1, with its caches cold from the emulator, ONNX Runtime's
convolutions (MLAS, weights re-blocked once per session) take ~90-100 us each where oneDNN's
take ~160 us (a Zen 3 core stepping Frostbite), so an int8 pass fell from 0.75 to 0.43 ms a
step and a float32 one from 1.00 to 0.74 ms (bench/inference_engines.py; docs/performance.md,
"The inference engine"). A genome's weights are constants of a session built per load (int8
16 ms, float32 26 ms, against an offspring episode's 3-4 s), so that ONNX Runtime packs them
once.

The numbers are those of Policy's torch pass for the same dtype, up to the order of float
sums (as between two CPUs; tests/test_onnx_forward.py holds the logits close and the greedy
actions the same):
- float32: the torch pass's layers and weights (conv1's scaled by 1/255), in float32.
- int8: the convolutions on bfloat16 values (weights, biases and each ReLU output rounded to
  bfloat16 and back, as the torch pass does on a CPU without bfloat16 convolutions); the
  dense layer on the same int8 integers and row scales as Int8Linear (worker/atari_net.py),
  its input quantised per observation to 7 bits over [0, max] (what fbgemm's dynamic
  quantisation does with reduce_range: a ReLU output has no negatives), summed in int32, then
  scaled to float32.
bfloat16 has no engine here (ONNX Runtime has no bfloat16 convolution on CPU): its policies
run on torch.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

TORCH = "torch"
ONNXRUNTIME = "onnxruntime"
INFERENCE_ENGINES = (TORCH, ONNXRUNTIME)
ENGINE_DTYPES = frozenset({"float32", "int8"})
"""The inference dtypes an onnxruntime policy computes; others run on torch."""
_OPSET = 17
_INT8_INPUT_LEVELS = 127.0
"""7-bit activations: AVX2's int8 dot products add pairs of u8 x s8 products in saturating
int16, and 2 x 127 x 127 fits where 2 x 255 x 127 does not (fbgemm's reduce_range)."""
_MIN_INPUT_SCALE = 1e-30
"""Floor of an all-zero input's scale, so that it quantises to zeros instead of 0/0."""


def onnxruntime_installed() -> bool:
    """Whether onnxruntime and onnx can be imported here."""
    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "onnx"))


def default_inference_engine() -> str:
    """NEURO_INFERENCE_ENGINE if set, else onnxruntime where it is installed, else torch."""
    chosen = os.environ.get("NEURO_INFERENCE_ENGINE")
    if chosen:
        return chosen
    return ONNXRUNTIME if onnxruntime_installed() else TORCH


def check_inference_engine(engine: str) -> None:
    """ValueError naming the engine unless it is known and, for onnxruntime, installed."""
    if engine not in INFERENCE_ENGINES:
        raise ValueError(
            f"inference engine {engine!r} is not one of {', '.join(INFERENCE_ENGINES)}"
        )
    if engine == ONNXRUNTIME and not onnxruntime_installed():
        raise ValueError(
            "inference engine 'onnxruntime' needs the onnxruntime and onnx packages "
            "(pip install 'neuro[worker]'), or choose 'torch'"
        )


def session(model: Any, profile_prefix: str | None = None) -> Any:
    """An ONNX Runtime CPU session over `model` that runs in the calling thread.

    `profile_prefix`: where ONNX Runtime writes a per-node profile (a benchmark's breakdown)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    # One worker per core: the pass runs in the caller's thread, which never spins.
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    # MatMulIntegerToFloat, which this fusion makes of the int8 dense layer's integer matmul
    # and its scaling, computed other logits than the unfused ops (3.8% of the largest logit
    # on a trained genome's observation, where the unfused ops match torch's int8 pass to
    # 2e-7), and it is no faster here.
    return ort.InferenceSession(
        model.SerializeToString(),
        options,
        providers=["CPUExecutionProvider"],
        disabled_optimizers=["MatMulIntegerToFloatFusion"],
    )


def bind_single(
    session: Any, single_input: np.ndarray, output: np.ndarray, n_actions: int
) -> tuple[Any, np.ndarray]:
    """An I/O binding of the session's "observation" to `single_input` and its "logits" to a
    (1, n_actions) float32 buffer (`output`, where it has that shape), and that buffer: a
    batch-1 pass then copies into bound buffers instead of building the call's arguments."""
    if output.shape != (1, n_actions):
        output = np.zeros((1, n_actions), dtype=np.float32)
    binding = session.io_binding()
    binding.bind_cpu_input("observation", single_input)
    binding.bind_output("logits", "cpu", 0, np.float32, [1, n_actions], output.ctypes.data)
    return binding, output


@dataclass(frozen=True)
class AtariWeights:
    """One genome's weights as the forward pass computes with them (numpy, C order).

    `convs`: per layer (weight (out, in, kh, kw), bias), conv1's already scaled by 1/255 and,
    for int8, all rounded to bfloat16 values. `fc`: (weight (out, in), bias) in float32, or
    for int8 (int8 integers (out, in), float32 row scales, bias). `out`: (weight, bias).
    """

    convs: Sequence[tuple[np.ndarray, np.ndarray]]
    fc: tuple[np.ndarray, ...]
    out: tuple[np.ndarray, np.ndarray]


class OnnxAtariForward:
    """Logits of the Atari net for a batch of observations, on one ONNX Runtime session.

    `strides` and `pads` (left, right, top, bottom per layer, as F.pad takes them) describe
    the convolutions; a session is built by each load() and runs in the calling thread.
    """

    def __init__(
        self,
        dtype: str,
        strides: Sequence[int],
        pads: Sequence[tuple[int, int, int, int]],
        observation_shape: tuple[int, ...],
    ) -> None:
        if dtype not in ENGINE_DTYPES:
            raise ValueError(
                f"onnxruntime computes {', '.join(sorted(ENGINE_DTYPES))}, not {dtype!r}"
            )
        self.dtype = dtype
        self._strides = list(strides)
        self._pads = [list(p) for p in pads]
        self._observation_shape = observation_shape
        self._session: Any = None
        self._single: Any = None
        """An I/O binding of the session to one-observation buffers: an offspring's step
        copies into them instead of building the call's arguments (0.45 -> 0.42 ms a step,
        int8, stepping Frostbite on one Zen 3 core)."""
        self._single_input = np.zeros((1, *observation_shape), dtype=np.float32)
        self._single_output = np.zeros((1, 0), dtype=np.float32)
        self.weight_bytes = 0
        """Bytes of weights one pass reads, in the dtypes it computes in."""

    def load(self, weights: AtariWeights) -> None:
        """Builds the session over these weights (they are copied into it)."""
        self._session = session(self.model(weights))
        self._single, self._single_output = bind_single(
            self._session, self._single_input, self._single_output, weights.out[0].shape[0]
        )
        arrays = [array for pair in (*weights.convs, weights.fc, weights.out) for array in pair]
        self.weight_bytes = sum(int(array.nbytes) for array in arrays)

    def __call__(self, observations: np.ndarray) -> np.ndarray:
        """(batch, n_actions) float32 logits; observations are (batch, *observation_shape)."""
        if self._session is None:
            raise RuntimeError("load() a genome before the first forward pass")
        if observations.shape == self._single_input.shape:
            np.copyto(self._single_input, observations, casting="unsafe")
            self._session.run_with_iobinding(self._single)
            return self._single_output.copy()
        batch = np.ascontiguousarray(observations, dtype=np.float32)
        return self._session.run(None, {"observation": batch})[0]

    def model(self, weights: AtariWeights) -> Any:
        """The ONNX model of the pass over these weights; nodes are named by their output."""
        from onnx import TensorProto, helper, numpy_helper

        initializers = []

        def constant(name: str, array: np.ndarray) -> str:
            initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
            return name

        def node(op: str, inputs: list[str], output: str, **attributes: Any) -> str:
            nodes.append(helper.make_node(op, inputs, [output], name=output, **attributes))
            return output

        def bfloat16_values(x: str) -> str:
            return node("Cast", [node("Cast", [x], f"{x}_bf16", to=TensorProto.BFLOAT16)],
                        f"{x}_rounded", to=TensorProto.FLOAT)  # fmt: skip

        nodes: list[Any] = []
        x = "observation"
        layers = zip(weights.convs, self._strides, self._pads, strict=True)
        for index, ((weight, bias), stride, (left, right, top, bottom)) in enumerate(layers, 1):
            name = f"conv{index}"
            inputs = [x, constant(f"{name}.weight", weight), constant(f"{name}.bias", bias)]
            conv = node("Conv", inputs, name, strides=[stride, stride],
                        pads=[top, left, bottom, right])  # fmt: skip
            x = node("Relu", [conv], f"relu{index}")
            if self.dtype == "int8":
                x = bfloat16_values(x)
        x = node("Flatten", [x], "features", axis=1)
        if self.dtype == "int8":
            x = self._int8_dense(x, weights.fc, node, constant)
        else:
            weight, bias = weights.fc
            x = node("Gemm", [x, constant("fc.weight", weight), constant("fc.bias", bias)],
                     "fc", transB=1)  # fmt: skip
        x = node("Relu", [x], "hidden")
        weight, bias = weights.out
        node("Gemm", [x, constant("out.weight", weight), constant("out.bias", bias)], "logits",
             transB=1)  # fmt: skip
        n_actions = weights.out[0].shape[0]
        graph = helper.make_graph(
            nodes,
            "atari_net",
            [helper.make_tensor_value_info(
                "observation", TensorProto.FLOAT, ["batch", *self._observation_shape])],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", n_actions])],
            initializers,
        )  # fmt: skip
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)])
        model.ir_version = 8  # what every onnxruntime of the last years reads
        return model

    @staticmethod
    def _int8_dense(x: str, fc: tuple[np.ndarray, ...], node: Any, constant: Any) -> str:
        """x W^T + b with int8 W and x quantised per row to 7 bits over [0, max(x)]."""
        from onnx import TensorProto

        integers, row_scales, bias = fc
        peak = node("ReduceMax", [x], "fc_input_max", axes=[1], keepdims=1)
        levels = constant("levels", np.float32(_INT8_INPUT_LEVELS))
        raw_scale = node("Div", [peak, levels], "fc_input_scale_raw")
        scale = node("Max", [raw_scale, constant("min_scale", np.float32(_MIN_INPUT_SCALE))],
                     "fc_input_scale")  # fmt: skip
        # fbgemm multiplies by the scale's reciprocal (a division would round differently).
        scaled = node("Mul", [x, node("Reciprocal", [scale], "fc_input_inverse")], "fc_scaled")
        rounded = node("Round", [scaled], "fc_rounded")
        clipped = node("Clip", [rounded, constant("zero", np.float32(0)), levels], "fc_levels")
        quantised = node("Cast", [clipped], "fc_input_uint8", to=TensorProto.UINT8)
        sums = node("MatMulInteger", [quantised, constant("fc.integers", integers.T)], "fc_sums")
        sums_float = node("Cast", [sums], "fc_sums_float", to=TensorProto.FLOAT)
        output_scale = node("Mul", [scale, constant("fc.row_scales", row_scales)], "fc_out_scale")
        product = node("Mul", [sums_float, output_scale], "fc_product")
        return node("Add", [product, constant("fc.bias", bias)], "fc")
