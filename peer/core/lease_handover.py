"""A block's hand-over to a new primary after a ring view change: which record the new primary adopts.

A new primary serves a block only after reading the records of a majority of the block's previous
owners; the highest rev wins, which contains every acknowledged write (write quorum and read quorum
intersect). Quorum intersection covers only writes of the previous view, so a record must also have
been established there (adopted, with a rev minted under that view); otherwise, or when fewer than a
majority of previous owners answered completely, the owner rebuilds the record from the log
(docs/leases.md, "View changes"). The owner (peer/core/leases.py) keeps one `Handover` per block it
waits on and sends the `SyncRequest`s; this module decides.

    .venv/bin/python -m pytest tests/unit/test_leases.py -q -k "sync or rebuild or view"
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from peer.core.audit import EpochLedger
from peer.core.ids import BlockId, SiteId
from peer.core.lease_types import LeaseHeader, LeaseRecord, Send, SyncRequest, fresh_record


@dataclass
class Handover:
    """A block this peer became primary of, waiting for its previous owners' records."""

    waiting: set[SiteId]
    needed: int
    """Complete answers needed: a majority of the previous owner set."""
    established: int
    """Lowest rev a record must have to be known current: one the previous view's primary adopted
    (or wrote) and replicated. Older records may miss writes of a view whose owners are not asked."""
    got: list[LeaseRecord] = field(default_factory=list)
    complete: int = 0

    def heard(self, site: SiteId, complete: bool, rec: LeaseRecord | None) -> bool:
        """A SyncReply from `site` (`rec`: its record of the block, if it has one); True when it was
        the last answer awaited."""
        if site not in self.waiting:
            return False
        self.waiting.discard(site)
        if complete:
            self.complete += 1
            if rec is not None:
                self.got.append(rec)
        return not self.waiting

    def record(self, b: BlockId, ledger: EpochLedger, base: int) -> LeaseRecord | None:
        """The record to adopt for block `b` now that every answer is in (`base`: the new primary's
        mint base), merged with the log; None: rebuild it from the log."""
        if self.complete < self.needed:
            return None
        size, done = ledger.size(b), ledger.done(b)
        fresh = fresh_record(b, size, done, base, ledger.data_epoch)
        best = max((r for r in self.got if r.data_epoch == ledger.data_epoch), key=lambda r: r.rev,
                   default=fresh)
        if best.rev < self.established or not self.got:
            # The previous view's primary never established the record here (it was still syncing,
            # or crashed before a majority held it): the newest writes may sit with owners of an
            # older view or with the crashed primary alone. The log is the only safe source then.
            return None
        return replace(best, done=done, pending=tuple(p for p in best.pending if p.round > ledger.last_round))


def sync_requests(header: LeaseHeader, syncing: Mapping[BlockId, Handover]) -> list[Send]:
    """One SyncRequest per previous owner still awaited, naming every block it is awaited for."""
    per: dict[SiteId, list[BlockId]] = {}
    for b, s in sorted(syncing.items()):
        for m in s.waiting:
            per.setdefault(m, []).append(b)
    return [Send(m, SyncRequest(header, tuple(bs))) for m, bs in sorted(per.items())]
