"""Lease owner core (DARL): the lease records of the blocks this peer owns on the ring.

Protocol (docs/leases.md). For each block of the data epoch, the ring (peer/core/ring.py) names R owners;
the first is the primary and the only one that changes the record. Every change (grant, steal,
start, trained claim, release, reclaim) bumps the record's `rev`, is applied at the primary at once
and pushed to the replicas; the answer to the holder is held back until a strict majority of the R
owners (the primary included) holds that rev. There is no sloppy quorum and no hinted handoff: an
owner that cannot reach its replicas stops answering, it does not grant elsewhere.

When the ring view changes, a block whose primary changed is not served until its new primary has
read the records of a majority of the block's previous owners (their highest rev wins: it contains
every write that was acknowledged). If fewer than a majority of the previous owners survived, the
record is rebuilt from the log alone (committed samples; everything else free, at a generation
above any the old view minted) and a REBUILD event says so. Samples trained under a lost record are
still judged at commit time by the log (peer/core/admission.py), so a rebuild can waste work but never
commit a sample twice.

The owner is the single place where starting and stealing are ordered: only a LEASED block can be
stolen, and a holder may train a block only after the owner acknowledged its Start. A started
block's holder may instead be asked (RenewReply.wanted) to give its rest back to an idle site that
found nothing free or stealable (docs/leases.md, "Giving back at the tail"). Every message
carries (leader epoch, ring version, data epoch) and every lease reference a generation; anything
stale is refused with a reason ("stale: generation 4294967297 < 4294967298 for block 812").

This class orders the changes and routes the messages; the parts it consults live beside it: the
quorum count of replicated writes (peer/core/lease_quorum.py), the hand-over of a block to a new
primary (peer/core/lease_handover.py), the give-back at the tail (peer/core/lease_give_back.py), and
the timers (peer/core/lease_config.py).

    .venv/bin/python -m pytest tests/unit/test_leases.py -q
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Mapping
from dataclasses import replace

from peer.core.audit import EpochLedger
from peer.core.election import SiteId
from peer.core.lease_types import (
    BlockRev,
    BlockId,
    Claim,
    EventKind,
    Grant,
    GrantReply,
    GrantRequest,
    LeaseHeader,
    LeaseEvent,
    LeaseRef,
    LeaseState,
    Message,
    PendingClaim,
    LeaseRecord,
    Refusal,
    Rejected,
    Release,
    Renew,
    RenewReply,
    Replicate,
    ReplicateAck,
    Send,
    Start,
    StartReply,
    SyncReply,
    SyncRequest,
    Trained,
    TrainedReply,
    Voucher,
    fmt,
    fresh_record,
    mint_base,
    next_gen,
    normalize,
    subtract,
)
from peer.core.lease_config import LeaseConfig
from peer.core.lease_give_back import GiveBack
from peer.core.lease_handover import Handover, sync_requests
from peer.core.lease_quorum import QuorumAnswers
from peer.core.ring import RingView, quorum, score
from peer.core.vouchers import VoucherKeys, signed

Effect = Send | LeaseEvent


class LeaseOwner:
    """The lease records of every block this peer owns; pure: messages and ticks in, effects out."""

    def __init__(self, site: SiteId, ledger: EpochLedger, cfg: LeaseConfig, amnesiac: bool = False,
                 boot: int = 0, keys: VoucherKeys | None = None) -> None:
        self.site = site
        self.keys = keys
        """This site's key: it signs every voucher it issues (peer/core/vouchers.py); None in an
        insecure run, whose vouchers are unsigned."""
        self.boot = boot
        """How many times this site's process started before (the node keeps the count on disk): a
        primary restarted within one ring view mints generations above those it minted before."""
        self.ledger = ledger
        """Committed samples and the data epoch, from the log (shared with the node's other cores)."""
        self.cfg = cfg
        self.view: RingView | None = None
        self.leader_epoch = 0
        self.records: dict[BlockId, LeaseRecord] = {}
        """Blocks this peer is an owner of in the current view."""
        self.retired: dict[BlockId, LeaseRecord] = {}
        """Records of the previous view this peer no longer owns: kept to answer SyncRequests."""
        self.serving: set[BlockId] = set()
        """Blocks this peer is primary of and may change (synced or rebuilt)."""
        self.syncing: dict[BlockId, Handover] = {}
        """Blocks this peer became primary of and waits on its previous owners' records for."""
        self.expiry: dict[BlockId, float] = {}
        self.give_back = GiveBack(cfg)
        """Started blocks an idle site asked for at the data epoch's tail (peer/core/lease_give_back.py)."""
        self.paces: dict[SiteId, float] = {}
        """Each site's pace as its newest holder message said (LeaseHeader.pace; absent: 0)."""
        self.writes = QuorumAnswers()
        """What the replicas acknowledged, and the answers held back until a majority holds them."""
        self.unacked_since: dict[BlockId, float] = {}
        self.sync_sent = 0.0
        """When SyncRequests last went out (set_view sends the first ones)."""
        self.live_since: int | None = None if amnesiac else 0
        """First ring version at which this core took part in the protocol (a message passed its
        fence, so other peers were on that view too); 0: a founder, trusted from the first view.
        A restarted or joining core learns the log's views by replay, and has no records of the views
        it was not running in."""
        self.trusted_prev = False
        """This core's records of the previous view hold every write it acknowledged in it: it was
        live before that view began. Only then does its SyncReply count toward a majority."""
        self.epoch = ledger.data_epoch
        self._dirty: set[BlockId] = set()
        self._order: list[BlockId] = []
        self._events: list[LeaseEvent] = []

    # --- inputs ---

    @property
    def _base(self) -> int:
        assert self.view is not None
        return mint_base(self.view.version, self.boot)

    def header(self) -> LeaseHeader:
        v = self.view.version if self.view else 0
        return LeaseHeader(self.site, self.leader_epoch, v, self.epoch, self.ledger.last_round)

    def set_view(self, view: RingView, leader_epoch: int, now: float,
                 previous: RingView | None = None) -> list[Effect]:
        """A new ring view (from the committed voter set) and the current leader epoch. `previous` is
        the view before it, for a core that starts with none (a restart or a late join). Only the
        run's very first view, on a founder's core, is adopted without asking anyone; a view replayed
        from the log by a restarted core is not trusted (`live_since`)."""
        self.leader_epoch = max(self.leader_epoch, leader_epoch)
        if self.view is not None and view.version <= self.view.version:
            return []
        old = self.view or previous
        self.view = view
        self.writes.clear()
        self.unacked_since.clear()
        self.syncing.clear()
        # A primary that keeps a block keeps its holder's deadline: the holder renews with the same
        # owner, so a fresh ttl at every voter change would let a silent holder keep its lease for
        # as long as jobs keep joining and leaving (one change every few seconds at short walls).
        kept_expiry, self.expiry = self.expiry, {}
        trusted = old is not None and self.live_since is not None and self.live_since < old.version
        held = {**self.retired, **self.records} if trusted else {}
        self.records, self.retired, self.serving = {}, {}, set()
        out: list[Effect] = []
        for b in self.ledger.blocks:
            owners = view.owners(b)
            if self.site not in owners:
                if b in held:
                    self.retired[b] = held[b]
                continue
            if b in held:
                self.records[b] = held[b]
            if owners[0] != self.site:
                continue
            fresh = fresh_record(b, self.ledger.size(b), self.ledger.done(b), self._base, self.epoch)
            if old is None and self.live_since == 0:
                self._adopt(b, fresh, now)  # the run's first view: the log is the whole truth
            elif old is not None and old.primary(b) == self.site and b in held:
                self._adopt(b, held[b], now, kept_expiry.get(b))
            else:
                prev = old.owners(b) if old is not None else owners
                sync = Handover({m for m in prev if m in view.members and m != self.site}, quorum(len(prev)),
                                mint_base((old or view).version, 0))
                if self.site in prev and trusted:
                    sync.complete += 1
                    sync.got.extend([held[b]] if b in held else [])
                if sync.complete + len(sync.waiting) < sync.needed:
                    out.extend(self._rebuild(b, now))
                elif not sync.waiting:
                    out.extend(self._finish_sync(b, sync, now))
                else:
                    self.syncing[b] = sync
        self.trusted_prev = trusted
        self._rebuild_order()
        out.extend(self._request_syncs(now))
        return out + self._flush(now)

    def on_commit(self, now: float) -> list[Effect]:
        """The node applied a RoundCommit to `ledger`: settle pending claims; new epoch -> reset."""
        if self.view is None:
            return []
        if self.epoch != self.ledger.data_epoch:
            self._new_epoch()
            return []
        rnd = self.ledger.last_round
        for b, rec in list(self.records.items()):
            done = self.ledger.done(b)
            pending = tuple(p for p in rec.pending if p.round > rnd)
            if done != rec.done or pending != rec.pending:
                new = replace(rec, done=done, pending=pending)
                if b in self.serving:
                    self._write(new, now)
                else:
                    self.records[b] = new
        return self._flush(now)

    def _new_epoch(self) -> None:
        """Every sample of the epoch is committed: every record starts over, as the log says, on
        every owner at once (no replication needed: all derive it from the same log)."""
        assert self.view is not None
        self.epoch = self.ledger.data_epoch
        self.serving |= set(self.syncing)
        for b in set(self.records) | self.serving:
            self.records[b] = fresh_record(b, self.ledger.size(b), self.ledger.done(b), self._base, self.epoch)
        self.retired.clear()
        self.syncing.clear()
        self.expiry.clear()
        self.give_back.clear()
        self.writes.clear()
        self.unacked_since.clear()
        self._dirty.clear()
        self._rebuild_order()

    def note_leader_epoch(self, epoch: int) -> None:
        """The consensus layer saw a new leader epoch (LeaderChanged): fence older messages."""
        self.leader_epoch = max(self.leader_epoch, epoch)

    def receive(self, msg: Message, now: float) -> list[Effect]:
        handler: Callable[[Message, float], list[Effect]] | None = self._handlers.get(type(msg))
        if handler is None:
            return []
        refusal = self._fence(msg.header)
        self.note_leader_epoch(msg.header.leader_epoch)  # epochs only grow: a newer one is news
        if refusal:
            req = msg.req if isinstance(msg, GrantRequest) else 0
            return [Send(msg.header.site, Rejected(self.header(), req, refusal))]
        if self.live_since is None and msg.header.site != self.site:
            self.live_since = msg.header.ring_version
        if msg.header.pace > 0:  # an owner's own messages (replication, sync) carry none
            self.paces[msg.header.site] = msg.header.pace
        return handler(self, msg, now) + self._flush(now)

    def tick(self, now: float) -> list[Effect]:
        """Reclaim expired leases; resend unacknowledged replication and sync requests."""
        if self.view is None:
            return []
        for b in sorted(b for b, t in self.expiry.items() if t <= now):
            rec = self.records[b]
            del self.expiry[b]
            if rec.holder is not None:
                self._write(rec.bumped(self._base, holder=None, started=False,
                                       generation=next_gen(rec.generation, self._base)), now)
                self._event(EventKind.RECLAIM, rec, rec.holder, now)
        for b, t in self.unacked_since.items():
            if t + self.cfg.retry_after <= now:
                self._dirty.add(b)
        out: list[Effect] = []
        if self.syncing and self.sync_sent + self.cfg.retry_after <= now:
            out.extend(self._request_syncs(now))
        return out + self._flush(now)

    def next_deadline(self) -> float | None:
        times = list(self.expiry.values())
        times += [t + self.cfg.retry_after for t in self.unacked_since.values()]
        if self.syncing:
            times.append(self.sync_sent + self.cfg.retry_after)
        return min(times) if times else None

    # --- holder requests (primary only) ---

    def _lagging(self, h: LeaseHeader) -> str:
        """Why a holder is too far behind the log to be given or keep a lease ("" if it is not)."""
        if h.applied_round + self.cfg.max_round_lag < self.ledger.last_round:
            return (f"holder lags the log: applied round {h.applied_round} < {self.ledger.last_round} - "
                    f"{self.cfg.max_round_lag}")
        return ""

    def _on_grant(self, m: GrantRequest, now: float) -> list[Effect]:
        assert self.view is not None
        site = m.header.site
        lag = self._lagging(m.header)
        if lag:
            return [Send(site, Rejected(self.header(), m.req, lag))]
        mine = [b for b in self._order if self.records[b].holder == site and not self.records[b].started]
        need = max(0, min(m.want, self.cfg.max_grant) - len(mine))
        reason = f"{len(mine)} held"
        if need:
            free = (b for b in self._order if self.records[b].state is LeaseState.FREE
                    and self.give_back.may_take(b, site, now))
            picked = list(itertools.islice(free, need))
            kind = EventKind.GRANT
            if not picked and m.steal:
                picked = self._steal_candidates(site, now)[:need]
                kind = EventKind.STEAL
            if not picked and m.steal:
                self.give_back.ask(site, (self.records[b] for b in self._order), self.paces, now)
            for b in picked:
                rec = self.records[b]
                self.give_back.granted(b, site, now)
                self._write(rec.bumped(self._base, holder=site, started=False,
                                       generation=next_gen(rec.generation, self._base)), now)
                self._event(kind, self.records[b], site, now)
                self.expiry[b] = now + self.cfg.ttl
            mine += picked
            reason = f"granted {len(picked)} ({kind.value}), {len(mine)} held" if picked else (
                f"nothing free{' or stealable' if m.steal else ''}, {len(mine)} held")
        grants = tuple(Grant(b, self.records[b].generation, self.records[b].free_spans) for b in mine)
        nfree = sum(1 for b in self._order if self.records[b].state is LeaseState.FREE)
        reply = GrantReply(self.header(), m.req, grants, nfree, reason)
        return self._answer(site, reply, [self.records[b] for b in mine])

    def _steal_candidates(self, thief: SiteId, now: float) -> list[BlockId]:
        """Leased-not-started blocks of other holders, from the holder with the most first; never
        a given-back rest while it is kept for another site (the whole-peer simulator's tail run:
        two slow idle sites stole the rest from the fast site it was given back to, before it
        started it, and trained it slowly)."""
        leased = [b for b in self._order if self.records[b].state is LeaseState.LEASED
                  and self.records[b].holder != thief and self.give_back.may_take(b, thief, now)]
        per: dict[SiteId | None, int] = {}
        for b in leased:
            per[self.records[b].holder] = per.get(self.records[b].holder, 0) + 1
        return sorted(leased, key=lambda b: -per[self.records[b].holder])

    def _check(self, site: SiteId, ref: LeaseRef) -> str:
        """Why `site` does not hold lease `ref` here ("" when it does)."""
        rec = self.records.get(ref.block_id)
        if rec is None or ref.block_id not in self.serving:
            return f"not serving block {ref.block_id} (ring version {self.header().ring_version})"
        if ref.generation < rec.generation:
            who = f"held by {rec.holder}" if rec.holder else f"now {rec.state.value}"
            return f"stale: generation {ref.generation} < {rec.generation} for block {ref.block_id} ({who})"
        if ref.generation > rec.generation or rec.holder != site:
            return f"no lease: block {ref.block_id} generation {ref.generation} is not held by {site}"
        return ""

    def _on_renew(self, m: Renew, now: float) -> list[Effect]:
        renewed, lost = [], []
        lag = self._lagging(m.header)
        for ref in m.leases:
            why = self._check(m.header.site, ref) or lag
            if not why:
                self.expiry[ref.block_id] = now + self.cfg.ttl
                renewed.append(ref)
            elif ref.block_id in self.serving:
                lost.append(Refusal(ref.block_id, why))
        wanted = tuple(ref.block_id for ref in renewed if self.give_back.reserved_for(ref.block_id, now) not in (None, m.header.site))
        return [Send(m.header.site, RenewReply(self.header(), tuple(renewed), tuple(lost), m.sent_at, wanted))]

    def _on_start(self, m: Start, now: float) -> list[Effect]:
        assert self.view is not None
        why = self._check(m.header.site, m.lease) or self._lagging(m.header)
        if why:
            return [Send(m.header.site, StartReply(self.header(), m.lease, False, why))]
        rec = self.records[m.lease.block_id]
        if not rec.started:
            self._write(rec.bumped(self._base, started=True), now)
        self.expiry[m.lease.block_id] = now + self.cfg.ttl
        reply = StartReply(self.header(), m.lease, True, f"started block {m.lease.block_id}")
        return self._answer(m.header.site, reply, [self.records[m.lease.block_id]])

    def _on_trained(self, m: Trained, now: float) -> list[Effect]:
        vouched, refused, touched = [], [], []
        for c in m.claims:
            if c.lease.block_id not in self.serving:
                continue  # not this owner's (yet): no answer, the holder resends to the primary it finds
            why = self._claim(m.header.site, m.round, c, now)
            if why:
                refused.append(Refusal(c.lease.block_id, why))
            else:
                assert self.view is not None
                v = Voucher(c.lease.block_id, c.lease.generation, normalize(c.spans), m.header.site, m.round,
                            self.view.version, self.site)
                vouched.append(signed(v, self.keys))
                touched.append(self.records[c.lease.block_id])
                self._events.append(LeaseEvent(EventKind.VOUCH, self.ledger.data_epoch, v.block_id, v.generation,
                                               v.holder, now, v.round, v.spans, v.ring_version, self.site))
        reply = TrainedReply(self.header(), m.round, tuple(vouched), tuple(refused))
        return self._answer(m.header.site, reply, touched)

    def _claim(self, site: SiteId, rnd: int, c: Claim, now: float) -> str:
        assert self.view is not None
        rec = self.records[c.lease.block_id]
        spans = normalize(c.spans)
        if PendingClaim(rnd, site, spans) in rec.pending:
            return ""  # a retry of a claim already vouched
        why = self._check(site, c.lease)
        if why:
            return why
        if not rec.started:
            return f"block {c.lease.block_id} was never started by {site}"
        if rnd <= self.ledger.last_round:
            return f"round {rnd} is already decided (log at round {self.ledger.last_round})"
        overlap = subtract(spans, rec.free_spans)
        if overlap:
            return f"samples {fmt(overlap)} of block {c.lease.block_id} are already committed or claimed"
        changes: dict[str, object] = {"pending": rec.pending + (PendingClaim(rnd, site, spans),)}
        if not c.keep:
            changes.update(holder=None, started=False, generation=next_gen(rec.generation, self._base))
            self.expiry.pop(c.lease.block_id, None)
        self._write(rec.bumped(self._base, **changes), now)
        return ""

    def _on_release(self, m: Release, now: float) -> list[Effect]:
        assert self.view is not None
        for ref in m.leases:
            if not self._check(m.header.site, ref):
                rec = self.records[ref.block_id]
                self._write(rec.bumped(self._base, holder=None, started=False,
                                       generation=next_gen(rec.generation, self._base)), now)
                self.expiry.pop(ref.block_id, None)
                self._event(EventKind.RELEASE, rec, m.header.site, now)
        return []

    # --- replication between owners ---

    def _on_replicate(self, m: Replicate, now: float) -> list[Effect]:
        assert self.view is not None
        acked = []
        for rec in m.records:
            if self.view.primary(rec.block_id) != m.header.site or self.site not in self.view.owners(rec.block_id):
                continue
            mine = self.records.get(rec.block_id)
            if mine is None or rec.rev > mine.rev:
                self.records[rec.block_id] = replace(rec, done=normalize(rec.done + self.ledger.done(rec.block_id)))
            acked.append(BlockRev(rec.block_id, self.records[rec.block_id].rev))
        return [Send(m.header.site, ReplicateAck(self.header(), tuple(acked)))]

    def _on_replicate_ack(self, m: ReplicateAck, now: float) -> list[Effect]:
        for b, rev in ((a.block_id, a.rev) for a in m.acked):
            if b in self.serving:
                self.writes.ack(b, m.header.site, rev)
                if self._quorum_holds(b, self.records[b].rev):
                    self.unacked_since.pop(b, None)
        return self._release_deferred()

    def _on_sync_request(self, m: SyncRequest, now: float) -> list[Effect]:
        held = {**self.retired, **self.records}
        recs = tuple(held[b] for b in m.block_ids if b in held) if self.trusted_prev else ()
        return [Send(m.header.site, SyncReply(self.header(), recs, self.trusted_prev))]

    def _on_sync_reply(self, m: SyncReply, now: float) -> list[Effect]:
        out: list[Effect] = []
        by_block = {r.block_id: r for r in m.records}
        for b, s in list(self.syncing.items()):
            if s.heard(m.header.site, m.complete, by_block.get(b)):
                del self.syncing[b]
                out.extend(self._finish_sync(b, s, now))
        return out

    def _finish_sync(self, b: BlockId, s: Handover, now: float) -> list[Effect]:
        assert self.view is not None
        rec = s.record(b, self.ledger, self._base)
        if rec is None:
            return self._rebuild(b, now)
        self._adopt(b, rec, now)
        self._order_insert(b)
        return []

    # --- internals ---

    def _fence(self, h: LeaseHeader) -> str:
        me = self.header()
        if self.view is None:
            return "no ring view yet"
        if h.leader_epoch < me.leader_epoch:
            return f"stale: leader epoch {h.leader_epoch} < {me.leader_epoch}"
        if h.ring_version != me.ring_version:
            return f"ring version {h.ring_version} != {me.ring_version}"
        if h.data_epoch != me.data_epoch:
            return f"data epoch {h.data_epoch} != {me.data_epoch}"
        return ""

    def _adopt(self, b: BlockId, rec: LeaseRecord, now: float, expiry: float | None = None) -> None:
        """Start serving `b` with `rec`: holders get a full ttl to find the new primary (`expiry`: the
        deadline a primary that keeps the block already gave). A holder that is no longer in the
        ring (membership removed it: dead, or gone without releasing) has no owner to renew with and
        no round to contribute to, so its lease is reclaimed at once; should it come back, its claims
        are refused like a zombie's (stale generation). The rev is re-minted under this view, which
        marks the record as established in it (see Handover)."""
        assert self.view is not None
        rec = rec.bumped(self._base)
        self.serving.add(b)
        self.records[b] = rec
        if rec.holder is not None:
            gone = rec.holder not in self.view.members
            self.expiry[b] = now if gone else (expiry if expiry is not None else now + self.cfg.ttl)
        self._dirty.add(b)
        self.unacked_since[b] = now

    def _rebuild(self, b: BlockId, now: float) -> list[Effect]:
        assert self.view is not None
        rec = fresh_record(b, self.ledger.size(b), self.ledger.done(b), self._base, self.ledger.data_epoch)
        self._adopt(b, rec, now)
        self._order_insert(b)
        return [LeaseEvent(EventKind.REBUILD, self.ledger.data_epoch, b, rec.generation, None, now)]

    def _write(self, rec: LeaseRecord, now: float) -> None:
        self.records[rec.block_id] = rec
        self._dirty.add(rec.block_id)
        self.unacked_since.setdefault(rec.block_id, now)

    def _event(self, kind: EventKind, rec: LeaseRecord, site: SiteId | None, now: float) -> None:
        cur = self.records[rec.block_id]
        self._events.append(LeaseEvent(kind, self.ledger.data_epoch, rec.block_id, cur.generation, site, now))

    def _quorum_holds(self, b: BlockId, rev: int) -> bool:
        assert self.view is not None
        return self.writes.holds(b, rev, self.view.owners(b))

    def _answer(self, to: SiteId, reply: Message, recs: list[LeaseRecord]) -> list[Effect]:
        needs = tuple((r.block_id, self.records[r.block_id].rev) for r in recs)
        self.writes.hold(Send(to, reply), needs)
        return []

    def _release_deferred(self) -> list[Effect]:
        return list(self.writes.release(self._quorum_holds))

    def _flush(self, now: float) -> list[Effect]:
        """Push every changed record to its replicas (one message per replica), release answers."""
        assert self.view is not None or not self._dirty
        out: list[Effect] = list(self._events)
        self._events.clear()
        per: dict[SiteId, list[LeaseRecord]] = {}
        for b in sorted(self._dirty):
            if b not in self.serving:
                continue
            for r in self.view.owners(b)[1:]:  # type: ignore[union-attr]
                per.setdefault(r, []).append(self.records[b])
            if self._quorum_holds(b, self.records[b].rev):
                self.unacked_since.pop(b, None)
            else:
                self.unacked_since[b] = now
        self._dirty.clear()
        out += [Send(r, Replicate(self.header(), tuple(recs))) for r, recs in sorted(per.items())]
        return out + self._release_deferred()

    def _request_syncs(self, now: float) -> list[Effect]:
        self.sync_sent = now
        return list(sync_requests(self.header(), self.syncing))

    def _order_key(self, b: BlockId) -> int:
        """Serving blocks in a per-epoch shuffled order: the order free blocks are granted in."""
        return score(self.ledger.data_epoch * 0x9E3779B97F4A7C15 + 1, b)

    def _rebuild_order(self) -> None:
        self._order = sorted(self.serving, key=self._order_key)

    def _order_insert(self, b: BlockId) -> None:
        # One insertion per synced block: re-sorting everything each time was quadratic in the shard.
        if b not in self._order:
            bisect.insort(self._order, b, key=self._order_key)

    _handlers: Mapping[type, Callable[..., list[Effect]]] = {
        GrantRequest: _on_grant, Renew: _on_renew, Start: _on_start, Trained: _on_trained,
        Release: _on_release, Replicate: _on_replicate, ReplicateAck: _on_replicate_ack,
        SyncRequest: _on_sync_request, SyncReply: _on_sync_reply,
    }
