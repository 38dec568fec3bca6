"""A study dir mirrored to an S3 prefix, laid out as it is on disk, and restored from there.

    s3://BUCKET/PREFIX/study.toml, study.json   put whenever a run's state changes
    s3://BUCKET/PREFIX/runs/<name>/             each run dir, as a single run's mirror keeps
                                                it (master.run.s3_mirror.RunDirMirror: after
                                                each checkpoint, periodically, at the end)

A replacement machine with an empty study dir and the same --s3-uri gets every run's dir back
(each where its checkpoint is in S3) and study.json (a failed run's error with it) before the
study is planned, so the same command resumes the study there. `neuro-deploy status` reads the
study's states from study.json; `neuro-deploy fetch` brings the prefix down as a study dir that
`neuro-master report` reads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from master.run.rundir import write_bytes_atomic
from master.run.s3_mirror import MirrorError, RunDirMirror, S3Uri, client_for, parse_s3_uri
from neuro.runfiles import STUDY_JSON, STUDY_RUNS

log = logging.getLogger(__name__)
STUDY_FILE = "study.toml"
"""The study file's copy in the study dir (master.study.studydir keeps it under this name)."""


class StudyMirror:
    """Copies a study dir to s3://bucket/prefix and back. Blocking: call it off the event loop,
    but for put_study_files, which puts on a thread of its own."""

    def __init__(self, uri: str | S3Uri, study_dir: Path, client: Any | None = None) -> None:
        self.uri = uri if isinstance(uri, S3Uri) else parse_s3_uri(uri)
        self.study_dir = Path(study_dir)
        self.client = client if client is not None else client_for(self.uri)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"StudyMirror({str(self.uri)!r})"

    def run(self, name: str) -> RunDirMirror:
        """The mirror of one run's dir, at runs/<name>/ under the study's prefix."""
        return RunDirMirror(S3Uri(self.uri.bucket, self.uri.key(f"{STUDY_RUNS}/{name}")),
                            self.client)  # fmt: skip

    def restore(self, names: Iterable[str]) -> list[str]:
        """Brings back study.json (where the study dir has none) and each named run's dir
        (where it holds no checkpoint and S3 does); the runs restored. MirrorError if S3
        cannot be read: a study started over a prefix that holds one would fork it."""
        study_dir = self.study_dir
        if not (study_dir / STUDY_JSON).exists():
            self._download_if_present(STUDY_JSON, study_dir / STUDY_JSON)
        restored = []
        for name in names:
            if self.run(name).restore(study_dir / STUDY_RUNS / name):
                restored.append(name)
        return restored

    def put_study_files(self) -> None:
        """Puts study.toml and study.json as they are now, on a daemon thread: a state change
        never waits for S3. A put that fails is logged; the next state change puts them again."""
        thread = threading.Thread(target=self._put_study_files, name="s3-study", daemon=True)
        thread.start()

    def _put_study_files(self) -> None:
        with self._lock:  # in order: an older study.json never lands after a newer one
            for name in (STUDY_FILE, STUDY_JSON):
                try:
                    data = (self.study_dir / name).read_bytes()
                    self.client.put_object(Bucket=self.uri.bucket, Key=self.uri.key(name),
                                           Body=data, ContentType=_content_type(name))  # fmt: skip
                except Exception as error:
                    log.warning("%s: %s not put (%s: %s); the next state change puts it",
                                self.uri, name, type(error).__name__, error)  # fmt: skip

    def _download_if_present(self, name: str, path: Path) -> None:
        try:
            body = self.client.get_object(Bucket=self.uri.bucket, Key=self.uri.key(name))["Body"]
        except Exception as error:
            code = str(getattr(error, "response", {}).get("Error", {}).get("Code", ""))
            if code in ("NoSuchKey", "404"):
                return
            raise MirrorError(f"{self.uri}: cannot read {name}: {error}") from None
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, body.iter_chunks(1 << 20))


def _content_type(name: str) -> str:
    return "application/json" if name.endswith(".json") else "application/toml"
