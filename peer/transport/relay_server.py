"""A relay: a reachable host that joins connections from any site to sites that only dial out.

A site whose compute nodes accept no inbound connection (route.Relayed) holds a **tunnel** to each
of its relays: a connection it dialled out, TLS from its first byte, authenticated by its site
certificate (mutual, against the run CA); the relay tells it from a plaintext request by that byte. Another site reaching it dials the relay and asks for it with an HTTP CONNECT;
the relay asks the site over the tunnel to dial back a fresh connection, and joins the two:

    client -> relay   CONNECT lumi/grpc HTTP/1.1          (or lumi/bulk: the bulk data plane)
    relay  -> lumi    OPEN 3f2a... grpc                   (a line on lumi's tunnel)
    lumi   -> relay   ACCEPT 3f2a... HTTP/1.1             (a new connection lumi dials out)
    relay  -> client  HTTP/1.1 200 Connection established
    ... then bytes both ways, spliced unread: TLS between client and lumi, end to end.

Each relayed connection is its own TCP connection end to end, so parallel bulk streams stay
parallel and one stalled stream does not hold another (a multiplexed tunnel would). The relay
never decodes what it forwards (no TLS, no hashing): it checks certificates only on tunnels, so a
relay's certificate cannot speak as a site, and a certificate of another run gets no tunnel (its
handshake fails against this run's CA).

Bounds (`RelayLimits`): tunnels, connections per tunnel, connections waiting for a dial back, header
bytes and seconds, bytes held per connection (peer/transport/splice.py), and a tunnel silent past
`tunnel_idle_s` is dropped. The tunnel's line protocol, inside its TLS: site -> relay
"TUNNEL <member>" (the site, or one of its jobs' members), relay -> site "READY" once it holds it, then "OPEN <id> <service>" and "PONG"; site -> relay "PING" (tunnel.py
sends one every `PING_S`).

    peer serve --role relay --site relay1 --listen 0.0.0.0:7100 --certs certs/
    .venv/bin/python -m pytest tests/unit/test_relay.py -q
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import ssl
from dataclasses import dataclass, field

from peer.core.site_names import site_of
from peer.transport import route
from peer.transport.auth import BadCertificate, Role, identity_of
from peer.transport.channels import Credentials
from peer.transport.route import Direct
from peer.transport.splice import splice
from peer.transport.tls_context import server_tls

log = logging.getLogger("sitemesh.relay")

_TLS_HANDSHAKE = b"\x16"
PING_S = 5.0
"""How often a site pings its tunnel; the relay answers PONG. Either end drops a tunnel silent for
three times this: a relay on the far side of a cut is given up within ~15 s."""
_LINE_BYTES = 256


@dataclass(frozen=True)
class RelayLimits:
    """What one relay holds at most."""

    tunnels: int = 64
    """Sites with a tunnel here at once (a run has a handful; a reconnect replaces the old one)."""
    per_tunnel: int = 256
    """Relayed connections to one site at once: gossip, consensus, exchange and ~20 bulk streams
    from each of a few peers."""
    waiting: int = 64
    """Connections waiting for their site to dial back, per site."""
    header_s: float = 10.0
    """Seconds a new connection has to send its first line, and a site to dial back."""
    tunnel_idle_s: float = 3 * PING_S


@dataclass
class _Tunnel:
    site: str
    writer: asyncio.StreamWriter
    open: int = 0
    """Relayed connections to the site now (bounded by per_tunnel)."""
    waiting: dict[str, asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = field(default_factory=dict)


@dataclass
class RelayStats:
    """What the relay did, for its log line and metrics."""

    forwarded_bytes: int = 0
    relayed: int = 0
    refused: dict[str, int] = field(default_factory=dict)

    def refuse(self, why: str) -> None:
        self.refused[why] = self.refused.get(why, 0) + 1


class RelayServer:
    """The relay's listener and its tunnels (asyncio, in the calling loop)."""

    def __init__(self, creds: Credentials, limits: RelayLimits = RelayLimits()) -> None:
        if creds.plaintext:
            raise ValueError("a relay needs the run's certificates (--certs): tunnels are authenticated")
        self.limits = limits
        self.stats = RelayStats()
        self._creds = creds
        self._tls = server_tls(creds)
        self._tunnels: dict[str, _Tunnel] = {}
        self._listener: socket.socket | None = None
        self._local: Direct | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> int:
        """Listens on host:port (0: a free port); the port."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host or "0.0.0.0", port), family=family, backlog=1024,
                                              dualstack_ipv6=host == "::" and socket.has_dualstack_ipv6())
        self._listener.setblocking(False)
        self._tasks.add(asyncio.ensure_future(self._accept_loop(self._listener)))
        bound = int(self._listener.getsockname()[1])
        self._local = Direct(route.local_host(host), bound)
        return bound

    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as err:  # out of descriptors: the listener stands, accept again shortly
                log.warning("relay: accept failed: %s", err)
                await asyncio.sleep(0.5)
                continue
            task = asyncio.ensure_future(self._accept(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def local_route(self, site: str) -> Direct | None:
        """Where this process reaches `site` through its own relay: the listener, if `site` holds a
        tunnel here now, else None. A peer that also relays (a direct site's `relay_listen`) dials
        its own fetches this way (Dialer.via_self): the site dials back straight to it, so the bytes
        cross one WAN path, not two, and load no other relay. Called from the dialer's threads: a
        dict lookup, atomic under the GIL; a tunnel that ends meanwhile fails the CONNECT, and the
        dialer goes on to the site's named relays."""
        return self._local if site in self._tunnels else None

    def tunnels(self) -> list[str]:
        """Sites with a tunnel here now."""
        return sorted(self._tunnels)

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        for tunnel in list(self._tunnels.values()):
            tunnel.writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, conn: socket.socket) -> None:
        """A tunnel (TLS from its first byte: a handshake record starts 0x16) or a plaintext request."""
        try:
            first = await asyncio.wait_for(_peek(conn), self.limits.header_s)
            if first == _TLS_HANDSHAKE:
                return await self._hold_tunnel(*await _tls_streams(conn, self._tls))
            reader, writer = await asyncio.open_connection(sock=conn, limit=_LINE_BYTES * 4)
        except (asyncio.TimeoutError, ConnectionError, OSError, ssl.SSLError) as err:
            self.stats.refuse(type(err).__name__)
            conn.close()
            return
        try:
            line = await asyncio.wait_for(_header(reader), self.limits.header_s)
            verb, _, rest = line.partition(" ")
            if verb == "CONNECT":
                await self._connect(rest.rsplit(" ", 1)[0], reader, writer)
            elif verb == "ACCEPT":
                self._dialled_back(rest.split(" ", 1)[0], reader, writer)
            else:
                self.stats.refuse("bad request")
                await _answer(writer, 400, "expected CONNECT SITE/SERVICE or ACCEPT ID")
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError,
                OSError, ValueError) as err:
            self.stats.refuse(type(err).__name__)
            writer.transport.abort()

    async def _connect(self, target: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        site, _, service = target.partition("/")
        tunnel = self._tunnels.get(site)
        if service not in route.SERVICES:
            self.stats.refuse("bad service")
            return await _answer(writer, 400, f"unknown service {service!r}: one of {', '.join(route.SERVICES)}")
        if tunnel is None:
            self.stats.refuse("no tunnel")
            return await _answer(writer, 503, f"no tunnel from site {site} at this relay")
        if tunnel.open >= self.limits.per_tunnel or len(tunnel.waiting) >= self.limits.waiting:
            self.stats.refuse("tunnel full")
            return await _answer(writer, 503, f"{tunnel.open} connections to {site} open and {len(tunnel.waiting)} "
                                              "waiting here, the most there may be")
        ident = secrets.token_hex(16)
        back = tunnel.waiting[ident] = asyncio.get_running_loop().create_future()
        tunnel.open += 1
        try:
            tunnel.writer.write(f"OPEN {ident} {service}\n".encode())
            try:
                far = await asyncio.wait_for(back, self.limits.header_s)
            except asyncio.TimeoutError:
                self.stats.refuse("no dial back")
                return await _answer(writer, 504, f"site {site} did not dial back within {self.limits.header_s:.0f} s")
            except ConnectionError as err:  # the site refused, or its tunnel ended: the next relay may do
                self.stats.refuse("site refused" if isinstance(err, ConnectionRefusedError) else "tunnel gone")
                return await _answer(writer, 503, f"site {site}: {err}")
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            self.stats.relayed += 1
            await splice((reader, writer), far, self._count)
        finally:
            tunnel.waiting.pop(ident, None)
            tunnel.open -= 1

    def _count(self, n: int) -> None:
        self.stats.forwarded_bytes += n

    def _dialled_back(self, ident: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for tunnel in self._tunnels.values():
            back = tunnel.waiting.pop(ident, None)
            if back is not None and not back.done():
                back.set_result((reader, writer))
                return
        self.stats.refuse("unknown dial back")
        writer.transport.abort()

    async def _hold_tunnel(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        holder = self._site_of(writer)
        if holder is None:
            return
        # The member the tunnel stands for: the certificate's site, or one of its jobs (SITE.jN).
        words = (await asyncio.wait_for(reader.readline(), self.limits.header_s)).decode("ascii", "replace").split()
        site = words[1] if len(words) == 2 and words[0] == "TUNNEL" else ""
        if site_of(site) != holder:
            self.stats.refuse("not its site")
            log.warning("refused a tunnel from site %s for %r: a site holds tunnels for itself and its jobs",
                        holder, site)
            writer.transport.abort()
            return
        if site not in self._tunnels and len(self._tunnels) >= self.limits.tunnels:
            self.stats.refuse("tunnels full")
            log.warning("refused a tunnel from %s: %d tunnels held, the most there may be", site, len(self._tunnels))
            writer.transport.abort()
            return
        old = self._tunnels.get(site)
        if old is not None:  # the site reconnected (its old connection is dead or about to be)
            old.writer.transport.abort()
        tunnel = self._tunnels[site] = _Tunnel(site, writer)
        writer.write(b"READY\n")  # the site counts the tunnel up only now: a refusal is not mistaken for one
        log.info("tunnel from site %s up", site)
        try:
            while True:
                line = await asyncio.wait_for(reader.readline(), self.limits.tunnel_idle_s)
                if not line:
                    break
                said = line.split()
                if said == [b"PING"]:
                    writer.write(b"PONG\n")
                elif len(said) == 2 and said[0] == b"REFUSE":
                    refused = tunnel.waiting.pop(said[1].decode("ascii", "replace"), None)
                    if refused is not None and not refused.done():
                        refused.set_exception(ConnectionRefusedError("does not serve that service"))
        except asyncio.TimeoutError:
            log.warning("tunnel from site %s silent for %.0f s: dropped", site, self.limits.tunnel_idle_s)
        finally:
            if self._tunnels.get(site) is tunnel:
                del self._tunnels[site]
                log.info("tunnel from site %s down", site)
            for back in tunnel.waiting.values():  # no dial back can come through a tunnel that is gone
                if not back.done():
                    back.set_exception(ConnectionResetError("its tunnel to this relay closed"))
            writer.transport.abort()

    def _site_of(self, writer: asyncio.StreamWriter) -> str | None:
        """The site a verified tunnel certificate names, or None (refused and closed)."""
        ssl_object = writer.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        try:
            if der is None:
                raise BadCertificate("no certificate")
            who = identity_of(ssl.DER_cert_to_PEM_cert(der).encode())
        except (BadCertificate, ValueError) as err:
            self.stats.refuse("bad certificate")
            log.warning("refused a tunnel: %s", err)
            writer.transport.abort()
            return None
        if who.role is not Role.SITE:
            self.stats.refuse("not a site")
            log.warning("refused a tunnel from %s %s: only sites hold tunnels", who.role.value, who.name)
            writer.transport.abort()
            return None
        return who.name


async def _peek(conn: socket.socket) -> bytes:
    """The first byte `conn` sends, left unread (asyncio has no peek: wait until readable, then MSG_PEEK)."""
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(conn.fileno(), ready)
    try:
        await readable
    finally:
        loop.remove_reader(conn.fileno())
    return conn.recv(1, socket.MSG_PEEK)


async def _tls_streams(conn: socket.socket, ctx: ssl.SSLContext) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Streams over the server side of TLS on an accepted socket (the handshake done)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_LINE_BYTES * 4)
    protocol = asyncio.StreamReaderProtocol(reader)
    transport, _ = await loop.connect_accepted_socket(lambda: protocol, conn, ssl=ctx,
                                                      ssl_handshake_timeout=RelayLimits.header_s)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


async def _header(reader: asyncio.StreamReader) -> str:
    """The request line of an HTTP-style header ending in an empty line (bounded by the reader's limit)."""
    data = await reader.readuntil(b"\r\n\r\n")
    return data.split(b"\r\n", 1)[0].decode("ascii")


async def _answer(writer: asyncio.StreamWriter, code: int, reason: str) -> None:
    writer.write(f"HTTP/1.1 {code} {reason}\r\n\r\n".encode())
    with contextlib.suppress(ConnectionError, OSError):
        await writer.drain()
    writer.close()
