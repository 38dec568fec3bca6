"""Both images built with USER_PACKAGES as docs/your-own-problem.md builds them: the example
package (docs/examples/mypkg) from user-packages/ of the build context, and for the master
PyTorch's CPU build. The worker makes the package's env and network; the master, torch-free
otherwise, builds the network once to learn its layout. `make test-containers`."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator

import pytest

from tests.containers.fleet import docker
from tests.containers.images import REPO, BuildSettings, build_images

pytestmark = [pytest.mark.containers, pytest.mark.timeout(2400)]

EXAMPLE = REPO / "docs" / "examples" / "mypkg"
TORCH_CPU = "--extra-index-url https://download.pytorch.org/whl/cpu torch==2.13.0+cpu"


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Both images with the example package; its copy in user-packages/ goes afterwards."""
    folder = REPO / "user-packages" / f"test-{uuid.uuid4().hex[:8]}"
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    try:
        settings = BuildSettings.from_env(tag="user-packages-test")
        packages = f"{TORCH_CPU} ./user-packages/{folder.name}"
        settings.flags.extend(["--build-arg", f"USER_PACKAGES={packages}"])
        log = tmp_path_factory.mktemp("build") / "build.log"
        build_images(settings, log=log)
        yield {role: settings.image(role) for role in ("master", "worker")}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_the_worker_makes_the_users_env_and_network(images: dict[str, str]) -> None:
    script = (
        "import gymnasium as gym; from mypkg.nets import make_policy; "
        "env = gym.make('mypkg:MyEnv-v0'); "
        "net = make_policy(env.observation_space, env.action_space); "
        "print(env.spec.max_episode_steps, sum(p.numel() for p in net.parameters()))"
    )
    out = docker("run", "--rm", "--entrypoint", "python", images["worker"], "-c", script,
                 timeout=300)  # fmt: skip
    assert out.split() == ["300", str(4 * 32 + 32 + 32 * 32 + 32 + 32 * 2 + 2)]


def test_the_master_reads_the_users_network_layout(images: dict[str, str]) -> None:
    script = (
        "from master.config import config_from_settings; "
        "from master.run.algorithm_setup import user_network_layout; "
        "config = config_from_settings('mypkg:MyEnv-v0', {'policy': 'mypkg.nets:make_policy'}); "
        "print(' '.join(name for name, _ in user_network_layout(config)))"
    )
    out = docker("run", "--rm", "--entrypoint", "python", images["master"], "-c", script,
                 timeout=300)  # fmt: skip
    assert out.split() == ["body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias",
                           "head.weight", "head.bias"]  # fmt: skip
