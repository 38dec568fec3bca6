"""A saved genome as a float32 policy outside training: what neuro.load_policy returns and
neuro-export writes.

A genome is read the way neuro-eval reads it (replay.load_genome_file) and built the way a
worker builds its policy (the Evaluator, on the genome's env's spaces), in float32: the exact
decode every inference dtype starts from. An int8-static genome therefore loads as its float32
weights, whose greedy actions may differ from the int8-static replay on some steps.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuro.inference import FLOAT32
from worker.evaluation.evaluator import Evaluator
from worker.evaluation.spec import EvaluationSpec
from worker.inference.policy import Policy
from worker.offline.replay import load_genome_file, resolve_genome_path
from worker.play.envs import build_env

if TYPE_CHECKING:
    from torch import nn

GenomeSource = str | os.PathLike | Mapping[str, Any] | Any
"""A genome file, a run dir (its best_genome.json), a genome document (a dict as the run dir's
files hold), or an object with a `best_genome_path` (neuro.train's Result)."""


@dataclass(frozen=True)
class LoadedGenome:
    """A genome's float32 policy, its parameters and observation normaliser loaded."""

    spec: EvaluationSpec
    """The genome as its file describes it (inference_dtype: the dtype it was trained in)."""
    policy: Policy
    """The float32 policy on `spec`'s env's spaces."""
    observation_space: Any
    action_space: Any


def genome_spec(genome: GenomeSource) -> EvaluationSpec:
    """The spec a genome file, run dir, document or Result describes; ValueError naming what
    cannot be read."""
    path = getattr(genome, "best_genome_path", None)
    if path is not None:
        return load_genome_file(path)
    if isinstance(genome, Mapping):
        return _document_spec(genome)
    if isinstance(genome, str | os.PathLike):
        return load_genome_file(resolve_genome_path(genome))
    raise TypeError(
        f"a genome is a file path, a run dir, a genome document or a training Result, "
        f"not {type(genome).__name__}"
    )


def _document_spec(document: Mapping[str, Any]) -> EvaluationSpec:
    """A genome document's spec, read by the one reader of genome files."""
    parameters = document.get("parameters")
    if isinstance(parameters, Mapping) and not Path(str(parameters.get("file"))).is_absolute():
        raise ValueError(
            f"this genome document names its parameters by the relative path "
            f"{parameters.get('file')!r}: pass the genome file's path (the .npy sits beside it)"
        )
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "genome.json"
        path.write_text(json.dumps(dict(document)))
        return load_genome_file(path)


def load_genome(
    genome: GenomeSource, inference_engine: str | None = None, evaluator: Evaluator | None = None
) -> LoadedGenome:
    """The genome's float32 policy on its env's spaces, as a worker builds and loads it.

    `inference_engine`: the engine to prefer (None: a worker's default, as neuro-eval)."""
    spec = genome_spec(genome)
    evaluator = evaluator or Evaluator(inference_engine=inference_engine)
    played = dataclasses.replace(spec, inference_dtype=FLOAT32)
    handle = build_env(spec.env_id, spec.atari_dynamics)
    try:
        env = handle.env
        policy = evaluator.build_policy(played, handle)
        evaluator.load(played, policy)
        return LoadedGenome(spec, policy, env.observation_space, env.action_space)
    finally:
        handle.env.close()


def load_policy(genome: GenomeSource) -> nn.Module:
    """A genome as a torch module with its float32 weights: module(observations) is the
    network's outputs (observation normaliser included), module.act(observations) the greedy
    actions neuro-eval plays; module.network is the bare network, its state_dict the genome's
    parameters in their layout (what neuro-export's .safetensors file holds)."""
    from worker.offline.policy_module import PolicyModule

    loaded = load_genome(genome, inference_engine="torch")
    return PolicyModule.of(loaded.policy)
