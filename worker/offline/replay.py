"""Score a genome outside training: a seed list (as in the paper), a genome file or a run dir."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuro.envs.ids import import_env_module
from neuro.envs.make import PAPER, is_atari
from neuro.inference import MODULE_ARCHITECTURE
from neuro.layout import DEFAULT_MLP_HIDDEN
from neuro.noise import PAPER_NOISE_TABLE_SIZE, SMALL_NOISE_TABLE_SIZE, NoiseTableSpec
from neuro.policy_spec import UserPolicy, load_factory, user_policy
from neuro.runfiles import BEST_GENOME, GENOME_FORMAT
from worker.evaluation.evaluator import Evaluator
from worker.evaluation.spec import EvaluationSpec
from worker.runners.per_genome import play_spec

if TYPE_CHECKING:
    from worker.offline.video import Video


def resolve_genome_path(path: str | os.PathLike) -> Path:
    """A genome file as given; for a run dir, its best_genome.json."""
    path = Path(path)
    if not path.is_dir():
        return path
    best = path / BEST_GENOME
    if not best.is_file():
        raise ValueError(
            f"run dir {str(path)!r} has no {BEST_GENOME} (the master writes it after the first "
            "generation whose elite has a finite score)"
        )
    return best


def load_genome_file(path: str | os.PathLike) -> EvaluationSpec:
    """Reads a genome JSON the master wrote (best_genome.json, elite_genome.json, a run dir)."""
    path = resolve_genome_path(path)
    try:
        data: dict[str, Any] = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read genome file {str(path)!r}: {error}") from None
    if data.get("format") != GENOME_FORMAT:
        raise ValueError(
            f"{str(path)!r} is not a {GENOME_FORMAT} file (format {data.get('format')!r})"
        )
    table = data["noise_table"]
    # ES parameters are a vector in an .npy beside the file, not a seed list.
    parameters = data.get("parameters")
    return EvaluationSpec(
        env_id=data["env_id"],
        seeds=tuple(int(s) for s in data["seeds"]),
        mutation_power=float(data["mutation_power"]),
        noise_table=NoiseTableSpec(int(table["seed"]), int(table["size"])),
        architecture=data["architecture"],
        hidden_sizes=tuple(data.get("hidden_sizes") or ()),
        atari_dynamics=data.get("atari_dynamics") or PAPER,
        max_episode_steps=int(data.get("max_episode_steps") or 0),
        parameters_file=str(Path(path).parent / parameters["file"]) if parameters else None,
        parameters_sha256=parameters["sha256"] if parameters else None,
        # A genome file from before the field was trained and scored in float32.
        inference_dtype=data.get("inference_dtype") or "float32",
        # The .npy then ends with the observation mean and std the policy was trained with.
        observation_size=int(data.get("observation_size") or 0),
        policy=_user_network(data.get("policy"), path),
    )


def _user_network(document: Any, path: str | os.PathLike) -> UserPolicy | None:
    """A genome file's user network ("policy": factory and options); None for a built-in one."""
    if document is None:
        return None
    if not isinstance(document, dict) or not isinstance(document.get("factory"), str):
        raise ValueError(f"{str(path)!r}: its policy must name a factory, got {document!r}")
    return user_policy(document["factory"], document.get("options") or {})


def evaluate_policy(
    env_id_or_genome_file: str | os.PathLike,
    seeds: Sequence[int] | None = None,
    episodes: int = 1,
    *,
    architecture: str | None = None,
    hidden_sizes: Sequence[int] = (),
    mutation_power: float = 0.002,
    noise_table: NoiseTableSpec | None = None,
    atari_dynamics: str = PAPER,
    max_episode_steps: int = 0,
    env_seed: int = 0,
    inference_dtype: str | None = None,
    policy: UserPolicy | None = None,
    evaluator: Evaluator | None = None,
    video: str | os.PathLike | Video | None = None,
) -> list[float]:
    """Plays `episodes` episodes as a worker plays a task (play_spec) and returns their scores.

    `evaluate_policy('Frostbite-v4', [seed, ...])` uses the paper's network and settings;
    `evaluate_policy('runs/x/best_genome.json', episodes=30)` replays a saved genome (a run
    dir replays its best_genome.json). `video`: an .mp4 path records the first episode, a
    `worker.offline.video.Video` the first `Video.episodes` (the `video` extra); the scores are the
    same either way. `inference_dtype` overrides the genome file's (default: the file's, or
    float32 for a seed list). `policy`: a user's network for a seed list (a genome file names
    its own).
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if seeds is None:
        spec = load_genome_file(env_id_or_genome_file)
    else:
        env_id = str(env_id_or_genome_file)
        atari = is_atari(env_id)
        if policy is not None:
            architecture = MODULE_ARCHITECTURE
        if architecture is None:
            architecture = "deepga" if atari else "mlp"
        if not atari and not hidden_sizes and policy is None:
            hidden_sizes = DEFAULT_MLP_HIDDEN
        default_size = PAPER_NOISE_TABLE_SIZE if atari else SMALL_NOISE_TABLE_SIZE
        spec = EvaluationSpec(
            env_id=env_id,
            seeds=tuple(int(s) for s in seeds),
            mutation_power=mutation_power,
            noise_table=noise_table or NoiseTableSpec(size=default_size),
            architecture=architecture,
            hidden_sizes=tuple(hidden_sizes),
            atari_dynamics=atari_dynamics,
            max_episode_steps=max_episode_steps,
            policy=policy,
        )
    overrides: dict[str, Any] = {"episodes": episodes, "env_seed": env_seed}
    if inference_dtype is not None:
        overrides["inference_dtype"] = inference_dtype
    spec = EvaluationSpec(**{**spec.__dict__, **overrides})
    # A user's env or network whose module is not importable here is named (ModuleUnavailable,
    # a ValueError) before anything is built.
    import_env_module(spec.env_id)
    if spec.policy is not None:
        load_factory(spec.policy)
    if video is not None:
        from worker.offline.video import Video, play_recorded

        if not isinstance(video, Video):
            video = Video(video)
        return play_recorded(spec, video, evaluator or Evaluator())
    return play_spec(evaluator or Evaluator(), spec).returns
