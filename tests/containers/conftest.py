"""The container tests build both images and run a fleet for minutes, so they run only when
asked for (`make test-containers`: pytest -m containers). Asked for where no Docker engine
answers, they are skipped, saying what is missing."""

from __future__ import annotations

import pytest

from tests.containers.fleet import engine_problem


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselects the `containers` tests unless the -m expression names them."""
    ours = [item for item in items if item.get_closest_marker("containers")]
    if not ours:
        return
    if "containers" not in (config.option.markexpr or ""):
        config.hook.pytest_deselected(items=ours)
        items[:] = [item for item in items if item not in ours]
        return
    problem = engine_problem()
    if problem is not None:
        for item in ours:
            item.add_marker(pytest.mark.skip(reason=problem))
