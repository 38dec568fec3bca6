"""A study's dir: its files, and the rules a restarted study follows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from master.study.file import Study, parse_study
from master.study.studydir import (
    COMPLETE,
    FAILED,
    QUEUED,
    RUNNING,
    STUDY_FORMAT,
    StudyDir,
    StudyDirError,
)
from neuro.runfiles import CONFIG, FINAL_TEST, FINAL_TEST_FORMAT


def study(grid: str = "", runs: str = "", name: str = "grid", head: str = "") -> Study:
    """CartPole's seeds 0 and 1 with `grid` in their table, then `runs`."""
    text = (
        f'name = "{name}"\n{head}\n[budget]\ngenerations = 3\n'
        f'[[grid]]\nenvs = ["CartPole-v1"]\nseeds = 2\n{grid}\n{runs}'
    )
    return parse_study(text, "grid.toml")


def start(directory: StudyDir, run_study: Study, name: str) -> None:
    """What the master does when a run starts: its run dir with its config.json."""
    run_dir = directory.run_dir(name)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG).write_text(json.dumps(run_study.run(name).config.to_dict()))


def finish(directory: StudyDir, name: str, document: object = None) -> None:
    """What the master writes last: the run's final test."""
    if document is None:
        document = {"format": FINAL_TEST_FORMAT, "scores": [1.0], "mean": 1.0, "median": 1.0,
                    "episodes": 1, "frames": 4, "genome_sha256": "0" * 64}  # fmt: skip
    (directory.run_dir(name) / FINAL_TEST).write_text(json.dumps(document))


def test_a_new_study_dir_holds_the_file_and_every_run_queued(tmp_path: Path) -> None:
    first = study("settings = { population_size = 30 }")
    directory = StudyDir(tmp_path / "study")
    plan = directory.open(first)
    assert plan.added == ("cartpole-v1-s0", "cartpole-v1-s1") and plan.dropped == ()
    assert plan.states == {"cartpole-v1-s0": QUEUED, "cartpole-v1-s1": QUEUED}
    assert directory.study_file.read_text() == first.text
    document = json.loads(directory.state_file.read_text())
    assert (document["format"], document["name"]) == (STUDY_FORMAT, "grid")
    assert document["max_concurrent_runs"] == first.max_concurrent_runs
    assert document["runs"][1] == {
        "name": "cartpole-v1-s1", "env": "CartPole-v1", "seed": 1, "label": "",
        "settings": {"population_size": 30}, "budget": {"generations": 3},
        "test_episodes": 30, "state": QUEUED,
    }  # fmt: skip
    assert directory.run_dir("cartpole-v1-s1") == tmp_path / "study" / "runs" / "cartpole-v1-s1"


def test_plan_writes_nothing(tmp_path: Path) -> None:
    directory = StudyDir(tmp_path / "study")
    assert directory.plan(study()).states
    assert not directory.path.exists()


def test_a_restart_resumes_started_runs_first_and_a_complete_run_stays_complete(
    tmp_path: Path,
) -> None:
    first = study(runs='[[run]]\nenv = "CartPole-v1"\nseed = 9\nname = "extra"')
    directory = StudyDir(tmp_path)
    directory.open(first)
    start(directory, first, "cartpole-v1-s1")
    start(directory, first, "cartpole-v1-s0")
    finish(directory, "cartpole-v1-s0")
    # A larger budget for every run: the complete one stays complete.
    longer = parse_study(first.text.replace("generations = 3", "generations = 30"), "grid.toml")
    plan = directory.open(longer)
    assert plan.states == {"cartpole-v1-s0": COMPLETE, "cartpole-v1-s1": RUNNING,
                           "extra": QUEUED}  # fmt: skip
    assert plan.waiting() == ["cartpole-v1-s1", "extra"] and plan.added == ()
    assert directory.states() == plan.states


def test_a_final_test_that_cannot_be_read_does_not_make_a_run_complete(tmp_path: Path) -> None:
    first = study()
    directory = StudyDir(tmp_path)
    directory.open(first)
    start(directory, first, "cartpole-v1-s0")
    finish(directory, "cartpole-v1-s0", {"format": "neuro.final-test/0"})
    assert directory.plan(first).states["cartpole-v1-s0"] == RUNNING
    (directory.run_dir("cartpole-v1-s0") / FINAL_TEST).write_text("{trunc")
    assert directory.plan(first).states["cartpole-v1-s0"] == RUNNING


def test_runs_added_to_the_file_are_queued(tmp_path: Path) -> None:
    directory = StudyDir(tmp_path)
    first = study()
    directory.open(first)
    start(directory, first, "cartpole-v1-s0")
    more = parse_study(first.text.replace("seeds = 2", "seeds = [0, 1, 5]"), "grid.toml")
    plan = directory.open(more)
    assert plan.added == ("cartpole-v1-s5",)
    assert plan.states == {"cartpole-v1-s0": RUNNING, "cartpole-v1-s1": QUEUED,
                           "cartpole-v1-s5": QUEUED}  # fmt: skip
    assert [r["name"] for r in json.loads(directory.state_file.read_text())["runs"]] == list(
        plan.states
    )


@pytest.mark.parametrize(
    ("before", "after", "message"),
    [
        ("settings = { population_size = 30 }", "settings = { population_size = 40 }",
         r"run cartpole-v1-s0 started with population_size = 30; the file now gives 40: a "
         r"started run keeps its settings"),
        # A setting taken out falls back to the preset's, which differs.
        ("settings = { population_size = 30, truncation = 3 }",
         "settings = { population_size = 30 }",
         r"run cartpole-v1-s0 started with truncation = 3; the file now gives 10"),
        ("", 'settings = { policy = "mlp", hidden = [8] }',
         r"run cartpole-v1-s0 started with hidden_sizes = \[64, 64\]; the file now gives \[8\]"),
        ("", 'settings = { algorithm = "es" }',
         r"run cartpole-v1-s0 started with algorithm = \"ga\"; the file now gives \"es\""),
    ],
)  # fmt: skip
def test_a_changed_setting_of_a_started_run_is_refused_naming_the_run_and_the_setting(
    tmp_path: Path, before: str, after: str, message: str
) -> None:
    directory = StudyDir(tmp_path)
    first = study(before)
    directory.open(first)
    start(directory, first, "cartpole-v1-s0")
    changed = study(after)
    with pytest.raises(StudyDirError, match=message):
        directory.plan(changed)
    with pytest.raises(StudyDirError):
        directory.open(changed)
    assert directory.study_file.read_text() == first.text  # nothing written
    finish(directory, "cartpole-v1-s0")  # a complete run keeps its settings too
    with pytest.raises(StudyDirError, match="cartpole-v1-s0"):
        directory.plan(changed)


def test_a_queued_runs_settings_and_any_runs_budget_may_change(tmp_path: Path) -> None:
    directory = StudyDir(tmp_path)
    first = study("settings = { population_size = 30 }")
    directory.open(first)
    start(directory, first, "cartpole-v1-s0")
    text = first.text.replace("generations = 3", "generations = 9")
    text = text.replace("seeds = 2", "seeds = [0]") + (
        '\n[[run]]\nenv = "CartPole-v1"\nseed = 1\nsettings = { population_size = 50 }'
    )
    plan = directory.open(parse_study(text, "grid.toml"))
    assert plan.states == {"cartpole-v1-s0": RUNNING, "cartpole-v1-s1": QUEUED}
    records = {r["name"]: r for r in json.loads(directory.state_file.read_text())["runs"]}
    assert records["cartpole-v1-s1"]["settings"] == {"population_size": 50}
    assert records["cartpole-v1-s0"]["budget"] == {"generations": 9}


def test_a_setting_the_file_does_not_give_is_not_compared(tmp_path: Path) -> None:
    """A default that depends on where the study runs (the batched workers' float32) is the
    run's own once it started: restarting elsewhere does not count as a change."""
    text = 'name = "atari"\n[budget]\nframes = 100_000\n[[grid]]\nenvs = ["Frostbite-v4"]\n'
    directory = StudyDir(tmp_path)
    on_cpus = parse_study(text, "atari.toml")
    directory.open(on_cpus)
    start(directory, on_cpus, "frostbite-v4-s0")
    on_gpus = parse_study(text, "atari.toml", batched=True)
    assert on_cpus.runs[0].config.inference_dtype != on_gpus.runs[0].config.inference_dtype
    assert directory.plan(on_gpus).states == {"frostbite-v4-s0": RUNNING}


def test_a_started_runs_env_and_seed_are_its_own(tmp_path: Path) -> None:
    named = '[[run]]\nname = "mine"\nenv = "CartPole-v1"\nseed = 4'
    directory = StudyDir(tmp_path)
    first = study(runs=named)
    directory.open(first)
    start(directory, first, "mine")
    with pytest.raises(StudyDirError, match=r"run mine started on CartPole-v1; the file now "
                       r"gives env Acrobot-v1"):  # fmt: skip
        directory.plan(study(runs=named.replace("CartPole-v1", "Acrobot-v1")))
    with pytest.raises(StudyDirError, match=r"run mine started with seed 4; the file now gives 5"):
        directory.plan(study(runs=named.replace("seed = 4", "seed = 5")))


def test_a_run_taken_out_of_the_file_is_dropped_unless_it_started(tmp_path: Path) -> None:
    directory = StudyDir(tmp_path)
    first = study()
    directory.open(first)
    fewer = parse_study(first.text.replace("seeds = 2", "seeds = [0]"), "grid.toml")
    plan = directory.plan(fewer)
    assert plan.dropped == ("cartpole-v1-s1",) and list(plan.states) == ["cartpole-v1-s0"]
    start(directory, first, "cartpole-v1-s1")
    with pytest.raises(StudyDirError, match=r"run cartpole-v1-s1 started in .* and the study "
                       r"file no longer names it"):  # fmt: skip
        directory.plan(fewer)


def test_a_failed_run_stays_failed_until_its_run_dir_is_removed(tmp_path: Path) -> None:
    directory = StudyDir(tmp_path)
    first = study()
    directory.open(first)
    start(directory, first, "cartpole-v1-s0")
    directory.set_state("cartpole-v1-s0", FAILED)
    assert directory.states()["cartpole-v1-s0"] == FAILED
    assert directory.open(first).states["cartpole-v1-s0"] == FAILED
    for path in directory.run_dir("cartpole-v1-s0").iterdir():
        path.unlink()
    directory.run_dir("cartpole-v1-s0").rmdir()
    assert directory.open(first).states["cartpole-v1-s0"] == QUEUED


def test_set_state_refuses_an_unknown_run_or_state(tmp_path: Path) -> None:
    directory = StudyDir(tmp_path)
    with pytest.raises(StudyDirError, match=r"holds no study\.json"):
        directory.set_state("cartpole-v1-s0", RUNNING)
    directory.open(study())
    with pytest.raises(ValueError, match=r"one of .*not 'done'"):
        directory.set_state("cartpole-v1-s0", "done")
    with pytest.raises(ValueError, match=r"study grid has no run 'nope'"):
        directory.set_state("nope", RUNNING)
    directory.set_state("cartpole-v1-s1", RUNNING)
    assert directory.states() == {"cartpole-v1-s0": QUEUED, "cartpole-v1-s1": RUNNING}


def test_another_studys_dir_is_refused(tmp_path: Path) -> None:
    directory = StudyDir(tmp_path)
    directory.open(study(name="one"))
    with pytest.raises(StudyDirError, match=r"holds study 'one', not 'two'"):
        directory.plan(study(name="two"))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", r"cannot be read"),
        ('{"format": "neuro.study/9", "name": "grid", "runs": []}', r"'neuro.study/9'"),
        ('{"format": "neuro.study/1", "name": "grid", "runs": [{"name": "a"}]}',
         r"run a: a state of"),
        ("[]", r"format is 'list'"),
    ],
)  # fmt: skip
def test_a_study_json_that_cannot_be_read_is_refused_naming_it(
    tmp_path: Path, content: str, message: str
) -> None:
    directory = StudyDir(tmp_path)
    directory.state_file.write_text(content)
    with pytest.raises(StudyDirError, match=rf"study.json .*{message}"):
        directory.plan(study())
