"""One peer's protocol, sans I/O: consensus, the round protocol and the seat's half of a leave, routed.

A peer runs the commit log (`ConsensusCore`), the outer rounds (`PeerRounds`: the lease cores, the
round leader and the round core) and, while it leaves, the voter seat's half of the leave
(`SeatLeave`). How they talk to each other is protocol, so it lives here once:

- membership's verdicts reach consensus (a voter is added, removed, dead) and the rounds (the open
  round stops waiting for a dead site, resends its open to one back up);
- the leader changing reaches the rounds (the lease cores learn the epoch, a deposed leader stops);
- the leader's `Propose` goes to the log, and what consensus said back to the round leader;
- committed entries reach the rounds in log order, after the commit index is made durable;
- a peer without a trainer (`peer serve --round-interval`) commits empty rounds while it leads;
- a leave: the rounds first (`LeaveRequested` ... `LeaveReady`), then the seat (`give_up_seat`).

What the round protocol sees of consensus (leading, epoch, committed round, leader) is read here;
what membership and the disk say comes in with every call as a `View`. The node's executor
(peer/node.py with peer/coordinator.py) and the whole-peer simulator (peer/sim/peer_node.py) run
this class's effects; neither routes anything between the cores itself. Membership stays its own
core: the whole-peer simulator models its verdicts (peer/sim/peer_world.py) and the membership
simulator runs the real one.

Effects come out in the order they are to run: consensus's (persist before any later send), then
`Commits` and the round protocol's effects of those entries. A proposal that commits at once
(a single voter) adds its entries' effects after the rest of the batch that proposed it.

    .venv/bin/python -m pytest -q tests/unit/test_peer_core.py
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Union

from peer.core import consensus_effects as ce
from peer.core import events as ev
from peer.core import rounds as r
from peer.core.commitlog import Entry, RoundCommit
from peer.core.consensus import ConsensusCore
from peer.core.consensus import Message as ConsensusMessage
from peer.core.election import Role
from peer.core.ids import SiteId
from peer.core.lease_types import Message as LeaseMessage
from peer.core.membership_types import MemberState
from peer.core.peer_rounds import Effect as RoundsEffect
from peer.core.peer_rounds import PeerRounds, Seen
from peer.core.seat_leave import SayLeft, SeatLeave, Stop


@dataclass(frozen=True)
class View:
    """What membership and the disk say at the moment of a call."""

    live: frozenset[str]
    """The sites membership counts live (alive or suspect), this one included."""
    leaving: frozenset[str] = frozenset()
    """Live sites whose graceful leave has started (membership's `LEAVING` label)."""
    applied_round: int = 0
    """The round whose θ this peer holds (a peer without a trainer: unused)."""
    weights_hash: bytes = b""
    """The hash of that θ."""
    trainerless: frozenset[str] = frozenset()
    """Live sites without a trainer (no training identity in their membership labels): voters only,
    so no round is opened for them or waits for their report."""


@dataclass(frozen=True)
class Commits:
    """Effect: consensus committed these entries, in log order. Make the commit index durable
    before anything acts on them; the round protocol's effects of them follow."""

    entries: tuple[Entry, ...]


@dataclass(frozen=True)
class Proposed:
    """Effect: the leader's decision of a round went to the log, or consensus refused it (`reason`)."""

    commit: RoundCommit
    accepted: bool
    reason: str


ConsensusEffect = Union[ce.Send, ce.PersistHardState, ce.PersistLog, ce.PersistSnapshot, ce.SnapshotInstalled,
                        ce.LeaderChanged, ce.Rejected]
"""Consensus's effects as they come out of here: its `Committed` become one `Commits` per batch."""
Effect = Union[ConsensusEffect, RoundsEffect, Commits, Proposed, SayLeft, Stop]


class PeerCore:
    """Consensus, the round protocol and a leave's seat of one peer, behind one event router."""

    def __init__(self, consensus: ConsensusCore, *, trains: bool, empty: r.EmptyRounds | None = None,
                 leader_wait_s: float, follower_wait_s: float) -> None:
        """`trains`: the round protocol is attached once the trainer started (`attach`); until then
        committed entries wait for it. `empty`: a peer without a trainer commits empty rounds.
        `leader_wait_s`, `follower_wait_s`: how long a leave waits for its removal (SeatLeave)."""
        self.consensus = consensus
        self.rounds: PeerRounds | None = None
        self._trains = trains
        self._empty = empty
        self._waiting: list[ev.Event] = []
        """Round commits consensus made before the round protocol was attached, for its round core."""
        self._seat: SeatLeave | None = None
        self._seat_waits = (leader_wait_s, follower_wait_s)
        self._held: RoundCommit | None = None
        """A round this leader decided while its lease had lapsed (its voters' acks lag, the lead is
        not lost yet: ElectionConfig.quorum_window_s): proposed once a majority acks again, given
        up with the lead. Refused at once, the round would be reopened and decided again."""

    # ----- what the executor asks -------------------------------------------------------------
    def next_deadline(self, view: View) -> float:
        """When `tick` next has something to do on its own (-inf: now; inf: on events only)."""
        times = [self.consensus.next_deadline()]
        if self.rounds is not None:
            times.append(self.rounds.next_deadline(self._seen(view)))
        elif self._empty is not None:
            times.append(self._empty.next_deadline(self.consensus.role is Role.LEADER))
        if self._seat is not None:
            times.append(self._seat.next_deadline(self.consensus.removed()))
        return min(times)

    def last_round_entry(self, upto: int | None = None) -> tuple[int, int, bytes]:
        """(round, index, θ hash) of the newest round entry at or below `upto` (default: committed)."""
        return self.consensus.log.last_round_entry(self.consensus.commit_index if upto is None else upto)

    # ----- inputs -----------------------------------------------------------------------------------
    def attach(self, rounds: PeerRounds, now: float, view: View, first: ev.Event | None = None) -> list[Effect]:
        """The trainer started: the round protocol joins. Its lease cores replay the applied part of
        the log (θ is on disk already); its round core gets `first` (a divergence found at start)
        and then the commits that came while the trainer started."""
        assert self.rounds is None and self._trains, "attach once, on a peer that trains"
        log = self.consensus.log
        applied = [log.entry(i) for i in range(log.snapshot.last_index + 1, self.consensus.applied_index + 1)]
        rounds.leases.note_leader_epoch(self.consensus.hard.epoch)
        self.rounds = rounds
        out = self._drain(rounds.replay([e for e in applied if e is not None], now), now, view)
        waiting, self._waiting = ([first] if first is not None else []) + self._waiting, []
        for event in waiting:
            out += self.handle(event, now, view)
        return out

    def tick(self, now: float, view: View) -> list[Effect]:
        self._note_leaving(view)
        self._defer_to_trainers(now)
        out = self._consensus(self.consensus.tick(now), now, view)
        if self._seat is not None:
            out += self._seat.update(now, self.consensus.removed())
        if self.rounds is not None:
            out += self._drain(self.rounds.tick(now, self._seen(view)), now, view)
        elif self._empty is not None:
            leading = self.consensus.role is Role.LEADER
            if self._held is None and self._empty.next_deadline(leading) <= now:  # not due: spare reading the log
                committed, _, weights = self.last_round_entry()
                commit = self._empty.tick(now, leading, committed, weights)
                if commit is not None:
                    out += self._propose(commit, now, view, deque())
        return out

    def consensus_message(self, msg: ConsensusMessage, now: float, view: View) -> list[Effect]:
        self._note_leaving(view)  # a commit of this leader's removal hands over to a staying voter
        return self._consensus(self.consensus.receive(msg, now), now, view)

    def round_message(self, msg: r.Message, now: float, view: View) -> list[Effect]:
        if self.rounds is None:
            return []
        return self._drain(self.rounds.round_message(msg, now, self._seen(view)), now, view)

    def lease_message(self, msg: LeaseMessage, now: float, view: View) -> list[Effect]:
        if self.rounds is None:
            return []
        return self._drain(self.rounds.lease_message(msg, now, self._seen(view)), now, view)

    def member_changed(self, site: str, state: MemberState, address: str, now: float, view: View) -> list[Effect]:
        """Membership's verdict on `site`: consensus adds, marks or removes the voter; the rounds
        stop waiting for a site DEAD or LEFT, stop fetching from a SUSPECT one, and resend an open
        to one (back) ALIVE (a one-way
        open sent while it restarted is lost, docs/decisions/rounds-open-resend.md)."""
        self.consensus.member_changed(SiteId(site), state, address, trains=site not in view.trainerless)
        if self.rounds is None:
            return []
        if state in (MemberState.DEAD, MemberState.LEFT):
            return self._drain(self.rounds.member_down(site, now, self._seen(view)), now, view)
        if state is MemberState.ALIVE:
            return self._drain(self.rounds.member_up(site, now, self._seen(view)), now, view)
        if state is MemberState.SUSPECT:
            return self._drain(self.rounds.member_suspect(site, now, self._seen(view)), now, view)
        return []

    def handle(self, event: ev.Event, now: float, view: View) -> list[Effect]:
        """An event for the round protocol: a completion (TrainDone, Persisted ...) or `LeaveRequested`.
        A peer without rounds has no round work to end: its leave is ready at once."""
        out: list[Effect] = []
        if isinstance(event, ev.LeaveRequested):
            # A leaving leader opens no round: a staying voter leads (a hand-over, now if one holds
            # the whole log, else at a later tick) or, if this peer does not lead, wins the next election.
            self.consensus.stand_back(now)
            self._note_leaving(view)
            out = self._consensus(self.consensus.tick(now), now, view)
        if self.rounds is None:
            if isinstance(event, ev.LeaveRequested):
                return [*out, ev.LeaveReady()]
            if self._trains:  # the trainer is starting: the round core gets it at attach
                self._waiting.append(event)
            return out
        return out + self._drain(self.rounds.handle(event, now, self._seen(view)), now, view)

    def give_up_seat(self, now: float, view: View) -> list[Effect]:
        """The rounds' half of a leave is done (`LeaveReady`, and the executor's sends of it are out):
        hand the voter seat back through the log; `SayLeft` and `Stop` follow (SeatLeave)."""
        voter = self.consensus.is_voter()
        answer = self.consensus.leave(now)
        out: list[Effect] = [ev.Note(f"leaving: {answer.reason}")]
        out += self._consensus(answer.effects, now, view)
        self._seat = SeatLeave(answer.accepted, voter, self.consensus.role is Role.LEADER, now, *self._seat_waits)
        return out + self._seat.update(now, self.consensus.removed())

    # ----- routing ----------------------------------------------------------------------------
    def _defer_to_trainers(self, now: float) -> None:
        """A voter without a trainer opens no training round (it commits empty ones): where some voter
        trains, it stands back as a leaving peer does, campaigning only after a trainer could have,
        and handing a lead it won to a trainer that caught up (docs/decisions/leases-trainerless-voter.md)."""
        if self._trains or self.consensus.standing_back:
            return
        log = self.consensus.log
        if any(site != self.consensus.site and site not in log.trainerless() for site, _ in log.voters()):
            self.consensus.stand_back(now)

    def _note_leaving(self, view: View) -> None:
        self.consensus.leaving_members = frozenset(SiteId(s) for s in view.leaving & view.live)

    def _seen(self, view: View) -> Seen:
        status = self.consensus.status()
        return Seen(status.role is Role.LEADER, status.epoch, status.committed_round, view.applied_round,
                    view.weights_hash, view.live - view.trainerless, view.leaving & view.live, status.leader)

    def _drain(self, effects: Sequence[RoundsEffect], now: float, view: View) -> list[Effect]:
        """The round protocol's effects in order; a `Propose` is answered here, and the effects of
        what it commits at once run after the rest (as they would had the commit come later)."""
        out: list[Effect] = []
        queue: deque[RoundsEffect] = deque(effects)
        while queue:
            effect = queue.popleft()
            if isinstance(effect, ev.Propose):
                out += self._propose(effect.commit, now, view, queue)
            else:
                out.append(effect)
        return out

    def _propose(self, commit: RoundCommit, now: float, view: View,
                 queue: deque[RoundsEffect]) -> list[Effect]:
        answer = self.consensus.propose_round(commit, now)
        lease = self.consensus.status().lease_expiry
        if not answer.accepted and lease is not None and now >= lease:
            self._held = commit
            return [Proposed(commit, False, f"{answer.reason}; held until a majority acks again")]
        if self.rounds is not None:
            self.rounds.proposed(answer.accepted)
        out: list[Effect] = [Proposed(commit, answer.accepted, answer.reason)]
        return out + self._consensus(answer.effects, now, view, queue)

    def _release_held(self, now: float, view: View, queue: deque[RoundsEffect] | None) -> list[Effect]:
        """The held round (`_held`): proposed once the lease is back, given up once the lead is lost."""
        held = self._held
        if held is None or (self.consensus.role is Role.LEADER and self.consensus.not_ready(now) is not None):
            return []
        self._held = None
        if self.consensus.role is not Role.LEADER:
            if self.rounds is not None:
                self.rounds.proposed(False)
            return [Proposed(held, False, "the lead was lost before a majority acked again")]
        into: deque[RoundsEffect] = deque() if queue is None else queue
        out = self._propose(held, now, view, into)
        return out if queue is not None else out + self._drain(list(into), now, view)

    def _consensus(self, effects: Sequence[ce.Effect], now: float, view: View,
                   queue: deque[RoundsEffect] | None = None) -> list[Effect]:
        """Consensus's effects in order, then `Commits` and the round protocol's effects of them
        (appended to `queue` instead when a round effect being drained proposed), then the held
        round's proposal if the lease is back."""
        out = self._consensus_effects(effects, now, view, queue)
        return out + self._release_held(now, view, queue)

    def _consensus_effects(self, effects: Sequence[ce.Effect], now: float, view: View,
                           queue: deque[RoundsEffect] | None) -> list[Effect]:
        out: list[Effect] = []
        committed: list[Entry] = []
        for effect in effects:
            if isinstance(effect, ce.Committed):
                committed.append(effect.entry)
                continue
            if isinstance(effect, ce.LeaderChanged) and self.rounds is not None:
                self.rounds.leader_changed(effect.leader, effect.epoch)
            out.append(effect)
        if not committed:
            return out
        out.append(Commits(tuple(committed)))
        if self.rounds is None:
            if self._trains:
                self._waiting += [ev.Committed(e.index, e.body) for e in committed if isinstance(e.body, RoundCommit)]
            return out
        follow = self.rounds.entries(committed, now, self._seen(view))
        if queue is not None:
            queue.extend(follow)
            return out
        return out + self._drain(follow, now, view)
