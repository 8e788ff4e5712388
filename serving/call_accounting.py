"""Every RPC counted by its final code, also the ones gRPC refuses before a handler runs.

The handlers count what they answer (``Handlers.instrumented``). Three outcomes are decided before any
handler runs, and they are the ones that show overload and broken clients first: RESOURCE_EXHAUSTED
(the concurrent-call limit), a request that does not decode, and a method the server does not have.
``CallAccounting``, a server interceptor, counts them under the same ``recsys_serving_requests_total``
(an unknown method under ``method="unknown"``: client-chosen names would make unbounded label sets),
and turns an undecodable request into INVALID_ARGUMENT naming the message it should have been
(gRPC's own answer is INTERNAL "Exception deserializing request!", which blames the server).

The limit is gRPC's own ``maximum_concurrent_rpcs``, so a refusal stays immediate (it never waits in
the handler pool). gRPC counts a call against it from acceptance until its handler task finishes;
``CountingExecutor`` counts the same tasks, and the interceptor, which gRPC runs just before it applies
the limit, predicts the refusal from that count. The two counts settle a moment apart when a call
finishes, so a refusal in that instant can go uncounted; none is counted that did not happen.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import grpc
from google.protobuf import descriptor_pool


class CountingExecutor(ThreadPoolExecutor):
    """The RPC handler pool, knowing how many calls it holds (queued or running)."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers, thread_name_prefix="rpc")
        self._active = 0
        self._count_lock = threading.Lock()

    def submit(self, fn, /, *args, **kwargs) -> Future:
        with self._count_lock:
            self._active += 1
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._finished()
            raise
        future.add_done_callback(self._finished)
        return future

    def _finished(self, _future: Future | None = None) -> None:
        with self._count_lock:
            self._active -= 1

    def active(self) -> int:
        return self._active


class _Undecodable:
    """What the tolerant deserializer hands the handler instead of a message."""

    def __init__(self, error: str) -> None:
        self.error = error


Count = Callable[[str, str], None]  # (method, status code name)


class CallAccounting(grpc.ServerInterceptor):
    def __init__(self, pool: CountingExecutor, max_concurrent_rpcs: int, count: Count) -> None:
        self._pool = pool
        self._limit = max_concurrent_rpcs
        self._count = count
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def intercept_service(self, continuation, handler_call_details: grpc.HandlerCallDetails):
        handler = continuation(handler_call_details)
        if handler is None:
            self._count("unknown", "UNIMPLEMENTED")
            return None
        path = handler_call_details.method
        method = path.rsplit("/", 1)[-1]
        if self._pool.active() >= self._limit:
            self._count(method, "RESOURCE_EXHAUSTED")
            return handler
        if handler.unary_unary is None or handler.request_deserializer is None:
            return handler
        cached = self._wrapped.get(path)
        if cached is None or cached[0] is not handler:  # the same handler object for every call, usually
            cached = self._wrapped[path] = (handler, self._tolerant(handler, path, method))
        return cached[1]

    def _tolerant(self, handler: grpc.RpcMethodHandler, path: str, method: str) -> grpc.RpcMethodHandler:
        """``handler`` with its request decoded leniently: an undecodable one is refused by name."""
        decode, behaviour, count = handler.request_deserializer, handler.unary_unary, self._count
        expected = _request_type(path)

        def decode_or_explain(data: bytes):
            try:
                return decode(data)
            except Exception as err:  # protobuf's DecodeError, or whatever a custom decoder raises
                return _Undecodable(f"{type(err).__name__}: {err}")

        def refuse_undecodable(request, context: grpc.ServicerContext):
            if isinstance(request, _Undecodable):
                count(method, "INVALID_ARGUMENT")
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a {expected}: {request.error}"
                )
            return behaviour(request, context)

        return handler._replace(request_deserializer=decode_or_explain, unary_unary=refuse_undecodable)


def _request_type(path: str) -> str:
    """The full name of the request message of ``/package.Service/Method``, as the caller should know it."""
    service, _, method = path.strip("/").rpartition("/")
    try:
        return descriptor_pool.Default().FindMethodByName(f"{service}.{method}").input_type.full_name
    except KeyError:
        return f"request of {path}"
