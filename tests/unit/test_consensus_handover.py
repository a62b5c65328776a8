"""A leaving leader hands its epoch over (Raft thesis 3.10): once its own removal commits it steps
down and sends `TimeoutNow`; every voter that follows it drops its lease, and the successor
campaigns at once. Only the leader a voter follows can void that lease.

    .venv/bin/python -m pytest -q tests/unit/test_consensus_handover.py
"""

from __future__ import annotations

import pytest

from peer.core.consensus_checks import RefusalKind
from peer.core.consensus_effects import LeaderChanged, Rejected, Send
from peer.core.election import Epoch, Header, Role, SiteId, TimeoutNow
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


def test_a_voter_with_a_trainer_succeeds_before_a_long_lived_one_without() -> None:
    """A voter without a trainer (a coordinator) would outlast every job, but leads no training
    round: a job that trains is the heir; the coordinator only when nobody that trains is fit (a
    run of trainer-less peers alone)."""
    names = [SiteId(n) for n in ("coordinator", "b.j3", "c.j7")]
    members = {v: _verdict() for v in names}
    match = {v: 10 for v in names}
    acks = {v: 5.0 for v in names}
    coordinator = {SiteId("coordinator")}
    assert successor(names, match, 10, members, set(), acks, heard_after=3.0) == "coordinator"
    assert successor(names, match, 10, members, set(), acks, 3.0, coordinator) == "c.j7"
    assert successor(names, match, 10, members, set(names[1:]), acks, 3.0, coordinator) == "coordinator"


def test_the_leader_steps_down_before_any_hand_over_leaves_it() -> None:
    """The safety argument: a voter drops its lease only for a leader that already stopped deciding."""
    net = Lockstep(3)
    leader = _led(net)
    core = net.cluster.core(leader)
    core.stand_back(net.t)
    effects = core.tick(net.t + SIM_CONFIG.heartbeat_interval_s)
    kinds = [type(e).__name__ if not isinstance(e, Send) else type(e.msg).__name__ for e in effects]
    assert "TimeoutNow" in kinds, kinds
    first_send = kinds.index("TimeoutNow")
    assert any(isinstance(e, LeaderChanged) and e.leader is None for e in effects[:first_send]), kinds
    assert core.role is Role.FOLLOWER and core.not_ready(net.t) is not None


def test_a_hand_over_of_another_epoch_moves_nothing() -> None:
    """A hand-over voids a lease held at this peer's epoch and nothing else: one claiming a later
    epoch must not move this peer to it (adopting an epoch drops its leader, which a forged message
    could otherwise do), nor make it campaign."""
    net = Lockstep(3)
    leader = _led(net)
    heir = sorted(s for s in net.cluster.live() if s != leader)[0]
    core = net.cluster.core(heir)
    epoch = core.hard.epoch
    ahead = TimeoutNow(Header(leader, f"{leader}:7000", Epoch(epoch + 1), 0), heir)
    effects = core.receive(ahead, net.t)
    assert [type(e) for e in effects] == [Rejected] and core.hard.epoch == epoch and core.leader == leader


def test_a_heir_that_is_leaving_itself_drops_the_lease_but_does_not_campaign() -> None:
    """The leaver's view of who is leaving comes by gossip and may lag: a leaving heir would win,
    open no round, and hand over again."""
    net = Lockstep(3)
    leader = _led(net)
    heir = sorted(s for s in net.cluster.live() if s != leader)[0]
    core = net.cluster.core(heir)
    core.stand_back(net.t)
    epoch = core.hard.epoch
    core.receive(TimeoutNow(net.cluster.core(leader)._header(), heir), net.t)
    assert core._sticky() is None and core.hard.epoch == epoch and core.role is Role.FOLLOWER


def test_a_heir_refused_because_the_hand_over_came_late_asks_again_soon() -> None:
    """Messages may overtake each other: a voter gets the heir's vote request before the hand-over,
    still holds the lease, and refuses. The heir asks again half a minimum timeout later, not a
    whole election timeout."""
    net = Lockstep(4, seed=3)
    old = _led(net)
    others = sorted(s for s in net.cluster.live() if s != old)
    core = net.cluster.core(old)
    late = [s for s in others if s != successor(others, core.match_index, core.log.last_index, {}, set(),
                                                core.ack_time, net.t - E_MIN)]
    for s in late:  # their hand-over is delayed: it comes after the heir's vote request
        net.blocked.add((old, s))
    epoch = core.hard.epoch
    core.stand_back(net.t)
    assert net.run_until(lambda: core.role is not Role.LEADER, timeout=SIM_CONFIG.heartbeat_interval_s + 0.01)
    handed_over = net.t
    net.run_for(0.01)
    assert net.leader() is None, "2 of 4 votes: the late voters refused"
    for s in late:
        net.blocked.discard((old, s))
        net.post(old, [Send(s, f"{s}:7000", TimeoutNow(Header(old, f"{old}:7000", epoch, 0), SiteId("x")))])
    assert net.run_until(lambda: net.leader() not in (None, old), timeout=SIM_CONFIG.election_timeout_max_s)
    assert net.t - handed_over < E_MIN / 2 + 0.02, f"the heir led {net.t - handed_over:.3f}s after the hand-over"
