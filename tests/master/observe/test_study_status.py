"""A study's runs in the Status answer and neuro-master status, from a real grpc.aio master on
loopback whose figures come from a stand-in study (the master's study serving provides them)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from master.fleet.fleet import Fleet
from master.fleet.phases import FleetSettings
from master.fleet.service import EvolutionService, add_to_server
from master.fleet.tasks import task_template
from master.observe import status as status_cli
from master.observe.events import RunSnapshot, RunView
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
    assert "busy          87% of the workers' time, lately" in lines
    assert "runs          4: 1 running, 1 queued, 1 complete, 1 failed" in lines
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
        assert "busy " not in human and "runs          1: 1 complete" in human


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
