"""The Python API's facade: `import neuro` stays light (no torch, neither side) until
neuro.train or neuro.load_policy is asked for, and neuro.train refuses what cannot run,
naming it, before any run dir or process exists."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import neuro
from tests.support.processes import REPO, worker_env

PROBE = """
import sys
import neuro

def loaded():
    sides = sorted({name.split(".")[0] for name in sys.modules} & {"master", "worker", "torch"})
    return ",".join(sides) or "-"

print(loaded())
neuro.train
print(loaded())
neuro.load_policy
print(loaded())
"""


def test_import_neuro_loads_neither_side_until_asked() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], env=worker_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    # train brings the master (torch-free); load_policy the worker, whose torch loads when a
    # policy is built.
    assert done.stdout.split() == ["-", "master", "master,worker"]


def test_the_package_names_the_api() -> None:
    from master.api import Result, train
    from worker.offline.loading import load_policy

    assert (neuro.train, neuro.Result, neuro.load_policy) == (train, Result, load_policy)
    assert set(neuro.__all__) == {"train", "load_policy", "Result"}
    with pytest.raises(AttributeError, match="no attribute 'trian'"):
        neuro.trian  # noqa: B018


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"populaton": 10}, ValueError, "unknown setting 'populaton' (did you mean population?)"),
        ({"population": 0}, ValueError, "population_size must be"),
        ({"budget": {"hours": 3}}, ValueError, "budget keys are generations, frames, "),
        ({"budget": 2, "generations": 3}, ValueError, "generations is given twice"),
        ({"budget": "10"}, ValueError, "budget is generations (an int) or a mapping"),
        ({"workers": -1}, ValueError, "workers must be an integer >= 0, got -1"),
        ({"workers": 0}, ValueError, "workers=0 with no master address: nothing would train"),
        ({"master": "8080"}, ValueError, "master must look like host:port"),
        ({"master": "0.0.0.0:8080"}, ValueError, "accepts connections from other machines"),
        ({"policy": "transformer"}, ValueError, "transformer"),
        ({"algo": "ppo"}, ValueError, "ppo"),
    ],
)
def test_train_refuses_what_cannot_run_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kwargs: dict, error: type, message: str
) -> None:
    for name in ("NEURO_TOKEN", "NEURO_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    run_dir = tmp_path / "run"
    with pytest.raises(error) as raised:
        neuro.train("CartPole-v1", run_dir=run_dir, progress=False, **kwargs)
    assert message in str(raised.value)
    assert not run_dir.exists()


def test_an_unknown_env_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown env id 'NoSuchEnv-v9'"):
        neuro.train("NoSuchEnv-v9", run_dir=tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
