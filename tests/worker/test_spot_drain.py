"""Spot interruption notices: the IMDSv2 watcher, and a real worker that drains on one."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.support.harness import LiveMaster, live_master
from tests.support.processes import free_port, spawn_worker, stop_processes
from tests.support.tiny import long_elite_tasks
from worker.cli import worker_main
from worker.spot import (
    INSTANCE_ACTION_PATH,
    REBALANCE_PATH,
    TOKEN_PATH,
    SpotNotice,
    SpotNoticeWatcher,
)

TOKEN_HEADER = "X-aws-ec2-metadata-token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"


class Seen(NamedTuple):
    method: str
    path: str
    token: str | None
    ttl: str | None
    status: int


class FakeIMDS:
    """IMDSv2 on loopback: a token from PUT, then GETs that carry it (401 otherwise), as on EC2."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tokens: set[str] = set()
        self.seen: list[Seen] = []
        self.instance_action: bytes | None = None  # None: 404, no notice
        self.rebalance: bytes | None = None
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                ttl = self.headers.get(TTL_HEADER)
                if self.path != TOKEN_PATH:
                    self._answer(403, b"", None, ttl)
                elif ttl is None or not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                    self._answer(400, b"", None, ttl)
                else:
                    token = secrets.token_urlsafe(24)
                    with fake.lock:
                        fake.tokens.add(token)
                    self._answer(200, token.encode(), None, ttl)

            def do_GET(self) -> None:
                token = self.headers.get(TOKEN_HEADER)
                with fake.lock:
                    valid = token in fake.tokens
                    body = {INSTANCE_ACTION_PATH: fake.instance_action,
                            REBALANCE_PATH: fake.rebalance}.get(self.path)  # fmt: skip
                if not valid:
                    self._answer(401, b"", token, None)
                elif body is None:
                    self._answer(404, b"", token, None)
                else:
                    self._answer(200, body, token, None)

            def _answer(self, status: int, body: bytes, token: str | None, ttl: str | None) -> None:
                with fake.lock:
                    fake.seen.append(Seen(self.command, self.path, token, ttl, status))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def notify(self, action: str = "terminate") -> str:
        """Marks the instance for interruption two minutes from now; returns the notice's time."""
        when = (datetime.now(UTC) + timedelta(minutes=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
        with self.lock:
            self.instance_action = json.dumps({"action": action, "time": when}).encode()
        return when

    def expire_tokens(self) -> None:
        with self.lock:
            self.tokens.clear()

    def requests(self, method: str, path: str) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.method == method and s.path == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


@pytest.fixture
def imds() -> Iterator[FakeIMDS]:
    fake = FakeIMDS()
    yield fake
    fake.close()


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def spot_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "worker.spot" and r.levelno == logging.WARNING]  # fmt: skip


# -- the fake speaks IMDSv2 ------------------------------------------------------------------


def test_the_fake_refuses_a_get_without_a_valid_token(imds: FakeIMDS) -> None:
    url = imds.endpoint + INSTANCE_ACTION_PATH
    for headers in ({}, {TOKEN_HEADER: "not-a-token"}):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=2)
        assert refused.value.code == 401
    put = urllib.request.Request(imds.endpoint + TOKEN_PATH, method="PUT")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(put, timeout=2)  # no TTL header
    assert refused.value.code == 400


# -- the watcher -----------------------------------------------------------------------------


def test_a_token_first_then_gets_that_carry_it(imds: FakeIMDS) -> None:
    watcher = SpotNoticeWatcher(lambda: None, imds.endpoint, poll_seconds=1, timeout_s=1)
    assert watcher.poll_once() is None
    assert watcher.poll_once() is None
    first = imds.seen[0]
    assert (first.method, first.path, first.ttl, first.status) == ("PUT", TOKEN_PATH, "21600", 200)
    (token,) = imds.tokens
    gets = imds.requests("GET", INSTANCE_ACTION_PATH)
    assert len(gets) == 2 and all(g.token == token and g.status == 404 for g in gets)
    assert len(imds.requests("PUT", TOKEN_PATH)) == 1  # the token is reused until it expires
    assert watcher.errors == 0


def test_an_expired_token_is_replaced(imds: FakeIMDS) -> None:
    watcher = SpotNoticeWatcher(lambda: None, imds.endpoint, poll_seconds=1, timeout_s=1)
    assert watcher.poll_once() is None
    imds.expire_tokens()
    when = imds.notify("stop")
    assert watcher.poll_once() == SpotNotice("stop", when)
    statuses = [s.status for s in imds.requests("GET", INSTANCE_ACTION_PATH)]
    assert statuses == [404, 401, 200]
    assert len(imds.requests("PUT", TOKEN_PATH)) == 2 and watcher.errors == 0


def test_a_200_with_an_odd_body_is_still_a_notice(imds: FakeIMDS) -> None:
    imds.instance_action = b"not json"
    watcher = SpotNoticeWatcher(lambda: None, imds.endpoint, poll_seconds=1, timeout_s=1)
    assert watcher.poll_once() == SpotNotice("unknown", "not json")


def test_polls_on_through_404_and_calls_back_once_on_a_notice(
    imds: FakeIMDS, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="worker.spot")
    calls: list[float] = []
    watcher = SpotNoticeWatcher(lambda: calls.append(time.monotonic()), imds.endpoint,
                                poll_seconds=0.05, timeout_s=1)  # fmt: skip
    watcher.start()
    try:
        wait_until(lambda: len(imds.requests("GET", INSTANCE_ACTION_PATH)) >= 4, 10, "polls")
        assert calls == [] and watcher.running
        when = imds.notify("terminate")
        wait_until(lambda: calls, 10, "the callback")
        wait_until(lambda: not watcher.running, 5, "the watcher to end after the notice")
        polls = len(imds.requests("GET", INSTANCE_ACTION_PATH))
        time.sleep(0.3)  # six poll intervals: no more polls, no second call
        assert len(imds.requests("GET", INSTANCE_ACTION_PATH)) == polls
        assert len(calls) == 1
        assert watcher.notice == SpotNotice("terminate", when)
        assert any(f"terminate at {when}" in m for m in spot_warnings(caplog))
    finally:
        watcher.stop()


def test_an_unreachable_endpoint_is_polled_on_without_raising_or_spamming(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="worker.spot")
    calls: list[None] = []
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    watcher = SpotNoticeWatcher(lambda: calls.append(None), endpoint, poll_seconds=0.02,
                                timeout_s=0.5)  # fmt: skip
    watcher.start()
    try:
        wait_until(lambda: watcher.errors >= 5, 10, "failed polls")
        assert watcher.running and calls == [] and watcher.notice is None
        assert len(spot_warnings(caplog)) == 1  # the first failure; the rest only at debug
    finally:
        watcher.stop()
    assert not watcher.running


def test_a_silent_endpoint_times_out_and_stop_is_prompt() -> None:
    with socket.socket() as listener:  # accepts connections (backlog) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
        watcher = SpotNoticeWatcher(lambda: None, endpoint, poll_seconds=0.05, timeout_s=0.3)
        started = time.monotonic()
        assert watcher.poll_once() is None
        assert time.monotonic() - started < 3 and watcher.errors == 1
        watcher.start()
        time.sleep(0.1)  # inside a request that will not be answered
        started = time.monotonic()
        watcher.stop()
        assert not watcher.running and time.monotonic() - started < 3


def test_a_rebalance_recommendation_is_logged_once_and_does_not_drain(
    imds: FakeIMDS, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="worker.spot")
    imds.rebalance = b'{"noticeTime": "2031-01-01T00:00:00Z"}'
    calls: list[None] = []
    watcher = SpotNoticeWatcher(lambda: calls.append(None), imds.endpoint, poll_seconds=0.05,
                                timeout_s=1)  # fmt: skip
    watcher.start()
    try:
        wait_until(lambda: len(imds.requests("GET", INSTANCE_ACTION_PATH)) >= 5, 10, "polls")
        assert calls == [] and watcher.running and watcher.notice is None
        assert watcher.rebalance_notice == "2031-01-01T00:00:00Z"
        assert len(imds.requests("GET", REBALANCE_PATH)) == 1  # not asked again once known
        (warning,) = spot_warnings(caplog)
        assert "rebalance" in warning and "2031-01-01T00:00:00Z" in warning
    finally:
        watcher.stop()


# -- the command line --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--spot-poll-seconds", "0"], {}, "got 0.0"),
        (["--spot-poll-seconds", "-1"], {}, "got -1.0"),
        (["--spot-poll-seconds", "nan"], {}, "got nan"),
        ([], {"NEURO_SPOT_POLL_SECONDS": "soon"}, "'soon'"),
        (["--spot-notice", "sqs"], {}, "'sqs'"),
        ([], {"NEURO_SPOT_NOTICE": "yes"}, "'yes'"),
        (["--spot-notice", "imds"], {"AWS_EC2_METADATA_SERVICE_ENDPOINT": "169.254.169.254"},
         "'169.254.169.254'"),
    ],
)  # fmt: skip
def test_bad_spot_settings_are_refused_by_name(
    argv: list[str],
    env: dict[str, str],
    named: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exited:
        worker_main(["--master", "127.0.0.1:1", *argv])
    assert exited.value.code == 2
    assert named in capsys.readouterr().err


# -- a real worker drains on a notice ----------------------------------------------------------


async def _spot_notice_mid_task(tmp_path: Path, imds: FakeIMDS) -> dict:
    # Elite tasks of 300 CartPole episodes each: long enough to be caught mid-task. A 600 s
    # lease means only a hand-back can free a task within the test.
    config = long_elite_tasks(lease_seconds=600.0)
    async with live_master(config, tmp_path / "run", train=False) as live:
        return await _drain_on_a_notice(live, imds, tmp_path)


async def _drain_on_a_notice(live: LiveMaster, imds: FakeIMDS, tmp_path: Path) -> dict:
    # The release is recorded from the start: patched before training begins.
    fleet = live.trainer.fleet
    released: list[tuple[str, int]] = []
    release = fleet.release

    def recording_release(worker_id: str, task_ids) -> int:
        count = release(worker_id, task_ids)
        released.append((worker_id, count))
        return count

    fleet.release = recording_release
    training = live.start_training()
    log_path = tmp_path / "worker-a.log"
    spot = ["--spot-notice", "imds", "--spot-poll-seconds", "0.2"]
    with log_path.open("w") as log_file:
        first = spawn_worker(live.port, "spot-a", *spot, stderr=log_file,
                             env={"AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint})  # fmt: skip
    second = None
    try:

        def first_holds_elite_task() -> bool:
            return any("/e/" in t for t in fleet.tasks_leased_to("spot-a"))

        deadline = time.monotonic() + 60
        while not first_holds_elite_task():
            assert time.monotonic() < deadline, "the worker never leased an elite task"
            assert first.poll() is None, log_path.read_text()[-3000:]
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # well inside a 300-episode task
        polls_before = len(imds.requests("GET", INSTANCE_ACTION_PATH))
        held_before = fleet.counters().leased
        when = imds.notify("terminate")
        flipped = time.monotonic()
        while first.poll() is None and time.monotonic() - flipped < 30:
            await asyncio.sleep(0.02)
        drain_s = time.monotonic() - flipped
        after = fleet.counters()
        second = spawn_worker(live.port, "spot-b")
        records = await asyncio.wait_for(training, 120)
        return dict(exit_code=first.poll(), drain_s=drain_s, when=when, released=released,
                    polls_before=polls_before, held_before=held_before, after=after,
                    records=records, log=log_path.read_text())  # fmt: skip
    finally:
        stop_processes([p for p in (first, second) if p is not None])


@pytest.mark.slow
def test_a_spot_notice_drains_a_worker_mid_task(
    tmp_path: Path, noise_cache: Path, imds: FakeIMDS
) -> None:
    outcome = asyncio.run(_spot_notice_mid_task(tmp_path, imds))
    log = outcome["log"]
    assert outcome["exit_code"] == 0, log[-3000:]
    assert outcome["drain_s"] < 15, log[-3000:]  # far inside the two-minute warning
    assert outcome["polls_before"] >= 1  # it was polling (404) while it worked
    # Every poll carried an IMDSv2 token.
    gets = imds.requests("GET", INSTANCE_ACTION_PATH)
    assert gets and all(g.status in (200, 404) for g in gets)
    assert f"spot interruption notice (terminate at {outcome['when']}): stopping" in log
    assert "left on a spot interruption notice" in log
    # It handed its unfinished tasks back (Release): with a 600 s lease nothing else frees
    # them, yet none stays leased and they are pending again at once.
    assert outcome["held_before"] >= 1
    assert [w for w, _ in outcome["released"]] == ["spot-a"] and outcome["released"][0][1] >= 1
    assert outcome["after"].leased == 0 and outcome["after"].pending >= 1
    # The second worker finished the generation; every individual was scored exactly once.
    (record,) = outcome["records"]
    assert record.generation_evaluations == 4 + 2 * 300
    assert record.leases_reissued == 0 and record.failed_evaluations == 0
