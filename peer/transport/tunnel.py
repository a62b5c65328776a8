"""An outbound site's side of its relays: a tunnel dialled out to each, and the connections they ask
for dialled back and joined to this peer's own services.

A site whose compute node accepts no inbound connection (`reach = "outbound"`) advertises
``relay://SITE@R1,R2`` (peer/transport/route.py). For each relay it holds a tunnel
(relay_server.py says the protocol): it dials out (through the egress proxy if there is one),
proves it is SITE with its certificate, pings every `PING_S`, and for every "OPEN <id> <service>"
dials the relay again, says "ACCEPT <id>" and joins that connection to its local gRPC server or
bulk plane. A relay that dies or goes silent is redialled with backoff while the others carry the
traffic: every relay is held at once, so losing one costs the connections it carried (gRPC and
the bulk plane reconnect through another, fetches resume by chunk) and nothing else.

    .venv/bin/python -m pytest tests/unit/test_relay.py -q
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from peer.transport import route
from peer.transport.auth import BadCertificate, identity_of
from peer.transport.channels import Credentials
from peer.transport.dialer import Dialer
from peer.transport.relay_server import PING_S
from peer.transport.route import Direct
from peer.transport.splice import splice
from peer.transport.tls_context import client_tls

log = logging.getLogger("sitemesh.tunnel")

_BACKOFF_S = (1.0, 30.0)
"""First and longest wait before redialling a relay that failed (doubling in between)."""


@dataclass
class TunnelState:
    """One relay as this site holds it, for `ops status` and the logs."""

    relay: str
    up: bool = False
    why: str = "not dialled yet"
    """Why it is down (the last failure), or what it is ("up")."""
    relayed: int = 0
    """Connections it asked for and this site joined."""


class TunnelAgent:
    """Holds a tunnel to each of `relays` for `site`; joins what they ask for to `services`."""

    def __init__(self, site: str, relays: tuple[str, ...], creds: Credentials, dialer: Dialer,
                 services: dict[str, Direct]) -> None:
        if creds.plaintext:
            raise ValueError("tunnels to relays need the site's certificates (--certs)")
        self.site = site
        self._hops = [route.host_port(r) for r in relays]
        self._creds = creds
        self._dialer = dialer
        self._services = services
        """Service name ("grpc", "bulk") -> where this peer serves it locally."""
        self._tls = client_tls(creds)
        self._tls.check_hostname = False  # a relay proves its run by the CA; which relay it is, by its name below
        self.states = {route.text(h): TunnelState(route.text(h)) for h in self._hops}
        self._tasks: set[asyncio.Task[None]] = set()
        self._first_up = asyncio.Event()

    def start(self) -> None:
        for hop in self._hops:
            self._spawn(self._hold(hop))

    async def wait_up(self, timeout_s: float) -> bool:
        """True once any tunnel is up; False after `timeout_s` with none."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._first_up.wait(), timeout_s)
        return self._first_up.is_set()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _hold(self, hop: Direct) -> None:
        state = self.states[route.text(hop)]
        wait = _BACKOFF_S[0]
        while True:
            try:
                reader, writer = await self._open_tunnel(hop)
            except (OSError, ssl.SSLError, asyncio.TimeoutError, BadCertificate) as err:
                if state.why != str(err):
                    log.warning("no tunnel to relay %s: %s (retrying)", state.relay, err)
                state.up, state.why = False, str(err)
                await asyncio.sleep(wait)
                wait = min(2 * wait, _BACKOFF_S[1])
                continue
            wait = _BACKOFF_S[0]
            state.up, state.why = True, "up"
            self._first_up.set()
            log.info("tunnel to relay %s up: other sites reach %s through it", state.relay, self.site)
            why = await self._serve(hop, reader, writer, state)
            state.up, state.why = False, why
            log.warning("tunnel to relay %s down: %s (redialling)", state.relay, why)

    async def _open_tunnel(self, hop: Direct) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        sock = await asyncio.to_thread(self._dialer.tcp, hop)
        try:
            sock.setblocking(False)
            # TLS from the first byte (the relay tells a tunnel from a request by it); no host name
            # to match: the run CA vouches for the relay, whatever name the site dials it by.
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(sock=sock, ssl=self._tls, server_hostname=""), self._dialer.connect_s)
        except BaseException:
            sock.close()
            raise
        ssl_object = writer.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if der is None:
            writer.transport.abort()
            raise BadCertificate("the relay showed no certificate")
        who = identity_of(ssl.DER_cert_to_PEM_cert(der).encode())
        try:
            writer.write(f"TUNNEL {self.site}\n".encode())
            ready = await asyncio.wait_for(reader.readline(), self._dialer.connect_s)
        except BaseException:
            writer.transport.abort()
            raise
        if ready != b"READY\n":
            writer.transport.abort()
            raise ConnectionError(f"{who.role.value} {who.name} refused the tunnel (see its log)")
        return reader, writer

    async def _serve(self, hop: Direct, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     state: TunnelState) -> str:
        """Answers the relay's OPENs and pings it until the tunnel ends; why it ended."""
        pinger = asyncio.ensure_future(self._ping(writer))
        try:
            while True:
                line = await asyncio.wait_for(reader.readline(), 3 * PING_S)
                if not line:
                    return "the relay closed it"
                words = line.decode("ascii", "replace").split()
                if len(words) == 3 and words[0] == "OPEN" and words[2] in self._services:
                    state.relayed += 1
                    self._spawn(self._dial_back(hop, words[1], self._services[words[2]]))
                elif len(words) == 3 and words[0] == "OPEN":
                    # A service this peer does not run (a trainer-less site has no bulk plane): the
                    # asker's mistake -- anyone may send a CONNECT -- not the relay's; the tunnel stands.
                    writer.write(f"REFUSE {words[1]}\n".encode())
                elif words != ["PONG"]:
                    return f"the relay sent {line[:60]!r}"
        except asyncio.TimeoutError:
            return f"silent for {3 * PING_S:.0f} s"
        except (ConnectionError, OSError, ssl.SSLError) as err:
            return str(err) or type(err).__name__
        finally:
            pinger.cancel()
            writer.transport.abort()

    async def _ping(self, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while True:
                writer.write(b"PING\n")
                await writer.drain()
                await asyncio.sleep(PING_S)

    async def _dial_back(self, hop: Direct, ident: str, local: Direct) -> None:
        try:
            sock = await asyncio.to_thread(self._dialer.tcp, hop)
        except OSError as err:
            log.warning("cannot dial relay %s back for a connection: %s", route.text(hop), err)
            return
        try:
            sock.sendall(f"ACCEPT {ident} HTTP/1.1\r\n\r\n".encode())
            sock.setblocking(False)
            far = await asyncio.open_connection(sock=sock)
        except OSError:
            sock.close()
            return
        try:
            near = await asyncio.open_connection(local.host, local.port)
        except OSError as err:
            log.warning("a relayed connection found no local service at %s: %s", route.text(local), err)
            far[1].transport.abort()
            return
        await splice(far, near)

