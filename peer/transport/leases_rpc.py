"""The lease service's one-way routes (DARL messages <-> sitemesh.v1.Leases RPCs)."""

from __future__ import annotations

from peer.core import lease_types as lt
from peer.gen.sitemesh.v1 import leases_pb2
from peer.transport.oneway import OneWayService, Route

LEASES = OneWayService(
    leases_pb2.DESCRIPTOR.services_by_name["Leases"].full_name,
    tuple(
        Route(cls, getattr(leases_pb2, cls.__name__), f"Send{cls.__name__}")
        for cls in (lt.GrantRequest, lt.GrantReply, lt.Renew, lt.RenewReply, lt.Start, lt.StartReply, lt.Trained,
                    lt.TrainedReply, lt.Release, lt.Replicate, lt.ReplicateAck, lt.SyncRequest, lt.SyncReply,
                    lt.Rejected)
    ),
)
