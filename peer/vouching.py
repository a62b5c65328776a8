"""The cryptography of lease vouchers: a site signs with its key, the leader checks against the run CA.

peer/core/vouchers.py says what a voucher binds and what the leader checks; this gives it the keys,
made from the site's `Credentials` (ops/certs.py: EC P-256 keys, certificates with CN = site name,
OU = role, O = run id). A voucher carries its owner's site certificate, so the leader needs no
certificate store: it checks that the certificate was issued by the run CA (the same `ca.crt` the
TLS handshakes trust), is a site certificate of this run naming the voucher's owner and is valid
now, then the ECDSA signature. A checked certificate is remembered (by its bytes) for the next rounds.

    .venv/bin/python -m pytest tests/unit/test_vouching.py -q
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from peer.core.ids import SiteId
from peer.core.site_names import site_of
from peer.core.vouchers import VoucherKeys
from peer.transport.auth import BadCertificate, Role, identity_of, run_id_of
from peer.transport.channels import Credentials

_ECDSA = ec.ECDSA(hashes.SHA256())


def keys_of(creds: Credentials, clock: Callable[[], datetime.datetime] | None = None) -> VoucherKeys | None:
    """This site's voucher keys from its TLS credentials; None for plaintext (`--insecure`): such a
    run's vouchers are unsigned and its leader cannot tell a forged one (vouchers.UNSIGNED)."""
    if creds.plaintext:
        return None
    key = serialization.load_pem_private_key(creds.key, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{creds.name}.key is not an EC key made by `ops certs issue`")
    cert = x509.load_pem_x509_certificate(creds.cert).public_bytes(serialization.Encoding.DER)

    def sign(payload: bytes) -> bytes:
        return key.sign(payload, _ECDSA)

    return VoucherKeys(sign, cert, CaVerifier(creds.ca, clock))


class CaVerifier:
    """`vouchers.Verify` against one run CA: (owner, payload, signature, certificate DER) -> why not."""

    MAX_REMEMBERED = 1024
    """Certificates remembered once checked: one per site is all an honest run needs."""

    def __init__(self, ca_pem: bytes, clock: Callable[[], datetime.datetime] | None = None) -> None:
        self.ca = x509.load_pem_x509_certificate(ca_pem)
        self.run_id = run_id_of(self.ca)
        self.clock = clock or (lambda: datetime.datetime.now(datetime.timezone.utc))
        self._known: dict[bytes, tuple[SiteId, ec.EllipticCurvePublicKey, datetime.datetime]] = {}

    def __call__(self, owner: SiteId, payload: bytes, signature: bytes, certificate: bytes) -> str:
        known = self._known.get(certificate)
        if known is None:
            checked = self._check_certificate(certificate)
            if isinstance(checked, str):
                return checked
            known = checked
            if len(self._known) >= self.MAX_REMEMBERED:
                self._known.clear()
            self._known[certificate] = known
        name, key, until = known
        if name != site_of(owner):  # a site's certificate vouches for the site and its jobs' members
            return f"its certificate is {name}'s, not {owner}'s"
        if self.clock() > until:
            return f"its certificate expired at {until.isoformat()}"
        try:
            key.verify(signature, payload, _ECDSA)
        except InvalidSignature:
            return "the signature does not verify with its certificate (forged or altered)"
        return ""

    def _check_certificate(self, der: bytes) -> tuple[SiteId, ec.EllipticCurvePublicKey, datetime.datetime] | str:
        try:
            cert = x509.load_der_x509_certificate(der)
        except ValueError:
            return "its certificate does not parse"
        try:
            cert.verify_directly_issued_by(self.ca)
        except (ValueError, TypeError, InvalidSignature):
            return f"its certificate was not issued by the CA of run {self.run_id}"
        try:
            who = identity_of(cert.public_bytes(serialization.Encoding.PEM))
        except (BadCertificate, ValueError) as err:
            return f"its certificate names no site: {err}"
        if who.role is not Role.SITE or who.run_id != self.run_id:
            return f"its certificate is a {who.role.value} certificate of run {who.run_id}, not a site's of {self.run_id}"
        now = self.clock()
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            return f"its certificate is not valid now (valid {cert.not_valid_before_utc.isoformat()} to " \
                   f"{cert.not_valid_after_utc.isoformat()})"
        key = cert.public_key()
        if not isinstance(key, ec.EllipticCurvePublicKey):
            return "its certificate holds no EC key"
        return SiteId(who.name), key, cert.not_valid_after_utc
