"""A study for the stack: what `neuro-deploy up --study FILE|NAME` hands the template, checked
before anything is asked of AWS.

A ready study (paper, laptop) is a name the template's Study parameter takes. A study file may
hold up to 1 MiB, far past a CloudFormation parameter's 4 KB: its SHA-256 is the
StudyFileSha256 parameter, and `up` uploads the file to the stack's own bucket once
CloudFormation has made it (deploy/stack.py), where the master's boot fetches it and checks the
digest. The master checks the whole study (`neuro-master --study FILE --dry-run`); deploy/
imports none of it, so only what decides the stack is checked here: the file exists and fits,
and on GPU workers every run is float32.
"""

from __future__ import annotations

import hashlib
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.stack import DeployError

MAX_STUDY_BYTES = 1 << 20
"""The master reads a study file up to this size (master/study/file.py; a test holds the two
equal)."""
GPU_DTYPE = "float32"
"""The one inference dtype GPU workers (the batched runner) run."""


@dataclass(frozen=True)
class StackStudy:
    """A study as the stack takes it: a ready study's name, or a file and its digest."""

    name: str = ""
    data: bytes | None = None
    sha256: str = ""

    def parameters(self) -> dict[str, str]:
        """The template's Study and StudyFileSha256 parameters (both empty: one run)."""
        return {"Study": self.name, "StudyFileSha256": self.sha256}


def resolve_study(spec: str, ready: Sequence[str], gpu: bool) -> StackStudy:
    """The study `spec` names, a file if one is there, else a ready study; DeployError naming
    the value if it is neither, is too big, or cannot run on GPU workers."""
    path = Path(spec)
    if path.is_file():
        try:
            with path.open("rb") as handle:
                data = handle.read(MAX_STUDY_BYTES + 1)
        except OSError as error:
            raise DeployError(f"cannot read study file {spec}: {error.strerror}") from None
        if len(data) > MAX_STUDY_BYTES:
            raise DeployError(
                f"study file {spec} is over {MAX_STUDY_BYTES:,} bytes, more than the master reads"
            )
        if gpu:
            _check_gpu_dtype(data, spec)
        return StackStudy(data=data, sha256=hashlib.sha256(data).hexdigest())
    if spec in ready:
        if gpu:
            raise DeployError(
                f"--study {spec} with --worker-gpu: a ready study's Atari runs are int8-static, "
                f'which GPU workers do not run; copy it and set inference_dtype = "{GPU_DTYPE}" '
                "in its [settings]"
            )
        return StackStudy(name=spec)
    names = ", ".join(ready)
    raise DeployError(f"no study file {spec!r}, and no ready study of that name ({names})")


def _check_gpu_dtype(data: bytes, spec: str) -> None:
    """Every run of the study sets inference_dtype float32: the study's [settings], or its own
    [[grid]] or [[run]] table's, which goes over the study's."""
    try:
        document = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise DeployError(f"study file {spec} cannot be read as TOML: {error}") from None
    default = _dtype(document)
    tables = [(f"[[{key}]] {i}", table) for key in ("grid", "run")
              for i, table in enumerate(_list(document.get(key)), 1)]  # fmt: skip
    for where, table in tables or [("the study", {})]:
        dtype = _dtype(table) or default
        if dtype != GPU_DTYPE:
            shown = "the fleet's default (int8-static on Atari)" if dtype is None else repr(dtype)
            raise DeployError(
                f"study file {spec}: {where} runs inference_dtype {shown}, and --worker-gpu "
                f'workers run "{GPU_DTYPE}" only; set inference_dtype = "{GPU_DTYPE}" in its '
                "[settings]"
            )


def _dtype(table: Any) -> Any:
    settings = table.get("settings") if isinstance(table, Mapping) else None
    return settings.get("inference_dtype") if isinstance(settings, Mapping) else None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
