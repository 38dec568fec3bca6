"""Authentication and TLS against a real grpc.aio master on loopback and real worker processes.

Forged calls without the token, or with a wrong one, are refused and change nothing; the right
token works; the health check stays open; the token never reaches a log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from master import cli
from master.fleet.auth import REFUSAL, is_loopback, load_token
from master.run.local_workers import LocalWorkers
from neuro.v1 import evolution_pb2 as pb
from neuro.v1 import evolution_pb2_grpc as pb_grpc
from neuro.wire import SERVICE_NAME
from tests.support.harness import live_master
from tests.support.processes import spawn_worker, stop_processes
from tests.support.tiny import tiny_cartpole
from tests.support.tls import self_signed

CURRENT = pb.PROTOCOL_VERSION_CURRENT
CALL_S, TEST_S, RUN_S, EXIT_S = 5.0, 20.0, 120.0, 60.0
TOKEN = f"good-{secrets.token_hex(16)}"  # random, so finding it in a log cannot be chance
WRONG = f"bad-{secrets.token_hex(16)}"
GOOD = (("authorization", f"Bearer {TOKEN}"),)
BAD_CREDENTIALS = {
    "none": None,
    "wrong token": (("authorization", f"Bearer {WRONG}"),),
    "no scheme": (("authorization", TOKEN),),
    "one character short": (("authorization", f"Bearer {TOKEN[:-1]}"),),
    "one character more": (("authorization", f"Bearer {TOKEN}x"),),
    "another key": (("x-token", f"Bearer {TOKEN}"),),
    "two values": (("authorization", f"Bearer {WRONG}"), ("authorization", f"Bearer {TOKEN}")),
}
CLEAN_ENV = ("NEURO_TOKEN", "NEURO_TOKEN_FILE", "NEURO_HOST", "NEURO_TLS_CA")


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes, Path]:
    """(certificate, key, certificate file) for a TLS master."""
    certificate, key = self_signed()
    path = tmp_path_factory.mktemp("tls") / "master.pem"
    path.write_bytes(certificate)
    return certificate, key, path


def serve(scenario, tmp_path: Path, timeout: float = TEST_S, **master_args) -> None:
    """Runs one scenario against a fresh training master with the token; always stops it."""

    async def main():
        config = tiny_cartpole(target_score=None)
        async with live_master(config, tmp_path / "run", token=TOKEN, **master_args) as live:
            await asyncio.wait_for(scenario(live.master, live.training), timeout)

    asyncio.run(main())


@contextlib.asynccontextmanager
async def evolution(master):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{master.port}") as channel:
        yield pb_grpc.EvolutionStub(channel)


def scored(task: pb.Task, score: float) -> pb.TaskResult:
    """A well-formed result: `score` in every episode, ten frames each."""
    n = task.episodes
    return pb.TaskResult(task_id=task.task_id, run_id=task.run_id, episode_returns=[score] * n,
                         episode_frames=[10] * n, frames=10 * n)  # fmt: skip


def forged_requests(worker: str, tasks: list[pb.Task]) -> dict[str, object]:
    """One request per method, each claiming `worker`'s tasks; the results score a fortune."""
    ids = [t.task_id for t in tasks]
    results = [scored(t, 1e6) for t in tasks]
    common = {"protocol_version": CURRENT, "worker_id": worker}
    return {
        "Lease": pb.LeaseRequest(**common, max_tasks=256),
        "Report": pb.ReportRequest(**common, results=results),
        "Heartbeat": pb.HeartbeatRequest(**common, task_ids=ids),
        "Release": pb.ReleaseRequest(**common, task_ids=ids),
        "Status": pb.StatusRequest(),
    }


async def snapshot(stub) -> tuple:
    s = await stub.Status(pb.StatusRequest(), timeout=CALL_S, metadata=GOOD)
    return (s.generation, s.phase, s.frames, s.evaluations, s.tasks_pending, s.tasks_leased,
            s.tasks_done, s.leases_reissued, s.workers)  # fmt: skip


async def refused(call, *never_in_details: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert caught.value.details() == REFUSAL
    assert not any(secret in caught.value.details() for secret in never_in_details)


def assert_not_logged(caplog, capfd) -> None:
    """Neither token in the master's log records nor in anything written to stdout/stderr."""
    captured = capfd.readouterr()
    for text in (caplog.text, captured.out, captured.err):
        assert TOKEN not in text and WRONG not in text


def test_forged_calls_are_refused_and_change_nothing(tmp_path, caplog, capfd):
    caplog.set_level(logging.DEBUG)

    async def scenario(master, training):
        async with evolution(master) as stub:
            request = pb.LeaseRequest(protocol_version=CURRENT, worker_id="honest", max_tasks=256)
            tasks = []
            while not tasks:  # the trainer may not have opened the phase yet
                tasks = list((await stub.Lease(request, timeout=CALL_S, metadata=GOOD)).tasks)
                await asyncio.sleep(0.01)
            before = await snapshot(stub)
            for label, credentials in BAD_CREDENTIALS.items():
                for method, forged in forged_requests("honest", tasks).items():
                    call = getattr(stub, method)(forged, timeout=CALL_S, metadata=credentials)
                    try:
                        await refused(call, TOKEN, WRONG)
                    except AssertionError as error:
                        raise AssertionError(f"{method} with {label}") from error
            assert await snapshot(stub) == before
            # The honest worker still holds its tasks, and its scores are the ones recorded.
            results = [scored(t, 7.0) for t in tasks]
            report = pb.ReportRequest(protocol_version=CURRENT, worker_id="honest", results=results)
            acks = (await stub.Report(report, timeout=CALL_S, metadata=GOOD)).acks
            assert [a.disposition for a in acks] == [pb.RESULT_DISPOSITION_ACCEPTED] * len(tasks)
            while (await snapshot(stub))[1] != "elite":
                await asyncio.sleep(0.01)
            assert list(master.trainer.algorithm.state.scores) == [7.0] * len(tasks)

    serve(scenario, tmp_path)
    assert_not_logged(caplog, capfd)


def test_health_check_needs_no_token(tmp_path):
    async def scenario(master, training):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{master.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in (SERVICE_NAME, ""):
                request = health_pb2.HealthCheckRequest(service=service)
                response = await health.Check(request, timeout=CALL_S)
                assert response.status == health_pb2.HealthCheckResponse.SERVING

    serve(scenario, tmp_path)


def test_tls_with_the_token_works_and_plaintext_fails(tmp_path, tls):
    from neuro.wire import open_channel

    certificate, key, _ = tls

    def status(token: str | None) -> pb.StatusResponse:
        channel = open_channel(f"127.0.0.1:{port}", token, certificate)
        try:
            return pb_grpc.EvolutionStub(channel).Status(pb.StatusRequest(), timeout=CALL_S)
        finally:
            channel.close()

    async def scenario(master, training):
        nonlocal port
        port = master.port
        # The worker's own channel, in a thread: its calls block.
        assert (
            await asyncio.to_thread(status, TOKEN)
        ).run_id == master.trainer.fleet.settings.run_id
        with pytest.raises(grpc.RpcError) as caught:
            await asyncio.to_thread(status, None)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        async with evolution(master) as plaintext:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await plaintext.Status(pb.StatusRequest(), timeout=CALL_S, metadata=GOOD)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE

    port = 0
    serve(scenario, tmp_path, tls=(certificate, key))


async def wait_exit(process: subprocess.Popen, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while process.poll() is None:
        assert time.monotonic() < deadline, f"worker still running after {timeout}s"
        await asyncio.sleep(0.05)
    return process.returncode


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["plaintext", "tls"])
def test_a_worker_with_the_token_completes_a_run(
    tmp_path, noise_cache, tls, caplog, capfd, transport
):
    caplog.set_level(logging.DEBUG)
    certificate, key, certificate_path = tls
    extra = ("--tls-ca", str(certificate_path)) if transport == "tls" else ()
    log_path = tmp_path / "worker.log"
    outcome = {}

    async def scenario(master, training):
        with log_path.open("wb") as log:
            worker = spawn_worker(master.port, "honest", *extra, env={"NEURO_TOKEN": TOKEN},
                                  stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            outcome["records"] = await training
            outcome["code"] = await wait_exit(worker, EXIT_S)
        finally:
            stop_processes([worker])

    serve(scenario, tmp_path, RUN_S, tls=(certificate, key) if transport == "tls" else None)
    assert [r.generation for r in outcome["records"]] == [0, 1]
    assert outcome["code"] == 0
    assert TOKEN not in log_path.read_text()
    assert_not_logged(caplog, capfd)


@pytest.mark.slow
def test_a_worker_with_a_wrong_or_no_token_exits_with_code_2(tmp_path, noise_cache, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    logs = {name: tmp_path / f"{name}.log" for name in ("wrong", "none")}

    async def scenario(master, training):
        workers = []
        try:
            for name, env in (("wrong", {"NEURO_TOKEN": WRONG}), ("none", {})):
                with logs[name].open("wb") as log:
                    workers.append(spawn_worker(master.port, name, env=env, stdout=log,
                                                stderr=subprocess.STDOUT))  # fmt: skip
            for worker in workers:
                assert await wait_exit(worker, EXIT_S) == 2
        finally:
            stop_processes(workers)

    serve(scenario, tmp_path, EXIT_S + 10)
    for path in logs.values():
        text = path.read_text()
        assert "UNAUTHENTICATED" in text and TOKEN not in text and WRONG not in text
    assert_not_logged(caplog, capfd)


# -- configuration: token files, the loopback rule, local workers ------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True),
     ("localhost", True), ("0.0.0.0", False), ("::", False), ("[::]", False), ("", False),
     ("10.0.0.5", False), ("master.example.com", False)],
)  # fmt: skip
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_load_token_from_file_or_environment(tmp_path, monkeypatch):
    path = tmp_path / "token"
    path.write_text(f"  {TOKEN}\n")
    monkeypatch.setenv("NEURO_TOKEN", WRONG)
    assert load_token(str(path)) == TOKEN  # a file wins over the environment
    assert load_token(None) == WRONG
    monkeypatch.delenv("NEURO_TOKEN")
    assert load_token(None) is None
    for content in ("", " \n\t"):
        path.write_text(content)
        with pytest.raises(ValueError, match=f"token file {path} is empty"):
            load_token(str(path))
    with pytest.raises(ValueError, match=f"cannot read token file {tmp_path / 'absent'}"):
        load_token(str(tmp_path / "absent"))
    path.write_text(f"{TOKEN} {WRONG}")
    with pytest.raises(ValueError) as caught:
        load_token(str(path))
    assert str(path) in str(caught.value) and TOKEN not in str(caught.value)


def master_cli(monkeypatch, tmp_path, *argv: str, env: dict[str, str] | None = None) -> dict:
    """Runs neuro-master's main() up to the point where it would serve; returns what it would."""
    for name in CLEAN_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    served = {}

    async def run_master(config, run_dir, serve, options, **kwargs):
        served.update(vars(serve), **vars(options))

    monkeypatch.setattr("master.run.start.run_master", run_master)
    args = ["--env", "CartPole-v1", "--run-dir", str(tmp_path / "run"), "--port", "0", *argv]
    assert cli.main(args) == 0
    return served


def test_master_cli_refuses_a_public_address_without_a_token(tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit) as caught:
        master_cli(monkeypatch, tmp_path, "--host", "0.0.0.0")
    assert caught.value.code == 2
    assert "--insecure-no-token" in capsys.readouterr().err
    assert (
        master_cli(monkeypatch, tmp_path, "--host", "0.0.0.0", "--insecure-no-token")["token"]
        is None
    )
    assert master_cli(monkeypatch, tmp_path)["token"] is None  # loopback: no token needed


def test_master_cli_reads_the_token_and_tls_files(tmp_path, monkeypatch, capsys, tls):
    certificate, key, certificate_path = tls
    token_path, key_path = tmp_path / "token", tmp_path / "key.pem"
    token_path.write_text(TOKEN + "\n")
    key_path.write_bytes(key)
    public = ("--host", "0.0.0.0")
    served = master_cli(monkeypatch, tmp_path, *public, "--token-file", str(token_path))
    assert served["token"] == TOKEN and served["tls"] is None
    served = master_cli(monkeypatch, tmp_path, *public, env={"NEURO_TOKEN_FILE": str(token_path)})
    assert served["token"] == TOKEN
    served = master_cli(monkeypatch, tmp_path, *public, "--tls-cert", str(certificate_path),
                        "--tls-key", str(key_path), env={"NEURO_TOKEN": TOKEN})  # fmt: skip
    assert served["token"] == TOKEN and served["tls"] == (certificate, key)
    token_path.write_text("")
    for argv in (("--token-file", str(token_path)), ("--tls-cert", str(certificate_path))):
        with pytest.raises(SystemExit) as caught:
            master_cli(monkeypatch, tmp_path, *argv)
        assert caught.value.code == 2
    err = capsys.readouterr().err
    assert f"token file {token_path} is empty" in err and "--tls-key" in err
    assert TOKEN not in err


def test_worker_cli_names_an_empty_token_file(tmp_path, monkeypatch, capsys):
    from worker.cli import worker_main

    path = tmp_path / "token"
    path.write_text("\n")
    with pytest.raises(SystemExit) as caught:
        worker_main(["--token-file", str(path)])
    assert caught.value.code == 2
    assert f"token file {path} is empty" in capsys.readouterr().err


def test_local_workers_get_the_token_through_the_environment(monkeypatch):
    started = []
    monkeypatch.setenv("NEURO_TOKEN_FILE", "/elsewhere")
    monkeypatch.setattr("master.run.local_workers._worker_installed", lambda: True)
    # Its look-up runs ldconfig through the subprocess module patched here.
    monkeypatch.setattr("neuro.allocator.tcmalloc_installed", lambda: False)
    monkeypatch.setattr(
        "master.run.local_workers.subprocess.Popen",
        lambda command, env, **output: started.append((command, env)),
    )
    workers = LocalWorkers("127.0.0.1:1", 2, ("--slots", "2"), token=TOKEN)
    workers.start()
    assert len(started) == 2
    for command, env in started:
        assert not any(TOKEN in part for part in command)  # argv shows in ps
        assert env["NEURO_TOKEN"] == TOKEN and "NEURO_TOKEN_FILE" not in env
