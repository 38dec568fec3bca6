"""A study's directory, and the rules a restarted study follows.

    STUDY_DIR/study.toml       the study file as last started
    STUDY_DIR/study.json       its runs (name, env, seed, label, settings, budget, test
                               episodes) and each one's state: queued, running, complete, failed
                               (with its error)
    STUDY_DIR/runs/<name>/     each run's own run dir, which every tool reads as any run's

Starting a study again in its dir (the same command) resumes it (StudyDir.plan):

- a run is complete once its run dir holds its final test (final_test.json): it stays
  complete, whatever the file now says of its budget;
- a run that started (its run dir holds config.json) keeps its env, seed and settings: a change
  in the file is refused, naming the run and the setting; its budget and test episodes may
  change, as a resumed run's budget may;
- a run added to the file is queued; one taken out of it is dropped if it never started, and
  refused if it did (its run dir would be left behind);
- a run recorded failed stays failed while its run dir exists (remove the dir to run it again).

Plain files: the state is read from each run dir's own files and study.json, written whole
(write, fsync, rename) so a crash leaves the old file or the new one.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from master.config import RunConfig
from master.observe.events import COMPLETE, FAILED, QUEUED, RUN_STATES, RUNNING
from master.run.rundir import write_json_atomic, write_text_atomic
from master.study.file import Study, StudyRun
from neuro.runfiles import CONFIG, FINAL_TEST, FINAL_TEST_FORMAT, STUDY_JSON, STUDY_RUNS

STUDY_FORMAT = "neuro.study/1"
STUDY_FILE = "study.toml"

STATES = RUN_STATES
MAX_STATE_BYTES = 16 << 20
"""study.json is read only up to this size (a thousand runs' records are far smaller)."""


class StudyDirError(ValueError):
    """A study dir the study cannot start in, and why, naming the run and the setting."""


@dataclass(frozen=True)
class Plan:
    """What starting a study in its dir does: each run's state, in the file's order."""

    states: dict[str, str]
    added: tuple[str, ...] = ()
    """Runs the study dir did not hold yet (all of them in a new dir)."""
    dropped: tuple[str, ...] = ()
    """Runs of the dir that the file no longer names and that never started."""

    def waiting(self) -> list[str]:
        """The runs still to serve, in order: those started first (they resume), then queued."""
        started = [name for name, state in self.states.items() if state == RUNNING]
        return started + [name for name, state in self.states.items() if state == QUEUED]


class StudyDir:
    """The files of one study's directory."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"StudyDir({str(self.path)!r})"

    @property
    def study_file(self) -> Path:
        return self.path / STUDY_FILE

    @property
    def state_file(self) -> Path:
        return self.path / STUDY_JSON

    def run_dir(self, name: str) -> Path:
        """The run dir of the run of this name (a checked name: a single path component)."""
        return self.path / STUDY_RUNS / name

    def read(self) -> dict[str, Any] | None:
        """study.json, checked; None if the dir holds none. StudyDirError if it cannot be read."""
        try:
            with self.state_file.open("rb") as handle:
                data = handle.read(MAX_STATE_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise StudyDirError(f"cannot read {self.state_file}: {error.strerror}") from None
        if len(data) > MAX_STATE_BYTES:
            raise StudyDirError(f"{self.state_file} is over {MAX_STATE_BYTES} bytes")
        try:
            document = json.loads(data)
            _check_document(document)
        except (ValueError, TypeError, KeyError) as error:
            raise StudyDirError(f"{self.state_file} cannot be read: {error}") from None
        return document

    def states(self) -> dict[str, str]:
        """Each run's state as study.json records it ({} before the study first started)."""
        document = self.read()
        return {} if document is None else {r["name"]: r["state"] for r in document["runs"]}

    def plan(self, study: Study) -> Plan:
        """What starting `study` here does, by the rules above; writes nothing. StudyDirError,
        naming the run and the setting, if the study cannot start here."""
        document = self.read()
        saved: dict[str, dict[str, Any]] = {}
        if document is not None:
            if document["name"] != study.name:
                raise StudyDirError(
                    f"{self.path} holds study {document['name']!r}, not {study.name!r}: "
                    "give each study a dir of its own (--study-dir)"
                )
            saved = {record["name"]: record for record in document["runs"]}
        states = {}
        for run in study.runs:
            record = saved.get(run.name)
            states[run.name] = state = self._state(run.name, record)
            if state != QUEUED:
                self._check_unchanged(run, record)
        names = {run.name for run in study.runs}
        dropped = []
        for name in saved:
            if name in names:
                continue
            if self.started(name):
                raise StudyDirError(
                    f"run {name} started in {self.path} and the study file no longer names it: "
                    "put it back, or start the changed study in a dir of its own"
                )
            dropped.append(name)
        added = tuple(run.name for run in study.runs if run.name not in saved)
        return Plan(states, added, tuple(dropped))

    def open(self, study: Study) -> Plan:
        """Starts `study` here: plan(), then the file's copy and study.json written."""
        plan = self.plan(study)
        self.path.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.study_file, study.text)
        errors = {name: record.get("error") for name, record in self._records().items()}
        records = []
        for run in study.runs:
            state = plan.states[run.name]
            record = {**run.record(), "state": state}
            if state == FAILED and errors.get(run.name):
                record["error"] = errors[run.name]
            records.append(record)
        self._write(study.name, study.max_concurrent_runs, records)
        return plan

    def set_state(self, name: str, state: str, error: str = "") -> None:
        """Records a run's new state in study.json (a failed run's with its error);
        ValueError naming an unknown run or state."""
        if state not in STATES:
            raise ValueError(f"a run's state is one of {STATES}, not {state!r}")
        document = self.read()
        if document is None:
            raise StudyDirError(f"{self.path} holds no {STUDY_JSON}: open the study first")
        records = document["runs"]
        for record in records:
            if record["name"] == name:
                record["state"] = state
                if state == FAILED and error:
                    record["error"] = error
                else:
                    record.pop("error", None)
                break
        else:
            raise ValueError(f"study {document['name']} has no run {name!r}")
        self._write(document["name"], document["max_concurrent_runs"], records)

    def error(self, name: str) -> str:
        """Why a failed run failed, as study.json records it ("" if it says nothing)."""
        error = self._records().get(name, {}).get("error", "")
        return error if isinstance(error, str) else ""

    def _records(self) -> dict[str, dict[str, Any]]:
        document = self.read()
        return {} if document is None else {r["name"]: r for r in document["runs"]}

    def started(self, name: str) -> bool:
        """Whether the run's dir holds its config (the master writes it when the run starts)."""
        return (self.run_dir(name) / CONFIG).is_file()

    def complete(self, name: str) -> bool:
        """Whether the run's dir holds its final test, the last file a run writes."""
        try:
            document = json.loads((self.run_dir(name) / FINAL_TEST).read_bytes())
        except (OSError, ValueError):
            return False
        return isinstance(document, dict) and document.get("format") == FINAL_TEST_FORMAT

    def _state(self, name: str, record: Mapping[str, Any] | None) -> str:
        if self.complete(name):
            return COMPLETE
        exists = self.run_dir(name).is_dir()
        if record is not None and record["state"] == FAILED and exists:
            return FAILED
        return RUNNING if self.started(name) else QUEUED

    def _check_unchanged(self, run: StudyRun, record: Mapping[str, Any] | None) -> None:
        """A started run's env, seed and settings are those it started with, read from its run
        dir's config.json: each setting the file gives now or gave then."""
        where = f"run {run.name}"
        path = self.run_dir(run.name) / CONFIG
        try:
            started = RunConfig.from_dict(json.loads(path.read_bytes()))
        except (OSError, ValueError, TypeError, KeyError) as error:
            raise StudyDirError(f"{where}: its {path} cannot be read ({error})") from None
        keep = "a started run keeps its settings (change it back, or give the changed run "
        keep += "another name or label)"
        if started.env_id != run.env:
            raise StudyDirError(
                f"{where} started on {started.env_id}; the file now gives env {run.env}: {keep}"
            )
        if started.seed != run.seed:
            raise StudyDirError(
                f"{where} started with seed {started.seed}; the file now gives {run.seed}: {keep}"
            )
        was, now = _flat(started), _flat(run.config)
        named = set(run.settings) | set(record["settings"] if record is not None else ())
        for name in sorted(named):
            if was.get(name) != now.get(name):
                raise StudyDirError(
                    f"{where} started with {name} = {_toml(was.get(name))}; the file now gives "
                    f"{_toml(now.get(name))}: {keep}"
                )

    def _write(self, name: str, concurrent: int, records: list[dict[str, Any]]) -> None:
        document = {"format": STUDY_FORMAT, "name": name, "max_concurrent_runs": concurrent,
                    "runs": records}  # fmt: skip
        write_json_atomic(self.state_file, document)


def _check_document(document: Any) -> None:
    """ValueError unless `document` is a study.json this master can read."""
    if not isinstance(document, dict) or document.get("format") != STUDY_FORMAT:
        found = document.get("format") if isinstance(document, dict) else type(document).__name__
        raise ValueError(f"format is {found!r}, expected {STUDY_FORMAT!r}")
    if not isinstance(document["name"], str) or not isinstance(document["runs"], list):
        raise ValueError("it needs a name and a list of runs")
    for record in document["runs"]:
        if not isinstance(record, dict) or not isinstance(record.get("name"), str):
            raise ValueError(f"a run record needs a name, got {str(record)[:80]}")
        if record.get("state") not in STATES or not isinstance(record.get("settings"), dict):
            raise ValueError(f"run {record['name']}: a state of {STATES} and its settings")


def _flat(config: RunConfig) -> dict[str, Any]:
    """Every setting of a config by its field's name: RunConfig's own, then its sections'."""
    flat = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
            if f.init and f.name != "sections"}  # fmt: skip
    for settings in config.sections.values():
        flat.update(dataclasses.asdict(settings))
    return flat


def _toml(value: Any) -> str:
    """A setting's value as a study file writes it."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return json.dumps(list(value))
    return json.dumps(value)
