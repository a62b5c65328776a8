"""Chunks over gRPC: the peer's FetchChunks stream, a chunk source (sources.py).

Each message is read on the event loop (chunkwire parses it without a copy) and verified, then
sunk, in a thread of this stream's own. A stream that stalls makes the peer reconnect: the TCP
connection under the channel may be wedged, and a retry on it would stall too.

    .venv/bin/python -m pytest tests/integration/test_exchange_transfer.py -q
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from typing import Protocol

import grpc

from peer.exchange import codec
from peer.exchange.sources import FATAL, Attempt, FetchError, Retry, closed_under_us


class FetchChunksPeer(Protocol):
    """What a GrpcSource needs of the peer (client.ExchangeClient)."""

    address: str

    def stream(self, manifest: codec.Manifest, first: int, end: int, timeout_s: float) -> grpc.aio.UnaryStreamCall:
        """FetchChunks for chunks [first, end) of `manifest`."""
        ...

    async def reconnect(self) -> None:
        """Moves the peer's channel to a new TCP connection."""
        ...


class GrpcSource:
    def __init__(self, peer: FetchChunksPeer) -> None:
        self._peer = peer

    async def read(self, attempt: Attempt) -> None:
        manifest, end = attempt.manifest, attempt.end
        call = self._peer.stream(manifest, attempt.next, end, max(attempt.timeout_s, 0.001))
        # Verified (and sunk, for an InThread sink) in a thread of this stream's own, as the bulk plane
        # does: an InThread sink may wait for other streams (the reducer takes chunks in lockstep), and
        # in the shared executor all its few threads could be waiting while the chunk they wait for
        # queues behind them.
        thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"grpc-fetch-{manifest.key}")
        loop = asyncio.get_running_loop()
        sinking: asyncio.Future[None] | None = None
        try:
            while attempt.next < end:
                due = attempt.next
                try:
                    msg = await asyncio.wait_for(call.read(), attempt.stall_s)
                except asyncio.TimeoutError:
                    # A dead NAT entry or a stopped process wedges the connection: open a new one.
                    await self._peer.reconnect()
                    raise Retry("stalls", f"stalled: no chunk for {attempt.stall_s} s at chunk {due}") from None
                except asyncio.CancelledError:
                    if not closed_under_us():
                        raise
                    raise Retry("transport_errors", "channel closed (reconnect after another stream's stall)") from None
                except grpc.aio.AioRpcError as err:
                    if err.code() in FATAL:
                        raise FetchError(
                            f"{manifest.key} from {self._peer.address}: {err.code().name}: {err.details()}",
                            manifest.key) from err
                    raise Retry("transport_errors", f"{err.code().name}: {err.details()}") from None
                if msg is grpc.aio.EOF:
                    raise Retry("truncated_streams", f"stream ended at chunk {due}, expected up to {end}")
                if msg.index != due:
                    raise Retry("misplaced_chunks", f"got chunk {msg.index} when chunk {due} was due (duplicate or reordered)")
                try:
                    sinking = loop.run_in_executor(thread, attempt.verified, msg.index, msg.data)
                    await asyncio.shield(sinking)
                except codec.ChunkError as err:
                    raise Retry("corrupt_chunks", str(err)) from None
                if not attempt.in_thread:
                    await attempt.deliver(msg.index, msg.data)
        except asyncio.CancelledError:
            # As on the bulk plane, the fetch is over when its thread is out of the sink (which may
            # still write the destination): short, since a waiting sink's owner wakes it (_all's stop).
            while sinking is not None and not sinking.done():
                with contextlib.suppress(BaseException):
                    await asyncio.shield(sinking)
            raise
        finally:
            call.cancel()
            thread.shutdown(wait=False)
