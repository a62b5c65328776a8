"""Giving back at the tail: a started block's rest, kept for the idle site that asked for it.

A started block is never stolen, so at the end of a data epoch a slow site could keep a block for many
rounds while a fast one idles. When an idle site's steal finds nothing, the block's primary marks the
started blocks of holders it is clearly faster than (`LeaseConfig.give_back_faster`) as wanted by
that site, for one ttl; the holder hears it in its next `RenewReply.wanted` and gives the rest back
with its next claim, and the rest is granted only to that site until the mark lapses
(docs/leases.md, "Giving back at the tail"; docs/decisions/leases-give-back-at-the-tail.md). A hint,
kept by the primary alone: lost on a restart or a view change, which costs speed, never correctness.

    .venv/bin/python -m pytest tests/unit/test_leases.py -q -k give
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from peer.core.ids import BlockId, SiteId
from peer.core.lease_config import LeaseConfig
from peer.core.lease_types import LeaseRecord, LeaseState


class GiveBack:
    """The primary's reservations of given-back rests, block by block."""

    def __init__(self, cfg: LeaseConfig) -> None:
        self.cfg = cfg
        self.wanted: dict[BlockId, tuple[SiteId, float]] = {}
        """Started blocks an idle site asked for when nothing was free or stealable: their holders
        are asked in the renew reply to give back what they have not taken, and the freed rest is
        granted only to that site until the time here."""

    def ask(self, site: SiteId, records: Iterable[LeaseRecord], paces: Mapping[SiteId, float], now: float) -> None:
        """An idle `site` found nothing free or stealable: ask the holders of started blocks with
        samples left to give those back (at their round's end), for `site` -- only holders it is
        clearly faster than, and over a reservation only for a slower site. Handing a slow holder's
        rest to a site slower still lengthened the tail: the whole-peer simulator's tail run (one
        site at 50 samples/s, two at 8) gave a block from one slow site to the other while the fast
        one idled 5 of 8 rounds."""
        pace = paces.get(site, 0.0)
        for rec in records:
            b = rec.block_id
            if rec.state is not LeaseState.STARTED or rec.holder is None or rec.holder == site or not rec.free_spans:
                continue
            if not pace > self.cfg.give_back_faster * paces.get(rec.holder, 0.0):  # (inf x 0 is nan: no)
                continue
            kept_for = self.reserved_for(b, now)
            if kept_for is None or paces.get(kept_for, 0.0) * self.cfg.give_back_faster < pace:
                self.wanted[b] = (site, now + self.cfg.ttl)

    def granted(self, b: BlockId, site: SiteId, now: float) -> None:
        """Block `b` was granted to `site`: if it was kept for it, it keeps it a ttl before anyone
        asks for it again."""
        if b in self.wanted:
            self.wanted[b] = (site, now + self.cfg.ttl)

    def reserved_for(self, b: BlockId, now: float) -> SiteId | None:
        """The idle site block `b`'s given-back rest is kept for, while its reservation lasts."""
        got = self.wanted.get(b)
        if got is None or got[1] <= now:
            self.wanted.pop(b, None)
            return None
        return got[0]

    def may_take(self, b: BlockId, site: SiteId, now: float) -> bool:
        """Block `b`'s given-back rest is kept for nobody, or for `site`."""
        return self.reserved_for(b, now) in (None, site)

    def clear(self) -> None:
        self.wanted.clear()
