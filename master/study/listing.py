"""A study's runs as text, one line each: what `neuro-master --study ... --dry-run` prints."""

from __future__ import annotations

from master.config import RunConfig
from master.study.file import Study
from master.study.studydir import Plan, StudyDir


def budget_text(config: RunConfig) -> str:
    """A run's budget in words: "1,500,000 frames", "80 generations, target 0"."""
    parts = []
    if config.generations is not None:
        parts.append(f"{config.generations:,} generations")
    if config.frames is not None:
        parts.append(f"{config.frames:,} frames")
    if config.target_score is not None:
        parts.append(f"target {config.target_score:g}")
    return ", ".join(parts)


def study_listing(study: Study, study_dir: StudyDir, plan: Plan) -> list[str]:
    """A heading, then each run: name, env, seed, budget and its state in the study dir."""
    runs = len(study.runs)
    origin = "" if study.origin == study.name else f" ({study.origin})"
    heading = (
        f"study {study.name}{origin}: {runs} run{'s' if runs != 1 else ''}, at most "
        f"{study.max_concurrent_runs} at once, study dir {study_dir.path}"
    )
    rows = [("run", "env", "seed", "budget", "test", "state")]
    rows += [
        (run.name, run.env, str(run.seed), budget_text(run.config), f"{run.test_episodes} ep",
         plan.states[run.name])
        for run in study.runs
    ]  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [heading]
    for row in rows:
        cells = [cell.rjust(w) if i == 2 else cell.ljust(w)
                 for i, (cell, w) in enumerate(zip(row, widths, strict=True))]  # fmt: skip
        lines.append("  ".join(cells).rstrip())
    return lines
