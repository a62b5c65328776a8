"""Epoch jumps no honest peer makes are refused (peer/core/consensus.py `implausible_epoch`): a site
outside the voter set cannot push a peer far above its epoch; a voter far ahead (this peer was
away) and a joiner with no voters yet are believed. docs/decisions/security-epoch-jumps.md.

    .venv/bin/python -m pytest tests/unit/test_consensus_epoch_jumps.py -q
"""

from __future__ import annotations

from peer.core.commitlog import AppendEntries, Epoch, LogIndex
from peer.core.consensus import MAX_EPOCH_JUMP, Rejected
from peer.core.election import Header, RequestVote, SiteId
from peer.sim.consensus_sim import SIM_CONFIG, Lockstep


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
    epoch, before = core.hard.epoch, core.status()
    vote = RequestVote(Header(SiteId("intruder"), "intruder:7000", Epoch(epoch), 0), Epoch(epoch + 10**6), 10**6,
                       Epoch(epoch + 10**6 - 1), False)
    for msg, claimed in ((_append("intruder", epoch + MAX_EPOCH_JUMP + 1), epoch + MAX_EPOCH_JUMP + 1),
                         (vote, epoch + 10**6)):
        effects = core.receive(msg, net.t)
        assert len(effects) == 1 and isinstance(effects[0], Rejected), effects
        assert effects[0].reason.startswith(f"implausible epoch {claimed}: more than {MAX_EPOCH_JUMP} above")
    assert core.status() == before
    # Within the bound a non-voter is heard as before (a joiner learns the epoch from its replies).
    core.receive(_append("intruder", epoch + MAX_EPOCH_JUMP), net.t)
    assert core.hard.epoch == epoch + MAX_EPOCH_JUMP
    net.run_until(lambda: net.leader() is not None, timeout=5 * SIM_CONFIG.election_timeout_max_s)
    assert net.leader() is not None  # the run goes on


def test_a_voter_far_ahead_is_believed() -> None:
    """A peer that was away while the others held many elections must be able to rejoin."""
    net, leader, follower = _settled()
    core = net.cluster.core(follower)
    far = core.hard.epoch + 10 * MAX_EPOCH_JUMP
    core.receive(_append(leader, far), net.t)
    assert core.hard.epoch == far


def test_a_joiner_without_voters_believes_the_run() -> None:
    net = Lockstep(["a"])
    net.cluster.start(SiteId("b"), net.t)  # not among the founders: an empty log, no voters
    joiner = net.cluster.core(SiteId("b"))
    assert not joiner.log.voters()
    joiner.receive(_append("a", 5 * MAX_EPOCH_JUMP), net.t)
    assert joiner.hard.epoch == 5 * MAX_EPOCH_JUMP


def test_a_leader_refuses_a_second_leader_of_its_own_epoch() -> None:
    """An epoch has one leader (I1): an AppendEntries or InstallSnapshot at the leader's own epoch is
    forged or misdirected. The leader refuses it and stays leader; it used to raise, which a fuzzed
    message with an empty sender turned into an unhandled servicer exception."""
    net, leader, follower = _settled()
    core = net.cluster.core(leader)
    before = core.status()
    for sender in (follower, "", "intruder"):
        effects = core.receive(_append(sender, core.hard.epoch), net.t)
        assert len(effects) == 1 and isinstance(effects[0], Rejected), effects
        assert effects[0].reason.startswith(f"two leaders in epoch {core.hard.epoch}: ")
    assert core.status() == before
