"""Lease holder core (DARL): the leases this site trains from, and the trainer's sample cursor.

Protocol (docs/leases.md), from the holder's side:

1. keep `prefetch` blocks leased: GrantRequest to the owner with the most free blocks it knows of
   (every owner answers with its free count); when every owner says none is free, ask again with
   `steal=True` to take a leased-but-not-started block from a slower site;
2. before training a block, Start it and wait for the owner's ack (the owner orders starts against
   steals); train only started blocks whose lease is valid on this site's clock;
3. renew every `renew_every`, one Renew per owner with all its leases; a lease the owner reports
   lost (stolen, reclaimed) is dropped at once;
4. when the leader closes round r, claim what was trained (Trained, one per owner) and contribute
   exactly the vouched samples; a block with samples left stays leased (`keep`).

    .venv/bin/python -m pytest tests/unit/test_leases.py -q
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from peer.core.admission import Offer
from peer.core.audit import EpochLedger
from peer.core.election import SiteId
from peer.core.lease_types import (
    BlockId,
    Claim,
    Gen,
    GrantReply,
    GrantRequest,
    LeaseHeader,
    LeaseRef,
    Message,
    Rejected,
    Release,
    Renew,
    RenewReply,
    Send,
    Spans,
    Start,
    StartReply,
    Trained,
    TrainedReply,
    Voucher,
    count,
    intersect,
    normalize,
    of_range,
    subtract,
    take,
    to_ranges,
)
from peer.core.lease_config import LeaseConfig
from peer.core.ring import RingView, score, site_seed
from peer.core.samples import SampleRange

VALID_FRACTION = 0.8
"""A holder trusts a lease for this fraction of ttl after the renewal it sent: margin for clock
rate differences and the renewal's flight time."""


@dataclass
class Held:
    block: BlockId
    gen: Gen
    spans: Spans
    """Samples still to train."""
    valid_until: float
    started: bool = False
    start_sent: float | None = None
    wanted: bool = False
    """An idle site asked for this block (RenewReply.wanted): the next claim of samples trained from
    it gives the rest back. A holder that has trained nothing from it yet keeps it until it has."""


@dataclass
class _RoundClaims:
    """A round's claims, per block: sent to the block's current primary until it answers (so a claim
    follows its block to a new primary after a view change)."""

    claims: dict[BlockId, Claim]
    sent: float
    vouchers: dict[BlockId, Voucher] = field(default_factory=dict)
    answered: set[BlockId] = field(default_factory=set)

    @property
    def complete(self) -> bool:
        return self.answered == set(self.claims)


class LeaseClient:
    """This site's leases; pure: messages, ticks and trainer calls in, effects out."""

    def __init__(self, site: SiteId, ledger: EpochLedger, cfg: LeaseConfig, prefetch: int = 2) -> None:
        self.site = site
        self.ledger = ledger
        self.cfg = cfg
        self.prefetch = prefetch
        self.view: RingView | None = None
        self.leader_epoch = 0
        self.epoch = ledger.data_epoch
        self.held: dict[BlockId, Held] = {}
        self.free_hint: dict[SiteId, int] = {}
        """Free blocks each owner last reported (absent: unknown)."""
        self.asking: tuple[SiteId, float] | None = None
        self.req = 0
        self.last_renew = float("-inf")
        self.asked_empty = float("-inf")
        """When this site last asked while every owner it knew of had nothing free."""
        self.trained: dict[tuple[BlockId, Gen], Spans] = {}
        """Trained since the last claim, per lease."""
        self.rounds: dict[int, _RoundClaims] = {}
        self.leaving = False
        """Set by release_all: this site leaves and takes no new lease."""
        self.lost_reasons: list[str] = []
        """Why leases were lost (for logs and tests), newest last."""
        self._pace = 0.0
        """Samples per compute second this site trained in its last round (`trained_at`), sent in
        every header: owners compare holders by it at the data epoch's tail."""

    def header(self) -> LeaseHeader:
        return LeaseHeader(self.site, self.leader_epoch, self.view.version if self.view else 0, self.epoch,
                           self.ledger.last_round, self._pace)

    def trained_at(self, pace: float) -> None:
        """This site's round core measured its pace (samples per compute second) in its last round."""
        self._pace = pace

    def set_view(self, view: RingView, leader_epoch: int, now: float) -> list[Send]:
        self.leader_epoch = max(self.leader_epoch, leader_epoch)
        if self.view is None or view.version > self.view.version:
            self.view = view
            self.free_hint.clear()
            self.asking = None
        return []

    def on_commit(self, now: float) -> list[Send]:
        """The node applied a RoundCommit to `ledger`; a new data epoch drops every lease."""
        if self.ledger.data_epoch != self.epoch:
            self.epoch = self.ledger.data_epoch
            self.held.clear()
            self.trained.clear()
            self.free_hint.clear()
            self.asking = None
        self.rounds = {r: c for r, c in self.rounds.items() if r > self.ledger.last_round}
        return []

    # --- trainer calls ---

    def next_samples(self, n: int, now: float) -> tuple[tuple[BlockId, Spans], ...]:
        """Take up to n samples from started, valid leases (in block order) and note them trained."""
        out = []
        for h in sorted(self.held.values(), key=lambda h: h.block):
            if n <= 0:
                break
            if not h.started or h.valid_until <= now or not h.spans:
                continue
            got, h.spans = take(h.spans, n)
            n -= count(got)
            key = (h.block, h.gen)
            self.trained[key] = normalize(self.trained.get(key, ()) + got)
            out.append((h.block, got))
        return tuple(out)

    def untake(self, ranges: Sequence[SampleRange]) -> None:
        """Samples `next_samples` handed out that the trainer did not reach (a time-boxed round ended
        first): no longer noted trained, so not claimed; back on their lease for the next round (or,
        if the lease changed meanwhile, left for its owner to free)."""
        for r in ranges:
            back = of_range(r)
            h = self.held.get(BlockId(r.block_id))
            for key in [k for k in self.trained if k[0] == r.block_id]:
                got = intersect(self.trained[key], back)
                if not got:
                    continue
                self.trained[key] = subtract(self.trained[key], got)
                if not self.trained[key]:
                    del self.trained[key]
                if h is not None and h.gen == key[1]:
                    h.spans = normalize(h.spans + got)

    def end_round(self, round_: int, now: float) -> list[Send]:
        """The leader closed `round_`: claim everything trained since the last claim; a block an
        idle site wants back is claimed without keeping its lease (the rest goes to that site)."""
        claims: dict[BlockId, Claim] = {}
        for (b, gen), spans in sorted(self.trained.items()):
            h = self.held.get(b)
            keep = h is not None and h.gen == gen and bool(h.spans) and not h.wanted
            if h is not None and h.gen == gen and not keep:
                del self.held[b]
            # ascending generations: a block trained under an older lease too keeps only the newest
            # claim (the older one would be refused as stale anyway)
            claims[b] = Claim(LeaseRef(b, gen), spans, keep)
        self.trained.clear()
        rc = _RoundClaims(claims, now)
        self.rounds[round_] = rc
        return self._send_claims(round_, rc)

    def offer(self, round_: int) -> Offer | None:
        """The vouched samples of `round_` once every owner answered (None while waiting)."""
        rc = self.rounds.get(round_)
        if rc is None or not rc.complete:
            return None
        vs = tuple(v for _, v in sorted(rc.vouchers.items()))
        ranges = tuple(r for v in vs for r in to_ranges(v.block_id, v.spans))
        return Offer(self.site, round_, ranges, _certificates_once(vs))

    def release_all(self, now: float) -> list[Send]:
        """Graceful leave (I8): give every lease back, one Release per owner, and ask for no more."""
        self.leaving = True
        if self.view is None:  # never had a view: holds nothing
            return []
        per: dict[SiteId, list[LeaseRef]] = {}
        for h in self.held.values():
            owner = self.view.primary(h.block)
            if owner is not None:
                per.setdefault(owner, []).append(LeaseRef(h.block, h.gen))
        self.held.clear()
        return [Send(o, Release(self.header(), tuple(refs))) for o, refs in sorted(per.items())]

    # --- protocol ---

    def tick(self, now: float) -> list[Send]:
        if self.view is None or not self.view.members:
            return []
        out: list[Send] = []
        for b, h in list(self.held.items()):
            if h.valid_until <= now:
                self.lost_reasons.append(f"block {b}: lease ran out on {self.site}'s clock")
                del self.held[b]
        if now >= self.last_renew + self.cfg.renew_every:  # the same sum next_deadline() reports
            self.last_renew = now
            per: dict[SiteId, list[LeaseRef]] = {}
            for h in self.held.values():
                per.setdefault(self.view.primary(h.block), []).append(LeaseRef(h.block, h.gen))  # type: ignore[arg-type]
            out += [Send(o, Renew(self.header(), tuple(refs), now)) for o, refs in sorted(per.items())]
        out += self._maybe_grant(now)
        out += self._maybe_start(now)
        for r, rc in sorted(self.rounds.items()):
            if not rc.complete and rc.sent + self.cfg.retry_after <= now:
                rc.sent = now
                out += self._send_claims(r, rc)
        return out

    def next_deadline(self) -> float | None:
        """When tick next has something to do on its own: a renewal, a lease running out, a grant,
        start or claim to (re)send (-inf: now). Between these only messages and the trainer change
        what tick would do, and the executor ticks after each of those."""
        if self.view is None or not self.view.members:
            return None
        times = [self._grant_from(), self._start_from()[1]]
        if self.held:  # with nothing to renew, tick's renewal sends nothing: no reason to wake for it
            times.append(self.last_renew + self.cfg.renew_every)
        times += [h.valid_until for h in self.held.values()]
        times += [rc.sent + self.cfg.retry_after for rc in self.rounds.values() if not rc.complete]
        return min(times)

    def note_leader_epoch(self, epoch: int) -> None:
        """The consensus layer saw a new leader epoch (LeaderChanged): send it from now on."""
        self.leader_epoch = max(self.leader_epoch, epoch)

    def receive(self, msg: Message, now: float) -> list[Send]:
        self.note_leader_epoch(msg.header.leader_epoch)  # a refusal for a stale epoch teaches the new one
        if isinstance(msg, GrantReply):
            self._on_grant_reply(msg, now)
        elif isinstance(msg, RenewReply):
            for ref in msg.renewed:
                h = self.held.get(ref.block_id)
                if h is not None and h.gen == ref.generation:
                    h.valid_until = max(h.valid_until, msg.sent_at + VALID_FRACTION * self.cfg.ttl)
                    h.wanted = h.wanted or (h.started and ref.block_id in msg.wanted)
            for lost in msg.lost:
                if self.held.pop(lost.block_id, None) is not None:
                    self.lost_reasons.append(lost.reason)
        elif isinstance(msg, StartReply):
            h = self.held.get(msg.lease.block_id)
            if h is not None and h.gen == msg.lease.generation:
                if msg.ok:
                    h.started = True
                else:
                    self.lost_reasons.append(msg.reason)
                    del self.held[msg.lease.block_id]
        elif isinstance(msg, TrainedReply):
            rc = self.rounds.get(msg.round)
            if rc is not None:
                for v in msg.vouched:
                    c = rc.claims.get(v.block_id)
                    if c is not None and v.block_id not in rc.answered and v.generation == c.lease.generation:
                        rc.answered.add(v.block_id)
                        rc.vouchers[v.block_id] = v
                for r in msg.refused:
                    if r.block_id in rc.claims and r.block_id not in rc.answered:
                        rc.answered.add(r.block_id)
                        self.lost_reasons.append(r.reason)
        elif isinstance(msg, Rejected) and self.asking and self.asking[0] == msg.header.site:
            self.asking = None
        return []

    def _on_grant_reply(self, m: GrantReply, now: float) -> None:
        if self.asking is None or self.asking[0] != m.header.site or m.req != self.req:
            return
        sent = self.asking[1]
        self.asking = None
        self.free_hint[m.header.site] = m.free_blocks
        for g in m.grants:
            h = self.held.get(g.block_id)
            if h is None or h.gen != g.generation:
                self.held[g.block_id] = Held(g.block_id, g.generation, g.spans, sent + VALID_FRACTION * self.cfg.ttl)

    def _ready(self) -> int:
        """Leases with samples left to train (started or prefetched)."""
        return sum(1 for h in self.held.values() if h.spans)

    def _nothing_free(self) -> bool:
        """Every owner we know of said it has no free block."""
        assert self.view is not None
        return all(self.free_hint.get(m) == 0 for m in self.view.members)

    def _grant_from(self) -> float:
        """From when _maybe_grant asks for leases (-inf: now; inf: not until a message or the
        trainer changes something)."""
        ready = self._ready()
        if self.leaving or ready >= self.prefetch:
            return float("inf")
        if self.asking is not None:  # answered, or asked again after retry_after
            return self.asking[1] + self.cfg.retry_after
        if self._nothing_free():
            # Nothing free anywhere we know of. Only an idle site steals (a busy one taking a
            # prefetched block from another would just make that one steal it back): it asks again
            # after retry_after; a busy one at renewal pace, in case something came free.
            return self.asked_empty + (self.cfg.retry_after if ready == 0 else self.cfg.renew_every)
        return float("-inf")

    def _maybe_grant(self, now: float) -> list[Send]:
        assert self.view is not None
        if now < self._grant_from():
            return []
        ready = self._ready()
        members = self.view.members
        unknown = [m for m in members if m not in self.free_hint]
        steal = False
        if unknown:
            # Own shard first (no network hop), then the others in an order unique to this site.
            me = site_seed(self.site)
            owner = self.site if self.site in unknown else min(unknown, key=lambda m: score(me, site_seed(m)))
        else:
            owner = max(members, key=lambda m: (self.free_hint[m], m))
            if self.free_hint[owner] == 0:
                # Forgetting the hint makes the next request find out whether something came free there.
                self.asked_empty = now
                steal, owner = ready == 0, members[self.req % len(members)]
                del self.free_hint[owner]
        self.req += 1
        self.asking = (owner, now)
        mine_there = sum(1 for h in self.held.values()
                         if h.spans and not h.started and self.view.primary(h.block) == owner)
        want = self.prefetch - ready + mine_there
        return [Send(owner, GrantRequest(self.header(), self.req, want, steal))]

    def _start_from(self) -> tuple[Held | None, float]:
        """The leased block _maybe_start starts next, and from when (inf: none to start): one when no
        started block has samples left to train, its Start resent after retry_after."""
        if any(h.started and h.spans for h in self.held.values()):
            return None, float("inf")
        waiting = [h for h in self.held.values() if not h.started and h.spans]
        if not waiting:
            return None, float("inf")
        h = min(waiting, key=lambda h: h.block)
        return h, float("-inf") if h.start_sent is None else h.start_sent + self.cfg.retry_after

    def _maybe_start(self, now: float) -> list[Send]:
        """Start the next leased block when no started block has samples left to train."""
        h, due = self._start_from()
        if h is None or now < due:
            return []
        h.start_sent = now
        assert self.view is not None
        return [Send(self.view.primary(h.block), Start(self.header(), LeaseRef(h.block, h.gen)))]  # type: ignore[arg-type]

    def _send_claims(self, round_: int, rc: _RoundClaims) -> list[Send]:
        """One Trained per owner, with every unanswered claim whose block it is primary of now."""
        assert self.view is not None
        per: dict[SiteId, list[Claim]] = {}
        for b, c in sorted(rc.claims.items()):
            owner = self.view.primary(b)
            if b not in rc.answered and owner is not None:
                per.setdefault(owner, []).append(c)
        return [Send(o, Trained(self.header(), round_, tuple(cs))) for o, cs in sorted(per.items())]


def _certificates_once(vouchers: tuple[Voucher, ...]) -> tuple[Voucher, ...]:
    """Each owner's certificate on its first voucher only: the leader takes it from there for the
    owner's other vouchers of the contribution (a certificate is ~600 bytes, a signature ~70). Per
    owner, not per certificate: a site's jobs (b.j60, b.j61) sign with the one certificate of b, and
    the leader looks it up by owner (admission.py)."""
    seen: set[tuple[str, bytes]] = set()
    out = []
    for v in vouchers:
        if (v.owner, v.certificate) in seen:
            v = replace(v, certificate=b"")
        seen.add((v.owner, v.certificate))
        out.append(v)
    return tuple(out)
