"""Owner-bound vouchers with real keys: the owner core signs, the leader checks against the run CA."""

from __future__ import annotations

import datetime
from dataclasses import replace
from pathlib import Path

import pytest

from ops.certs import init_ca, issue, make_run
from peer.core.admission import Offer, Credit, admit_round
from peer.core.election import SiteId
from peer.core.lease_types import BlockId, Gen, Voucher, spans
from peer.core.ring import RingView
from peer.core.vouchers import VoucherKeys, payload, signed
from peer.transport.channels import PLAINTEXT, Credentials
from peer.vouching import CaVerifier, keys_of
from tests.unit.test_leases_mesh import Mesh, _settle

SITES = ("a", "b", "c")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("certs")
    make_run("probe5", d, list(SITES))
    other = d / "other-run"
    init_ca("other", other)
    issue(other, "a", "site", other)  # a certificate named a, from another run's CA
    issue(d, "old", "site", d, now=datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc), days=1)
    return d


def keys(certs: Path, name: str) -> VoucherKeys:
    k = keys_of(Credentials.from_dir(certs, name))
    assert k is not None
    return k


def test_an_insecure_run_has_no_keys() -> None:
    assert keys_of(PLAINTEXT) is None


def v_of(owner: str, holder: str = "b") -> Voucher:
    return Voucher(BlockId(812), Gen(9), spans((0, 4)), SiteId(holder), 3, 7, SiteId(owner))


def test_signatures_verify_only_for_the_owner_of_this_run(certs: Path) -> None:
    a, b = keys(certs, "a"), keys(certs, "b")
    verify = keys(certs, "c").verify
    good = signed(v_of("a"), a)
    foreign = keys(certs / "other-run", "a")
    expired = keys(certs, "old")
    cases = [
        ("a's voucher", good, ""),
        ("b signs, names a as owner", replace(signed(v_of("b"), b), owner=SiteId("a")),
         "its certificate is b's, not a's"),
        ("a's job 3 vouches under a's certificate", signed(v_of("a.j3"), a), ""),
        ("b signs as a's job", replace(signed(v_of("b"), b), owner=SiteId("a.j3")), "its certificate is b's, not a.j3's"),
        ("b's signature under a's certificate", replace(good, signature=signed(v_of("a"), b).signature),
         "the signature does not verify with its certificate (forged or altered)"),
        ("holder rewritten", replace(good, holder=SiteId("c")),
         "the signature does not verify with its certificate (forged or altered)"),
        ("spans widened", replace(good, spans=spans((0, 8))),
         "the signature does not verify with its certificate (forged or altered)"),
        ("another run's CA", signed(v_of("a"), foreign), "its certificate was not issued by the CA of run"),
        ("an expired certificate", signed(v_of("old"), expired), "its certificate is not valid now"),
        ("not a certificate", replace(good, certificate=b"\x30\x03junk"), "its certificate does not parse"),
    ]
    for name, v, why in cases:
        got = verify(v.owner, payload(v), v.signature, v.certificate)
        assert got.startswith(why) and (why or not got), f"{name}: {got!r}"


def test_a_checked_certificate_is_remembered_and_expires(certs: Path) -> None:
    now = [datetime.datetime.now(datetime.timezone.utc)]
    verify = CaVerifier((certs / "ca.crt").read_bytes(), lambda: now[0])
    v = signed(v_of("a"), keys(certs, "a"))
    assert verify(v.owner, payload(v), v.signature, v.certificate) == ""
    now[0] += datetime.timedelta(days=1000)
    assert verify(v.owner, payload(v), v.signature, v.certificate).startswith("its certificate expired")


def test_the_owner_core_signs_and_the_leader_credits_only_the_owners_word(certs: Path) -> None:
    """Through the lease cores: a trains a block, its owner vouches with its key, the leader (c)
    credits it; the same samples with a's self-written or altered vouchers are excluded."""
    ks = {s: keys(certs, s) for s in SITES}
    m = Mesh(SITES, keys=ks)
    view = m.set_view(SITES)
    _settle(m)
    a = m.clients[SiteId("a")]
    (block, got), = a.next_samples(5, m.now)[:1]
    m.effects(SiteId("a"), a.end_round(1, m.now))
    m.run()
    c = a.offer(1)
    assert c is not None and len(c.vouchers) == 1
    (v,) = c.vouchers
    owner = view.primary(block)
    assert (v.owner, v.holder, v.round, v.ring_version, v.spans) == (owner, "a", 1, view.version, got)
    assert v.signature and v.certificate
    accept = {view.version: view}
    credit = Credit(128, accept.get, ks["c"].verify)
    ledger = m.ledgers[SiteId("c")]
    honest = replace(c, tokens=5 * 128)
    self_signed = replace(honest, vouchers=(signed(replace(v, owner=SiteId("a")), ks["a"]),))
    widened = replace(honest, ranges=(replace(c.ranges[0], end=8),),
                      vouchers=(replace(v, spans=spans((0, 8))),), tokens=8 * 128)
    inflated = replace(honest, tokens=50 * 128)
    expect = [(honest, True), (inflated, False), (widened, False)]
    if owner != "a":  # a may be the block's primary itself: then signing its own voucher is its right
        expect.append((self_signed, False))
    for contribution, included in expect:
        (d,) = admit_round(1, [contribution], ledger, credit)
        assert d.included == included, d.reason


def test_the_contribution_sends_each_owners_certificate_once(certs: Path) -> None:
    from peer.core.lease_client import _certificates_once

    a = keys(certs, "a")
    vs = tuple(signed(replace(v_of("a"), block_id=BlockId(b)), a) for b in (1, 2, 3))
    once = _certificates_once(vs)
    assert [bool(v.certificate) for v in once] == [True, False, False]
    ring = RingView.of(7, ["a"])
    c = Offer(SiteId("b"), 3, (), once)
    from peer.core.admission import _not_credited

    assert _not_credited(c, 3, Credit(0, {7: ring}.get, keys(certs, "c").verify)) == ""


def test_two_jobs_of_one_site_each_send_the_sites_certificate_and_are_credited(certs: Path) -> None:
    # A job's member signs with its site's certificate: b.j60 and b.j61 carry the same bytes. The
    # soak of 2026-12-07 20:00 lost 14 honest contributions to "no certificate of b.j61 comes with
    # its voucher" when the second job's certificate was dropped as already sent.
    from peer.core.admission import _not_credited
    from peer.core.lease_client import _certificates_once

    b = keys(certs, "b")
    ring = RingView.of(7, ["b.j60", "b.j61"])
    blocks = {ring.primary(BlockId(n)): BlockId(n) for n in range(1, 40)}
    vs = tuple(signed(replace(v_of(owner, holder="c"), block_id=blocks[SiteId(owner)]), b)
               for owner in ("b.j60", "b.j61"))
    once = _certificates_once(vs)
    assert [bool(v.certificate) for v in once] == [True, True]
    c = Offer(SiteId("c"), 3, (), once)
    assert _not_credited(c, 3, Credit(0, {7: ring}.get, keys(certs, "a").verify)) == ""


def test_a_signed_voucher_crosses_the_wire_and_oversized_fields_are_refused(certs: Path) -> None:
    from peer.gen.sitemesh.v1 import leases_pb2
    from peer.transport.wire import WireError, from_proto, to_proto

    v = signed(v_of("a"), keys(certs, "a"))
    assert from_proto(to_proto(v, leases_pb2.Voucher), Voucher) == v
    for field, size in (("signature", 257), ("certificate", 4097)):
        with pytest.raises(WireError, match=f"{field} is {size} bytes long"):
            from_proto(to_proto(replace(v, **{field: b"x" * size}), leases_pb2.Voucher), Voucher)


def test_the_leader_accepts_vouchers_of_recent_ring_views_of_its_log() -> None:
    """The last three views, and every view since the one before the view in force when the round
    before the one decided opened (before the second round commits: all of the run's start)."""
    from peer.core.commitlog import Entry, LogIndex, Round, RoundCommit, VoterChange
    from peer.core.election import Epoch
    from peer.core.lease_log import LeaseLog
    from peer.core.lease_config import LeaseConfig

    log = LeaseLog(SiteId("a"), {1: 4}, LeaseConfig.local_test(), 0)
    rnd = iter(range(1, 10))
    index = iter(range(1, 100))

    def apply(*bodies: VoterChange | RoundCommit) -> list[int]:
        log.apply_entries([Entry(LogIndex(next(index)), Epoch(1), b) for b in bodies], 0.0)
        return [v for v in range(20) if log.accepted_view(v) is not None]

    def vc(s: str, add: bool = True) -> VoterChange:
        return VoterChange(SiteId(s), s, add, "t")

    def commit() -> RoundCommit:
        return RoundCommit(Round(next(rnd)), (), b"")

    assert apply(vc("a"), vc("b"), vc("c"), vc("b", False)) == [1, 2, 3, 4], "no round yet: the whole start"
    assert apply(commit(), vc("d"), vc("e"), vc("f")) == [1, 2, 3, 4, 6, 7, 8], "one round: still the start"
    assert apply(commit()) == [3, 4, 6, 7, 8], "in force when round 2 opened (4), the one before, and since"
    assert apply(commit(), commit()) == [6, 7, 8], "nothing changed for two rounds: the last three"
    assert apply(vc("g")) == [7, 8, 12]
    assert log.accepted_view(8) == RingView.of(8, ["a", "c", "d", "e", "f"])
    assert log.credit.view(1) is None and log.credit.verify is None and log.credit.tokens_per_sample == 0
