"""Chunk sources: the transports a fetch reads chunks over, behind one interface.

`client.fetch_chunks` is the one retry loop. Each attempt it asks the peer in turn for a source
(the peer's plane choice, planes.PlaneChoice) and has it read chunks [attempt.next, attempt.end) of
one object. A source checks every chunk against the manifest (index, length, blake3) before the
sink sees it, hands it over through the `Attempt` (the sink side, written once for every source),
and ends in one of three ways: the range is done; `Retry` names the fault and the FetchStats
counter it counts in (the next attempt resumes at the first chunk not yet delivered); `FetchError`
says retrying cannot help. Sources: grpc_source.GrpcSource (FetchChunks), bulk_source.BulkSource
(the bulk TCP data plane); a relayed tunnel would be a third.

    .venv/bin/python -m pytest tests/integration/test_exchange_transfer.py -q
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import grpc

from peer.exchange import codec
from peer.exchange.buffers import ChunkBuffers

# Statuses that say our own request is wrong: retrying cannot help.
FATAL = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.UNIMPLEMENTED}


@dataclass(frozen=True)
class InThread:
    """A sink run in the thread of the stream that verified the chunk (each stream has one, on either
    plane) instead of on the event loop: for work that needs no loop, such as decoding into a
    destination or the reducer's lockstep (it may block until other streams deliver). Saves the
    thread hops of each chunk. The data is valid only during the call: the bulk plane receives the
    next chunk into the same buffer. A cancelled fetch ends once its thread is out of the sink, so
    a sink that waits for other streams must be woken by its owner then (Reducer.stop)."""

    fn: Callable[[int, memoryview], None]
    into: Callable[[int], Sequence[memoryview] | None] | None = None
    """Where chunk k's bytes belong, if they can go there as they are (decoding.chunk_targets: the
    destination's own memory). The bulk plane receives such a chunk straight into it and hands
    it to `placed` instead of `fn`: no receive buffer and no copy. Over gRPC every chunk goes to `fn`."""
    placed: Callable[[int, Sequence[memoryview]], None] | None = None


# Receives each verified chunk (index, data) in increasing index order.
ChunkSink = Callable[[int, memoryview], Awaitable[None]] | InThread


@dataclass
class FetchStats:
    """What happened during fetches; each counter is a fault that was detected and survived."""

    chunks: int = 0
    bytes: int = 0
    corrupt_chunks: int = 0
    misplaced_chunks: int = 0
    truncated_streams: int = 0
    stalls: int = 0
    transport_errors: int = 0
    attempts: int = 0

    def add(self, other: FetchStats) -> None:
        for name in vars(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def count(self, counter: Fault) -> None:
        """One more fault of the kind `counter` names (a field)."""
        setattr(self, counter, getattr(self, counter) + 1)


class FetchError(RuntimeError):
    """A fetch that gave up; the message names the object, the chunk reached and the last fault."""

    def __init__(self, message: str, key: codec.ObjectKey | None = None) -> None:
        super().__init__(message)
        self.key = key
        """The object that could not be fetched, where one can be named (a round's mean blames its
        publisher: round_exchange.RoundExchange.mean)."""


def unanswerable(err: grpc.aio.AioRpcError) -> bool:
    """Whether no wait or retry at this peer brings the object: nothing listens at its address any
    more (its process is gone, and with it every object it published: an exchange store lives in
    memory), or it said the request can never be answered (FATAL: e.g. a global state it has
    superseded with a newer one)."""
    return err.code() in FATAL or (err.code() == grpc.StatusCode.UNAVAILABLE
                                   and "Connection refused" in (err.details() or ""))


Fault = Literal["corrupt_chunks", "misplaced_chunks", "truncated_streams", "stalls", "transport_errors"]
"""The kinds of fault an attempt ends with: the FetchStats fields that count them."""


class Retry(Exception):
    """One attempt failed in a way another attempt (same or next source) may fix; `counter`: the
    FetchStats field that counts the fault."""

    def __init__(self, counter: Fault, fault: str) -> None:
        super().__init__(fault)
        self.counter = counter


def closed_under_us() -> bool:
    """True when a CancelledError came from our channel being closed, not from cancelling this task.

    Python 3.10 cannot tell the two apart (no Task.cancelling): it treats both as a cancellation.
    """
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    return cancelling is not None and cancelling() == 0


class Attempt:
    """One attempt on one source: chunks [next, end) of `manifest`, each handed to the sink once,
    in order, after it was verified. Every source delivers through these methods, so the sink's
    threading, the stop on cancellation and the count of what moved are the same on every plane.

    `next` and the counts are written by whichever thread delivers (the source's own, or the loop
    for a coroutine sink); the loop reads them once the source's thread is out of the sink."""

    def __init__(self, manifest: codec.Manifest, sink: ChunkSink, first: int, end: int, *, timeout_s: float,
                 stall_s: float, buffers: ChunkBuffers | None = None) -> None:
        self.manifest, self.sink, self.end = manifest, sink, end
        self.next = first
        """First chunk not yet delivered to the sink: where the next attempt resumes."""
        self.timeout_s = timeout_s
        """The whole attempt (the fetch's deadline, less what earlier attempts took)."""
        self.stall_s = stall_s
        """A source that delivers no chunk for this long is abandoned (a stalled or dead sender)."""
        self.buffers = buffers
        """The pool the bulk plane receives into (bulk.receive); None: fresh memory."""
        self.stopped = threading.Event()
        """Set when the attempt is cancelled: nothing more reaches the sink."""
        self.chunks = 0
        self.bytes = 0
        self._delivering: set[asyncio.Task[object]] = set()

    @property
    def in_thread(self) -> bool:
        return isinstance(self.sink, InThread)

    def verified(self, index: int, data: memoryview) -> None:
        """Verifies chunk `index` (ChunkError) and, for an InThread sink, hands it over: in the
        source's thread, where blake3 releases the GIL and overlaps with the event loop's I/O."""
        codec.verify_chunk(self.manifest, index, data)
        if isinstance(self.sink, InThread):
            self.deliver_here(index, data)

    def deliver_here(self, index: int, data: memoryview) -> None:
        """A verified chunk to an InThread sink, in the calling thread."""
        assert isinstance(self.sink, InThread)
        if self.stopped.is_set():
            return
        self.sink.fn(index, data)
        self._advanced(index, len(data))

    def placed(self, index: int, targets: Sequence[memoryview]) -> None:
        """A verified chunk received straight into the sink's own memory (InThread.into)."""
        assert isinstance(self.sink, InThread) and self.sink.placed is not None
        if self.stopped.is_set():
            return
        self.sink.placed(index, targets)
        self._advanced(index, sum(len(t) for t in targets))

    async def deliver(self, index: int, data: memoryview) -> None:
        """A verified chunk to a coroutine sink, on the loop; `stop` cancels it."""
        if self.stopped.is_set():  # scheduled before the attempt was cancelled, started after
            return
        task = asyncio.current_task()
        assert task is not None and not isinstance(self.sink, InThread)
        self._delivering.add(task)
        try:
            await self.sink(index, data)
        finally:
            self._delivering.discard(task)
        self._advanced(index, len(data))

    def stop(self) -> None:
        """Nothing more reaches the sink; a coroutine sink under way is cancelled."""
        self.stopped.set()
        for task in self._delivering:
            task.cancel()

    def _advanced(self, index: int, nbytes: int) -> None:
        self.chunks += 1
        self.bytes += nbytes
        self.next = index + 1


class ChunkSource(Protocol):
    """One transport to one peer, for one attempt."""

    async def read(self, attempt: Attempt) -> None:
        """Delivers verified chunks [attempt.next, attempt.end) through `attempt`, advancing it;
        raises Retry with the fault, or FetchError where retrying cannot help. Cancelled, it
        returns once no thread of it is inside the sink."""
        ...
