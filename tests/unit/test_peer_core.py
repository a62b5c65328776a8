"""One peer's protocol (peer/core/peer_core.py) driven alone: what PeerCore routes, and in what order.

Site "a" runs the real consensus core on a fresh log (alone, or beside a voter "b" that is only the
messages the test hands it), the real round protocol (`PeerRounds`, owning every block: its lease
sends are delivered to itself at once) or empty rounds, and the seat's half of a leave.

    .venv/bin/python -m pytest -q tests/unit/test_peer_core.py
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from peer.core import consensus_effects as ce
from peer.core import events as ev
from peer.core import rounds as r
from peer.core.commitlog import (EMPTY_SNAPSHOT, AppendEntries, AppendReply, DurableState, Entry, EpochStart, LogIndex,
                                 Round, RoundCommit, VoterChange, bootstrap_entries)
from peer.core.consensus import ConsensusCore
from peer.core.election import Epoch, HardState, Header, Role, SiteId, TimeoutNow, VoteReply
from peer.core.lease_config import LeaseConfig
from peer.core.lease_log import LeaseLog
from peer.core.lease_types import Send as LeaseSend
from peer.core.membership_types import MemberState
from peer.core.peer_core import Commits, Effect, PeerCore, Proposed, View
from peer.core.peer_rounds import PeerRounds, Seen
from peer.core.seat_leave import SayLeft, Stop
from peer.core.timeline import RoundClock
from peer.sim.peer_config import RAFT

CONFIG = r.RoundsConfig(inner_steps=2, samples_per_step=8, deadline_s=10.0, gather_s=2.0)
THETA0 = b"theta0"
ALONE = View(frozenset({"a"}), applied_round=0, weights_hash=THETA0)
LEADER_WAIT_S, FOLLOWER_WAIT_S = 4.0, 8.0


def _peer(trains: bool, voters: Sequence[str] = ("a",), tail: Sequence[Entry] = (),
          empty: r.EmptyRounds | None = None) -> PeerCore:
    """Site "a" on a fresh log founded by `voters`, with `tail` on disk after the bootstrap entries;
    a's `trains` is every founder's (a run of consensus-only peers, or of trainers)."""
    founders = {SiteId(s): f"addr-{s}" for s in voters}
    log = [*bootstrap_entries(founders, frozenset() if trains else frozenset(founders)), *tail]
    consensus = ConsensusCore.start(SiteId("a"), "addr-a", RAFT, DurableState(HardState(Epoch(0), None),
                                    EMPTY_SNAPSHOT, log), 0.0, random.Random(0))
    return PeerCore(consensus, trains=trains, empty=empty, leader_wait_s=LEADER_WAIT_S,
                    follower_wait_s=FOLLOWER_WAIT_S)


def _rounds() -> PeerRounds:
    cfg = LeaseConfig.local_test()
    return PeerRounds("a", "addr-a", CONFIG, LeaseLog(SiteId("a"), {1000: 64}, cfg, boot=0), cfg.ttl,
                      RoundClock("a", 0.0), 0, THETA0)


def _elect(p: PeerCore) -> tuple[float, list[Effect]]:
    """Ticks the single voter at its election deadline: it leads, and its log commits at once."""
    t = p.consensus.next_deadline()
    out = p.tick(t, ALONE)
    assert p.consensus.role is Role.LEADER
    return t, out


def _pump(p: PeerCore, effects: list[Effect], now: float) -> list[Effect]:
    """Delivers the lease sends to this peer's own cores; returns every other effect."""
    out: list[Effect] = []
    queue = list(effects)
    while queue:
        e = queue.pop(0)
        if isinstance(e, LeaseSend):
            queue += p.lease_message(e.msg, now, ALONE)
        else:
            out.append(e)
    return out


def _append(epoch: int, prev: int, entries: Sequence[Entry], commit: int, seq: int) -> AppendEntries:
    """What leader "b" of `epoch` sends "a" (its log of the bootstrap entries at epoch 0)."""
    prev_epoch = Epoch(0) if prev <= 2 else Epoch(epoch)
    return AppendEntries(Header(SiteId("b"), "addr-b", Epoch(epoch), 0), LogIndex(prev), prev_epoch,
                         tuple(entries), LogIndex(commit), seq)


def _spy(monkeypatch: pytest.MonkeyPatch, obj: object, name: str,
         answer: Callable[..., Any] | None = None) -> list[Any]:
    """Records the arguments of each call of `obj.name`; `answer`, if any, replaces it."""
    calls: list[Any] = []
    real = getattr(obj, name)

    def spy(*args: Any) -> Any:
        calls.append(args)
        return (answer or real)(*args)

    monkeypatch.setattr(obj, name, spy)
    return calls


def _kinds(effects: Sequence[object]) -> list[str]:
    return [type(e).__name__ for e in effects]


def test_a_peer_without_trainer_commits_an_empty_round_each_interval_while_it_leads() -> None:
    """`peer serve --round-interval`: the leader proposes round n+1 with no contributors at the
    interval (its Proposed first, then consensus's persist, then its Commits), next_deadline says
    when; a follower proposes nothing."""
    p = _peer(trains=False, empty=r.EmptyRounds(0.1))  # below the heartbeat: the interval is the deadline
    assert not [e for t in (0.0, 0.5, 1.0) for e in p.tick(t, ALONE) if isinstance(e, Proposed)], "a follower"
    assert p.next_deadline(ALONE) == p.consensus.next_deadline() > 1.0, "a follower waits for its election"
    t, out = _elect(p)
    assert any(isinstance(e, Proposed) and e.commit.round == 1 for e in out), "due at once on winning"
    assert p.next_deadline(ALONE) == pytest.approx(t + 0.1)
    assert not [e for e in p.tick(t + 0.05, ALONE) if isinstance(e, Proposed)], "not due yet"
    out = p.tick(t + 0.1, ALONE)
    empty = RoundCommit(Round(2), (), b"")
    assert _kinds(out) == ["Proposed", "PersistLog", "Commits"]
    assert out[0] == Proposed(empty, True, "appended at index 4")
    assert isinstance(out[1], ce.PersistLog) and out[1].entries[0].body == empty
    assert isinstance(out[2], Commits) and [e.body for e in out[2].entries] == [empty]


def test_commits_follow_consensus_effects_and_round_effects_follow_commits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A round of a single training voter: the election's Commits come after its persists and before
    the round opens; the decision's entries are applied (Apply) only after the Commits of them, and
    after the rest of the batch that proposed it."""
    p = _peer(trains=True)
    rounds = _rounds()
    assert p.attach(rounds, 0.0, ALONE) == []
    t, out = _elect(p)
    out = _pump(p, out, t)
    assert _kinds(out)[:5] == ["PersistHardState", "LeaderChanged", "PersistLog", "Commits", "Broadcast"]
    (opened,) = [e.msg for e in out if isinstance(e, r.Broadcast)]
    assert _pump(p, p.round_message(opened, t, ALONE), t) == []
    train: list[ev.Train] = []
    while not train:  # it gathers its leased samples
        t += 0.1
        train = [e for e in _pump(p, p.tick(t, ALONE), t) if isinstance(e, ev.Train)]
    done = ev.TrainDone(1, train[0].ranges, 160, b"root-a")
    (report,) = [e for e in _pump(p, p.handle(done, t, ALONE), t) if isinstance(e, ev.SendReport)]
    out = _pump(p, p.round_message(report.contribution, t, ALONE), t)
    (fetch,) = [e for e in out if isinstance(e, ev.Fetch)]
    handle = rounds.handle

    def and_more(event: ev.Event, now: float, seen: Seen) -> list[object]:
        """The batch that proposes goes on after its Propose."""
        more = [ev.Note("rest of the batch")] if isinstance(event, ev.OutcomeReady) else []
        return [*handle(event, now, seen), *more]

    monkeypatch.setattr(rounds, "handle", and_more)
    out = _pump(p, p.handle(ev.OutcomeReady(1, fetch.attempt, b"theta1"), t, ALONE), t)
    assert _kinds(out) == ["Note", "Proposed", "PersistLog", "Commits", "Note", "Apply"]
    assert out[4] == ev.Note("rest of the batch")
    commits, apply = out[3], out[5]
    assert isinstance(commits, Commits) and isinstance(apply, ev.Apply)
    assert (apply.index, apply.commit) == (commits.entries[0].index, commits.entries[0].body)


def test_round_commits_made_before_attach_wait_for_the_round_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commits while the trainer starts go out as Commits only; at attach the lease cores replay
    the applied log, and the round core gets `first` and then the held round commits, in order."""
    held = RoundCommit(Round(1), (), b"theta1")
    p = _peer(trains=True, tail=[Entry(LogIndex(2), Epoch(0), held)])
    _, out = _elect(p)
    assert _kinds(out) == ["PersistHardState", "LeaderChanged", "PersistLog", "Commits"]
    rounds = _rounds()
    replayed = _spy(monkeypatch, rounds, "replay")
    handled = _spy(monkeypatch, rounds, "handle")
    first = ev.Diverged("θ on disk is not the log's")
    out = p.attach(rounds, 2.0, ALONE, first)
    assert [[e.index for e in call[0]] for call in replayed] == [[1, 2, 3]], "voter, held round, epoch start"
    assert [call[0] for call in handled] == [first, ev.Committed(2, held)]
    assert ev.CatchUp() in out, "the divergence's effects come out"
    with pytest.raises(AssertionError):
        p.attach(_rounds(), 2.0, ALONE)


def test_attach_without_first_applies_the_held_commit_and_a_peer_without_trainer_refuses_it() -> None:
    """The held round commit reaches the round core as if it had just committed (it applies θ)."""
    held = RoundCommit(Round(1), (), b"theta1")
    p = _peer(trains=True, tail=[Entry(LogIndex(2), Epoch(0), held)])
    _elect(p)
    assert ev.Apply(2, held) in p.attach(_rounds(), 2.0, ALONE)
    with pytest.raises(AssertionError):
        _peer(trains=False).attach(_rounds(), 0.0, ALONE)


def test_membership_verdicts_reach_consensus_and_the_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """ALIVE (with an address) seats the member in consensus; DEAD and LEFT mark it there. With the
    rounds attached, ALIVE goes to member_up, DEAD and LEFT to member_down, SUSPECT to
    member_suspect (their effects out); consensus keeps a suspect seated."""
    p = _peer(trains=True)
    b = SiteId("b")
    assert p.member_changed("b", MemberState.ALIVE, "addr-b", 0.0, ALONE) == [], "no rounds yet"
    assert (p.consensus.members[b].address, p.consensus.members[b].state) == ("addr-b", MemberState.ALIVE)
    rounds = _rounds()
    p.attach(rounds, 0.0, ALONE)
    ups = _spy(monkeypatch, rounds, "member_up", lambda s, now, seen: [ev.Note(f"up {s}")])
    downs = _spy(monkeypatch, rounds, "member_down", lambda s, now, seen: [ev.Note(f"down {s}")])
    suspects = _spy(monkeypatch, rounds, "member_suspect", lambda s, now, seen: [ev.Note(f"suspect {s}")])
    assert p.member_changed("b", MemberState.SUSPECT, "addr-b", 0.1, ALONE) == [ev.Note("suspect b")]
    assert ups == downs == [] and [c[0] for c in suspects] == ["b"]
    assert p.consensus.members[b].state is MemberState.ALIVE
    assert p.member_changed("b", MemberState.DEAD, "addr-b", 0.2, ALONE) == [ev.Note("down b")]
    assert p.consensus.members[b].state is MemberState.DEAD
    assert p.member_changed("b", MemberState.ALIVE, "addr-b2", 0.3, ALONE) == [ev.Note("up b")]
    assert p.consensus.members[b].address == "addr-b2"
    assert p.member_changed("b", MemberState.LEFT, "addr-b2", 0.4, ALONE) == [ev.Note("down b")]
    assert p.consensus.members[b].state is MemberState.LEFT
    assert ([c[0] for c in ups], [c[0] for c in downs]) == (["b"], ["b", "b"])


def test_a_peer_without_rounds_is_ready_to_leave_at_once_and_a_last_voter_stops_at_once() -> None:
    """No round work to end: LeaveReady at once. The last voter keeps its seat (consensus refuses):
    it says why, then LEFT, then stops with nothing to wait for."""
    p = _peer(trains=False, empty=r.EmptyRounds(1.0))
    t, _ = _elect(p)
    assert p.handle(ev.LeaveRequested(5.0), t, ALONE) == [ev.LeaveReady()]
    out = p.give_up_seat(t, ALONE)
    assert out == [ev.Note("leaving: last voter stays in the voter set: the run resumes from its disk"),
                   SayLeft(), Stop("no removal to wait for (no voter seat, or consensus refused the leave)")]


def _follower_leaving() -> tuple[PeerCore, list[Effect]]:
    """Site a follows b (epoch 1) in a voter set of two, then gives its seat up at t=1."""
    p = _peer(trains=False, voters=("a", "b"))
    start = Entry(LogIndex(3), Epoch(1), EpochStart(SiteId("b")))
    p.consensus_message(_append(1, 2, [start], 3, 1), 0.5, ALONE)
    assert p.consensus.leader == "b" and p.consensus.commit_index == 3
    return p, p.give_up_seat(1.0, ALONE)


def test_a_leaving_follower_says_left_first_and_stops_once_its_removal_committed() -> None:
    """A follower cannot remove itself: it says LEFT at once (its leader removes it on the gossip)
    and stops only once its removal committed, once."""
    p, out = _follower_leaving()
    assert out == [ev.Note("leaving: leader b removes this voter when membership reports the leave"),
                   SayLeft()]
    removal = Entry(LogIndex(4), Epoch(1), VoterChange(SiteId("a"), "addr-a", False, "left"))
    p.consensus_message(_append(1, 3, [removal], 4, 2), 2.0, ALONE)
    p.consensus_message(_append(1, 4, [], 4, 3), 2.05, ALONE)  # a heartbeat: no election timer left
    assert p.consensus.removed() and p.next_deadline(ALONE) <= 1.0 + FOLLOWER_WAIT_S, "the seat's deadline"
    assert [e for e in p.tick(2.1, ALONE) if isinstance(e, SayLeft | Stop)] == [
        Stop("its removal from the voters committed")]
    assert not [e for e in p.tick(20.0, ALONE) if isinstance(e, SayLeft | Stop)], "once"


def test_a_leaving_follower_whose_removal_never_commits_stops_after_the_follower_wait() -> None:
    """The follower's wait is bounded by follower_wait_s (not the leader's shorter wait)."""
    p, out = _follower_leaving()
    assert out[-1] == SayLeft()
    assert p.next_deadline(ALONE) <= 1.0 + FOLLOWER_WAIT_S
    before = 1.0 + FOLLOWER_WAIT_S - 0.01
    assert not [e for e in p.tick(before, ALONE) if isinstance(e, Stop)], "past the leader's wait only"
    assert [e for e in p.tick(1.0 + FOLLOWER_WAIT_S, ALONE) if isinstance(e, SayLeft | Stop)] == [
        Stop("its removal did not commit in time; stopping anyway")]


def test_a_leader_change_reaches_the_rounds_and_the_executor(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease cores and the round leader learn of each leader change from consensus, and the
    executor still gets LeaderChanged (it logs it, and the node's status reads it)."""
    p = _peer(trains=True)
    rounds = _rounds()
    p.attach(rounds, 0.0, ALONE)
    heard = _spy(monkeypatch, rounds, "leader_changed")
    _, out = _elect(p)
    assert heard == [("a", 1)]
    assert ce.LeaderChanged(SiteId("a"), Epoch(1)) in out


def test_a_removal_that_commits_by_message_makes_the_seat_due_now() -> None:
    """Once the removal committed (by a message, which no timer follows) the next tick stops the
    peer, so the deadline is now, not the end of the follower wait."""
    p, _ = _follower_leaving()
    removal = Entry(LogIndex(4), Epoch(1), VoterChange(SiteId("a"), "addr-a", False, "left"))
    p.consensus_message(_append(1, 3, [removal], 4, 2), 2.0, ALONE)
    p.consensus_message(_append(1, 4, [], 4, 3), 2.05, ALONE)  # the leader's next heartbeat
    assert p.consensus.removed()
    assert p.next_deadline(ALONE) <= 2.05
    assert p.tick(2.05, ALONE) == [Stop("its removal from the voters committed")]


def _lead_with_b(p: PeerCore, view: View) -> tuple[float, list[Effect]]:
    """"a" wins epoch 1 with "b"'s votes; when, and what it sent."""
    t = p.consensus.next_deadline()
    p.tick(t, view)  # pre-vote
    p.consensus_message(VoteReply(Header(SiteId("b"), "addr-b", Epoch(0), 0), Epoch(1), True, True, "granted"), t, view)
    out = p.consensus_message(VoteReply(Header(SiteId("b"), "addr-b", Epoch(1), 0), Epoch(1), True, False, "granted"),
                              t, view)
    assert p.consensus.role is Role.LEADER
    return t, out


def _acks(p: PeerCore, sent: Sequence[Effect], now: float, view: View) -> list[Effect]:
    """Every AppendEntries in `sent` acked by its receiver; what "a" does on them."""
    out: list[Effect] = []
    for e in sent:
        if isinstance(e, ce.Send) and isinstance(e.msg, AppendEntries):
            last = e.msg.prev_index + len(e.msg.entries)
            out += p.consensus_message(AppendReply(Header(e.to, f"addr-{e.to}", Epoch(1), 0), True, LogIndex(last),
                                                   e.msg.seq, "ok"), now, view)
    return out


def test_a_voter_that_joins_without_a_trainer_is_logged_as_one() -> None:
    """Membership labels tell a trainer-less member apart (View.trainerless); its join's VoterChange
    carries that into the log, where the lease cores and `ops audit` leave it out of the ring."""
    p = _peer(trains=True)
    t, _ = _elect(p)
    view = View(frozenset({"a", "w", "x"}), applied_round=0, weights_hash=THETA0, trainerless=frozenset({"w"}))
    p.member_changed("w", MemberState.ALIVE, "addr-w", t, view)
    p.member_changed("x", MemberState.ALIVE, "addr-x", t, view)
    out = p.tick(t + 0.1, view)
    for _ in range(6):  # the followers ack what they are sent; the leader adds them one at a time
        out = _acks(p, out, t + 0.2, view) + p.tick(t + 0.3, view)
        t += 0.2
    joins = {e.body.site: e.body.trainerless for e in p.consensus.log.entries
             if isinstance(e.body, VoterChange) and e.body.reason == "join"}
    assert joins == {"w": True, "x": False}, joins


def test_a_voter_without_a_trainer_hands_a_lead_it_won_to_a_trainer() -> None:
    """A trainer-less voter (the coordinator) that leads opens no training round: it commits empty
    ones. Where another voter trains, it stands back as a leaving peer does: it hands a lead it won
    to that voter once it holds the whole log. In a run of trainer-less peers alone it leads on."""
    founders = {SiteId("a"): "addr-a", SiteId("b"): "addr-b"}
    consensus = ConsensusCore.start(SiteId("a"), "addr-a", RAFT, DurableState(
        HardState(Epoch(0), None), EMPTY_SNAPSHOT, bootstrap_entries(founders, frozenset({SiteId("a")}))), 0.0,
        random.Random(0))
    p = PeerCore(consensus, trains=False, empty=r.EmptyRounds(1.0), leader_wait_s=LEADER_WAIT_S,
                 follower_wait_s=FOLLOWER_WAIT_S)
    two = View(frozenset({"a", "b"}), applied_round=0, weights_hash=THETA0, trainerless=frozenset({"a"}))
    first = p.consensus.next_deadline()
    p.tick(first, two)
    assert p.consensus.standing_back and p.consensus.next_deadline() >= first + RAFT.election_timeout_max_s, \
        "b trains: a campaigns only after b could have"
    t, sent = _lead_with_b(p, two)  # b's timer did not fire (cut off, say): a won
    out = _acks(p, sent, t + 0.01, two)  # b holds the whole log
    out += p.tick(t + 0.02, two)
    handed = [e for e in out if isinstance(e, ce.Send) and isinstance(e.msg, TimeoutNow)]
    assert [e.msg.successor for e in handed] == ["b"] and p.consensus.role is Role.FOLLOWER, out

    alone = _peer(trains=False, voters=("a", "b"))  # b has no trainer either
    t, sent = _lead_with_b(alone, View(frozenset({"a", "b"}), applied_round=0, weights_hash=THETA0))
    assert not alone.consensus.standing_back and alone.consensus.role is Role.LEADER


@pytest.mark.parametrize("trainerless", [True, False])
def test_a_round_neither_opens_for_nor_waits_on_a_voter_without_a_trainer(trainerless: bool) -> None:
    """w is a live voter that trains nothing (a long-lived coordinator): a's report alone decides the
    round. Counted as a site that trains, w would hold every round to its deadline (a soak with
    such a voter: every round's decision waited for it)."""
    p = _peer(trains=True)
    p.attach(_rounds(), 0.0, ALONE)
    view = View(frozenset({"a", "w"}), applied_round=0, weights_hash=THETA0,
                trainerless=frozenset({"w"}) if trainerless else frozenset())
    t = p.consensus.next_deadline()
    out = _pump(p, p.tick(t, view), t)
    (opened,) = [e.msg for e in out if isinstance(e, r.Broadcast)]
    _pump(p, p.round_message(opened, t, view), t)
    train: list[ev.Train] = []
    while not train:
        t += 0.1
        train = [e for e in _pump(p, p.tick(t, view), t) if isinstance(e, ev.Train)]
    (report,) = [e for e in _pump(p, p.handle(ev.TrainDone(1, train[0].ranges, 160, b"root-a"), t, view), t)
                 if isinstance(e, ev.SendReport)]
    decided = [e for e in _pump(p, p.round_message(report.contribution, t, view), t) if isinstance(e, ev.Fetch)]
    assert bool(decided) is trainerless


def test_a_leader_whose_leave_begins_hands_over_to_a_voter_that_is_not_leaving() -> None:
    """LeaveRequested reaches consensus first, with membership's LEAVING label: the leader steps
    down and names a staying voter (not c, which leaves too) before the rounds hear of the leave."""
    p = _peer(trains=False, voters=("a", "b", "c"))
    three = View(frozenset({"a", "b", "c"}), applied_round=0, weights_hash=THETA0)
    t, sent = _lead_with_b(p, three)
    _acks(p, sent, t + 0.01, three)
    leaving_c = View(three.live, frozenset({"c"}), applied_round=0, weights_hash=THETA0)
    out = p.handle(ev.LeaveRequested(5.0), t + 0.02, leaving_c)
    handed = [e for e in out if isinstance(e, ce.Send) and isinstance(e.msg, TimeoutNow)]
    assert sorted(e.to for e in handed) == ["b", "c"] and {e.msg.successor for e in handed} == {"b"}, out
    assert p.consensus.role is Role.FOLLOWER and out[-1] == ev.LeaveReady()


def test_a_round_decided_while_the_lease_lapsed_is_held_and_proposed_when_acks_come_back() -> None:
    """b's acks lag past a's lease but within the election timeout (a loaded machine): a keeps the
    lead and holds the round it decided (refused now, it would be decided again) until b acks; a
    held round whose leader loses the lead is given up."""
    p = _peer(trains=False, voters=("a", "b"), empty=r.EmptyRounds(0.1))
    two = View(frozenset({"a", "b"}), applied_round=0, weights_hash=THETA0)
    t, sent = _lead_with_b(p, two)
    sent += _acks(p, sent, t, two)  # the EpochStart commits
    lapsed = t + RAFT.lease_s + 0.05  # b silent since t: no lease, but within the election timeout
    out = p.tick(lapsed, two)
    held = [e for e in out if isinstance(e, Proposed)]
    assert len(held) == 1 and not held[0].accepted and "held until a majority acks again" in held[0].reason, out
    assert p.consensus.role is Role.LEADER
    again = p.tick(lapsed + RAFT.heartbeat_interval_s, two)  # a heartbeat goes out
    assert not [e for e in again if isinstance(e, Proposed)], "held once, not decided again"
    out = _acks(p, out + again, lapsed + RAFT.heartbeat_interval_s + 0.01, two)  # b acks again: the lease is back
    proposed = [e for e in out if isinstance(e, Proposed)]
    assert proposed == [Proposed(held[0].commit, True, proposed[0].reason)] and proposed[0].accepted, out

    q = _peer(trains=False, voters=("a", "b"), empty=r.EmptyRounds(0.1))
    t, sent = _lead_with_b(q, two)
    _acks(q, sent, t, two)
    lapsed = t + RAFT.lease_s + 0.05
    assert any(isinstance(e, Proposed) and not e.accepted for e in q.tick(lapsed, two))
    out = q.tick(t + RAFT.election_timeout_max_s + 0.01, two)  # check-quorum: the lead is lost
    assert q.consensus.role is Role.FOLLOWER
    assert [e.reason for e in out if isinstance(e, Proposed)] == ["the lead was lost before a majority acked again"]
