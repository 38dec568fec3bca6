"""The parameters and observation normaliser a spec names: a genome's seeds (decoded, on the
host or a device), an ES perturbation of a fetched version, or a saved vector."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from neuro.layout import check_parameter_count, parameter_count
from neuro.noise import load_noise_table
from worker.evaluation.decoders import Decoders
from worker.evaluation.es_parameters import EsParameterStore
from worker.evaluation.parameters import (
    load_parameters_file,
    perturbed_parameters,
    without_statistics,
)
from worker.evaluation.spec import EvaluationSpec
from worker.inference.base import NetSpec
from worker.inference.policy import Policy


class ParameterResolver:
    """Resolves a spec to float32 parameters (and its normaliser) through the worker's decoders
    and fetched ES versions."""

    def __init__(
        self, decoders: Decoders, es_parameters: EsParameterStore, noise_cache_dir: str | None
    ) -> None:
        self._decoders = decoders
        self._es_parameters = es_parameters
        self._noise_cache_dir = noise_cache_dir

    def parameters(self, spec: EvaluationSpec, network: NetSpec) -> np.ndarray:
        """The flat parameters a spec names: a saved file, an ES perturbation or a genome."""
        num_params = parameter_count(network.layout)
        if spec.parameters_file is not None:
            saved = load_parameters_file(spec.parameters_file, spec.parameters_sha256)
            return without_statistics(saved, num_params, spec.observation_size)
        if spec.perturbation is not None:
            check_parameter_count(num_params, spec.noise_table.size)  # before building it
            version, index, sign, sigma = spec.perturbation
            fetched = self._es_parameters.get(version, spec.perturbation_run)
            theta = without_statistics(fetched, num_params, spec.observation_size)
            table = load_noise_table(spec.noise_table, self._noise_cache_dir)
            return perturbed_parameters(theta, table, index, sign, sigma)
        return self._decoders.decoder(spec, network).decode(spec.seeds)

    def device_parameters(self, spec: EvaluationSpec, network: NetSpec, device: str) -> Any:
        """parameters() as a float32 tensor on a torch device: a genome's seeds decoded there
        from a copy of the noise table kept on the device, so only the seeds cross to it;
        anything else through the host."""
        if spec.parameters_file is not None or spec.perturbation is not None:
            return self.parameters(spec, network)
        return self._decoders.device_decoder(spec, network, device).decode(spec.seeds)

    def observation_norm(
        self, spec: EvaluationSpec, network: NetSpec
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """(mean, std) the policy normalises observations with under `spec`; None: none."""
        if not spec.observation_size:
            return None
        # Checked before the episode: a normaliser of another size would fail mid-episode as a
        # broadcast error, and the observation sums reported would be of the wrong size.
        expected = math.prod(network.observation_shape)
        if spec.observation_size != expected:
            raise ValueError(
                f"observation_size {spec.observation_size} does not match {spec.env_id}, whose "
                f"observations have {expected} values (shape {network.observation_shape})"
            )
        if spec.parameters_file is not None:
            stored = load_parameters_file(spec.parameters_file, spec.parameters_sha256)
        elif spec.perturbation is not None:
            stored = self._es_parameters.get(spec.perturbation[0], spec.perturbation_run)
        else:
            raise ValueError("observation statistics come only with ES parameters")
        n, size = parameter_count(network.layout), spec.observation_size
        without_statistics(stored, n, size)  # checks the length
        mean, std = stored[n : n + size], stored[n + size :]
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(std)) and np.all(std > 0)):
            raise ValueError("ES observation statistics must be finite, with std > 0")
        return mean, std

    def load(self, spec: EvaluationSpec, policy: Policy) -> None:
        """Loads the parameters (and observation normaliser) `spec` names into `policy`; a
        spec refused here (ValueError) leaves the policy as it was."""
        norm = self.observation_norm(spec, policy.spec)
        policy.load_parameters(self.parameters(spec, policy.spec))
        policy.observation_norm = norm
