"""What both ONNX Runtime passes share: the session, the graph builder and the one-observation
I/O binding."""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np

OPSET = 17
IR_VERSION = 8
"""What every onnxruntime of the last years reads."""


def installed() -> bool:
    """Whether onnxruntime and onnx can be imported here."""
    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "onnx"))


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


class Graph:
    """An ONNX graph being written: constants and nodes, each named by its output."""

    def __init__(self) -> None:
        self.initializers: list[Any] = []
        self.nodes: list[Any] = []

    def constant(self, name: str, array: Any) -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(self, op: str, inputs: list[str], output: str, **attributes: Any) -> str:
        from onnx import helper

        self.nodes.append(helper.make_node(op, inputs, [output], name=output, **attributes))
        return output

    def model(
        self,
        name: str,
        observation: tuple[int, tuple[Any, ...]],
        n_outputs: int,
        microsoft_ops: bool = False,
    ) -> Any:
        """The model of a pass from "observation" (element type, shape after the batch axis)
        to "logits" (batch, n_outputs) float32."""
        from onnx import TensorProto, helper

        element_type, shape = observation
        graph = helper.make_graph(
            self.nodes,
            name,
            [helper.make_tensor_value_info("observation", element_type, ["batch", *shape])],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", n_outputs])],
            self.initializers,
        )
        opsets = [helper.make_opsetid("", OPSET)]
        if microsoft_ops:
            opsets.append(helper.make_opsetid("com.microsoft", 1))
        model = helper.make_model(graph, opset_imports=opsets)
        model.ir_version = IR_VERSION
        return model


class BoundSession:
    """A session and an I/O binding of its "observation" to a kept one-observation buffer and
    its "logits" to a kept (1, n_outputs) one: an offspring's step copies into them instead of
    building the call's arguments (0.45 -> 0.42 ms a step, int8, stepping Frostbite on one Zen
    3 core). A forward pass keeps `run_single`, `binding` and `single_output` as its own
    attributes at each load, so a step looks nothing up through this object."""

    def __init__(self, model: Any, single_input: np.ndarray, n_outputs: int) -> None:
        self.session = session(model)
        self.single_output = np.zeros((1, n_outputs), dtype=np.float32)
        self.binding = self.session.io_binding()
        self.binding.bind_cpu_input("observation", single_input)
        self.binding.bind_output("logits", "cpu", 0, np.float32, [1, n_outputs],
                                 self.single_output.ctypes.data)  # fmt: skip
        self.run_single = self.session.run_with_iobinding

    def batch(self, observations: np.ndarray) -> np.ndarray:
        """(batch, n_outputs) logits of a batch, through the session's own arguments."""
        return self.session.run(None, {"observation": observations})[0]
