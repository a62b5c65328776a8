"""Membership's verdicts reach the consensus core through one call (`member_changed`): the node only
forwards what membership says, and the core decides what a verdict means for the voters.

    .venv/bin/python -m pytest -q tests/unit/test_consensus_membership.py
"""

from __future__ import annotations

import pytest

from peer.core.election import SiteId
from peer.core.membership_types import MemberState
from peer.core.voter_set import replication_targets
from peer.sim.consensus_cluster import SIM_CONFIG
from peer.sim.lockstep import Lockstep


def _leader_core(net: Lockstep | None = None) -> tuple[Lockstep, SiteId]:
    net = net or Lockstep(3)
    assert net.run_until(lambda: net.leader() is not None, timeout=3 * SIM_CONFIG.election_timeout_max_s + 1)
    leader = net.leader()
    assert leader is not None
    return net, leader


def test_each_verdict_is_what_the_core_records_and_suspect_changes_nothing() -> None:
    net, leader = _leader_core()
    core = net.cluster.core(leader)
    other = next(s for s in net.cluster.live() if s != leader)
    core.member_changed(other, MemberState.SUSPECT, "elsewhere:1")
    assert other not in core.members or core.members[other].state is not MemberState.SUSPECT
    for state in (MemberState.DEAD, MemberState.LEFT, MemberState.ALIVE):
        core.member_changed(other, state, f"{other}:7000")
        assert core.members[other].state is state
    core.member_changed(other, MemberState.DEAD, "")
    core.member_changed(other, MemberState.ALIVE, "")
    assert core.members[other].state is MemberState.DEAD, "ALIVE without an address is ignored"


def test_a_dead_verdict_removes_the_voter() -> None:
    net, leader = _leader_core()
    core = net.cluster.core(leader)
    other = next(s for s in net.cluster.live() if s != leader)
    net.cluster.crash(other)  # it stops acking: the leader confirms the verdict before acting on it
    core.member_changed(other, MemberState.DEAD, "")
    net.run_until(lambda: other not in dict(core.log.voters()), timeout=10 * SIM_CONFIG.election_timeout_max_s)
    assert other not in dict(core.log.voters()), "the leader removed the dead voter"



@pytest.mark.parametrize("seed", range(12))
def test_a_leaving_voter_stands_back_so_a_staying_one_leads(seed: int) -> None:
    """A voter whose leave began (its rounds' half first) campaigns only after a staying voter
    could have: a leaving leader opens no round, so electing it would stall the run until its leave
    is done. Over seeds and choices of leaver, the next leader is a staying voter."""
    net, old = _leader_core(Lockstep(4, seed=seed))
    followers = [s for s in net.cluster.live() if s != old]
    leaver = followers[seed % len(followers)]
    net.cluster.core(leaver).stand_back(net.t)
    net.cluster.crash(old)
    assert net.run_until(lambda: net.leader() not in (None, old), timeout=5 * SIM_CONFIG.election_timeout_max_s)
    assert net.leader() != leaver, f"the leaving {leaver} was elected"


def test_when_every_voter_left_is_leaving_one_still_leads() -> None:
    """Standing back defers a candidacy, never forbids it."""
    net, old = _leader_core(Lockstep(3, seed=1))
    for s in net.cluster.live():
        net.cluster.core(s).stand_back(net.t)
    net.cluster.crash(old)
    assert net.run_until(lambda: net.leader() not in (None, old), timeout=8 * SIM_CONFIG.election_timeout_max_s)


def test_a_site_only_heard_of_as_left_is_not_dialled() -> None:
    """A joiner learns from gossip that a site it never saw alive left; with no address for it, the
    leader must not send it the log (an empty target once made gRPC log 'dns:///' errors)."""
    net, leader = _leader_core()
    core = net.cluster.core(leader)
    core.member_changed(SiteId("gone"), MemberState.LEFT, "")
    sends = core.tick(net.t + 1.0)
    assert sends and all(getattr(e, "address", "x") for e in sends), sends
    assert "gone" not in replication_targets(core)
