"""The float32 parameters a spec names, other than by seeds (neuro/decode.py decodes those):
an ES perturbation of a fetched version, or a saved vector."""

from __future__ import annotations

import hashlib

import numpy as np

from neuro.noise import noise_offset


def perturbed_parameters(
    theta: np.ndarray, table: np.ndarray, noise_index: int, sign: int, sigma: float
) -> np.ndarray:
    """theta + sign * (sigma * eps(noise_index)) in float32, as the ES master defines it."""
    n = theta.size
    offset = noise_offset(noise_index, n, table.size)
    if sign == 0:
        return theta.copy()
    step = np.multiply(table[offset : offset + n], np.float32(sigma))
    return np.add(theta, np.multiply(step, np.float32(sign)))


def without_statistics(stored: np.ndarray, num_params: int, observation_size: int) -> np.ndarray:
    """The parameters of an ES vector that may end with observation mean and std; ValueError
    unless its length is exactly that."""
    if stored.size != num_params + 2 * observation_size:
        extra = f" + 2 x {observation_size} observation statistics" if observation_size else ""
        raise ValueError(
            f"ES parameters have {stored.size} values, expected {num_params} (the policy's)" + extra
        )
    return stored[:num_params]


def load_parameters_file(path: str, sha256: str | None = None) -> np.ndarray:
    """A saved float32 parameter vector, checked against its recorded sha256."""
    theta = np.load(path, allow_pickle=False)
    if theta.dtype != np.float32 or theta.ndim != 1:
        raise ValueError(f"{path}: expected a 1-D float32 array, got {theta.dtype} {theta.shape}")
    if sha256 is not None and hashlib.sha256(theta.tobytes()).hexdigest() != sha256:
        raise ValueError(f"{path}: sha256 does not match the genome file's")
    return theta
