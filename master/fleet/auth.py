"""Shared-token authentication: loading the token, checking it on every call, loopback rules,
and bounds on what a client without the token can make the master hold.

Every method needs `authorization: Bearer <token>`, Status included: it exposes the elite's
seeds, which are the trained policy. Only the standard health service stays open, so load
balancers and orchestrators can probe the master without the secret: its Watch streams are
bounded in number (BoundedHealthServicer), and connections in number, in streams each and in
how long they may stay silent (connection_options), so that no client without the token can
exhaust the master's memory or file descriptors. Nothing here ever puts the token, or what a
caller sent in its place, into a message or a log line.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2

from neuro.wire import METADATA_KEY, TOKEN_ENV, is_loopback, load_token

__all__ = ["TOKEN_ENV", "TokenInterceptor", "is_loopback", "load_token"]

OPEN_PREFIX = "/" + health_pb2.DESCRIPTOR.services_by_name["Health"].full_name + "/"
REFUSAL = "missing or invalid token"
"""The same words for every refusal: whether a token was sent or how close it was stays hidden."""


async def _refuse(request: object, context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSAL)


# The refusal never reads the request: no deserializer, so a forged payload is never parsed.
_REFUSALS = {
    (False, False): grpc.unary_unary_rpc_method_handler(_refuse),
    (False, True): grpc.unary_stream_rpc_method_handler(_refuse),
    (True, False): grpc.stream_unary_rpc_method_handler(_refuse),
    (True, True): grpc.stream_stream_rpc_method_handler(_refuse),
}


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Answers UNAUTHENTICATED unless the call carries `authorization: Bearer <token>`."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("an empty token would let everyone in")
        self._expected = f"Bearer {token}".encode()

    def __repr__(self) -> str:
        return "TokenInterceptor(token=<hidden>)"

    def authorized(self, metadata: object) -> bool:
        """Whether exactly one authorization value is present and matches, in constant time."""
        values = [value for key, value in metadata or () if key == METADATA_KEY]
        if len(values) != 1:
            return False
        value = values[0]
        sent = value.encode("utf-8", "replace") if isinstance(value, str) else bytes(value)
        return hmac.compare_digest(sent, self._expected)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        # Everything but the health service is closed, so a service added later is too.
        if handler_call_details.method.startswith(OPEN_PREFIX) or self.authorized(
            handler_call_details.invocation_metadata
        ):
            return handler
        if handler is None:  # an unknown method: refused the same way, revealing nothing
            return _REFUSALS[False, False]
        return _REFUSALS[handler.request_streaming, handler.response_streaming]


MAX_HEALTH_WATCHES = 64
"""Health.Watch streams held at once, from anyone: an orchestrator needs one or two (most probe
with Check); each costs the master about 22 KB, and any client may open them."""
MAX_SERVICE_NAME = 256
"""The longest service name a health call may ask about (the master's are far shorter)."""
MAX_STREAMS_PER_CONNECTION = 100
"""Calls open at once on one connection (HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS): a worker
holds its Attach call and one or two others; a client's further calls wait their turn."""
HANDSHAKE_TIMEOUT_S = 10.0
"""A connection that has not completed its HTTP/2 (and TLS) handshake by then is closed."""
CONNECTION_IDLE_S = 120.0
"""A connection with no call open for this long is closed (a client reconnects as it calls)."""
MIN_FILES_KEPT = 64
MAX_FILES_KEPT = 1024
"""File descriptors never given to connections, for the run's own files (checkpoints,
metrics, TensorBoard, the S3 mirror's sockets): an eighth of the limit, within these bounds."""


def connection_options(file_limit: int) -> tuple[tuple[str, Any], ...]:
    """The server options that bound connections, given the process's open-file limit: never
    more connections than leave the run its own files, none silent for long."""
    kept = max(MIN_FILES_KEPT, min(MAX_FILES_KEPT, file_limit // 8))
    return (
        ("grpc.max_allowed_incoming_connections", max(1, file_limit - kept)),
        ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
        ("grpc.server_handshake_timeout_ms", int(HANDSHAKE_TIMEOUT_S * 1000)),
        ("grpc.max_connection_idle_ms", int(CONNECTION_IDLE_S * 1000)),
    )


class BoundedHealthServicer(health.aio.HealthServicer):
    """The standard health service, with at most MAX_HEALTH_WATCHES Watch streams at once and
    service names of at most MAX_SERVICE_NAME characters; beyond, RESOURCE_EXHAUSTED (or
    INVALID_ARGUMENT) says so."""

    def __init__(self, max_watches: int = MAX_HEALTH_WATCHES) -> None:
        super().__init__()
        self.max_watches = max_watches
        self.watching = 0

    async def Check(self, request: health_pb2.HealthCheckRequest, context: Any) -> Any:
        await _check_service_name(request, context)
        return await super().Check(request, context)

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: Any) -> None:
        await _check_service_name(request, context)
        if self.watching >= self.max_watches:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"at most {self.max_watches} Health.Watch streams at once; probe with Health.Check",
            )
        self.watching += 1
        try:
            # The standard Watch writes its updates itself and never returns.
            await super().Watch(request, context)
        finally:
            self.watching -= 1


async def _check_service_name(request: health_pb2.HealthCheckRequest, context: Any) -> None:
    if len(request.service) > MAX_SERVICE_NAME:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"service name of {len(request.service)} characters; at most {MAX_SERVICE_NAME}",
        )
