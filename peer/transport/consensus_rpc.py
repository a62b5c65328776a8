"""The consensus service's one-way routes (election + log replication <-> sitemesh.v1.Consensus)."""

from __future__ import annotations

from peer.core import commitlog, election
from peer.gen.sitemesh.v1 import consensus_pb2
from peer.transport.oneway import OneWayService, Route

CONSENSUS = OneWayService(
    consensus_pb2.DESCRIPTOR.services_by_name["Consensus"].full_name,
    (
        Route(election.RequestVote, consensus_pb2.RequestVote, "SendRequestVote"),
        Route(election.VoteReply, consensus_pb2.VoteReply, "SendVoteReply"),
        Route(commitlog.AppendEntries, consensus_pb2.AppendEntries, "SendAppendEntries"),
        Route(commitlog.AppendReply, consensus_pb2.AppendReply, "SendAppendReply"),
        Route(commitlog.InstallSnapshot, consensus_pb2.InstallSnapshot, "SendInstallSnapshot"),
        Route(election.TimeoutNow, consensus_pb2.TimeoutNow, "SendTimeoutNow"),
    ),
)
