"""The contract every inference engine keeps, run over the whole registry (the inference twin
of tests/master/algorithms/test_algorithm_contract.py): an engine is tested the day it is
registered.

For each engine and each combination the shared table says it serves here: it builds, loads a
genome, a reload changes its output and a second reload of the first genome gives the first
output back, the rows of a batch are the rows computed alone, it refuses by name what it does
not serve, and where its arithmetic is exact its outputs are recorded goldens.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import pytest
from torch import nn

from neuro.inference import (
    ALL_ARCHITECTURES,
    BATCHED,
    CPU,
    DEVICES,
    INFERENCE_DTYPES,
    INFERENCE_ENGINES,
    INT8_STATIC,
    MODULE_ARCHITECTURE,
    PER_GENOME,
    RUNNERS,
    TABLE,
    engine_row,
    engines_for,
)
from neuro.layout import ATARI_SHAPE, parameter_count
from neuro.policy_spec import user_policy
from worker.inference.base import Engine, NetSpec, NetWeights
from worker.inference.registry import ENGINES, select
from worker.inference.user_policy import module_spec

N_OUT = 6
MLP_SHAPE = (8,)
HIDDEN = (16, 16)
# Synthetic frames: the calibration and the observations are part of the test's input, so the
# goldens depend on nothing but the code (a game's frames would depend on ale-py's version).
FRAMES = np.random.default_rng(2026).integers(0, 256, (4, *ATARI_SHAPE), dtype=np.uint8)


@dataclass(frozen=True)
class Case:
    engine: Engine
    dtype: str
    architecture: str
    device: str

    @property
    def id(self) -> str:
        return f"{self.engine.name}-{self.architecture}-{self.dtype}-{self.device}"

    def spec(self) -> NetSpec:
        if self.architecture == MODULE_ARCHITECTURE:
            # A user's network: this module's own factory (a module path any process imports).
            return module_spec(
                user_policy(f"{__name__}:user_network"),
                gym.spaces.Box(-np.inf, np.inf, MLP_SHAPE, np.float32),
                gym.spaces.Discrete(N_OUT),
                self.dtype,
            )
        atari = self.architecture != "mlp"
        return NetSpec(
            self.architecture, ATARI_SHAPE if atari else MLP_SHAPE, N_OUT,
            () if atari else HIDDEN, self.dtype,
            FRAMES if self.dtype == INT8_STATIC else None,
        )  # fmt: skip


def user_network(observation_space: gym.Space, action_space: gym.Space) -> nn.Module:
    """A user's network as a factory returns it: a conv-free module of its own layer names."""
    return nn.Sequential(
        nn.Linear(MLP_SHAPE[0], HIDDEN[0]), nn.ELU(), nn.Linear(HIDDEN[0], int(action_space.n))
    )


def served_cases() -> list[Case]:
    """Every (engine, dtype, architecture, device) the table lists, whether it runs here or
    not (a case whose engine is missing here is skipped, saying why)."""
    return [
        Case(engine, dtype, architecture, device)
        for engine in ENGINES
        for dtype, architecture, device in itertools.product(
            INFERENCE_DTYPES, ALL_ARCHITECTURES, DEVICES
        )
        if engine.row.serves(dtype, architecture, engine.runner, device)
    ]


CASES = served_cases()


def genome(spec: NetSpec, seed: int) -> np.ndarray:
    """Three times the paper's init scale plus noise on the biases: outputs that are neither
    zero nor saturated."""
    rng = np.random.default_rng(seed)
    count = parameter_count(spec.layout)
    theta = rng.standard_normal(count) * spec.init_scale() * 3
    return (theta + rng.standard_normal(count) * 0.01).astype(np.float32)


def observations(spec: NetSpec, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if spec.observation_shape == ATARI_SHAPE:
        return rng.integers(0, 256, (count, *ATARI_SHAPE), dtype=np.uint8)
    return rng.standard_normal((count, *spec.observation_shape)).astype(np.float32)


class Built:
    """A case's pass, per-genome or batched, behind one call: load(theta), outputs(obs)."""

    def __init__(self, case: Case) -> None:
        missing = case.engine.available(case.device)
        if missing is not None:
            pytest.skip(f"{case.engine.name} does not run here: {missing}")
        self.case = case
        self.spec = case.spec()
        self.flat = np.zeros(parameter_count(self.spec.layout), np.float32)
        if case.engine.runner == PER_GENOME:
            self.forward = case.engine.forward(self.spec, NetWeights(self.flat, self.spec.layout))
            self.forward.load()
        else:
            self.grouped = case.engine.grouped(self.spec, 2, case.device)

    def load(self, theta: np.ndarray) -> None:
        if self.case.engine.runner == PER_GENOME:
            np.copyto(self.flat, theta)
            self.forward.load()
        else:
            self.grouped.load(0, theta)

    def outputs(self, obs: np.ndarray) -> np.ndarray:
        if self.case.engine.runner == PER_GENOME:
            return self.forward(obs)
        return self.grouped([0] * len(obs), obs)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_it_builds_loads_and_follows_every_load(case: Case) -> None:
    built = Built(case)
    obs = observations(built.spec, 8, seed=1)
    first, second = genome(built.spec, 1), genome(built.spec, 2)
    built.load(first)
    out = built.outputs(obs)
    assert out.dtype == np.float32 and out.shape == (len(obs), N_OUT)
    assert np.all(np.isfinite(out)) and np.abs(out).max() > 1e-3
    assert not np.array_equal(out[0], out[1])  # the observations matter
    built.load(second)
    assert not np.array_equal(built.outputs(obs), out)  # a reload changes the policy
    built.load(first)
    assert np.array_equal(built.outputs(obs), out)  # and nothing of it stays behind


# Engines whose rows are the same bits alone or in a batch; on the others a row differs from
# its batched self only in the order of a sum (BLAS picks other kernels for one row).
EXACT_ROWS = {"onnxruntime"}
ROW_TOLERANCE = {"bfloat16": 2e-2}


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_a_batchs_rows_are_the_rows_computed_alone(case: Case) -> None:
    built = Built(case)
    built.load(genome(built.spec, 3))
    obs = observations(built.spec, 6, seed=4)
    batched = built.outputs(obs)
    alone = np.concatenate([built.outputs(row[None]) for row in obs])
    if case.engine.name in EXACT_ROWS:
        assert np.array_equal(batched, alone)
    rtol = ROW_TOLERANCE.get(case.dtype, 1e-5)
    np.testing.assert_allclose(batched, alone, rtol=rtol, atol=rtol * np.abs(alone).max())


@pytest.mark.parametrize("engine", ENGINES, ids=lambda engine: engine.name)
def test_it_refuses_by_name_what_it_does_not_serve(engine: Engine) -> None:
    refused = 0
    # A per-genome engine builds on the CPU; the batched one on the device it is given.
    devices = (CPU,) if engine.runner == PER_GENOME else DEVICES
    for dtype, architecture, device in itertools.product(
        INFERENCE_DTYPES, ALL_ARCHITECTURES, devices
    ):
        if engine.row.serves(dtype, architecture, engine.runner, device):
            continue
        spec = Case(engine, dtype, architecture, device).spec()
        with pytest.raises(ValueError, match=rf"{engine.name!r} does not serve {architecture}"):
            if engine.runner == PER_GENOME:
                engine.forward(spec, NetWeights(np.zeros(1 << 23, np.float32)[
                    : parameter_count(spec.layout)], spec.layout))  # fmt: skip
            else:
                engine.grouped(spec, 2, device)
        refused += 1
    assert refused > 0  # every engine leaves something to another


def test_the_registry_serves_exactly_the_shared_table() -> None:
    """Each engine takes its row of the table in neuro/ (which the master checks runs against)
    by name: every row has exactly one registered engine, in the table's order of preference,
    and an engine without a row is refused by name."""
    assert [engine.row for engine in ENGINES] == list(TABLE)
    assert all(engine.row is engine_row(engine.name) for engine in ENGINES)
    assert tuple(e.name for e in ENGINES if e.runner == PER_GENOME) == INFERENCE_ENGINES
    with pytest.raises(ValueError, match="'tpu'"):
        engine_row("tpu")
    for dtype, architecture, runner, device in itertools.product(
        INFERENCE_DTYPES, ALL_ARCHITECTURES, RUNNERS, DEVICES
    ):
        if not engines_for(dtype, architecture, runner, device):
            with pytest.raises(ValueError, match=repr(dtype)):
                select(dtype, architecture, runner, device)


def test_the_registry_picks_the_preferred_engine_where_it_serves_and_says_which() -> None:
    assert select("int8", "deepga", prefer="torch").name == "torch"
    if ENGINES[0].available(CPU) is None:
        assert select("int8", "deepga", prefer="onnxruntime").name == "onnxruntime"
    # Where the preferred engine does not serve a dtype, the one that runs it is returned,
    # and the caller (Policy.inference_engine, the worker's log) records it.
    assert select("bfloat16", "deepga", prefer="onnxruntime").name == "torch"
    assert select("float32", "mlp", BATCHED, CPU).name == "torch-grouped"


# int8-static computes in integers up to its float32 output layer; this genome's output layer
# has one power-of-two weight per row, so each logit is one exact product plus its bias: the
# outputs are exact on every engine and CPU, and the same on both engines.
GOLDEN_INT8_STATIC = {
    "deepga": "9bbb6577ec23f5793ed954ea2c98f7bab0c5da8a23c2bca590e953d4639223c1",
    "nature": "f0cf0d286a0054f4c868cb04d4d23dd00645f509b871190fd56069aa5074d763",
}


def exact_output_genome(spec: NetSpec) -> np.ndarray:
    theta = genome(spec, 5)
    weights = NetWeights(theta, spec.layout)
    out_weight, out_bias = weights.layer("out")
    out_weight[:] = 0
    for row in range(len(out_weight)):
        out_weight[row, (97 * row) % out_weight.shape[1]] = 2.0 ** (row % 3 - 1)
    out_bias[:] = np.arange(len(out_bias), dtype=np.float32) / 4
    return theta


@pytest.mark.parametrize(
    "case",
    [case for case in CASES if case.dtype == INT8_STATIC],
    ids=lambda case: case.id,
)
def test_golden_exact_outputs(case: Case) -> None:
    built = Built(case)
    built.load(exact_output_genome(built.spec))
    out = built.outputs(observations(built.spec, 8, seed=6))
    assert np.abs(out).max() > 1e-2
    assert hashlib.sha256(out.tobytes()).hexdigest() == GOLDEN_INT8_STATIC[case.architecture]
