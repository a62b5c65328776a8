"""Wrapping a gRPC method handler so that a check runs before its behaviour, for server interceptors.

gRPC's aio interceptors see the method name but neither the request nor the caller's certificate,
so an interceptor that must look at them (peer/transport/guard.py) wraps the method's handler and
checks inside it. `SafeDecode`, on every server (peer/transport/channels.py), answers a request
that does not parse with INVALID_ARGUMENT: left to gRPC, it logs a traceback per message and
answers UNKNOWN, so garbage would fill the log.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import grpc
from google.protobuf.message import DecodeError

Check = Callable[[str, Any, grpc.aio.ServicerContext], Awaitable[None]]
"""check(method, request, context): aborts the call to refuse it. `request` is None for calls with
a stream of requests (they are not looked at)."""
Scope = Callable[[str, Any, grpc.aio.ServicerContext], AbstractAsyncContextManager[None]]
"""scope(method, request, context): entered before the behaviour runs, left when the call ends
(peer/transport/limits.py counts open calls with one)."""


class _Garbage:
    """Stands for a request whose bytes did not parse."""


GARBAGE = _Garbage()


def _lenient(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError:
            return GARBAGE

    return parse


class SafeDecode(grpc.aio.ServerInterceptor):
    """Refuses requests that do not parse as their method's message, with INVALID_ARGUMENT."""

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Any], details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None or handler.request_streaming:
            return handler
        return wrapped(handler, details.method, _refuse_garbage, lenient=True)


async def _refuse_garbage(method: str, request: Any, context: grpc.aio.ServicerContext) -> None:
    if request is GARBAGE:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request bytes do not parse as {method}'s message")


def wrapped(handler: grpc.RpcMethodHandler, method: str, check: Check, lenient: bool = False) -> grpc.RpcMethodHandler:
    """`handler` with `check(method, request, context)` run before its behaviour; with `lenient`,
    a request that does not parse reaches `check` as GARBAGE instead of raising inside gRPC."""

    @contextlib.asynccontextmanager
    async def checked(method: str, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        await check(method, request, context)
        yield

    return enclosed(handler, method, checked, lenient)


class CallCheck(grpc.aio.ServerInterceptor):
    """An interceptor that runs its `check` before every call's behaviour; a check refuses a call by
    aborting it (the guard's roles, the front's connection slots)."""

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Any], details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None:
            return None
        return wrapped(handler, details.method, self.check)

    async def check(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> None:
        raise NotImplementedError


def enclosed(handler: grpc.RpcMethodHandler, method: str, scope: Scope, lenient: bool = False) -> grpc.RpcMethodHandler:
    """`handler` whose behaviour runs inside `scope(method, request, context)`, streams included."""
    deserializer = _lenient(handler.request_deserializer) if lenient else handler.request_deserializer
    if handler.unary_unary is not None:
        inner = handler.unary_unary

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            async with scope(method, request, context):
                return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, deserializer, handler.response_serializer)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(
            _streaming(handler.unary_stream, lambda req: req, method, scope), deserializer,
            handler.response_serializer)
    if handler.stream_unary is not None:
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            async with scope(method, None, context):
                return await inner_su(requests, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, deserializer, handler.response_serializer)
    return grpc.stream_stream_rpc_method_handler(
        _streaming(handler.stream_stream, lambda _: None, method, scope), deserializer,
        handler.response_serializer)


def _streaming(inner: Any, checked: Callable[[Any], Any], method: str, scope: Scope) -> Any:
    """A streaming-response behaviour in the same style as `inner`: an async generator, or a
    coroutine that writes with context.write (gRPC refuses a mix of the two)."""
    if inspect.isasyncgenfunction(inner):
        async def generator(request: Any, context: grpc.aio.ServicerContext) -> Any:
            async with scope(method, checked(request), context):
                async for item in inner(request, context):
                    yield item

        return generator

    async def coroutine(request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with scope(method, checked(request), context):
            return await inner(request, context)

    return coroutine
