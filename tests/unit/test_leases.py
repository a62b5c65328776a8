"""Lease owner core: quorum writes, start/steal ordering, renewal, expiry, fencing, claims, epochs."""

from __future__ import annotations

from peer.core.commitlog import SampleRange
from peer.core.election import SiteId
from peer.core.lease_types import (
    BlockId,
    Claim,
    EventKind,
    Gen,
    Grant,
    GrantReply,
    GrantRequest,
    LeaseHeader,
    LeaseRef,
    LeaseState,
    Rejected,
    Renew,
    RenewReply,
    Start,
    StartReply,
    Trained,
    TrainedReply,
    spans,
)
from peer.core.ring import RingView
from tests.unit.test_leases_mesh import CFG, Mesh

B = BlockId(100)


def hdr(m: Mesh, site: str, **kw: int) -> LeaseHeader:
    base = {"leader_epoch": 1, "ring_version": m.views[-1].version, "data_epoch": 0}
    base.update(kw)
    return LeaseHeader(SiteId(site), base["leader_epoch"], base["ring_version"], base["data_epoch"],  # type: ignore[arg-type]
                       pace=m.paces.get(site, 0.0))


def replies(m: Mesh, to: str, kind: type) -> list:
    return [msg for dest, msg in m.delivered if dest == to and isinstance(msg, kind)]


def holder_site(m: Mesh) -> tuple[str, str]:
    """(primary of block B, another site) in a 3-site mesh."""
    p = m.primary_of(B)
    return p, next(s for s in "abc" if s != p)


def third_site(owner: str, holder: str) -> str:
    """The site of the 3-site mesh that is neither `owner` nor `holder`."""
    return next(s for s in "abc" if s not in (owner, holder))


def grant(m: Mesh, site: str, owner: str, steal: bool = False, want: int = 1, req: int = 1) -> GrantReply:
    m.send(site, GrantRequest(hdr(m, site), req, want, steal), owner)
    m.run()
    return replies(m, site, GrantReply)[-1]


def rec(m: Mesh, owner: str, block: BlockId = B):
    return m.owners[SiteId(owner)].records[block]


def test_grant_is_answered_only_after_a_majority_of_owners_holds_it() -> None:
    m = Mesh("abcde", universe={100: 8})
    m.set_view("abcde")
    m.run()
    owner, *replicas = m.views[-1].owners(B)
    x = next(s for s in "abcde" if s not in m.views[-1].owners(B))
    m.cut = set(replicas)
    m.send(x, GrantRequest(hdr(m, x), 1, 1, False), owner)
    m.run()
    assert not replies(m, x, GrantReply), "the primary alone is not a majority of 3"
    assert rec(m, owner).holder == x
    m.cut = {replicas[0]}
    m.tick(CFG.retry_after, sites=[owner])  # the primary resends the unacknowledged write
    got = replies(m, x, GrantReply)
    assert got and [g.block_id for g in got[-1].grants] == [B], "primary + one replica is a majority"
    assert rec(m, replicas[1]).holder == x and rec(m, replicas[0]).holder is None


def test_a_retried_grant_request_returns_the_same_leases() -> None:
    m = Mesh("abc")
    m.set_view("abc")
    m.run()
    owner, x = holder_site(m)
    first = grant(m, x, owner, want=2, req=1)
    again = grant(m, x, owner, want=2, req=2)
    assert [g.block_id for g in again.grants] == [g.block_id for g in first.grants]
    assert [g.generation for g in again.grants] == [g.generation for g in first.grants]
    assert sum(1 for e in m.events if e.kind is EventKind.GRANT) == 2


def test_steal_takes_only_leased_not_started_blocks_and_the_victim_learns_at_renewal() -> None:
    view = RingView.of(1, "abc")
    owner, blocks = next((o, bs) for o in "abc" for n in range(3, 12)
                         if 2 <= len(bs := [b for b in range(100, 100 + n) if view.primary(b) == o]) <= 3)
    m = Mesh("abc", universe={b: 8 for b in blocks})
    m.set_view("abc")
    m.run()
    victim, thief = [s for s in "abc" if s != owner][:2]
    g = grant(m, victim, owner, want=3).grants
    assert g
    started = g[0]
    m.send(victim, Start(hdr(m, victim), LeaseRef(started.block_id, started.generation)), owner)
    m.run()
    assert replies(m, victim, StartReply)[-1].ok
    nothing = grant(m, thief, owner, steal=False)
    assert not nothing.grants and nothing.free_blocks == 0
    stolen = grant(m, thief, owner, steal=True, req=2).grants
    assert stolen
    assert started.block_id not in [s.block_id for s in stolen], "a started block is never stolen"
    assert [s.block_id for s in stolen] == [x.block_id for x in g[1:]][: len(stolen)]
    for s in stolen:
        old = next(x for x in g if x.block_id == s.block_id)
        assert s.generation > old.generation
        m.send(victim, Renew(hdr(m, victim), (LeaseRef(s.block_id, old.generation),), 0.0), owner)
        m.run()
        lost = replies(m, victim, RenewReply)[-1].lost
        assert lost and "stale: generation" in lost[0].reason and f"held by {thief}" in lost[0].reason
        m.send(victim, Start(hdr(m, victim), LeaseRef(s.block_id, old.generation)), owner)
        m.run()
        assert not replies(m, victim, StartReply)[-1].ok
    assert any(e.kind is EventKind.STEAL for e in m.events)


def started_lease(m: Mesh) -> tuple[str, str, Grant]:
    """In the 3-site mesh `m`: (owner, holder, lease) of a block its primary granted to another
    site, which started it."""
    m.set_view("abc")
    m.run()
    owner, z = holder_site(m)
    g = grant(m, z, owner).grants[0]
    m.send(z, Start(hdr(m, z), LeaseRef(g.block_id, g.generation)), owner)
    m.run()
    return owner, z, g


def claim_under(m: Mesh, z: str, owner: str, g: Grant) -> TrainedReply:
    """`z` claims samples 0..4 of `g`'s block under `g`'s generation, for round 1; the owner's answer."""
    m.send(z, Trained(hdr(m, z), 1, (Claim(LeaseRef(g.block_id, g.generation), spans((0, 4)), True),)), owner)
    m.run()
    return replies(m, z, TrainedReply)[-1]


def test_expired_lease_is_reclaimed_and_the_zombie_is_fenced() -> None:
    m = Mesh("abc")
    owner, z, g = started_lease(m)
    assert rec(m, owner, g.block_id).state is LeaseState.STARTED
    m.now += CFG.ttl - 0.1
    m.effects(SiteId(owner), m.owners[SiteId(owner)].tick(m.now))
    m.run()
    assert rec(m, owner, g.block_id).holder == z, "not before ttl"
    m.now += 0.2
    m.effects(SiteId(owner), m.owners[SiteId(owner)].tick(m.now))
    m.run()
    r = rec(m, owner, g.block_id)
    assert r.state is LeaseState.FREE and r.generation > g.generation
    assert [e.kind for e in m.events if e.block == g.block_id][-1] is EventKind.RECLAIM
    # the zombie wakes up and claims what it trained before the pause: refused, no voucher
    tr = claim_under(m, z, owner, g)
    assert not tr.vouched and f"stale: generation {g.generation} < {r.generation} for block {g.block_id}" in tr.refused[0].reason


def test_a_voter_change_that_keeps_the_primary_keeps_the_holders_deadline() -> None:
    # Jobs joining and leaving change the voter set every few seconds; were each change to restart
    # the ttl, a silent holder (paused, cut) would keep its blocks for as long as the churn lasts.
    b = BlockId(next(b for b in range(100, 200) if RingView.of(1, "abc").primary(b) == RingView.of(2, "abcd").primary(b)))
    m = Mesh("abcd", universe={b: 8})
    m.set_view("abc")
    m.run()
    owner = m.primary_of(b)
    z = next(s for s in "abc" if s != owner)
    g = grant(m, z, owner).grants[0]
    m.tick(CFG.ttl - 1.0, sites=[owner])
    m.set_view("abcd")
    m.run()
    assert rec(m, owner, b).holder == z
    m.tick(1.1, sites=[owner])
    r = rec(m, owner, b)  # (the owner's own idle client may have been granted it since)
    assert r.holder != z and r.generation > g.generation, "reclaimed a ttl after the holder's last word"
    assert [(e.kind, e.site) for e in m.events if e.block == b and e.kind is EventKind.RECLAIM] == [(EventKind.RECLAIM, z)]


def test_a_holder_removed_from_the_ring_loses_its_lease_at_once_and_its_claim_is_refused() -> None:
    m = Mesh("abc")
    owner, z, g = started_lease(m)
    m.set_view([s for s in "abc" if s != z])  # membership declared z dead: no renewal will come
    m.tick(0.0, sites=[owner])
    r = rec(m, owner, g.block_id)
    assert r.holder != z and r.generation > g.generation
    assert any(e.kind is EventKind.RECLAIM and e.site == z for e in m.events if e.block == g.block_id)
    # z was only cut off: it comes back and claims what it trained, under the old generation
    m.set_view("abc")
    m.run()
    tr = claim_under(m, z, owner, g)
    assert not tr.vouched and "stale: generation" in tr.refused[0].reason


def test_messages_with_stale_tokens_are_rejected_with_a_reason() -> None:
    m = Mesh("abc")
    m.set_view("abc")
    m.run()
    owner, x = holder_site(m)
    m.owners[SiteId(owner)].leader_epoch = 3
    cases = {
        "stale: leader epoch 1 < 3": hdr(m, x, leader_epoch=1),
        "ring version 7 != 1": hdr(m, x, leader_epoch=3, ring_version=7),
        "data epoch 2 != 0": hdr(m, x, leader_epoch=3, data_epoch=2),
    }
    for reason, h in cases.items():
        m.send(x, GrantRequest(h, 9, 1, False), owner)
        m.run()
        rej = replies(m, x, Rejected)[-1]
        assert rej.reason == reason and rej.req == 9
    assert not replies(m, x, GrantReply)


def test_claims_are_vouched_once_and_settled_by_the_commit() -> None:
    m = Mesh("abc")
    m.set_view("abc")
    m.run()
    owner, x = holder_site(m)
    y = third_site(owner, x)
    g = grant(m, x, owner).grants[0]
    ref = LeaseRef(g.block_id, g.generation)
    m.send(x, Trained(hdr(m, x), 1, (Claim(ref, spans((0, 3)), True),)), owner)
    m.run()
    assert not replies(m, x, TrainedReply)[-1].vouched, "never started"
    m.send(x, Start(hdr(m, x), ref), owner)
    m.send(x, Trained(hdr(m, x), 1, (Claim(ref, spans((0, 3)), True),)), owner)
    m.send(x, Trained(hdr(m, x), 1, (Claim(ref, spans((0, 3)), True),)), owner)  # a retry
    m.run()
    first, retry = replies(m, x, TrainedReply)[-2:]
    assert first.vouched == retry.vouched and [v.spans for v in first.vouched] == [spans((0, 3))]
    m.send(x, Trained(hdr(m, x), 2, (Claim(ref, spans((3, 8)), False),)), owner)  # done with it
    m.run()
    assert rec(m, owner, g.block_id).state is LeaseState.TRAINED_PENDING
    # another site cannot claim those samples
    m.send(y, Trained(hdr(m, y), 2, (Claim(LeaseRef(g.block_id, rec(m, owner, g.block_id).generation), spans((3, 5)), True),)), owner)
    m.run()
    assert not replies(m, y, TrainedReply)[-1].vouched
    # round 1 commits x's samples; round 2 excludes x: its samples go back to free
    m.commit(1, [(x, (SampleRange(g.block_id, 0, 3),))])
    assert rec(m, owner, g.block_id).done == spans((0, 3)) and rec(m, owner, g.block_id).state is LeaseState.TRAINED_PENDING
    m.commit(2, [])
    r = rec(m, owner, g.block_id)
    assert r.state is LeaseState.FREE and r.free_spans == spans((3, 8))
    again = grant(m, y, owner, want=3, req=5)
    assert any(gr.block_id == g.block_id and gr.spans == spans((3, 8)) for gr in again.grants)


def test_losing_the_primary_keeps_leases_via_the_replicas() -> None:
    m = Mesh("abcd")
    m.set_view("abcd")
    m.run()
    owner = m.primary_of(B)
    x = next(s for s in "abcd" if s != owner and s not in m.views[-1].owners(B))
    leases = grant(m, x, owner, want=3).grants
    target = leases[0]
    m.send(x, Start(hdr(m, x), LeaseRef(target.block_id, target.generation)), owner)
    m.run()
    old_owners = m.views[-1].owners(target.block_id)
    m.crash(owner)
    m.set_view([s for s in "abcd" if s != owner])
    m.run()
    new_primary = m.primary_of(target.block_id)
    assert new_primary == old_owners[1], "HRW: the first replica steps up"
    r = rec(m, new_primary, target.block_id)
    assert r.holder == x and r.generation == target.generation and r.started
    m.send(x, Renew(hdr(m, x), (LeaseRef(target.block_id, target.generation),), m.now), new_primary)
    m.run()
    assert replies(m, x, RenewReply)[-1].renewed == (LeaseRef(target.block_id, target.generation),)
    assert not any(e.kind is EventKind.REBUILD for e in m.events)


def test_losing_a_majority_of_owners_rebuilds_from_the_log() -> None:
    m = Mesh("abcde")
    m.set_view("abcde")
    m.run()
    owners = m.views[-1].owners(B)
    x = next(s for s in "abcde" if s not in owners)
    m.commit(1, [(x, (SampleRange(B, 0, 2),))])
    for o in owners[:2]:
        m.crash(o)
    m.set_view([s for s in "abcde" if s not in owners[:2]])
    m.run()
    p = m.primary_of(B)
    r = rec(m, p, B)
    assert r.done == spans((0, 2)) and r.holder is None and r.generation >= Gen(2 << 32)
    assert any(e.kind is EventKind.REBUILD and e.block == B for e in m.events)


def test_a_restarted_owner_does_not_count_toward_the_majority() -> None:
    m = Mesh("abc")
    m.set_view("abc")
    m.run()
    owner, x = holder_site(m)
    g = grant(m, x, owner, want=3).grants
    m.crash(owner)
    m.add(SiteId(owner), amnesiac=True)
    m.set_view("abc")  # its rejoin is a new view
    m.run()
    for gr in g:
        r = rec(m, owner, gr.block_id)
        assert r.holder == x and r.generation == gr.generation, "synced from the two replicas, not rebuilt"
    assert not any(e.kind is EventKind.REBUILD for e in m.events)


def test_a_completed_epoch_resets_every_record() -> None:
    m = Mesh("abc", universe={100: 4, 101: 4})
    m.set_view("abc")
    m.run()
    m.commit(1, [("a", (SampleRange(100, 0, 4),)), ("b", (SampleRange(101, 0, 4),))])
    for o in m.owners.values():
        assert o.epoch == 1
        assert all(r.state is LeaseState.FREE and r.data_epoch == 1 for r in o.records.values())


def test_every_message_round_trips_through_its_proto() -> None:
    """Field names match protos/sitemesh/v1/leases.proto, so peer/transport/wire.py converts them."""
    from peer.gen.sitemesh.v1 import leases_pb2
    from peer.core.lease_types import (
        BlockRev, Grant, LeaseRecord, PendingClaim, Refusal, Release, Replicate, ReplicateAck, SyncReply,
        SyncRequest, Voucher,
    )
    from peer.transport.wire import from_proto, to_proto

    h = LeaseHeader(SiteId("a"), 3, 7, 1)  # type: ignore[arg-type]
    ref = LeaseRef(B, Gen(5))
    rec_ = LeaseRecord(B, 8, 9, Gen(5), SiteId("b"), True, (PendingClaim(4, SiteId("b"), spans((0, 2))),),
                       spans((2, 3), (5, 6)), 1)  # type: ignore[arg-type]
    messages = [
        GrantRequest(h, 1, 2, True), GrantReply(h, 1, (Grant(B, Gen(5), spans((0, 8))),), 3, "granted"),
        Renew(h, (ref,), 1.5), RenewReply(h, (ref,), (Refusal(B, "stale"),), 1.5), Start(h, ref),
        StartReply(h, ref, True, "ok"), Trained(h, 4, (Claim(ref, spans((0, 2)), False),)),
        TrainedReply(h, 4, (Voucher(B, Gen(5), spans((0, 2))),), ()), Release(h, (ref,)),
        Replicate(h, (rec_, LeaseRecord(B, 8, 1, Gen(1)))), ReplicateAck(h, (BlockRev(B, 9),)),
        SyncRequest(h, (B,)), SyncReply(h, (rec_,), True), Rejected(h, 2, "ring version 7 != 8"),
    ]
    for msg in messages:
        proto = to_proto(msg, getattr(leases_pb2, type(msg).__name__))
        assert from_proto(proto, type(msg)) == msg, type(msg).__name__


def test_an_epoch_ending_while_a_block_syncs_leaves_it_served_and_fresh() -> None:
    universe = {b: 4 for b in range(100, 110)}
    joined = RingView.of(2, "abcd")
    block = next(b for b in universe if joined.primary(b) == "d")  # the newcomer's first block
    m = Mesh("abc", universe=universe)
    m.set_view("abc")
    m.run()
    m.add(SiteId("d"), amnesiac=True)
    m.cut = {SiteId(s) for s in "abc"}  # the sync answers do not arrive yet
    m.set_view("abcd")
    m.run()
    d = m.owners[SiteId("d")]
    assert block in d.syncing and block not in d.records
    m.cut = set()
    m.queue.clear()
    m.commit(1, [("x", tuple(SampleRange(b, 0, 4) for b in universe))])
    assert d.epoch == 1 and block in d.serving and d.records[block].state is LeaseState.FREE
    m.send("a", GrantRequest(hdr(m, "a", data_epoch=1), 1, 3, False), "d")
    m.run()
    assert block in [g.block_id for g in replies(m, "a", GrantReply)[-1].grants]


def test_a_primary_rebuilding_in_the_same_view_after_a_restart_never_repeats_a_generation() -> None:
    """A restarted primary may learn the very view it crashed in again (no voter change) and, short of
    previous owners, rebuild: its boot count keeps the new generations above the old ones."""
    m = Mesh("abc", universe={100: 8})
    view = m.set_view("abc")
    m.run()
    p, x = holder_site(m)
    g1 = grant(m, x, p).grants[0].generation
    m.crash(p)
    m.add(SiteId(p), amnesiac=True, boot=1)
    gone = RingView.of(0, [p, "y", "z"])  # its previous owners are no longer members: rebuild
    m.effects(SiteId(p), m.owners[SiteId(p)].set_view(view, 1, m.now, previous=gone))
    m.run()
    assert any(e.kind is EventKind.REBUILD and e.block == B for e in m.events)
    y = third_site(p, x)
    g2 = grant(m, y, p, req=2).grants[0].generation
    assert g2 > g1 and g2 >> 32 == g1 >> 32 == view.version


def test_a_newer_leader_epoch_in_any_message_is_adopted_and_fences_older_ones() -> None:
    m = Mesh("abc")
    m.set_view("abc")
    m.run()
    owner, x = holder_site(m)
    y = third_site(owner, x)
    grant(m, x, owner)  # leader epoch 1
    m.send(y, GrantRequest(hdr(m, y, leader_epoch=4), 1, 1, False), owner)
    m.run()
    assert m.owners[SiteId(owner)].leader_epoch == 4 and replies(m, y, GrantReply)
    m.send(x, GrantRequest(hdr(m, x), 2, 1, False), owner)
    m.run()
    assert replies(m, x, Rejected)[-1].reason == "stale: leader epoch 1 < 4"
    assert m.clients[SiteId(x)].leader_epoch == 4, "the refusal teaches the holder the new epoch"


def test_a_holder_that_lags_the_log_gets_no_lease_and_loses_its_renewals() -> None:
    m = Mesh("abc")
    m.set_view("abc")
    m.run()
    owner, x = holder_site(m)
    g = grant(m, x, owner).grants[0]
    for rnd in range(1, 6):  # the log moves on; x's header still says round 0
        m.ledgers[SiteId(owner)].apply(rnd, [])
    m.send(x, Renew(hdr(m, x), (LeaseRef(g.block_id, g.generation),), m.now), owner)
    m.send(x, GrantRequest(hdr(m, x), 7, 2, False), owner)
    m.run()
    lost = replies(m, x, RenewReply)[-1].lost
    assert [r.reason for r in lost] == ["holder lags the log: applied round 0 < 5 - 3"]
    assert replies(m, x, Rejected)[-1].reason == "holder lags the log: applied round 0 < 5 - 3"
    m.send(x, Renew(LeaseHeader(SiteId(x), 1, m.views[-1].version, 0, 2), (LeaseRef(g.block_id, g.generation),),  # type: ignore[arg-type]
                    m.now), owner)
    m.run()
    assert replies(m, x, RenewReply)[-1].renewed, "within the allowed lag"


def _started_by_a_slow_site() -> tuple[Mesh, str, str, str, LeaseRef]:
    """A one-block mesh whose block B the holder `slow` has started: (mesh, owner, slow, fast, lease)."""
    m = Mesh("abc", universe={100: 8})
    m.set_view("abc")
    m.run()
    owner, slow = holder_site(m)
    fast = third_site(owner, slow)
    m.paces.update({slow: 1.0, fast: 4.0})
    g = grant(m, slow, owner).grants[0]
    ref = LeaseRef(g.block_id, g.generation)
    m.send(slow, Start(hdr(m, slow), ref), owner)
    m.run()
    return m, owner, slow, fast, ref


def test_an_idle_site_that_finds_nothing_gets_the_rest_of_a_started_block_given_back() -> None:
    """The epoch's tail: every block is started by a slow holder, a fast site finds nothing free or
    stealable. The owner asks the holder (in its renew reply) to give back what it has not taken;
    the rest, freed by a claim without keep, is granted to the idle site alone until its
    reservation ends."""
    m, owner, slow, fast, ref = _started_by_a_slow_site()
    m.send(slow, Renew(hdr(m, slow), (ref,), 0.0), owner)
    m.run()
    assert replies(m, slow, RenewReply)[-1].wanted == (), "nobody asked yet"
    assert not grant(m, fast, owner, steal=True, req=2).grants, "a started block is never stolen"
    m.send(slow, Renew(hdr(m, slow), (ref,), 1.0), owner)
    m.run()
    assert replies(m, slow, RenewReply)[-1].wanted == (B,), "the holder is asked to give the rest back"
    m.send(slow, Trained(hdr(m, slow), 1, (Claim(ref, spans((0, 3)), False),)), owner)  # gives back 3..8
    m.run()
    assert rec(m, owner).state is LeaseState.FREE and rec(m, owner).free_spans == spans((3, 8))
    assert not grant(m, slow, owner, req=3).grants, "the freed rest is kept for the site that asked"
    got = grant(m, fast, owner, steal=True, req=4).grants
    assert [(x.block_id, x.spans) for x in got] == [(B, spans((3, 8)))]
    # Leased to the fast site and not started yet: stealable, but not while it is kept for it.
    assert not grant(m, slow, owner, steal=True, req=5).grants, "a given-back rest kept for one site is stolen"


def test_an_idle_site_not_clearly_faster_than_the_holder_does_not_get_its_block_given_back() -> None:
    """Giving a slow holder's rest to a site slower still (or barely faster) lengthens the tail."""
    m, owner, slow, fast, ref = _started_by_a_slow_site()
    m.paces[fast] = 1.4  # below give_back_faster (1.5) x the holder's 1.0
    assert not grant(m, fast, owner, steal=True, req=2).grants
    m.send(slow, Renew(hdr(m, slow), (ref,), 1.0), owner)
    m.run()
    assert replies(m, slow, RenewReply)[-1].wanted == ()


def test_a_reservation_for_an_idle_site_lapses_after_a_ttl() -> None:
    m, owner, slow, fast, ref = _started_by_a_slow_site()
    grant(m, fast, owner, steal=True, req=2)
    m.send(slow, Trained(hdr(m, slow), 1, (Claim(ref, spans((0, 3)), False),)), owner)
    m.run()
    m.tick(CFG.ttl + 0.1, sites=[])  # time passes, nobody acts
    assert [x.block_id for x in grant(m, slow, owner, req=3).grants] == [B], "the reservation lapsed"
