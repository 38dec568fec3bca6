"""Every inference engine, and the one place that picks the engine a policy runs on.

Adding an engine is its row in the shared table (neuro/inference.py: what it serves, and where
it stands in the order of preference), a file or folder under engines/ exporting
ENGINE = Engine(engine_row(name), available, build), and its line below;
tests/worker/inference/test_engine_contract.py runs it through the contract the day it is
registered.
"""

from __future__ import annotations

import os

from neuro.inference import CPU, INFERENCE_ENGINES, PER_GENOME, TABLE, check_combination
from worker.inference.base import Engine
from worker.inference.engines import onnx_runtime, torch_cpu, torch_grouped

_REGISTERED = (onnx_runtime.ENGINE, torch_cpu.ENGINE, torch_grouped.ENGINE)

ENGINES: tuple[Engine, ...] = tuple(sorted(_REGISTERED, key=lambda entry: TABLE.index(entry.row)))
"""In the order a worker prefers them: the shared table's."""

__all__ = ["ENGINES", "check_preference", "engine", "preferred_engine", "select"]


def engine(name: str) -> Engine:
    """The registered engine of this name; ValueError naming it otherwise."""
    for entry in ENGINES:
        if entry.name == name:
            return entry
    raise ValueError(
        f"inference engine {name!r} is not one of {', '.join(e.name for e in ENGINES)}"
    )


def check_preference(name: str) -> str:
    """`name` if a worker may prefer it (--inference-engine) and it runs here; ValueError
    naming it otherwise."""
    if name not in INFERENCE_ENGINES:
        raise ValueError(f"inference engine {name!r} is not one of {', '.join(INFERENCE_ENGINES)}")
    missing = engine(name).available(CPU)
    if missing is not None:
        raise ValueError(missing)
    return name


def preferred_engine() -> str:
    """NEURO_INFERENCE_ENGINE if set, else the first per-genome engine in the table's order
    that runs here (onnxruntime where it is installed, else torch); where none does, the first,
    which check_preference refuses saying what to install."""
    chosen = os.environ.get("NEURO_INFERENCE_ENGINE")
    if chosen:
        return chosen
    for name in INFERENCE_ENGINES:
        if engine(name).available(CPU) is None:
            return name
    return INFERENCE_ENGINES[0]


def select(
    dtype: str,
    architecture: str,
    runner: str = PER_GENOME,
    device: str = CPU,
    prefer: str | None = None,
) -> Engine:
    """The engine a policy of this dtype and architecture runs on: `prefer` where it serves
    them and runs here, else the first that does. ValueError naming the value where the table
    has no such combination, or naming what is missing where no engine that serves it runs
    here. The caller records which engine it got (Policy.inference_engine)."""
    check_combination(dtype, architecture, runner, device)
    serving = [e for e in ENGINES if e.row.serves(dtype, architecture, runner, device)]
    usable = [e for e in serving if e.available(device) is None]
    for entry in usable:
        if entry.name == prefer:
            return entry
    if usable:
        return usable[0]
    reasons = "; ".join(f"{e.name}: {e.available(device)}" for e in serving)
    raise ValueError(
        f"no inference engine runs {architecture} {dtype} on the {runner} runner on {device} "
        f"here ({reasons})"
    )
