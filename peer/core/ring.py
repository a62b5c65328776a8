"""Block -> lease owners by rendezvous (highest-random-weight) hashing over the ring's members.

Thaler & Ravishankar, "Using name-based mappings to increase hit rates" (HRW, 1998): every member
scores every block with a hash of (member, block); the block's owners are the R best scores, the
first of them the primary. Removing a member only moves the blocks it owned (every other member's
relative order is unchanged, so the next-best member steps up); adding one only takes blocks from
others where it scores in the top R. No virtual nodes are needed: scores are independent per block,
so the load is balanced to within sampling noise.

The ring is computed from a `RingView`: the member list plus a version that only grows. The node
takes both from the committed voter set (a log position), so every peer that applied the same log
prefix computes the same owners; lease messages carry the version and are fenced by it.

    .venv/bin/python -c "from peer.core.ring import *; v=RingView(1, ('a','b','c','d')); print(v.owners(812))"
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import blake3

from peer.core.election import SiteId

REPLICAS = 3
"""R: owners per block (primary + R-1 replicas); all members when fewer (docs/leases.md)."""

_MASK = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a cheap, well-mixed 64-bit permutation (the per-block score)."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK
    return x ^ (x >> 31)


def site_seed(site: SiteId) -> int:
    """A member's 64-bit hash key, stable across runs and platforms."""
    return int.from_bytes(blake3.blake3(site.encode()).digest(8), "big")


def score(seed: int, block_id: int) -> int:
    """HRW weight of (member, block); ties are broken by site name where it is used."""
    return _mix64(seed ^ _mix64(block_id & _MASK))


def quorum(n: int) -> int:
    """Strict majority of a replica set of n: two writes (or a write and a read) always intersect."""
    return n // 2 + 1


@dataclass(frozen=True)
class RingView:
    """The members lease shards are spread over, at one version of the voter set."""

    version: int
    """Grows with every membership change (the node uses the log index of the voter change);
    generations minted under a view start with it, so they order across views."""
    members: tuple[SiteId, ...]
    """Sorted, unique."""
    replicas: int = REPLICAS
    _seeds: tuple[tuple[int, SiteId], ...] = field(init=False, repr=False, compare=False)
    _owners: dict[int, tuple[SiteId, ...]] = field(init=False, repr=False, compare=False)
    """Memo of owners(): a view is immutable, and every lease message looks owners up."""

    def __post_init__(self) -> None:
        if list(self.members) != sorted(set(self.members)):
            raise ValueError(f"ring members must be sorted and unique, got {self.members}")
        if self.version < 0 or self.replicas < 1:
            raise ValueError(f"bad ring view version={self.version} replicas={self.replicas}")
        object.__setattr__(self, "_seeds", tuple((site_seed(m), m) for m in self.members))
        object.__setattr__(self, "_owners", {})

    @classmethod
    def of(cls, version: int, members: Iterable[str], replicas: int = REPLICAS) -> RingView:
        return cls(version, tuple(sorted({SiteId(m) for m in members})), replicas)

    @property
    def width(self) -> int:
        """Owners per block under this view: R, or every member when there are fewer."""
        return min(self.replicas, len(self.members))

    def owners(self, block_id: int) -> tuple[SiteId, ...]:
        """Primary first, then the replicas, by descending HRW score."""
        got = self._owners.get(block_id)
        if got is None:
            ranked = sorted(self._seeds, key=lambda sm: (-score(sm[0], block_id), sm[1]))
            got = self._owners[block_id] = tuple(m for _, m in ranked[: self.width])
        return got

    def primary(self, block_id: int) -> SiteId | None:
        owners = self.owners(block_id)
        return owners[0] if owners else None


def moved(before: RingView, after: RingView, blocks: Sequence[int]) -> tuple[int, int]:
    """(blocks whose owner set changed, blocks whose primary changed) between two views: the number
    of records a membership change moves (docs/leases.md reports it per change)."""
    sets = primaries = 0
    for b in blocks:
        ob, oa = before.owners(b), after.owners(b)
        sets += set(ob) != set(oa)
        primaries += ob[:1] != oa[:1]
    return sets, primaries
