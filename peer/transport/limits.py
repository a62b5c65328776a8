"""Bounds on the calls a peer's server runs at once, per caller and in total, and on how long one runs.

Without them one caller could hold every exchange long poll and chunk stream a server can run
(500 unread FetchChunks streams, 500 GetManifest polls) and grow it without bound. A call over a
bound is RESOURCE_EXHAUSTED with a one-line reason, counted in `CallLimiter.refused` and logged
once per (caller, method); a call running past `max_call_s` is cancelled. Health, Admin/Status and
reflection are never limited, so operators can always see a peer under such a load. Connections
are bounded per identity and address by the front (peer/transport/slots.py, front.py), handshakes
by gRPC's server options (peer/transport/channels.py). Every server of `channels.new_server` has
one limiter (docs/decisions/security-stream-bounds.md).

    .venv/bin/python -m pytest tests/integration/test_stream_bounds.py -q
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from peer.transport.auth import BadCertificate, identity_of, split_method
from peer.transport.front import remote_of
from peer.transport.intercept import enclosed

log = logging.getLogger("sitemesh.limits")

_UNLIMITED_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                       "grpc.reflection.v1.ServerReflection")


@dataclass(frozen=True)
class CallLimits:
    """How many calls may run at once and for how long (every call but health, status, reflection)."""

    per_caller: int = 64
    """Open calls of one caller (a certificate's name; a connection without TLS). A site holds a
    few exchange streams per peer and round; one-way messages finish in milliseconds."""
    total: int = 1024
    """Open calls of all callers together."""
    max_call_s: float = 600.0
    """Longest call: a long poll waits 60 s at most (peer/exchange/service.py), a chunk stream of a
    whole pseudo-gradient over a slow WAN link minutes; a stream nobody reads ends here."""

    def __post_init__(self) -> None:
        if not 1 <= self.per_caller <= self.total:
            raise ValueError(f"need 1 <= per_caller ({self.per_caller}) <= total ({self.total})")
        if not self.max_call_s > 0:
            raise ValueError(f"max_call_s must be > 0, got {self.max_call_s}")


def limited(method: str) -> bool:
    service, name = split_method(method)
    return service not in _UNLIMITED_SERVICES and not (service == "sitemesh.v1.Admin" and name == "Status")


def caller_of(context: grpc.aio.ServicerContext) -> str:
    """Who is calling: the verified certificate's name, else (plaintext) the client's connection
    (`ipv4:1.2.3.4:5678`, through the front: `front.remote_of`). Not its host: on loopback every
    site shares one, and a peer dials each other peer over one connection; the connections one host
    opens are bounded by the front (peer/transport/slots.py) and all their calls by `CallLimits.total`."""
    pems = (context.auth_context() or {}).get("x509_pem_cert")
    if pems:
        try:
            return identity_of(pems[0]).name
        except (BadCertificate, ValueError):
            pass
    return remote_of(context.peer())


class CallLimiter(grpc.aio.ServerInterceptor):
    """Counts the open calls of each caller and refuses those over `limits`."""

    def __init__(self, limits: CallLimits = CallLimits()) -> None:
        self.limits = limits
        self.open: collections.Counter[str] = collections.Counter()
        """caller -> calls running now."""
        self.refused: collections.Counter[tuple[str, str]] = collections.Counter()
        """(method, caller) -> calls refused for a bound."""
        self.timed_out = 0
        """Calls cancelled at max_call_s."""

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Any], details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None or not limited(details.method):
            return handler
        return enclosed(handler, details.method, self._held, lenient=False)

    def _over(self, caller: str) -> str | None:
        if self.open[caller] >= self.limits.per_caller:
            return f"{caller} has {self.open[caller]} calls open, the most one caller may have here"
        total = sum(self.open.values())
        if total >= self.limits.total:
            return f"{total} calls are open, the most this peer runs at once"
        return None

    @contextlib.asynccontextmanager
    async def _held(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        caller = caller_of(context)
        reason = self._over(caller)
        if reason is not None:
            key = (method, caller)
            if key not in self.refused:
                log.warning("refused %s from %s: %s; further refusals of this kind are only counted",
                            method, caller, reason)
            self.refused[key] += 1
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{reason}: retry when some have finished")
        self.open[caller] += 1
        task = asyncio.current_task()
        assert task is not None  # gRPC runs every call in a task
        deadline = asyncio.get_running_loop().call_later(self.limits.max_call_s, self._expire, task)
        try:
            yield
        finally:
            deadline.cancel()
            self.open[caller] -= 1
            if not self.open[caller]:
                del self.open[caller]

    def _expire(self, task: asyncio.Task[Any]) -> None:
        self.timed_out += 1
        task.cancel()
