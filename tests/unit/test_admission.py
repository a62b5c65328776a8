"""Commit-time check I6: include only fully vouched, uncommitted contributions; judge in site order."""

from __future__ import annotations

import pytest

from peer.core.admission import Offer, admit_round
from peer.core.audit import EpochLedger
from peer.core.commitlog import SampleRange
from peer.core.election import SiteId
from peer.core.lease_types import BlockId, Gen, Voucher, spans

UNIVERSE = {812: 10, 813: 10}


def contrib(site: str, rnd: int, ranges: list[tuple[int, int, int]], vouched: list[tuple[int, int, int]] | None = None) -> Offer:
    rs = tuple(SampleRange(b, s, e) for b, s, e in ranges)
    vs = tuple(Voucher(BlockId(b), Gen(1), spans((s, e))) for b, s, e in (ranges if vouched is None else vouched))
    return Offer(SiteId(site), rnd, rs, vs)


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
def test_single_contribution(name: str, c: Offer, included: bool, reason: str) -> None:
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


# ----- work credit: owner-bound vouchers and the token bound (docs/decisions/security-work-credit.md) -----
import hashlib  # noqa: E402
from dataclasses import replace  # noqa: E402

from peer.core.admission import Credit  # noqa: E402
from peer.core.ring import RingView  # noqa: E402
from peer.core.vouchers import VoucherKeys, payload, signed  # noqa: E402

VIEWS = {7: RingView.of(7, ["a", "b", "c"]), 5: RingView.of(5, ["a", "b"])}
"""The views the leader accepts (its log's last ones). Primaries: 812 -> a, 813 -> b."""
TPS = 128


def fake_keys(site: str) -> VoucherKeys:
    """A stand-in for the site keys: a "signature" is the signer's name and the payload's hash, and
    a "certificate" names its site (peer/vouching.py's real ECDSA is tested in test_vouching.py)."""
    def sign(p: bytes) -> bytes:
        return site.encode() + b":" + hashlib.sha256(p).digest()

    def verify(owner: SiteId, p: bytes, sig: bytes, cert: bytes) -> str:
        if cert != b"cert:" + owner.encode():
            return f"the certificate is not {owner}'s"
        return "" if sig == owner.encode() + b":" + hashlib.sha256(p).digest() else "bad signature"
    return VoucherKeys(sign, b"cert:" + site.encode(), verify)


CREDIT = Credit(TPS, VIEWS.get, fake_keys("leader").verify)


def voucher(block: int, s: int, e: int, owner: str = "", holder: str = "b", rnd: int = 3, view: int = 7,
            sign: bool = True) -> Voucher:
    owner = owner or str(VIEWS[view].primary(block) if view in VIEWS else "a")
    v = Voucher(BlockId(block), Gen(1), spans((s, e)), SiteId(holder), rnd, view, SiteId(owner))
    return signed(v, fake_keys(owner)) if sign else v


def offer(vs: tuple[Voucher, ...], ranges: list[tuple[int, int, int]] | None = None, tokens: int | None = None,
          site: str = "b") -> Offer:
    rs = tuple(SampleRange(b, s, e) for b, s, e in ranges) if ranges is not None else \
        tuple(SampleRange(v.block_id, x.start, x.end) for v in vs for x in v.spans)
    n = sum(r.end - r.start for r in rs)
    return Offer(SiteId(site), 3, rs, vs, n * TPS if tokens is None else tokens)


HONEST = offer((voucher(812, 0, 4), voucher(813, 0, 2)))
CREDIT_CASES = [
    ("honest: vouched by each block's primary, tokens = samples x seq_len", HONEST, True,
     "included: 6 samples in 2 ranges"),
    ("fewer tokens than the samples hold", offer((voucher(812, 0, 4),), tokens=100), True,
     "included: 4 samples in 1 ranges"),
    ("vouched under the previous ring view", offer((voucher(813, 0, 4, view=5),)), True,
     "included: 4 samples in 1 ranges"),
    ("the owner's certificate came with its first voucher only",
     offer((voucher(812, 0, 2), replace(voucher(812, 5, 7), certificate=b""))), True,
     "included: 4 samples in 2 ranges"),
    ("10x tokens", offer((voucher(812, 0, 4),), tokens=10 * 4 * TPS), False,
     "excluded: b claims 5120 tokens for 4 samples of 128 tokens (at most 512)"),
    ("one token more than the samples hold", offer((voucher(812, 0, 4),), tokens=4 * TPS + 1), False,
     "excluded: b claims 513 tokens for 4 samples of 128 tokens (at most 512)"),
    ("no signature", offer((voucher(812, 0, 4, sign=False),)), False,
     "excluded: block 812: the voucher of a carries no signature (the owner's word is missing)"),
    ("self-signed by a site that is not the block's owner", offer((voucher(812, 0, 4, owner="b"),)), False,
     "excluded: block 812: the voucher is by b, but the block's owner in ring view 7 is a"),
    ("owner field forged onto the contributor's own signature",
     offer((replace(voucher(812, 0, 4, owner="b"), owner=SiteId("a")),)), False,
     "excluded: block 812: the voucher of a: the certificate is not a's"),
    ("a's certificate attached to b's signature",
     offer((replace(voucher(812, 0, 4, owner="b"), owner=SiteId("a"), certificate=b"cert:a"),)), False,
     "excluded: block 812: the voucher of a: bad signature"),
    ("signed for another holder", offer((voucher(812, 0, 4, holder="c"),)), False,
     "excluded: block 812: the voucher names holder c, not b"),
    ("signed for another holder, holder field rewritten", offer((replace(voucher(812, 0, 4, holder="c"),
                                                                         holder=SiteId("b")),)), False,
     "excluded: block 812: the voucher of a: bad signature"),
    ("signed for another round", offer((voucher(812, 0, 4, rnd=2),)), False,
     "excluded: block 812: the voucher is for round 2, not 3"),
    ("signed for another round, round field rewritten", offer((replace(voucher(812, 0, 4, rnd=2), round=3),)),
     False, "excluded: block 812: the voucher of a: bad signature"),
    ("signed for other spans, spans rewritten", offer((replace(voucher(812, 0, 2), spans=spans((0, 4))),)),
     False, "excluded: block 812: the voucher of a: bad signature"),
    ("a ring view the leader does not accept", offer((voucher(812, 0, 4, owner="a", view=3),)), False,
     "excluded: block 812: the voucher names ring view 3, not a recent view of the leader's log (its last three, "
     "and any since round 2 opened)"),
    ("no certificate at all", offer((replace(voucher(812, 0, 4), certificate=b""),)), False,
     "excluded: block 812: no certificate of a comes with its voucher"),
    ("an unleased block beside a vouched one", offer((voucher(812, 0, 4),), [(812, 0, 4), (813, 0, 5)]), False,
     "excluded: block 813: samples 0..5 were not leased to b for round 3"),
]


@pytest.mark.parametrize("name,c,included,reason", CREDIT_CASES, ids=[c[0] for c in CREDIT_CASES])
def test_work_is_credited_only_as_leased_and_trained(name: str, c: Offer, included: bool,
                                                      reason: str) -> None:
    (d,) = admit_round(3, [c], EpochLedger(UNIVERSE), CREDIT)
    assert (d.included, d.reason) == (included, reason)
    assert d.freed == (() if included else c.ranges)


def test_without_a_credit_the_old_check_stands() -> None:
    """Callers that only settle claims (the lease simulator's stand-in) pass no credit."""
    (d,) = admit_round(3, [offer((voucher(812, 0, 4, sign=False, owner="b"),), tokens=10**9)], EpochLedger(UNIVERSE))
    assert d.included


INSECURE = Credit(TPS, VIEWS.get, None)


@pytest.mark.parametrize("c,included", [
    (offer((voucher(812, 0, 4, sign=False),)), True),
    (offer((voucher(812, 0, 4, sign=False, holder="c"),)), False),
    (offer((voucher(812, 0, 4, sign=False, owner="b"),)), False),
    (offer((voucher(812, 0, 4, sign=False),), tokens=10 * 4 * TPS), False),
], ids=["unsigned honest", "another holder", "not the owner", "10x tokens"])
def test_an_insecure_run_checks_the_fields_and_tokens_but_not_signatures(c: Offer, included: bool) -> None:
    (d,) = admit_round(3, [c], EpochLedger(UNIVERSE), INSECURE)
    assert d.included == included, d.reason


def test_a_forger_cannot_take_the_outer_step_from_honest_sites() -> None:
    """The probe: c reports 10x tokens and adds a block it never leased, with vouchers it wrote
    itself; a and b are honest. Only a and b are credited, with their true weights."""
    a = offer((voucher(813, 0, 3, holder="a"),), site="a")
    b = offer((voucher(812, 0, 3),))
    forged = (voucher(812, 5, 9, holder="c", owner="c"), voucher(813, 5, 9, holder="c", owner="c"))
    c = offer(forged, tokens=10 * 8 * TPS, site="c")
    ds = admit_round(3, [a, b, c], EpochLedger(UNIVERSE), CREDIT)
    assert [(d.site, d.included) for d in ds] == [("a", True), ("b", True), ("c", False)]
    assert ds[2].reason == "excluded: block 812: the voucher is by c, but the block's owner in ring view 7 is a"
    assert payload(a.vouchers[0]) != payload(replace(a.vouchers[0], holder=SiteId("c")))
