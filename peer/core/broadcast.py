"""Transmit-limited rumour queue for piggybacked dissemination (SWIM section 4.1, memberlist queue.go).

Every member keeps at most one queued rumour per subject member (a newer rumour about the same
member replaces the older one, which it supersedes). Each time rumours are piggybacked on an
outgoing message, the least-transmitted (then newest) ones go first, and a rumour is dropped after
`limit` transmissions; the limit is retransmit_mult * ceil(log10(n + 1)), so a rumour reaches all n
members with high probability in O(log n) periods while the queue stays bounded.

    python -c "from peer.core.broadcast import BroadcastQueue as Q; q = Q(); q.push('b', 'x'); \
print(q.take(8, 3))"
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class _Entry(Generic[T]):
    item: T
    transmits: int
    order: int  # insertion counter: among equals, newer rumours go first


class BroadcastQueue(Generic[T]):
    """Rumours keyed by subject; `take` hands out the least-sent ones and retires spent ones."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry[T]] = {}
        self._counter = 0

    def __len__(self) -> int:
        return len(self._entries)

    def push(self, key: str, item: T) -> None:
        """Queue `item` about `key`, replacing (invalidating) any queued rumour about `key`."""
        self._counter += 1
        self._entries[key] = _Entry(item, 0, self._counter)

    def discard(self, key: str) -> None:
        """Drop any queued rumour about `key` (its subject was forgotten)."""
        self._entries.pop(key, None)

    def take(self, max_items: int, limit: int) -> list[T]:
        """Up to max_items rumours to piggyback now; each counts one transmission of at most limit."""
        if not self._entries or max_items <= 0:
            return []
        chosen = heapq.nsmallest(max_items, self._entries.items(),
                                 key=lambda kv: (kv[1].transmits, -kv[1].order))
        out: list[T] = []
        for key, entry in chosen:
            out.append(entry.item)
            entry.transmits += 1
            if entry.transmits >= limit:
                del self._entries[key]
        return out

    def pending(self) -> list[T]:
        """Queued rumours (for inspection and tests), least-sent first."""
        return [e.item for e in sorted(self._entries.values(), key=lambda e: (e.transmits, -e.order))]
