"""What runs where: inference dtypes, engines, runners and devices, and the one table of which
combinations a worker runs.

Both sides read this table, the one place an engine's capabilities are declared. The master
checks a run's dtype and network against it before the run starts (master/config.py) and asks
it whether its local workers may be the batched one (master/run/local_workers.py); each of the
worker's engines takes its row from here by name (engine_row), and its registry
(worker/inference/registry.py) serves exactly these rows, preferring them in the order below.

A combination runs when an engine's row lists its dtype, architecture, runner and device, and
the dtype itself works on that architecture (DTYPE_ARCHITECTURES: int8-static calibrates the
Atari nets' convolutions, which an mlp has none of).
"""

from __future__ import annotations

from dataclasses import dataclass

FLOAT32 = "float32"
BFLOAT16 = "bfloat16"
INT8 = "int8"
INT8_STATIC = "int8-static"
INFERENCE_DTYPES = (FLOAT32, BFLOAT16, INT8, INT8_STATIC)
"""Precisions a policy's forward pass may run in; decoding is always float32.

bfloat16: every layer but the output layer in bfloat16. int8: the hidden dense layers' weights
in int8 (one scale per output unit), their inputs quantised on each call; convolutions in
bfloat16; the output layer in float32. int8-static (Atari nets only): convolutions and dense
layer on 7-bit weights and 8-bit activations whose scales are calibrated per genome on fixed
frames of the game (worker/inference/int8_static.py)."""

ATARI_ARCHITECTURES = ("deepga", "nature")
MLP_ARCHITECTURE = "mlp"
ARCHITECTURES = (*ATARI_ARCHITECTURES, MLP_ARCHITECTURE)
"""The networks neuro ships (--policy deepga, nature or mlp)."""
MODULE_ARCHITECTURE = "module"
"""A user's torch module (--policy package.module:callable; neuro/policy_spec.py): only the
torch engine runs it, in float32, since the other engines know only the networks they build."""
ALL_ARCHITECTURES = (*ARCHITECTURES, MODULE_ARCHITECTURE)

PER_GENOME = "per-genome"
"""The CPU worker's runner: one genome at a time, its episodes batched (worker/runners)."""
BATCHED = "batched"
"""`neuro-worker --envs N` or a CUDA device: N tasks of different genomes, one grouped forward
pass a step."""
RUNNERS = (PER_GENOME, BATCHED)

CPU = "cpu"
CUDA = "cuda"
DEVICES = (CPU, CUDA)
"""The kinds of device the table speaks of; a worker may name one GPU of several as "cuda:N",
which the table reads as "cuda" (device_kind)."""

ONNXRUNTIME = "onnxruntime"
TORCH = "torch"
TORCH_GROUPED = "torch-grouped"

DTYPE_ARCHITECTURES: dict[str, tuple[str, ...]] = {
    FLOAT32: ALL_ARCHITECTURES,
    BFLOAT16: ARCHITECTURES,
    INT8: ARCHITECTURES,
    INT8_STATIC: ATARI_ARCHITECTURES,
}
"""The architectures each dtype is defined on, whatever the engine."""


@dataclass(frozen=True)
class EngineRow:
    """One engine's row of the table: what it serves."""

    engine: str
    runner: str
    dtypes: frozenset[str]
    architectures: frozenset[str]
    devices: frozenset[str]

    def serves(self, dtype: str, architecture: str, runner: str, device: str) -> bool:
        """Whether this engine runs a policy of this dtype and architecture here."""
        return (
            runner == self.runner
            and _kind_or_none(device) in self.devices
            and dtype in self.dtypes
            and architecture in self.architectures
            and architecture in DTYPE_ARCHITECTURES.get(dtype, ())
        )


TABLE: tuple[EngineRow, ...] = (
    # ONNX Runtime first: the same numbers as torch's passes up to the order of sums, and a
    # faster CPU pass (docs/performance.md, "The inference engine").
    EngineRow(
        ONNXRUNTIME,
        PER_GENOME,
        frozenset({FLOAT32, INT8, INT8_STATIC}),
        frozenset(ATARI_ARCHITECTURES),
        frozenset({CPU}),
    ),
    # Every network, a user's module included: it runs any torch module as it is.
    EngineRow(
        TORCH,
        PER_GENOME,
        frozenset(INFERENCE_DTYPES),
        frozenset(ALL_ARCHITECTURES),
        frozenset({CPU}),
    ),
    # Grouped convolutions and batched matmuls over K weight sets, float32 only: TF32 off, a
    # genome is the same policy as on a CPU worker up to the order of sums.
    EngineRow(
        TORCH_GROUPED,
        BATCHED,
        frozenset({FLOAT32}),
        frozenset(ARCHITECTURES),
        frozenset({CPU, CUDA}),
    ),
)
"""Every engine's row, in the order a worker prefers them."""

INFERENCE_ENGINES: tuple[str, ...] = tuple(row.engine for row in TABLE if row.runner == PER_GENOME)
"""The engines a worker's --inference-engine (NEURO_INFERENCE_ENGINE) may prefer, in the
table's order; the batched runner has one engine of its own (torch-grouped)."""


def engine_row(engine: str) -> EngineRow:
    """This engine's row of the table; ValueError naming it where it has none."""
    for row in TABLE:
        if row.engine == engine:
            return row
    raise ValueError(
        f"inference engine {engine!r} is not one of {', '.join(row.engine for row in TABLE)}"
    )


def device_kind(device: str) -> str:
    """The table's name for a device: "cpu" or "cuda", which "cuda:N" (GPU N) is too; ValueError
    naming any other value."""
    kind = _kind_or_none(device)
    if kind is None:
        raise ValueError(f"device {device!r} is not one of cpu, cuda or cuda:N (N: a GPU's index)")
    return kind


def _kind_or_none(device: str) -> str | None:
    if device in DEVICES:
        return device
    kind, _, index = device.partition(":")
    # ASCII digits only: str.isdigit also takes "²", which no device index is.
    if kind == CUDA and index.isascii() and index.isdigit():
        return CUDA
    return None


def engines_for(dtype: str, architecture: str, runner: str, device: str) -> tuple[str, ...]:
    """The engines that serve this combination, in the table's order (none: it does not run)."""
    return tuple(row.engine for row in TABLE if row.serves(dtype, architecture, runner, device))


def check_combination(
    dtype: str, architecture: str, runner: str | None = None, device: str | None = None
) -> None:
    """ValueError naming the value unless some engine serves this combination; a runner or
    device left None may be any."""
    _check_name("inference dtype", dtype, INFERENCE_DTYPES)
    _check_name("architecture", architecture, ALL_ARCHITECTURES)
    if runner is not None:
        _check_name("runner", runner, RUNNERS)
    if device is not None:
        device_kind(device)
    if architecture not in DTYPE_ARCHITECTURES[dtype]:
        defined = DTYPE_ARCHITECTURES[dtype]
        raise ValueError(
            f"inference dtype {dtype!r} runs on the {', '.join(defined)} nets, not "
            f"{architecture!r}: choose one of {', '.join(dtypes_for(architecture))}"
        )
    runners = RUNNERS if runner is None else (runner,)
    devices = DEVICES if device is None else (device,)
    if any(engines_for(dtype, architecture, r, d) for r in runners for d in devices):
        return
    where = " on ".join(part for part in (runner and f"the {runner} runner", device) if part)
    served = dtypes_for(architecture, runner, device)
    raise ValueError(
        f"inference dtype {dtype!r} does not run on {where}: it runs "
        f"{', '.join(served) or 'nothing'} there"
    )


def dtypes_for(
    architecture: str, runner: str | None = None, device: str | None = None
) -> tuple[str, ...]:
    """The dtypes some engine runs for this architecture (on this runner and device)."""
    runners = RUNNERS if runner is None else (runner,)
    devices = DEVICES if device is None else (device,)
    return tuple(
        dtype
        for dtype in INFERENCE_DTYPES
        if any(engines_for(dtype, architecture, r, d) for r in runners for d in devices)
    )


def default_dtype(architecture: str, runner: str) -> str:
    """The dtype a new run gets when none is given: int8-static for the Atari nets on the
    per-genome (CPU) runner, float32 elsewhere (the batched runner runs float32 only, and an
    mlp has no int8-static). Chosen by the learning study (docs/performance.md, "Choosing the
    Atari default"): at equal core-hours int8-static learned as well as float32 on Frostbite
    and Seaquest, and a CPU worker plays ~1.5x the frames per core-hour with it."""
    _check_name("architecture", architecture, ALL_ARCHITECTURES)
    _check_name("runner", runner, RUNNERS)
    if runner == PER_GENOME and architecture in DTYPE_ARCHITECTURES[INT8_STATIC]:
        return INT8_STATIC
    return FLOAT32


def batched_runs(dtype: str, architecture: str) -> bool:
    """Whether the batched runner (--envs, a CUDA device) runs this dtype and network."""
    return any(engines_for(dtype, architecture, BATCHED, device) for device in DEVICES)


def _check_name(what: str, value: str, known: tuple[str, ...]) -> None:
    if value not in known:
        raise ValueError(f"{what} {value!r} is not one of {', '.join(known)}")
