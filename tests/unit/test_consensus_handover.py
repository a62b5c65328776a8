"""A leaving leader hands its epoch over (Raft thesis 3.10): once its own removal commits it steps
down and sends `TimeoutNow`; every voter that follows it drops its lease, and the successor
campaigns at once. Only the leader a voter follows can void that lease.

    .venv/bin/python -m pytest -q tests/unit/test_consensus_handover.py
"""

from __future__ import annotations

import pytest

from peer.core.consensus_checks import RefusalKind
from peer.core.consensus_effects import Rejected, Send
from peer.core.election import Header, Role, SiteId, TimeoutNow
from peer.core.handover import successor
from peer.core.membership_types import MemberState
from peer.core.voter_set import MemberVerdict
from peer.sim.consensus_cluster import SIM_CONFIG
from peer.sim.lockstep import Lockstep

E_MIN = SIM_CONFIG.election_timeout_min_s


def _led(net: Lockstep) -> SiteId:
    assert net.run_until(lambda: net.leader() is not None, timeout=4 * SIM_CONFIG.election_timeout_max_s)
    leader = net.leader()
    assert leader is not None
    net.run_for(0.1)  # a few heartbeats: every follower acked and holds the whole log
    return leader


def _leave(net: Lockstep, leader: SiteId) -> float:
    """The leader leaves; returns when its removal committed and it stepped down."""
    core = net.cluster.core(leader)
    answer = core.leave(net.t)
    assert answer.accepted, answer.reason
    net.do(leader, answer.effects)
    assert net.run_until(lambda: core.role is not Role.LEADER, timeout=1.0)
    return net.t


@pytest.mark.parametrize("seed", range(6))
def test_the_successor_leads_within_a_few_message_delays_of_the_step_down(seed: int) -> None:
    """Without the hand-over a staying voter campaigns only once its lease for the leaver ran out
    (at least the minimum election timeout after the last heartbeat), then needs a pre-vote. Here
    the leader's removal commits before its next tick: it hands over at that commit."""
    net = Lockstep(5, seed=seed)
    old = _led(net)
    stepped_down = _leave(net, old)
    assert not net.cluster.core(old).is_voter()
    net.cluster.crash(old)  # it exits once its removal committed
    assert net.run_until(lambda: net.leader() not in (None, old), timeout=2 * SIM_CONFIG.election_timeout_max_s)
    took = net.t - stepped_down
    assert took < E_MIN / 10, f"the next leader took {took:.3f}s after the step-down"


@pytest.mark.parametrize("seed", range(4))
def test_a_leader_whose_leave_begins_hands_over_at_once_and_stays_a_voter(seed: int) -> None:
    """The leave begins with the rounds' half (the site's last rounds commit first); a leader that
    stays in charge meanwhile opens no round. It hands over at its next tick instead, still a voter,
    and the heir leads within a few message delays."""
    net = Lockstep(5, seed=seed)
    old = _led(net)
    core = net.cluster.core(old)
    core.stand_back(net.t)
    assert net.run_until(lambda: core.role is not Role.LEADER, timeout=SIM_CONFIG.heartbeat_interval_s + 0.01)
    stepped_down = net.t
    assert core.is_voter()
    assert net.run_until(lambda: net.leader() not in (None, old), timeout=E_MIN)
    assert net.t - stepped_down < E_MIN / 10
    net.run_for(SIM_CONFIG.election_timeout_max_s)
    assert net.leader() not in (None, old), "the old leader stands back: it does not win the epoch back"


@pytest.mark.parametrize("leaver_index", range(3))
def test_a_leaving_voter_is_never_the_successor(leaver_index: int) -> None:
    """A leaving leader opens no round: handing the epoch to another leaver stalls the run again."""
    net = Lockstep(4, seed=leaver_index)
    old = _led(net)
    followers = sorted(s for s in net.cluster.live() if s != old)
    leaver = followers[leaver_index]
    net.cluster.core(old).leaving_members = frozenset({leaver})
    net.cluster.core(leaver).stand_back(net.t)
    _leave(net, old)
    net.cluster.crash(old)
    assert net.run_until(lambda: net.leader() not in (None, old), timeout=0.05), "nobody took over at once"
    assert net.leader() != leaver


def test_a_timeout_now_from_a_site_this_peer_does_not_follow_changes_nothing() -> None:
    """A voter that is not the leader (a forgery, or an old leader's late message) cannot void the
    lease that protects the real leader, nor make anyone campaign."""
    net = Lockstep(3)
    leader = _led(net)
    other, target = sorted(s for s in net.cluster.live() if s != leader)
    core = net.cluster.core(target)
    epoch, sticky_until = core.hard.epoch, core.sticky_until
    forged = TimeoutNow(Header(other, f"{other}:7000", epoch, 0), target)
    effects = core.receive(forged, net.t)
    assert [type(e) for e in effects] == [Rejected], effects
    refusal = effects[0]
    assert isinstance(refusal, Rejected) and refusal.kind is RefusalKind.IMPLAUSIBLE, refusal
    assert f"{leader} does" in refusal.reason
    assert core.role is Role.FOLLOWER and core.hard.epoch == epoch and core.sticky_until == sticky_until
    net.run_for(0.2)
    assert net.leader() == leader


def test_the_leavers_late_heartbeat_renews_no_lease() -> None:
    """Messages may overtake each other: the leaver's last heartbeat (it carries the commit index of
    its removal) can arrive after its TimeoutNow, and must not make the voter refuse the heir."""
    net = Lockstep(3)
    leader = _led(net)
    lead = net.cluster.core(leader)
    heir, voter = sorted(s for s in net.cluster.live() if s != leader)
    core = net.cluster.core(voter)
    heartbeat = [e for e in lead.tick(net.t + SIM_CONFIG.heartbeat_interval_s)
                 if isinstance(e, Send) and e.to == voter][0].msg
    core.receive(TimeoutNow(lead._header(), heir), net.t)
    assert core._sticky() is None, "the hand-over voids the lease"
    core.receive(heartbeat, net.t)
    assert core._sticky() is None, "a late heartbeat of the epoch handed over renewed the lease"


def _verdict(state: MemberState = MemberState.ALIVE) -> MemberVerdict:
    return MemberVerdict("x:1", state)


def test_the_successor_holds_the_whole_log_was_heard_lately_and_stays() -> None:
    s = [SiteId(n) for n in ("a", "b", "c", "d", "e")]
    members = {s[0]: _verdict(), s[1]: _verdict(MemberState.DEAD), s[2]: _verdict(), s[3]: _verdict()}
    match = {s[0]: 9, s[1]: 10, s[2]: 10, s[3]: 10, s[4]: 10}
    acks = {s[0]: 5.0, s[1]: 5.0, s[2]: 4.0, s[3]: 5.0, s[4]: 1.0}
    # a is behind, b is dead, d is leaving, e was not heard since 3.0: c.
    assert successor(s, match, 10, members, {s[3]}, acks, heard_after=3.0) == s[2]
    # Nobody fit: the timers elect one, as without a hand-over.
    assert successor(s, match, 10, members, {s[2], s[3]}, acks, heard_after=3.0) is None
    # Among the fit ones the most recently heard.
    assert successor(s, match, 10, members, set(), acks, heard_after=3.0) == s[3]


def test_the_successor_is_the_voter_likely_to_stay_longest() -> None:
    """A site's own peer has no wall time; of a site's jobs the newest ends last. Most recently heard
    decides only between equals."""
    names = [SiteId(n) for n in ("a", "b.j3", "b.j4", "c.j7")]
    members = {v: _verdict() for v in names}
    match = {v: 10 for v in names}
    acks = {SiteId("a"): 4.0, SiteId("b.j3"): 6.0, SiteId("b.j4"): 5.0, SiteId("c.j7"): 5.5}
    assert successor(names, match, 10, members, set(), acks, heard_after=3.0) == "a"
    jobs = names[1:]
    # b.j3 was heard last, but b.j4 follows it; c.j7 is its site's newest and heard after b.j4.
    assert successor(jobs, match, 10, members, set(), acks, heard_after=3.0) == "c.j7"
    assert successor(jobs[:2], match, 10, members, set(), acks, heard_after=3.0) == "b.j4"
