"""What a task asks a worker to score, and the keys that say which genome and which network.

A task off the wire (worker/client/wire.py) or a genome file (worker/offline/replay.py) becomes an
EvaluationSpec; every cache of the worker is keyed by one of its three keys, defined here
once: a built policy fits every spec of its `network_key`, specs of one `genome_key` play the
same parameters (an elite's episodes share one loaded policy), and one decoder (and parent
cache) serves every spec of a `decoder_key`.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuro.envs.make import PAPER
from neuro.inference import FLOAT32
from neuro.noise import NoiseTableSpec
from neuro.policy_spec import UserPolicy


@dataclass(frozen=True)
class NetworkKey:
    """Which built policy fits a spec: its network, env and dtype."""

    architecture: str
    hidden_sizes: tuple[int, ...]
    env_id: str
    atari_dynamics: str
    inference_dtype: str
    policy: UserPolicy | None = None


@dataclass(frozen=True)
class GenomeKey:
    """Which individual a spec plays: specs of one key play the same parameters."""

    network: NetworkKey
    noise_table: NoiseTableSpec
    mutation_power: float
    seeds: tuple[int, ...]
    perturbation: tuple[int, int, int, float] | None
    parameters_file: str | None
    perturbation_run: str = ""


@dataclass(frozen=True)
class DecoderKey:
    """Which decoder (noise table, sigma, network shape) turns a spec's seeds into parameters."""

    noise_table: NoiseTableSpec
    mutation_power: float
    architecture: str
    hidden_sizes: tuple[int, ...]
    env_id: str
    atari_dynamics: str
    policy: UserPolicy | None = None


@dataclass(frozen=True)
class EvaluationSpec:
    """Everything needed to score a genome; a task off the wire becomes one of these."""

    env_id: str
    seeds: tuple[int, ...]
    mutation_power: float
    noise_table: NoiseTableSpec
    architecture: str
    hidden_sizes: tuple[int, ...] = ()
    atari_dynamics: str = PAPER
    episodes: int = 1
    max_episode_steps: int = 0
    env_seed: int | None = None
    perturbation: tuple[int, int, int, float] | None = None
    """ES: (version, noise index, sign, sigma) applied to the fetched parameters of version."""
    parameters_file: str | None = None
    """A saved parameter vector (.npy) to play instead of decoding `seeds`."""
    parameters_sha256: str | None = None
    inference_dtype: str = FLOAT32
    """Precision of the forward pass after the float32 decode (neuro/inference.py)."""
    behaviour_size: int = 0
    """> 0: each episode reports its behaviour characterisation of this many values."""
    observation_size: int = 0
    """ES with observation normalisation: the fetched version ends with the observation mean
    and std (this many values each), and the task reports its observations' sums."""
    policy: UserPolicy | None = None
    """A user's network (architecture "module"): its factory and options."""
    perturbation_run: str = ""
    """ES: the run whose parameter version the perturbation applies to (a master serving
    several runs numbers each one's versions from 0); "": the master's only run, or none."""

    @property
    def network_key(self) -> NetworkKey:
        return NetworkKey(self.architecture, self.hidden_sizes, self.env_id,
                          self.atari_dynamics, self.inference_dtype, self.policy)  # fmt: skip

    @property
    def genome_key(self) -> GenomeKey:
        return GenomeKey(self.network_key, self.noise_table, self.mutation_power, self.seeds,
                         self.perturbation, self.parameters_file,
                         self.perturbation_run)  # fmt: skip

    @property
    def decoder_key(self) -> DecoderKey:
        return DecoderKey(self.noise_table, self.mutation_power, self.architecture,
                          self.hidden_sizes, self.env_id, self.atari_dynamics,
                          self.policy)  # fmt: skip
