"""Which device a worker's forward pass runs on."""

from __future__ import annotations

from neuro.inference import CPU, CUDA, DEVICES

AUTO = "auto"


def resolve_device(device: str) -> str:
    """ "auto" -> "cuda" when torch sees a CUDA device, else "cpu"; ValueError naming a device
    that is neither or that is not here."""
    if device not in (AUTO, *DEVICES):
        raise ValueError(f"device must be auto, cpu or cuda, got {device!r}")
    if device == CPU:
        return CPU
    import torch  # only asking about CUDA costs its import

    if device == AUTO:
        return CUDA if torch.cuda.is_available() else CPU
    if not torch.cuda.is_available():
        raise ValueError("device 'cuda' asked for, but torch sees no CUDA device here")
    return device
