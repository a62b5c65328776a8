"""Two byte streams joined: what one end sends the other receives, unread and unchanged.

The relay (peer/transport/relay_server.py), an outbound site's tunnel agent (tunnel.py) and the
local forwarder of gRPC channels (forwarder.py) all join a connection they accepted or dialled to
another this way. Nothing is decoded: the bytes are TLS between two sites. Each direction holds at
most `BUFFER_BYTES` the receiver has not taken (the writer's high-water mark; reading stops until
it drains), so a slow receiver bounds what a splice holds instead of growing it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

BUFFER_BYTES = 256 * 1024
"""Per direction: a few TCP windows' worth at 200 Mbit/s and 100 ms is in flight in the sockets'
own buffers; this is what the process itself holds."""
READ_BYTES = 64 * 1024
HALF_CLOSED_S = 30.0
"""After one direction ended, how long the other may still carry bytes. A TLS close_notify comes
back within a round trip; a side that never closes (a client that CONNECTed, was refused by the
site's server and went silent) must not hold the connection, and a relay's slot, for ever."""


async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, count: Callable[[int], None],
                ends: tuple[asyncio.StreamWriter, ...]) -> None:
    try:
        while data := await src.read(READ_BYTES):
            dst.write(data)
            count(len(data))
            await dst.drain()
        if dst.can_write_eof():
            dst.write_eof()  # a half-close passes through: TLS's close_notify, then the other side's
    except (ConnectionError, OSError):
        for end in ends:  # one side broke: the other direction would wait on it forever
            end.transport.abort()


async def splice(a: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 b: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 count: Callable[[int], None] = lambda n: None) -> None:
    """Copies a→b and b→a until both directions ended (or one broke, or the other did not end
    within `HALF_CLOSED_S` of the first), then closes both ends. `count(n)` is told every n bytes
    forwarded, either way."""
    for _, writer in (a, b):
        writer.transport.set_write_buffer_limits(high=BUFFER_BYTES)
    ends = (a[1], b[1])
    pumps = [asyncio.ensure_future(_pump(a[0], b[1], count, ends)),
             asyncio.ensure_future(_pump(b[0], a[1], count, ends))]
    try:
        _, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        if pending:  # one direction ended: the other has HALF_CLOSED_S to end too
            _, pending = await asyncio.wait(pending, timeout=HALF_CLOSED_S)
        if pending:  # it did not: what it waits on (a silent reader, a receiver that reads nothing) is cut
            for end in ends:
                end.transport.abort()
    finally:
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        for _, writer in (a, b):
            writer.close()
        for _, writer in (a, b):
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()
