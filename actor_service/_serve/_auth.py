"""Bearer-token check for the actor's gRPC server, run before any request body is decoded.

When the actor has a token, every ``rlfleet.v1.ActorService`` call must carry
``authorization: Bearer <token>`` metadata. The interceptor looks only at the
metadata, so a caller without the token never gets its messages parsed; it is
answered UNAUTHENTICATED at once: the refusing handler has no request
deserializer, so not even a unary body is parsed, and every refusal is
audit-logged with the caller's address. Health and reflection stay open so that
probes (Kubernetes, load balancers, ``grpcurl list``) work without secrets.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from actor_service._serve._logging import log_event

if TYPE_CHECKING:
    from actor_service._serve._metrics import ActorMetrics

__all__ = ["TokenAuthInterceptor"]

# Services a probe needs; everything else requires the token.
_OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
_REFUSED = (
    "missing or invalid bearer token (give the actor's --token: token= or RLFLEET_TOKEN on "
    "the learner, --token or RLFLEET_TOKEN for rlfleet status)"
)


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuse ActorService calls without ``authorization: Bearer <token>``.

    Args:
        token: The shared secret; must be non-empty.
        metrics: Where to count refusals; None counts nothing.
    """

    def __init__(self, token: str, metrics: ActorMetrics | None = None) -> None:
        if not token:
            raise ValueError("TokenAuthInterceptor needs a non-empty token")
        self._expected = f"Bearer {token}".encode()
        self._metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """Pass authorised and probe calls on; answer the rest UNAUTHENTICATED."""
        method = handler_call_details.method or ""
        handler = await continuation(handler_call_details)
        if handler is None or method.startswith(_OPEN_PREFIXES):
            return handler
        if self._authorised(handler_call_details.invocation_metadata or ()):
            return handler
        if self._metrics is not None:  # only the service's own methods get here: bounded
            self._metrics.auth_refusals.labels(method.rsplit("/", 1)[-1]).inc()
        return _refusing_handler(handler, method)

    def _authorised(self, metadata: Any) -> bool:
        for key, value in metadata:
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else bytes(value)
                return hmac.compare_digest(given, self._expected)
        return False


def _refusing_handler(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that logs the peer and aborts UNAUTHENTICATED.

    It has no request deserializer: a unary body stays raw bytes, never parsed,
    and a request stream is never iterated.
    """

    async def refuse(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        log_event("auth.refused", logging.WARNING, method=method, peer=context.peer())
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, _REFUSED)

    async def refuse_streaming(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        await refuse(request_or_iterator, context)
        yield  # pragma: no cover  # makes this an async generator, as a streaming handler must be

    kwargs = {"request_deserializer": None, "response_serializer": handler.response_serializer}
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse_streaming, **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse_streaming, **kwargs)
    return grpc.unary_unary_rpc_method_handler(refuse, **kwargs)
