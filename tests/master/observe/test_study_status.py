"""A study's runs in the Status answer, neuro-master status and /metrics: a real grpc.aio
master and a real metrics server on loopback, whose figures come from a stand-in study."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
import math
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from master.fleet.fleet import Fleet
from master.fleet.phases import FleetSettings
from master.fleet.service import EvolutionService, add_to_server
from master.fleet.tasks import task_template
from master.observe import status as status_cli
from master.observe.events import GenerationRecord, RunSnapshot, RunView
from master.observe.prometheus import start_metrics_server
from neuro.wire import MAX_ERROR_CHARS
from tests.support.tiny import tiny_cartpole

CLIENT_ENV = ("NEURO_TOKEN", "NEURO_TOKEN_FILE", "NEURO_TLS_CA", "NEURO_MASTER")


@pytest.fixture(autouse=True)
def _no_client_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CLIENT_ENV:
        monkeypatch.delenv(name, raising=False)


def snapshot(run_id: str = "study", generation: int = 0, frames: int = 0,
             elite: float = math.nan, workers: int = 3, **fields: Any) -> RunSnapshot:  # fmt: skip
    values: dict[str, Any] = dict(
        run_id=run_id, env_id="CartPole-v1", generation=generation, phase="offspring",
        frames=frames, evaluations=frames // 20, elite_score=elite, elite_seeds=(),
        tasks_pending=5, tasks_leased=2, tasks_done=1, workers=workers, leases_reissued=0,
        run_complete=False, wall_s=1.0,
    )  # fmt: skip
    values.update(fields)
    return RunSnapshot(**values)


RUNS = (
    RunView("cartpole-v1-s0", "CartPole-v1", 0, "", "complete",
            snapshot("cartpole-v1-s0", 15, 120_000, 500.0)),
    RunView("frostbite-v4-t10-s1", "Frostbite-v4", 1, "t10", "running",
            snapshot("frostbite-v4-t10-s1", 7, 2_500_000, 228.5)),
    RunView("frostbite-v4-t10-s2", "Frostbite-v4", 2**63 - 1, "t10", "queued", None),
    RunView("memorize-s0", "neuro/Memorize-K10-v0", 0, "", "failed", None,
            error="checkpoint write failed:\n\x1b[2Jdisk full " + "x" * 2000),
)  # fmt: skip


@dataclass(frozen=True)
class StandInStudy:
    """The figures a study's master answers Status with: the fleet's, and each run's."""

    fleet: RunSnapshot
    views: tuple[RunView, ...]
    busy: float | None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fleet, name)

    def runs(self) -> tuple[RunView, ...]:
        return self.views

    def utilisation(self) -> float | None:
        return self.busy


@contextlib.asynccontextmanager
async def master_answering(figures: Callable[[], Any]) -> AsyncIterator[str]:
    """A real Evolution server on loopback whose Status reads `figures`; its address."""
    server = grpc.aio.server()
    fleet = Fleet(FleetSettings(run_id="study", run_seed=1))
    add_to_server(EvolutionService(fleet, task_template(tiny_cartpole()), figures), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


def status_of(figures: Callable[[], Any], *argv: str) -> tuple[int, str]:
    """neuro-master status against a master answering with `figures`: exit code, stdout."""

    async def scenario() -> tuple[int, str]:
        async with master_answering(figures) as address:
            return await asyncio.to_thread(_run_cli, "--master", address, *argv)

    return asyncio.run(scenario())


def _run_cli(*argv: str) -> tuple[int, str]:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = status_cli.main(list(argv))
    return code, buffer.getvalue()


def test_status_lists_a_studys_runs_and_the_fleets_utilisation() -> None:
    figures = StandInStudy(snapshot(workers=3), RUNS, 0.874)
    code, out = status_of(lambda: figures, "--json")
    assert code == 0
    answer = json.loads(out)
    assert answer["utilisation"] == pytest.approx(0.874)
    assert answer["workers"] == 3 and answer["run_id"] == "study"
    runs = answer["runs"]
    assert [r["name"] for r in runs] == [v.name for v in RUNS]
    assert runs[0] == {"name": "cartpole-v1-s0", "env_id": "CartPole-v1", "seed": 0, "label": "",
                       "state": "complete", "generation": 15, "frames": 120_000,
                       "elite_score": 500.0, "error": ""}  # fmt: skip
    assert runs[1]["label"] == "t10" and runs[1]["elite_score"] == 228.5
    # Not started: no figures, and no elite (NaN on the wire, null here).
    assert runs[2] == {"name": "frostbite-v4-t10-s2", "env_id": "Frostbite-v4", "seed": 2**63 - 1,
                       "label": "t10", "state": "queued", "generation": 0, "frames": 0,
                       "elite_score": None, "error": ""}  # fmt: skip
    assert runs[3]["state"] == "failed"
    assert runs[3]["error"] == RUNS[3].error[:MAX_ERROR_CHARS]  # bounded, as a worker's

    code, human = status_of(lambda: figures)
    assert code == 0
    lines = human.splitlines()
    assert lines[:2] == ["study         study",
                         "runs          4: 1 running, 1 queued, 1 complete, 1 failed"]  # fmt: skip
    assert "complete      no" in lines and "busy          87% of the workers' time, lately" in lines
    # A study's figures are its runs': no generation or elite of its own.
    assert not [line for line in lines if line.startswith(("generation ", "elite score", "env "))]
    table = lines[lines.index("") + 1 :]
    assert table[0].split() == ["run", "env", "seed", "state", "generation", "frames", "elite"]
    assert table[1].split() == ["cartpole-v1-s0", "CartPole-v1", "0", "complete", "15",
                                "120,000", "500.00"]  # fmt: skip
    assert table[2].split() == ["frostbite-v4-t10-s1", "Frostbite-v4", "1", "running", "7",
                                "2,500,000", "228.50"]  # fmt: skip
    assert table[3].split() == ["frostbite-v4-t10-s2", "Frostbite-v4", str(2**63 - 1), "queued",
                                "0", "0", "-"]  # fmt: skip
    # A run's error, on its line: escaped, so it can neither break the table nor drive the
    # terminal.
    assert table[4].startswith("memorize-s0 ") and "failed:\\n\\x1b[2Jdisk full xxx" in table[4]
    assert len(table) == 5 and "\x1b" not in human


def test_unknown_utilisation_stays_unset() -> None:
    for busy in (None, math.nan):
        figures = StandInStudy(snapshot(), RUNS[:1], busy)
        code, out = status_of(lambda figures=figures: figures, "--json")
        assert code == 0 and json.loads(out)["utilisation"] is None
        code, human = status_of(lambda figures=figures: figures)
        assert "busy " not in human and "runs          1: 1 complete" in human.splitlines()


def test_a_single_runs_answer_lists_no_runs_and_reads_as_before() -> None:
    """A RunSnapshot alone (a single run's master) has neither runs() nor utilisation()."""
    run = snapshot("cartpole-run", 2, 4000, 120.0)
    code, out = status_of(lambda: run, "--json")
    answer = json.loads(out)
    assert code == 0 and answer["runs"] == [] and answer["utilisation"] is None
    assert answer["generation"] == 2 and answer["elite_score"] == 120.0
    code, human = status_of(lambda: run)
    assert human.splitlines()[0] == "run           cartpole-run"
    assert "busy" not in human and "runs " not in human and "\n\n" not in human


# -- Prometheus -------------------------------------------------------------------------------


class StandInTrainer:
    """A Snapshots: the fleet-wide figures of the master."""

    def __init__(self, figures: RunSnapshot) -> None:
        self.figures = figures

    def snapshot(self, workers: bool = False) -> RunSnapshot:
        return self.figures


class StandInView:
    """A StudyView whose runs the test sets."""

    def __init__(self, runs: tuple[RunView, ...], busy: float | None) -> None:
        self.views, self.busy = runs, busy

    def runs(self) -> tuple[RunView, ...]:
        return self.views

    def utilisation(self) -> float | None:
        return self.busy


def scrape(trainer: StandInTrainer, study: StandInView | None) -> dict[str, dict[tuple, float]]:
    """/metrics of a real metrics server, fetched over loopback as Prometheus would."""

    async def scenario() -> str:
        server = start_metrics_server(trainer, "127.0.0.1", 0, study=study)
        try:
            return await asyncio.to_thread(_get, server.url)
        finally:
            await server.close()

    return parse_labelled(asyncio.run(scenario()))


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


def parse_labelled(text: str) -> dict[str, dict[tuple, float]]:
    """sample name -> {((label, value), ...): value}, read by Prometheus's own parser."""
    parsed: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            parsed.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return parsed


def test_metrics_label_each_run_of_a_study() -> None:
    last = GenerationRecord(generation=6, frames=2_500_000, evaluations=9000, wall_s=60.0,
                            score_mean=133.25, score_max=300.0, elite_score=228.5,
                            elite_seeds=[1], generation_evaluations=60, generation_frames=1000,
                            failed_evaluations=0, leases_reissued=0)  # fmt: skip
    runs = list(RUNS)
    runs[1] = dataclasses.replace(
        RUNS[1], snapshot=dataclasses.replace(RUNS[1].snapshot, last_record=last)
    )
    samples = scrape(StandInTrainer(snapshot(workers=3)), StandInView(tuple(runs), 0.874))
    # The fleet-wide names are there as for a single run, unlabelled.
    assert samples["neuro_workers_connected"] == {(): 3.0}
    assert samples["neuro_fleet_utilisation"] == {(): pytest.approx(0.874)}
    assert samples["neuro_study_runs"] == {
        (("state", "queued"),): 1.0, (("state", "running"),): 1.0,
        (("state", "complete"),): 1.0, (("state", "failed"),): 1.0,
    }  # fmt: skip
    info = samples["neuro_study_run_info"]
    assert info[(("env", "Frostbite-v4"), ("label", "t10"), ("run", "frostbite-v4-t10-s2"),
                 ("seed", str(2**63 - 1)))] == 1.0  # fmt: skip
    assert len(info) == 4
    states = samples["neuro_study_run_state"]
    assert len(states) == 4 * 4
    for run in runs:
        for state in ("queued", "running", "complete", "failed"):
            assert states[(("run", run.name), ("state", state))] == float(run.state == state)
    # Figures for the runs this master served (a snapshot); none for the others.
    assert samples["neuro_study_run_generation"] == {
        (("run", "cartpole-v1-s0"),): 15.0, (("run", "frostbite-v4-t10-s1"),): 7.0,
    }  # fmt: skip
    assert samples["neuro_study_run_frames_total"] == {
        (("run", "cartpole-v1-s0"),): 120_000.0, (("run", "frostbite-v4-t10-s1"),): 2_500_000.0,
    }  # fmt: skip
    assert samples["neuro_study_run_elite_score"][(("run", "frostbite-v4-t10-s1"),)] == 228.5
    assert samples["neuro_study_run_score_mean"] == {(("run", "frostbite-v4-t10-s1"),): 133.25}
    unknown = scrape(StandInTrainer(snapshot()), StandInView(tuple(runs[2:]), None))
    assert math.isnan(unknown["neuro_fleet_utilisation"][()])
    assert "neuro_study_run_generation" not in unknown  # no run has figures: no samples


def test_a_single_runs_metrics_have_no_study_series() -> None:
    samples = scrape(StandInTrainer(snapshot("cartpole-run", 2, 4000, 120.0)), None)
    assert samples["neuro_generation"] == {(): 2.0} and samples["neuro_elite_score"] == {(): 120.0}
    assert not [name for name in samples if "study" in name or "utilisation" in name]
