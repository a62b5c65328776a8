"""Hostile values stop at the decode edge (peer/transport/wire.py), before any core sees them."""

from __future__ import annotations

import pytest

from peer.core import commitlog
from peer.core import membership as m
from peer.gen.sitemesh.v1 import common_pb2, consensus_pb2, membership_pb2
from peer.transport.wire import MAX_COUNTER, MAX_MEMBERS, MAX_STRING, WireError, from_proto


def _append(epoch: int) -> consensus_pb2.AppendEntries:
    return consensus_pb2.AppendEntries(header=consensus_pb2.ConsensusHeader(
        from_site="a", from_address="h:1", epoch=epoch), prev_index=0, commit_index=0)


def test_a_counter_that_could_not_be_incremented_is_refused() -> None:
    assert from_proto(_append(MAX_COUNTER), commitlog.AppendEntries).header.epoch == MAX_COUNTER
    with pytest.raises(WireError, match=r"ConsensusHeader.epoch = 18446744073709551615 is beyond 2\^62"):
        from_proto(_append(2**64 - 1), commitlog.AppendEntries)


def test_a_left_rumour_at_the_top_incarnation_is_refused() -> None:
    msg = membership_pb2.PushPull(from_site="c", from_address="h:3", members=[membership_pb2.MemberUpdate(
        site="b", state=membership_pb2.MEMBER_STATE_LEFT, incarnation=2**64 - 1, from_site="c")])
    with pytest.raises(WireError, match="MemberUpdate.incarnation"):
        from_proto(msg, m.PushPull)


def test_at_most_max_members_in_one_message() -> None:
    def push_pull(n: int) -> membership_pb2.PushPull:
        return membership_pb2.PushPull(from_site="c", from_address="h:3", members=[membership_pb2.MemberUpdate(
            site=f"fake{i}", state=membership_pb2.MEMBER_STATE_ALIVE, from_site=f"fake{i}") for i in range(n)])

    assert len(from_proto(push_pull(MAX_MEMBERS), m.PushPull).members) == MAX_MEMBERS
    with pytest.raises(WireError, match="2000 items, at most 256"):
        from_proto(push_pull(2000), m.PushPull)


def test_long_strings_and_non_finite_floats_are_refused() -> None:
    with pytest.raises(WireError, match=f"at most {MAX_STRING}"):
        from_proto(membership_pb2.Nack(seq=1, from_site="x" * (MAX_STRING + 1)), m.Nack)
    meta = common_pb2.MemberMeta(site="a", address="h:1", tokens_per_s=float("nan"))
    with pytest.raises(WireError, match="not a finite number"):
        from_proto(membership_pb2.PushPull(from_site="a", from_address="h:1", members=[
            membership_pb2.MemberUpdate(site="a", state=membership_pb2.MEMBER_STATE_ALIVE, meta=meta)]),
            m.PushPull)
    labels = common_pb2.MemberMeta(site="a", address="h:1", labels={"k": "v" * (MAX_STRING + 1)})
    with pytest.raises(WireError, match="value is"):
        from_proto(labels, m.MemberMeta)


def test_a_forged_snapshot_with_too_many_voters_is_refused() -> None:
    snap = consensus_pb2.Snapshot(last_index=1, voters=[consensus_pb2.Voter(site=f"s{i}", address="h:1")
                                                        for i in range(MAX_MEMBERS + 1)])
    msg = consensus_pb2.InstallSnapshot(header=consensus_pb2.ConsensusHeader(from_site="a", from_address="h:1",
                                                                             epoch=1), snapshot=snap)
    with pytest.raises(WireError, match="items, at most"):
        from_proto(msg, commitlog.InstallSnapshot)


def test_identifiers_may_use_all_64_bits() -> None:
    """Block ids are 64-bit hashes: only counters are bounded (a real demo run found this)."""
    from peer.core import lease_types as lt
    from peer.gen.sitemesh.v1 import leases_pb2

    msg = leases_pb2.Release(header=leases_pb2.LeaseHeader(site="a"),
                             leases=[leases_pb2.LeaseRef(block_id=8590897764185931777, generation=12884901932)])
    assert from_proto(msg, lt.Release).leases[0].block_id == 8590897764185931777
