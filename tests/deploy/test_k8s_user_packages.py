"""deploy/k8s/overlays/user-packages: the fleet on a user's own images, env id and network, and
nothing else changed from the base (the generic checks of tests/deploy/test_k8s.py render it
too)."""

from __future__ import annotations

import copy

from tests.deploy.test_k8s import _container, _master, _worker, kubectl, render  # noqa: F401

OVERLAY = "overlays/user-packages"


def _config_map(docs: list[dict]) -> dict:
    (found,) = [d for d in docs if d["kind"] == "ConfigMap"
                and d["metadata"]["name"].startswith("neuro-master")]  # fmt: skip
    return found


def test_runs_the_users_images_env_and_policy(render) -> None:  # noqa: F811
    docs, base = render(OVERLAY), render("base")
    master, worker = _container(_master(docs), "master"), _container(_worker(docs), "worker")
    assert master["image"] == "registry.example.com/my-master:0.1.0"
    assert worker["image"] == "registry.example.com/my-worker:0.1.0"
    assert master["args"] == ["--policy", "mypkg.nets:make_policy"]
    assert _config_map(docs)["data"]["NEURO_ENV"] == "mypkg:MyEnv-v0"
    assert "args" not in _container(_master(base), "master")
    # The config map's generated name follows its content, and the master follows the name.
    name = _config_map(docs)["metadata"]["name"]
    assert name != _config_map(base)["metadata"]["name"]
    assert master["envFrom"] == [{"configMapRef": {"name": name}}]
    # Everything else is the base's (compared on copies: the renderings are shared).
    master, worker = copy.deepcopy(master), copy.deepcopy(worker)
    for changed in (master, worker):
        changed.pop("image"), changed.pop("args", None), changed.pop("envFrom", None)
    plain_master = dict(_container(_master(base), "master"))
    plain_worker = dict(_container(_worker(base), "worker"))
    for plain in (plain_master, plain_worker):
        plain.pop("image"), plain.pop("envFrom", None)
    assert (master, worker) == (plain_master, plain_worker)
