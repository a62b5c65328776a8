"""A site of the run cannot break consensus with protocol-valid but false messages (issue 38):
peer/core/consensus_checks.py. Each probe below once stopped a real 3-peer run; here the core must
refuse it as `IMPLAUSIBLE` without changing state, and the run must go on committing.

    .venv/bin/python -m pytest tests/unit/test_consensus_hostile.py -q
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from peer.core.commitlog import (
    AppendEntries,
    AppendReply,
    DurableState,
    Entry,
    EpochStart,
    InstallSnapshot,
    LogIndex,
    Round,
    RoundCommit,
    Snapshot,
)
from peer.core.consensus import ConsensusCore
from peer.core.consensus_effects import Rejected, Status
from peer.core.consensus_checks import EPOCH_LIMIT, RefusalKind, leader_not_known_yet, unknown_to_a_joiner
from peer.core.election import Epoch, Header, RequestVote, SiteId, VoteReply
from peer.logstore import MemoryStore
from peer.sim.consensus_cluster import SIM_CONFIG, _App
from peer.sim.lockstep import Lockstep


def _settled(rounds: int = 3) -> tuple[Lockstep, SiteId, SiteId]:
    net = Lockstep(3)
    assert net.run_until(lambda: net.leader() is not None, timeout=3 * SIM_CONFIG.election_timeout_max_s + 1)
    leader = net.leader()
    assert leader is not None
    for _ in range(rounds):
        assert net.propose(leader).accepted
        net.run_for(0.2)
    follower = next(s for s in net.cluster.live() if s != leader)
    return net, leader, follower


def _header(site: str, epoch: int) -> Header:
    return Header(SiteId(site), f"{site}:7000", Epoch(epoch), 0)


def _refused(effects: list[object], reason: str) -> None:
    assert len(effects) == 1 and isinstance(effects[0], Rejected), effects
    assert effects[0].kind is RefusalKind.IMPLAUSIBLE and reason in effects[0].reason, effects[0]


def _commits_on(net: Lockstep, leader: SiteId) -> None:
    """The run goes on: a new round commits on every live peer."""
    target = net.cluster.core(leader).commit_index + 1
    assert net.propose(leader).accepted
    assert net.run_until(lambda: all(net.cluster.core(s).commit_index >= target for s in net.cluster.live()),
                         timeout=2.0)


def _snapshot_status(core: ConsensusCore) -> tuple[Status, list[Entry]]:
    return core.status(), list(core.log.entries)


def test_a_snapshot_from_a_site_that_never_joined_is_refused() -> None:
    """Probe 1: an InstallSnapshot at last_index 10^6 with voters [d] from d, a certificate of the
    run that never joined: the follower's log became empty and both other peers crashed."""
    net, leader, follower = _settled()
    core = net.cluster.core(follower)
    before = _snapshot_status(core)
    snap = Snapshot(LogIndex(10**6), core.hard.epoch, Round(10**6), b"forged", ((SiteId("d"), "d:7000"),))
    _refused(core.receive(InstallSnapshot(_header("d", core.hard.epoch), snap, 1), net.t),
             "d cannot lead: neither a voter nor a member of the run")
    assert _snapshot_status(core) == before
    # At a newer epoch d could be a leader elected while this peer was away, that joined meanwhile
    # (the whole-peer simulator: a peer paused 17 s while a late joiner became leader): refused, not
    # implausible, until this peer's log or membership knows it.
    newer = core.receive(InstallSnapshot(_header("d", core.hard.epoch + 1), snap, 1), net.t)
    assert [(type(e), e.kind) for e in newer] == [(Rejected, RefusalKind.ROUTINE)], newer  # type: ignore[attr-defined]
    assert _snapshot_status(core) == before
    _commits_on(net, leader)


@pytest.mark.parametrize("seated,claimed,leader,waits", [
    (False, 6, "a", "d leads epoch 6, newer than ours (5)"),  # elected while this peer was away
    (False, 5, None, "d leads epoch 5, ours, whose leader this peer has not heard yet"),  # seed 30378
    (False, 5, "a", None),  # this epoch's leader is known: d would be a second one (I1)
    (False, 5, "me", None),  # this peer leads the epoch
    (True, 5, None, None),  # a site this peer knows: the other checks judge it
])
def test_entries_from_a_site_not_known_yet_wait_only_where_an_honest_leader_could_send_them(
        seated: bool, claimed: int, leader: str | None, waits: str | None) -> None:
    """peer/core/consensus_checks.leader_not_known_yet: a leader that joined while this peer (epoch
    5) was away is refused as ROUTINE until its seat is known; None means the standing check judges."""
    snap = Snapshot(LogIndex(10), Epoch(claimed), Round(3), b"w", ((SiteId("d"), "d:7000"),))
    for msg in (AppendEntries(_header("d", claimed), LogIndex(10), Epoch(claimed), (), LogIndex(9), 1),
                InstallSnapshot(_header("d", claimed), snap, 1)):
        why = leader_not_known_yet(msg, seated, Epoch(5), SiteId(leader) if leader else None)
        assert (why is None) if waits is None else (why is not None and why.startswith(waits)), why
    vote = RequestVote(_header("d", claimed), Epoch(claimed), 10, Epoch(5), False)
    assert leader_not_known_yet(vote, seated, Epoch(5), None) is None


@pytest.mark.parametrize("known,sender,claimed,waits", [
    (("a", "b"), "d", 6, True),  # unreported: a site that never joined, or a member restarted since (seed 70042)
    (("a", "b"), "a", 6, False),  # a member its membership reports: believed at any epoch below the limit
    (("a", "b"), "d", 5, False),  # not above the joiner's epoch: the leader and standing checks judge it
    ((), "d", 6, False),  # membership reported nobody yet: a bare joiner believes anyone
])
def test_a_joiner_waits_for_a_newer_epoch_from_a_site_its_membership_does_not_report(
        known: tuple[str, ...], sender: str, claimed: int, waits: bool) -> None:
    """peer/core/consensus_checks.unknown_to_a_joiner: a peer with no voters yet refuses as ROUTINE
    (nothing changes; the sender retries) any message at an epoch above its own from a site its
    membership does not report, whatever the message; a peer with voters has other checks."""
    h = _header(sender, claimed)
    members = [SiteId(k) for k in known]
    for msg in (AppendEntries(h, LogIndex(0), Epoch(0), (), LogIndex(0), 1), RequestVote(h, Epoch(claimed), 0, Epoch(0), False),
                AppendReply(h, True, LogIndex(3), 1, "ok"), VoteReply(h, Epoch(claimed), False, False, "no")):
        why = unknown_to_a_joiner(msg, Epoch(5), (), members)
        assert (why is not None) == waits, (msg, why)
        assert unknown_to_a_joiner(msg, Epoch(5), ((SiteId("a"), "a:7000"),), members) is None


def test_an_ack_beyond_the_leaders_log_is_refused() -> None:
    """Probe 2: one AppendReply with match_index 10^6 made the leader assert at its next heartbeat."""
    net, leader, follower = _settled()
    core = net.cluster.core(leader)
    before = core.status()
    ack = AppendReply(_header(follower, core.hard.epoch), True, LogIndex(10**6), 1, "ok")
    _refused(core.receive(ack, net.t), f"acknowledges index {10**6} beyond this log's last {core.log.last_index}")
    assert core.status() == before and core.match_index.get(follower, 0) <= core.log.last_index
    net.run_for(3 * SIM_CONFIG.heartbeat_interval_s)
    assert net.leader() == leader
    _commits_on(net, leader)


def test_a_reply_from_a_site_the_leader_never_replicated_to_is_refused() -> None:
    net, leader, _ = _settled()
    core = net.cluster.core(leader)
    before = core.status()
    _refused(core.receive(AppendReply(_header("d", core.hard.epoch), True, LogIndex(1), 1, "ok"), net.t),
             "d answers entries this leader never sent it")
    assert core.status() == before


@pytest.mark.parametrize("reply", ["vote", "append"])
def test_a_reply_from_a_site_that_never_joined_deposes_nobody(reply: str) -> None:
    # Found by the hypothesis test below: replies of epoch e+1 and then e+1000 from d raised a
    # voter's epoch past every other voter's plausibility bound, so its elections were refused.
    net, leader, follower = _settled()
    for to in (leader, follower):
        core = net.cluster.core(to)
        before = core.status()
        for epoch in (core.hard.epoch + 1, core.hard.epoch + 1000):
            h = _header("d", epoch)
            msg = (VoteReply(h, Epoch(epoch), False, False, "x") if reply == "vote"
                   else AppendReply(h, False, LogIndex(0), 1, "x"))
            _refused(core.receive(msg, net.t), "d answers what it was never asked")
        assert core.status() == before


@pytest.mark.parametrize("entries,prev,reason", [
    ((2, 4), (1, 1), "entries not consecutive: index 4 where 3 was due"),
    ((2,), (1, 9), "previous entry of epoch 9 sent at epoch"),
])
def test_malformed_entries_are_refused(entries: tuple[int, ...], prev: tuple[int, int], reason: str) -> None:
    net, leader, follower = _settled()
    core = net.cluster.core(follower)
    before = _snapshot_status(core)
    epoch = core.hard.epoch
    batch = tuple(Entry(LogIndex(i), epoch, EpochStart(leader)) for i in entries)
    msg = AppendEntries(_header(leader, epoch), LogIndex(prev[0]), Epoch(prev[1]), batch, LogIndex(0), 99)
    _refused(core.receive(msg, net.t), reason)
    assert _snapshot_status(core) == before


def test_entries_that_contradict_committed_ones_change_nothing() -> None:
    """A voter re-writing committed history (index 2 at another epoch) is refused whole."""
    net, leader, follower = _settled()
    core = net.cluster.core(follower)
    before = _snapshot_status(core)
    epoch = core.hard.epoch
    assert core.commit_index >= 2
    forged = (Entry(LogIndex(2), epoch, RoundCommit(Round(1), (), b"forged")),)
    msg = AppendEntries(_header(leader, epoch), LogIndex(1), core.log.epoch_at(1) or Epoch(0), forged,
                        core.commit_index, 99)
    effects = core.receive(msg, net.t)
    assert any(isinstance(e, Rejected) and e.kind is RefusalKind.IMPLAUSIBLE and "contradicts the committed" in e.reason
               for e in effects), effects
    assert core.log.entries == before[1] and core.commit_index == before[0].commit_index


def test_a_repaired_follower_catches_up_while_the_leader_stays() -> None:
    """Probe 7: after `peer repair` (the follower's log emptied) the leader kept its old match_index
    and re-sent the same unusable prev_index until the leader changed (40 s to minutes)."""
    net, leader, follower = _settled(rounds=5)
    epoch = net.cluster.core(leader).hard.epoch
    net.cluster.crash(follower)
    disk = MemoryStore()  # what `peer repair` leaves: no log, no hard state; the site joins again
    fresh = DurableState.fresh(None)
    disk.save_hard_state(fresh.hard)
    disk.write_log(1, tuple(fresh.entries))
    net.cluster.disks[follower], net.cluster.apps[follower] = disk, _App()
    net.cluster.start(follower, net.t)
    target = net.cluster.core(leader).commit_index
    assert net.run_until(lambda: net.cluster.core(follower).commit_index >= target, timeout=1.0)
    assert net.leader() == leader and net.cluster.core(leader).hard.epoch == epoch
    _commits_on(net, leader)


@pytest.mark.parametrize("probe", ["snapshot", "append", "vote", "reply"])
def test_a_joiner_believes_no_site_that_never_joined(probe: str) -> None:
    """A joiner (no voters yet) whose membership reported the run's members: one message at a far
    epoch from d, a certificate of the run that never joined, once took it there (or emptied its
    log into d's snapshot) for good: the leader was stale to it and its answers implausible to the
    leader (the whole-peer simulator's faulty site found it). The message waits (ROUTINE: a member
    restarted after the joiner's join is unreported for a moment too, seed 70042) and changes
    nothing. Members are still believed at any epoch below the limit (a joiner has no majority to
    ask), and so is anyone before membership reports a member (a bare core)."""
    import random

    from peer.sim.consensus_cluster import SIM_CONFIG as cfg

    def joiner(members: tuple[str, ...]) -> ConsensusCore:
        core = ConsensusCore.start(SiteId("j"), "j:7000", cfg, DurableState.fresh(None), 0.0, random.Random(0))
        for m in members:
            core.member_alive(SiteId(m), f"{m}:7000")
        return core

    far = 10**6
    h = _header("d", far)
    msg = {"snapshot": InstallSnapshot(h, Snapshot(LogIndex(far), Epoch(far), Round(far), b"forged",
                                                   ((SiteId("d"), "d:7000"),)), 1),
           "append": AppendEntries(h, LogIndex(0), Epoch(0), (), LogIndex(0), 1),
           "vote": RequestVote(h, Epoch(far), 0, Epoch(0), False),
           "reply": AppendReply(h, True, LogIndex(far), 1, "ok")}[probe]
    core = joiner(("a", "b"))
    before = _snapshot_status(core)
    effects = core.receive(msg, 1.0)
    assert effects and all(isinstance(e, Rejected) and e.kind is RefusalKind.ROUTINE for e in effects), effects
    assert _snapshot_status(core) == before and core.log.snapshot.last_index == 0
    member = joiner(("a", "d"))  # d is a member now: believed (docs/decisions/security-consensus-standing.md)
    member.receive(msg, 1.0)
    bare = joiner(())
    bare.receive(msg, 1.0)
    assert member.hard.epoch == bare.hard.epoch == far


def test_a_stale_refusal_does_not_undo_a_newer_ack() -> None:
    """A refusal delivered late (sent before the follower's newest ack) is not a repaired log: the
    leader keeps what the follower acked."""
    net, leader, follower = _settled()
    core = net.cluster.core(leader)
    matched = core.match_index[follower]
    late = AppendReply(_header(follower, core.hard.epoch), False, LogIndex(1), 0, "missing entries")
    core.receive(late, net.t)
    assert core.match_index[follower] == matched


# ----- adversarial sequences from a legitimate sender -----

_counter = st.one_of(st.integers(0, 8), st.integers(0, 2**62), st.sampled_from([EPOCH_LIMIT, EPOCH_LIMIT + 1, 2**62]))


@st.composite
def _hostile(draw: st.DrawFn, sender: str) -> object:
    h = _header(sender, draw(_counter))
    kind = draw(st.sampled_from(["append", "reply", "snapshot", "vote", "vote_reply"]))
    if kind == "append":
        first = draw(_counter)
        n = draw(st.integers(0, 3))
        entries = tuple(Entry(LogIndex(first + k + 1), Epoch(draw(_counter)), EpochStart(SiteId(sender)))
                        for k in range(n))
        return AppendEntries(h, LogIndex(first), Epoch(draw(_counter)), entries, LogIndex(draw(_counter)),
                             draw(_counter))
    if kind == "reply":
        return AppendReply(h, draw(st.booleans()), LogIndex(draw(_counter)), draw(_counter), "x")
    if kind == "snapshot":
        voters = tuple((SiteId(s), f"{s}:7000") for s in draw(st.sets(st.sampled_from(["s00", "s01", "s02", "d"]))))
        snap = Snapshot(LogIndex(draw(_counter)), Epoch(draw(_counter)), Round(draw(_counter)), b"x", tuple(sorted(voters)))
        return InstallSnapshot(h, snap, draw(_counter))
    if kind == "vote":
        return RequestVote(h, Epoch(draw(_counter)), draw(_counter), Epoch(draw(_counter)), draw(st.booleans()))
    return VoteReply(h, Epoch(draw(_counter)), draw(st.booleans()), draw(st.booleans()), "x")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_no_sequence_from_a_site_that_never_joined_changes_the_run(data: st.DataObject) -> None:
    """A site that holds a certificate of the run but never joined sends any sequence of well-typed
    consensus messages with any counters to the leader and a follower: no peer raises, nothing it
    says is applied (the simulator's checks of agreement run on every commit), and once it stops the
    three peers elect a leader and commit again."""
    net, _, _ = _settled(rounds=2)
    for _ in range(data.draw(st.integers(1, 12), label="messages")):
        msg = data.draw(_hostile("d"))
        to = data.draw(st.sampled_from(net.cluster.live()), label="to")
        # Run like the node, refusals logged (the cluster's own deliver counts them as violations:
        # there every message is honest). The answers go to d's address, where nobody listens.
        effects = net.cluster.core(to).receive(msg, net.t)  # type: ignore[arg-type]
        net.post(to, net.cluster.execute(to, [e for e in effects if not isinstance(e, Rejected)]))
        net.run_for(0.01)
    assert all(net.cluster.core(s).hard.epoch <= EPOCH_LIMIT for s in net.cluster.live())
    assert net.run_until(lambda: net.leader() is not None, timeout=10 * SIM_CONFIG.election_timeout_max_s)
    new_leader = net.leader()
    assert new_leader is not None
    _commits_on(net, new_leader)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_no_sequence_from_a_voter_crashes_a_peer_or_blocks_the_epoch(data: st.DataObject) -> None:
    """A voter's certificate (a buggy or hostile site in the run) sends any sequence of well-typed
    messages: no core raises and no epoch passes EPOCH_LIMIT, so elections can always go on. What it
    says within what an honest leader could say (a plausible snapshot) may be believed: Raft trusts
    its voters (docs/decisions/security-consensus-standing.md), so only the cores are driven here."""
    net, leader, follower = _settled(rounds=2)
    for _ in range(data.draw(st.integers(1, 12), label="messages")):
        msg = data.draw(_hostile(follower))
        to = data.draw(st.sampled_from([leader] + [s for s in net.cluster.live() if s not in (leader, follower)]))
        core = net.cluster.core(to)
        core.receive(msg, net.t)  # type: ignore[arg-type]
        core.tick(net.t + 0.01)
        assert core.hard.epoch <= EPOCH_LIMIT and core.commit_index <= core.log.last_index
