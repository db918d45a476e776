"""Per-group caps on open calls, so no group of callers can crowd out the others.

gRPC's server-wide ``maximum_concurrent_rpcs`` counts every call alike: a few
connections holding ~128 idle ``grpc.health.v1.Health/Watch`` streams, with
no token, made ``Health/Check`` answer RESOURCE_EXHAUSTED and the learner's
calls fail. :class:`CallLimiter` instead caps each group of open calls on its
own and answers a call over its group's cap RESOURCE_EXHAUSTED at once:

* ``Health/Watch`` streams: :data:`MAX_WATCH_STREAMS`;
* reflection streams: :data:`MAX_REFLECTION_STREAMS`;
* ``Health/Check`` (unary, answered from memory) is not capped;
* ActorService calls are capped by the servicer (``MAX_ACTOR_CALLS``), and with
  a token, callers without it are refused before they hold anything.

So probes always find room, and in a fleet with a token the learner too, whatever
unauthenticated callers hold. Without a token every caller counts as the learner: calls
that hold the ActorService cap are dropped after the idle timeout (docs/security.md).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:
    from actor_service._serve._metrics import ActorMetrics

__all__ = ["MAX_REFLECTION_STREAMS", "MAX_WATCH_STREAMS", "CallLimiter"]

#: Open ``Health/Watch`` streams an actor serves at once.
MAX_WATCH_STREAMS = 1024
#: Open server-reflection streams an actor serves at once.
MAX_REFLECTION_STREAMS = 64

_GROUPS = (
    ("/grpc.health.v1.Health/Watch", "health watch", MAX_WATCH_STREAMS),
    ("/grpc.reflection.", "reflection", MAX_REFLECTION_STREAMS),
)


class CallLimiter(grpc.aio.ServerInterceptor):
    """Cap the open calls of each group in :data:`_GROUPS`; other calls pass untouched.

    Args:
        metrics: Where refusals are counted (``rpc_errors`` by the method's last name and
            RESOURCE_EXHAUSTED); None counts nothing.
    """

    def __init__(self, metrics: ActorMetrics | None = None) -> None:
        self.open: dict[str, int] = {name: 0 for _, name, _ in _GROUPS}
        self._metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """Wrap the handler of a capped method in the count of its group."""
        handler = await continuation(handler_call_details)
        method = handler_call_details.method or ""
        group = next(((n, cap) for prefix, n, cap in _GROUPS if method.startswith(prefix)), None)
        if handler is None or group is None or not handler.response_streaming:
            return handler
        name, cap = group
        codec = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        short = method.rsplit("/", 1)[-1]  # "Watch": one of a few names, a bounded label
        if handler.request_streaming and handler.stream_stream is not None:
            behavior = self._limited(handler.stream_stream, name, cap, short)
            return grpc.stream_stream_rpc_method_handler(behavior, **codec)
        if handler.unary_stream is not None:
            behavior = self._limited(handler.unary_stream, name, cap, short)
            return grpc.unary_stream_rpc_method_handler(behavior, **codec)
        return handler

    def _limited(
        self, behavior: Callable[..., Any], name: str, cap: int, method: str
    ) -> Callable[..., Any]:
        async def admit(context: grpc.aio.ServicerContext) -> None:
            if self.open[name] >= cap:
                if self._metrics is not None:
                    self._metrics.rpc_errors.labels(method, "RESOURCE_EXHAUSTED").inc()
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{self.open[name]} {name} streams are open, the most this actor serves",
                )
            self.open[name] += 1

        if inspect.isasyncgenfunction(behavior):

            async def generator(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator:
                await admit(context)
                try:
                    async for response in behavior(request, context):
                        yield response
                finally:
                    self.open[name] -= 1

            return generator

        async def coroutine(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await admit(context)
            try:
                return await behavior(request, context)
            finally:
                self.open[name] -= 1

        return coroutine
