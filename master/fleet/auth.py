"""Shared-token authentication: loading the token, checking it on every call, loopback rules.

Every method needs `authorization: Bearer <token>`, Status included: it exposes the elite's
seeds, which are the trained policy. Only the standard health service stays open, so load
balancers and orchestrators can probe the master without the secret. Nothing here ever puts
the token, or what a caller sent in its place, into a message or a log line.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

import grpc
from grpc_health.v1 import health_pb2

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
