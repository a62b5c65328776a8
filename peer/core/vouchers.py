"""A lease owner's voucher, bound to the owner: what it signs and how the leader checks it (sans I/O).

An owner vouches (`TrainedReply`) that samples of a block are a holder's to contribute in a round
(peer/core/leases.py); the leader credits a contribution only for samples such vouchers cover
(peer/core/admission.py, I6). A voucher the holder could write itself would make that check
worthless, so the owner signs `payload(v)` = (owner, holder, round, block, generation, ring version,
spans) with its site key and attaches its site certificate, and the leader checks that

* the voucher names the contributing site and the round being decided,
* its owner is the block's primary in the ring view it names, and that view is a recent one of the
  leader's log: one of its last three, or any since the previous round opened (only the primary
  serves, and so vouches for, a block, and views may change while a round is open: one voter at a
  time, a restart is two; peer/core/lease_log.py `accepted_view`),
* the signature verifies with the owner's certificate, and that certificate is the owner's site
  certificate issued by this run's CA (peer/vouching.py, where the cryptography lives).

Keys come in as `VoucherKeys` callables, so this module does no cryptography and no I/O. An insecure
run (`--insecure`) has no keys: vouchers are unsigned there, the leader checks the fields alone and
says so (`UNSIGNED`); anyone may forge them (docs/decisions/security-work-credit.md).

    .venv/bin/python -m pytest tests/unit/test_vouching.py tests/unit/test_admission.py -q
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace

from peer.core.ids import SiteId
from peer.core.lease_types import Voucher
from peer.core.ring import RingView

DOMAIN = b"sitemesh.v1.Voucher\n"
"""Prefix of every signed payload: a signature made for any other purpose never verifies here."""

UNSIGNED = "insecure run: vouchers are not signed, their owner's word is not checked"
"""What the leader says of the signature check when it has no CA to check against."""

Sign = Callable[[bytes], bytes]
"""This site's key: payload -> signature."""
Verify = Callable[[SiteId, bytes, bytes, bytes], str]
"""(owner, payload, signature, certificate) -> "" when `signature` is `owner`'s over `payload` and
`certificate` is `owner`'s site certificate of this run's CA; else why not."""


@dataclass(frozen=True)
class VoucherKeys:
    """A site's means to sign its vouchers and to check others' (peer/vouching.py makes them from
    the site's certificate, key and the run CA)."""

    sign: Sign
    certificate: bytes
    """This site's certificate (DER), attached to the vouchers it signs."""
    verify: Verify


def payload(v: Voucher) -> bytes:
    """The bytes an owner signs: every field that says whose samples these are, when and where."""
    body = [v.owner, v.holder, v.round, v.block_id, v.generation, v.ring_version,
            [[s.start, s.end] for s in v.spans]]
    return DOMAIN + json.dumps(body, separators=(",", ":")).encode()


def signed(v: Voucher, keys: VoucherKeys | None) -> Voucher:
    """`v` signed with `keys` (unchanged without keys: an insecure run)."""
    if keys is None:
        return v
    return replace(v, signature=keys.sign(payload(v)), certificate=keys.certificate)


def check(v: Voucher, site: SiteId, round_: int, view: Callable[[int], RingView | None],
          verify: Verify | None, certificate: bytes) -> str:
    """Why voucher `v` is not the owner's word that its samples are `site`'s in round `round_` ("" when
    it is). `view(version)` is the ring view of that version if the leader accepts it (None if not);
    `verify` is None in an insecure run; `certificate` is the owner's (this voucher's, or one an
    earlier voucher of the same owner in the contribution carried)."""
    b = v.block_id
    if v.holder != site:
        return f"block {b}: the voucher names holder {v.holder or '(none)'}, not {site}"
    if v.round != round_:
        return f"block {b}: the voucher is for round {v.round}, not {round_}"
    ring = view(v.ring_version)
    if ring is None:
        return (f"block {b}: the voucher names ring view {v.ring_version}, not a recent view of the "
                f"leader's log (its last three, and any since round {round_ - 1} opened)")
    primary = ring.primary(b)
    if v.owner != primary:
        return (f"block {b}: the voucher is by {v.owner or '(nobody)'}, but the block's owner in ring view "
                f"{v.ring_version} is {primary}")
    if verify is None:
        return ""
    if not v.signature:
        return f"block {b}: the voucher of {v.owner} carries no signature (the owner's word is missing)"
    if not certificate:
        return f"block {b}: no certificate of {v.owner} comes with its voucher"
    why = verify(v.owner, payload(v), v.signature, certificate)
    return f"block {b}: the voucher of {v.owner}: {why}" if why else ""
