"""The master's whole state on disk: atomic, checksummed, with the previous one kept.

checkpoint.json holds {"format", "sha256", "payload"}; the checksum covers the payload's
canonical JSON, so a truncated or bit-flipped file is detected and the previous good one
(checkpoint.prev.json) is used instead. A checkpoint whose ES state file (the .npy sidecar it
names) is missing or altered is as bad as a damaged one, and a bad checkpoint is never rotated
over a good previous one.
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
CORRUPT_PREFIX = "checkpoint.corrupt-"
"""A checkpoint that failed to verify is kept as checkpoint.corrupt-<n>.json, never deleted."""


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
    except (OSError, ValueError, EOFError) as error:  # EOFError: an empty or cut-short file
        raise CheckpointError(f"{path}: unreadable ({error or type(error).__name__})") from None
    if hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest() != record["sha256"]:
        raise CheckpointError(f"{path}: sha256 does not match the checkpoint's")
    return array


class CheckpointError(Exception):
    """No usable checkpoint although one was expected."""


def _digest(payload: dict[str, Any]) -> str:
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def save_checkpoint(run_dir: Path, payload: dict[str, Any]) -> None:
    """Writes a new checkpoint; a crash at any point leaves a good one on disk.

    The current checkpoint becomes the previous one only if it verifies (its ES state
    included); a bad one is moved aside as checkpoint.corrupt-<n>.json and the previous one kept,
    so falling back to the previous checkpoint never ends with it overwritten.
    """
    document = {"format": CHECKPOINT_FORMAT, "sha256": _digest(payload), "payload": payload}
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".checkpoint.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(document, f, allow_nan=False)
            f.flush()
            os.fsync(f.fileno())
        current = run_dir / CURRENT
        if _written_here(current):
            # This process wrote and fsynced it: reading and hashing it (and a 48 MB ES
            # sidecar) again on every save would only repeat what it already knows.
            os.replace(current, run_dir / PREVIOUS)
        elif current.exists() or current.is_symlink():
            try:
                _verify(run_dir, current)
            except ValueError as error:
                aside = _corrupt_name(run_dir)
                log.warning("checkpoint %s is bad (%s): moved to %s", current, error, aside)
                os.replace(current, aside)
            else:
                # Between these two renames only the previous checkpoint exists, and the
                # loader falls back to it.
                os.replace(current, run_dir / PREVIOUS)
        os.replace(tmp, current)
        _remember_written(current, payload)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    directory = os.open(run_dir, os.O_RDONLY)
    try:
        os.fsync(directory)  # the renames themselves survive a power cut
    finally:
        os.close(directory)


_written: dict[Path, list[tuple[Path, tuple[int, int, int] | None]]] = {}
"""Checkpoint path -> (file, (inode, size, mtime)) of the checkpoint this process last wrote
there and of the ES state file it names, if any."""


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _remember_written(path: Path, payload: dict[str, Any]) -> None:
    sidecar = payload.get("sidecar")
    files = [path] + ([path.parent / sidecar["file"]] if isinstance(sidecar, dict) else [])
    _written[path.resolve()] = [(f, _identity(f)) for f in files]


def _written_here(path: Path) -> bool:
    """Whether `path` and its ES state are still exactly what this process wrote there."""
    remembered = _written.get(path.resolve())
    return remembered is not None and all(
        identity is not None and _identity(f) == identity for f, identity in remembered
    )


def _corrupt_name(run_dir: Path) -> Path:
    """The first free checkpoint.corrupt-<n>.json: every bad checkpoint is kept for a look."""
    n = 1
    while (run_dir / f"{CORRUPT_PREFIX}{n}.json").exists():
        n += 1
    return run_dir / f"{CORRUPT_PREFIX}{n}.json"


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


def _verify(run_dir: Path, path: Path) -> dict[str, Any]:
    """The payload of a checkpoint whose file and ES state file are both good; else ValueError."""
    if not path.is_file():
        raise ValueError("not a regular file")
    payload = _read(path)
    record = payload.get("sidecar")
    if record is None:
        return payload
    name = record.get("file") if isinstance(record, dict) else None
    # A plain name in the run dir: a checkpoint never points elsewhere.
    if not (isinstance(name, str) and isinstance(record.get("sha256"), str)
            and Path(name).name == name and name not in ("", ".", "..")):  # fmt: skip
        raise ValueError(f"ES state record {record!r}: not {{file, sha256}} in the run dir")
    if not (run_dir / name).is_file():
        raise ValueError(f"ES state file {run_dir / name}: missing")
    try:
        load_sidecar(run_dir, record)
    except CheckpointError as error:
        raise ValueError(f"ES state file {error}") from None
    return payload


def load_checkpoint(run_dir: Path) -> dict[str, Any] | None:
    """The newest good checkpoint's payload (its ES state file verified too); None if none at all.

    CheckpointError if a checkpoint path is not a regular file (a save would fail on it later)
    or no checkpoint is usable; the message names each file and what is wrong with it.
    """
    candidates = [run_dir / CURRENT, run_dir / PREVIOUS]
    present = [p for p in candidates if p.exists() or p.is_symlink()]
    if not present:
        return None
    for path in present:
        if not path.is_file():
            raise CheckpointError(
                f"{path}: not a regular file; move it out of the way to resume from the other "
                "checkpoint"
            )
    problems = []
    for path in present:
        try:
            payload = _verify(run_dir, path)
        except ValueError as error:
            problems.append(f"{path}: {error}")
            log.warning("checkpoint %s refused: %s", path, error)
            continue
        if problems:
            log.warning("resuming from the previous checkpoint %s", path)
        return payload
    raise CheckpointError(f"no usable checkpoint in {run_dir}: " + "; ".join(problems))


ALGORITHM = "algorithm"
"""The payload's algorithm section: {"name": registry name, "state": its state document}."""
LEGACY_ALGORITHM = "ga"
"""Where checkpoints before the algorithm section kept the state, whichever algorithm ran."""


def algorithm_section(payload: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(registry name, state document) of a checkpoint's algorithm, in either layout."""
    section = payload.get(ALGORITHM)
    if section is not None:
        return section["name"], section["state"]
    # The old layout names no algorithm: the run's config says which one it was.
    from master.config import RunConfig

    return RunConfig.from_dict(payload["config"]).algorithm, payload[LEGACY_ALGORITHM]
