"""Structural conversion between membership dataclasses and protobuf, both directions."""

from __future__ import annotations

import pytest

from peer.gen.sitemesh.v1 import membership_pb2
from peer.core.membership_types import Ack, MemberMeta, MemberState, MemberUpdate, Nack, Ping, PingReq, PushPull
from peer.transport.wire import WireError, from_proto, to_proto

META = MemberMeta(site="lumi", address="10.0.0.1:7001", role="voter", accelerator="4x MI250X",
                  tokens_per_s=1234.5, labels=(("job", "42"), ("queue", "standard-g")))
UPDATES = (
    MemberUpdate(site="lumi", state=MemberState.ALIVE, incarnation=3, meta=META, from_site="lumi"),
    MemberUpdate(site="frontier", state=MemberState.SUSPECT, incarnation=0, meta=None, from_site="lumi"),
    MemberUpdate(site="snellius", state=MemberState.LEFT, incarnation=9, meta=None, from_site="snellius"),
)

CASES = [
    (Ping(seq=7, from_site="lumi", from_address="h:1", target_site="frontier", updates=UPDATES), membership_pb2.Ping),
    (Ack(seq=7, from_site="frontier", updates=UPDATES[:1]), membership_pb2.Ack),
    (PingReq(seq=2, from_site="a", from_address="h:1", target_site="b", target_address="h:2"), membership_pb2.PingReq),
    (Nack(seq=2, from_site="c"), membership_pb2.Nack),
    (PushPull(from_site="a", from_address="h:1", members=UPDATES, join=True, reply=False), membership_pb2.PushPull),
]


@pytest.mark.parametrize(("msg", "proto_cls"), CASES, ids=[type(c[0]).__name__ for c in CASES])
def test_round_trip_through_bytes(msg: object, proto_cls: type) -> None:
    wire = to_proto(msg, proto_cls).SerializeToString()
    back = from_proto(proto_cls.FromString(wire), type(msg))
    assert back == msg


def test_enum_maps_by_name() -> None:
    proto = to_proto(UPDATES[1], membership_pb2.MemberUpdate)
    assert proto.state == membership_pb2.MEMBER_STATE_SUSPECT


def test_unspecified_state_is_refused() -> None:
    proto = membership_pb2.MemberUpdate(site="x", incarnation=1)  # state left at 0 = UNSPECIFIED
    with pytest.raises(WireError, match="enum value 0 is not one of ALIVE, SUSPECT, DEAD, LEFT"):
        from_proto(proto, MemberUpdate)


def test_unknown_enum_number_is_refused() -> None:
    proto = membership_pb2.MemberUpdate(site="x", incarnation=1)
    proto.state = 42  # an enum value from a newer peer
    with pytest.raises(WireError, match="enum value 42"):
        from_proto(proto, MemberUpdate)


def test_absent_meta_stays_none() -> None:
    back = from_proto(membership_pb2.MemberUpdate(site="x", state=membership_pb2.MEMBER_STATE_DEAD), MemberUpdate)
    assert back.meta is None
    assert back.state is MemberState.DEAD


def test_consensus_entries_oneof_and_voter_tuples_round_trip() -> None:
    from peer.core.commitlog import AppendEntries, Contributor, Entry, EpochStart, RoundCommit, SampleRange, VoterChange
    from peer.core.election import Epoch, Header, SiteId
    from peer.gen.sitemesh.v1 import consensus_pb2

    entries = (
        Entry(1, Epoch(1), EpochStart(SiteId("a"))),
        Entry(2, Epoch(1), VoterChange(SiteId("b"), "h:2", True, "joined")),
        Entry(3, Epoch(2), RoundCommit(1, (Contributor(SiteId("a"), 10, (SampleRange(5, 0, 3),), b"\x01" * 32),),
                                       b"\x02" * 32)),
    )
    msg = AppendEntries(Header(SiteId("a"), "h:1", Epoch(3), 2), 0, Epoch(0), entries, 2, 7)
    proto = to_proto(msg, consensus_pb2.AppendEntries)
    assert [e.WhichOneof("body") for e in proto.entries] == ["epoch_start", "voter_change", "round_commit"]
    assert from_proto(consensus_pb2.AppendEntries.FromString(proto.SerializeToString()), AppendEntries) == msg


def test_missing_oneof_is_refused() -> None:
    from peer.core.commitlog import Entry
    from peer.gen.sitemesh.v1 import consensus_pb2

    with pytest.raises(WireError, match="LogEntry.body is not set"):
        from_proto(consensus_pb2.LogEntry(index=1, epoch=1), Entry)
