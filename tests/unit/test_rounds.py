"""The leader's round scheduling: disjoint grants of uncommitted samples, admission (I6), decisions."""

from __future__ import annotations

import pytest

from peer.commitlog import Contributor, RoundCommit, SampleRange
from peer.election import Epoch, Header, SiteId
from peer.rounds import Broadcast, Contribution, Decide, EpochComplete, Ledger, RoundLeader, RoundOpen, RoundsConfig

BLOCKS = [(10, 8), (11, 8), (12, 4)]  # 20 samples
CFG = RoundsConfig(inner_steps=2, samples_per_step=2, deadline_s=5.0)  # 4 samples per site per round
H = Header(SiteId("a"), "h:1", Epoch(3), 0)


def _open(leader: RoundLeader, sites: list[str], now: float = 0.0, committed: int = 0) -> RoundOpen:
    effects = leader.tick(now, H, committed, sites, b"base")
    assert len(effects) == 1 and isinstance(effects[0], Broadcast)
    return effects[0].msg


def _contribution(site: str, rnd: int, ranges: tuple[SampleRange, ...], tokens: int = 64) -> Contribution:
    return Contribution(H, rnd, site, f"{site}:1", tokens, ranges, b"\x01" * 32)


def _commit(decide: Decide) -> RoundCommit:
    return RoundCommit(decide.round, tuple(Contributor(SiteId(c.site), c.tokens, c.ranges, c.pseudo_gradient_root)
                                           for c in decide.admitted), b"w")


def test_grants_are_disjoint_sized_and_in_epoch_order() -> None:
    msg = _open(RoundLeader(CFG, Ledger(BLOCKS)), ["c", "a", "b"])
    assert msg.round == 1 and msg.inner_steps == 2 and msg.base_weights_hash == b"base"
    assert [g.site for g in msg.grants] == ["a", "b", "c"]
    assert msg.grants[0].ranges == (SampleRange(10, 0, 4),)
    assert msg.grants[1].ranges == (SampleRange(10, 4, 8),)
    assert msg.grants[2].ranges == (SampleRange(11, 0, 4),)


def test_grant_spans_blocks_when_one_is_short() -> None:
    ledger = Ledger([(1, 3), (2, 5)])
    msg = _open(RoundLeader(CFG, ledger), ["a"])
    assert msg.grants[0].ranges == (SampleRange(1, 0, 3), SampleRange(2, 0, 1))


def test_all_reported_decides_at_once_and_commit_frees_next_round() -> None:
    leader = RoundLeader(CFG, Ledger(BLOCKS))
    msg = _open(leader, ["a", "b"])
    assert leader.receive(_contribution("a", 1, msg.grants[0].ranges), 1.0) == []
    (decide,) = leader.receive(_contribution("b", 1, msg.grants[1].ranges), 1.0)
    assert isinstance(decide, Decide) and [c.site for c in decide.admitted] == ["a", "b"] and not decide.excluded
    assert leader.tick(2.0, H, 0, ["a", "b"], b"") == [], "no new round before the decision commits"
    leader.on_commit(_commit(decide))
    nxt = _open(leader, ["a", "b"], committed=1)
    assert nxt.round == 2
    assert nxt.grants[0].ranges == (SampleRange(11, 0, 4),), "committed samples are never granted again"


@pytest.mark.parametrize(("ranges", "why"), [
    ((SampleRange(11, 0, 4),), "outside its grant"),
    ((SampleRange(10, 0, 5),), "outside its grant"),
    ((SampleRange(99, 0, 1),), "outside its grant"),
])
def test_contribution_outside_grant_is_excluded_whole(ranges: tuple[SampleRange, ...], why: str) -> None:
    leader = RoundLeader(CFG, Ledger(BLOCKS))
    _open(leader, ["a"])
    assert leader.receive(_contribution("a", 1, ranges), 1.0) == []
    (decide,) = leader.tick(CFG.deadline_s + 1, H, 0, ["a"], b"")
    assert decide.admitted == ()
    assert len(decide.excluded) == 1
    assert why in dict(decide.excluded)["a"]


def test_ungranted_site_and_missing_site_are_excluded_with_reasons() -> None:
    leader = RoundLeader(CFG, Ledger(BLOCKS))
    msg = _open(leader, ["a", "b"])
    leader.receive(_contribution("zz", 1, msg.grants[0].ranges), 1.0)
    leader.receive(_contribution("a", 1, msg.grants[0].ranges[:1]), 1.0)
    assert leader.tick(CFG.deadline_s - 0.1, H, 0, ["a", "b"], b"") == []
    (decide,) = leader.tick(CFG.deadline_s, H, 0, ["a", "b"], b"")
    assert [c.site for c in decide.admitted] == ["a"]
    assert dict(decide.excluded) == {"zz": "excluded: zz holds no grant in round 1",
                                     "b": "excluded: b did not report (deadline passed or it left the mesh)"}


def test_missing_site_samples_are_granted_again() -> None:
    leader = RoundLeader(CFG, Ledger(BLOCKS))
    msg = _open(leader, ["a", "b"])
    leader.receive(_contribution("a", 1, msg.grants[0].ranges), 1.0)
    (decide,) = leader.tick(CFG.deadline_s, H, 0, ["a", "b"], b"")
    leader.on_commit(_commit(decide))
    again = _open(leader, ["a", "b"], now=10.0, committed=1)
    assert again.grants[0].ranges == msg.grants[1].ranges, "b's lost samples go to the next grantee"


def test_already_committed_samples_are_refused() -> None:
    ledger = Ledger(BLOCKS)
    leader = RoundLeader(CFG, ledger)
    msg = _open(leader, ["a"])
    ledger.commit([SampleRange(10, 2, 3)])  # e.g. a stale leader's commit landed meanwhile
    leader.receive(_contribution("a", 1, msg.grants[0].ranges), 1.0)
    (decide,) = leader.tick(CFG.deadline_s, H, 0, ["a"], b"")
    assert decide.admitted == ()
    assert "already committed" in dict(decide.excluded)["a"]


def test_stale_round_and_duplicates_change_nothing() -> None:
    leader = RoundLeader(CFG, Ledger(BLOCKS))
    msg = _open(leader, ["a", "b"])
    assert leader.receive(_contribution("a", 7, msg.grants[0].ranges), 1.0) == []
    leader.receive(_contribution("a", 1, msg.grants[0].ranges), 1.0)
    assert leader.receive(_contribution("a", 1, msg.grants[0].ranges), 1.0) == []
    (decide,) = leader.receive(_contribution("b", 1, msg.grants[1].ranges), 1.0)
    assert [c.site for c in decide.admitted] == ["a", "b"]


def test_epoch_completes_once_every_sample_is_committed_exactly_once() -> None:
    ledger = Ledger(BLOCKS)
    leader = RoundLeader(CFG, ledger)
    committed, seen = 0, []
    while True:
        effects = leader.tick(0.0, H, committed, ["a", "b", "c"], b"")
        if effects and isinstance(effects[0], EpochComplete):
            assert effects[0].samples == 20
            break
        (open_,) = effects
        for g in open_.msg.grants:
            out = leader.receive(_contribution(g.site, open_.msg.round, g.ranges), 0.0)
        (decide,) = out
        seen.extend(r for c in decide.admitted for r in c.ranges)
        leader.on_commit(_commit(decide))
        committed += 1
    samples = [(r.block_id, i) for r in seen for i in range(r.start, r.end)]
    assert len(samples) == len(set(samples)) == 20
    assert leader.tick(0.0, H, committed, ["a"], b"") == [], "reported once"


def test_step_down_abandons_the_open_round() -> None:
    leader = RoundLeader(CFG, Ledger(BLOCKS))
    msg = _open(leader, ["a"])
    leader.step_down()
    assert leader.receive(_contribution("a", 1, msg.grants[0].ranges), 1.0) == []
    assert _open(leader, ["a"]).grants[0].ranges == msg.grants[0].ranges


def test_grantee_gone_from_the_mesh_is_not_waited_for() -> None:
    leader = RoundLeader(CFG, Ledger(BLOCKS))
    msg = _open(leader, ["a", "b"])
    leader.receive(_contribution("a", 1, msg.grants[0].ranges), 1.0)
    assert leader.tick(1.0, H, 0, ["a", "b"], b"") == [], "b is live: wait for it"
    (decide,) = leader.tick(1.0, H, 0, ["a"], b"")  # b declared dead long before the deadline
    assert [c.site for c in decide.admitted] == ["a"]
    assert dict(decide.excluded)["b"].startswith("excluded: b did not report")
