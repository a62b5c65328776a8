"""Replication through the consensus core on a manual clock: commits applied once everywhere, catch-up
by entries and by snapshot, voter changes (join, graceful leave down to one voter, death), the last
voter rule and resuming from disk. Harness: peer.sim.lockstep.Lockstep."""

from __future__ import annotations

from peer.core.commitlog import Contributor, Round, RoundCommit, SampleRange, VoterChange
from peer.core.consensus_effects import Committed, SnapshotInstalled
from peer.core.election import Role, SiteId
from peer.sim.consensus_cluster import SIM_CONFIG
from peer.sim.lockstep import Lockstep

E_MAX = SIM_CONFIG.election_timeout_max_s


def _elect(net: Lockstep) -> SiteId:
    assert net.run_until(lambda: net.leader() is not None, timeout=4 * E_MAX)
    leader = net.leader()
    assert leader is not None
    return leader


def _commit_rounds(net: Lockstep, n: int) -> SiteId:
    """Drive n rounds (no training: empty contributions) through whoever leads; returns the leader."""
    for _ in range(n):
        leader = _elect(net)
        assert net.run_until(lambda: net.cluster.core(leader).not_ready(net.t) is None, timeout=1.0)  # noqa: B023
        d = net.propose(leader)
        assert d.accepted, d.reason
        target = d.index
        assert net.run_until(lambda: net.cluster.core(leader).commit_index >= target, timeout=1.0)  # noqa: B023
    return _elect(net)


def _round(net: Lockstep, site: SiteId) -> int:
    return net.cluster.core(site).status().committed_round


def test_a_round_commits_once_on_every_peer_with_its_contributors() -> None:
    net = Lockstep(3)
    leader = _elect(net)
    contrib = (Contributor(SiteId("s00"), 4096, (SampleRange(12, 0, 8),), b"root"),)
    d = net.propose(leader, contrib)
    assert d.accepted
    net.run_for(0.1)
    for site in net.cluster.live():
        entry = net.cluster.committed[d.index]  # type: ignore[index]
        assert net.cluster.apps[site].index >= entry.index
        assert _round(net, site) == 1
    assert net.cluster.rounds[1].body == RoundCommit(Round(1), contrib, b"w1")


def test_proposals_are_refused_with_a_reason() -> None:
    net = Lockstep(3)
    leader = _elect(net)
    follower = next(s for s in net.cluster.live() if s != leader)
    assert f"leader is {leader}" in net.propose(follower).reason
    core = net.cluster.core(leader)
    d = core.propose_round(RoundCommit(Round(5), (), b"w"), net.t)
    assert not d.accepted and "not the next round 1" in d.reason
    assert net.propose(leader).accepted
    # Round 2 waits for round 1 to commit: each round starts from the committed θ of the last.
    d2 = core.propose_round(RoundCommit(Round(2), (), b"w"), net.t)
    assert not d2.accepted and "round 1 is not committed yet" in d2.reason


def test_crashed_follower_catches_up_from_the_log_on_restart() -> None:
    net = Lockstep(3)
    leader = _elect(net)
    lagger = next(s for s in net.cluster.live() if s != leader)
    net.cluster.crash(lagger)
    leader = _commit_rounds(net, 40)  # more than one AppendEntries batch (16 in SIM_CONFIG)
    net.cluster.start(lagger, net.t)
    assert net.run_until(lambda: _round(net, lagger) == 40, timeout=1.0)


def test_follower_behind_a_compacted_log_gets_a_snapshot() -> None:
    net = Lockstep(3)
    leader = _elect(net)
    lagger = next(s for s in net.cluster.live() if s != leader)
    net.cluster.crash(lagger)
    leader = _commit_rounds(net, 10)
    net.cluster.compact_all(every=1)
    assert net.cluster.core(leader).log.snapshot.last_round == 10
    net.run_for(0.01)  # heartbeats built before the compaction are lost on the down peer
    net.cluster.start(lagger, net.t)
    seen: list[object] = []
    original = net.cluster.execute

    def spy(site: SiteId, effects: list[object]) -> list[object]:
        seen.extend(e for e in effects if isinstance(e, SnapshotInstalled) and site == lagger)
        return original(site, effects)  # type: ignore[arg-type]

    net.cluster.execute = spy  # type: ignore[method-assign,assignment]
    assert net.run_until(lambda: _round(net, lagger) == 10, timeout=1.0)
    assert seen, "the lagging follower should have been sent a snapshot"
    # And it keeps up with rounds after the snapshot.
    _commit_rounds(net, 2)
    assert net.run_until(lambda: _round(net, lagger) == 12, timeout=0.5)


def test_graceful_leaves_shrink_the_voter_set_until_one_site_commits_alone() -> None:
    net = Lockstep(3)
    _commit_rounds(net, 2)
    for leaving in ["s00", "s01"]:
        decision = net.cluster.core(leaving).leave(net.t)
        assert decision.accepted, decision.reason
        net.do(leaving, decision.effects)
        for s in net.cluster.live():
            if s != leaving:
                net.cluster.core(s).member_left(SiteId(leaving))
        # It learns from its own log that its removal committed, then exits (what `ops leave` waits for).
        me = net.cluster.core(SiteId(leaving))
        assert net.run_until(lambda: SiteId(leaving) not in dict(me.log.voters_at(me.commit_index)),  # noqa: B023
                             timeout=4 * E_MAX), f"{leaving} was not removed"
        net.cluster.crash(SiteId(leaving))  # it exits once its removal is committed
    assert net.cluster.core(SiteId("s02")).status().voters == (("s02", "s02:7000"),)
    leader = _commit_rounds(net, 3)
    assert leader == "s02" and _round(net, leader) == 5
    # The last voter's own leave is refused: it stays so that the run resumes from its disk.
    last = net.cluster.core(leader).leave(net.t)
    assert not last.accepted and "last voter" in last.reason
    net.run_for(1.0)
    assert net.cluster.core(leader).status().voters == (("s02", "s02:7000"),)


def test_leader_that_leaves_removes_itself_then_steps_down() -> None:
    net = Lockstep(3)
    leader = _commit_rounds(net, 1)
    d = net.cluster.core(leader).leave(net.t)
    assert d.accepted
    net.do(leader, d.effects)
    assert net.run_until(lambda: net.cluster.core(leader).role is Role.FOLLOWER, timeout=1.0)
    assert not net.cluster.core(leader).is_voter()
    net.cluster.crash(leader)
    new = _commit_rounds(net, 1)
    assert new != leader and _round(net, new) == 2


def test_joiner_is_added_as_voter_after_catching_up() -> None:
    net = Lockstep(3)
    leader = _commit_rounds(net, 3)
    net.cluster.start(SiteId("s03"), net.t)
    for s in net.cluster.live():
        if s != "s03":
            net.cluster.core(s).member_alive(SiteId("s03"), "s03:7000")
    joined = VoterChange(SiteId("s03"), "s03:7000", True, "join")
    assert net.run_until(lambda: any(e.body == joined for e in net.cluster.committed.values()), timeout=1.0)
    assert net.cluster.core(SiteId("s03")).is_voter()
    assert _round(net, SiteId("s03")) == 3
    assert net.leader() == leader


def test_dead_voter_is_removed_only_after_the_leader_also_heard_nothing() -> None:
    net = Lockstep(3)
    leader = _commit_rounds(net, 1)
    victim = next(s for s in net.cluster.live() if s != leader)
    net.cluster.core(leader).member_dead(victim)  # membership's verdict, while it still answers
    net.run_for(2 * E_MAX)
    assert victim in dict(net.cluster.core(leader).log.voters())
    net.cluster.crash(victim)
    assert net.run_until(lambda: victim not in dict(net.cluster.core(leader).log.voters()), timeout=3 * E_MAX)
    change = net.cluster.core(leader).log.entries[-1].body
    assert isinstance(change, VoterChange) and not change.add and change.reason.startswith("dead")


def test_all_stopped_then_one_restarted_resumes_from_its_disk() -> None:
    net = Lockstep(3)
    _commit_rounds(net, 4)
    for s in net.cluster.live():
        net.cluster.crash(s)
    net.run_for(1.0)
    for s in net.cluster.cores:
        net.cluster.start(s, net.t)
        # Each resumes at what it applied; followers may not have heard of the last commit yet.
        assert net.cluster.core(s).status().applied_index == net.cluster.apps[s].index
    assert max(_round(net, s) for s in net.cluster.cores) == 4
    leader = _commit_rounds(net, 1)
    assert _round(net, leader) == 5
    applied: list[int] = []
    for entry in net.cluster.committed.values():
        if isinstance(entry.body, RoundCommit):
            applied.append(entry.body.round)
    assert applied == [1, 2, 3, 4, 5]


def test_sole_voter_restarts_alone_and_keeps_committing() -> None:
    net = Lockstep(1)
    _commit_rounds(net, 3)
    net.cluster.crash(SiteId("s00"))
    net.cluster.start(SiteId("s00"), net.t)
    leader = _commit_rounds(net, 1)
    assert leader == "s00" and _round(net, leader) == 4


def test_committed_effects_come_once_in_index_order() -> None:
    net = Lockstep(3)
    leader = _elect(net)
    seen: list[int] = []
    original = net.cluster.execute

    def spy(site: SiteId, effects: list[object]) -> list[object]:
        if site == leader:
            seen.extend(e.entry.index for e in effects if isinstance(e, Committed))
        return original(site, effects)  # type: ignore[arg-type]

    net.cluster.execute = spy  # type: ignore[method-assign,assignment]
    _commit_rounds(net, 5)
    assert seen == list(range(seen[0], seen[0] + len(seen))) and len(seen) >= 5


def test_dead_voter_is_removed_before_a_leaver_so_the_rest_keeps_a_majority() -> None:
    # {A, B, C}: C crashes for good, B leaves. Removing B first would leave {A, C}, where A alone is
    # no majority; the leader waits for C's death to be confirmed and removes C first.
    net = Lockstep(3)
    leader = _commit_rounds(net, 1)
    leaver, dead = sorted(s for s in net.cluster.live() if s != leader)
    net.cluster.crash(dead)
    for s in (leader, leaver):
        net.cluster.core(s).member_dead(dead)
        net.cluster.core(s).member_left(leaver)
    assert net.run_until(lambda: net.cluster.core(leader).status().voters == ((leader, f"{leader}:7000"),),
                         timeout=4 * E_MAX)
    removed = [e.body.site for e in net.cluster.committed.values()
               if isinstance(e.body, VoterChange) and not e.body.add]
    assert removed == [dead, leaver]
    assert _commit_rounds(net, 1) == leader


def test_a_leaving_follower_learns_that_its_removal_committed() -> None:
    net = Lockstep(3)
    leader = _commit_rounds(net, 1)
    leaver = next(s for s in net.cluster.live() if s != leader)
    net.do(leaver, net.cluster.core(leaver).leave(net.t).effects)
    for s in net.cluster.live():
        if s != leaver:
            net.cluster.core(s).member_left(leaver)
    lead = net.cluster.core(leader)
    assert net.run_until(lambda: leaver not in dict(lead.log.voters_at(lead.commit_index)), timeout=2 * E_MAX)
    me = net.cluster.core(leaver)
    assert net.run_until(lambda: leaver not in dict(me.log.voters_at(me.commit_index)), timeout=E_MAX)
