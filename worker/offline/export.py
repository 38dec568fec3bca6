"""neuro-export's work: a genome as a standard model file (ONNX or safetensors), with the
observation preprocessing and the action rule it expects written beside it as JSON.

The model is the genome's float32 policy (loading.py): the ONNX file takes the observation and
gives the logits and the greedy action (the normaliser and the action head inside, onnx_graph.py);
the safetensors file holds the network's parameters by their layout names, and the JSON says
how to run them. An int8-static (or int8, bfloat16) genome exports its float32 weights: the
greedy actions then equal those of a float32 replay, and may differ from its own dtype's
replay on some steps.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym

from neuro.envs.make import (
    FRAME_STACK,
    PAPER,
    PAPER_FRAME_SKIP,
    PAPER_NOOP_MAX,
    SCREEN_SIZE,
    atari_game,
)
from neuro.inference import ATARI_ARCHITECTURES, FLOAT32, MLP_ARCHITECTURE
from neuro.layout import ATARI_CONVS, ATARI_HIDDEN, atari_conv_pads
from neuro.observation_stats import CLIP
from worker.offline.loading import GenomeSource, LoadedGenome, load_genome

EXPORT_FORMAT = "neuro.export/1"
"""The preprocessing document's format (its "format" key)."""
ONNX = "onnx"
SAFETENSORS = "safetensors"
FORMATS = (ONNX, SAFETENSORS)
SUFFIXES = {ONNX: ".onnx", SAFETENSORS: ".safetensors"}


@dataclass(frozen=True)
class Exported:
    """The files an export wrote."""

    model: Path
    preprocessing: Path
    """The JSON beside the model: MODEL_FILE.json."""
    document: dict[str, Any]
    """What the JSON holds."""


def preprocessing_path(model: str | os.PathLike) -> Path:
    """Where the preprocessing document of a model file goes: beside it, MODEL_FILE.json."""
    model = Path(model)
    return model.with_name(model.name + ".json")


def default_model_path(genome: GenomeSource, model_format: str) -> Path:
    """A genome file's path with the format's suffix (a run dir: its best_genome's)."""
    from worker.offline.replay import resolve_genome_path

    if not isinstance(genome, str | os.PathLike):
        raise ValueError("name the model file (out=...): the genome was not given as a file")
    return resolve_genome_path(genome).with_suffix(SUFFIXES[model_format])


def export_genome(
    genome: GenomeSource, model_format: str, out: str | os.PathLike | None = None
) -> Exported:
    """Writes the genome's float32 policy as `model_format` to `out` (default: beside the
    genome file, with the format's suffix) and its preprocessing document beside it."""
    if model_format not in FORMATS:
        raise ValueError(f"export format must be one of {', '.join(FORMATS)}, got {model_format!r}")
    path = Path(out) if out is not None else default_model_path(genome, model_format)
    loaded = load_genome(genome)
    if model_format == ONNX:
        from worker.offline.onnx_graph import check_model, onnx_model

        model = onnx_model(loaded)
        check_model(model)
        data = model.SerializeToString()
    else:
        from safetensors.numpy import save

        weights = loaded.policy.weights
        data = save({name: weights[name].copy() for name in weights},
                    metadata={"format": EXPORT_FORMAT})  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    document = preprocessing_document(loaded, path.name, model_format, data)
    written = preprocessing_path(path)
    written.write_text(json.dumps(document, indent=2) + "\n")
    return Exported(path, written, document)


def preprocessing_document(
    loaded: LoadedGenome, file_name: str, model_format: str, data: bytes
) -> dict[str, Any]:
    """What a model file expects and gives: the observation and its preprocessing, the
    normaliser, the network, the action rule; `in_model` says which the file computes."""
    from worker.offline.onnx_graph import ACTION, INPUT, LOGITS

    spec, policy = loaded.spec, loaded.policy
    in_model = model_format == ONNX
    model: dict[str, Any] = {"file": file_name, "format": model_format,
                             "sha256": hashlib.sha256(data).hexdigest()}  # fmt: skip
    if in_model:
        model.update(input=INPUT, input_dtype="float32", outputs=[LOGITS, ACTION])
    else:
        model["tensors"] = [name for name, _ in policy.parameter_layout]
    genome = {
        "env_id": spec.env_id,
        "atari_dynamics": spec.atari_dynamics if spec.architecture in ATARI_ARCHITECTURES else None,
        "architecture": spec.architecture,
        "hidden_sizes": list(policy.spec.hidden_sizes),
        "trained_dtype": spec.inference_dtype,
        "exported_dtype": FLOAT32,
    }
    if spec.policy is not None:
        genome["policy"] = {"factory": spec.policy.factory, "options": spec.policy.options}
    if spec.inference_dtype != FLOAT32:
        genome["note"] = (
            f"the genome was trained and is replayed in {spec.inference_dtype}; this file holds "
            "its float32 weights, whose greedy actions may differ from that replay's on some "
            "steps"
        )
    normaliser = None
    if policy.observation_norm is not None:
        mean, std = policy.observation_norm
        normaliser = {
            "formula": "clip((x - mean) / std, -clip, clip), float32, over the flattened "
            "observation",
            "mean": mean.tolist(),
            "std": std.tolist(),
            "clip": CLIP,
            "in_model": in_model,
        }
    return {
        "format": EXPORT_FORMAT,
        "model": model,
        "genome": genome,
        "observation": {
            "shape": list(policy.observation_shape),
            "dtype": str(loaded.observation_space.dtype),
            "preprocessing": observation_preprocessing(
                spec.env_id, spec.atari_dynamics, spec.architecture
            ),
        },
        "observation_normaliser": normaliser,
        "network": network_description(loaded),
        "action": action_rule(loaded.action_space, in_model),
    }


def observation_preprocessing(
    env_id: str, dynamics: str, architecture: str
) -> dict[str, Any] | None:
    """How the env's raw frames become the observation (neuro.envs.make builds it so); None
    where the env's observation goes in as it is."""
    if architecture not in ATARI_ARCHITECTURES:
        return None
    make = f"neuro.envs.make.make_env({env_id!r}, {dynamics!r})"
    if dynamics == PAPER:
        steps = [
            {"step": "emulator", "game": atari_game(env_id), "obs_type": "rgb", "frameskip": 1,
             "repeat_action_probability": 0.0, "full_action_space": False},
            {"step": "noop_reset", "max_noops": PAPER_NOOP_MAX},
            {"step": "frame_skip", "frames": PAPER_FRAME_SKIP,
             "max_pool": "pixel-wise max of the last two frames"},
            {"step": "grayscale"},
            {"step": "resize", "height": SCREEN_SIZE, "width": SCREEN_SIZE,
             "interpolation": "area (OpenCV INTER_AREA)"},
            {"step": "fire_on_reset", "when": "the game's actions include FIRE"},
            {"step": "frame_stack", "frames": FRAME_STACK, "order": "oldest first"},
        ]  # fmt: skip
    else:
        steps = [
            {"step": "emulator", "env_id": env_id, "obs_type": "grayscale",
             "dynamics": "the registered env's own"},
            {"step": "resize", "height": SCREEN_SIZE, "width": SCREEN_SIZE,
             "interpolation": "area (OpenCV INTER_AREA)"},
            {"step": "frame_stack", "frames": FRAME_STACK, "order": "oldest first"},
        ]  # fmt: skip
    return {
        "atari_dynamics": dynamics,
        "steps": steps,
        "values": "uint8 0-255, not scaled: the network divides by 255 itself",
        "built_by": make,
    }


def network_description(loaded: LoadedGenome) -> dict[str, Any]:
    """The network's layers in the order they run, and its parameters in the genome's layout."""
    spec = loaded.policy.spec
    parameters = [[name, list(shape)] for name, shape in loaded.policy.parameter_layout]
    described: dict[str, Any] = {"architecture": spec.architecture}
    if spec.architecture in ATARI_ARCHITECTURES:
        layers: list[dict[str, Any]] = [
            {"op": "scale", "by": "1/255", "note": "the ONNX graph folds it into conv1's weights"}
        ]
        convs = zip(ATARI_CONVS, atari_conv_pads(spec.architecture), strict=True)
        for index, ((channels, kernel, stride), pads) in enumerate(convs, 1):
            layers.append(
                {
                    "op": "conv2d",
                    "name": f"conv{index}",
                    "out_channels": channels,
                    "kernel": kernel,
                    "stride": stride,
                    "pads_left_right_top_bottom": list(pads),
                    "activation": "relu",
                }
            )
        layers += [
            {"op": "flatten", "order": "channel, height, width"},
            {"op": "linear", "name": "fc", "out_features": ATARI_HIDDEN, "activation": "relu"},
            {"op": "linear", "name": "out", "out_features": spec.n_outputs},
        ]  # fmt: skip
        described["layers"] = layers
    elif spec.architecture == MLP_ARCHITECTURE:
        layers = [{"op": "flatten"}]
        for index, size in enumerate(spec.hidden_sizes):
            layers.append({"op": "linear", "name": f"hidden.{index}", "out_features": size,
                           "activation": "tanh"})  # fmt: skip
        layers.append({"op": "linear", "name": "out", "out_features": spec.n_outputs})
        described["layers"] = layers
    if spec.policy is not None:
        described["module"] = (
            f"{spec.policy.factory}(observation_space, action_space, **options) builds it; its "
            "state_dict holds these parameters"
        )
    else:
        described["linear"] = "y = x W^T + b, W of shape (out_features, in_features)"
    described["parameters"] = parameters
    return described


def action_rule(action_space: Any, in_model: bool) -> dict[str, Any]:
    """How the network's outputs become the env's action (worker/inference/actions.py)."""
    if isinstance(action_space, gym.spaces.Discrete):
        return {"rule": "argmax", "n": int(action_space.n), "start": int(action_space.start),
                "ties": "the lowest index", "in_model": in_model}  # fmt: skip
    return {
        "rule": "tanh",
        "formula": "low + (tanh(y) + 1) / 2 * (high - low), float32, reshaped to shape",
        "low": action_space.low.astype("float32").ravel().tolist(),
        "high": action_space.high.astype("float32").ravel().tolist(),
        "shape": list(action_space.shape),
        "dtype": str(action_space.dtype),
        "in_model": in_model,
    }
