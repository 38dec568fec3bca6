"""A worker that cannot import a module a run needs (the env's `module:Env-id`, the network's
factory) refuses the run's tasks: it hands them back instead of failing them, says why in every
lease request, and still runs other runs' tasks; a task's user network arrives checked."""

from __future__ import annotations

from typing import Any

import pytest

from neuro.noise import NoiseTableSpec
from neuro.policy_spec import ModuleUnavailable, user_policy
from neuro.v1 import evolution_pb2 as pb
from tests.support.user_problem import MLP_FACTORY, USER_PACKAGES
from worker.client import WorkerClient
from worker.client.link import MasterLink
from worker.client.wire import leased_task, spec_from_task
from worker.evaluation.spec import EvaluationSpec
from worker.limits import unavailable_module

TABLE = pb.NoiseTableSpec(seed=1, size=2**16)


def _spec(env_id: str, factory: str | None = None) -> EvaluationSpec:
    return EvaluationSpec(
        env_id=env_id, seeds=(1,), mutation_power=0.01, noise_table=NoiseTableSpec(size=2**16),
        architecture="module" if factory else "mlp",
        policy=user_policy(factory) if factory else None,
    )  # fmt: skip


def _task(task_id: str, run_id: str, env_id: str, factory: str = "", options: str = "") -> Any:
    architecture = "module" if factory else "mlp"
    return pb.Task(task_id=task_id, run_id=run_id, episodes=1, env=pb.EnvSpec(env_id=env_id),
                   genome=pb.Genome(seeds=[1], noise_table=TABLE),
                   policy=pb.PolicySpec(architecture=architecture, factory=factory,
                                        options=options))  # fmt: skip


def test_the_missing_module_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    error = unavailable_module(_spec("not_installed_pkg:Thing-v0"))
    assert isinstance(error, ModuleUnavailable) and error.module == "not_installed_pkg"
    error = unavailable_module(_spec("CartPole-v1", "not_installed_nets:make"))
    assert isinstance(error, ModuleUnavailable)
    assert str(error).startswith("cannot import module 'not_installed_nets' (policy ")
    assert unavailable_module(_spec("CartPole-v1")) is None
    monkeypatch.syspath_prepend(str(USER_PACKAGES))
    assert unavailable_module(_spec("userpkg:MyEnv-v0", MLP_FACTORY)) is None


class _Stub:
    def __init__(self) -> None:
        self.leases: list[pb.LeaseRequest] = []
        self.released: list[str] = []

    def Lease(self, request: pb.LeaseRequest, timeout: float) -> pb.LeaseResponse:
        self.leases.append(request)
        return pb.LeaseResponse(retry_after_ms=5000)

    def Release(self, request: pb.ReleaseRequest, timeout: float) -> pb.ReleaseResponse:
        self.released.extend(request.task_ids)
        return pb.ReleaseResponse(released=len(request.task_ids))


def test_a_run_whose_module_is_missing_is_refused_and_its_tasks_handed_back() -> None:
    client = WorkerClient("127.0.0.1:1", "w", evaluator=None)  # type: ignore[arg-type]
    held = client.held
    refused = [leased_task(_task(f"t{i}", "r1", "not_installed_pkg:Thing-v0")) for i in range(3)]
    other = leased_task(_task("o", "r2", "CartPole-v1"))
    held.inbox.extend([refused[1], other, refused[2]])
    held.running[refused[0].task_id] = refused[0]

    class Runner:
        started: list[str] = []

        def start(self, task_id: str, spec: Any) -> None:
            Runner.started.append(task_id)

    client._start(Runner(), refused[0])
    # Not played, not failed: handed back, with every other held task of that run.
    assert Runner.started == [] and held.outbox == [] and client.counters.tasks_failed == 0
    assert sorted(held.abandoned) == ["t0", "t1", "t2"] and list(held.inbox) == [other]
    assert held.refusal is not None and held.refusal[0] == "r1"
    assert "cannot import module 'not_installed_pkg'" in held.refusal[1]
    # The run's next task is refused at once; another run's task runs.
    late = leased_task(_task("t3", "r1", "not_installed_pkg:Thing-v0"))
    held.running["t3"] = late
    client._start(Runner(), late)
    held.running["o"] = held.inbox.popleft()
    client._start(Runner(), other)
    assert Runner.started == ["o"] and "t3" in held.abandoned
    # The link hands them back, and every lease request says why.
    link = MasterLink("127.0.0.1:1", "w", held, client._stop, client.counters, None)
    stub = _Stub()
    link.give_back_refused(stub)  # type: ignore[arg-type]
    link.lease(stub)  # type: ignore[arg-type]
    assert sorted(stub.released) == ["t0", "t1", "t2", "t3"] and held.abandoned == []
    refusal = stub.leases[0].refusal
    assert refusal.run_id == "r1" and refusal.reason == held.refusal[1]


def test_a_tasks_user_network_arrives_checked() -> None:
    spec = spec_from_task(_task("t", "r", "CartPole-v1", MLP_FACTORY, '{"hidden": 8}'))
    assert spec.architecture == "module"
    assert spec.policy == user_policy(MLP_FACTORY, {"hidden": 8})
    assert spec_from_task(_task("t", "r", "CartPole-v1", MLP_FACTORY)).policy.options == {}
    for factory, options, named in (
        ("not a path", "", "package.module:callable"),
        (MLP_FACTORY, "[1, 2]", "JSON object"),
        (MLP_FACTORY, "{", "not JSON"),
    ):
        leased = leased_task(_task("t", "r", "CartPole-v1", factory, options))
        assert leased.spec is None and named in leased.refusal
    built_in = _task("t", "r", "CartPole-v1")
    built_in.policy.factory = MLP_FACTORY
    assert "takes no factory" in leased_task(built_in).refusal
    no_factory = _task("t", "r", "CartPole-v1")
    no_factory.policy.architecture = "module"
    assert "package.module:callable" in leased_task(no_factory).refusal


def test_the_batched_worker_says_a_users_network_is_not_its_own(tmp_path) -> None:
    """No engine of the batched worker (--envs, a GPU) runs a user's module: it stops, naming
    the network and the worker that runs it, instead of failing each task."""
    from worker.evaluation.evaluator import Evaluator
    from worker.play.envs import NotRunnableHere
    from worker.runners.batched import BatchedRunner

    runner = BatchedRunner(Evaluator(str(tmp_path)), 2)
    with pytest.raises(NotRunnableHere, match=rf"a user's network \({MLP_FACTORY}\) runs on the "
                       "per-genome worker's torch engine"):  # fmt: skip
        runner.start("t", _spec("CartPole-v1", MLP_FACTORY))
