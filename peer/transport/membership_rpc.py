"""The membership service's one-way routes (SWIM messages <-> sitemesh.v1.Membership RPCs)."""

from __future__ import annotations

from peer.core import membership as m
from peer.gen.sitemesh.v1 import membership_pb2
from peer.transport.oneway import OneWayService, Route

MEMBERSHIP = OneWayService(
    membership_pb2.DESCRIPTOR.services_by_name["Membership"].full_name,
    (
        Route(m.Ping, membership_pb2.Ping, "SendPing"),
        Route(m.Ack, membership_pb2.Ack, "SendAck"),
        Route(m.PingReq, membership_pb2.PingReq, "SendPingReq"),
        Route(m.Nack, membership_pb2.Nack, "SendNack"),
        Route(m.PushPull, membership_pb2.PushPull, "SendPushPull"),
    ),
)
