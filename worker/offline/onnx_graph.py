"""A loaded genome as one ONNX model: observation -> (normaliser) -> network -> logits, and the
greedy action head -> action.

The Atari nets are the onnxruntime engine's own float32 graph (the pass neuro-eval runs on a
CPU where onnxruntime is installed), so the exported file computes the same logits to the bit;
the mlp is the same Gemm and Tanh layers the torch engine computes; a user's module is traced
by torch's exporter. The normaliser and the action head are the worker's float32 operations
(neuro.observation_stats.normalise, worker/inference/actions.py) written as ONNX nodes.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

from neuro.inference import ATARI_ARCHITECTURES, FLOAT32, MLP_ARCHITECTURE
from neuro.observation_stats import CLIP
from worker.inference.engines.onnx_runtime.atari import AtariWeights, OnnxAtariForward
from worker.inference.engines.onnx_runtime.session import OPSET, Graph
from worker.offline.loading import LoadedGenome

INPUT = "observation"
"""The model's input: (batch, *observation shape) float32, the observation as the env gives it
(Atari: the preprocessed 4 x 84 x 84 frames, values 0-255)."""
LOGITS = "logits"
"""The network's (batch, outputs) float32 outputs."""
ACTION = "action"
"""The greedy action of each row: int64 for a Discrete space, the box's dtype for a Box."""
_NETWORK_INPUT = "network_input"


def onnx_model(loaded: LoadedGenome) -> ModelProto:
    """The genome's policy as an ONNX model with inputs INPUT and outputs LOGITS and ACTION."""
    policy = loaded.policy
    spec = policy.spec
    if spec.architecture in ATARI_ARCHITECTURES:
        weights = AtariWeights.of(policy.weights, FLOAT32)
        model = OnnxAtariForward(spec, policy.weights).model(weights)
    elif spec.architecture == MLP_ARCHITECTURE:
        model = _mlp_model(policy.weights, spec.observation_shape, spec.n_outputs)
    else:
        model = _traced_model(loaded)
    graph = model.graph
    if policy.observation_norm is not None:
        _normalise_input(graph, *policy.observation_norm, spec.observation_shape)
    _add_action_head(graph, loaded.action_space)
    model.graph.name = f"neuro_{spec.architecture}"
    return model


def _mlp_model(weights: Any, observation_shape: tuple[int, ...], n_outputs: int) -> ModelProto:
    """The mlp as the torch engine computes it: flatten, tanh(x W^T + b) per hidden layer, then
    the output layer."""
    graph = Graph()
    x = graph.node("Flatten", [INPUT], "flat", axis=1)
    layers = [name.removesuffix(".weight") for name in weights if name.endswith(".weight")]
    for index, layer in enumerate(layers):
        weight, bias = weights.layer(layer)
        inputs = [
            x,
            graph.constant(f"{layer}.weight", weight),
            graph.constant(f"{layer}.bias", bias),
        ]
        last = index == len(layers) - 1
        x = graph.node("Gemm", inputs, LOGITS if last else layer, transB=1)
        if not last:
            x = graph.node("Tanh", [x], f"{layer}.tanh")
    return graph.model("mlp", (TensorProto.FLOAT, observation_shape), n_outputs)


def _traced_model(loaded: LoadedGenome) -> ModelProto:
    """A user's torch module, traced by torch's exporter from INPUT to LOGITS."""
    import io

    import onnx
    import torch

    from worker.offline.policy_module import PolicyModule

    network = PolicyModule.of(loaded.policy).network
    example = torch.zeros((1, *loaded.policy.observation_shape), dtype=torch.float32)
    buffer = io.BytesIO()
    try:
        # The TorchScript exporter, chosen: torch's default one needs onnxscript, which the
        # worker extra does not bring; torch says it is deprecated, which is known here.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.onnx.export(
                network, (example,), buffer, input_names=[INPUT], output_names=[LOGITS],
                dynamic_axes={INPUT: {0: "batch"}, LOGITS: {0: "batch"}}, opset_version=OPSET,
                dynamo=False,
            )  # fmt: skip
    except Exception as error:  # the user's module: whatever torch cannot trace is named
        name = loaded.spec.policy.factory if loaded.spec.policy else loaded.spec.architecture
        raise ValueError(
            f"torch cannot export {name}'s module to ONNX ({type(error).__name__}: {error}); "
            "--format safetensors writes its parameters whatever the module does"
        ) from error
    return onnx.load_from_string(buffer.getvalue())


def _normalise_input(
    graph: Any, mean: np.ndarray, std: np.ndarray, observation_shape: tuple[int, ...]
) -> None:
    """clip((x - mean) / std, +-CLIP) over the flattened observation, before the network."""
    for node in graph.node:
        node.input[:] = [_NETWORK_INPUT if name == INPUT else name for name in node.input]
    constants = {
        "observation_mean": np.asarray(mean, np.float32),
        "observation_std": np.asarray(std, np.float32),
        "clip_low": np.float32(-CLIP),
        "clip_high": np.float32(CLIP),
        "observation_shape": np.array([-1, *observation_shape], np.int64),
    }
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in constants.items())
    nodes = [
        ("Flatten", [INPUT], "observation_flat", {"axis": 1}),
        ("Sub", ["observation_flat", "observation_mean"], "observation_centred", {}),
        ("Div", ["observation_centred", "observation_std"], "observation_scaled", {}),
        ("Clip", ["observation_scaled", "clip_low", "clip_high"], "observation_clipped", {}),
        ("Reshape", ["observation_clipped", "observation_shape"], _NETWORK_INPUT, {}),
    ]
    made = [helper.make_node(op, inputs, [out], name=out, **attrs)
            for op, inputs, out, attrs in nodes]  # fmt: skip
    # Before the network's: a graph lists its nodes in the order they run.
    network = list(graph.node)
    del graph.node[:]
    graph.node.extend([*made, *network])


def _add_action_head(graph: Any, action_space: Any) -> None:
    """ACTION from LOGITS: argmax (the lowest index on ties) + start for a Discrete space, the
    tanh squashed to [low, high] for a Box (worker/inference/actions.py)."""
    if isinstance(action_space, gym.spaces.Discrete):
        start = int(action_space.start)
        index = ACTION if not start else "action_index"
        nodes = [helper.make_node("ArgMax", [LOGITS], [index], name=index, axis=1, keepdims=0)]
        if start:
            graph.initializer.append(numpy_helper.from_array(np.int64(start), "action_start"))
            nodes.append(helper.make_node("Add", [index, "action_start"], [ACTION], name=ACTION))
        graph.node.extend(nodes)
        graph.output.append(helper.make_tensor_value_info(ACTION, TensorProto.INT64, ["batch"]))
        return
    if not isinstance(action_space, gym.spaces.Box):
        raise ValueError(f"no action head for {action_space}")
    low = action_space.low.astype(np.float32).ravel()
    high = action_space.high.astype(np.float32).ravel()
    dtype = np.dtype(action_space.dtype)
    constants = {
        "one": np.float32(1.0),
        "half": np.float32(0.5),
        "action_low": low,
        "action_range": high - low,
        "action_shape": np.array([-1, *action_space.shape], np.int64),
    }
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in constants.items())
    nodes = [
        ("Tanh", [LOGITS], "action_tanh", {}),
        ("Add", ["action_tanh", "one"], "action_shifted", {}),
        ("Mul", ["action_shifted", "half"], "action_unit", {}),
        ("Mul", ["action_unit", "action_range"], "action_scaled", {}),
        ("Add", ["action_low", "action_scaled"], "action_flat", {}),
        ("Reshape", ["action_flat", "action_shape"], "action_float", {}),
        ("Cast", ["action_float"], ACTION, {"to": helper.np_dtype_to_tensor_dtype(dtype)}),
    ]
    graph.node.extend(helper.make_node(op, inputs, [out], name=out, **attrs)
                      for op, inputs, out, attrs in nodes)  # fmt: skip
    element = helper.np_dtype_to_tensor_dtype(dtype)
    shape = ["batch", *action_space.shape]
    graph.output.append(helper.make_tensor_value_info(ACTION, element, shape))


def check_model(model: ModelProto) -> None:
    """onnx's own checker over the model (ValueError naming what it finds)."""
    import onnx

    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.checker.ValidationError as error:
        raise ValueError(f"the exported ONNX model does not check: {error}") from None


def model_actions(path: str | os.PathLike) -> Callable[[np.ndarray], np.ndarray]:
    """An exported ONNX file's greedy actions of a batch of observations, on ONNX Runtime."""
    import onnx

    from worker.inference.engines.onnx_runtime.session import session

    run = session(onnx.load(str(path))).run

    def actions(observations: np.ndarray) -> np.ndarray:
        feed = {INPUT: np.ascontiguousarray(observations, dtype=np.float32)}
        return run([ACTION], feed)[0]

    return actions
