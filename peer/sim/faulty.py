"""A faulty site for the whole-peer simulator: a holder of a certificate of the run that sends
protocol-valid but false messages (issue 38, `--faults faulty`).

Each seed draws whether the faulty site is a member (one of the run's sites, running the honest
cores, whose modified build also lies) or a site that never joined (a certificate of the run, no
process in the mesh). At seeded times it sends honest peers, through the simulated network, one of
the lies issue 38 found (`PROBES`); every name in them that the transport's guard checks against the
certificate (a header's `from_site`, a report's `site`) is its own, as mutual TLS forces:

* consensus: an InstallSnapshot far ahead (10^6, voters: itself) from a site that never joined, or
  a malformed one (no voters, an epoch above its own) from a member; an AppendReply that acks
  10^6 beyond the leader's log; an AppendEntries or RequestVote at 2^62 or EPOCH_LIMIT + 1, or far
  more than MAX_EPOCH_JUMP above the epoch it knows; a malformed batch (not consecutive, an entry of
  an epoch above its header's, a previous epoch above it); an entry that contradicts one the
  receiver committed (an epoch-start index, rewritten at the epoch before it); a TimeoutNow from a
  member that does not lead, naming itself the successor (it would void the real leader's lease);
* membership: a Ping relaying "c LEFT / DEAD / SUSPECT" about an honest c at 2^62, 2^61 (nobody
  could refute it) or more than 2^60 (a jump from a third party);
* rounds, a member only: its own report with 10x the tokens its samples hold, or with samples of a
  block whose primary is another site, vouched by a voucher it wrote itself (signed with its own
  key as that primary's, or naming itself the owner).

What Raft and SWIM cannot refuse is not sent: a voter's well-formed entries at a plausible epoch,
a member's epoch at a joiner with no voters yet (nothing to compare it with) or at a peer whose voter
set it alone is a majority of (a voter left alone by `ops leave`), and an accusation
within 1000 of what peers hold are believed by design (docs/decisions/
security-consensus-standing.md, security-membership-counters.md), so a contradicting entry goes only
to peers that committed its index, and a member's epoch jump only to peers with voters of which it
is not a majority alone. Every rumour and every forged report sent must be refused; the
consensus lies are refused as IMPLAUSIBLE (or, sent at an epoch a receiver left, as STALE).

The simulator counts what was sent and refused per probe (`sent`, `refused`), never flags a refusal
of the faulty site's message, never checks the faulty site itself, and flags: any honest message
refused as implausible (as without this fault), a rumour of it believed, and a forged report
committed or a share of tokens above its samples. The simulator's membership is the world's
verdicts, so honest peers hear the faulty site's Pings with a real membership core that hears
nobody else (`FaultySite.heard`).

    ops simulate --protocol peer --members 5 --seeds 0:20 --faults faulty
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from peer.core import membership as m
from peer.core import rounds as r
from peer.core.commitlog import AppendEntries, AppendReply, EpochStart, Entry, InstallSnapshot, Snapshot
from peer.core.consensus import ConsensusCore
from peer.core.consensus_checks import EPOCH_LIMIT, MAX_EPOCH_JUMP
from peer.core.election import Header, RequestVote, TimeoutNow, has_majority
from peer.core.ids import BlockId, Epoch, Gen, LogIndex, Round, SiteId
from peer.core.lease_types import Span, Voucher
from peer.core.membership_guard import CATCH_UP_LIMIT, INCARNATION_LIMIT, MAX_INCARNATION_JUMP
from peer.core.peer_rounds import PeerRounds
from peer.core.samples import SampleRange
from peer.core.vouchers import VoucherKeys, signed
from peer.sim.peer_config import PeerSimConfig
from peer.sim.runner import Simulation

MEMBER_PROBES = ("snapshot", "append_reply", "epoch_limit", "epoch_jump", "batch", "contradiction",
                 "hand_over", "rumour_limit", "rumour_jump")
STRANGER_PROBES = ("snapshot", "append_reply", "epoch_limit", "epoch_jump", "rumour_limit", "rumour_jump")
REPORTS = ("tokens", "voucher_forged", "voucher_self")
"""A member's forged reports (one kind per round it forges, drawn at its first report of the round)."""
PROBES = (*MEMBER_PROBES, *REPORTS)
FORGE_P = 0.5
"""Share of rounds a faulty member reports falsely (the rest it reports honestly)."""
FAR = 10**6
"""How far beyond the truth a snapshot or an ack claims to be (issue 38's probes)."""
ACCUSATIONS = (m.MemberState.LEFT, m.MemberState.DEAD, m.MemberState.SUSPECT)


class Peer(Protocol):
    """What the faulty site reads of a simulated peer (peer_node.PeerNode): its cores."""

    @property
    def consensus(self) -> ConsensusCore: ...
    @property
    def rounds(self) -> PeerRounds: ...


class World(Protocol):
    """What the faulty site reads of the simulated world (peer_world.World) and adds to it."""

    @property
    def names(self) -> Sequence[SiteId]: ...
    @property
    def cfg(self) -> PeerSimConfig: ...
    @property
    def sim(self) -> Simulation: ...
    @property
    def epochs_done(self) -> int: ...
    @property
    def violations(self) -> list[str]: ...

    def up(self) -> list[SiteId]: ...
    def leader(self) -> SiteId | None: ...
    def peer(self, name: str) -> Peer | None: ...


@dataclass(frozen=True)
class SimSend:
    """A lie on its way (the runner routes it by `to`, as peer_node.SimSend)."""

    to: str
    msg: object


class Stranger:
    """The process of a faulty site that never joined: it hears the answers to its lies, and drops them."""

    def tick(self, now: float) -> list[Any]:
        return []

    def receive(self, msg: object, now: float) -> list[Any]:
        return []

    def next_deadline(self) -> float:
        return float("inf")


class FaultySite:
    """The seed's faulty site: its lies, what became of them, and the checks on honest peers they need."""

    def __init__(self, world: World, rng: random.Random, keys: Mapping[str, VoucherKeys],
                 tokens_per_sample: int) -> None:
        self.world, self.rng = world, rng
        self.member = rng.random() < 0.5
        self.name = SiteId(rng.choice(world.names) if self.member else f"s{len(world.names)}")
        """A site of the run, or a site name the run's CA issued a certificate for that never joined."""
        if self.name not in keys:
            raise ValueError(f"--faults faulty: the run's keys hold no certificate of {self.name} (they must "
                             "include a site that never joins, and every voucher is checked)")
        self.keys = keys[self.name]
        self.tokens_per_sample = tokens_per_sample
        self.sent: Counter[str] = Counter()
        """Probe kind -> lies sent (a forged report counts once per round)."""
        self.refused: Counter[str] = Counter()
        """Probe kind -> refusals by honest cores: implausible (consensus), by the guard (membership),
        excluded by the leader (reports)."""
        self.forged: dict[int, str | None] = {}
        """Round -> the kind of report this member sent for it (None: an honest one)."""
        self._forgeries: dict[int, r.Contribution] = {}
        """Round -> the forged report, sent again as it is (to a new leader)."""
        self._kinds: dict[int, tuple[object, str]] = {}
        """id(message) -> (the message, kept alive so its id stays its own; its probe kind)."""
        self.ears: dict[tuple[str, int], m.Membership] = {}
        """(honest site, process) -> the membership core that hears the faulty site's Pings there."""

    # ----- the lies --------------------------------------------------------------------------------
    def start(self, at: float) -> None:
        self.world.sim.schedule(at, self._act, f"{self.name} (faulty) lies")

    def _act(self) -> None:
        w = self.world
        if w.epochs_done >= w.cfg.epochs:
            return  # the run converges now: liveness and convergence are checked without lies
        kind = self.rng.choice(MEMBER_PROBES if self.member else STRANGER_PROBES)
        w.sim.act(self.name, lambda node, now: self._probe(kind))
        w.sim.schedule(w.sim.now + self.rng.uniform(0.3, 3.0), self._act, f"{self.name} (faulty) lies")

    def _probe(self, kind: str) -> list[SimSend]:
        """The messages of one lie of `kind`, from what the faulty site knows: its own cores (a
        member), or what any peer's messages would tell it (a stranger: the most advanced peer)."""
        w, rng = self.world, self.rng
        honest = [n for n in w.up() if n != self.name]
        ref = self._reference()
        if ref is None or not honest:
            return []
        epoch, rnd = ref.hard.epoch, ref.status().committed_round
        me = Header(self.name, self.name, epoch, rnd)
        out: list[SimSend] = []
        if kind == "snapshot":
            if self.member:  # seated: only a malformed snapshot is refused (Raft trusts its voters)
                snap = Snapshot(LogIndex(ref.log.last_index), Epoch(epoch + 1), Round(rnd), b"\0" * 16,
                                () if rng.random() < 0.5 else ((self.name, self.name),))
            else:
                snap = Snapshot(LogIndex(FAR), Epoch(epoch), Round(rnd + FAR), b"\0" * 16, ((self.name, self.name),))
            out = [SimSend(n, InstallSnapshot(me, snap, 0)) for n in honest]
        elif kind == "append_reply":
            leader = w.leader()
            lnode = w.peer(leader) if leader else None
            if leader is not None and leader != self.name and lnode is not None:
                lead = lnode.consensus
                if self.member and (ref.hard.epoch != lead.hard.epoch or ref.leader != leader):
                    return []  # a member lies about the epoch it follows
                header = replace(me, epoch=lead.hard.epoch)
                out = [SimSend(leader, AppendReply(header, True, LogIndex(lead.log.last_index + FAR), 0, "ok"))]
        elif kind in ("epoch_limit", "epoch_jump"):
            if kind == "epoch_limit":
                high = Epoch(rng.choice([2**62, EPOCH_LIMIT + 1]))
            else:
                high = Epoch(epoch + rng.randint(2 * MAX_EPOCH_JUMP, FAR))
            last = ref.log.last_index
            for n in honest:
                voters = [v for v, _ in peer.consensus.log.voters()] if (peer := w.peer(n)) else []
                if kind == "epoch_jump" and self.member and (not voters or has_majority([self.name], voters)):
                    continue  # a joiner believes a member at any epoch; a voter set it is a majority of, too
                if rng.random() < 0.5:
                    msg: object = AppendEntries(replace(me, epoch=high), LogIndex(last),
                                                Epoch(ref.log.epoch_at(last) or 0), (), LogIndex(0), 0)
                else:
                    msg = RequestVote(me, high, last, Epoch(ref.log.epoch_at(last) or 0), rng.random() < 0.5)
                out.append(SimSend(n, msg))
        elif kind == "batch":
            out = [SimSend(n, self._malformed(me, ref)) for n in honest]
        elif kind == "hand_over":
            # Only the leader may void the lease kept for it: a voter that follows another must not.
            if ref.leader is not None and ref.leader != self.name and ref.leader_epoch == epoch:
                out = [SimSend(n, TimeoutNow(me, self.name)) for n in honest]
        elif kind == "contradiction":
            out = self._contradictions(me, ref, honest)
        else:
            out = [SimSend(n, self._rumour(kind, n, honest)) for n in honest]
        for s in out:
            self._kinds[id(s.msg)] = (s.msg, kind)
        self.sent[kind] += len(out)
        return out

    def _reference(self) -> ConsensusCore | None:
        """The consensus core whose state the lies are made from: the member's own, or (a stranger)
        the most advanced peer's, as its messages would tell."""
        if self.member:
            node = self.world.peer(self.name)
            return node.consensus if node is not None else None
        nodes = [n for name in self.world.up() if (n := self.world.peer(name)) is not None]
        return max((n.consensus for n in nodes), key=lambda c: (c.hard.epoch, c.commit_index), default=None)

    def _malformed(self, me: Header, ref: ConsensusCore) -> AppendEntries:
        last, epoch = ref.log.last_index, me.epoch
        body = EpochStart(self.name)
        prev_epoch = Epoch(ref.log.epoch_at(last) or 0)
        how = self.rng.randrange(3)
        entries: tuple[Entry, ...]
        if how == 0:  # not consecutive
            entries = (Entry(LogIndex(last + 1), epoch, body), Entry(LogIndex(last + 3), epoch, body))
        elif how == 1:  # an entry newer than the epoch it is sent at
            entries = (Entry(LogIndex(last + 1), Epoch(epoch + 1), body),)
        else:  # a previous entry newer than the epoch it is sent at
            return AppendEntries(me, LogIndex(last), Epoch(epoch + 1), (), LogIndex(0), 0)
        return AppendEntries(me, LogIndex(last), prev_epoch, entries, LogIndex(0), 0)

    def _contradictions(self, me: Header, ref: ConsensusCore, honest: Sequence[str]) -> list[SimSend]:
        """An entry at the index where an epoch starts, rewritten at the epoch before it, to each
        honest peer that committed that index (only there must it be refused: a lagging peer takes
        it as its leader's word, and a lower epoch is never the more up-to-date log in an election)."""
        log, out = ref.log, []
        starts = [i for i in range(max(2, log.snapshot.last_index + 2), ref.commit_index + 1)
                  if (log.epoch_at(i - 1) or 0) < (log.epoch_at(i) or 0)]
        for n in honest:
            peer = self.world.peer(n)
            if peer is None:
                continue
            theirs = [i for i in starts if i <= peer.consensus.commit_index and i > peer.consensus.log.snapshot.last_index + 1]
            if not theirs:
                continue
            i = self.rng.choice(theirs)
            before = Epoch(log.epoch_at(i - 1) or 0)
            out.append(SimSend(n, AppendEntries(me, LogIndex(i - 1), before, (Entry(LogIndex(i), before,
                                                                                    EpochStart(self.name)),),
                                                LogIndex(0), 0)))
        return out

    def _rumour(self, kind: str, to: str, honest: Sequence[str]) -> m.Ping:
        rng = self.rng
        about = rng.choice([n for n in honest if n != self.name])
        if kind == "rumour_limit":
            incarnation = rng.choice([2**62, INCARNATION_LIMIT])
        else:
            incarnation = CATCH_UP_LIMIT + rng.randint(2 * MAX_INCARNATION_JUMP, FAR)
        lie = m.MemberUpdate(about, rng.choice(ACCUSATIONS), incarnation, None, self.name)
        return m.Ping(rng.randrange(1, 2**31), self.name, self.name, to, (lie,))

    # ----- a member's forged reports ---------------------------------------------------------------
    def report(self, node: Peer, c: r.Contribution) -> r.Contribution:
        """What this member sends the leader for its report `c`: `c`, or a forgery (drawn per round;
        a round it cannot forge in, with no block left whose primary is another site, is honest)."""
        if c.round not in self.forged:
            kinds = [k for k in REPORTS if k != "tokens" or (c.ranges and c.tokens > 0)]
            kind = self.rng.choice(kinds) if self.rng.random() < FORGE_P else None
            forgery = self._forge(kind, node, c) if kind else None
            self.forged[c.round] = kind if forgery else None
            if kind and forgery:
                self._forgeries[c.round] = forgery
                self.sent[kind] += 1
        forgery = self._forgeries.get(c.round)
        return c if forgery is None else replace(forgery, header=c.header)  # sent again: the same lie

    def _forge(self, kind: str, node: Peer, c: r.Contribution) -> r.Contribution | None:
        if kind == "tokens":
            return replace(c, tokens=c.tokens * 10)
        view, ledger = node.rounds.leases.owner.view, node.rounds.leases.ledger
        if view is None:
            return None
        mine = {x.block_id for x in c.ranges}
        free = [(b, s) for b in sorted(ledger.sizes) if b not in mine and view.primary(b) not in (None, self.name)
                and (s := _first_free(ledger.done(b), ledger.size(b))) is not None]
        if not free:
            return None
        b, start = self.rng.choice(free)
        end = min(start + 4, ledger.size(b))
        owner = self.name if kind == "voucher_self" else view.primary(b)
        voucher = signed(Voucher(BlockId(b), Gen(view.version), (Span(start, end),), self.name, c.round,
                                 view.version, owner or self.name), self.keys)
        return replace(c, ranges=(*c.ranges, SampleRange(b, start, end)), vouchers=(*c.vouchers, voucher),
                       tokens=max(c.tokens, 0) + (end - start) * self.tokens_per_sample,
                       pseudo_gradient_root=c.pseudo_gradient_root or b"forged")

    # ----- what became of the lies, and the checks --------------------------------------------------
    def refused_at(self, site: str, sender: str, msg: object) -> bool:
        """An implausible refusal at `site` of `sender`'s `msg` (the message being delivered): the
        faulty site's lie (counted), or a refusal by the faulty site's own cores (never checked).
        False: an honest message was refused."""
        if sender == self.name:
            kind = self._kinds.get(id(msg))
            self.refused[kind[1] if kind else "other"] += 1
            return True
        return site == self.name

    def excluded(self, round_: int, site: str) -> None:
        """The leader excluded `site`'s report of `round_` (any reason: a forgery must not get in)."""
        kind = self.forged.get(round_) if site == self.name else None
        if kind is not None:
            self.refused[kind] += 1

    def committed(self, round_: int, contributors: Sequence[Any]) -> list[str]:
        """Violations in a commit: the faulty site's forged report admitted, or its tokens above its samples."""
        out = []
        for c in contributors:
            if c.site != self.name:
                continue
            if self.forged.get(round_):
                out.append(f"round {round_}: {self.name}'s forged report ({self.forged[round_]}) was admitted "
                           "(work credit)")
            n = sum(x.num_samples for x in c.ranges)
            if c.tokens > n * self.tokens_per_sample:
                out.append(f"round {round_}: {self.name} is credited {c.tokens} tokens for {n} samples of "
                           f"{self.tokens_per_sample} (work credit)")
        return out

    def heard(self, site: str, boot: int, msg: m.Message, now: float) -> list[Any]:
        """A membership message at honest `site` (process `boot`; only the faulty site sends them
        here, and only lies its guard must refuse): the ear's refusals are counted, a rumour it takes
        is a violation."""
        if site == self.name:
            return []  # the faulty site ignores what the ears answer
        ear = self.ears.get((site, boot))
        if ear is None:
            ear = self.ears[(site, boot)] = m.Membership(m.MemberMeta(site, site), m.MembershipConfig.local_test(),
                                                         random.Random(f"{site}/{boot}"), now)
        effects = ear.receive(msg, now)
        refusals = [e for e in effects if isinstance(e, m.Rejected)]
        for e in refusals:
            if not self.refused_at(site, e.from_site, msg):
                self.world.violations.append(f"{site}: membership refused {e.what} of {e.from_site}: {e.reason}")
        if msg.from_site == self.name and isinstance(msg, m.Ping) and not refusals:
            lie = ", ".join(f"{u.site} {u.state.name}@{u.incarnation}" for u in msg.updates)
            self.world.violations.append(f"{site} believed {self.name}'s rumour {lie}: its subject could not "
                                         "refute it (membership guard)")
        return [e for e in effects if isinstance(e, m.Send)]


def _first_free(done: Sequence[Span], size: int) -> int | None:
    """The first sample of a block not committed in this data epoch (None: all are)."""
    at = 0
    for s in done:
        if s.start > at:
            return at
        at = max(at, s.end)
    return at if at < size else None
