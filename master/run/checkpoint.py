"""The master's whole state on disk: atomic, checksummed, with the previous one kept.

checkpoint.json holds {"format", "sha256", "payload"}; the checksum covers the payload's
canonical JSON, so a truncated or bit-flipped file is detected and the previous good one
(checkpoint.prev.json) is used instead. A checkpoint whose state file (the .npy sidecar it
names: ES theta and Adam's moments, a novelty archive) is missing or altered is as bad as a
damaged one, and so is one whose observation sums no normaliser could use; a bad checkpoint
is never rotated over a good previous one.

Every save writes its state file under a name never used before in the run dir
(es_state-<generation>-<serial>.npy) and no file is ever written twice, so what one
checkpoint names no later save changes: damage to the newest state file leaves the previous
checkpoint whole. Only the files the current and the previous checkpoint name are kept.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from neuro.observation_stats import ObservationStats

log = logging.getLogger(__name__)
CHECKPOINT_FORMAT = "neuro.checkpoint/1"
CURRENT = "checkpoint.json"
PREVIOUS = "checkpoint.prev.json"
CORRUPT_PREFIX = "checkpoint.corrupt-"
"""A checkpoint that failed to verify is kept as checkpoint.corrupt-<n>.json, never deleted."""


SIDECAR_PREFIX = "es_state-"
SIDECAR_SUFFIX = ".npy"


def save_sidecar(run_dir: Path, generation: int, array: np.ndarray) -> dict[str, Any]:
    """Writes arrays too big for JSON as an .npy, atomically; returns what the checkpoint records.

    The file is one no checkpoint on disk names (es_state-<generation>-<serial>.npy, a serial
    new to the run dir), so writing it changes none of theirs. One exception writes nothing:
    when the previous checkpoint's file holds exactly these arrays and the current checkpoint
    names another (saves within one generation alternate between two files), the new
    checkpoint names that file, which it alone will name once the current becomes the
    previous. save_checkpoint removes the files no checkpoint names any more.
    """
    from master.run.rundir import write_array_atomic

    reusable = _reusable_sidecar(run_dir, generation)
    if reusable is not None:
        # Hashed only here: a file that is written is hashed as it is written.
        sha256 = hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
        if sha256 == reusable["sha256"]:
            return dict(reusable)
    name = f"{SIDECAR_PREFIX}{generation}-{_next_serial(run_dir)}{SIDECAR_SUFFIX}"
    return {"file": name, "sha256": write_array_atomic(run_dir / name, array)}


def _reusable_sidecar(run_dir: Path, generation: int) -> dict[str, str] | None:
    """The previous checkpoint's state file ({file, sha256}), if it is of this generation and
    not the current checkpoint's, and both checkpoints (and their state files) are still as
    this process wrote or checked them; else None."""
    current, previous = _still_known(run_dir / CURRENT), _still_known(run_dir / PREVIOUS)
    if current is None or previous is None or previous.record is None:
        return None
    name = previous.record["file"]
    if not name.startswith(f"{SIDECAR_PREFIX}{generation}-"):
        return None
    if current.record is not None and current.record["file"] == name:
        return None
    return previous.record


def _next_serial(run_dir: Path) -> int:
    """One more than any serial a state file in the run dir carries (1 in a new run dir)."""
    serial = 0
    for path in run_dir.glob(f"{SIDECAR_PREFIX}*{SIDECAR_SUFFIX}"):
        stem = path.name.removeprefix(SIDECAR_PREFIX).removesuffix(SIDECAR_SUFFIX)
        _, dash, last = stem.rpartition("-")
        if dash and last.isdigit():
            serial = max(serial, int(last))
    return serial + 1


def _sidecar_record(payload: dict[str, Any]) -> dict[str, str] | None:
    """The {file, sha256} of the state file a checkpoint's payload names (None: none)."""
    record = payload.get("sidecar")
    if not isinstance(record, dict):
        return None
    name, sha256 = record.get("file"), record.get("sha256")
    return (
        {"file": name, "sha256": sha256}
        if isinstance(name, str) and isinstance(sha256, str)
        else None
    )


def _remove_unnamed_sidecars(run_dir: Path, named: set[str]) -> None:
    """Deletes the state files that neither checkpoint names (older ones, or one a crash left
    before its checkpoint was written)."""
    for path in run_dir.glob(f"{SIDECAR_PREFIX}*{SIDECAR_SUFFIX}"):
        if path.name not in named:
            path.unlink(missing_ok=True)


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
    so falling back to the previous checkpoint never ends with it overwritten. Then the state
    files neither checkpoint names are removed (none, where what the previous one names cannot
    be read).
    """
    document = {"format": CHECKPOINT_FORMAT, "sha256": _digest(payload), "payload": payload}
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".checkpoint.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(document, f, allow_nan=False)
            f.flush()
            os.fsync(f.fileno())
        current, previous = run_dir / CURRENT, run_dir / PREVIOUS
        # What the previous checkpoint names once this save is done (None: not known, so no
        # state file is removed).
        kept = _still_known(current)
        if kept is not None:
            # This process wrote and fsynced it: reading and hashing it (and a 48 MB ES
            # sidecar) again on every save would only repeat what it already knows.
            os.replace(current, previous)
            _known[previous.resolve()] = _known.pop(current.resolve())  # the inode moved
        elif current.exists() or current.is_symlink():
            try:
                replaced = _verify(run_dir, current)
            except ValueError as error:
                aside = _corrupt_name(run_dir)
                log.warning("checkpoint %s is bad (%s): moved to %s", current, error, aside)
                os.replace(current, aside)
                kept = _still_known(previous) or _read_named(previous)
            else:
                # Between these two renames only the previous checkpoint exists, and the
                # loader falls back to it.
                os.replace(current, previous)
                _remember(previous, replaced)
                kept = _Named(_sidecar_record(replaced))
        else:
            kept = _still_known(previous) or _read_named(previous)
        os.replace(tmp, current)
        _remember(current, payload)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    directory = os.open(run_dir, os.O_RDONLY)
    try:
        os.fsync(directory)  # the renames themselves survive a power cut
    finally:
        os.close(directory)
    if kept is not None:
        named = [_sidecar_record(payload), kept.record]
        _remove_unnamed_sidecars(run_dir, {record["file"] for record in named if record})


class _Named(NamedTuple):
    """The state file a checkpoint names, as {file, sha256} (None: it names none)."""

    record: dict[str, str] | None


def _read_named(path: Path) -> _Named | None:
    """What the checkpoint at `path` names (nothing, if there is none); None if it cannot be
    read (it may name a file that must stay)."""
    if not (path.exists() or path.is_symlink()):
        return _Named(None)
    try:
        return _Named(_sidecar_record(_read(path)))
    except ValueError:
        return None


_Identity = tuple[int, int, int]
_known: dict[Path, tuple[_Named, _Identity | None, _Identity | None]] = {}
"""Checkpoint path -> what it names, and (inode, size, mtime) of it and of its state file, as
this process wrote or checked them."""


def _identity(path: Path) -> _Identity | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _remember(path: Path, payload: dict[str, Any]) -> None:
    named = _Named(_sidecar_record(payload))
    state = _identity(path.parent / named.record["file"]) if named.record else None
    _known[path.resolve()] = (named, _identity(path), state)


def _still_known(path: Path) -> _Named | None:
    """What the checkpoint at `path` names, if it and its state file are still exactly as this
    process wrote or checked them; else None."""
    entry = _known.get(path.resolve())
    if entry is None:
        return None
    named, identity, state = entry
    if identity is None or _identity(path) != identity:
        return None
    if named.record is not None and (
        state is None or _identity(path.parent / named.record["file"]) != state
    ):
        return None
    return named


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
    _check_observation_sums(payload)
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


def _check_observation_sums(payload: dict[str, Any]) -> None:
    """ValueError unless every observation sums the checkpoint holds (the run's, and those of
    the running phase's results) give a usable normaliser: poisoned sums never resume."""
    section = payload.get(ALGORITHM)
    state = section.get("state") if isinstance(section, dict) else None
    found = [("the run's", state.get("observations") if isinstance(state, dict) else None)]
    extras = payload.get("phase_extras")
    if isinstance(extras, dict):
        found += [
            (f"task {task_id[:80]}'s", document.get("observations"))
            for task_id, document in extras.items()
            if isinstance(document, dict)
        ]
    for whose, sums in found:
        if sums is None:
            continue
        try:
            ObservationStats.from_json(sums).normaliser()
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{whose} observation sums are unusable: {error}") from None


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
