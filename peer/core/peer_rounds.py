"""One peer's whole round protocol, sans I/O: its lease cores, the leader's half and the site's half, routed.

A peer runs three cores for the outer rounds: the DARL lease cores fed from the log
(peer/core/lease_log.py), the leader's `RoundLeader` (peer/core/rounds.py, acting only while this
peer leads) and the site's `RoundCore` (peer/core/round_core.py: gather, train, claim, report, the
leader's fetch, applying the log, leave). Which event goes to which core, in what order, and how
the leader's `Decide` becomes the fetch is protocol, so it lives here once. `PeerCore`
(peer/core/peer_core.py) holds it beside consensus and routes consensus's news to it; the node and
the whole-peer simulator execute their effects, and neither routes anything itself.

What consensus, membership and the disk say at the moment of a call comes in as a `Seen`; what
to do goes out as effects: the round cores' (`peer.core.events`), the lease cores' (`Send`,
`LeaseEvent`), and the leader's `Broadcast`, `SendOpen` and `EpochComplete`.

    .venv/bin/python -m pytest -q tests/unit/test_peer_rounds.py
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Union

from peer.core import events as ev
from peer.core import rounds as r
from peer.core.commitlog import Entry, RoundCommit
from peer.core.election import Header
from peer.core.ids import Epoch, SiteId
from peer.core.lease_log import Effect as LeaseEffect
from peer.core.lease_log import LeaseLog
from peer.core.lease_types import Message as LeaseMessage
from peer.core.round_core import RoundCore
from peer.core.site_round import SiteRound
from peer.core.timeline import RoundClock

Effect = Union[ev.Effect, ev.SendReport, LeaseEffect, r.Broadcast, r.SendOpen, r.EpochComplete, r.Reported]


@dataclass(frozen=True)
class Seen:
    """What the executor's consensus, membership and disk say at the moment of a call."""

    leading: bool
    """Consensus says this peer is the leader of `epoch`."""
    epoch: int
    """The newest leader epoch consensus knows: round messages of older epochs are refused."""
    committed_round: int
    """The newest round committed in the log."""
    applied_round: int
    """The round whose θ this peer holds."""
    weights_hash: bytes
    """The hash of that θ (a round opened here is trained from it)."""
    live: frozenset[str]
    """The sites membership counts live (alive or suspect): a round is opened for them."""
    leaving: frozenset[str] = frozenset()
    """Live sites whose graceful leave has started (membership's `LEAVING` label)."""
    leader: str | None = None
    """The leader of `epoch` as consensus knows it (None: none known); reports go there."""


class PeerRounds:
    """The lease cores, the round leader and the round core of one peer, behind one event router."""

    def __init__(self, site: str, address: str, config: r.RoundsConfig, leases: LeaseLog, claim_wait_s: float,
                 clock: RoundClock, applied_round: int, weights_hash: bytes) -> None:
        self.site, self.address = site, address
        self.leases = leases
        self.leader = r.RoundLeader(config, leases.ledger, leases.credit)
        self.core = RoundCore(SiteRound(site, address, config, claim_wait_s, leases.client, clock,
                                        applied_round, weights_hash))
        self.clock = clock
        self._nobody_stays = False
        """The last `NobodyStays` the round core was told (only while this peer leaves)."""
        self._opened: tuple[int, float] | None = None
        """(round, when its open came) of the last round another leader opened (RoundLeader.observed)."""

    @property
    def leaving(self) -> bool:
        """A graceful leave was asked for (the site's half keeps the flag)."""
        return self.core.site.leaving

    # ----- what the executor asks -------------------------------------------------------------
    def may_open(self, seen: Seen) -> bool:
        """The leader half may open round committed_round + 1 now (RoundCore.may_open); a leaving
        peer opens none: it would decide a round after its own removal."""
        return not self.leaving and self.core.may_open(seen.leading, seen.applied_round, seen.committed_round)

    def _ticks_leader(self, seen: Seen) -> bool:
        """The leader half has something to tick: a round to open, or an open round to close at its
        deadline (also while this peer leaves: else a report lost on the way would keep that round
        open for ever when every site leaves at once, since no leader that stays would reopen it)."""
        return self.may_open(seen) or (seen.leading and self.leader.collecting)

    def next_deadline(self, seen: Seen) -> float:
        """When `tick` next has something to do on its own (-inf: now; inf: on events only)."""
        times = [self.core.next_deadline(), self.leases.next_deadline()]
        if self._ticks_leader(seen):
            times.append(self.leader.next_deadline())
        return min(times)

    # ----- events --------------------------------------------------------------------------------
    def replay(self, entries: Sequence[Entry], now: float) -> list[Effect]:
        """The applied part of the log at a start: the lease cores only (θ is on disk already)."""
        return list(self.leases.apply_entries(entries, now))

    def tick(self, now: float, seen: Seen) -> list[Effect]:
        out: list[Effect] = []
        if self.leader.done:
            out += self.leases.release_all(now)  # nothing left to train: lease no more
        out += self.leases.tick(now)
        out += self.handle(ev.Tick(), now, seen)
        if self._ticks_leader(seen):
            header = Header(SiteId(self.site), self.address, Epoch(seen.epoch), seen.committed_round)
            out += self._lead(self.leader.tick(now, header, seen.committed_round, sorted(seen.live),
                                               seen.weights_hash, open_new=self.may_open(seen)), now, seen)
        return out

    def entries(self, entries: Sequence[Entry], now: float, seen: Seen) -> list[Effect]:
        """Committed log entries, in order: the lease ledger and views at once, θ by the apply queue."""
        out: list[Effect] = list(self.leases.apply_entries(entries, now))
        for entry in entries:
            if isinstance(entry.body, RoundCommit):
                if not seen.leading and self._opened is not None and self._opened[0] == entry.body.round:
                    self.leader.observed(entry.body.round, now - self._opened[1])
                self.leader.on_commit(entry.body.round)
                self.clock.committed(entry.body.round, now)
                out += self.handle(ev.Committed(entry.index, entry.body), now, seen)
        return out

    def round_message(self, msg: r.Message, now: float, seen: Seen) -> list[Effect]:
        """A round message from a peer: refused if its epoch is stale (a deposed leader's open)."""
        if msg.header.epoch < seen.epoch:
            return [ev.Note(f"refused {type(msg).__name__} of round {msg.round} from {msg.header.from_site}: "
                            f"stale epoch {msg.header.epoch} < {seen.epoch}")]
        if isinstance(msg, r.RoundOpen):
            if not seen.leading:
                self._opened = (msg.round, now)
                self.leader.opened_elsewhere()
            return self.handle(ev.Opened(msg), now, seen)
        if isinstance(msg, r.RunComplete):
            # Only the leader this peer knows may say so: the claim ends a leaving site's wait.
            if (msg.header.from_site, msg.header.epoch) != (seen.leader, seen.epoch):
                return [ev.Note(f"refused RunComplete of round {msg.round} from {msg.header.from_site}: "
                                f"not the leader of epoch {seen.epoch} ({seen.leader or 'none known'})",
                                warning=True)]
            return self.handle(ev.RunCompleted(msg.round), now, seen)
        if seen.leading:
            return self._lead(self.leader.receive(msg, now), now, seen)
        return []

    def lease_message(self, msg: LeaseMessage, now: float, seen: Seen) -> list[Effect]:
        return [*self.leases.receive(msg, now), *self.handle(ev.LeasesChanged(), now, seen)]

    def member_down(self, site: str, now: float, seen: Seen) -> list[Effect]:
        """Membership declared `site` DEAD or LEFT: the open round stops waiting for it, and a
        decision that is fetching its pseudo-gradient drops it at once instead of retrying."""
        out = self._lead(self.leader.member_down(site, now), now, seen) if seen.leading else []
        return out + self.handle(ev.MemberDown(site), now, seen)

    def member_suspect(self, site: str, now: float, seen: Seen) -> list[Effect]:
        """Membership suspects `site`: a decision fetching its pseudo-gradient drops it at once."""
        return self.handle(ev.MemberSuspect(site), now, seen)

    def member_up(self, site: str, now: float, seen: Seen) -> list[Effect]:
        """Membership saw `site` come (back) up (ALIVE again, or a new process of it): the open
        round's leader sends it the open again if it still waits for its report (a one-way open
        sent while the site restarted is lost, docs/decisions/rounds-open-resend.md)."""
        out = self._lead(self.leader.member_up(site, now), now, seen) if seen.leading else []
        return out + self.handle(ev.MemberUp(site), now, seen)

    def leader_changed(self, leader: str | None, epoch: int) -> None:
        self.leases.note_leader_epoch(epoch)
        if leader != self.site:
            self.leader.step_down()

    def proposed(self, accepted: bool) -> None:
        """What consensus said to a `Propose`: refused means this peer no longer leads."""
        if not accepted:
            self.leader.step_down()

    def handle(self, event: ev.Event, now: float, seen: Seen) -> list[Effect]:
        """An event for the round core: a completion (TrainDone, Persisted, ...), a leave, a tick."""
        out: list[Effect] = []
        if isinstance(event, ev.LeaveRequested):
            if seen.leading:
                # A leaving leader must not commit its own pseudo-gradient: once it is gone nobody
                # else holds it (every other peer fetches it to apply the round), and no round after
                # would open to prove a staying peer has θ (docs/decisions/rounds-leaving-leader.md).
                out += self._lead(self.leader.withdraw(self.site, now), now, seen)
        out += self.core.handle(event, now)
        out = self._all_leave(out, now, seen) if self.leaving else out
        return [self._addressed(e, seen) for e in out]

    def _addressed(self, effect: Effect, seen: Seen) -> Effect:
        """A report goes to the leader consensus knows now, under its epoch: the leader may have
        changed while the site trained (a successor reopens the same round)."""
        if not isinstance(effect, ev.Report):
            return effect
        c = effect.contribution
        return ev.SendReport(replace(c, header=replace(c.header, epoch=Epoch(seen.epoch))), seen.leader)

    def _all_leave(self, out: list[Effect], now: float, seen: Seen) -> list[Effect]:
        """While this peer leaves: tell the round core whether a round after its last can still
        open (`NobodyStays`, whenever that changes). None can once every other live member is
        leaving too (membership's `LEAVING` label; a leaving leader opens none), unless this peer
        leads one open or decided already, whose commit ends the wait anyway
        (docs/decisions/rounds-open-resend.md)."""
        leads_one = seen.leading and (self.leader.in_progress or self.core.decision.deciding)
        nobody = not leads_one and not seen.live - seen.leaving - {self.site}
        if nobody != self._nobody_stays:
            self._nobody_stays = nobody
            out += self.core.handle(ev.NobodyStays(nobody), now)
        return out

    # ----- the leader's effects -------------------------------------------------------------------
    def _lead(self, effects: Sequence[r.Effect], now: float, seen: Seen) -> list[Effect]:
        out: list[Effect] = []
        for e in effects:
            if isinstance(e, r.Decide):
                out += self.handle(ev.DecideRound(e, seen.live), now, seen)
            else:
                out.append(e)
        return out
