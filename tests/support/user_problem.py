"""The test package of a user's own problem (tests/support/userpkg): where it lives, its ids and
factories, and a process environment with or without it."""

from __future__ import annotations

import os

from tests.support.processes import REPO, worker_env

USER_PACKAGES = REPO / "tests" / "support"
"""The folder that holds `userpkg`: on PYTHONPATH, `import userpkg` works."""
MY_ENV = "userpkg:MyEnv-v0"
"""CartPole under the user's name, registered when userpkg is imported."""
SIDES = "userpkg:Sides-v0"
"""The package's small image task (1x8x8 uint8 frames, two actions)."""
MLP_FACTORY = "userpkg.nets:make_policy"
CONV_FACTORY = "userpkg.nets:make_conv_policy"


def env_with_user_packages() -> dict[str, str]:
    """A worker's (or master's) environment in which `import userpkg` works."""
    env = worker_env()
    env["PYTHONPATH"] = os.pathsep.join([str(USER_PACKAGES), env["PYTHONPATH"]])
    return env


def env_without_user_packages() -> dict[str, str]:
    """The usual worker environment: the repository, not the user's package."""
    return worker_env()
