"""Epoch jumps no honest peer makes are refused (peer/core/consensus_checks.py `implausible_epoch`):
no site alone can push a peer far above its epoch or past EPOCH_LIMIT; a majority of the voters far
ahead (this peer was away) and anyone below the limit to a joiner with no voters yet are believed.
docs/decisions/security-epoch-jumps.md, security-consensus-standing.md.

    .venv/bin/python -m pytest tests/unit/test_consensus_epoch_jumps.py -q
"""

from __future__ import annotations

from peer.core.commitlog import AppendEntries, Epoch, LogIndex
from peer.core.consensus import MAX_EPOCH_JUMP
from peer.core.consensus_effects import Rejected
from peer.core.consensus_checks import EPOCH_LIMIT, RefusalKind
from peer.core.election import Header, RequestVote, SiteId, VoteReply
from peer.sim.consensus_cluster import SIM_CONFIG
from peer.sim.lockstep import Lockstep


def _settled() -> tuple[Lockstep, SiteId, SiteId]:
    net = Lockstep(3)
    assert net.run_until(lambda: net.leader() is not None, timeout=3 * SIM_CONFIG.election_timeout_max_s + 1)
    leader = net.leader()
    assert leader is not None
    net.propose(leader)
    net.run_for(0.5)
    follower = next(s for s in net.cluster.live() if s != leader)
    return net, leader, follower


def _append(site: str, epoch: int) -> AppendEntries:
    return AppendEntries(Header(SiteId(site), f"{site}:7000", Epoch(epoch), 0), LogIndex(0), Epoch(0), (),
                         LogIndex(0), 1)


def test_a_non_voter_cannot_push_the_epoch_far_up() -> None:
    net, leader, follower = _settled()
    core = net.cluster.core(follower)
    core.member_alive(SiteId("intruder"), "intruder:7000")  # a live member of the run, not a voter
    epoch, before = core.hard.epoch, core.status()
    vote = RequestVote(Header(SiteId("intruder"), "intruder:7000", Epoch(epoch), 0), Epoch(epoch + 10**6), 10**6,
                       Epoch(epoch + 10**6 - 1), False)
    for msg, claimed in ((_append("intruder", epoch + MAX_EPOCH_JUMP + 1), epoch + MAX_EPOCH_JUMP + 1),
                         (vote, epoch + 10**6)):
        effects = core.receive(msg, net.t)
        assert len(effects) == 1 and isinstance(effects[0], Rejected), effects
        assert effects[0].kind is RefusalKind.IMPLAUSIBLE
        assert effects[0].reason.startswith(f"implausible epoch {claimed}: more than {MAX_EPOCH_JUMP} above")
    assert core.status() == before
    # Within the bound a live member is heard as before (a joiner learns the epoch from its replies).
    core.receive(_append("intruder", epoch + MAX_EPOCH_JUMP), net.t)
    assert core.hard.epoch == epoch + MAX_EPOCH_JUMP
    net.run_until(lambda: net.leader() is not None, timeout=5 * SIM_CONFIG.election_timeout_max_s)
    assert net.leader() is not None  # the run goes on


def test_one_voter_far_ahead_is_not_believed_a_majority_is() -> None:
    """A peer that was away while the others held many elections must be able to rejoin: a
    majority of its voters far ahead is believed. One voter alone (a faulty or hostile site) is
    not: one AppendEntries at epoch 2^62 from a voter once left a run leaderless for good."""
    net, leader, follower = _settled()
    core = net.cluster.core(follower)
    epoch, before = core.hard.epoch, core.status()
    far = epoch + 10 * MAX_EPOCH_JUMP
    for claim in (far, EPOCH_LIMIT + 1, 2**62):
        effects = core.receive(_append(leader, claim), net.t)
        assert [e.kind for e in effects if isinstance(e, Rejected)] == [RefusalKind.IMPLAUSIBLE], effects
        assert core.status() == before
    # The third voter is heard there too (its reply to this peer's campaign): a majority, believed.
    third = next(s for s in net.cluster.live() if s not in (leader, follower))
    reply = VoteReply(Header(SiteId(third), f"{third}:7000", Epoch(far), 0), Epoch(epoch + 1), False, True, "no")
    core.receive(reply, net.t)
    assert core.hard.epoch == far
    core.receive(_append(leader, far), net.t)
    assert core.leader == leader


def test_a_joiner_without_voters_believes_the_run() -> None:
    net = Lockstep(["a"])
    net.cluster.start(SiteId("b"), net.t)  # not among the founders: an empty log, no voters
    joiner = net.cluster.core(SiteId("b"))
    assert not joiner.log.voters()
    joiner.receive(_append("a", 5 * MAX_EPOCH_JUMP), net.t)
    assert joiner.hard.epoch == 5 * MAX_EPOCH_JUMP
    # ... below the limit, so that every epoch it holds can still be incremented.
    effects = joiner.receive(_append("a", EPOCH_LIMIT + 1), net.t)
    assert [e.kind for e in effects if isinstance(e, Rejected)] == [RefusalKind.IMPLAUSIBLE]
    assert joiner.hard.epoch == 5 * MAX_EPOCH_JUMP
    joiner.receive(_append("a", EPOCH_LIMIT), net.t)
    assert joiner.hard.epoch == EPOCH_LIMIT


def test_a_leader_refuses_a_second_leader_of_its_own_epoch() -> None:
    """An epoch has one leader (I1): an AppendEntries or InstallSnapshot at the leader's own epoch is
    forged or misdirected. The leader refuses it and stays leader; it used to raise, which a fuzzed
    message with an empty sender turned into an unhandled servicer exception."""
    net, leader, follower = _settled()
    core = net.cluster.core(leader)
    before = core.status()
    for sender, reason in ((follower, f"two leaders in epoch {core.hard.epoch}: "), ("", "(no name) cannot lead: neither a voter nor a member of the run"),
                           ("intruder", "intruder cannot lead: neither a voter nor a member of the run")):
        effects = core.receive(_append(sender, core.hard.epoch), net.t)
        assert len(effects) == 1 and isinstance(effects[0], Rejected), effects
        assert effects[0].reason.startswith(reason) and effects[0].kind is RefusalKind.IMPLAUSIBLE
    assert core.status() == before
