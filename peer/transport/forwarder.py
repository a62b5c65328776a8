"""Loopback ports that stand for peers gRPC cannot dial by itself.

gRPC dials `host:port` (or one fixed HTTP proxy per channel); a site reached only through relays,
with a fallback when one dies, or a peer behind this host's CONNECT proxy is neither. For such an
address the dialer (peer/transport/dialer.py) gives gRPC a port on 127.0.0.1 instead: each
connection accepted there is joined (peer/transport/splice.py) to one the dialer opens the way the
address says, so gRPC's own reconnect after a relay died goes through the dialer again, which then
takes the next relay. TLS still runs end to end inside (channels.py names the site to check).

The listeners and their splices run in one thread with its own event loop, shared by asyncio and
blocking channels (command-line tools) alike; a port is opened on first use of an address.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Callable

from peer.transport.splice import splice

log = logging.getLogger("sitemesh.forwarder")

_CLOSE_S = 5.0
"""How long closing waits for the forwarder's connections to be dropped and its thread to end."""


class Forwarder:
    """One loopback listener per address, joined to `open(address)`'s connections."""

    def __init__(self, open_: Callable[[str], socket.socket]) -> None:
        self._open = open_
        self._ports: dict[str, int] = {}
        self._servers: list[asyncio.AbstractServer] = []
        self._lock = threading.Lock()
        """Guards `_ports` and the thread's start: gRPC's loop and tools' threads ask at once."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._failing: set[str] = set()
        """Addresses whose last dial failed: logged once until one works again."""

    def port(self, address: str) -> int:
        """The loopback port standing for `address` (opened on first use)."""
        with self._lock:
            if address in self._ports:
                return self._ports[address]
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._run, args=(self._loop,), name="sitemesh-forwarder",
                                                daemon=True)
                self._thread.start()
            port = asyncio.run_coroutine_threadsafe(self._listen(address), self._loop).result()
            self._ports[address] = port
            return port

    def close(self) -> None:
        """Closes the listeners and the connections through them, and stops the thread."""
        with self._lock:
            loop, self._loop = self._loop, None
            self._ports.clear()
        if loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=_CLOSE_S)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(_CLOSE_S)

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop) -> None:
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _shutdown(self) -> None:
        for server in self._servers:
            server.close()
        self._servers.clear()
        splices = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in splices:
            task.cancel()
        await asyncio.gather(*splices, return_exceptions=True)

    async def _listen(self, address: str) -> int:
        server = await asyncio.start_server(lambda r, w: self._join(address, r, w), "127.0.0.1", 0)
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def _join(self, address: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            sock = await asyncio.get_running_loop().run_in_executor(None, self._open, address)
        except OSError as err:
            if address not in self._failing:
                log.warning("cannot reach %s: %s", address, err)
            self._failing.add(address)
            writer.transport.abort()  # gRPC sees the connection fail and backs off before the next
            return
        if address in self._failing:
            self._failing.discard(address)
            log.info("reaching %s again", address)
        try:
            far = await asyncio.open_connection(sock=sock)
        except OSError:
            sock.close()
            writer.transport.abort()
            return
        await splice((reader, writer), far)
