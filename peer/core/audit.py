"""Exactly-once accounting of data samples per data epoch, from the commit log (I4, I5).

`EpochLedger` folds RoundCommit entries in log order into "which samples of the current data epoch
are committed". It is the single definition of *committed* that the lease owners (peer/core/leases.py),
the leader's admission check (peer/core/admission.py) and the audit share. The data epoch is a function
of the log alone: epoch e ends with the entry that commits its last uncommitted sample, and the next
entry belongs to e + 1 (docs/decisions/leases-epochs-from-log.md). Owners never grant a sample of
e + 1 before that entry, so an entry never mixes two epochs.

`audit` reports per epoch: samples total, committed exactly once, duplicated (in two or more
commits), lost (not committed when the epoch ended, which for the last epoch is when the caller
says the run ended), and from the owners' lease-event ledgers (docs/decisions/leases-audit-ledger.md)
grants, reclaims and steals. Duplicated and lost come from the log alone. With `VouchEvidence`, it
also checks every committed sample against its owner's word: unvouched samples are committed
samples that the block's owner did not vouch to that contributor for that round, although the
audit holds the owner's ledger (credit a site took for work it was not given: a violation);
unchecked ones are those whose owner's ledger was not given (docs/decisions/security-work-credit.md).

    .venv/bin/python -m ops.cli audit --data-dir runs/peer-a --json
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace

from peer.core.commitlog import (
    Body, RoundCommit, SampleRange, VoterChange, Voters, apply_trainerless, apply_voter_change, lease_owners
)
from peer.core.election import SiteId
from peer.core.lease_types import (
    of_range,
    BlockId,
    DataEpoch,
    EventKind,
    Gen,
    LeaseEvent,
    Span,
    Spans,
    count,
    intersect,
    normalize,
    subtract,
)
from peer.core.ring import RingView

SiteRanges = tuple[SiteId, Sequence[SampleRange]]
"""What the ledger needs of a RoundCommit contributor: its site and the ranges it trained."""


@dataclass(frozen=True)
class Applied:
    """What folding one RoundCommit did."""

    data_epoch: DataEpoch
    """The epoch the entry belongs to."""
    new_samples: int
    duplicated_samples: int
    """Samples already committed in the epoch: non-zero only on a log that broke I4."""
    foreign_samples: int
    """Samples of blocks outside the universe (another data config): always a bug."""
    epoch_ended: bool


class EpochLedger:
    """Committed samples of the current data epoch, as the log says."""

    def __init__(self, universe: Mapping[int, int]) -> None:
        self.sizes: dict[BlockId, int] = {BlockId(b): n for b, n in universe.items()}
        """Every block of the dataset and its number of samples (the same in every epoch)."""
        if any(n <= 0 for n in self.sizes.values()):
            raise ValueError("every block needs at least one sample")
        self.blocks: list[BlockId] = sorted(self.sizes)
        self.total = sum(self.sizes.values())
        self.data_epoch = DataEpoch(0)
        self.last_round = 0
        self._done: dict[BlockId, Spans] = {}
        self._committed = 0

    @classmethod
    def from_log(cls, universe: Mapping[int, int],
                 commits: Iterable[tuple[int, Iterable[SiteRanges]]]) -> EpochLedger:
        """Replay RoundCommits (round, contributors) in log order: what a peer that lost its lease
        shards (owner and replicas) rebuilds them from."""
        ledger = cls(universe)
        for rnd, contributors in commits:
            ledger.apply(rnd, contributors)
        return ledger

    def size(self, block: BlockId) -> int:
        return self.sizes[block]

    def done(self, block: BlockId) -> Spans:
        return self._done.get(block, ())

    @property
    def committed(self) -> int:
        """Samples of the current epoch committed so far."""
        return self._committed

    def is_committed(self, r: SampleRange) -> Spans:
        """The part of `r` already committed in the current epoch."""
        return intersect(of_range(r), self.done(BlockId(r.block_id)))

    def apply(self, round_: int, contributors: Iterable[SiteRanges]) -> Applied:
        """Fold one RoundCommit (rounds arrive in log order)."""
        epoch = self.data_epoch
        new = dup = foreign = 0
        for _, ranges in contributors:
            for r in ranges:
                b = BlockId(r.block_id)
                if b not in self.sizes or r.end > self.sizes[b]:
                    foreign += r.end - r.start
                    continue
                before = self.done(b)
                overlap = intersect(of_range(r), before)
                dup += count(overlap)
                self._done[b] = normalize(before + of_range(r))
                new += count(self._done[b]) - count(before)
        self._committed += new
        self.last_round = max(self.last_round, round_)
        ended = self._committed == self.total
        if ended:
            self.data_epoch = DataEpoch(epoch + 1)
            self._done.clear()
            self._committed = 0
        return Applied(epoch, new, dup, foreign, ended)


@dataclass(frozen=True)
class EpochAudit:
    """One line of `ops audit` (its JSON keys)."""

    epoch: int
    samples_total: int
    committed_once: int
    duplicated: int
    """Samples committed in two or more entries of the epoch (I4 broken)."""
    lost: int
    """Samples not committed when the epoch ended (I5 broken); 0 while it runs."""
    grants: int
    reclaimed: int
    reclaimed_pct: float
    stolen: int
    ended: bool
    rounds: int
    """Round entries that committed samples of this epoch."""
    foreign: int
    """Committed samples outside the dataset (another config): counted as a violation."""
    unvouched: int = 0
    """Committed samples their block's owner, whose ledger the audit holds, did not vouch to the
    contributor for that round: work credited that was not leased (a violation)."""
    unchecked: int = 0
    """Committed samples no vouch covers whose owner's ledger was not given: not judged."""

    @property
    def ok(self) -> bool:
        return self.duplicated == 0 and self.lost == 0 and self.foreign == 0 and self.unvouched == 0


@dataclass(frozen=True)
class VouchEvidence:
    """What the audit checks committed samples against: the owners' word, from their ledgers."""

    events: tuple[LeaseEvent, ...]
    """The VOUCH events of the ledgers given (others are ignored)."""
    views: Mapping[int, RingView]
    """Every ring view of the log by version (the log index of its voter change): a vouch counts
    only if its owner was the block's primary in the view it names."""
    recent: Mapping[int, tuple[int, ...]]
    """Per committed round: the versions of the ring views whose primary may have vouched for it,
    those the leader accepts (peer/core/lease_log.py `accepted_view`): the last three before the
    round's commit, and every view since the one before the view in force at the commit before the
    previous one."""
    given: frozenset[SiteId]
    """Sites whose ledgers were given (`<data dir>/leases/owners`): a sample is judged only if every
    owner that may have vouched for it is among them."""

    @classmethod
    def from_log(cls, entries: Iterable[tuple[int, Body]], events: Iterable[LeaseEvent],
                 given: Iterable[SiteId]) -> VouchEvidence:
        """From (log index, body) of the committed entries in log order, the ledgers' events and
        whose ledgers they are."""
        voters: Voters = ()
        trainerless: frozenset[SiteId] = frozenset()
        views: dict[int, RingView] = {}
        recent: dict[int, tuple[int, ...]] = {}
        since = (0, 0)  # positions (in `views`) of the views in force at the last two round commits
        for index, body in entries:
            if isinstance(body, VoterChange):
                voters = apply_voter_change(voters, body)
                trainerless = apply_trainerless(trainerless, body)
                views[index] = RingView.of(index, lease_owners(voters, trainerless))
            elif isinstance(body, RoundCommit):
                recent[body.round] = tuple(views)[max(min(since[0] - 1, len(views) - 3), 0):]
                since = (since[1], max(len(views) - 1, 0))
        return cls(tuple(e for e in events if e.kind is EventKind.VOUCH), views, recent, frozenset(given))

    def vouched(self) -> dict[tuple[int, SiteId, BlockId], Spans]:
        """(round, holder, block) -> samples vouched by the block's primary of the view named, one
        of the round's recent views (a site's own ledger cannot vouch it blocks it does not own)."""
        out: dict[tuple[int, SiteId, BlockId], Spans] = {}
        for e in self.events:
            view = self.views.get(e.ring_version)
            if (e.site is None or view is None or view.primary(e.block) != e.owner
                    or e.ring_version not in self.recent.get(e.round, ())):
                continue
            key = (e.round, e.site, e.block)
            out[key] = normalize(out.get(key, ()) + e.spans)
        return out

    def judged(self, round_: int, block: BlockId) -> bool:
        """Every owner that may have vouched for `block` in `round_` gave its ledger."""
        owners = {self.views[v].primary(block) for v in self.recent.get(round_, ())}
        return bool(owners) and owners <= self.given


def audit(universe: Mapping[int, int], commits: Iterable[tuple[int, Iterable[SiteRanges]]],
          events: Iterable[LeaseEvent] = (), run_ended: bool = False,
          vouches: VouchEvidence | None = None) -> list[EpochAudit]:
    """Per-epoch accounting of a log's RoundCommits (round, contributors) in log order.

    Samples are counted once per epoch; a sample in two entries adds one to `duplicated` however
    often it repeats. With `run_ended`, the last epoch counts as ended (its uncommitted samples are
    lost); otherwise it is in progress. Lease events are deduplicated by (kind, epoch, block, gen),
    so ledgers of several peers may be passed together. With `vouches`, committed samples are
    checked against the owners' vouches (`unvouched`, `unchecked`)."""
    ledger = EpochLedger(universe)
    vouched = vouches.vouched() if vouches is not None else {}
    per: dict[int, dict[str, int]] = {}
    dups: dict[int, dict[BlockId, Spans]] = {}
    for rnd, contributors in commits:
        contributors = list(contributors)
        if not any(rs for _, rs in contributors):
            ledger.last_round = max(ledger.last_round, rnd)
            continue
        epoch = ledger.data_epoch
        seen_before = {b: ledger.done(b) for _, rs in contributors for b in {BlockId(r.block_id) for r in rs}}
        a = ledger.apply(rnd, contributors)
        st = per.setdefault(epoch, {"rounds": 0, "foreign": 0, "committed": 0, "unvouched": 0, "unchecked": 0})
        st["rounds"] += 1
        st["foreign"] += a.foreign_samples
        st["committed"] += a.new_samples
        if vouches is not None:
            for site, ranges in contributors:
                for r in ranges:
                    b = BlockId(r.block_id)
                    missing = count(subtract(of_range(r), vouched.get((rnd, site, b), ())))
                    st["unvouched" if vouches.judged(rnd, b) else "unchecked"] += missing
        if a.duplicated_samples:
            _record_dups(dups.setdefault(epoch, {}), contributors, seen_before, ledger.sizes)
    stats = _event_counts(events)
    last = ledger.data_epoch
    out = []
    for epoch in map(DataEpoch, range(0, last + 1)):
        st = per.get(epoch, {"rounds": 0, "foreign": 0, "committed": 0, "unvouched": 0, "unchecked": 0})
        if epoch == last and not st["rounds"] and not run_ended and epoch not in stats:
            break
        ended = epoch < last or run_ended
        dup = sum(count(s) for s in dups.get(epoch, {}).values())
        grants, reclaimed, stolen = stats.get(epoch, (0, 0, 0))
        out.append(EpochAudit(
            epoch=epoch, samples_total=ledger.total, committed_once=st["committed"] - dup, duplicated=dup,
            lost=ledger.total - st["committed"] if ended else 0, grants=grants, reclaimed=reclaimed,
            reclaimed_pct=round(100.0 * reclaimed / grants, 3) if grants else 0.0, stolen=stolen,
            ended=ended, rounds=st["rounds"], foreign=st["foreign"], unvouched=st["unvouched"],
            unchecked=st["unchecked"]))
    return out


def _record_dups(acc: dict[BlockId, Spans], contributors: Sequence[SiteRanges],
                 before: Mapping[BlockId, Spans], sizes: Mapping[BlockId, int]) -> None:
    """Distinct samples of this entry committed before, or twice within it."""
    seen = dict(before)
    for _, ranges in contributors:
        for r in ranges:
            b = BlockId(r.block_id)
            if b not in sizes:
                continue
            acc[b] = normalize(acc.get(b, ()) + intersect(of_range(r), seen.get(b, ())))
            seen[b] = normalize(seen.get(b, ()) + of_range(r))


def _event_counts(events: Iterable[LeaseEvent]) -> dict[int, tuple[int, int, int]]:
    """(grants, reclaimed, stolen) per data epoch; a steal is also a grant."""
    seen: set[tuple[EventKind, int, int, int]] = set()
    out: dict[int, list[int]] = {}
    for e in events:
        key = (e.kind, e.data_epoch, e.block, e.gen)
        if key in seen:
            continue
        seen.add(key)
        c = out.setdefault(e.data_epoch, [0, 0, 0])
        c[0] += e.kind in (EventKind.GRANT, EventKind.STEAL)
        c[1] += e.kind is EventKind.RECLAIM
        c[2] += e.kind is EventKind.STEAL
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def event_to_json(e: LeaseEvent) -> str:
    """One line of a peer's lease ledger (`<data dir>/leases/ledger.jsonl`); a VOUCH event also has
    round, spans ([[start, end], ...]), ring_version and owner."""
    o: dict[str, object] = {"kind": e.kind.value, "epoch": e.data_epoch, "block": e.block, "gen": e.gen,
                            "site": e.site, "at": e.at}
    if e.kind is EventKind.VOUCH:
        o.update(round=e.round, spans=[[x.start, x.end] for x in e.spans], ring_version=e.ring_version, owner=e.owner)
    return json.dumps(o, sort_keys=True)


def event_from_json(line: str) -> LeaseEvent:
    o = json.loads(line)
    e = LeaseEvent(EventKind(o["kind"]), DataEpoch(o["epoch"]), BlockId(o["block"]), Gen(o["gen"]),
                   SiteId(o["site"]) if o["site"] is not None else None, float(o["at"]))
    if e.kind is not EventKind.VOUCH:
        return e
    return replace(e, round=int(o["round"]), spans=normalize(Span(int(s), int(t)) for s, t in o["spans"]),
                   ring_version=int(o["ring_version"]), owner=SiteId(str(o["owner"])))


def audit_to_json(rows: Sequence[EpochAudit]) -> str:
    return json.dumps([asdict(r) for r in rows], indent=2)


def universe_to_json(universe: Mapping[int, int]) -> str:
    """`<data dir>/leases/universe.json`: every block of the dataset and its sample count, written by
    the node from the trainer's BlockIndex (the same on every peer of a run)."""
    return json.dumps({"blocks": [[b, n] for b, n in sorted(universe.items())]})


def universe_from_json(text: str) -> dict[int, int]:
    return {int(b): int(n) for b, n in json.loads(text)["blocks"]}
