"""Quorum writes of the lease owner: which replica holds which rev, and the answers held back until
a strict majority of a block's owners (the primary included) holds what they promise.

A change is applied at the primary at once and pushed to the other owners; the answer to the holder
(a grant, a start, a voucher) goes out only once a majority holds the record's rev, so a later
primary that reads a majority of the owners sees every write a holder was told of (docs/leases.md,
"Quorum writes"). The owner (peer/core/leases.py) replicates and resends; this module counts.

    .venv/bin/python -m pytest tests/unit/test_leases.py -q
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from peer.core.ids import BlockId, SiteId
from peer.core.lease_types import Send
from peer.core.ring import quorum


@dataclass
class _Deferred:
    send: Send
    needs: tuple[tuple[BlockId, int], ...]
    """(block, rev) that a quorum must hold before `send` goes out."""


class QuorumAnswers:
    """The replicas' acknowledged revs per block, and the answers waiting on them."""

    def __init__(self) -> None:
        self.acks: dict[BlockId, dict[SiteId, int]] = {}
        """The highest rev each other owner acknowledged, per block."""
        self.deferred: list[_Deferred] = []

    def clear(self) -> None:
        self.acks.clear()
        self.deferred.clear()

    def ack(self, b: BlockId, site: SiteId, rev: int) -> None:
        per = self.acks.setdefault(b, {})
        per[site] = max(rev, per.get(site, 0))

    def holds(self, b: BlockId, rev: int, owners: Sequence[SiteId]) -> bool:
        """A majority of `owners` (the primary, counted without an ack, among them) holds `rev` of `b`."""
        have = 1 + sum(1 for s, r in self.acks.get(b, {}).items() if s in owners and r >= rev)
        return have >= quorum(len(owners))

    def hold(self, send: Send, needs: tuple[tuple[BlockId, int], ...]) -> None:
        """Send `send` once a majority holds every (block, rev) of `needs`."""
        self.deferred.append(_Deferred(send, needs))

    def release(self, holds: Callable[[BlockId, int], bool]) -> list[Send]:
        """The held answers whose needs a majority now holds, in the order they were held."""
        out: list[Send] = []
        keep = []
        for d in self.deferred:
            if all(holds(b, rev) for b, rev in d.needs):
                out.append(d.send)
            else:
                keep.append(d)
        self.deferred = keep
        return out
