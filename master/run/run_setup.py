"""A run ready to train: its algorithm, trainer and task template, over the fleet it is given.

A single run (master.run.start) builds one over a Fleet of its own; a study
(master.run.study) builds each of its runs over a RunFleet of the study's one Fleet.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from master.algorithms import registry
from master.config import RunConfig
from master.fleet.fleet import Fleet, RunFleet
from master.fleet.phases import FleetSettings
from master.fleet.tasks import ParameterStore, TaskTemplate, task_template
from master.observe.events import Observer
from master.observe.tensorboard import TensorBoardObserver
from master.run.algorithm_setup import behaviour_size_of, build_algorithm
from master.run.final_test import FinalTest, best_elite
from master.run.rundir import RunDirectory
from master.run.trainer import Budget, Trainer


def resume_config(payload: dict[str, Any], **budget: Any) -> RunConfig:
    """The checkpointed run's settings; only the budget (generations, frames, target) may change."""
    unknown = set(budget) - {"generations", "frames", "target_score"}
    if unknown:
        raise ValueError(f"a resumed run keeps its settings; cannot change {sorted(unknown)}")
    return dataclasses.replace(RunConfig.from_dict(payload["config"]), **budget)


@dataclass(frozen=True)
class BuiltRun:
    """A run ready to train: its trainer and the template its tasks are built from."""

    trainer: Trainer
    template: TaskTemplate


def build_run(
    config: RunConfig,
    run_dir: Path,
    fleet_for: Callable[[FleetSettings], Fleet | RunFleet],
    observers: Sequence[Observer],
    resume: dict[str, Any] | None,
    checkpoint_seconds: float,
    overlap: bool = False,
    test_episodes: int = 0,
) -> BuiltRun:
    """A run's trainer, over the fleet `fleet_for` gives its settings (a new Fleet for a single
    run, a study fleet's RunFleet), with TensorBoard and `observers`; and its task template."""
    directory = RunDirectory(run_dir)
    directory.write_config(config.to_dict())
    algorithm = build_algorithm(config, directory.path, resume)
    behaviour_size = behaviour_size_of(config) if algorithm.needs_behaviours else 0
    fleet = fleet_for(
        FleetSettings(
            run_id=config.run_id,
            run_seed=config.seed,
            lease_seconds=config.lease_seconds,
            max_attempts=config.max_task_attempts,
            episodes_per_task=config.episodes_per_task,
            behaviour_size=behaviour_size,
        )
    )
    # Workers fetch the shared parameter vector of an algorithm that has one (the ES's theta).
    parameters = (
        ParameterStore(algorithm.parameters) if algorithm.parameters() is not None else None
    )
    document = functools.partial(registry.get(config.algorithm).elite_document, config)
    if resume is not None:
        directory.truncate_metrics(algorithm.generation)
    fix = parameters.fix if parameters is not None else None
    final_test = FinalTest(test_episodes, functools.partial(best_elite, directory.path, fix))
    trainer = Trainer(
        algorithm,
        fleet,
        Budget(config.generations, config.frames, config.target_score),
        directory,
        document,
        config.env_id,
        observers=[TensorBoardObserver(directory.path / "tensorboard"), *observers],
        config=config.to_dict(),
        checkpoint_seconds=checkpoint_seconds,
        resume=resume,
        overlap=overlap,
        final_test=final_test if test_episodes > 0 else None,
    )
    return BuiltRun(trainer, task_template(config, parameters, behaviour_size))
