"""Envs for episodes: the one place a failure to build one becomes EnvBuildError."""

from __future__ import annotations

from collections import defaultdict

from neuro.envs.make import PAPER, EnvHandle, make_env


class EnvBuildError(Exception):
    """The env could not be built on this worker (missing ROM, unknown id, ...)."""


def build_env(env_id: str, dynamics: str = PAPER) -> EnvHandle:
    """make_env, with any failure to build raised as EnvBuildError naming the id."""
    try:
        return make_env(env_id, dynamics)
    except Exception as error:  # any failure to build is reported, never fatal
        raise EnvBuildError(f"cannot build env {env_id!r}: {error}") from error


class EnvPool:
    """Built envs waiting for their next task, by (env id, dynamics); builds on a miss."""

    def __init__(self) -> None:
        self._free: dict[tuple[str, str], list[EnvHandle]] = defaultdict(list)

    def __repr__(self) -> str:
        return f"EnvPool(free={sum(map(len, self._free.values()))})"

    def take(self, env_id: str, dynamics: str = PAPER) -> EnvHandle:
        """A free env of this id and dynamics, or a new one; EnvBuildError if none can be built."""
        free = self._free[(env_id, dynamics)]
        return free.pop() if free else build_env(env_id, dynamics)

    def give(self, env_id: str, dynamics: str, handle: EnvHandle) -> None:
        """Keeps an env taken for (env_id, dynamics) for the next task that needs one."""
        self._free[(env_id, dynamics)].append(handle)
