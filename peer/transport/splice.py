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
    """Copies a→b and b→a until both directions ended (or one broke), then closes both ends.
    `count(n)` is told every n bytes forwarded, either way."""
    for _, writer in (a, b):
        writer.transport.set_write_buffer_limits(high=BUFFER_BYTES)
    try:
        ends = (a[1], b[1])
        await asyncio.gather(_pump(a[0], b[1], count, ends), _pump(b[0], a[1], count, ends))
    finally:
        for _, writer in (a, b):
            writer.close()
        for _, writer in (a, b):
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()
