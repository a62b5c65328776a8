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

    .venv/bin/python -m pytest tests/unit/test_admission.py -q
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from peer.core.audit import EpochLedger
from peer.core.commitlog import SampleRange
from peer.core.election import SiteId
from peer.core.lease_types import BlockId, Spans, Voucher, fmt, intersect, normalize, of_range, subtract


@dataclass(frozen=True)
class Contribution:
    """What a site offers for round `round` (its manifest's accounting part)."""

    site: SiteId
    round: int
    ranges: tuple[SampleRange, ...]
    vouchers: tuple[Voucher, ...]
    """The owners' TrainedReply vouchers for this round."""


@dataclass(frozen=True)
class Admission:
    site: SiteId
    included: bool
    reason: str
    freed: tuple[SampleRange, ...]
    """Ranges going back to free (all of them when excluded, none when included)."""


def admit_contribution(c: Contribution, round_: int, ledger: EpochLedger,
                       taken: dict[BlockId, Spans]) -> Admission:
    """Decide one contribution; on inclusion, its samples are added to `taken` (this round's)."""
    why = _why_not(c, round_, ledger, taken)
    if why:
        return Admission(c.site, False, f"excluded: {why}", c.ranges)
    for r in c.ranges:
        b = BlockId(r.block_id)
        taken[b] = normalize(taken.get(b, ()) + of_range(r))
    n = sum(r.end - r.start for r in c.ranges)
    return Admission(c.site, True, f"included: {n} samples in {len(c.ranges)} ranges", ())


def admit_round(round_: int, contributions: Iterable[Contribution], ledger: EpochLedger) -> list[Admission]:
    """Decide every contribution of round `round_`, in site order."""
    taken: dict[BlockId, Spans] = {}
    return [admit_contribution(c, round_, ledger, taken) for c in sorted(contributions, key=lambda c: c.site)]


def _why_not(c: Contribution, round_: int, ledger: EpochLedger, taken: dict[BlockId, Spans]) -> str:
    if c.round != round_:
        return f"contribution is for round {c.round}, closing round {round_}"
    if not c.ranges:
        return "no samples named"
    vouched: dict[BlockId, Spans] = {}
    for v in c.vouchers:
        vouched[v.block_id] = normalize(vouched.get(v.block_id, ()) + v.spans)
    own: dict[BlockId, Spans] = {}
    for r in c.ranges:
        b, span = BlockId(r.block_id), of_range(r)
        if b not in ledger.sizes or r.end > ledger.size(b):
            return f"range {r.start}..{r.end} of block {b} is not in the dataset"
        if intersect(span, own.get(b, ())):
            return f"block {b}: range {r.start}..{r.end} named twice"
        own[b] = normalize(own.get(b, ()) + span)
        missing = subtract(span, vouched.get(b, ()))
        if missing:
            return f"block {b}: samples {fmt(missing)} were not leased to {c.site} for round {round_}"
        done = intersect(span, ledger.done(b))
        if done:
            return f"block {b}: samples {fmt(done)} already committed in data epoch {ledger.data_epoch}"
        clash = intersect(span, taken.get(b, ()))
        if clash:
            return f"block {b}: samples {fmt(clash)} already included in round {round_} from another site"
    return ""
