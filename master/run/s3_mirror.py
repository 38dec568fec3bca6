"""Mirrors the run dir to an S3 prefix, and restores it from there on a replaced machine.

boto3 is imported only when a mirror is made: the master runs without the `aws` extra. S3 is
an observer of the run: an upload that fails is logged and retried at the next sync, and no
S3 call runs on the event loop or can hold up the GA or the exit for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from master.observe.events import Observer, RunSnapshot
from master.run.checkpoint import CURRENT, PREVIOUS, SIDECAR_PREFIX, SIDECAR_SUFFIX
from master.run.rundir import write_bytes_atomic
from neuro.runfiles import BEST_GENOME, CONFIG, ELITE_GENOME, FINAL_TEST, GENOMES, METRICS

log = logging.getLogger(__name__)

DATA_FILES = (CONFIG, METRICS, BEST_GENOME, ELITE_GENOME, FINAL_TEST)
CHECKPOINT_FILES = (PREVIOUS, CURRENT)
"""Uploaded after the data files and restored last, the current checkpoint the very last."""
STATUS_FILE = "status.json"
TENSORBOARD_DIR = "tensorboard"
"""Its event files are mirrored too, so a fetched or restored run keeps its curves."""
ARRAY_SUFFIX = ".npy"
"""Arrays in the run dir (an ES run's parameters and the sidecar its checkpoint names)."""
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
STATUS_FIELDS = ("run_id", "env_id", "generation", "phase", "frames", "evaluations",
                 "elite_score", "workers", "tasks_pending", "tasks_leased", "tasks_done",
                 "leases_reissued", "run_complete")  # fmt: skip
SYNC_TIMEOUT_S = 120.0
FINAL_SYNC_TIMEOUT_S = 30.0

_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IP_ADDRESS = re.compile(r"\d+\.\d+\.\d+\.\d+")
_BUCKET_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_BUCKET_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


class MirrorError(Exception):
    """S3 cannot be used for the run dir; the message names the URI and why."""


class OtherRunError(MirrorError):
    """The S3 prefix holds a different run than the run dir."""


@dataclass(frozen=True)
class S3Uri:
    """s3://bucket/prefix, validated; `prefix` has no leading or trailing slash."""

    bucket: str
    prefix: str

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


def parse_s3_uri(text: str) -> S3Uri:
    """An S3Uri from s3://bucket[/prefix]; ValueError naming the value and the rule it breaks."""

    def refuse(why: str) -> ValueError:
        return ValueError(f"S3 URI {text!r} is not s3://bucket[/prefix]: {why}")

    if not isinstance(text, str) or not text.startswith("s3://"):
        raise refuse("it must start with s3://")
    bucket, _, prefix = text[len("s3://") :].partition("/")
    if not bucket:
        raise refuse("no bucket name")
    if not 3 <= len(bucket) <= 63:
        raise refuse(f"bucket name {bucket!r} must be 3-63 characters long")
    if not _BUCKET.fullmatch(bucket):
        raise refuse(
            f"bucket name {bucket!r} may hold only lowercase letters, digits, dots and "
            "hyphens, and must begin and end with a letter or digit"
        )
    if ".." in bucket or _IP_ADDRESS.fullmatch(bucket):
        raise refuse(f"bucket name {bucket!r} has two adjacent dots or is an IP address")
    if bucket.startswith(_BUCKET_RESERVED_PREFIXES) or bucket.endswith(_BUCKET_RESERVED_SUFFIXES):
        raise refuse(f"bucket name {bucket!r} uses a prefix or suffix S3 reserves")
    prefix = prefix.rstrip("/")
    if any(ord(c) < 32 or ord(c) == 127 for c in prefix):
        raise refuse("the prefix holds control characters")
    # Keys like a//b or a/../b are legal in S3 but no tool treats them as folders alike.
    if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
        raise refuse(f"prefix {prefix!r} has an empty, '.' or '..' part")
    if len(prefix.encode()) > 900:  # keys are at most 1024 bytes, file names included
        raise refuse("the prefix is longer than 900 bytes")
    return S3Uri(bucket, prefix)


def status_document(status: RunSnapshot) -> dict[str, Any]:
    """status.json's fields from a snapshot of the run (named as the Status RPC names them)."""
    document = {name: getattr(status, name) for name in STATUS_FIELDS}
    if not math.isfinite(document["elite_score"]):
        document["elite_score"] = None  # JSON has no NaN; no elite yet
    return document


def client_for(uri: S3Uri) -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise MirrorError(
            f"--s3-uri {uri} needs boto3, which is not installed: pip install 'neuro[aws]'"
        ) from None
    config = Config(
        connect_timeout=10, read_timeout=10, retries={"max_attempts": 3, "mode": "standard"}
    )
    # A session of its own: boto3's default session is not thread-safe, clients are.
    return boto3.session.Session().client("s3", config=config)


def _error_code(error: Exception) -> str:
    response = getattr(error, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


class RunDirMirror:
    """Copies run files to s3://bucket/prefix and back. Blocking: call it off the event loop."""

    def __init__(self, uri: str | S3Uri, client: Any | None = None) -> None:
        self.uri = uri if isinstance(uri, S3Uri) else parse_s3_uri(uri)
        self.client = client if client is not None else client_for(self.uri)
        self._uploaded: dict[str, tuple[tuple[int, int, int], str]] = {}
        # Genome files S3 already holds: named by their content, so never uploaded again.
        self._stored_genomes: set[str] = set()
        self._failing = False
        self._swept = False
        """Whether the ES state files no checkpoint of this run dir names (an earlier master
        process's) were deleted from S3."""

    def __repr__(self) -> str:
        return f"RunDirMirror({str(self.uri)!r}, uploaded={sorted(self._uploaded)})"

    def restore(self, run_dir: str | os.PathLike) -> bool:
        """Downloads the run if `run_dir` holds no checkpoint and S3 does; True if it did.

        Raises MirrorError if S3 cannot be listed (no bucket, no access, unreachable), even
        when there is nothing to restore: a fresh run over a prefix that holds one would fork it.
        """
        run_dir = Path(run_dir)
        present = self._list()
        self._stored_genomes = {name for name in present if _is_genome_file(name)}
        if any((run_dir / name).exists() for name in CHECKPOINT_FILES):
            self._check_same_run(run_dir, present)
            return False  # the local run is the newer one; the next sync overwrites S3's
        if not present & set(CHECKPOINT_FILES):
            return False
        run_dir.mkdir(parents=True, exist_ok=True)
        # Data first and the current checkpoint last: a restore cut short leaves no checkpoint
        # (and is redone) or one that every data file is at least as new as. Of the ES state
        # files, only those the checkpoints name (each can be tens of MB).
        named = self._named_state_files(present)
        wanted = (lambda name: name in named) if named is not None else (lambda name: True)
        extras = sorted(name for name in present if _is_extra_file(name)
                        and (not _is_state_file(name) or wanted(name)))  # fmt: skip
        for name in (*DATA_FILES, *extras, *CHECKPOINT_FILES):
            if name in present:
                try:
                    self._download(name, run_dir / name)
                except Exception as error:
                    raise MirrorError(self._describe(f"cannot download {name}", error)) from None
        return True

    def _named_state_files(self, present: set[str]) -> set[str] | None:
        """The ES state files S3's checkpoints name; None if one cannot be read (then every
        one is restored, and the loader picks)."""
        named: set[str] = set()
        for name in CHECKPOINT_FILES:
            if name not in present:
                continue
            try:
                body = self.client.get_object(Bucket=self.uri.bucket, Key=self.uri.key(name))
                record = json.loads(body["Body"].read())["payload"].get("sidecar")
            except Exception as error:
                log.warning("%s", self._describe(f"cannot read {name}; restoring every ES "
                                                 "state file", error))  # fmt: skip
                return None
            if isinstance(record, dict) and isinstance(record.get("file"), str):
                named.add(record["file"])
        return named

    def _check_same_run(self, run_dir: Path, present: set[str]) -> None:
        """Refuses to mirror a local run over a prefix that holds a different one."""
        if "config.json" not in present or not (run_dir / "config.json").exists():
            return
        try:
            body = self.client.get_object(Bucket=self.uri.bucket, Key=self.uri.key("config.json"))
            theirs = json.loads(body["Body"].read()).get("run_id")
            ours = json.loads((run_dir / "config.json").read_text()).get("run_id")
        except Exception as error:
            raise MirrorError(self._describe("cannot read the run's config.json", error)) from None
        if theirs != ours:
            raise OtherRunError(
                f"{self.uri} holds run {theirs}, but {run_dir} is run {ours}: mirroring would "
                "overwrite it; give this run its own --s3-uri"
            )

    def _list(self) -> set[str]:
        """The run files the prefix holds (names relative to it)."""
        names = set(DATA_FILES + CHECKPOINT_FILES)
        found: set[str] = set()
        prefix = self.uri.key("")
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.uri.bucket, Prefix=prefix
            )
            for page in pages:
                for item in page.get("Contents", ()):
                    name = item["Key"][len(prefix) :]
                    if name in names or _is_extra_file(name):
                        found.add(name)
        except Exception as error:
            raise MirrorError(self._describe("cannot list the run's files", error)) from None
        return found

    def _download(self, name: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        body = self.client.get_object(Bucket=self.uri.bucket, Key=self.uri.key(name))["Body"]
        write_bytes_atomic(path, body.iter_chunks(1 << 20))

    def _describe(self, what: str, error: Exception) -> str:
        code = _error_code(error)
        if code == "NoSuchBucket":
            why = f"bucket {self.uri.bucket!r} does not exist"
        elif code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            why = f"access denied ({error})"
        elif code:
            why = str(error)
        elif type(error).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
            why = f"no usable AWS credentials ({error})"
        else:
            why = f"cannot reach S3 ({type(error).__name__}: {error})"
        return f"{self.uri}: {what}: {why}"

    def sync(self, run_dir: str | os.PathLike, status: dict[str, Any]) -> bool:
        """Uploads the files changed since their last upload, then status.json; never raises.

        False (and one warning naming the URI) if S3 refused or was unreachable; what did not
        go up goes up at the next sync.
        """
        try:
            self._upload(Path(run_dir), status)
        except Exception as error:
            log.warning("%s", self._describe("sync failed, retrying at the next one", error))
            self._failing = True
            return False
        if self._failing:
            log.info("sync to %s works again", self.uri)
            self._failing = False
        return True

    def _upload(self, run_dir: Path, status: dict[str, Any]) -> None:
        # The checkpoints are read first: the trainer writes metrics and genomes before each
        # checkpoint, so the data read after one is at least as new as it, and a run restored
        # from S3 never lacks a metrics line its checkpoint counts (extra lines it drops).
        extras = [name for name in _extra_files(run_dir) if name not in self._stored_genomes]
        changed = {
            name: self._changed(run_dir, name) for name in (CURRENT, PREVIOUS, *DATA_FILES, *extras)
        }
        # A checkpoint goes up after the arrays it names, so S3 never holds one without them.
        for name in (*DATA_FILES, *extras, *CHECKPOINT_FILES):
            if changed[name] is None:
                continue
            signature, digest, data = changed[name]
            self._put(name, data)
            self._uploaded[name] = (signature, digest)
        # Sidecars the trainer rotated out go from S3 too (each can be tens of MB), but only
        # now that the checkpoints which replaced them are up.
        for name in sorted(set(self._uploaded) - set(extras) - {*DATA_FILES, *CHECKPOINT_FILES}):
            if _is_extra_file(name) and not (run_dir / name).exists():
                self.client.delete_object(Bucket=self.uri.bucket, Key=self.uri.key(name))
                del self._uploaded[name]
        if not self._swept and CURRENT in self._uploaded:
            # Once, after this process's first checkpoint is up: the state files an earlier
            # master process left, which no checkpoint names any more.
            for name in sorted(self._list()):
                if _is_state_file(name) and not (run_dir / name).exists():
                    self.client.delete_object(Bucket=self.uri.bucket, Key=self.uri.key(name))
            self._swept = True
        document = {**status, "updated_at": round(time.time(), 3)}
        self._put(STATUS_FILE, (json.dumps(document, indent=2) + "\n").encode())

    def _changed(self, run_dir: Path, name: str) -> tuple[tuple[int, int, int], str, bytes] | None:
        """(signature, digest, bytes) of a file that differs from its last upload, else None."""
        path = run_dir / name
        try:
            # Stat before reading: a write that lands after it changes the signature, so the
            # next sync uploads it again.
            stat = os.stat(path)
            signature = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
            last = self._uploaded.get(name)
            if last is not None and last[0] == signature:
                return None
            data = path.read_bytes()
        except FileNotFoundError:
            return None  # not written yet, or a checkpoint between its two renames
        if name == "metrics.jsonl":
            data = data[: data.rfind(b"\n") + 1]  # complete lines only, if one is being written
        digest = hashlib.sha256(data).hexdigest()
        if last is not None and last[1] == digest:
            self._uploaded[name] = (signature, digest)
            return None
        return signature, digest, data

    def _put(self, name: str, data: bytes) -> None:
        content_type = (
            "application/x-ndjson"
            if name.endswith(".jsonl")
            else "application/json"
            if name.endswith(".json")
            else "application/octet-stream"
        )
        self.client.put_object(
            Bucket=self.uri.bucket, Key=self.uri.key(name), Body=data, ContentType=content_type
        )


def _is_extra_file(name: str) -> bool:
    """A TensorBoard event file, a genome file or a run-dir array, beside the fixed run files."""
    head, _, tail = name.partition("/")
    if not tail:
        return name.endswith(ARRAY_SUFFIX) and not name.startswith(".")
    if head == GENOMES:
        return _is_genome_file(name)
    return head == TENSORBOARD_DIR and "/" not in tail and tail.startswith("events.out.tfevents")


def _is_state_file(name: str) -> bool:
    """An ES state file a checkpoint names (es_state-<generation>-<serial>.npy)."""
    return "/" not in name and name.startswith(SIDECAR_PREFIX) and name.endswith(SIDECAR_SUFFIX)


def _is_genome_file(name: str) -> bool:
    """genomes/<sha256>.json (not a temp file of one being written)."""
    head, _, tail = name.partition("/")
    return head == GENOMES and tail.endswith(".json") and bool(_SHA256_HEX.fullmatch(tail[:-5]))


def _extra_files(run_dir: Path) -> list[str]:
    """The run dir's event files, genome files and arrays, as names relative to it."""
    names = [path.name for path in run_dir.glob(f"*{ARRAY_SUFFIX}") if path.is_file()]
    for folder in (TENSORBOARD_DIR, GENOMES):
        with contextlib.suppress(FileNotFoundError):
            names += [f"{folder}/{path.name}" for path in (run_dir / folder).iterdir()
                      if path.is_file()]  # fmt: skip
    return sorted(name for name in names if _is_extra_file(name))


class MirrorLoop(Observer):
    """Syncs a run dir in the background: on request, every `interval` s, and once at close.

    As an observer of the run, it requests a sync whenever a checkpoint is on disk.

    Syncs never overlap and each runs on a daemon thread: the event loop never waits for S3,
    and a sync stuck on a dead endpoint cannot keep the process from exiting.
    """

    def __init__(
        self,
        mirror: RunDirMirror,
        run_dir: str | os.PathLike,
        status: Callable[[], dict[str, Any]],
        interval: float = 60.0,
        timeout: float = SYNC_TIMEOUT_S,
    ) -> None:
        if not interval > 0 or not timeout > 0:
            raise ValueError(f"sync interval and timeout must be > 0, got {interval}, {timeout}")
        self.mirror = mirror
        self.run_dir = Path(run_dir)
        self.status = status
        self.interval = interval
        self.timeout = timeout
        self.syncs = 0
        self._wanted = asyncio.Event()
        self._running: asyncio.Future[bool] | None = None
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"MirrorLoop({str(self.mirror.uri)!r}, interval={self.interval}, syncs={self.syncs})"

    def start(self) -> None:
        """Begins syncing, the first time right away."""
        self._wanted.set()
        self._task = asyncio.ensure_future(self._loop())

    def request(self) -> None:
        """Asks for a sync soon (e.g. a checkpoint was written); returns at once."""
        self._wanted.set()

    def checkpointed(self) -> None:
        self.request()

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel that
            # arrives as the event is set (a checkpoint just before close), and then this
            # loop would outlive the run and hold up the master's exit.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await self._wanted.wait()
            self._wanted.clear()
            await self._sync(loop.time() + self.timeout)

    async def _sync(self, deadline: float) -> bool:
        """One sync, waited for until `deadline` (loop time); False if it failed or runs on."""
        loop = asyncio.get_running_loop()
        if self._running is not None and not self._running.done():
            # The last one outlived its time: never two at once, and it ends on its own
            # (every S3 call has a timeout).
            await asyncio.wait([self._running], timeout=max(deadline - loop.time(), 0))
            if not self._running.done():
                log.warning(
                    "sync to %s skipped: the previous one is still running", self.mirror.uri
                )
                return False
        try:
            status = self.status()
        except Exception:
            log.exception("status for %s failed; sync skipped", self.mirror.uri)
            return False
        self._running = _in_daemon_thread(self.mirror.sync, self.run_dir, status)
        done, _ = await asyncio.wait([self._running], timeout=max(deadline - loop.time(), 0))
        if not done:
            log.warning("sync to %s still running after %.0f s", self.mirror.uri, self.timeout)
            return False
        self.syncs += 1
        return self._running.exception() is None and self._running.result()

    async def close(self, timeout: float = FINAL_SYNC_TIMEOUT_S) -> bool:
        """Stops the loop and makes one final sync, all within `timeout` s; True if it went up."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self._task is not None:
            self._task.cancel()
            # asyncio.wait, not `await task`: a cancel of close() itself must reach close's
            # caller, not be taken for the loop's own end and suppressed.
            await asyncio.wait([self._task], timeout=max(deadline - loop.time(), 0))
            self._task = None
        ok = await self._sync(deadline)
        if not ok:
            log.warning(
                "final sync to %s did not complete within %.0f s; S3 may lack the last "
                "checkpoint (the local run dir has it)",
                self.mirror.uri,
                timeout,
            )
        return ok


def _in_daemon_thread(function: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
    """Runs `function(*args)` on a daemon thread; the returned future gets its result."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def target() -> None:
        result, error = None, None
        try:
            result = function(*args)
        except BaseException as exc:
            error = exc
        # The loop may be gone when a sync outlives the run; there is no one left to tell.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=target, name="s3-mirror", daemon=True).start()
    return future
