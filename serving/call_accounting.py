"""Every RPC counted by its final code, also the ones refused before a handler runs; the call limit.

The handlers count what they answer (``Handlers.instrumented``). Three outcomes are decided before any
handler runs, and they are the ones that show overload and broken clients first: RESOURCE_EXHAUSTED
(too many calls at once), a request that does not decode, and a method the server does not have.
``CallAccounting``, a server interceptor, counts them under the same ``recsys_serving_requests_total``
(an unknown method under ``method="unknown"``: client-chosen names would make unbounded label sets),
and turns an undecodable request into INVALID_ARGUMENT naming the message it should have been
(gRPC's own answer is INTERNAL "Exception deserializing request!", which blames the server).

It also enforces ``max_concurrent_rpcs`` itself, instead of gRPC's option of that name, because gRPC
refuses those calls without a word to any interceptor. A unary call counts from the moment it is
accepted (when gRPC asks the interceptors for its handler, inside the call's own task) until that task
ends, however it ends; so the count is exact, and a refusal is answered at once, without waiting for
the calls ahead of it. Streaming calls (health Watch, reflection) are long-lived and not limited.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable

import grpc
from google.protobuf import descriptor_pool

Count = Callable[[str, str], None]  # (method, status code name)


class _Undecodable:
    """What the tolerant deserializer hands the handler instead of a message."""

    def __init__(self, error: str) -> None:
        self.error = error


class CallAccounting(grpc.aio.ServerInterceptor):
    def __init__(self, max_concurrent_rpcs: int, count: Count) -> None:
        self._limit = max_concurrent_rpcs
        self._count = count
        self._active = 0  # touched only on the event loop
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def active(self) -> int:
        """Unary calls accepted and not finished."""
        return self._active

    async def intercept_service(self, continuation, handler_call_details: grpc.HandlerCallDetails):
        handler = await continuation(handler_call_details)
        if handler is None:
            self._count("unknown", "UNIMPLEMENTED")
            return None
        if handler.unary_unary is None:
            return handler
        path = handler_call_details.method
        method = path.rsplit("/", 1)[-1]
        if self._active >= self._limit:
            self._count(method, "RESOURCE_EXHAUSTED")
            return _REFUSAL
        self._active += 1
        asyncio.current_task().add_done_callback(self._finished)
        cached = self._wrapped.get(path)
        if cached is None or cached[0] is not handler:  # the same handler object for every call, usually
            cached = self._wrapped[path] = (handler, self._tolerant(handler, path, method))
        return cached[1]

    def _finished(self, _task: asyncio.Task) -> None:
        self._active -= 1

    def _tolerant(self, handler: grpc.RpcMethodHandler, path: str, method: str) -> grpc.RpcMethodHandler:
        """``handler`` with its request decoded leniently: an undecodable one is refused by name."""
        decode, behaviour, count = handler.request_deserializer, handler.unary_unary, self._count
        expected = _request_type(path)

        def decode_or_explain(data: bytes):
            try:
                return decode(data) if decode is not None else data
            except Exception as err:  # protobuf's DecodeError, or whatever a custom decoder raises
                return _Undecodable(f"{type(err).__name__}: {err}")

        async def refuse_undecodable(request, context: grpc.aio.ServicerContext):
            if isinstance(request, _Undecodable):
                count(method, "INVALID_ARGUMENT")
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a {expected}: {request.error}"
                )
            answer = behaviour(request, context)
            return await answer if inspect.isawaitable(answer) else answer

        return handler._replace(request_deserializer=decode_or_explain, unary_unary=refuse_undecodable)


async def _refuse(request: bytes, context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many calls at once; retry with backoff")


#: Answers a call over the limit; its request is never decoded.
_REFUSAL = grpc.unary_unary_rpc_method_handler(_refuse)


def _request_type(path: str) -> str:
    """The full name of the request message of ``/package.Service/Method``, as the caller should know it."""
    service, _, method = path.strip("/").rpartition("/")
    try:
        return descriptor_pool.Default().FindMethodByName(f"{service}.{method}").input_type.full_name
    except KeyError:
        return f"request of {path}"
