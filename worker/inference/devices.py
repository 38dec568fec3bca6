"""Which device a worker's forward pass runs on, and which devices a --device value names."""

from __future__ import annotations

from collections import Counter

from neuro.inference import CPU, CUDA, device_kind

AUTO = "auto"


def resolve_device(device: str) -> str:
    """ "auto" -> "cuda" when torch sees a CUDA device, else "cpu"; "cpu", "cuda" and "cuda:N"
    as given where they are here. ValueError naming a device that is none of these, or that is
    not here (with how many CUDA devices torch sees)."""
    if device == AUTO:
        return CUDA if cuda_device_count() else CPU
    try:
        kind = device_kind(device)
    except ValueError:
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {device!r}") from None
    if kind == CPU:
        return CPU
    count = cuda_device_count()
    if not count:
        raise ValueError(f"device {device!r} asked for, but torch sees no CUDA device here")
    if device == CUDA:
        return CUDA
    index = int(device.partition(":")[2])
    if index >= count:
        raise ValueError(
            f"device {device!r} is not here: torch sees {count} CUDA device"
            f"{'s' if count > 1 else ''} (cuda:0 to cuda:{count - 1})"
        )
    return f"{CUDA}:{index}"  # "cuda:01" named as torch names it


def resolve_devices(value: str) -> tuple[str, ...]:
    """The devices a --device value names, one worker process each (worker/fanout.py).

    "auto" or "cuda" where torch sees G > 1 CUDA devices: every one of them, cuda:0 to
    cuda:G-1 (on one GPU, or none, the single device resolve_device gives). A comma list
    ("cuda:0,cuda:2", "cpu,cpu"): each entry resolved, "cuda" read as cuda:0; cpu may repeat
    (CPU workers on shares of the cores), a GPU may not. ValueError naming the value otherwise.
    """
    entries = [entry.strip() for entry in value.split(",")]
    if len(entries) == 1:
        device = resolve_device(entries[0])
        count = cuda_device_count() if device == CUDA else 0
        return tuple(f"{CUDA}:{i}" for i in range(count)) if count > 1 else (device,)
    if AUTO in entries or "" in entries:
        raise ValueError(
            f"device list {value!r}: name each device (cpu, cuda:N); auto and empty entries "
            "stand alone"
        )
    devices = tuple(f"{CUDA}:0" if d == CUDA else d for d in map(resolve_device, entries))
    twice = sorted(d for d, n in Counter(devices).items() if n > 1 and d != CPU)
    if twice:
        raise ValueError(
            f"device list {value!r} names {', '.join(twice)} more than once: one worker per GPU"
        )
    return devices


def cuda_device_count() -> int:
    """The CUDA devices torch sees here (0 where it sees none); imports torch only when asked."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
