"""A fault-injecting asyncio TCP proxy for tests on loopback (this kernel has no netem).

Put it between a client and a server and give each new connection a `Fault` plan: drop the
connection after N bytes, flip one byte at an offset, stall for T seconds after N bytes, or delay
every read. Faults apply to one direction of a connection (server to client by default, where the
bulk data flows); connections beyond the list of plans pass through untouched, so "the first stream
breaks, the retry succeeds" is `FaultProxy(target, [Fault(drop_after=100_000)])`.

    async with FaultProxy(("127.0.0.1", server_port), [Fault(flip_at=70_000)]) as proxy:
        client = ExchangeClient(proxy.address)   # the first connection gets one byte flipped

Offsets count the bytes of the faulted direction of that connection from its first byte. The proxy
only ever connects to the target it was given (loopback in tests, or a peer inside the network
namespaces of tests/support/netns.py). `latency_s` makes it a delay line for every connection:

    async with FaultProxy(("10.212.0.2", 50051), latency_s=0.05) as proxy:   # +100 ms round trip

A transparent proxy takes each connection's target from the connection itself: an nftables
`redirect` brought it here and `original_destination` reads where it was going (netns.py's delay):

    FaultProxy(original_destination, latency_s=0.05, listen_port=4000, mark=MARK)
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any


@dataclass(frozen=True)
class Fault:
    """What to do to one connection. Leave a field None to not inject that fault."""

    drop_after: int | None = None
    """Close both sides abruptly once this many bytes went through."""
    flip_at: int | None = None
    """XOR 0xFF into the byte at this offset."""
    stall_after: int | None = None
    """Stop forwarding for `stall_s` seconds once this many bytes went through (then carry on)."""
    stall_s: float = 0.0
    delay_s: float = 0.0
    """Sleep this long before forwarding each read (a slow link)."""
    upstream: bool = False
    """Fault the client-to-server direction instead of server-to-client."""


PASS = Fault()


SO_ORIGINAL_DST = 80
"""linux/netfilter_ipv4.h: a redirected (NATed) connection's destination before the redirect."""


def original_destination(sock: socket.socket) -> tuple[str, int]:
    """Where a connection an nftables `redirect` (or DNAT) brought here was going: host, port."""
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)  # a struct sockaddr_in
    port, addr = struct.unpack_from("!2xH4s", raw)
    return socket.inet_ntoa(addr), port


@dataclass
class FaultProxy:
    target: tuple[str, int] | Callable[[socket.socket], tuple[str, int]]
    """Where every connection goes, or a function of the accepted socket saying where this one goes
    (`original_destination`: a transparent proxy)."""
    plans: list[Fault] = field(default_factory=list)
    host: str = "127.0.0.1"
    listen_port: int = 0
    """Port to listen on (0: an ephemeral one, read back from `port`)."""
    mark: int = 0
    """SO_MARK of the proxy's own connections to the targets (0: none; setting one needs
    CAP_NET_ADMIN), so that the redirect which brought a connection here lets them pass."""
    latency_s: float = 0.0
    """Delay line: every byte, both directions, is forwarded this long after it arrived, while reads
    go on (a long pipe holding rate x latency bytes), so a round trip through the proxy gains 2x this."""
    connections: int = 0
    """Connections accepted so far (the n-th one got plans[n-1], if any)."""
    faults_fired: list[str] = field(default_factory=list)
    """One line per fault that actually happened, e.g. "conn 1: flipped byte 70000"."""
    stalls_over: int = 0
    """Stalls that ran their whole `stall_s` (a test reads it to tell whether a client waited one out)."""
    _server: asyncio.base_events.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def port(self) -> int:
        assert self._server is not None, "proxy not started"
        return self._server.sockets[0].getsockname()[1]

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, self.host, self.listen_port)
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = self.connections
        fault = self.plans[conn - 1] if conn <= len(self.plans) else PASS
        try:
            server_r, server_w = await self._connect(client_w)
        except OSError:
            client_w.close()
            return
        writers = (client_w, server_w)
        up = self._spawn(self._pipe(conn, client_r, server_w, fault if fault.upstream else PASS, writers))
        down = self._spawn(self._pipe(conn, server_r, client_w, PASS if fault.upstream else fault, writers))
        await asyncio.gather(up, down, return_exceptions=True)

    async def _connect(
        self, client_w: asyncio.StreamWriter
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if not callable(self.target):
            host, port = self.target
        else:
            host, port = self.target(client_w.get_extra_info("socket"))
        if not self.mark:
            return await asyncio.open_connection(host, port)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, self.mark)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, (host, port))
        except BaseException:
            sock.close()
            raise
        return await asyncio.open_connection(sock=sock)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _pipe(
        self,
        conn: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        fault: Fault,
        writers: tuple[asyncio.StreamWriter, ...],
    ) -> None:
        sent, stalled = 0, False
        line = _DelayLine(writer, self.latency_s) if self.latency_s else None
        try:
            while data := await reader.read(65536):
                if fault.delay_s:
                    await asyncio.sleep(fault.delay_s)
                if fault.drop_after is not None and sent + len(data) >= fault.drop_after:
                    writer.write(data[: fault.drop_after - sent])
                    self.faults_fired.append(f"conn {conn}: dropped after {fault.drop_after} bytes")
                    for w in writers:  # abort, not close: the peer sees a reset mid-stream
                        w.transport.abort()
                    return
                if fault.flip_at is not None and sent <= fault.flip_at < sent + len(data):
                    buf = bytearray(data)
                    buf[fault.flip_at - sent] ^= 0xFF
                    data = bytes(buf)
                    self.faults_fired.append(f"conn {conn}: flipped byte {fault.flip_at}")
                if fault.stall_after is not None and not stalled and sent + len(data) >= fault.stall_after:
                    stalled = True
                    self.faults_fired.append(f"conn {conn}: stalled {fault.stall_s} s after {fault.stall_after} bytes")
                    await asyncio.sleep(fault.stall_s)
                    self.stalls_over += 1
                if line is not None:
                    line.put(data)
                else:
                    writer.write(data)
                    await writer.drain()
                sent += len(data)
            if line is not None:
                await line.flush()
        except (ConnectionError, OSError):
            pass
        finally:
            if line is not None:
                line.close()
            for w in writers:
                w.close()


class _DelayLine:
    """Writes each piece `latency_s` after it was put, in order, without holding up the reader."""

    def __init__(self, writer: asyncio.StreamWriter, latency_s: float) -> None:
        self._writer, self._latency = writer, latency_s
        self._queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        self._task = asyncio.ensure_future(self._run())

    def put(self, data: bytes) -> None:
        self._queue.put_nowait((asyncio.get_running_loop().time() + self._latency, data))

    async def flush(self) -> None:
        self._queue.put_nowait((0.0, b""))
        await self._task

    def close(self) -> None:
        self._task.cancel()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, data = await self._queue.get()
            if not data:
                return
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            self._writer.write(data)
            await self._writer.drain()
