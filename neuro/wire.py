"""What master and workers agree on to talk: address, token, channel, message limits and the
enum maps both sides convert through.

The token is checked on the master by master.fleet.auth.TokenInterceptor; every client (a
worker, `neuro-master status`) sends it the same way, through open_channel.
"""

from __future__ import annotations

import ipaddress
import os
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import grpc

from neuro.envs.make import PAPER, REGISTERED
from neuro.v1 import evolution_pb2 as pb

DEFAULT_MASTER = "127.0.0.1:8080"
SERVICE_NAME = "neuro.v1.Evolution"
TOKEN_ENV = "NEURO_TOKEN"
METADATA_KEY = "authorization"
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""gRPC's default cap, made explicit: a bigger request gets RESOURCE_EXHAUSTED."""
MAX_TASKS_PER_LEASE = 256
"""The most tasks one Lease may ask for: the master refuses more, so a worker asks for at most
this many (a batched worker of more env slots fills them over several leases)."""
MAX_WORKER_ID_LENGTH = 256
WORKER_ID_CHARACTERS = frozenset(string.ascii_letters + string.digits + "._:@+=-")
"""What a worker id may hold: it shows up in logs, the status table and metric labels."""
MAX_TASK_ID_LENGTH = 256
"""The longest task id the master accepts back; a worker skips a task with a longer one, since
every report naming it would be refused."""
MAX_ERROR_CHARS = 512
"""A task's error text travels up to this long: the worker cuts it there, the master keeps no
more."""
ATARI_DYNAMICS_TO_WIRE = {PAPER: pb.ATARI_DYNAMICS_PAPER, REGISTERED: pb.ATARI_DYNAMICS_REGISTERED}
"""Each Atari dynamics (neuro.envs.make) as Task.env.atari_dynamics carries it."""
ATARI_DYNAMICS_FROM_WIRE = {
    # Unspecified: a non-Atari task, or a master from before the field (the paper's protocol).
    pb.ATARI_DYNAMICS_UNSPECIFIED: PAPER,
    **{value: name for name, value in ATARI_DYNAMICS_TO_WIRE.items()},
}
"""Task.env.atari_dynamics -> the dynamics it names; a value missing here is a newer master's."""


def load_token(path: str | None, env_var: str = TOKEN_ENV) -> str | None:
    """The token from `path` if given, else from `env_var`; None if neither is set."""
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            reason = getattr(error, "strerror", None) or type(error).__name__
            raise ValueError(f"cannot read token file {path}: {reason}") from None
        source = f"token file {path}"
    else:
        text = os.environ.get(env_var)
        if text is None:
            return None
        source = f"environment variable {env_var}"
    token = text.strip()
    if not token:
        raise ValueError(f"{source} is empty")
    # gRPC metadata values are printable ASCII; a space would also break the Bearer scheme.
    if not all("!" <= c <= "~" for c in token):
        raise ValueError(f"{source}: the token must be printable ASCII without spaces")
    return token


def worker_id_problem(worker_id: str) -> str | None:
    """Why `worker_id` cannot name a worker, or None if it can."""
    if not 1 <= len(worker_id) <= MAX_WORKER_ID_LENGTH:
        return (
            f"worker_id must be 1-{MAX_WORKER_ID_LENGTH} characters, got {len(worker_id)}: "
            f"{worker_id[:40]!r}"
        )
    for position, character in enumerate(worker_id):
        if character not in WORKER_ID_CHARACTERS:
            return (
                f"worker_id {worker_id[:40]!r} holds {character!r} at position {position}; "
                "allowed are ASCII letters, digits and . _ : @ + = -"
            )
    return None


def is_loopback(host: str) -> bool:
    """Whether `host` (as given to --host) only accepts connections from this machine."""
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it could resolve anywhere


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...] | None:
    """Call metadata carrying the token (None without one)."""
    return ((METADATA_KEY, f"Bearer {token}"),) if token is not None else None


class _CallDetails(NamedTuple):
    method: str
    timeout: float | None
    metadata: tuple | None
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: grpc.Compression | None


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call (the master's TokenInterceptor)."""

    def __init__(self, token: str) -> None:
        self._metadata = bearer_metadata(token)

    def __repr__(self) -> str:
        return "_BearerToken(<hidden>)"

    def intercept_unary_unary(self, continuation, client_call_details, request):
        details = _CallDetails(
            client_call_details.method,
            client_call_details.timeout,
            (*(client_call_details.metadata or ()), *self._metadata),
            client_call_details.credentials,
            client_call_details.wait_for_ready,
            client_call_details.compression,
        )
        return continuation(details, request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return self.intercept_unary_unary(continuation, client_call_details, request)


def open_channel(
    address: str,
    token: str | None = None,
    root_certificates: bytes | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.Channel:
    """A channel to the master: TLS when given its root certificate, the token on every call."""
    if root_certificates is not None:
        credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates)
        channel = grpc.secure_channel(address, credentials, options=list(options))
    else:
        channel = grpc.insecure_channel(address, options=list(options))
    if token is not None:
        # An interceptor rather than call credentials: those are refused on plaintext channels,
        # and a master on loopback may run without TLS.
        channel = grpc.intercept_channel(channel, _BearerToken(token))
    return channel
