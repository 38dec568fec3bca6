"""Spot interruption notices from the EC2 instance metadata service (IMDSv2), polled in a thread.

EC2 marks a spot instance about two minutes before it reclaims it: from then on
GET /latest/meta-data/spot/instance-action answers 200 {"action", "time"} instead of 404. The
watcher calls back once on that notice, so the worker can hand its tasks back while the
master can still take them. Standard library only: the worker image needs no AWS SDK for it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from http.client import HTTPException
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "http://169.254.169.254"
ENDPOINT_ENV = "AWS_EC2_METADATA_SERVICE_ENDPOINT"  # the AWS SDKs' own variable
TOKEN_PATH = "/latest/api/token"
INSTANCE_ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
TOKEN_TTL_S = 21600
ERROR_LOG_INTERVAL_S = 60.0


@dataclass(frozen=True)
class SpotNotice:
    """What EC2 will do to the instance, and when (ISO 8601, UTC)."""

    action: str
    time: str


def metadata_endpoint(value: str | None = None) -> str:
    """The IMDS base URL: `value`, else $AWS_EC2_METADATA_SERVICE_ENDPOINT, else the default."""
    endpoint = (value or os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT).rstrip("/")
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        source = "endpoint" if value else ENDPOINT_ENV
        raise ValueError(f"{source} must be http(s)://host[:port], got {endpoint!r}")
    return endpoint


class SpotNoticeWatcher:
    """Polls spot/instance-action every `poll_seconds`; calls `on_notice` once when marked.

    404 means no notice. 401 means the session token expired: a new one is fetched. A
    rebalance recommendation is only logged: it comes early and often no interruption follows.
    Network errors are logged at most once a minute and polling goes on; nothing here raises
    into the worker.
    """

    def __init__(
        self,
        on_notice: Callable[[], None],
        endpoint: str | None = None,
        poll_seconds: float = 5.0,
        timeout_s: float = 2.0,
        token_ttl_s: int = TOKEN_TTL_S,
    ) -> None:
        if not (poll_seconds > 0 and math.isfinite(poll_seconds)):
            raise ValueError(f"poll_seconds must be a number > 0, got {poll_seconds}")
        self.endpoint = metadata_endpoint(endpoint)
        self.poll_seconds = poll_seconds
        self.timeout_s = timeout_s
        self.token_ttl_s = token_ttl_s
        self.notice: SpotNotice | None = None
        self.rebalance_notice: str | None = None
        self.polls = 0
        self.errors = 0
        self._on_notice = on_notice
        self._token: str | None = None
        self._token_expires = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._unreachable_since: float | None = None
        self._next_error_log = 0.0
        self._errors_unlogged = 0
        # The metadata service is link-local: an HTTP(S)_PROXY of the host must not see it.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def __repr__(self) -> str:
        return (f"SpotNoticeWatcher({self.endpoint}, every {self.poll_seconds}s, "
                f"polls={self.polls}, errors={self.errors}, notice={self.notice})")  # fmt: skip

    def start(self) -> None:
        """Starts polling in a daemon thread."""
        self._thread = threading.Thread(target=self._loop, name="spot-notice", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stops polling; waits at most `timeout` (default: one request's timeout + 1 s)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout_s + 1.0 if timeout is None else timeout)

    @property
    def running(self) -> bool:
        """Whether the polling thread is alive (it ends on stop() or after a notice)."""
        return self._thread is not None and self._thread.is_alive()

    def poll_once(self) -> SpotNotice | None:
        """One look at the metadata service: the interruption notice, or None (none, or error)."""
        self.polls += 1
        try:
            body = self._get(INSTANCE_ACTION_PATH)
            if body is None:
                self._check_rebalance()
        except (urllib.error.URLError, HTTPException, OSError, ValueError) as error:
            self._note_error(error)
            return None
        self._note_reachable()
        if body is None:
            return None
        return _parse_notice(body)

    # -- internals ---------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                notice = self.poll_once()
            except Exception:  # a bug here must not end the watch, nor the worker
                log.exception("spot notice poll failed")
                notice = None
            if notice is not None:
                self.notice = notice
                log.warning(
                    "spot interruption notice (%s at %s): stopping", notice.action, notice.time
                )
                try:
                    self._on_notice()
                except Exception:
                    log.exception("spot notice callback failed")
                return
            self._stop.wait(self.poll_seconds)

    def _get(self, path: str, retry: bool = True) -> bytes | None:
        """GET with the session token; None on 404. A 401 gets one retry with a new token."""
        request = urllib.request.Request(
            self.endpoint + path, headers={"X-aws-ec2-metadata-token": self._session_token()}
        )
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                return response.read()
        except urllib.error.HTTPError as error:
            error.close()
            if error.code == 404:
                return None
            if error.code == 401 and retry:
                log.debug("instance metadata token refused (expired?); fetching a new one")
                self._token = None
                return self._get(path, retry=False)
            raise

    def _session_token(self) -> str:
        if self._token is None or time.monotonic() >= self._token_expires:
            request = urllib.request.Request(
                self.endpoint + TOKEN_PATH,
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl_s)},
            )
            with self._opener.open(request, timeout=self.timeout_s) as response:
                token = response.read().decode("ascii").strip()
            if not token:
                raise ValueError(f"empty IMDSv2 token from {self.endpoint}{TOKEN_PATH}")
            self._token = token
            # Renew a minute early, so a poll never carries a token that lapses in flight.
            self._token_expires = time.monotonic() + max(self.token_ttl_s - 60, 1)
        return self._token

    def _check_rebalance(self) -> None:
        if self.rebalance_notice is not None:
            return
        body = self._get(REBALANCE_PATH)
        if body is None:
            return
        try:
            self.rebalance_notice = str(json.loads(body).get("noticeTime", "?"))
        except (ValueError, AttributeError):
            self.rebalance_notice = "?"
        log.warning(
            "EC2 rebalance recommendation (%s): interruption risk is high; working on until "
            "an interruption notice", self.rebalance_notice,
        )  # fmt: skip

    def _note_error(self, error: BaseException) -> None:
        """Logs the first error of an outage, then at most one summary a minute."""
        self.errors += 1
        now = time.monotonic()
        if self._unreachable_since is None:
            self._unreachable_since = now
        if now < self._next_error_log:
            self._errors_unlogged += 1
            log.debug("instance metadata %s: %s", self.endpoint, error)
            return
        more = f" ({self._errors_unlogged} more errors)" if self._errors_unlogged else ""
        log.warning("instance metadata %s unavailable: %s%s; polling on for spot notices",
                    self.endpoint, error, more)  # fmt: skip
        self._errors_unlogged = 0
        self._next_error_log = now + ERROR_LOG_INTERVAL_S

    def _note_reachable(self) -> None:
        if self._unreachable_since is not None:
            log.info("instance metadata %s reachable again after %.0fs", self.endpoint,
                     time.monotonic() - self._unreachable_since)  # fmt: skip
            self._unreachable_since = None
            self._next_error_log = 0.0
            self._errors_unlogged = 0


def _parse_notice(body: bytes) -> SpotNotice:
    """A 200 on instance-action is a notice whatever its body; the body says which and when."""
    try:
        document = json.loads(body)
    except ValueError:
        document = None
    if not isinstance(document, dict):
        return SpotNotice("unknown", body[:100].decode("utf-8", "replace"))
    return SpotNotice(str(document.get("action", "unknown")), str(document.get("time", "unknown")))
