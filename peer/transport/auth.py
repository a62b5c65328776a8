"""Who may call what: a verified client certificate -> (role, name, run id) -> allowed or why not.

Pure policy, no gRPC: peer/transport/guard.py runs it on every call of a mutual-TLS server.
Certificates come from `ops certs` (ops/certs.py): subject CN = name, OU = role, O = run id.

* a **site** may call the peer-to-peer services (membership, consensus, rounds, leases, exchange),
  and only with messages whose sender field names itself or one of its jobs' members (`SITE.jN`,
  peer/core/site_names.py): a site cannot speak for another;
* an **operator** may call `Admin/Leave`, `Admin/Join` and everything a reader may;
* a site may also call `Admin/DialBack` for itself (a joining site's reachability check);
* a **reader** may call `Admin/Status`, health and reflection only; so may a **relay**, which
  forwards sites' connections it cannot read (peer/transport/relay_server.py) and is no site.

    .venv/bin/python -m pytest tests/unit/test_auth.py -q
"""

from __future__ import annotations

import enum
import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from peer.core.site_names import site_of


class Role(enum.Enum):
    SITE = "site"
    OPERATOR = "operator"
    READER = "reader"
    RELAY = "relay"
    """Forwards connections to sites that only dial out (peer/transport/relay_server.py): it reads
    and forges nothing it forwards, and may call what a reader may."""


@dataclass(frozen=True)
class Identity:
    """What a verified certificate says about its holder."""

    role: Role
    name: str
    """The site's name (for a site) or the person's / tool's name."""
    run_id: str
    """`<run name>-<CA fingerprint>`: the run whose CA signed it."""


class BadCertificate(ValueError):
    """A certificate (already verified by TLS) that does not carry a sitemesh identity."""


def run_id_of(ca: x509.Certificate | bytes) -> str:
    """The run's identity: its name and the CA's fingerprint (a re-made CA is another run)."""
    cert = x509.load_pem_x509_certificate(ca) if isinstance(ca, bytes) else ca
    names = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    if not names:
        raise BadCertificate("the CA certificate has no organisation (O) naming the run: make it with `ops certs init`")
    value = names[0].value
    run = value.decode() if isinstance(value, bytes) else value
    return f"{run}-{hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()[:12]}"


def _one(cert: x509.Certificate, oid: x509.ObjectIdentifier, what: str) -> str:
    values = cert.subject.get_attributes_for_oid(oid)
    if len(values) != 1:
        raise BadCertificate(f"certificate subject {cert.subject.rfc4514_string()} has no single {what}")
    return str(values[0].value)


@functools.lru_cache(maxsize=256)
def identity_of(cert_pem: bytes) -> Identity:
    """The identity in a PEM certificate (cached: one parse per connection's certificate)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    role = _one(cert, NameOID.ORGANIZATIONAL_UNIT_NAME, "role (OU)")
    try:
        parsed = Role(role)
    except ValueError:
        raise BadCertificate(f"unknown role {role!r} in certificate: one of site, operator, reader, relay") from None
    return Identity(parsed, _one(cert, NameOID.COMMON_NAME, "name (CN)"),
                    _one(cert, NameOID.ORGANIZATION_NAME, "run id (O)"))


# The sender each peer-to-peer message names, by service: a site's message must name itself there.
def _header_from(request: Any) -> tuple[str, ...]:
    return (request.header.from_site,)


def _contribution(request: Any) -> tuple[str, ...]:
    return (request.header.from_site, request.site) if hasattr(request, "site") else (request.header.from_site,)


_SENDERS: dict[str, Callable[[Any], tuple[str, ...]]] = {
    "sitemesh.v1.Membership": lambda r: (r.from_site,),
    "sitemesh.v1.Consensus": _header_from,
    "sitemesh.v1.Rounds": _contribution,
    "sitemesh.v1.Leases": lambda r: (r.header.site,),
}
# Exchange: an announcement names the object's producer; reads (manifest, chunks) name nobody.
_EXCHANGE_SENDERS: dict[str, Callable[[Any], tuple[str, ...]]] = {"Announce": lambda r: (r.key.site,)}
_READ_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                  "grpc.reflection.v1.ServerReflection")
_OPERATOR_METHODS = ("Leave", "Join")


def split_method(method: str) -> tuple[str, str]:
    """'/pkg.Service/Method' -> ('pkg.Service', 'Method')."""
    service, _, name = method.lstrip("/").partition("/")
    return service, name


def authorize(who: Identity, run_id: str, method: str, request: Any | None) -> str | None:
    """None if `who` may make this call, else a one-line reason. `request` is None for calls whose
    request is not looked at (streams of requests: reflection)."""
    if who.run_id != run_id:
        return f"certificate of run {who.run_id}, this peer serves run {run_id}"
    service, name = split_method(method)
    if service in _READ_SERVICES or (service == "sitemesh.v1.Admin" and name == "Status"):
        return None
    if service == "sitemesh.v1.Admin":
        if name in _OPERATOR_METHODS and who.role is Role.OPERATOR:
            return None
        if name == "DialBack" and who.role is Role.SITE:
            claimed = getattr(request, "from_site", who.name) if request is not None else who.name
            return None if site_of(claimed) == who.name else f"site {who.name} sent {name} as {claimed!r}"
        return f"{who.role.value} {who.name} may not call Admin/{name} (operators only)"
    if service in _SENDERS or service == "sitemesh.v1.Exchange":
        if who.role is not Role.SITE:
            return f"{who.role.value} {who.name} may not call {service}/{name} (sites only)"
        senders = _SENDERS.get(service) or _EXCHANGE_SENDERS.get(name)
        if senders is None or request is None:
            return None
        for claimed in senders(request):
            if site_of(claimed) != who.name:  # a site speaks for itself and its jobs' members (SITE.jN)
                return f"site {who.name} sent {name} as {claimed!r}"
        return None
    return f"no access rule for {method}"

