"""One-way protocol messages over gRPC, for any core (membership, consensus, leases).

A core message type is routed to the unary RPC of its service that takes the matching proto
message and answers `Accepted` (docs/decisions/wire-one-way-messages.md). The server side is a
generic handler built from the routes, so no per-method servicer boilerplate exists: decode,
hand to `deliver`, answer. The client side sends with a deadline; failure is a lost message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from peer.gen.sitemesh.v1 import common_pb2
from peer.transport.channels import ChannelPool
from peer.transport.wire import WireError, from_proto, to_proto

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Refused:
    """What `deliver` returns for a message it refuses for good: no retry can change the answer, the
    sender must (its config differs from the run's). Answered FAILED_PRECONDITION with `reason`, which
    the sender keeps in `OneWaySender.refused`; a plain string is answered PERMISSION_DENIED."""

    reason: str


@dataclass(frozen=True)
class Route:
    """Core message type `core_cls` travels as `proto_cls` through RPC `method` of the service."""

    core_cls: type
    proto_cls: type
    method: str


@dataclass(frozen=True)
class OneWayService:
    """A proto service made only of one-way RPCs, and how its messages map to a core's types."""

    full_name: str
    routes: Sequence[Route]

    def route_of(self, msg: object) -> Route:
        for route in self.routes:
            if type(msg) is route.core_cls:
                return route
        raise TypeError(f"{type(msg).__name__} is not a message of {self.full_name}")

    def handler(self, deliver: Callable[[Any], str | Refused | None]) -> grpc.GenericRpcHandler:
        """The server side: every RPC decodes, calls `deliver(core_msg)` and answers Accepted, or
        PERMISSION_DENIED with the reason `deliver` returns for a message it refuses (a `Refused`:
        FAILED_PRECONDITION)."""

        def make(route: Route) -> grpc.RpcMethodHandler:
            async def call(request: Any, context: grpc.aio.ServicerContext) -> common_pb2.Accepted:
                try:
                    msg = from_proto(request, route.core_cls)
                except WireError as err:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
                refused = deliver(msg)
                if isinstance(refused, Refused):
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refused.reason)
                if refused is not None:
                    await context.abort(grpc.StatusCode.PERMISSION_DENIED, refused)
                return common_pb2.Accepted()

            return grpc.unary_unary_rpc_method_handler(
                call,
                request_deserializer=route.proto_cls.FromString,
                response_serializer=common_pb2.Accepted.SerializeToString,
            )

        return grpc.method_handlers_generic_handler(self.full_name, {r.method: make(r) for r in self.routes})


class OneWaySender:
    """Sends core messages of `service` to addresses, best effort (datagram semantics)."""

    def __init__(self, service: OneWayService, pool: ChannelPool, timeout_s: float) -> None:
        self._service = service
        self._pool = pool
        self._timeout_s = timeout_s
        self.failures = 0
        self.last_error = ""
        """Code and details of the last lost message, for error messages (e.g. a failed join)."""
        self.in_flight = 0
        """Messages handed to gRPC and not yet answered or failed (a leaving peer drains them)."""
        self.refused: dict[str, str] = {}
        """address -> reason of the last `Refused` answer from it (FAILED_PRECONDITION): a refusal
        no retry changes, e.g. a join whose config differs from the run's."""

    async def send(self, address: str, msg: object) -> bool:
        route = self._service.route_of(msg)
        call = self._pool.get(address).unary_unary(
            f"/{self._service.full_name}/{route.method}",
            request_serializer=route.proto_cls.SerializeToString,
            response_deserializer=common_pb2.Accepted.FromString,
        )
        self.in_flight += 1
        try:
            await call(to_proto(msg, route.proto_cls), timeout=self._timeout_s)
            return True
        except grpc.aio.AioRpcError as err:
            self.failures += 1
            self.last_error = f"{err.code().name}: {err.details()}"
            if err.code() == grpc.StatusCode.FAILED_PRECONDITION:
                self.refused[address] = err.details() or ""
            log.debug("%s to %s lost: %s", type(msg).__name__, address, err.code().name)
            return False
        finally:
            self.in_flight -= 1
