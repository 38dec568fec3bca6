"""neuro.train: a run from Python, its master in this process, with local workers beside it or
a fleet's workers joining it, and a progress bar that works in a terminal and a notebook.

The edge for Python callers, as cli.py is the edge for the shell: settings by name -> a
RunConfig -> master.run.start.run_master, on an event loop of its own in a thread, so that it
runs where a loop is already running (a notebook) and the calling thread stays free to show
progress and to take Ctrl-C. The run dir is the one neuro-master writes: neuro-master,
neuro-eval, neuro-export and neuro.train resume and read each other's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import site
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from master.config import RunConfig, checked_settings, config_from_settings
from master.fleet.auth import is_loopback, load_token
from master.run.algorithm_setup import user_network_layout
from master.run.checkpoint import algorithm_section, load_checkpoint
from master.run.local_workers import allowed_cpus, local_worker_args, pinned_cpus
from master.run.rundir import RunDirInUse, read_metrics, run_dir_lock
from master.run.start import RunOptions, ServeOptions, resume_config, run_master
from master.run.trainer import Budget
from neuro.envs.ids import env_module
from neuro.policy_spec import UserPolicy
from neuro.runfiles import BEST_GENOME, METRICS

__all__ = ["Result", "train"]

BUDGET_KEYS = ("generations", "frames", "target_score")
WORKER_LOG = ("--log-level", "WARNING")
"""The local workers' log level."""
POLL_S = 0.25
"""How often the calling thread looks for new generations (and lets Ctrl-C in)."""


@dataclass(frozen=True)
class Result:
    """A finished run, as its run dir holds it."""

    run_dir: Path
    best_genome: dict[str, Any] | None
    """best_genome.json: the best elite's genome document (None before a first elite)."""
    best_score: float | None
    """Its re-evaluated mean score."""
    metrics: list[dict[str, Any]]
    """metrics.jsonl: one record per generation, the first generation's first."""

    @property
    def best_genome_path(self) -> Path:
        """The best genome's file: what neuro.load_policy, neuro-eval and neuro-export read."""
        return self.run_dir / BEST_GENOME

    @property
    def generations(self) -> int:
        """Generations the run has completed."""
        return len(self.metrics)

    @classmethod
    def of(cls, run_dir: str | os.PathLike) -> Result:
        """What a run dir holds now."""
        run_dir = Path(run_dir)
        best_path, metrics_path = run_dir / BEST_GENOME, run_dir / METRICS
        best = json.loads(best_path.read_text()) if best_path.is_file() else None
        metrics = read_metrics(metrics_path) if metrics_path.is_file() else []
        score = best.get("elite_score") if best is not None else None
        return cls(run_dir, best, score, metrics)


def train(
    env: str,
    policy: str | None = None,
    algo: str | None = None,
    budget: int | Mapping[str, Any] | None = None,
    *,
    workers: int | None = None,
    master: str | None = None,
    run_dir: str | os.PathLike | None = None,
    token_file: str | None = None,
    progress: bool = True,
    **settings: Any,
) -> Result:
    """Trains a policy for `env` and returns the run's result (the run dir, best genome, score
    and every generation's metrics).

    `env`: a gymnasium id (CartPole-v1, Frostbite-v4, package.module:Env-v0). `policy`: the
    network (deepga, nature, mlp; default: the env's preset). `algo`: ga (default), es, ga-ns,
    ns-es or nsr-es. `budget`: generations (an int), or a mapping of generations, frames and
    target_score (the first reached ends the run; default: the env's target score, as
    neuro-master). `workers`: local worker processes to start (default: one per CPU this
    process may use, none with `master`). `master`: "host:port" to serve a fleet's workers
    on (they join with neuro-worker --master; a non-loopback host needs a token:
    `token_file`, NEURO_TOKEN_FILE or NEURO_TOKEN). `run_dir`: where the run is written
    (default runs/ENV-TIMESTAMP); one that holds a checkpoint is resumed, its settings kept.
    `settings`: neuro-master's settings by their config names (population_size, truncation,
    mutation_power, hidden_sizes, ...). `progress`: a bar per generation (tqdm.auto: a widget
    in a notebook), else nothing.

    Ctrl-C (KeyboardInterrupt) checkpoints the run and raises KeyboardInterrupt once the run
    dir can be resumed: train again with the same run_dir to continue. ValueError names a
    setting that cannot run; RuntimeError says why a run stopped before its budget.
    """
    budget_settings = _budget_settings(budget, settings)
    # Named as neuro-master names it: ALE/Pong-v5 -> ALE_Pong-v5, mypkg:Env-v0 -> mypkg_Env-v0.
    name = env.replace("/", "_").replace(":", "_")
    run_dir = Path(run_dir or f"runs/{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    host, port = _address(master)
    token = load_token(token_file or os.environ.get("NEURO_TOKEN_FILE"))
    if token is None and not is_loopback(host):
        raise ValueError(
            f"master={master!r} accepts connections from other machines: give a token "
            "(token_file=..., NEURO_TOKEN_FILE or NEURO_TOKEN)"
        )
    count = _worker_count(workers, master)
    out = _Progress(run_dir, sys.stderr) if progress else None
    held = contextlib.ExitStack()
    try:
        # Held until the master has stopped: one master per run dir, as neuro-master's.
        held.enter_context(run_dir_lock(run_dir))
    except RunDirInUse as error:
        raise ValueError(str(error)) from None
    with held:
        config, resume = _config(env, policy, algo, run_dir, settings, budget_settings)
        if out is not None:
            out.begin(config, resume)
        architecture, dtype = config.architecture, config.inference_dtype
        options = RunOptions(
            local_workers=count,
            # Their warnings only: a progress bar, not every worker's log, shows the run.
            worker_args=local_worker_args(WORKER_LOG, count, dtype, architecture),
            worker_cpus=pinned_cpus(True, (), count, dtype, architecture),
            out=None,
        )
        with _workers_import_what_this_process_imports(config, count):
            run = _RunThread(config, run_dir, ServeOptions(host, port, token), options, resume)
            try:
                interrupted = run.wait(out)
            finally:
                if out is not None:
                    out.close()
    result = Result.of(run_dir)
    if interrupted:
        print(f"neuro.train: stopped; {run_dir} is resumable: train again with "
              f"run_dir={str(run_dir)!r} to continue", file=sys.stderr)  # fmt: skip
        raise KeyboardInterrupt
    if not _budget_spent(config, result.metrics):
        raise RuntimeError(
            f"the run stopped before its budget ({result.generations} generations in "
            f"{run_dir}; see the log above); train again with run_dir={str(run_dir)!r} to "
            "continue it"
        )
    return result


@contextlib.contextmanager
def _workers_import_what_this_process_imports(config: RunConfig, count: int) -> Iterator[None]:
    """Local workers find the run's modules (its env's, its network's) where this process
    found them: a folder put on sys.path here (a notebook's sys.path.insert) goes on the
    PYTHONPATH they are started with, for the run, as a worker without the module would refuse
    every task."""
    folders = [] if count == 0 else _module_folders(config)
    known = os.environ.get("PYTHONPATH", "")
    missing = [folder for folder in folders if folder not in known.split(os.pathsep)]
    if not missing:
        yield
        return
    os.environ["PYTHONPATH"] = os.pathsep.join([*missing, *filter(None, [known])])
    try:
        yield
    finally:
        if known:
            os.environ["PYTHONPATH"] = known
        else:
            os.environ.pop("PYTHONPATH", None)


def _module_folders(config: RunConfig) -> list[str]:
    """The folders that hold the run's modules' top-level packages, where they are no site
    packages (those every process of this Python finds)."""
    modules = [env_module(config.env_id), config.policy.module if config.policy else None]
    site_folders = {
        str(Path(p).resolve()) for p in (*site.getsitepackages(), site.getusersitepackages())
    }
    folders = []
    for module in filter(None, modules):
        spec = importlib.util.find_spec(module.partition(".")[0])
        if spec is None:
            continue
        location = (list(spec.submodule_search_locations or []) or [spec.origin])[0]
        if location is None:
            continue
        folder = str(Path(location).resolve().parent)
        if folder not in site_folders and folder not in folders:
            folders.append(folder)
    return folders


def _budget_settings(
    budget: int | Mapping[str, Any] | None, settings: dict[str, Any]
) -> dict[str, Any]:
    """The budget as settings (generations, frames, target_score), taken out of `settings`
    too; ValueError naming a key given twice or unknown."""
    if budget is None:
        given: dict[str, Any] = {}
    elif isinstance(budget, Mapping):
        given = dict(budget)
    elif isinstance(budget, int) and not isinstance(budget, bool):
        given = {"generations": budget}
    else:
        raise ValueError(f"budget is generations (an int) or a mapping, got {budget!r}")
    unknown = sorted(set(given) - set(BUDGET_KEYS))
    if unknown:
        raise ValueError(f"budget keys are {', '.join(BUDGET_KEYS)}; not {unknown}")
    if settings.pop("no_target", False):  # neuro-master's --no-target
        settings["target_score"] = None
    for key in BUDGET_KEYS:
        if key in settings:
            if key in given:
                raise ValueError(f"{key} is given twice: in budget and as a setting")
            given[key] = settings.pop(key)
    return given


def _address(master: str | None) -> tuple[str, int]:
    """(host, port) to serve on: master's "host:port", else loopback on a free port."""
    if master is None:
        return "127.0.0.1", 0
    host, sep, port = master.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"master must look like host:port (port 0-65535), got {master!r}")
    return host, int(port)


def _worker_count(workers: int | None, master: str | None) -> int:
    if workers is None:
        return 0 if master is not None else max(1, len(allowed_cpus()))
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers must be an integer >= 0, got {workers!r}")
    if workers == 0 and master is None:
        raise ValueError("workers=0 with no master address: nothing would train")
    return workers


def _config(
    env: str,
    policy: str | None,
    algo: str | None,
    run_dir: Path,
    settings: dict[str, Any],
    budget: dict[str, Any],
) -> tuple[RunConfig, dict[str, Any] | None]:
    """The run's config and the checkpoint it resumes (None: a new run); ValueError naming
    what cannot run, or what a resumed run would change."""
    given = dict(settings)
    if policy is not None:
        given["policy"] = policy
    if isinstance(given.get("policy_options"), Mapping):  # as a dict, or as its JSON
        given["policy_options"] = json.dumps(given["policy_options"])
    # Checked alone first, as neuro-master's flags are: an unknown name or a bad value is
    # named whether the run is new or resumed.
    checked = checked_settings(given)
    resume = load_checkpoint(run_dir) if run_dir.exists() else None
    if resume is None:
        algorithm = {"algorithm": algo} if algo is not None else {}
        config = config_from_settings(env, {**given, **algorithm, **_budget_flags(budget)})
        if config.policy is not None:
            user_network_layout(config)  # the factory, built once here: refused now if bad
        return config, None
    saved = resume_config(resume)
    changed = sorted(
        name
        for name, value in checked.items()
        if _comparable(name, _value(saved, name)) != _comparable(name, value)
    )
    if changed:
        raise ValueError(
            f"{run_dir} holds a checkpoint and resumes with its own settings; only the budget "
            f"may change, not {changed}"
        )
    if algo not in (None, saved.algorithm):
        raise ValueError(f"{run_dir} is a {saved.algorithm} run, not {algo}")
    if saved.env_id != env:
        raise ValueError(f"{run_dir} is a run on {saved.env_id}, not {env}")
    resumed = checked_settings(_budget_flags(budget))
    if resumed.pop("no_target", False):
        resumed["target_score"] = None
    return resume_config(resume, **resumed), resume


def _budget_flags(budget: dict[str, Any]) -> dict[str, Any]:
    """The budget as neuro-master's settings: target_score None is --no-target."""
    flags = dict(budget)
    if "target_score" in flags and flags["target_score"] is None:
        del flags["target_score"]
        flags["no_target"] = True
    return flags


def _value(config: RunConfig, name: str) -> Any:
    """A setting's value in a config, as a setting gives it: its own field (a user's network's
    factory for its network), or its sections'."""
    if name == "architecture" and config.policy_factory:
        return config.policy_factory
    if name in {f.name for f in dataclasses.fields(config)}:
        return getattr(config, name)
    for section in config.sections.values():
        if hasattr(section, name):
            return getattr(section, name)
    return None


def _comparable(name: str, value: Any) -> Any:
    """Policy options as canonical JSON (no options: {}), any other value as it is."""
    if name == "policy_options":
        return UserPolicy("options:only", value or "{}").options_json
    return value


def _budget_spent(config: RunConfig, metrics: list[dict[str, Any]]) -> bool:
    """Whether the last generation recorded spent the config's budget."""
    if not metrics:
        return False
    last = metrics[-1]
    score = last.get("elite_score")
    budget = Budget(config.generations, config.frames, config.target_score)
    return budget.exhausted(len(metrics), last["frames"], math.nan if score is None else score)


class _RunThread:
    """run_master on an event loop of its own, in a thread; stop() cancels it as SIGINT
    cancels neuro-master (the run checkpoints and stays resumable)."""

    def __init__(self, config: RunConfig, run_dir: Path, serve: ServeOptions,
                 options: RunOptions, resume: dict[str, Any] | None) -> None:  # fmt: skip
        self._started = threading.Event()
        self._done = threading.Event()
        """Set when the thread ends: waited on instead of join(), which a KeyboardInterrupt
        can leave saying the thread has stopped while it still runs (CPython before 3.12)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self.error: BaseException | None = None
        self.stopped = False

        async def run() -> None:
            self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
            self._started.set()
            await run_master(config, run_dir, serve, options, resume=resume)

        def main() -> None:
            try:
                asyncio.run(run())
            except asyncio.CancelledError:
                pass  # stopped before training began: nothing to checkpoint yet
            except BaseException as error:  # re-raised in the calling thread
                self.error = error
            finally:
                self._started.set()
                self._done.set()

        self._thread = threading.Thread(target=main, name="neuro-master", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Checkpoint and stop, as SIGINT stops neuro-master."""
        self._started.wait()
        self.stopped = True
        if self._loop is not None and self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)

    def wait(self, out: _Progress | None) -> bool:
        """Until the run ends, showing its generations; True if Ctrl-C stopped it. A second
        Ctrl-C while it checkpoints raises at once."""
        try:
            while not self._done.wait(POLL_S):
                if out is not None:
                    out.update()
        except KeyboardInterrupt:
            print("\nneuro.train: stopping: the run checkpoints (a second Ctrl-C abandons it "
                  "at once)", file=sys.stderr, flush=True)  # fmt: skip
            self.stop()
            self._done.wait()
        self._thread.join()
        if out is not None:
            out.update()
        if self.error is not None:
            raise self.error
        return self.stopped


class _Progress:
    """A bar over the run's generations (tqdm.auto: a widget in a notebook where ipywidgets is
    installed, else text), fed from metrics.jsonl; plain lines where tqdm is not installed."""

    def __init__(self, run_dir: Path, stream: TextIO) -> None:
        self._path = run_dir / METRICS
        self._stream = stream
        self._seen = 0
        """Generations shown (a resumed run's earlier ones count as shown)."""
        self._read = 0
        """Bytes of metrics.jsonl read; its complete lines up to there are counted."""
        self._lines = 0
        self._bar: Any = None

    def begin(self, config: RunConfig, resume: dict[str, Any] | None) -> None:
        done = algorithm_section(resume)[1]["generation"] if resume is not None else 0
        self._seen = done
        if resume is not None:
            print(f"neuro.train: resuming {self._path.parent} at generation {done}",
                  file=self._stream, flush=True)  # fmt: skip
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=config.generations, initial=done, unit="gen", file=self._stream,
                         desc=config.env_id, dynamic_ncols=True)  # fmt: skip

    def update(self) -> None:
        """Shows the generations metrics.jsonl gained since the last call."""
        for record in self._new_records():
            figures = {k: _short(record.get(k)) for k in ("elite_score", "score_max", "score_mean")}
            if self._bar is not None:
                self._bar.set_postfix(elite=figures["elite_score"], max=figures["score_max"],
                                      mean=figures["score_mean"], refresh=False)  # fmt: skip
                self._bar.update(1)
            else:
                print(f"generation {record['generation']}: elite {figures['elite_score']} max "
                      f"{figures['score_max']} mean {figures['score_mean']}",
                      file=self._stream, flush=True)  # fmt: skip

    def _new_records(self) -> list[dict[str, Any]]:
        """Complete lines added since the last read, past those already shown (a resumed run
        cuts the file back to its checkpoint's generations: then it is read again)."""
        try:
            size = self._path.stat().st_size
            if size < self._read:
                self._read = self._lines = 0
            with open(self._path, "rb") as metrics:
                metrics.seek(self._read)
                data = metrics.read()
        except OSError:  # not written yet
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self._read += len(complete)
        records = []
        for line in complete.decode().splitlines():
            self._lines += 1
            if self._lines > self._seen and line.strip():
                records.append(json.loads(line))
        self._seen = max(self._seen, self._lines)
        return records

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _short(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}"
