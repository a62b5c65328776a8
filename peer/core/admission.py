"""Commit-time check of contributions against leases and the log (invariant I6).

The leader calls `admit_round` when it closes round r, with the contributions that arrived in time.
A contribution is included only if every sample range it names

* lies inside a block of the dataset,
* is covered by a voucher the block's lease owner issued to that site for round r (the owner vouches
  only for a current lease it saw started, and never for samples another holder has pending), and
* is not committed in this data epoch (per the log: `EpochLedger`) nor claimed by a contribution
  already included in this round;

otherwise the whole contribution is excluded, with the first reason found, and its ranges are
freed (owners drop the round's pending claims when they apply the commit). Contributions are
judged in site order, the order they are listed in the entry, so every leader decides alike.

The log check alone guarantees I4 even if lease state was lost and rebuilt; the voucher check is
what keeps a zombie (a holder paused past its lease) or a late contributor out.

With a `Credit` (the node's leader), a site cannot credit itself work it was not given, nor weigh
more than its work (docs/decisions/security-work-credit.md): every voucher must be the owner's word
for this site and round (peer/core/vouchers.py: signed by the block's primary, checked against the
run CA), and the tokens it claims (its weight in the outer step) may not exceed what its samples
hold, `samples x tokens_per_sample` (every sample is `seq_len` tokens, the same data index at
every site). A contribution that breaks either is excluded as a whole, like any other.

    .venv/bin/python -m pytest tests/unit/test_admission.py -q
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from peer.core import vouchers
from peer.core.audit import EpochLedger
from peer.core.commitlog import SampleRange
from peer.core.election import SiteId
from peer.core.exclusion import ExclusionKind
from peer.core.lease_types import BlockId, Spans, Voucher, fmt, intersect, normalize, of_range, subtract
from peer.core.ring import RingView


@dataclass(frozen=True)
class Offer:
    """What a site offers for round `round` (its manifest's accounting part)."""

    site: SiteId
    round: int
    ranges: tuple[SampleRange, ...]
    vouchers: tuple[Voucher, ...]
    """The owners' TrainedReply vouchers for this round."""
    tokens: int | None = None
    """Tokens the site says it trained: its weight in the outer step (None: not offered, as by a
    caller that only settles claims; the bound below is then not checked)."""


@dataclass(frozen=True)
class Credit:
    """What the leader checks before it credits a contribution with its samples and its tokens."""

    tokens_per_sample: int
    """Tokens one sample holds (the trainer's seq_len): a contribution may claim at most its samples
    times this. 0: tokens are not bounded (a caller without a trainer)."""
    view: Callable[[int], RingView | None]
    """The ring view of a version, if the leader accepts vouchers of it (a recent view of its log,
    `LeaseLog.accepted_view`; None otherwise): the voucher's owner must be the block's primary there."""
    verify: vouchers.Verify | None = None
    """Checks an owner's signature against its certificate and the run CA; None in an insecure run,
    where the fields are checked but not who wrote them (`vouchers.UNSIGNED`)."""

    def __post_init__(self) -> None:
        if self.tokens_per_sample < 0:
            raise ValueError(f"tokens_per_sample {self.tokens_per_sample} < 0")


@dataclass(frozen=True)
class Admission:
    site: SiteId
    included: bool
    reason: str
    freed: tuple[SampleRange, ...]
    """Ranges going back to free (all of them when excluded, none when included)."""
    kind: ExclusionKind | None = None
    """Why it is excluded, as a kind (None when included)."""


def admit_contribution(c: Offer, round_: int, ledger: EpochLedger,
                       taken: dict[BlockId, Spans], credit: Credit | None = None) -> Admission:
    """Decide one contribution; on inclusion, its samples are added to `taken` (this round's)."""
    found = _why_not(c, round_, ledger, taken)
    if found is None and credit is not None:  # a signature check only for what passed the rest
        not_credited = _not_credited(c, round_, credit)
        found = (ExclusionKind.INVALID, not_credited) if not_credited else None
    if found is not None:
        kind, why = found
        return Admission(c.site, False, f"excluded: {why}", c.ranges, kind)
    for r in c.ranges:
        b = BlockId(r.block_id)
        taken[b] = normalize(taken.get(b, ()) + of_range(r))
    n = sum(r.end - r.start for r in c.ranges)
    return Admission(c.site, True, f"included: {n} samples in {len(c.ranges)} ranges", ())


def admit_round(round_: int, contributions: Iterable[Offer], ledger: EpochLedger,
                credit: Credit | None = None) -> list[Admission]:
    """Decide every contribution of round `round_`, in site order (with `credit`: also whose word
    vouches for its samples, and its tokens against them)."""
    taken: dict[BlockId, Spans] = {}
    return [admit_contribution(c, round_, ledger, taken, credit) for c in sorted(contributions, key=lambda c: c.site)]


def _not_credited(c: Offer, round_: int, credit: Credit) -> str:
    """Why `c` may not be credited the samples its vouchers name or the tokens it claims."""
    certs: dict[SiteId, bytes] = {}
    for v in c.vouchers:
        cert = v.certificate or certs.get(v.owner, b"")
        if v.certificate:
            certs.setdefault(v.owner, v.certificate)
        why = vouchers.check(v, c.site, round_, credit.view, credit.verify, cert)
        if why:
            return why
    if credit.tokens_per_sample and c.tokens is not None:
        n = sum(r.end - r.start for r in c.ranges)
        most = n * credit.tokens_per_sample
        if c.tokens > most:
            return (f"{c.site} claims {c.tokens} tokens for {n} samples of {credit.tokens_per_sample} tokens "
                    f"(at most {most})")
    return ""


def _why_not(c: Offer, round_: int, ledger: EpochLedger,
             taken: dict[BlockId, Spans]) -> tuple[ExclusionKind, str] | None:
    if c.round != round_:
        return ExclusionKind.WRONG_ROUND, f"contribution is for round {c.round}, closing round {round_}"
    if not c.ranges:
        return ExclusionKind.INVALID, "no samples named"
    vouched: dict[BlockId, Spans] = {}
    for v in c.vouchers:
        vouched[v.block_id] = normalize(vouched.get(v.block_id, ()) + v.spans)
    own: dict[BlockId, Spans] = {}
    for r in c.ranges:
        b, span = BlockId(r.block_id), of_range(r)
        if b not in ledger.sizes or r.end > ledger.size(b):
            return ExclusionKind.INVALID, f"range {r.start}..{r.end} of block {b} is not in the dataset"
        if intersect(span, own.get(b, ())):
            return ExclusionKind.INVALID, f"block {b}: range {r.start}..{r.end} named twice"
        own[b] = normalize(own.get(b, ()) + span)
        missing = subtract(span, vouched.get(b, ()))
        if missing:
            return ExclusionKind.NOT_LEASED, f"block {b}: samples {fmt(missing)} were not leased to {c.site} for round {round_}"
        done = intersect(span, ledger.done(b))
        if done:
            return (ExclusionKind.ALREADY_COMMITTED,
                    f"block {b}: samples {fmt(done)} already committed in data epoch {ledger.data_epoch}")
        clash = intersect(span, taken.get(b, ()))
        if clash:
            return (ExclusionKind.DUPLICATE,
                    f"block {b}: samples {fmt(clash)} already included in round {round_} from another site")
    return None
