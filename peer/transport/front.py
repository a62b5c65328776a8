"""A peer's listener: connections accepted here, kept or closed by their slot, relayed to gRPC.

gRPC bounds connections only in total and shows the code it runs no connection, so it cannot give
each identity and address its own bound (peer/transport/slots.py says who may hold how many). A
peer's server therefore does not listen on its public address itself: a `Front` does, in a thread
of its own, and relays each connection it keeps byte for byte to the gRPC server on a unix socket
in a private directory (mode 0700). TLS still ends in gRPC, which checks the certificates as before.

The relay's end of each connection binds a name of its own in that directory, so the gRPC server
sees every connection under its own `context.peer()`. `SlotKeeper`, the first interceptor of every
server (channels.new_server), reads the certificate of a connection's first call and asks
`Front.identify` whether its holder may keep it; a call on a connection that did not come through
the front (another process of this user dialling the unix socket) is refused. `remote_of` names
the client a relayed connection stands for.

Closes a remote client causes are counted in `Front.closed` by (cause, who) and logged once each;
the costs are measured in docs/decisions/security-connection-slots.md.

    .venv/bin/python -m pytest tests/integration/test_connection_slots.py -q
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ipaddress
import itertools
import logging
import os
import resource
import shutil
import socket
import tempfile
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from peer.transport.auth import BadCertificate, Role, identity_of
from peer.transport.intercept import CallCheck
from peer.transport.slots import Close, Kind, SlotLimits, Slots, address_key

log = logging.getLogger("sitemesh.front")

_BUFFER = 1 << 20
"""Bytes one end of a relay buffers before the other end stops reading: HTTP/2 flow control
bounds what is in flight anyway, this bounds the relay's own memory per connection."""
_BACKLOG = 1024
_CLOSE_GRACE_S = 1.0
"""A call refused for its connection's slot gets its status before the connection goes; a
closing end that will not take its last bytes is cut after 5 times this."""
_MAX_KEYS = 1024
"""Distinct (cause, who) counted apart; more (many addresses) are counted under who = "others"."""

_REMOTES: dict[str, str] = {}
"""A relayed connection's name as gRPC sees it ("unix:/tmp/sitemesh-x/c17") -> its client's
("ipv4:203.0.113.5:41234"), for every front of this process."""


def remote_of(peer: str) -> str:
    """The client a connection's `context.peer()` stands for; a connection not relayed unchanged."""
    return _REMOTES.get(peer, peer)


def holder_of(context: grpc.aio.ServicerContext) -> tuple[Kind, str]:
    """Who holds the connection of a call: a site and its name, or another kind of certificate; a
    plaintext caller (`--insecure`, where the guard trusts everyone) as a site without a name."""
    pems = (context.auth_context() or {}).get("x509_pem_cert")
    if not pems:
        return Kind.SITE, ""
    try:
        who = identity_of(pems[0])
    except (BadCertificate, ValueError):
        return Kind.OTHER, "a certificate without a sitemesh identity"
    if who.role is Role.SITE:
        return Kind.SITE, who.name
    return Kind.OTHER, f"{who.role.value} {who.name}"


@dataclass(eq=False)
class _Relay:
    conn: int
    remote: str
    """The client, as gRPC would name it: "ipv4:1.2.3.4:5678"."""
    up: asyncio.Transport
    down: asyncio.Transport | None = None
    peer: str = ""
    """The relay's end as the gRPC server names it; empty until connected."""
    closed: bool = False


class _Up(asyncio.Protocol):
    """The client's end, accepted on a public listener."""

    def __init__(self, front: Front) -> None:
        self.front = front
        self.relay: _Relay | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.relay = self.front._accepted(transport)

    def data_received(self, data: bytes) -> None:
        relay = self.relay
        if relay is not None and relay.down is not None:  # reading starts once the other end is there
            relay.down.write(data)

    def eof_received(self) -> bool:
        if self.relay is not None:
            self.front._drop(self.relay)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.relay is not None:
            self.front._drop(self.relay)

    def pause_writing(self) -> None:
        if self.relay is not None and self.relay.down is not None:
            self.relay.down.pause_reading()

    def resume_writing(self) -> None:
        if self.relay is not None and self.relay.down is not None:
            self.relay.down.resume_reading()


class _Down(asyncio.Protocol):
    """The relay's end towards the gRPC server."""

    def __init__(self, front: Front, relay: _Relay) -> None:
        self.front = front
        self.relay = relay

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.set_write_buffer_limits(high=_BUFFER)
        self.relay.down = transport
        if self.relay.closed:  # the client went while this end connected
            transport.abort()

    def data_received(self, data: bytes) -> None:
        self.relay.up.write(data)

    def eof_received(self) -> bool:
        self.front._drop(self.relay)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.front._drop(self.relay)

    def pause_writing(self) -> None:
        self.relay.up.pause_reading()

    def resume_writing(self) -> None:
        self.relay.up.resume_reading()


class Front:
    """The public listeners of one gRPC server, and the connections they hold."""

    def __init__(self, limits: SlotLimits = SlotLimits()) -> None:
        self.limits = limits
        self.slots = Slots(limits)
        self.closed: collections.Counter[tuple[str, str]] = collections.Counter()
        """(cause, who) -> connections closed or refused for a bound, and calls on them refused."""
        self._lock = threading.Lock()
        """Guards slots, closed and the maps below: the front's thread and gRPC's loop use them."""
        self._dir = _private_dir()
        weakref.finalize(self, shutil.rmtree, self._dir, True)
        self.socket_path = os.path.join(self._dir, "grpc")
        self._listeners: list[socket.socket] = []
        self._servers: list[asyncio.AbstractServer] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ids = itertools.count()
        self._relays: dict[int, _Relay] = {}
        self._by_peer: dict[str, _Relay] = {}
        self._settled: set[str] = set()
        """Peers (relay ends) whose holder keeps its slot: their calls need no look."""
        self._refusing: dict[str, str] = {}
        """Peer -> why its calls are refused while its connection closes."""
        self._timer: asyncio.TimerHandle | None = None

    @property
    def private_address(self) -> str:
        """Where the gRPC server listens for the relayed connections."""
        return "unix:" + self.socket_path

    def listen(self, address: str) -> int:
        """Binds `address` (port 0: a free port) and returns the port; OSError naming the address."""
        sockets = _listen(address)
        self._listeners += sockets
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._serve(sockets), self._loop).result()
        return int(sockets[0].getsockname()[1])

    async def start(self) -> None:
        """Starts accepting on every address listened on, in the front's own thread."""
        _raise_open_files(3 * self.limits.total + 1024)  # client, relay and gRPC end per connection
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="sitemesh-front", daemon=True)
        self._thread.start()
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._serve(self._listeners), loop))

    def stop_accepting(self) -> None:
        """Closes the listeners (another process may bind the port); held connections go on."""
        if self._loop is None:
            for sock in self._listeners:
                sock.close()
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(lambda: [server.close() for server in self._servers])

    async def close(self) -> None:
        """Closes the listeners and every connection, and stops the thread."""
        self.stop_accepting()
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._close_all(), loop))
            loop.call_soon_threadsafe(loop.stop)
            await asyncio.to_thread(thread.join)
        shutil.rmtree(self._dir, ignore_errors=True)

    def settled(self, peer: str) -> bool:
        return peer in self._settled

    def identify(self, peer: str, kind: Kind, name: str) -> tuple[grpc.StatusCode, str] | None:
        """A call came on connection `peer` from `kind` `name`. None if it goes on, else the status
        to refuse it with (its connection is closed after a grace, for the status to get out)."""
        close: Close | None = None
        with self._lock:
            relay = self._by_peer.get(peer)
            refusing = self._refusing.get(peer)
            if relay is not None and refusing is None and not relay.closed:
                close = self.slots.identify(relay.conn, kind, name)
                if close is None:
                    self._settled.add(peer)
                    return None
                refusing = self._refusing[peer] = f"{close.reason}: close some and retry"
        if relay is None:
            reason = f"connection {peer} did not come through this peer's listener"
            self._note(Close(-1, "not relayed", "the private socket", reason))
            return grpc.StatusCode.PERMISSION_DENIED, reason
        if refusing is None:
            return grpc.StatusCode.UNAVAILABLE, "the connection is closing"
        if close is not None:
            self._note(close)
            loop = self._loop
            assert loop is not None
            with contextlib.suppress(RuntimeError):  # the front is closing: so is the connection
                loop.call_soon_threadsafe(loop.call_later, _CLOSE_GRACE_S, self._drop, relay, True)
        return grpc.StatusCode.RESOURCE_EXHAUSTED, refusing

    # ----- the front's thread -----------------------------------------------------------------
    def _run(self) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _serve(self, sockets: Sequence[socket.socket]) -> None:
        loop = asyncio.get_running_loop()
        for sock in sockets:
            self._servers.append(await loop.create_server(lambda: _Up(self), sock=sock, backlog=_BACKLOG))

    async def _close_all(self) -> None:
        for server in self._servers:
            server.close()
        if self._timer is not None:
            self._timer.cancel()
        for relay in list(self._relays.values()):
            self._drop(relay, abort=True)
        connecting = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in connecting:
            task.cancel()
        await asyncio.gather(*connecting, return_exceptions=True)

    def _accepted(self, up: asyncio.Transport) -> _Relay | None:
        loop = self._loop
        assert loop is not None
        peername = up.get_extra_info("peername")
        if not peername:  # reset before it was accepted
            up.abort()
            return None
        host, port = peername[:2]
        conn = next(self._ids)
        with self._lock:
            admission = self.slots.admit(conn, address_key(host), loop.time())
            pushed = [self._relays[c.conn] for c in admission.closes if c.conn != conn]
        for close in admission.closes:
            self._note(close)
        for relay in pushed:
            self._drop(relay, abort=True)
        if not admission.admitted:
            up.abort()
            return None
        up.pause_reading()  # until the relay's other end is connected
        up.set_write_buffer_limits(high=_BUFFER)
        relay = _Relay(conn, _peer_name(host, port), up)
        with self._lock:
            self._relays[conn] = relay
        loop.create_task(self._connect(relay))
        if self._timer is None:
            self._expire()
        return relay

    async def _connect(self, relay: _Relay) -> None:
        loop = asyncio.get_running_loop()
        path = os.path.join(self._dir, f"c{relay.conn}")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.bind(path)  # the name gRPC's context.peer() shows for this connection
            try:
                await loop.sock_connect(sock, self.socket_path)
            finally:
                os.unlink(path)
            if relay.closed:
                sock.close()
                return
            with self._lock:
                relay.peer = "unix:" + path
                self._by_peer[relay.peer] = relay
                _REMOTES[relay.peer] = relay.remote
            await loop.create_unix_connection(lambda: _Down(self, relay), sock=sock)
        except OSError as err:
            sock.close()
            self._note(Close(relay.conn, "relay", "this peer", f"the gRPC server at {self.socket_path} cannot be "
                                                              f"reached: {err}"))
            self._drop(relay, abort=True)
            return
        if not relay.closed:
            relay.up.resume_reading()

    def _drop(self, relay: _Relay, abort: bool = False) -> None:
        """Ends both sides of `relay` and gives back its slot; `abort` drops what is unsent."""
        if relay.closed:
            return
        relay.closed = True
        with self._lock:
            self.slots.release(relay.conn)
            self._relays.pop(relay.conn, None)
            if relay.peer:
                self._by_peer.pop(relay.peer, None)
                self._settled.discard(relay.peer)
                self._refusing.pop(relay.peer, None)
                _REMOTES.pop(relay.peer, None)
        for end in (relay.up, relay.down):
            if end is None:
                continue
            if abort:
                end.abort()
            else:
                end.close()  # what the other side said last (a GOAWAY) still goes out ...
                assert self._loop is not None
                self._loop.call_later(5 * _CLOSE_GRACE_S, end.abort)  # ... to a reader within a bound

    def _expire(self) -> None:
        """Closes the connections that made no call in time, and waits for the next to be due."""
        loop = self._loop
        assert loop is not None
        self._timer = None
        with self._lock:
            closes = self.slots.expire(loop.time())
            expired = [self._relays[c.conn] for c in closes]
            deadline = self.slots.next_deadline()
        for close, relay in zip(closes, expired):
            self._note(close)
            self._drop(relay, abort=True)
        if deadline != float("inf"):
            self._timer = loop.call_at(deadline, self._expire)

    def _note(self, close: Close) -> None:
        """Counts a close and logs the first of each (cause, who)."""
        with self._lock:
            key = (close.cause, close.who)
            if key not in self.closed and len(self.closed) >= _MAX_KEYS:
                key = (close.cause, "others")
            first = key not in self.closed
            self.closed[key] += 1
        if first:
            log.warning("closed a connection (%s): %s; further closes of this kind are only counted",
                        key[1], close.reason)


class SlotKeeper(CallCheck):
    """The first interceptor of a fronted server: a connection's first call shows who holds it, and
    whether its holder may keep it (Front.identify). Every method is looked at, health included:
    the bounds are on connections, whatever is called over them."""

    def __init__(self, front: Front) -> None:
        self.front = front

    async def check(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> None:
        peer = context.peer()
        if self.front.settled(peer):
            return
        refused = self.front.identify(peer, *holder_of(context))
        if refused is not None:
            await context.abort(*refused)


class FrontedServer(grpc.aio.Server):
    """A gRPC server whose public addresses are a `Front`'s (`channels.bind` listens through it)."""

    def __init__(self, server: grpc.aio.Server, front: Front) -> None:
        self.server = server
        self.front = front
        self._private = False

    def listen(self, address: str, credentials: grpc.ServerCredentials | None) -> int:
        """Listens on `address` through the front (credentials None: plaintext); returns the port."""
        if not self._private:
            if credentials is None:
                self.server.add_insecure_port(self.front.private_address)
            else:
                self.server.add_secure_port(self.front.private_address, credentials)
            self._private = True
        return self.front.listen(address)

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self.server.add_generic_rpc_handlers(generic_rpc_handlers)

    def add_registered_method_handlers(self, service_name: str, method_handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.server.add_registered_method_handlers(service_name, method_handlers)

    def add_insecure_port(self, address: str) -> int:
        """A port gRPC serves directly, past the front: for tools, never a peer's public address."""
        return self.server.add_insecure_port(address)

    def add_secure_port(self, address: str, server_credentials: grpc.ServerCredentials) -> int:
        return self.server.add_secure_port(address, server_credentials)

    async def start(self) -> None:
        await self.server.start()
        await self.front.start()

    async def stop(self, grace: float | None) -> None:
        self.front.stop_accepting()
        try:
            await self.server.stop(grace)
        finally:
            await self.front.close()

    async def wait_for_termination(self, timeout: float | None = None) -> bool:
        return await self.server.wait_for_termination(timeout)


def _listen(address: str) -> list[socket.socket]:
    """Listening sockets for `host:port` as gRPC binds them: every address the host resolves to
    (localhost: 127.0.0.1 and ::1) on one port; "[::]" or no host dual-stack."""
    host, _, port_text = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    try:
        port = int(port_text)
        if host in ("", "::") and socket.has_dualstack_ipv6():
            targets = [(socket.AF_INET6, "::")]
        else:
            infos = socket.getaddrinfo(host or "0.0.0.0", port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            targets = list(dict.fromkeys((family, str(sockaddr[0])) for family, _, _, _, sockaddr in infos))
    except (ValueError, OSError) as err:
        raise OSError(f"cannot listen on {address}: {err}") from err
    sockets: list[socket.socket] = []
    try:
        for family, ip in targets:
            dual = family == socket.AF_INET6 and ipaddress.ip_address(ip.split("%")[0]).is_unspecified
            sockets.append(socket.create_server((ip, port), family=family, backlog=_BACKLOG, reuse_port=False,
                                                dualstack_ipv6=dual and socket.has_dualstack_ipv6()))
            port = port or int(sockets[0].getsockname()[1])
    except OSError as err:
        for sock in sockets:
            sock.close()
        raise OSError(f"cannot listen on {address}: {err} (is the port in use?)") from err
    return sockets


def _peer_name(host: str, port: int) -> str:
    """A client's address as gRPC's context.peer() writes it."""
    return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"


_DIR_PREFIX = "sitemesh-front-"


def _private_dir() -> str:
    """A directory only this user can enter, short enough for unix socket names (108 bytes), named
    after this process; those of this user's processes that are gone (killed) are removed first."""
    base = tempfile.gettempdir()
    base = base if len(base) < 64 else "/tmp"
    with contextlib.suppress(OSError):
        for entry in os.scandir(base):
            pid = entry.name.removeprefix(_DIR_PREFIX).split("-", 1)[0]
            if entry.name.startswith(_DIR_PREFIX) and pid.isdigit() and entry.stat().st_uid == os.getuid() \
                    and not _alive(int(pid)):
                shutil.rmtree(entry.path, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-", dir=base)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _raise_open_files(need: int) -> None:
    """Lets this process have `need` files open if its hard limit allows (as Go's runtime does):
    a soft limit of 1024 is common and each relayed connection takes three."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
