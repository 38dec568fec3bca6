"""deploy/fleet.py: the simulated utilisation table as `estimate` reads it, and runs laid out
on a fleet from it."""

from __future__ import annotations

import json
import math

import pytest

from deploy import fleet
from tests.support.processes import REPO

DATA_FILE = REPO / "deploy" / fleet.UTILISATION_NAME


def document() -> dict:
    return json.loads(DATA_FILE.read_text())


def test_the_packaged_table_says_how_it_was_made_and_is_read_as_written() -> None:
    doc = document()
    assert doc["command"].startswith("python -m bench.fleet_study utilisation")
    assert doc["revision"] and doc["date"] and doc["generation"]["population"] == 1000
    table = fleet.utilisation_table()
    assert table.tasks_per_generation == 1000 + 10 * 30
    for i, workers in enumerate(doc["workers"]):
        for j, runs in enumerate(doc["runs_at_once"]):
            assert table.at(workers, runs) == doc["utilisation"][i][j]


def test_more_runs_at_once_keep_a_big_fleet_busier() -> None:
    """What the study is for: at 1,000 workers the simulated utilisation grows with the runs
    served at once, from a poor one for a single run."""
    table = fleet.utilisation_table()
    row = [table.at(1000, runs) for runs in table.runs_at_once]
    assert row == sorted(row) and row[0] < 0.5 < row[-1]


def test_between_the_points_it_interpolates_and_beyond_them_it_takes_the_edge() -> None:
    doc = {"command": "c", "generation": {"population": 1000, "elite_candidates": 10,
                                          "elite_episodes": 30},
           "workers": [10, 1000], "runs_at_once": [1, 4],
           "utilisation": [[0.9, 1.0], [0.3, 0.7]]}  # fmt: skip
    table = fleet.utilisation_table(doc)
    assert table.at(100, 1) == pytest.approx(0.6)  # halfway in log workers
    assert table.at(1000, 2) == pytest.approx(0.5)  # halfway in log runs
    assert table.at(1, 1) == 0.9 and table.at(10**6, 1) == 0.3 and table.at(1000, 50) == 0.7
    # A generation of 650 tasks on 2,000 workers has the tasks per worker of 1,300 on 1,000.
    assert table.at(2000, 1, tasks_per_generation=650) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="workers must be > 0 and runs >= 1, got 0 and 1"):
        table.at(0, 1)


@pytest.mark.parametrize(
    "change",
    [{"utilisation": [[0.9, 1.2], [0.3, 0.7]]}, {"workers": [1000, 10]},
     {"utilisation": [[0.9], [0.3]]}, {"utilisation": [[0.9, 0.0], [0.3, 0.7]]}],
)  # fmt: skip
def test_a_malformed_table_is_refused(change: dict) -> None:
    doc = {"command": "c", "generation": {"population": 1000, "elite_candidates": 10,
                                          "elite_episodes": 30},
           "workers": [10, 1000], "runs_at_once": [1, 4],
           "utilisation": [[0.9, 1.0], [0.3, 0.7]], **change}  # fmt: skip
    with pytest.raises(ValueError, match="not a table of utilisations"):
        fleet.utilisation_table(doc)


def flat(u1: float, u2: float) -> fleet.UtilisationTable:
    doc = {"command": "c", "generation": {"population": 1000, "elite_candidates": 10,
                                          "elite_episodes": 30},
           "workers": [1, 100000], "runs_at_once": [1, 2],
           "utilisation": [[u1, u2], [u1, u2]]}  # fmt: skip
    return fleet.utilisation_table(doc)


def test_one_run_takes_its_work_over_the_busy_fleet() -> None:
    line = fleet.timeline([100.0], 1, 50, flat(0.5, 1.0))
    assert line.wall_hours == pytest.approx(100 / (50 * 0.5))
    assert line.utilisation == pytest.approx(0.5)


def test_runs_share_the_fleet_and_the_queue_waits_for_a_place() -> None:
    table = flat(0.5, 0.8)
    # One at a time: each alone, at one run's utilisation.
    one = fleet.timeline([100.0, 100.0], 1, 10, table)
    assert one.run_end_hours == pytest.approx((20.0, 40.0))
    # Together: both at two runs' utilisation, sharing it equally, ending together.
    two = fleet.timeline([100.0, 100.0], 2, 10, table)
    assert two.run_end_hours == pytest.approx((25.0, 25.0))
    # Unequal work: the short run ends first, then the long one goes on alone.
    mixed = fleet.timeline([40.0, 100.0], 2, 10, table)
    first = 80 / (10 * 0.8)
    assert mixed.run_end_hours == pytest.approx((first, first + 60 / (10 * 0.5)))
    assert mixed.utilisation == pytest.approx(140 / (10 * mixed.wall_hours))


def test_a_timeline_refuses_what_is_no_plan() -> None:
    with pytest.raises(ValueError, match="each must be >= 1"):
        fleet.timeline([], 1, 10, flat(0.5, 0.8))
    with pytest.raises(ValueError, match="positive number of vCPU-hours"):
        fleet.timeline([math.inf], 1, 10, flat(0.5, 0.8))
