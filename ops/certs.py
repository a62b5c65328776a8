"""`ops certs`: a private certificate authority per run, and the certificates of its sites and people.

    ops certs init --run c4-qwen3 --out certs/                 # ca.crt, ca.key (keep ca.key safe)
    ops certs issue --site lumi --address lumi-uan01 --out certs/     # lumi.crt, lumi.key
    ops certs issue --operator alice --out certs/               # alice.crt: may call Leave/Join
    ops certs issue --reader grafana --out certs/               # grafana.crt: Status and health only

Every peer serves and dials with mutual TLS against `ca.crt` (peer/transport/channels.py); what a
certificate may do is written in it and read back by peer/transport/auth.py:

* subject CN = the site or person's name, OU = its role (`site`, `operator`, `reader`, `relay`),
  O = the run id `<run name>-<first 12 hex of the CA certificate's sha256>`, so a certificate names
  the one CA, and so the one run, it belongs to;
* a site certificate's subject alternative names are the site's name and every address other
  sites dial it by (TLS checks the dialled host against them); `localhost` and `127.0.0.1` are
  added for loopback meshes with `--loopback`.

Keys are EC P-256 (small, fast handshakes) and are written with mode 0600.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from peer.transport.auth import identity_of, run_id_of
from peer.transport.channels import PLAINTEXT, Credentials

ROLES = ("site", "operator", "reader", "relay")
CA_NAME = "ca"
# Long enough for a multi-month pre-training run; a run that outlives it re-issues (init is cheap).
DEFAULT_DAYS = 400
EXIT_USAGE = 2


class CertError(ValueError):
    """A certificate request a user can fix; the message says what and how."""


def _write(path: Path, data: bytes, private: bool) -> None:
    # The key must never exist with a wider mode, not even for an instant: create it 0600.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    if private:
        os.chmod(path, 0o600)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _validity(days: int, now: datetime.datetime | None) -> tuple[datetime.datetime, datetime.datetime]:
    start = (now or datetime.datetime.now(datetime.timezone.utc)) - datetime.timedelta(minutes=5)
    return start, start + datetime.timedelta(days=days)


def init_ca(run: str, out: Path, days: int = DEFAULT_DAYS) -> str:
    """Writes `ca.crt` and `ca.key` for run `run` into `out`; returns the run id."""
    if not run or len(run) > 40 or not all(ch.isalnum() or ch in "._-" for ch in run):
        raise CertError(f"bad run name {run!r}: use 1-40 letters, digits, '.', '_' or '-'")
    out.mkdir(parents=True, exist_ok=True)
    if (out / "ca.key").exists():
        raise CertError(f"{out / 'ca.key'} exists: this directory already has a run CA (remove it to make a new run)")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, run),
                      x509.NameAttribute(NameOID.COMMON_NAME, f"{run} run CA")])
    start, end = _validity(days, None)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(out / "ca.key", _key_pem(key), private=True)
    _write(out / "ca.crt", cert.public_bytes(serialization.Encoding.PEM), private=False)
    return run_id_of(cert)


@dataclass(frozen=True)
class Issued:
    """What `issue` wrote."""

    cert: Path
    key: Path
    run_id: str


def _san(name: str, addresses: tuple[str, ...]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = [x509.DNSName(name)]
    for addr in addresses:
        host = addr.rsplit(":", 1)[0] if addr.count(":") == 1 else addr  # drop a :port, keep bare IPv6
        host = host.strip("[]")
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            out.append(x509.DNSName(host))
    return list(dict.fromkeys(out))


def issue(
    ca_dir: Path, name: str, role: str, out: Path, addresses: tuple[str, ...] = (), days: int = DEFAULT_DAYS,
    now: datetime.datetime | None = None,
) -> Issued:
    """Signs a certificate for `name` in `role` with the CA in `ca_dir`; writes NAME.crt, NAME.key
    (and a copy of ca.crt) into `out`. `now` backdates or postdates it (tests of expiry)."""
    if role not in ROLES:
        raise CertError(f"unknown role {role!r}: use one of {', '.join(ROLES)}")
    if not name or len(name) > 63 or not all(ch.isalnum() or ch in "._-" for ch in name) or name == CA_NAME:
        raise CertError(f"bad name {name!r}: use 1-63 letters, digits, '.', '_' or '-' (not 'ca')")
    try:
        ca_cert = x509.load_pem_x509_certificate((ca_dir / "ca.crt").read_bytes())
        ca_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), password=None)
    except FileNotFoundError as err:
        raise CertError(f"no run CA in {ca_dir} ({err.filename} missing): run `ops certs init` first") from err
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise CertError(f"{ca_dir / 'ca.key'} is not an EC key made by `ops certs init`")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, run_id_of(ca_cert)),
                         x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                         x509.NameAttribute(NameOID.COMMON_NAME, name)])
    # Sites and relays are servers and clients; people only dial.
    serves = role in ("site", "relay")
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if serves else [])
    start, end = _validity(days, now)
    builder = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if serves:
        builder = builder.add_extension(x509.SubjectAlternativeName(_san(name, addresses)), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    out.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = out / f"{name}.crt", out / f"{name}.key"
    _write(key_path, _key_pem(key), private=True)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), private=False)
    if out.resolve() != ca_dir.resolve():
        _write(out / "ca.crt", (ca_dir / "ca.crt").read_bytes(), private=False)
    return Issued(cert_path, key_path, run_id_of(ca_cert))


LOOPBACK = ("localhost", "127.0.0.1", "::1")


def make_run(run: str, out: Path, sites: list[str], operators: tuple[str, ...] = ("operator",),
             addresses: tuple[str, ...] = LOOPBACK) -> str:
    """A whole loopback run's certificates in one directory (demo, tests): CA, sites, operators."""
    run_id = init_ca(run, out)
    for site in sites:
        issue(out, site, "site", out, addresses)
    for person in operators:
        issue(out, person, "operator", out)
    return run_id


# ----- command line -------------------------------------------------------------------------------
def register(sub: argparse._SubParsersAction) -> None:
    certs = sub.add_parser("certs", help="make the run's CA and its sites' and operators' certificates")
    csub = certs.add_subparsers(dest="certs_command", required=True, metavar="ACTION")
    init = csub.add_parser("init", help="make a private CA for a run (ca.crt, ca.key)")
    init.add_argument("--run", required=True, help="run name (part of the run id every certificate carries)")
    init.add_argument("--out", required=True, type=Path, help="directory for ca.crt and ca.key")
    init.add_argument("--days", type=int, default=DEFAULT_DAYS, help=f"validity in days (default {DEFAULT_DAYS})")
    init.set_defaults(func=_init)

    iss = csub.add_parser("issue", help="sign a site, operator or reader certificate with the run CA")
    who = iss.add_mutually_exclusive_group(required=True)
    who.add_argument("--site", help="a site's certificate (serves and dials the mesh)")
    who.add_argument("--operator", help="a person or tool that may call Admin Leave/Join and read status")
    who.add_argument("--reader", help="a read-only client: Status, health and reflection")
    who.add_argument("--relay", help="a relay (`peer serve --role relay`): forwards sites' connections, is no site")
    iss.add_argument("--address", action="append", default=[], metavar="HOST[:PORT]",
                     help="a host name or IP other sites (or a relay's sites) dial it by (repeatable; site or relay)")
    iss.add_argument("--loopback", action="store_true", help="also valid for localhost, 127.0.0.1 and ::1")
    iss.add_argument("--ca", type=Path, help="directory holding ca.crt and ca.key (default: --out)")
    iss.add_argument("--out", required=True, type=Path, help="directory for NAME.crt, NAME.key and ca.crt")
    iss.add_argument("--days", type=int, default=DEFAULT_DAYS, help=f"validity in days (default {DEFAULT_DAYS})")
    iss.set_defaults(func=_issue)


def _init(args: argparse.Namespace) -> int:
    try:
        run_id = init_ca(args.run, args.out, args.days)
    except CertError as err:
        print(f"ops certs: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(f"run CA for {run_id} in {args.out}/ca.crt (keep {args.out}/ca.key off the sites)")
    return 0


def _issue(args: argparse.Namespace) -> int:
    role, name = next((r, getattr(args, r)) for r in ROLES if getattr(args, r))
    if args.address and role not in ("site", "relay"):
        print("ops certs: error: --address is for site and relay certificates only", file=sys.stderr)
        return EXIT_USAGE
    addresses = tuple(args.address) + (LOOPBACK if args.loopback else ())
    try:
        issued = issue(args.ca or args.out, name, role, args.out, addresses, args.days)
    except CertError as err:
        print(f"ops certs: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{role} {name} of run {issued.run_id}: {issued.cert} {issued.key}")
    return 0


def add_client_flags(parser: argparse.ArgumentParser) -> None:
    """`--certs DIR [--as NAME]` for an ops command that dials a peer."""
    parser.add_argument("--certs", type=Path, metavar="DIR",
                        help="ca.crt and your NAME.crt/NAME.key (ops certs issue --operator/--reader); "
                             "without it the peer must run --insecure")
    parser.add_argument("--as", dest="identity", metavar="NAME",
                        help="whose certificate in --certs to use (default: the only operator's, else reader's)")


def client_credentials(args: argparse.Namespace) -> Credentials:
    """The credentials `add_client_flags` asked for; CertError says what is missing."""
    certs: Path | None = getattr(args, "certs", None)
    if certs is None:
        return PLAINTEXT
    name = getattr(args, "identity", None)
    if name is None:
        by_role: dict[str, list[str]] = {}
        for path in sorted(certs.glob("*.crt")):
            if path.stem != CA_NAME and (certs / f"{path.stem}.key").exists():
                by_role.setdefault(identity_of(path.read_bytes()).role.value, []).append(path.stem)
        choice = by_role.get("operator") or by_role.get("reader") or by_role.get("site") or []
        if len(choice) != 1:
            raise CertError(f"{certs}: {'no' if not choice else 'several'} client certificates "
                            f"({', '.join(choice) or 'none'}): say which with --as NAME")
        name = choice[0]
    try:
        return Credentials.from_dir(certs, name)
    except FileNotFoundError as err:
        raise CertError(str(err)) from err
