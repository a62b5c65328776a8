"""The exchange's bulk data plane: chunk ranges over a plain TCP stream (TLS under mutual TLS).

gRPC stays the control plane and the contract (manifests, announcements, OpenBulk tickets, the
fallback FetchChunks); this moves only the chunk bytes, at a fraction of gRPC's CPU per byte
(docs/decisions/exchange-bulk-plane.md). The wire protocol is documented in
protos/sitemesh/v1/exchange.proto ("Bulk data plane"): a request of magic + one-time token +
FetchRequest, answered by chunk frames (the Chunk's index and data) or one error frame.

Both ends run in threads with blocking sockets: a receive is `recv_into` a preallocated buffer and
the blake3 check runs in the same thread (both release the GIL), the server sends straight from the
encoded object (`sendmsg` of a header and a memoryview), so a chunk costs the event loop one step.

    server = BulkServer(store, host="127.0.0.1"); server.start()      # on the node's loop
    add_exchange_service(grpc_server, store, bulk=server)              # OpenBulk hands out tickets
    # receivers: ExchangeClient(address, plane="bulk") -> client.fetch_chunks uses it
    .venv/bin/python -m pytest tests/integration/test_exchange_bulk.py -q
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import secrets
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import torch

from peer.exchange import codec
from peer.exchange.buffers import ChunkBuffers
from peer.exchange.service import Refusal, resolve_fetch
from peer.exchange.store import ExchangeStore
from peer.gen.sitemesh.v1 import exchange_pb2
from peer.transport.channels import PLAINTEXT, Credentials
from peer.transport.tls_context import server_tls

log = logging.getLogger("sitemesh.exchange")

MAGIC = b"SMB1"
TOKEN_BYTES = 32
MAX_REQUEST_BYTES = 4096
"""A FetchRequest is a key, a 32-byte root and two integers: ~100 bytes. Anything longer is garbage."""
HEADER = struct.Struct("<BII")  # kind, a, b (see exchange.proto)
_LENGTH = struct.Struct("<I")
FRAME_CHUNK, FRAME_ERROR = 1, 2
MAX_ERROR_BYTES = 4096


@dataclass(frozen=True)
class BulkConfig:
    """Bounds of one peer's bulk listener."""

    host: str = "127.0.0.1"
    """Interface to listen on: the gRPC listen host (receivers dial the host they reached gRPC at)."""
    port: int = 0
    """0: an ephemeral port, announced through OpenBulk."""
    max_connections: int = 64
    """Connections at once (handshaking or streaming): a few per peer and phase in any real run."""
    request_timeout_s: float = 10.0
    """One deadline from accept: the TLS handshake, the request and, for a refused one, reading the
    error frame must all be done within it, however slowly the bytes trickle; then it is closed."""
    send_stall_s: float = 60.0
    """A receiver that reads nothing for this long is dropped (it resumes on a new connection)."""
    ticket_ttl_s: float = 30.0
    """How long a ticket from OpenBulk stays good for its one connection (BulkTicket.ttl_ms)."""
    accept_backoff_s: float = 0.1
    """After a failed accept() (EMFILE, ENFILE, ECONNABORTED): the pause before accepting again."""
    max_tickets: int = 1024
    """Tickets handed out and not yet used or expired; more are refused (RESOURCE_EXHAUSTED)."""

    def __post_init__(self) -> None:
        if min(self.max_connections, self.max_tickets) < 1 or not 0 <= self.port < 65536:
            raise ValueError(f"invalid bulk config {self}: connections and tickets >= 1, port in [0, 65536)")
        if min(self.request_timeout_s, self.send_stall_s, self.ticket_ttl_s, self.accept_backoff_s) <= 0:
            raise ValueError(f"invalid bulk config {self}: timeouts must be > 0")


def error_frame(code: grpc.StatusCode, message: str) -> bytes:
    text = message.encode()[:MAX_ERROR_BYTES]
    return HEADER.pack(FRAME_ERROR, code.value[0], len(text)) + text


class BulkServer:
    """Serves FetchRequests of `store`'s objects over TCP to holders of a ticket (one per connection)."""

    def __init__(self, store: ExchangeStore, config: BulkConfig = BulkConfig(),
                 creds: Credentials = PLAINTEXT) -> None:
        self._store, self.config, self._creds = store, config, creds
        self._tls = None if creds.plaintext else server_tls(creds)
        self._tickets: dict[bytes, float] = {}  # token -> monotonic expiry
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()  # the socket served (the SSLSocket under TLS)
        self._closed = threading.Event()  # set under _lock: no connection joins _open once it is set
        self._listener: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.port = 0
        self.refused: dict[str, int] = {}
        """Connections refused, by status name (under `_lock`; `refusals()` reads a copy)."""

    def start(self) -> int:
        """Listens (on the calling event loop's behalf: byte counts go to the store on it); the port."""
        self._loop = asyncio.get_running_loop()
        host = self.config.host.strip("[]")  # "[::]:7001" listens on host "[::]"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # "::" takes IPv4 too, as gRPC's [::] does (create_server alone would set IPV6_V6ONLY).
        dualstack = host == "::" and socket.has_dualstack_ipv6()
        listener = socket.create_server((host, self.config.port), family=family,
                                        backlog=self.config.max_connections, dualstack_ipv6=dualstack)
        self._listener, self.port = listener, listener.getsockname()[1]
        threading.Thread(target=self._accept, name=f"bulk-accept-{self.port}", daemon=True).start()
        return self.port

    def close(self) -> None:
        """Stops listening and drops every open connection (their receivers resume elsewhere)."""
        with self._lock:
            self._closed.set()
            open_now = list(self._open)
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked in its thread
            self._listener.close()
            self._listener = None
        for conn in open_now:
            shutdown(conn)

    def ticket(self) -> exchange_pb2.BulkTicket:
        """A one-connection ticket (OpenBulk's answer); Refusal when too many are outstanding."""
        now = time.monotonic()
        with self._lock:
            for token in [t for t, expiry in self._tickets.items() if expiry < now]:
                del self._tickets[token]
            if len(self._tickets) >= self.config.max_tickets:
                raise Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"{len(self._tickets)} bulk tickets are outstanding, the most there may be: "
                              "use or let expire the ones held")
            token = secrets.token_bytes(TOKEN_BYTES)
            self._tickets[token] = now + self.config.ticket_ttl_s
        return exchange_pb2.BulkTicket(port=self.port, token=token, ttl_ms=int(self.config.ticket_ttl_s * 1000),
                                       tls=self._tls is not None)

    def _accept(self) -> None:
        listener = self._listener
        assert listener is not None
        failing = False
        while True:
            try:
                conn, _ = listener.accept()
            except OSError as err:
                if self._closed.is_set():
                    return
                # Out of descriptors, or a connection reset in the backlog: passing, and the listener
                # still stands (OpenBulk hands out its port), so accept again after a pause.
                if not failing:
                    log.warning("bulk listener on port %d: accept failed (%s); retrying every %.2f s",
                                self.port, err, self.config.accept_backoff_s)
                failing = True
                if self._closed.wait(self.config.accept_backoff_s):
                    return
                continue
            if failing:
                log.info("bulk listener on port %d accepts again", self.port)
                failing = False
            with self._lock:
                if self._closed.is_set():
                    conn.close()
                    return
                full = len(self._open) >= self.config.max_connections
                if not full:
                    self._open.add(conn)
            if full:
                self._count("RESOURCE_EXHAUSTED")
                if self._tls is None:  # under TLS the client expects a handshake, not a frame
                    with contextlib.suppress(OSError):
                        conn.sendall(error_frame(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                                 f"{self.config.max_connections} bulk connections are open, "
                                                 "the most there may be; retry later"))
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name=f"bulk-serve-{self.port}", daemon=True).start()

    def refusals(self) -> dict[str, int]:
        """Connections refused so far, by status name (the metric sitemesh_exchange_bulk_refused)."""
        with self._lock:
            return dict(self.refused)

    def _count(self, what: str) -> None:
        with self._lock:
            self.refused[what] = self.refused.get(what, 0) + 1

    def _serve(self, conn: socket.socket) -> None:
        # One deadline for everything before streaming: a timeout per read would let a peer that
        # sends a byte every few seconds hold the slot for minutes (and, under TLS, before it has
        # shown any certificate).
        deadline = time.monotonic() + self.config.request_timeout_s
        sock: socket.socket = conn
        try:
            if self._tls is not None:
                # wrap_socket detaches `conn`: from now on only the SSLSocket can be shut down.
                sock = self._tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
                with self._lock:
                    self._open.discard(conn)
                    if self._closed.is_set():
                        return
                    self._open.add(sock)
                _until(sock, deadline)
                sock.do_handshake()  # bounded as a whole by the timeout set (CPython's _ssl)
            try:
                encoded, request = self._request(sock, deadline)
            except Refusal as err:
                self._count(err.code.name)
                _refuse(sock, err, deadline)
                return
            sock.settimeout(self.config.send_stall_s)
            self._stream(sock, encoded, request.first_chunk, request.end_chunk)
        except (OSError, ssl.SSLError):
            pass  # a receiver that went away, stalled or failed its handshake: it resumes elsewhere
        finally:
            with self._lock:
                self._open.discard(sock)
            with contextlib.suppress(OSError):
                sock.close()

    def _request(self, sock: socket.socket, deadline: float) -> tuple[codec.Encoded, exchange_pb2.FetchRequest]:
        head = _recv_exactly(sock, len(MAGIC) + TOKEN_BYTES + _LENGTH.size, deadline)
        if head is None or head[: len(MAGIC)] != MAGIC:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "not a sitemesh bulk request (it starts with "
                          "\"SMB1\", a ticket's token and a FetchRequest; see exchange.proto)")
        token = bytes(head[len(MAGIC) : len(MAGIC) + TOKEN_BYTES])
        with self._lock:
            expiry = self._tickets.pop(token, None)
        if expiry is None or expiry < time.monotonic():
            raise Refusal(grpc.StatusCode.UNAUTHENTICATED,
                          "bulk token unknown, already used or expired: ask OpenBulk for a ticket per connection")
        (length,) = _LENGTH.unpack(head[len(MAGIC) + TOKEN_BYTES :])
        if length > MAX_REQUEST_BYTES:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT,
                          f"bulk request of {length} bytes, the most is {MAX_REQUEST_BYTES}")
        raw = _recv_exactly(sock, length, deadline)
        if raw is None:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "bulk request ended inside its FetchRequest")
        try:
            request = exchange_pb2.FetchRequest.FromString(bytes(raw))
        except Exception as err:  # noqa: BLE001 - protobuf's DecodeError is not exported stably
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"bulk request is not a FetchRequest: {err}") from None
        return resolve_fetch(self._store, request), request

    def _stream(self, sock: socket.socket, encoded: codec.Encoded, first: int, end: int) -> None:
        plain = not isinstance(sock, ssl.SSLSocket)  # SSLSocket has no sendmsg
        sent = 0
        whole = codec.as_memoryview(encoded.data)  # sliced per chunk: no tensor per chunk
        try:
            for index in range(first, end):
                start, stop = encoded.manifest.wire_bounds(index)
                view = whole[start:stop]
                header = HEADER.pack(FRAME_CHUNK, index, view.nbytes)
                if plain:
                    _sendmsg_all(sock, header, view)
                else:
                    sock.sendall(header)
                    sock.sendall(view)
                sent += view.nbytes
        finally:
            if sent and self._loop is not None:
                kind = encoded.manifest.key.kind.name.lower()
                with contextlib.suppress(RuntimeError):  # the loop closed: nobody reads the count
                    self._loop.call_soon_threadsafe(self._add_sent, kind, sent)

    def _add_sent(self, kind: str, nbytes: int) -> None:
        self._store.sent_bytes[kind] = self._store.sent_bytes.get(kind, 0) + nbytes


def _refuse(sock: socket.socket, err: Refusal, deadline: float) -> None:
    """Sends the error frame and lets the receiver read it: closing with unread request bytes would
    reset the connection, and a reset can discard the frame before the receiver reads it. The
    connection's deadline bounds this too."""
    _until(sock, deadline)
    sock.sendall(error_frame(err.code, err.message))
    if not isinstance(sock, ssl.SSLSocket):
        sock.shutdown(socket.SHUT_WR)
    left = MAX_REQUEST_BYTES + 64 * 1024  # what an honest request can have left unread, with room
    while left > 0:
        _until(sock, deadline)
        if not (got := sock.recv(min(left, 65536))):
            return
        left -= len(got)


def _until(sock: socket.socket, deadline: float) -> None:
    """Makes the next blocking call on `sock` end by `deadline` (socket.timeout if it has passed)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise socket.timeout("deadline passed")
    sock.settimeout(left)


def shutdown(sock: socket.socket) -> None:
    """Wakes whatever thread blocks on `sock`. For an SSLSocket, the plain socket's shutdown: the
    SSLSocket's own would drop its TLS state under the thread still using it."""
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _sendmsg_all(sock: socket.socket, header: bytes, view: memoryview) -> None:
    """The header and the chunk in one system call when the socket takes them at once."""
    done = sock.sendmsg((header, view))
    if done < len(header):
        sock.sendall(header[done:])
        done = len(header)
    if done - len(header) < view.nbytes:
        sock.sendall(view[done - len(header) :])


def _recv_exactly(sock: socket.socket, n: int, deadline: float | None = None) -> memoryview | None:
    """n bytes, or None if the connection ends first."""
    buf = memoryview(bytearray(n))
    return buf if _recv_into(sock, buf, deadline) else None


def _recv_into(sock: socket.socket, view: memoryview, deadline: float | None = None) -> bool:
    """Fills `view`; False if the connection ends first. socket.timeout once `deadline` (monotonic)
    passes, however the bytes trickle; without one, after a silence of the socket's timeout."""
    got, n = 0, len(view)
    while got < n:
        if deadline is not None:
            _until(sock, deadline)
        k = sock.recv_into(view[got:])
        if not k:
            return False
        got += k
    return True


# ---------------------------------------------------------------------------- receiving side


class Truncated(ConnectionError):
    """The connection ended before the requested range did."""


class Misplaced(ConnectionError):
    """A frame that is not the chunk due (duplicate, reordered, or of another length)."""


class ErrorFrame(Refusal):
    """The server refused the request (its error frame); `code` is the status it would give over gRPC."""


_CODES = {c.value[0]: c for c in grpc.StatusCode}


@dataclass(frozen=True)
class BulkTarget:
    """Where one bulk connection goes and how it authenticates."""

    host: str
    port: int
    token: bytes
    tls: ssl.SSLContext | None = None
    server_name: str = ""
    """The name the server's certificate must carry (the host of the gRPC address; a relayed
    site's name)."""
    dial: Callable[[], socket.socket] | None = None
    """Opens the byte stream to the plane (peer/transport/dialer.py: through a proxy or a relay);
    None: connect to host:port."""


def connect(target: BulkTarget, request: exchange_pb2.FetchRequest, timeout_s: float) -> socket.socket:
    """Opens the connection and sends the request (blocking; in the receiving thread)."""
    if target.dial is None:
        sock = socket.create_connection((target.host, target.port), timeout=timeout_s)
    else:
        sock = target.dial()
        sock.settimeout(timeout_s)  # as create_connection leaves it: receive bounds silences by it
    try:
        if target.tls is not None:
            sock = target.tls.wrap_socket(sock, server_hostname=target.server_name or target.host)
        raw = request.SerializeToString()
        sock.sendall(MAGIC + target.token + _LENGTH.pack(len(raw)) + raw)
    except BaseException:
        sock.close()
        raise
    return sock


def receive(
    sock: socket.socket,
    manifest: codec.Manifest,
    first: int,
    end: int,
    loop: asyncio.AbstractEventLoop,
    deliver: Callable[[int, memoryview], Coroutine[Any, Any, None] | None],
    stopped: threading.Event,
    *,
    stall_s: float | None = None,
    deadline: float | None = None,
    reached: threading.Event | None = None,
    buffers: ChunkBuffers | None = None,
    into: Callable[[int], Sequence[memoryview] | None] | None = None,
    placed: Callable[[int, Sequence[memoryview]], None] | None = None,
) -> None:
    """Reads chunks [first, end) off `sock`, checks each (index, length, blake3) and hands it to
    `deliver`, in order: a coroutine function is run on `loop`, receiving chunk k+1 overlapping
    delivering k; a plain function is called here, in this thread. Each chunk must be in within
    `stall_s` of the one before, all of them by `deadline` (monotonic), however the bytes trickle:
    else socket.timeout (None: no bound but the socket's own timeout). `reached` is set once the first frame's header is in.
    Receive buffers: a plain function gets every chunk in one buffer, reused (it must not keep the
    view), taken from `buffers` and given back at the end (a fresh one without a pool); a coroutine
    gets a buffer of `buffers` per chunk, which it gives back when done, or a fresh one per chunk
    without a pool (docs/decisions/exchange-buffer-reuse.md). Raises Truncated,
    Misplaced, codec.ChunkError, ErrorFrame, socket.timeout or OSError; what `deliver` raises is
    raised here too. Runs in its own thread.
    `into`, with a plain `deliver`: where chunk k's bytes belong when they can go there as they are
    (decoding.chunk_targets); such a chunk is received straight into that memory, verified there and
    handed to `placed` instead of `deliver`. A corrupt one leaves garbage there until the retry
    writes it again (the destination means nothing before the fetch returns)."""
    on_loop = asyncio.iscoroutinefunction(deliver)
    header = memoryview(bytearray(HEADER.size))
    pending: concurrent.futures.Future[None] | None = None
    own: memoryview | None = None  # a plain function's one buffer
    if not on_loop:
        own = (buffers or ChunkBuffers(manifest.layout.wire_bytes(manifest.chunk_size))).take(
            manifest.layout.wire_bytes(manifest.chunk_size))
    try:
        for due in range(first, end):
            limits = [t for t in (None if stall_s is None else time.monotonic() + stall_s, deadline) if t is not None]
            by = min(limits, default=None)
            if not _recv_into(sock, header, by):
                raise Truncated(f"connection ended at chunk {due}, expected up to {end}")
            if reached is not None:
                reached.set()
            kind, a, b = HEADER.unpack(header)
            if kind == FRAME_ERROR:
                text = _recv_exactly(sock, min(b, MAX_ERROR_BYTES), by)
                raise ErrorFrame(_CODES.get(a, grpc.StatusCode.UNKNOWN),
                                 bytes(text).decode(errors="replace") if text is not None else "(cut short)")
            if kind != FRAME_CHUNK:
                raise Misplaced(f"frame of unknown kind {kind} at chunk {due}")
            if a != due:
                raise Misplaced(f"got chunk {a} when chunk {due} was due (duplicate or reordered)")
            start, stop = manifest.wire_bounds(due)
            if b != stop - start:  # checked before reading: a lying length cannot make us allocate
                raise codec.ChunkError(f"{manifest.key}: chunk {due} announced {b} bytes, a "
                                       f"{manifest.layout.wire.name} chunk of this manifest has {stop - start}")
            targets = None if into is None or on_loop else into(due)
            if targets is not None:
                assert placed is not None
                for target in targets:
                    if not _recv_into(sock, target, by):
                        raise Truncated(f"connection ended inside chunk {due}")
                codec.verify_chunk(manifest, due, targets)
                if stopped.is_set():
                    return
                placed(due, targets)
                continue
            # A coroutine may hold its chunk after this thread moved on: a buffer of its own (fresh
            # without a pool); a plain function is done with it when it returns.
            if own is not None:
                view = own[:b]
            else:
                view = codec.as_memoryview(torch.empty(b, dtype=torch.uint8)) if buffers is None else buffers.take(b)
            if not _recv_into(sock, view, by):
                raise Truncated(f"connection ended inside chunk {due}")
            codec.verify_chunk(manifest, due, view)
            if pending is not None:
                pending.result()  # chunks reach the sink in order, one at a time
            if stopped.is_set():
                return
            if not on_loop:
                deliver(due, view)
                continue
            coro = deliver(due, view)
            assert coro is not None
            pending = asyncio.run_coroutine_threadsafe(coro, loop)
        if pending is not None:
            pending.result()
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
        if own is not None and buffers is not None:
            buffers.give(own)
