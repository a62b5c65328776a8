"""How a peer's advertised address says it is reached: directly, or only through relays.

Addresses travel as opaque strings through every protocol (gossip's `from_address`, seeds, the
commit log's voters, `ops status`), so the way to reach a site is written into its address and
read only here, by the dialer (peer/transport/dialer.py):

* ``host:port`` -- **direct**: dial it (through the egress proxy where one is set);
* ``relay://lumi@r1.example.org:7100,r2.example.org:7100`` -- **outbound**: the site named before
  ``@`` accepts no inbound connection; ask one of the relays after it (any, in order) to connect
  to it through the tunnel it dialled out (peer/transport/tunnel.py, relay_server.py).

Pure: no sockets. docs/decisions/relays-for-outbound-sites.md says why addresses carry the route.

    .venv/bin/python -m pytest tests/unit/test_route.py -q
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from peer.core.site_names import site_of

SCHEME = "relay://"
SERVICES = ("grpc", "bulk")
"""What a relayed connection reaches at the site: its gRPC server, or its bulk data plane."""
MAX_RELAYS = 8
"""Relays one address may name: two make no single point of failure; eight bound what a hostile
address makes a dialer try."""

_SITE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_HOST_PORT = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})")


@dataclass(frozen=True)
class Direct:
    """Dial `host:port` itself."""

    host: str
    """As written, without IPv6 brackets."""
    port: int


@dataclass(frozen=True)
class Relayed:
    """Reach `site` through one of `relays` (``host:port`` each, tried in order)."""

    site: str
    relays: tuple[Direct, ...]


Route = Direct | Relayed


class BadRoute(ValueError):
    """An address that names no way to reach a peer; the message says what is wrong."""


def host_port(text: str) -> Direct:
    """``host:port`` (IPv6 in brackets) as a Direct; BadRoute naming the text."""
    m = _HOST_PORT.fullmatch(text.strip())
    if m is None or int(m.group("port")) > 65535:
        raise BadRoute(f"{text!r} is not HOST:PORT (e.g. 203.0.113.5:7001 or [::1]:7001)")
    return Direct(m.group("host").strip("[]"), int(m.group("port")))


def parse(address: str) -> Route:
    """The route an address names; BadRoute with the expected forms."""
    if not address.startswith(SCHEME):
        return host_port(address)
    site, at, relays = address[len(SCHEME):].partition("@")
    if not at or _SITE.fullmatch(site) is None:
        raise BadRoute(f"{address!r}: expected relay://SITE@RELAY_HOST:PORT[,RELAY_HOST:PORT...]")
    hops = tuple(host_port(r) for r in relays.split(",") if r.strip())
    if not hops:
        raise BadRoute(f"{address!r} names no relay after '@'")
    if len(hops) > MAX_RELAYS:
        raise BadRoute(f"{address!r} names {len(hops)} relays, at most {MAX_RELAYS} may be named")
    return Relayed(site, hops)


def text(hop: Direct) -> str:
    """``host:port`` again, IPv6 in brackets."""
    return f"[{hop.host}]:{hop.port}" if ":" in hop.host else f"{hop.host}:{hop.port}"


def relayed_address(site: str, relays: tuple[str, ...]) -> str:
    """The address an outbound site advertises: relay://SITE@R1,R2 (each relay checked)."""
    address = f"{SCHEME}{site}@{','.join(relays)}"
    parse(address)
    return address


def server_name(address: str | Direct | Relayed) -> str:
    """The name the peer at `address` (or its parsed route) proves with its certificate: a relayed
    site's own name (every site certificate carries it, ops/certs.py; a job's member proves its
    site's), else the host dialled."""
    route = parse(address) if isinstance(address, str) else address
    return site_of(route.site) if isinstance(route, Relayed) else route.host


_WILDCARDS = ("", "0.0.0.0", "::", "[::]")


def local_host(bound_host: str) -> str:
    """Where this host reaches its own listener bound at `bound_host`: 127.0.0.1 for a wildcard (a
    listener on "::" takes IPv4 too: gRPC's and the relay's are dual-stack), else the host itself."""
    return "127.0.0.1" if bound_host in _WILDCARDS else bound_host.strip("[]")


def proxy_hop(text: str) -> Direct:
    """The HTTP CONNECT proxy `text` names ("http://host:port" or "host:port"); BadRoute with the fix."""
    try:
        return host_port(text.removeprefix("http://").rstrip("/"))
    except BadRoute as err:
        raise BadRoute(f"proxy {text!r}: {err}; give http://HOST:PORT of an HTTP CONNECT proxy") from None
