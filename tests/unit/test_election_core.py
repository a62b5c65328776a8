"""Elections through the consensus core on a manual clock: one leader, epochs, lease, CheckQuorum,
stale-epoch fencing, paused leader, restart with a stale epoch, a paused follower woken under a leader
that joined meanwhile. Harness: peer.sim.lockstep.Lockstep."""

from __future__ import annotations

from peer.core.commitlog import AppendEntries, Epoch, LogIndex, PersistHardState
from peer.core.consensus_checks import RefusalKind
from peer.core.consensus_effects import LeaderChanged, Rejected, Send
from peer.core.election import Header, RequestVote, Role, SiteId
from peer.sim.consensus_cluster import SIM_CONFIG
from peer.sim.lockstep import Lockstep

E_MIN, E_MAX = SIM_CONFIG.election_timeout_min_s, SIM_CONFIG.election_timeout_max_s


def _elect(net: Lockstep) -> SiteId:
    assert net.run_until(lambda: net.leader() is not None, timeout=3 * E_MAX + 1)
    leader = net.leader()
    assert leader is not None
    return leader


def test_three_peers_elect_exactly_one_leader_and_all_follow_it() -> None:
    net = Lockstep(3)
    leader = _elect(net)
    net.run_for(1.0)
    assert net.leaders() == [leader]
    epoch = net.cluster.core(leader).hard.epoch
    for site in net.cluster.live():
        st = net.cluster.core(site).status()
        assert (st.leader, st.epoch) == (leader, epoch)


def test_no_election_before_the_minimum_timeout_after_start() -> None:
    # Restarted peers refuse votes for E_min (they may have acked a lease just before crashing).
    net = Lockstep(3)
    net.run_for(E_MIN * 0.99)
    assert all(net.cluster.core(s).role is not Role.LEADER for s in net.cluster.live())


def test_a_single_voter_elects_itself() -> None:
    net = Lockstep(1)
    assert _elect(net) == "s00"


def test_killed_leader_is_replaced_with_a_higher_epoch_within_the_bound() -> None:
    net = Lockstep(3)
    old = _elect(net)
    old_epoch = net.cluster.core(old).hard.epoch
    net.cluster.crash(old)
    crashed_at = net.t
    new = _elect(net)
    assert new != old
    assert net.cluster.core(new).hard.epoch > old_epoch
    # E_min stickiness + at most E_max timeout + pre-vote and vote round trips (+ one retry).
    assert net.t - crashed_at <= E_MIN + 2 * E_MAX


def test_paused_leader_steps_down_on_resume_and_its_messages_are_rejected() -> None:
    net = Lockstep(3)
    old = _elect(net)
    net.paused.add(old)
    net.run_for(2 * E_MAX + E_MIN)
    new = net.leader()
    assert new is not None and new != old
    new_epoch = net.cluster.core(new).hard.epoch
    # SIGCONT: its timer fires first; with no majority ack within the lease it stops deciding.
    net.paused.discard(old)
    core = net.cluster.core(old)
    decision = net.propose(old)
    assert not decision.accepted and "lease" in decision.reason
    effects = core.tick(net.t)
    net.do(old, effects)
    assert core.role is Role.FOLLOWER
    assert any(isinstance(e, LeaderChanged) and e.leader is None for e in effects)
    # A heartbeat it sent before noticing (stale epoch) is refused by the new leader's followers.
    follower = next(s for s in net.cluster.live() if s not in (old, new))
    stale = AppendEntries(Header(old, f"{old}:7000", Epoch(new_epoch - 1), 0), LogIndex(0), Epoch(0), (),
                          LogIndex(0), 1)
    before = net.cluster.core(follower).status()
    sends = net.cluster.deliver(follower, stale, net.t)  # the cluster also checks the fingerprint
    assert net.cluster.core(follower).status() == before
    assert any(isinstance(s, Send) and s.to == old and not s.msg.success for s in sends)  # type: ignore[union-attr]


def test_check_quorum_leader_cut_off_from_majority_stops_deciding_then_steps_down() -> None:
    """Cut off, the leader decides nothing once its lease ran out, but holds its epoch for the
    maximum election timeout after its last acked send (acks that only lag come back to it without
    an election: ElectionConfig.quorum_window_s), then steps down."""
    net = Lockstep(3)
    leader = _elect(net)
    others = [s for s in net.cluster.live() if s != leader]
    net.blocked = {(leader, o) for o in others} | {(o, leader) for o in others}
    net.run_for(E_MIN + SIM_CONFIG.heartbeat_interval_s * 2)
    core = net.cluster.core(leader)
    assert core.role is Role.LEADER and (core.not_ready(net.t) or "").startswith("no lease"), core.status()
    net.run_for(E_MAX - E_MIN)
    assert net.cluster.core(leader).role is Role.FOLLOWER
    assert net.run_until(lambda: net.leader() in others, timeout=3 * E_MAX)


def test_minority_side_never_elects_nor_commits() -> None:
    net = Lockstep(5)
    leader = _elect(net)
    minority = [leader, next(s for s in net.cluster.live() if s != leader)]
    majority = [s for s in net.cluster.live() if s not in minority]
    net.blocked = {(a, b) for a in minority for b in majority} | {(b, a) for a in minority for b in majority}
    committed_before = {s: net.cluster.core(s).commit_index for s in minority}
    # The old leader may still try to decide, but nothing it appends commits.
    net.run_for(SIM_CONFIG.heartbeat_interval_s)
    net.propose(leader)
    net.run_for(5 * E_MAX)
    for s in minority:
        assert net.cluster.core(s).commit_index == committed_before[s]
        assert net.cluster.core(s).role is not Role.LEADER
    assert net.leader() in majority


def test_restarted_former_leader_with_stale_epoch_rejoins_as_follower() -> None:
    net = Lockstep(3)
    old = _elect(net)
    old_epoch = net.cluster.core(old).hard.epoch
    net.cluster.crash(old)
    new = _elect(net)
    net.propose(new)
    net.run_for(0.1)
    net.cluster.start(old, net.t)
    assert net.cluster.core(old).hard.epoch == old_epoch  # from its disk
    net.run_for(E_MAX)
    st = net.cluster.core(old).status()
    assert st.role is Role.FOLLOWER and st.leader == new and st.epoch == net.cluster.core(new).hard.epoch
    assert st.commit_index == net.cluster.core(new).commit_index


def test_stale_vote_request_is_refused_without_any_state_change() -> None:
    net = Lockstep(3)
    leader = _elect(net)
    follower = next(s for s in net.cluster.live() if s != leader)
    core = net.cluster.core(follower)
    before = core.status()
    req = RequestVote(Header(SiteId("s99"), "x:1", Epoch(0), 0), Epoch(0), 1, Epoch(0), False)
    effects = core.receive(req, net.t)
    assert core.status() == before
    assert not any(isinstance(e, PersistHardState) for e in effects)
    assert any(isinstance(e, Rejected) and "leader" in e.reason for e in effects)


def test_partitioned_peer_does_not_disrupt_the_leader_when_it_returns() -> None:
    # PreVote: the isolated peer never moves to a higher epoch, so its return deposes no one.
    net = Lockstep(3)
    leader = _elect(net)
    epoch = net.cluster.core(leader).hard.epoch
    lone = next(s for s in net.cluster.live() if s != leader)
    net.blocked = {(lone, s) for s in net.cluster.live()} | {(s, lone) for s in net.cluster.live()}
    net.run_for(10 * E_MAX)
    assert net.cluster.core(lone).hard.epoch == epoch
    net.blocked = set()
    net.run_for(2 * E_MAX)
    assert net.leader() == leader and net.cluster.core(leader).hard.epoch == epoch


def test_a_paused_follower_defers_a_leader_that_joined_while_it_was_stopped() -> None:
    """Whole-peer simulator seed 30378: s2 was stopped (SIGSTOP) before the late joiner s4 became a
    voter, and s4 led when s2 woke. s2's pre-vote was refused by voters already at s4's epoch, so s2
    moved to that epoch without hearing its leader; s4's next heartbeat, at s2's own epoch now, from
    a site neither s2's log nor its membership knew, was refused as implausible (which no honest
    message is). It is deferred (ROUTINE, nothing changes) until membership reports the joiner; then
    s2 follows it and learns the joiner's seat from the log it sends."""
    net = Lockstep(4)
    leader = _elect(net)
    net.propose(leader)
    net.run_for(0.2)
    sleeper, *awake = [s for s in net.cluster.live() if s != leader]
    net.paused.add(sleeper)
    joiner = SiteId("s04")
    net.cluster.start(joiner, net.t)
    for s in [leader, *awake]:
        net.cluster.core(s).member_alive(joiner, f"{joiner}:7000")
    old = net.cluster.core(leader)
    assert net.run_until(lambda: joiner in dict(old.log.voters_at(old.commit_index)), timeout=2.0)
    # The joiner is elected: the old leader stops, and the awake followers reach only the joiner.
    net.cluster.crash(leader)
    net.blocked = {(a, b) for a in awake for b in net.cluster.cores if b != joiner}
    assert net.run_until(lambda: net.leader() == joiner, timeout=10 * E_MAX)
    net.blocked = set()
    lead, core = net.cluster.core(joiner), net.cluster.core(sleeper)
    assert joiner not in dict(core.log.voters()) and joiner not in core.members
    assert core.hard.epoch < lead.hard.epoch
    # SIGCONT: its election timer fires, the awake voters' refusals take it to the joiner's epoch,
    # and the joiner's heartbeats of that epoch reach it (the cluster raises at an implausible refusal).
    net.paused.discard(sleeper)
    net.run_for(2 * E_MAX)
    epoch = lead.hard.epoch
    assert (core.hard.epoch, core.leader, net.leader()) == (epoch, None, joiner)
    before = core.status()
    heartbeat = AppendEntries(Header(joiner, f"{joiner}:7000", epoch, 0), LogIndex(lead.log.last_index),
                              lead.log.last_epoch, (), lead.commit_index, 99)
    [deferred] = core.receive(heartbeat, net.t)
    assert isinstance(deferred, Rejected) and deferred.kind is RefusalKind.ROUTINE, deferred
    assert "has not heard" in deferred.reason and core.status() == before, deferred
    # Membership catches up (its gossip after SIGCONT): the sleeper follows the joiner and its log
    # gets the joiner's seat.
    core.member_alive(joiner, f"{joiner}:7000")
    assert net.run_until(lambda: core.leader == joiner and core.commit_index == lead.commit_index,
                         timeout=2.0)
    assert joiner in dict(core.log.voters()) and net.leader() == joiner
    # A site that never joined is refused as implausible at an epoch whose leader this peer knows.
    stranger = AppendEntries(Header(SiteId("d"), "d:7000", core.hard.epoch, 0), LogIndex(0), Epoch(0), (),
                             LogIndex(0), 1)
    [no] = core.receive(stranger, net.t)
    assert isinstance(no, Rejected) and no.kind is RefusalKind.IMPLAUSIBLE, no
