"""`neuro-deploy estimate --study FILE`: a study file read by deploy/ alone (no master import)
agrees with the master's reading of it, and is priced with the simulated fleet; bad input is
refused naming the run and the value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deploy import cli, fleet, study
from master.study import file as master_study
from tests.deploy.test_deploy_cost import (
    FARGATE_SPOT_GB,
    FARGATE_SPOT_VCPU,
    MASTER_ON_DEMAND,
    Stubs,
    data_figure,
    expect_fargate,
    expect_master,
    loopback_only,  # noqa: F401 (a fixture)
    use_clients,
)
from tests.support.processes import REPO

STUDIES = REPO / "master" / "studies"


def estimate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["estimate", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_bounds_and_names_are_the_masters() -> None:
    for name in (
        "MAX_STUDY_BYTES",
        "MAX_RUNS",
        "MAX_CONCURRENT_RUNS",
        "DEFAULT_CONCURRENT_RUNS",
        "MAX_FRAMES",
        "MAX_GENERATIONS",
        "MAX_TEST_EPISODES",
        "DEFAULT_TEST_EPISODES",
    ):
        assert getattr(study, name) == getattr(master_study, name), name  # fmt: skip
    for env, label, seed in (("Frostbite-v4", "", 0), ("ALE/Pong-v5", "small", 2), ("-", "", 7)):
        assert study.derived_name(env, label, seed) == master_study.derived_name(env, label, seed)


@pytest.mark.parametrize("name", ["paper", "laptop"])
def test_a_ready_study_reads_as_the_master_reads_it(name: str) -> None:
    priced = study.read_study(str(STUDIES / f"{name}.toml"))
    checked = master_study.load_study(name)
    assert priced.name == checked.name
    assert priced.max_concurrent_runs == checked.max_concurrent_runs
    assert [r.name for r in priced.runs] == [r.name for r in checked.runs]
    for mine, theirs in zip(priced.runs, checked.runs, strict=True):
        config = theirs.config
        assert (mine.env, mine.test_episodes) == (theirs.env, theirs.test_episodes)
        assert (mine.frames, mine.generations) == (config.frames, config.generations)
        if config.atari:  # the master's default generation is the paper's for Atari only
            ga = config.sections["ga"]
            assert mine.tasks_per_generation == ga.population_size + (
                ga.elite_candidates * ga.elite_episodes
            )


def test_the_paper_table_on_a_fleet_of_1000(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = estimate(capsys, "--study", str(STUDIES / "paper.toml"), "--workers",
                              "1000", "--price", "0.02", "--json")  # fmt: skip
    assert code == 0, err
    result = json.loads(out)
    assert result["budget"]["runs"] == 65 and result["budget"]["max_concurrent_runs"] == 65
    assert result["cost"]["frames"] == 65e9
    vcpu_hours = 65e9 / (data_figure() * 3600)
    line = fleet.timeline([vcpu_hours / 65] * 65, 65, 1000, fleet.utilisation_table())
    assert result["cost"]["vcpu_hours"] == pytest.approx(vcpu_hours)
    assert result["cost"]["utilisation"] == pytest.approx(line.utilisation)
    assert result["cost"]["wall_hours"] == pytest.approx(line.wall_hours)
    # The fleet is paid for all its hours, busy or not.
    assert result["cost"]["worker_usd"] == pytest.approx(1000 * line.wall_hours * 0.02)
    sizes = result["fleet_sizes"]
    assert [s["workers"] for s in sizes] == list(fleet.FLEET_SIZES)
    walls = [s["wall_hours"] for s in sizes]
    assert walls == sorted(walls, reverse=True)  # more workers, sooner
    cheapest = min(s["total_usd"] for s in sizes)
    picked = next(s for s in sizes if s["workers"] == result["suggested_workers"])
    assert picked["total_usd"] <= cheapest * (1 + fleet.COST_TOLERANCE)
    assert all(s["wall_hours"] >= picked["wall_hours"] for s in sizes
               if s["total_usd"] <= cheapest * (1 + fleet.COST_TOLERANCE))  # fmt: skip


def test_a_study_priced_at_the_regions_prices(
    loopback_only: None,  # noqa: F811 (the fixture)
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    file = tmp_path / "two.toml"
    file.write_text('name = "two"\nmax_concurrent_runs = 2\n[budget]\nframes = 50_000_000\n'
                    '[[grid]]\nenvs = ["Frostbite-v4", "Seaquest-v4"]\nseeds = [3]\n'
                    '[[run]]\nenv = "Pong-v4"\nname = "pong"\nbudget = { generations = 10 }\n'
                    'settings = { population = 200, elite_episodes = 5 }\n')  # fmt: skip
    stubs = Stubs("us-east-1")
    expect_fargate(stubs.pricing_stub, "us-east-1")
    expect_master(stubs.pricing_stub, "us-east-1")
    use_clients(monkeypatch, stubs.clients)
    code = cli.main(["--stack-name", "s", "estimate", "--study", str(file), "--workers", "64",
                     "--episode-steps", "500", "--fleet-sizes", "8", "64", "512"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    stubs.assert_used_up()
    per_vcpu_hour = float(FARGATE_SPOT_VCPU) + float(FARGATE_SPOT_GB) * 4
    # Two runs of 50M frames and one of 10 generations of (200 + 10 x 5) episodes, each with
    # 30 test episodes, at 500 steps of 4 frames.
    frames = [50e6 + 30 * 2000, 50e6 + 30 * 2000, 10 * 250 * 2000 + 30 * 2000]
    works = [f / (data_figure() * 3600) for f in frames]
    line = fleet.timeline(works, 2, 64, fleet.utilisation_table(), [1300, 1300, 250])
    assert f"budget: {sum(frames):,.0f} frames: study two, 3 runs, 2 at once" in out
    assert f"fleet: 64 workers busy {line.utilisation:.1%} of the time" in out
    assert f"wall clock: {line.wall_hours:,.2f} h at 64 workers" in out
    assert f"workers: {64 * line.wall_hours * per_vcpu_hour:,.2f} USD" in out
    master_usd = line.wall_hours * float(MASTER_ON_DEMAND)
    assert f"master: c5.large on demand for {line.wall_hours:,.2f} h" in out
    assert f"{master_usd:,.2f} USD" in out
    assert out.count("<- soonest for the money") == 1
    for workers in (8, 64, 512):
        assert f"{workers:>8,} " in out


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "study.toml"
    path.write_text(text)
    return str(path)


GRID = '[[grid]]\nenvs = ["Frostbite-v4"]\nseeds = 2\n'


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[budget]\nframes = 1000\n[settings]\npopulation_size = 0\n" + GRID,
         "run frostbite-v4-s0 ([[grid]] 1): population_size must be an integer in "
         "[1, 1,000,000], got 0"),
        ("[budget]\nframes = 1e12\n" + GRID,
         "run frostbite-v4-s0 ([[grid]] 1): frames must be an integer in "
         "[1, 100,000,000,000], got 1000000000000.0"),
        (GRID, "run frostbite-v4-s0 ([[grid]] 1): no budget: give generations or frames"),
        ("max_concurrent_runs = 0\n[budget]\nframes = 1000\n" + GRID,
         "the study: max_concurrent_runs must be an integer in [1, 256], got 0"),
        ('[budget]\nframes = 1000\n[[grid]]\nenvs = ["A-v4", "B-v4"]\nseeds = 600\n',
         "more than 1000 runs"),
        ("[budget]\nframes = 1000\n[[run]]\nseed = 1\n", "[[run]] 1: give its env"),
        ("name = [", "not a TOML file"),
    ],
)  # fmt: skip
def test_bad_studies_are_refused_naming_the_run_and_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, named: str
) -> None:
    code, _, err = estimate(capsys, "--study", write(tmp_path, text), "--price", "0.02")
    assert code == 1
    assert named in err


def test_a_missing_or_huge_file_and_mixed_flags_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = estimate(capsys, "--study", str(tmp_path / "none.toml"), "--price", "0.02")
    assert code == 1 and "none.toml: no such file" in err
    huge = tmp_path / "huge.toml"
    huge.write_text("# " + "x" * study.MAX_STUDY_BYTES)
    code, _, err = estimate(capsys, "--study", str(huge), "--price", "0.02")
    assert code == 1 and "more than 1048576 bytes" in err
    generations = write(tmp_path, "[budget]\ngenerations = 5\n" + GRID)
    code, _, err = estimate(capsys, "--study", generations, "--price", "0.02")
    assert (
        code == 1
        and "run frostbite-v4-s0: its budget is 5 generations; pass --episode-steps" in err
    )
    code, _, err = estimate(capsys, "--study", generations, "--population", "10", "--price", "1")
    assert code == 1 and "--population goes with --generations: a study sets its own" in err
    with pytest.raises(SystemExit) as exit_:
        cli.main(["estimate", "--study", generations, "--frames", "1e9"])
    assert exit_.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--fleet-sizes", "0"], "--fleet-sizes: expected 1 or more, got '0'"),
        (["--fleet-sizes", "5001"], "--fleet-sizes: expected at most 5000"),
        (["--fleet-sizes", *map(str, range(1, 52))], "--fleet-sizes: at most 50 sizes, got 51"),
    ],
)
def test_fleet_sizes_are_bounded(
    capsys: pytest.CaptureFixture[str], argv: list[str], named: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["estimate", "--price", "0.02", *argv])
    assert exit_.value.code == 2
    assert named in capsys.readouterr().err


def test_one_run_gets_the_fleet_table_too(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = estimate(capsys, "--price", "0.02", "--workers", "1000", "--json")
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    u = fleet.utilisation_table().at(1000, 1, 1300)
    assert result["cost"]["utilisation"] == pytest.approx(u)
    assert result["fleet"]["runs_at_once"] == 1
    # One run keeps a big fleet idle most of the time: a smaller fleet is as quick for less.
    assert result["suggested_workers"] < 1000
