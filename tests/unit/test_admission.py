"""Commit-time check I6: include only fully vouched, uncommitted contributions; judge in site order."""

from __future__ import annotations

import pytest

from peer.core.admission import Contribution, admit_round
from peer.core.audit import EpochLedger
from peer.core.commitlog import SampleRange
from peer.core.election import SiteId
from peer.core.lease_types import BlockId, Gen, Voucher, spans

UNIVERSE = {812: 10, 813: 10}


def contrib(site: str, rnd: int, ranges: list[tuple[int, int, int]], vouched: list[tuple[int, int, int]] | None = None) -> Contribution:
    rs = tuple(SampleRange(b, s, e) for b, s, e in ranges)
    vs = tuple(Voucher(BlockId(b), Gen(1), spans((s, e))) for b, s, e in (ranges if vouched is None else vouched))
    return Contribution(SiteId(site), rnd, rs, vs)


CASES = [
    ("all vouched, nothing committed", contrib("a", 3, [(812, 0, 4)]), True, "included: 4 samples in 1 ranges"),
    ("wrong round", contrib("a", 2, [(812, 0, 4)]), False, "excluded: contribution is for round 2, closing round 3"),
    ("no voucher for part", contrib("a", 3, [(812, 0, 6)], [(812, 0, 4)]), False,
     "excluded: block 812: samples 4..6 were not leased to a for round 3"),
    ("already committed", contrib("a", 3, [(813, 1, 3)]), False,
     "excluded: block 813: samples 1..2 already committed in data epoch 0"),
    ("outside the dataset", contrib("a", 3, [(999, 0, 1)]), False,
     "excluded: range 0..1 of block 999 is not in the dataset"),
    ("past the block's end", contrib("a", 3, [(812, 8, 11)]), False,
     "excluded: range 8..11 of block 812 is not in the dataset"),
    ("named twice", contrib("a", 3, [(812, 0, 4), (812, 2, 5)], [(812, 0, 5)]), False,
     "excluded: block 812: range 2..5 named twice"),
    ("empty", contrib("a", 3, [], []), False, "excluded: no samples named"),
]


@pytest.mark.parametrize("name,c,included,reason", CASES, ids=[c[0] for c in CASES])
def test_single_contribution(name: str, c: Contribution, included: bool, reason: str) -> None:
    ledger = EpochLedger(UNIVERSE)
    ledger.apply(1, [(SiteId("z"), [SampleRange(813, 0, 2)])])
    ledger.apply(2, [])
    (d,) = admit_round(3, [c], ledger)
    assert (d.included, d.reason) == (included, reason)
    assert d.freed == (() if included else c.ranges)


def test_overlap_in_one_round_goes_to_the_first_site_and_excludes_the_whole_other() -> None:
    ledger = EpochLedger(UNIVERSE)
    b = contrib("b", 1, [(812, 0, 2), (813, 0, 5)])
    a = contrib("a", 1, [(813, 4, 6)])
    da, db = admit_round(1, [b, a], ledger)
    assert (da.site, da.included) == ("a", True)
    assert (db.site, db.included) == ("b", False)
    assert db.reason == "excluded: block 813: samples 4..5 already included in round 1 from another site"
    assert db.freed == b.ranges, "the whole contribution is freed, also its clean block 812"


def test_committing_the_decisions_never_commits_a_sample_twice() -> None:
    ledger = EpochLedger(UNIVERSE)
    rounds = [[contrib("a", 1, [(812, 0, 5)]), contrib("b", 1, [(812, 3, 8)])],
              [contrib("b", 2, [(812, 3, 8)]), contrib("c", 2, [(812, 5, 10), (813, 0, 10)])]]
    for rnd, cs in enumerate(rounds, start=1):
        ds = admit_round(rnd, cs, ledger)
        by = {c.site: c for c in cs}
        applied = ledger.apply(rnd, [(d.site, by[d.site].ranges) for d in ds if d.included])
        assert applied.duplicated_samples == 0
    # a's 812[0,5) and c's 812[5,10) + 813 cover the dataset exactly once: the epoch ended
    assert ledger.data_epoch == 1 and ledger.committed == 0
