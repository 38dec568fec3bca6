"""Envs for episodes: the one place a failure to build one becomes EnvBuildError, and the
cache of built envs a worker keeps between tasks.

"Atari backend" is what plays the paper's Atari protocol: gymnasium's wrappers ("gym") or
ale-py's C++ vector env ("vector"), chosen by neuro-worker's --atari-backend; not to be
confused with the inference engine, which runs the policy (worker/inference).
"""

from __future__ import annotations

from collections import defaultdict

from neuro.envs.make import PAPER, EnvHandle, atari_game, is_atari, make_env, paper_frames
from worker.play.atari_vector import SubEnv, VectorGroup

GYM = "gym"
VECTOR = "vector"
ATARI_BACKENDS = (GYM, VECTOR)
DEFAULT_ATARI_BACKEND = VECTOR
"""Chosen by measurement (docs/atari-engines.md): the C++ vector env plays more frames/s."""


def check_atari_backend(atari_backend: str) -> str:
    """`atari_backend` if it is one of ATARI_BACKENDS; ValueError naming it otherwise."""
    if atari_backend not in ATARI_BACKENDS:
        raise ValueError(f"atari engine must be one of {ATARI_BACKENDS}, got {atari_backend!r}")
    return atari_backend


class EnvBuildError(Exception):
    """The env could not be built on this worker (missing ROM, unknown id, ...)."""


class NotRunnableHere(ValueError):
    """This worker, as started, can run no task of this kind (its settings, not the task, are
    why): it hands its tasks back and stops, instead of failing each task it leases (a task
    failed too often is recorded as NaN, although another worker could have run it)."""


def build_env(env_id: str, dynamics: str = PAPER) -> EnvHandle:
    """make_env, with any failure to build raised as EnvBuildError naming the id."""
    try:
        return make_env(env_id, dynamics)
    except Exception as error:  # any failure to build is reported, never fatal
        raise EnvBuildError(f"cannot build env {env_id!r}: {error}") from error


class EnvCache:
    """Built envs waiting for their next task, by (env id, dynamics); builds on a miss.

    With `atari_backend="vector"`, paper-protocol Atari envs are sub-envs of C++ vector envs of
    `vector_size` sub-envs each, which the rollout steps with one call; other
    envs, and Atari under the registered dynamics, are gymnasium envs either way.
    """

    def __init__(
        self, atari_backend: str = GYM, vector_size: int = 1, threads: int = 1,
        pipelined: bool = False,
    ) -> None:  # fmt: skip
        """`threads`: the C++ vector env's own threads stepping its sub-envs. `pipelined`: each
        game's `vector_size` sub-envs are two pipelined vector envs of half as many (see
        Rollout._step_pipelined), each task going to the one with more free sub-envs."""
        self.atari_backend = check_atari_backend(atari_backend)
        self.vector_size = vector_size
        self.threads = threads
        self.pipelined = pipelined and vector_size > 1
        self._free: dict[tuple[str, str], list[EnvHandle]] = defaultdict(list)
        self._groups: dict[str, list] = defaultdict(list)  # game -> its VectorGroups

    def __repr__(self) -> str:
        return f"EnvCache({self.atari_backend}, free={sum(map(len, self._free.values()))})"

    def take(self, env_id: str, dynamics: str = PAPER, behaviour: bool = False) -> EnvHandle:
        """A free env of this id and dynamics, or a new one; EnvBuildError if none can be built.

        `behaviour`: the episodes need a behaviour characterisation, which for Atari is the
        RAM that only the gymnasium engine exposes.
        """
        vector = self.atari_backend == VECTOR and not behaviour
        if vector and dynamics == PAPER and self._is_atari(env_id):
            return self._take_sub_env(env_id)
        free = self._free[(env_id, dynamics)]
        return free.pop() if free else build_env(env_id, dynamics)

    def give(self, env_id: str, dynamics: str, handle: EnvHandle) -> None:
        """Keeps an env taken for (env_id, dynamics) for the next task that needs one."""
        if isinstance(handle.env, SubEnv):
            handle.env.group.give(handle.env)
            return
        self._free[(env_id, dynamics)].append(handle)

    def _is_atari(self, env_id: str) -> bool:
        try:
            return is_atari(env_id)
        except Exception:  # an unknown id fails in build_env, with the usual error
            return False

    def _take_sub_env(self, env_id: str) -> EnvHandle:
        try:
            game = atari_game(env_id)
            groups = self._groups[game]
            if self.pipelined:
                if not any(group.free_count for group in groups):
                    half = (self.vector_size + 1) // 2
                    groups += [VectorGroup(game, size, threads=self.threads, pipelined=True)
                               for size in (half, self.vector_size - half)]  # fmt: skip
                # The halves overlap best when they hold equal shares of the work.
                open_groups = [group for group in groups if group.free_count]
                sub = min(open_groups, key=lambda group: group.size - group.free_count).take()
            else:
                for group in groups:
                    sub = group.take()
                    if sub is not None:
                        break
                else:
                    groups.append(VectorGroup(game, self.vector_size, threads=self.threads))
                    sub = groups[-1].take()
        except Exception as error:  # as build_env: reported, never fatal
            raise EnvBuildError(f"cannot build env {env_id!r}: {error}") from error
        return EnvHandle(sub, atari=True, dynamics=PAPER, frames_used=paper_frames)
