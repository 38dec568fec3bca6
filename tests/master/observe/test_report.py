"""neuro-master report on study dirs written by hand in the study dir's shape (study.json,
runs/<name>/ run dirs with config.json, metrics.jsonl and final_test.json), on damaged ones,
and on a real short CartPole run."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from master.cli import main as master_main
from master.observe.published import load_published, paper_game
from master.observe.report import (
    FINAL_TEST_SOURCE,
    LAST_ELITE_SOURCE,
    RunEntry,
    curve_band,
    read_run,
    throughputs,
)
from master.observe.report_output import main
from neuro.runfiles import CONFIG, FINAL_TEST, METRICS
from tests.support.processes import REPO, worker_env
from tests.support.tiny import LOCAL_CARTPOLE_ARGS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CLI = [sys.executable, "-c", "import sys; from master.cli import main; sys.exit(main())"]
# Such et al. 2017, Table 1, as the issue quotes it: DQN, ES, A3C, RS, GA, GA at 6B frames.
FROSTBITE = {"DQN": 797, "ES": 370, "A3C": 191, "RS": 1164, "GA": 4536, "GA-6B": 6220}
ANCHORS = {("Kangaroo", "GA"): 3790, ("Gravitar", "GA"): 476, ("Skiing", "GA"): -6502,
           ("Atlantis", "GA"): 76273}  # fmt: skip
PAPER_GAMES = ("Amidar", "Assault", "Asterix", "Asteroids", "Atlantis", "Enduro", "Frostbite",
               "Gravitar", "Kangaroo", "Seaquest", "Skiing", "Venture", "Zaxxon")  # fmt: skip


# -- study dirs by hand -------------------------------------------------------------------------


def write_run(
    run_dir: Path,
    env_id: str,
    seed: int,
    curve: list[tuple[int, float]],
    test_mean: float | None = None,
    worker_s: list[float] | None = None,
    config: dict[str, Any] | None = None,
) -> None:
    """A run dir as the master writes it: config.json, metrics.jsonl (one line per (frames,
    elite score)), and final_test.json where the run played its final test."""
    run_dir.mkdir(parents=True)
    atari = "Frostbite" in env_id
    network = ("deepga", "int8-static") if atari else ("mlp", "float32")
    document = {"env_id": env_id, "atari": atari, "ga": {"seed": seed}, "architecture": network[0],
                "inference_dtype": network[1], **(config or {})}  # fmt: skip
    (run_dir / CONFIG).write_text(json.dumps(document))
    lines = []
    for generation, (frames, elite) in enumerate(curve):
        record = {"generation": generation, "frames": frames, "evaluations": 10 * generation,
                  "wall_s": float(generation), "score_mean": elite / 2, "score_max": elite,
                  "elite_score": elite}  # fmt: skip
        if worker_s is not None:
            record["worker_s"] = worker_s[generation]
        lines.append(json.dumps(record) + "\n")
    (run_dir / METRICS).write_text("".join(lines))
    if test_mean is not None:
        scores = [test_mean - 1.0, test_mean + 1.0]
        final = {"format": "neuro.final-test/1", "genome_sha256": "0" * 64, "scores": scores,
                 "mean": test_mean, "median": test_mean, "episodes": 30,
                 "frames": 12345}  # fmt: skip
        (run_dir / FINAL_TEST).write_text(json.dumps(final))


def write_study(study_dir: Path, runs: list[dict[str, Any]], name: str = "hand") -> None:
    """study.json as the study's master writes it: each run's name, env, seed, label, state."""
    study_dir.mkdir(parents=True, exist_ok=True)
    entries = [{"name": run["name"], "env": run["env"], "seed": run["seed"],
                "label": run.get("label"), "settings": {}, "budget": {"generations": 3},
                "state": run.get("state", "complete")} for run in runs]  # fmt: skip
    (study_dir / "study.json").write_text(json.dumps({"name": name, "runs": entries}))


FROSTBITE_TESTS = {1: 300.0, 2: 900.0, 3: 600.0}
FROSTBITE_FRAMES = {1: 40_000, 2: 60_000, 3: 50_000}
CARTPOLE_TESTS = {1: 500.0, 2: 480.0, 3: None}  # seed 3 has no final test
CARTPOLE_LAST_ELITE = 450.0
CARTPOLE_WORKER_S = {1: 3600.0, 2: 7200.0, 3: 1800.0}


@pytest.fixture
def study(tmp_path: Path) -> Path:
    """3 seeds x 2 envs: Frostbite (one of the paper's games, no worker_s: core-hours are
    estimated) and CartPole (not in the paper; worker_s; one run without a final test)."""
    study_dir = tmp_path / "study"
    runs = []
    for seed in (1, 2, 3):
        name = f"Frostbite-v4-s{seed}"
        end = FROSTBITE_FRAMES[seed]
        curve = [(end // 2, 100.0 * seed), (end, 200.0 * seed)]
        write_run(study_dir / "runs" / name, "Frostbite-v4", seed, curve, FROSTBITE_TESTS[seed])
        runs.append({"name": name, "env": "Frostbite-v4", "seed": seed})
    for seed in (1, 2, 3):
        name = f"CartPole-v1-s{seed}"
        curve = [(1000, 20.0), (2000, 100.0), (3000, CARTPOLE_LAST_ELITE)]
        worker_s = [CARTPOLE_WORKER_S[seed] / 3, CARTPOLE_WORKER_S[seed] / 2,
                    CARTPOLE_WORKER_S[seed]]  # fmt: skip
        write_run(study_dir / "runs" / name, "CartPole-v1", seed, curve, CARTPOLE_TESTS[seed],
                  worker_s)  # fmt: skip
        runs.append({"name": name, "env": "CartPole-v1", "seed": seed})
    write_study(study_dir, runs)
    return study_dir


def report(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def table_rows(markdown: str, first_header: str) -> list[dict[str, str]]:
    """The rows of the Markdown table whose first column is `first_header`, by header name."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    header = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True)))
    return rows


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 1000, path


# -- the report of a whole study ----------------------------------------------------------------


def test_study_table_sets_medians_and_ranges_beside_the_paper(
    study: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = report(str(study), capsys=capsys)
    assert code == 0, err
    out_dir = study / "report"
    document = json.loads((out_dir / "report.json").read_text())
    assert document["format"] == "neuro.report/1" and document["study"] == "hand"
    frostbite, cartpole = document["envs"]

    assert frostbite["env_id"] == "Frostbite-v4" and frostbite["game"] == "Frostbite"
    assert frostbite["score"] == {"median": 600.0, "min": 300.0, "max": 900.0, "runs": 3,
                                  "from_final_test": 3, "from_last_elite": 0}  # fmt: skip
    assert frostbite["frames"]["median"] == 50_000 and frostbite["frames"]["total"] == 150_000
    assert frostbite["frames"]["vs_paper"] == pytest.approx(50_000 / 1e9)
    assert frostbite["published"] == FROSTBITE
    rate = throughputs()["deepga/int8-static"]
    assert frostbite["core_hours"]["estimated"] is True
    assert frostbite["core_hours"]["total"] == pytest.approx(150_000 / (rate * 3600))
    assert frostbite["generations"]["median"] == 2

    assert cartpole["env_id"] == "CartPole-v1" and cartpole["game"] is None
    assert cartpole["published"] is None and cartpole["frames"]["vs_paper"] is None
    # Seed 3 has no final test: it counts with its last elite score, marked as such.
    assert cartpole["score"] == {"median": 480.0, "min": CARTPOLE_LAST_ELITE, "max": 500.0,
                                 "runs": 3, "from_final_test": 2, "from_last_elite": 1}  # fmt: skip
    assert cartpole["core_hours"] == {"total": 3.5, "estimated": False, "runs_unknown": 0}

    runs = {run["name"]: run for run in document["runs"]}
    assert runs["CartPole-v1-s3"]["score_source"] == LAST_ELITE_SOURCE
    assert runs["CartPole-v1-s1"]["score_source"] == FINAL_TEST_SOURCE
    assert runs["CartPole-v1-s1"]["test_episodes"] == 30
    assert runs["CartPole-v1-s3"]["dir"] == "runs/CartPole-v1-s3"  # relative to the study

    markdown = (out_dir / "report.md").read_text()
    rows = {row["env"]: row for row in table_rows(markdown, "env")}
    assert rows["Frostbite-v4"]["score median"] == "600.0"
    assert rows["Frostbite-v4"]["score range"] == "300.0 to 900.0"
    assert rows["Frostbite-v4"]["frames vs paper"] == "0.005% of 1B"
    assert rows["Frostbite-v4"]["core-hours"].endswith(" est.")
    for column, value in FROSTBITE.items():
        assert rows["Frostbite-v4"][f"{column} (paper)"] == f"{value:,}"
    assert rows["CartPole-v1"]["score median"] == "480.0 †"
    assert rows["CartPole-v1"]["score range"] == "450.0 to 500.0"
    assert rows["CartPole-v1"]["core-hours"] == "3.5"
    assert rows["CartPole-v1"]["frames vs paper"] == "—"
    assert all(rows["CartPole-v1"][f"{column} (paper)"] == "—" for column in FROSTBITE)
    assert "arXiv:1712.06567" in markdown and "† some runs have no final test" in markdown

    curves = [out_dir / "curves.png", out_dir / "curves" / "Frostbite-v4.png",
              out_dir / "curves" / "CartPole-v1.png"]  # fmt: skip
    for path in curves:
        assert_png(path)
        assert f"wrote {path}" in out
    assert f"wrote {out_dir / 'report.md'}" in out and f"wrote {out_dir / 'report.json'}" in out
    summary = out.split("\n\n")[0].splitlines()
    assert summary[0].split()[0] == "env"
    assert summary[1].startswith("Frostbite-v4") and "600.0 [300.0, 900.0]" in summary[1]
    assert "4,536" in summary[1]
    assert summary[2].startswith("CartPole-v1") and "480.0 [450.0, 500.0] †" in summary[2]


def test_curve_json_is_the_median_and_range_over_seeds(
    study: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert report(str(study), "--out", str(study / "elsewhere"), capsys=capsys)[0] == 0
    document = json.loads((study / "elsewhere" / "report.json").read_text())
    curve = document["envs"][1]["curve"]  # CartPole: the three seeds' curves are the same
    assert curve["file"] == "curves/CartPole-v1.png" and curve["spread"] == "min-max"
    assert curve["frames"][0] == 1000 and curve["frames"][-1] == 3000
    assert curve["median"][0] == 20.0 and curve["median"][-1] == CARTPOLE_LAST_ELITE
    assert curve["low"] == curve["median"] == curve["high"] and set(curve["runs"]) == {3}
    # The population's mean score per generation (write_run: half the elite's), drawn in the
    # same picture.
    mean = document["envs"][1]["mean_curve"]
    assert mean["file"] == curve["file"] and mean["frames"] == curve["frames"]
    assert mean["median"][0] == 10.0 and mean["median"][-1] == CARTPOLE_LAST_ELITE / 2


def test_setting_labels_are_rows_of_their_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    study_dir = tmp_path / "labels"
    runs = []
    for label, score in (("small", 10.0), ("big", 30.0)):
        for seed in (1, 2):
            name = f"CartPole-v1-{label}-s{seed}"
            write_run(study_dir / "runs" / name, "CartPole-v1", seed, [(100, 1.0)], score + seed)
            runs.append({"name": name, "env": "CartPole-v1", "seed": seed, "label": label})
    write_study(study_dir, runs)
    assert report(str(study_dir), capsys=capsys)[0] == 0
    rows = table_rows((study_dir / "report" / "report.md").read_text(), "env")
    assert [(row["label"], row["score range"]) for row in rows] == [
        ("small", "11.0 to 12.0"),
        ("big", "31.0 to 32.0"),
    ]
    assert_png(study_dir / "report" / "curves" / "CartPole-v1-small.png")
    assert_png(study_dir / "report" / "curves" / "CartPole-v1-big.png")


def test_plain_run_dirs_are_reported_together(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dirs = [study / "runs" / f"Frostbite-v4-s{seed}" for seed in (1, 2, 3)]
    out = tmp_path / "plain"
    code, _, err = report(*map(str, dirs), "--out", str(out), capsys=capsys)
    assert code == 0, err
    document = json.loads((out / "report.json").read_text())
    assert document["study"] is None and len(document["envs"]) == 1
    assert document["envs"][0]["score"]["median"] == statistics.median(FROSTBITE_TESTS.values())
    assert [run["seed"] for run in document["runs"]] == [1, 2, 3]  # from config.json


# -- the published figures ----------------------------------------------------------------------


def test_the_published_table_is_the_papers() -> None:
    published = load_published()
    assert "arXiv:1712.06567" in published.source and "Table 1" in published.source
    assert sorted(published.games) == sorted(PAPER_GAMES)
    assert {key: int(value) for key, value in published.games["Frostbite"].items()} == FROSTBITE
    for (game, column), value in ANCHORS.items():
        assert published.games[game][column] == value
    assert published.columns["GA"]["frames"] == 1_000_000_000
    assert published.columns["GA-6B"]["frames"] == 6_000_000_000
    assert all(set(row) == set(published.columns) for row in published.games.values())
    assert any("30" in note and "no-op" in note for note in published.notes)


@pytest.mark.parametrize(
    ("env_id", "game"),
    [("Frostbite-v4", "Frostbite"), ("ALE/Frostbite-v5", "Frostbite"),
     ("FrostbiteNoFrameskip-v4", "Frostbite"), ("ALE/Skiing-v5", "Skiing"),
     ("Pong-v4", None), ("CartPole-v1", None), ("NoSuchGame-v0", None), (None, None)],
)  # fmt: skip
def test_env_ids_map_to_the_papers_games(env_id: str | None, game: str | None) -> None:
    assert paper_game(env_id, PAPER_GAMES) == game


# -- robustness ---------------------------------------------------------------------------------


def test_damaged_run_dirs_are_reported_as_such(
    study: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs_dir = study / "runs"
    # Half-written: the master was killed while writing generation 1's line.
    half = runs_dir / "CartPole-v1-s2"
    metrics = (half / METRICS).read_text().splitlines(keepends=True)
    (half / METRICS).write_text(metrics[0] + metrics[1][: len(metrics[1]) // 2])
    (half / FINAL_TEST).unlink()
    # A final test cut short, a damaged middle line, an empty run dir, one never made.
    (runs_dir / "Frostbite-v4-s1" / FINAL_TEST).write_text('{"format": "neuro.final-test/1", "me')
    damaged = runs_dir / "Frostbite-v4-s2" / METRICS
    lines = damaged.read_text().splitlines(keepends=True)
    damaged.write_text("{not json\n" + "".join(lines))
    (runs_dir / "Pong-v4-s1").mkdir()
    # Started, no generation finished yet; and a file where the run dir should be.
    (runs_dir / "Pong-v4-s3").mkdir()
    (runs_dir / "Pong-v4-s3" / CONFIG).write_text(json.dumps({"env_id": "Pong-v4"}))
    (runs_dir / "Pong-v4-s4").write_text("not a dir")
    study_json = json.loads((study / "study.json").read_text())
    study_json["runs"] += [
        {"name": f"Pong-v4-s{seed}", "env": "Pong-v4", "seed": seed, "state": state}
        for seed, state in ((1, "running"), (2, "queued"), (3, "running"), (4, "failed"))
    ]
    (study / "study.json").write_text(json.dumps(study_json))

    code, out, err = report(str(study), capsys=capsys)
    assert code == 0, err
    document = json.loads((study / "report" / "report.json").read_text())
    runs = {run["name"]: run for run in document["runs"]}
    assert runs["CartPole-v1-s2"]["generations"] == 1  # the complete line only
    assert runs["CartPole-v1-s2"]["score"] == 20.0
    assert runs["CartPole-v1-s2"]["score_source"] == LAST_ELITE_SOURCE
    assert any("half-written last line 2" in p for p in runs["CartPole-v1-s2"]["problems"])
    assert runs["Frostbite-v4-s1"]["score_source"] == LAST_ELITE_SOURCE
    assert any(f"{FINAL_TEST} unreadable" in p for p in runs["Frostbite-v4-s1"]["problems"])
    assert runs["Frostbite-v4-s2"]["generations"] == 2
    assert any("line 1 is damaged" in p for p in runs["Frostbite-v4-s2"]["problems"])
    assert runs["Pong-v4-s1"]["problems"] == ["empty run dir"]
    assert runs["Pong-v4-s2"]["problems"] == ["no run dir yet"]
    assert runs["Pong-v4-s3"]["problems"] == [f"no {METRICS}: no generation finished"]
    assert runs["Pong-v4-s4"]["problems"][0].startswith("run dir unreadable")
    for seed in (1, 2, 3, 4):
        assert runs[f"Pong-v4-s{seed}"]["generations"] == 0
        assert runs[f"Pong-v4-s{seed}"]["score"] is None
    pong = document["envs"][-1]
    assert pong["env_id"] == "Pong-v4" and pong["score"] is None and pong["curve"] is None
    rows = {row["run"]: row for row in table_rows((study / "report" / "report.md").read_text(),
                                                  "run")}  # fmt: skip
    assert rows["Pong-v4-s1"]["notes"] == "empty run dir"
    assert rows["Pong-v4-s2"]["state"] == "queued"
    assert "half-written" in rows["CartPole-v1-s2"]["notes"]
    # The seven above, and CartPole's seed 3, which never had a final test.
    assert "8 of 10 runs have notes" in out


def test_an_empty_study_writes_a_report_without_curves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    study_dir = tmp_path / "fresh"
    write_study(study_dir, [{"name": "CartPole-v1-s1", "env": "CartPole-v1", "seed": 1,
                             "state": "queued"}])  # fmt: skip
    code, out, err = report(str(study_dir), capsys=capsys)
    assert code == 0, err
    assert not (study_dir / "report" / "curves.png").exists()
    assert (
        "No run has finished a generation yet." in (study_dir / "report" / "report.md").read_text()
    )
    assert "no learning curves: no run has finished a generation yet" in out


def test_without_matplotlib_the_table_and_json_are_still_written(
    study: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import raises ImportError
    code, out, err = report(str(study), capsys=capsys)
    assert code == 0, err
    assert json.loads((study / "report" / "report.json").read_text())["envs"][0]["score"]
    assert "Not drawn: matplotlib is missing" in (study / "report" / "report.md").read_text()
    assert not (study / "report" / "curves.png").exists()
    assert "no learning curves: matplotlib is missing" in out


def test_neuro_master_report_is_the_subcommand(
    study: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert master_main(["report", str(study), "--out", str(study / "via-cli")]) == 0
    assert (study / "via-cli" / "report.md").is_file()
    assert f"wrote {study / 'via-cli' / 'report.json'}" in capsys.readouterr().out


def test_core_hours_without_worker_s_or_a_measured_rate_are_unknown(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    write_run(run_dir, "CartPole-v1", 1, [(500, 10.0)], 12.0)
    outcome = read_run(RunEntry("run", run_dir), throughput={})
    assert outcome.core_hours is None and not outcome.core_hours_estimated
    assert any("no measured throughput for mlp/float32" in p for p in outcome.problems)
    estimated = read_run(RunEntry("run", run_dir), throughput={"mlp/float32": 0.5})
    assert (
        estimated.core_hours == pytest.approx(500 / 0.5 / 3600) and estimated.core_hours_estimated
    )


@pytest.mark.parametrize("kind", ["missing", "plain folder", "file"])
def test_a_path_that_is_no_study_dir_is_refused_by_name(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "not-a-study"
    if kind == "plain folder":
        path.mkdir()
        (path / "notes.txt").write_text("hello")
    elif kind == "file":
        path.write_text("hello")
    code, out, err = report(str(path), capsys=capsys)
    assert code == 2 and out == ""
    assert str(path) in err and ("study dir" in err)
    assert not (path / "report").exists()


@pytest.mark.parametrize(
    ("study_json", "expected"),
    [("{\"name\": \"x\", \"runs\": [", "is not JSON"),
     ('{"name": "x"}', "lists no runs"),
     ('{"runs": [{"name": "../escape", "env": "CartPole-v1"}]}', "'../escape'")],
)  # fmt: skip
def test_a_broken_study_json_is_refused_by_name(
    tmp_path: Path, study_json: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "study.json").write_text(study_json)
    code, _, err = report(str(tmp_path), capsys=capsys)
    assert code == 2 and str(tmp_path / "study.json") in err and expected in err


# -- the curves' band ---------------------------------------------------------------------------


def test_curve_band_interpolates_each_run_onto_one_grid() -> None:
    band = curve_band([[(0, 0.0), (100, 100.0)], [(0, 10.0), (50, 20.0)]], points=3)
    assert band is not None and band.spread == "min-max"
    assert band.frames == (0.0, 50.0, 100.0)
    assert band.runs == (2, 2, 1)  # the second run ends at 50 frames: not extrapolated
    assert band.median == (5.0, 35.0, 100.0)
    assert band.low == (0.0, 20.0, 100.0) and band.high == (10.0, 50.0, 100.0)


def test_curve_band_from_four_runs_is_interquartile() -> None:
    curves = [[(0, float(v)), (10, float(v))] for v in (0, 10, 20, 30)]
    band = curve_band(curves, points=2)
    assert band is not None and band.spread == "interquartile"
    assert band.median == (15.0, 15.0) and band.low == (7.5, 7.5) and band.high == (22.5, 22.5)
    assert curve_band([[], []]) is None


# -- a real run ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_real_cartpole_run_dir_is_reported(tmp_path: Path, noise_cache: Path) -> None:
    run_dir = tmp_path / "run"
    train = [sys.executable, "-m", "master", *LOCAL_CARTPOLE_ARGS, "--generations", "2",
             "--population", "6", "--quiet", "--run-dir", str(run_dir)]  # fmt: skip
    done = subprocess.run(train, env=worker_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "report"
    done = subprocess.run([*CLI, "report", str(run_dir), "--out", str(out)], env=worker_env(),
                          cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"wrote {out / 'report.md'}" in done.stdout
    last = json.loads((run_dir / METRICS).read_text().splitlines()[-1])
    document = json.loads((out / "report.json").read_text())
    (env,) = document["envs"]
    assert env["env_id"] == "CartPole-v1" and env["game"] is None
    assert env["generations"]["median"] == 2 and env["frames"]["total"] == last["frames"]
    (run,) = document["runs"]
    expected = FINAL_TEST_SOURCE if (run_dir / FINAL_TEST).exists() else LAST_ELITE_SOURCE
    assert run["score_source"] == expected and math.isfinite(run["score"])
    if expected == LAST_ELITE_SOURCE:
        assert run["score"] == last["elite_score"]
    assert_png(out / "curves" / "CartPole-v1.png")
