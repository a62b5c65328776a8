"""Opening a TCP connection to a peer the way its address says: directly, through this host's HTTP
CONNECT proxy, or through a relay to a site that only dials out (peer/transport/route.py).

Every byte stream a peer opens to another -- the gRPC channels (through the forwarder,
peer/transport/forwarder.py), the bulk data plane, an outbound site's tunnels to its relays --
is opened here, so which path a connection takes is decided in one place. The connection returned
is a plain socket past every CONNECT handshake: TLS between the two sites runs inside it, end to
end, and neither the proxy nor the relay can read or forge it.

A relayed site names several relays; the dialer tries them in order, starting with the one that
last worked for that site, so a dead relay costs one refused connection (or `connect_s`) per new
connection, not one per round.

    .venv/bin/python -m pytest tests/unit/test_dialer.py -q
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from peer.transport import route
from peer.transport.forwarder import Forwarder
from peer.transport.route import Direct, Relayed

log = logging.getLogger("sitemesh.dialer")

MAX_HEADER_BYTES = 4096
"""An HTTP CONNECT answer longer than this is refused: the proxies and relays this talks to answer
with a status line and a few headers."""
_LOOPBACK = ("localhost", "127.0.0.1", "::1")


class DialError(OSError):
    """No path to a peer worked; the message names each one tried and why it failed."""


@dataclass(frozen=True)
class Egress:
    """How this host reaches the outside: directly, or through an HTTP CONNECT proxy (as compute
    nodes of some facilities do), except for the hosts `no_proxy` names."""

    proxy: Direct | None = None
    no_proxy: tuple[str, ...] = ()
    """Host names, domain suffixes (".cluster.local" or "cluster.local") and "*" as curl reads them."""
    loopback_direct: bool = True
    """Loopback is dialled directly: a proxy taken from the environment (set for pip on a login
    node, say) must not catch a local mesh. A proxy the run file names applies to loopback too."""

    @classmethod
    def from_env(cls, proxy: str = "", no_proxy: str | None = None) -> Egress:
        """`proxy` ("http://host:port" or "host:port") if given, else the environment's
        `https_proxy` (gRPC's own reading of the environment is off: channels.py), with `no_proxy`."""
        text = proxy or os.environ.get("https_proxy") or os.environ.get("HTTPS_PROXY") or ""
        skip = no_proxy if no_proxy is not None else os.environ.get("no_proxy") or os.environ.get("NO_PROXY") or ""
        hop = route.proxy_hop(text) if text else None  # BadRoute (a ValueError) names the fix
        return cls(hop, tuple(s.strip() for s in skip.split(",") if s.strip()), loopback_direct=not proxy)

    def proxy_for(self, host: str) -> Direct | None:
        """The proxy to reach `host` through, or None to dial it directly."""
        if self.proxy is None or (self.loopback_direct and host in _LOOPBACK):
            return None
        for entry in self.no_proxy:
            if entry == "*" or host == entry.lstrip(".") or host.endswith("." + entry.lstrip(".")):
                return None
        return self.proxy


def connect_request(target: str) -> bytes:
    """An HTTP CONNECT request for `target` (``host:port``, or ``site/service`` at a relay)."""
    return f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()


def read_answer(sock: socket.socket) -> tuple[int, str]:
    """(status code, reason) of the HTTP answer to a CONNECT, read byte by byte so that nothing of
    the tunnelled stream after it is consumed; ConnectionError when it is not one."""
    data = bytearray()
    while not data.endswith(b"\r\n\r\n"):
        byte = sock.recv(1)
        if not byte:
            raise ConnectionError(f"closed before answering the CONNECT ({bytes(data[:80])!r})")
        data += byte
        if len(data) > MAX_HEADER_BYTES:
            raise ConnectionError(f"answered the CONNECT with more than {MAX_HEADER_BYTES} bytes of header")
    status = data.split(b"\r\n", 1)[0].decode("latin-1")
    parts = status.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ConnectionError(f"answered the CONNECT with {status[:80]!r}, not an HTTP status line")
    return int(parts[1]), parts[2] if len(parts) > 2 else ""


def _tunnel(sock: socket.socket, target: str, who: str) -> None:
    """Asks the proxy or relay at the other end of `sock` to connect it to `target`."""
    sock.sendall(connect_request(target))
    code, reason = read_answer(sock)
    if code != 200:
        raise ConnectionError(f"{who} refused CONNECT {target}: {code} {reason}")


@dataclass
class Dialer:
    """This process's way out (`egress`) and which relay last worked for each relayed site."""

    egress: Egress = field(default_factory=Egress)
    connect_s: float = 5.0
    """Seconds one TCP connect (and CONNECT answer) may take before the next path is tried: a
    relay dropped by a firewall answers nothing, and gossip must not wait a minute on it."""
    via_self: Callable[[str], Direct | None] | None = None
    """Where this process's own relay reaches a relayed site (RelayServer.local_route), if it runs one:
    tried before the relays the address names, since the site then dials back straight to this
    peer (one WAN path, no other relay loaded). Reached directly, never through the egress proxy."""
    _forwarder: Forwarder | None = None
    _good: dict[str, Direct] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    """Guards `_good`: the forwarder's thread, bulk receivers and the tunnel agent dial at once."""

    def tcp(self, hop: Direct, *, proxied: bool = True) -> socket.socket:
        """A connection to `hop`, through the egress proxy unless `hop` is exempt or not `proxied`
        (blocking)."""
        proxy = self.egress.proxy_for(hop.host) if proxied else None
        first = proxy or hop
        sock = socket.create_connection((first.host, first.port), timeout=self.connect_s)
        try:
            if proxy is not None:
                _tunnel(sock, route.text(hop), f"proxy {route.text(proxy)}")
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except BaseException:
            sock.close()
            raise
        return sock

    def open(self, address: str, service: str = "grpc", port: int | None = None) -> socket.socket:
        """A connection to `service` of the peer at `address` (blocking). A direct peer's service is
        at `port` (the bulk plane's, from its ticket) or the address's own; DialError names every
        path tried."""
        target = route.parse(address)
        if isinstance(target, Direct):
            hop = Direct(target.host, port) if port is not None else target
            try:
                return self.tcp(hop)
            except OSError as err:
                raise DialError(f"cannot connect to {route.text(hop)}: {err}") from err
        return self._relayed(target, service)

    def grpc_target(self, address: str) -> tuple[str, str]:
        """(what gRPC dials, the name the peer's certificate must carry) for `address`: the address
        itself where gRPC can dial it directly, else a forwarder port on loopback standing for it."""
        if not address.startswith(route.SCHEME) and self.egress.proxy is None:
            return address, ""  # as given: gRPC resolves it (names, "unix:" paths) as it always did
        target = route.parse(address)
        name = route.server_name(target)
        if isinstance(target, Direct) and self.egress.proxy_for(target.host) is None:
            return address, ""
        with self._lock:
            if self._forwarder is None:
                self._forwarder = Forwarder(self.open)
            forwarder = self._forwarder
        return f"127.0.0.1:{forwarder.port(address)}", name

    def close(self) -> None:
        """Closes the forwarder's ports (a peer that stops; the default dialer lives with the process)."""
        with self._lock:
            forwarder, self._forwarder = self._forwarder, None
        if forwarder is not None:
            forwarder.close()

    def path(self, address: str) -> str:
        """How the next connection to `address` goes, for `ops status`: "direct", "via proxy P",
        "via relay R" (the one that last worked, else the first named)."""
        target = route.parse(address)
        if isinstance(target, Relayed):
            if self.via_self is not None and self.via_self(target.site) is not None:
                return "via this peer's relay"
            with self._lock:
                hop = self._good.get(target.site, target.relays[0])
            return f"via relay {route.text(hop)}"
        proxy = self.egress.proxy_for(target.host)
        return "direct" if proxy is None else f"via proxy {route.text(proxy)}"

    def _relayed(self, target: Relayed, service: str) -> socket.socket:
        if service not in route.SERVICES:
            raise ValueError(f"unknown service {service!r}: one of {', '.join(route.SERVICES)}")
        with self._lock:
            good = self._good.get(target.site)
        own = self.via_self(target.site) if self.via_self is not None else None
        order = sorted((hop for hop in target.relays if hop != own),
                       key=lambda hop: hop != good)  # stable: the named order otherwise
        failures: list[str] = []
        for hop in ([own] if own is not None else []) + order:
            try:
                sock = self.tcp(hop, proxied=hop != own)
            except OSError as err:
                failures.append(f"relay {route.text(hop)}: {err}")
                continue
            try:
                sock.settimeout(self.connect_s)
                _tunnel(sock, f"{target.site}/{service}", f"relay {route.text(hop)}")
                sock.settimeout(None)
            except OSError as err:
                sock.close()
                what = str(err) or type(err).__name__
                failures.append(what if what.startswith(f"relay {route.text(hop)}") else f"relay {route.text(hop)}: {what}")
                continue
            if hop not in (good, own):
                with self._lock:
                    self._good[target.site] = hop
                if good is not None:
                    log.info("reaching %s through relay %s now (%s)", target.site, route.text(hop), "; ".join(failures))
            return sock
        raise DialError(f"no relay of {target.site} connected to it: {'; '.join(failures)}")
