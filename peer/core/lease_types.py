"""Value types of the data-lease protocol (DARL): spans, lease records, messages and effects.

A lease record is the soft state of one block of the current data epoch, held by the block's ring
owners (peer/core/ring.py). The holder side is peer/core/lease_client.py, the owner side peer/core/leases.py; the
wire form is protos/sitemesh/v1/leases.proto (one message per dataclass below, same field names).
What the log decides (committed samples, the data epoch) is computed by peer/core/audit.py's
`EpochLedger`, which both the owners and the audit use, so there is one definition of "committed".

    .venv/bin/python -m pytest tests/unit/test_leases.py -q
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Union

from peer.core.commitlog import SampleRange
from peer.core.election import SiteId
from peer.core.ids import BlockId, DataEpoch, Gen  # noqa: F401 - re-exported: the id types live in peer/core/ids.py

@dataclass(frozen=True, order=True)
class Span:
    """Samples [start, end) of one block, in the block's deterministic order."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"empty or negative span {self.start}..{self.end}")

    def __str__(self) -> str:
        return f"{self.start}..{self.end}"


Spans = tuple[Span, ...]
"""Sorted, disjoint, non-adjacent spans."""


def spans(*pairs: tuple[int, int]) -> Spans:
    """Spans from (start, end) pairs, normalized: `spans((0, 4), (6, 8))`."""
    return normalize(Span(s, e) for s, e in pairs if s < e)


def normalize(items: Iterable[Span]) -> Spans:
    out: list[Span] = []
    for x in sorted(items):
        if out and x.start <= out[-1].end:
            out[-1] = Span(out[-1].start, max(out[-1].end, x.end))
        else:
            out.append(x)
    return tuple(out)


def subtract(a: Spans, b: Spans) -> Spans:
    """a minus b (both normalized)."""
    out: list[Span] = []
    for x in a:
        cur = x.start
        for y in b:
            if y.end <= cur or y.start >= x.end:
                continue
            if y.start > cur:
                out.append(Span(cur, y.start))
            cur = max(cur, y.end)
        if cur < x.end:
            out.append(Span(cur, x.end))
    return tuple(out)


def intersect(a: Spans, b: Spans) -> Spans:
    return subtract(a, subtract(a, b))


def count(items: Spans) -> int:
    return sum(x.end - x.start for x in items)


def take(items: Spans, n: int) -> tuple[Spans, Spans]:
    """The first n samples of `items`, and the rest."""
    taken: list[Span] = []
    rest = list(items)
    while n > 0 and rest:
        x = rest.pop(0)
        k = min(n, x.end - x.start)
        taken.append(Span(x.start, x.start + k))
        if x.start + k < x.end:
            rest.insert(0, Span(x.start + k, x.end))
        n -= k
    return tuple(taken), tuple(rest)


def fmt(items: Spans) -> str:
    """For reasons: "0..4, 6..8"."""
    return ", ".join(str(x) for x in items)


def to_ranges(block: int, items: Spans) -> tuple[SampleRange, ...]:
    return tuple(SampleRange(block, x.start, x.end) for x in items)


def of_range(r: SampleRange) -> Spans:
    return (Span(r.start, r.end),)


def mint_base(ring_version: int, boot: int) -> int:
    """Lowest generation (and record rev) a primary mints under ring view `ring_version` in its
    `boot`-th process: view in the high 32 bits, boot in the next 16, a counter in the low 16."""
    return (ring_version << 32) | ((boot & 0xFFFF) << 16)


def next_gen(gen: int, base: int) -> Gen:
    return Gen(max(gen + 1, base))


class LeaseState(enum.Enum):
    """Where a block stands (docs/leases.md has the transitions)."""

    FREE = "free"
    """Some samples neither committed nor pending, and no holder: grantable."""
    LEASED = "leased"
    """Granted to a holder that has not started it: may be stolen by an idle site."""
    STARTED = "started"
    """The owner acknowledged the holder's start: never stolen, reclaimed only on expiry."""
    TRAINED_PENDING = "trained-pending"
    """No holder; every sample is committed or vouched for a round that is not decided yet."""
    COMMITTED = "committed"
    """Every sample is in the log for this data epoch."""


@dataclass(frozen=True)
class PendingClaim:
    """Samples a holder trained and the owner vouched for, awaiting round `round`'s commit."""

    round: int
    site: SiteId
    spans: Spans


@dataclass(frozen=True)
class LeaseRecord:
    """One block's lease record: replicated by the primary to the block's other ring owners."""

    block_id: BlockId
    size: int
    """Samples in the block."""
    rev: int
    """Replication version: bumped on every change; a replica keeps the highest it has seen."""
    generation: Gen
    """Generation of the current (or last) lease; a message with another one is stale."""
    holder: SiteId | None = None
    started: bool = False
    pending: tuple[PendingClaim, ...] = ()
    done: Spans = ()
    """Committed in this data epoch, per the log."""
    data_epoch: DataEpoch = DataEpoch(0)

    def __post_init__(self) -> None:
        if self.holder == "":  # the wire's "no holder"
            object.__setattr__(self, "holder", None)

    @property
    def pending_spans(self) -> Spans:
        return normalize(s for p in self.pending for s in p.spans)

    @property
    def free_spans(self) -> Spans:
        """What a (new) holder would train: neither committed nor pending."""
        return subtract(subtract((Span(0, self.size),), self.done), self.pending_spans)

    @property
    def state(self) -> LeaseState:
        if self.holder is not None:
            return LeaseState.STARTED if self.started else LeaseState.LEASED
        if self.free_spans:
            return LeaseState.FREE
        return LeaseState.TRAINED_PENDING if self.pending else LeaseState.COMMITTED

    def bumped(self, base: int, **changes: object) -> LeaseRecord:
        """A new version of the record (`base`: the primary's mint_base)."""
        return replace(self, rev=next_gen(self.rev, base), **changes)  # type: ignore[arg-type]


def fresh_record(block: BlockId, size: int, done: Spans, base: int, data_epoch: DataEpoch) -> LeaseRecord:
    """A record as the log alone describes it (also the rebuild after losing every owner)."""
    return LeaseRecord(block, size, base, Gen(base), done=done, data_epoch=data_epoch)


class EventKind(enum.Enum):
    """Lease events the primary appends to its ledger (the audit's grant/reclaim/steal counts)."""

    GRANT = "grant"
    STEAL = "steal"
    """A grant that took a leased-but-not-started block from another holder."""
    RECLAIM = "reclaim"
    """A lease expired and went back to free."""
    RELEASE = "release"
    """The holder gave the lease back (graceful leave, or it could not use it)."""
    REBUILD = "rebuild"
    """The owner could not reach a quorum of the previous owners and rebuilt from the log."""
    VOUCH = "vouch"
    """The owner vouched samples of the block to a holder for a round: its record of its word,
    which `ops audit` checks every committed sample against (docs/decisions/security-work-credit.md)."""


@dataclass(frozen=True)
class LeaseEvent:
    kind: EventKind
    data_epoch: DataEpoch
    block: BlockId
    gen: Gen
    site: SiteId | None
    """The new holder (grant, steal) or the one that lost it (reclaim, release)."""
    at: float
    """Owner's clock."""
    round: int = 0
    """VOUCH only: the round the samples are vouched for."""
    spans: Spans = ()
    """VOUCH only: the samples vouched (`site` is their holder)."""
    ring_version: int = 0
    """VOUCH only: the ring view the owner served the block under (it was the block's primary)."""
    owner: SiteId | None = None
    """VOUCH only: the owner that vouched (the one whose ledger holds the event)."""


# --- messages (protos/sitemesh/v1/leases.proto) ---


@dataclass(frozen=True)
class LeaseHeader:
    """Sender, and the fencing tokens every lease message carries."""

    site: SiteId
    leader_epoch: int
    """Consensus epoch the sender knows; an owner rejects anything older than its own."""
    ring_version: int
    """RingView.version the sender computed owners with; must equal the receiver's."""
    data_epoch: DataEpoch
    applied_round: int = 0
    """Last round the sender applied from the log: an owner takes no lease request from a holder
    that lags it by more than LeaseConfig.max_round_lag (its contributions could never count)."""
    pace: float = 0.0
    """Samples per compute second the sender trained in its last round (0: not measured yet): an
    owner wants a started block back at the tail only for a site clearly faster than its holder."""


@dataclass(frozen=True)
class LeaseRef:
    block_id: BlockId
    generation: Gen


@dataclass(frozen=True)
class Grant:
    block_id: BlockId
    generation: Gen
    spans: Spans
    """The samples the holder may train (the block minus committed and pending samples)."""


@dataclass(frozen=True)
class Refusal:
    block_id: BlockId
    reason: str


@dataclass(frozen=True)
class GrantRequest:
    header: LeaseHeader
    req: int
    """Holder's request number, echoed in the reply."""
    want: int
    """Leases the holder wants to hold from this owner in total (the prefetch depth)."""
    steal: bool
    """The holder found no free block anywhere: it may take leased-not-started ones."""


@dataclass(frozen=True)
class GrantReply:
    header: LeaseHeader
    req: int
    grants: tuple[Grant, ...]
    """Every lease the holder now holds from this owner that it has not started (a retried
    request gets the same leases back, never a second set)."""
    free_blocks: int
    """Grantable blocks left on this owner: the holder's hint where to ask next."""
    reason: str


@dataclass(frozen=True)
class Renew:
    header: LeaseHeader
    leases: tuple[LeaseRef, ...]
    """Every lease the holder holds whose primary is the receiver (one heartbeat per owner)."""
    sent_at: float
    """Holder's clock when sent; echoed so the holder times its lease from it."""


@dataclass(frozen=True)
class RenewReply:
    header: LeaseHeader
    renewed: tuple[LeaseRef, ...]
    lost: tuple[Refusal, ...]
    """Leases the holder no longer has (stolen, reclaimed), with why."""
    sent_at: float
    """Echo of the holder's send time: the holder's lease runs from it, on its own clock."""
    wanted: tuple[BlockId, ...] = ()
    """Renewed started blocks an idle site asked for: the holder's next claim of samples trained
    from one gives back the rest (keep=False)."""


@dataclass(frozen=True)
class Start:
    header: LeaseHeader
    lease: LeaseRef


@dataclass(frozen=True)
class StartReply:
    header: LeaseHeader
    lease: LeaseRef
    ok: bool
    reason: str


@dataclass(frozen=True)
class Claim:
    """Samples of one leased block the holder trained in a round."""

    lease: LeaseRef
    spans: Spans
    keep: bool
    """True: the holder goes on training the block; false: the lease ends with this claim."""


@dataclass(frozen=True)
class Trained:
    header: LeaseHeader
    round: int
    claims: tuple[Claim, ...]


@dataclass(frozen=True)
class Voucher:
    """The owner's word that `spans` of the block are this holder's to contribute in a round, bound
    to the owner by its signature (peer/core/vouchers.py says what is signed and how it is checked)."""

    block_id: BlockId
    generation: Gen
    spans: Spans
    holder: SiteId = SiteId("")
    """The site the samples are vouched to: only its contribution may name them."""
    round: int = 0
    """The outer round they are vouched for."""
    ring_version: int = 0
    """The ring view the owner served the block under: the leader checks `owner` was its primary."""
    owner: SiteId = SiteId("")
    """The lease owner that vouched (the block's primary) and signed."""
    signature: bytes = b""
    """The owner's ECDSA P-256 / SHA-256 signature of `vouchers.payload(self)` with its site key;
    empty in an insecure run (no keys)."""
    certificate: bytes = b""
    """The owner's site certificate (DER), issued by the run CA, that the signature verifies
    against; empty in an insecure run, or when an earlier voucher of the same owner in the same
    contribution carries it."""


@dataclass(frozen=True)
class TrainedReply:
    header: LeaseHeader
    round: int
    vouched: tuple[Voucher, ...]
    refused: tuple[Refusal, ...]


@dataclass(frozen=True)
class Release:
    header: LeaseHeader
    leases: tuple[LeaseRef, ...]


@dataclass(frozen=True)
class Replicate:
    header: LeaseHeader
    records: tuple[LeaseRecord, ...]


@dataclass(frozen=True)
class BlockRev:
    block_id: BlockId
    rev: int


@dataclass(frozen=True)
class ReplicateAck:
    header: LeaseHeader
    acked: tuple[BlockRev, ...]
    """Record versions now held by the replica."""


@dataclass(frozen=True)
class SyncRequest:
    """A new primary asks the block's previous owners for their records before serving it."""

    header: LeaseHeader
    block_ids: tuple[BlockId, ...]


@dataclass(frozen=True)
class SyncReply:
    header: LeaseHeader
    records: tuple[LeaseRecord, ...]
    """The replier's records of the requested blocks (a block it has none of is left out)."""
    complete: bool
    """False when the replier restarted since the view began (it lost its records): it does not
    count toward the majority of previous owners."""


@dataclass(frozen=True)
class Rejected:
    """A message was refused as a whole (fencing); the sender learns the receiver's tokens."""

    header: LeaseHeader
    req: int
    reason: str


Message = Union[
    GrantRequest, GrantReply, Renew, RenewReply, Start, StartReply, Trained, TrainedReply, Release,
    Replicate, ReplicateAck, SyncRequest, SyncReply, Rejected,
]


@dataclass(frozen=True)
class Send:
    """Effect: deliver `msg` to site `to` (the node's transport; the simulator's network)."""

    to: SiteId
    msg: Message
