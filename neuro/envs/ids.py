"""Env ids as users type them, resolved the same way on the master and on every worker:
gymnasium's own ids, ale-py's, neuro's toy tasks, `module:Env-id` (gymnasium's convention: the
module is imported first, and importing it registers the id), and ids an installed package
registers through gymnasium's entry points (group "gymnasium.envs").

An entry point is `name = "package.module:register_function"` in the package's metadata; its
function is called inside gymnasium's namespace `name` (its ids read `name/Env-v0`), or in none
where the name is `__root__`. gymnasium 1.x no longer loads them itself: neuro does, once per
process, when an id is not found otherwise.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
from importlib import metadata

import gymnasium as gym

from neuro.envs import register_envs
from neuro.policy_spec import import_named

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "gymnasium.envs"
"""The entry-point group packages register gymnasium envs under."""
_NO_NAMESPACE = ("__root__", "__internal__")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


def env_module(env_id: str) -> str | None:
    """The module a `module:Env-id` names (imported before the id is looked up), else None;
    ValueError naming the id where that part is no module path."""
    module, sep, _ = env_id.partition(":")
    if not sep:
        return None
    if _MODULE.fullmatch(module) is None:
        raise ValueError(f"env id {env_id!r}: {module!r} before ':' is not a module path")
    return module


def registered_id(env_id: str) -> str:
    """The id gymnasium's registry knows: `module:Env-id` without its module."""
    return env_id.partition(":")[2] if env_module(env_id) else env_id


def import_env_module(env_id: str) -> None:
    """Imports the module a `module:Env-id` names; ModuleUnavailable naming it if it cannot be
    imported here."""
    module = env_module(env_id)
    if module is not None:
        import_named(module, f"env {env_id}")


def env_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """The registered spec of an id as users type it (its module imported, neuro's sized ids
    registered, entry points loaded on a miss); ModuleUnavailable where the id's module cannot
    be imported, ValueError naming the id where it is unknown."""
    import_env_module(env_id)
    name = registered_id(env_id)
    register_envs(name)
    try:
        return gym.spec(name)
    except gym.error.Error as error:
        if not load_entry_point_envs():
            raise ValueError(f"unknown env id {env_id!r}: {error}") from None
    try:
        return gym.spec(name)
    except gym.error.Error as error:
        raise ValueError(f"unknown env id {env_id!r}: {error}") from None


@functools.cache
def load_entry_point_envs() -> bool:
    """Runs every installed package's gymnasium entry point once; whether there was any. A
    package whose entry point fails is logged and skipped: another package's ids still work."""
    found = False
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        found = True
        namespace = (
            contextlib.nullcontext()
            if entry.name in _NO_NAMESPACE
            else gym.envs.registration.namespace(entry.name)
        )
        try:
            with namespace:
                loaded = entry.load()
                if entry.attr and callable(loaded):
                    loaded()
        except Exception as error:  # someone else's package: named, never fatal
            log.warning("gymnasium env entry point %s = %s failed: %s: %s", entry.name,
                        entry.value, type(error).__name__, error)  # fmt: skip
    return found
