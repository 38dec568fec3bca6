"""The master's whole state on disk: atomic, checksummed, with the previous one kept.

checkpoint.json holds {"format", "sha256", "payload"}; the checksum covers the payload's
canonical JSON, so a truncated or bit-flipped file is detected and the previous good one
(checkpoint.prev.json) is used instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)
CHECKPOINT_FORMAT = "neuro.checkpoint/1"
CURRENT = "checkpoint.json"
PREVIOUS = "checkpoint.prev.json"


SIDECAR_PREFIX = "es_state-"


def save_sidecar(run_dir: Path, generation: int, array: np.ndarray) -> dict[str, Any]:
    """Writes arrays too big for JSON as an .npy, atomically; returns what the checkpoint records.

    Kept: this generation's and the one before (the previous checkpoint may name it).
    """
    from master.run.rundir import write_array_atomic

    name = f"{SIDECAR_PREFIX}{generation}.npy"
    sha256 = write_array_atomic(run_dir / name, array)
    for old in run_dir.glob(f"{SIDECAR_PREFIX}*.npy"):
        stem = old.name.removeprefix(SIDECAR_PREFIX).removesuffix(".npy")
        if stem.isdigit() and int(stem) < generation - 1:
            old.unlink(missing_ok=True)
    return {"file": name, "sha256": sha256}


def load_sidecar(run_dir: Path, record: dict[str, Any]) -> np.ndarray:
    """The arrays a checkpoint names, checked against its sha256."""
    path = run_dir / record["file"]
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path}: unreadable ({error})") from None
    if hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest() != record["sha256"]:
        raise CheckpointError(f"{path}: sha256 does not match the checkpoint's")
    return array


class CheckpointError(Exception):
    """No usable checkpoint although one was expected."""


def _digest(payload: dict[str, Any]) -> str:
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def save_checkpoint(run_dir: Path, payload: dict[str, Any]) -> None:
    """Writes a new checkpoint; a crash at any point leaves a good one on disk."""
    document = {"format": CHECKPOINT_FORMAT, "sha256": _digest(payload), "payload": payload}
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".checkpoint.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(document, f, allow_nan=False)
            f.flush()
            os.fsync(f.fileno())
        current = run_dir / CURRENT
        if current.exists():
            # Between these two renames only the previous checkpoint exists, and the loader
            # falls back to it.
            os.replace(current, run_dir / PREVIOUS)
        os.replace(tmp, current)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    directory = os.open(run_dir, os.O_RDONLY)
    try:
        os.fsync(directory)  # the renames themselves survive a power cut
    finally:
        os.close(directory)


def _read(path: Path) -> dict[str, Any]:
    """The payload of one checkpoint file; ValueError saying what is wrong with it."""
    try:
        document = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"unreadable ({error})") from None
    if not isinstance(document, dict) or document.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"not a {CHECKPOINT_FORMAT} file")
    payload = document.get("payload")
    if not isinstance(payload, dict) or _digest(payload) != document.get("sha256"):
        raise ValueError("checksum mismatch (truncated or corrupted)")
    return payload


def load_checkpoint(run_dir: Path) -> dict[str, Any] | None:
    """The newest good checkpoint's payload; None if the run dir has none at all."""
    candidates = [run_dir / CURRENT, run_dir / PREVIOUS]
    present = [p for p in candidates if p.exists()]
    if not present:
        return None
    problems = []
    for path in present:
        try:
            payload = _read(path)
        except ValueError as error:
            problems.append(f"{path}: {error}")
            log.warning("checkpoint %s refused: %s", path, error)
            continue
        if problems:
            log.warning("resuming from the previous checkpoint %s", path)
        return payload
    raise CheckpointError("no usable checkpoint: " + "; ".join(problems))
