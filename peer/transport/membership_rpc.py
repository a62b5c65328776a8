"""gRPC edges of the membership protocol: a thin servicer and a one-way sender.

The servicer decodes a message, hands it to the node (which runs the core) and answers
`Accepted`; the sender turns a core `Send` effect into the matching RPC. Neither knows SWIM.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc

from peer import membership as m
from peer.gen.sitemesh.v1 import common_pb2, membership_pb2, membership_pb2_grpc
from peer.transport.channels import Credentials, PLAINTEXT, open_channel
from peer.transport.wire import WireError, from_proto, to_proto

log = logging.getLogger(__name__)

# core message type -> (proto type, stub method name)
_ROUTES: dict[type, tuple[type, str]] = {
    m.Ping: (membership_pb2.Ping, "SendPing"),
    m.Ack: (membership_pb2.Ack, "SendAck"),
    m.PingReq: (membership_pb2.PingReq, "SendPingReq"),
    m.Nack: (membership_pb2.Nack, "SendNack"),
    m.PushPull: (membership_pb2.PushPull, "SendPushPull"),
}


class MembershipServicer(membership_pb2_grpc.MembershipServicer):
    """Hands every decoded message to `deliver`; refuses malformed ones with INVALID_ARGUMENT."""

    def __init__(self, deliver: Callable[[m.Message], None]) -> None:
        self._deliver = deliver

    async def _take(self, request: object, cls: type, context: grpc.aio.ServicerContext) -> common_pb2.Accepted:
        try:
            msg = from_proto(request, cls)  # type: ignore[arg-type]
        except WireError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        self._deliver(msg)
        return common_pb2.Accepted()

    async def SendPing(self, request, context):  # noqa: N802 - generated name
        return await self._take(request, m.Ping, context)

    async def SendAck(self, request, context):  # noqa: N802
        return await self._take(request, m.Ack, context)

    async def SendPingReq(self, request, context):  # noqa: N802
        return await self._take(request, m.PingReq, context)

    async def SendNack(self, request, context):  # noqa: N802
        return await self._take(request, m.Nack, context)

    async def SendPushPull(self, request, context):  # noqa: N802
        return await self._take(request, m.PushPull, context)


class MembershipSender:
    """Delivers core messages to addresses; one cached channel per address.

    Delivery is best effort, like the datagrams SWIM was designed for: a failed call is a lost
    message, reported as False and left to the core's timers.
    """

    def __init__(self, timeout_s: float, creds: Credentials = PLAINTEXT) -> None:
        self._timeout_s = timeout_s
        self._creds = creds
        self._stubs: dict[str, membership_pb2_grpc.MembershipStub] = {}
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.failures = 0

    def _stub(self, address: str) -> membership_pb2_grpc.MembershipStub:
        stub = self._stubs.get(address)
        if stub is None:
            channel = open_channel(address, self._creds)
            self._channels[address] = channel
            stub = self._stubs[address] = membership_pb2_grpc.MembershipStub(channel)
        return stub

    async def send(self, address: str, msg: m.Message) -> bool:
        proto_cls, method = _ROUTES[type(msg)]
        try:
            await getattr(self._stub(address), method)(to_proto(msg, proto_cls), timeout=self._timeout_s)
            return True
        except grpc.aio.AioRpcError as err:
            self.failures += 1
            log.debug("send %s to %s failed: %s", type(msg).__name__, address, err.code().name)
            return False

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._stubs.clear()
