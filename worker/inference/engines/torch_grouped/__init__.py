"""The batched runner's engine: K individuals of one network in one grouped forward pass, on a
CPU or a CUDA device (grouped.py), float32 only."""

from __future__ import annotations

import importlib.util

from neuro.inference import CUDA, TORCH_GROUPED, device_kind, engine_row
from worker.inference.base import Engine, GroupedForward, NetSpec
from worker.inference.devices import resolve_device


def _available(device: str) -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "the batched runner needs torch (pip install 'neuro[worker]')"
    if device_kind(device) == CUDA:  # "cuda" or "cuda:N"
        try:
            resolve_device(device)
        except ValueError as error:  # no CUDA here, or not that many GPUs
            return str(error)
    return None


def _build(spec: NetSpec, capacity: int, device: str) -> GroupedForward:
    from worker.inference.engines.torch_grouped.grouped import BatchedPolicies

    return BatchedPolicies(spec, capacity, device)


ENGINE = Engine(engine_row(TORCH_GROUPED), _available, _build)
