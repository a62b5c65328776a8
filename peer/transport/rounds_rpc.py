"""The rounds service's one-way routes (RoundOpen, Contribution, RunComplete <-> sitemesh.v1.Rounds)."""

from __future__ import annotations

from peer.core import rounds
from peer.gen.sitemesh.v1 import rounds_pb2
from peer.transport.oneway import OneWayService, Route

ROUNDS = OneWayService(
    rounds_pb2.DESCRIPTOR.services_by_name["Rounds"].full_name,
    (
        Route(rounds.RoundOpen, rounds_pb2.RoundOpen, "SendRoundOpen"),
        Route(rounds.Contribution, rounds_pb2.Contribution, "SendContribution"),
        Route(rounds.RunComplete, rounds_pb2.RunComplete, "SendRunComplete"),
    ),
)
