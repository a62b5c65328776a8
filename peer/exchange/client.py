"""Fetching exchange objects from peers: resume after drops, re-fetch corrupt chunks, give up cleanly.

`fetch_chunks` pulls a chunk range of one object from one or more peers that hold it. Every chunk is
checked against the manifest (index, length, blake3) before the sink sees it; a stream that breaks,
stalls, ends early or sends a bad or misplaced chunk is abandoned and re-opened from the first chunk
not yet held, on the next source in turn, with exponential backoff (tenacity). It gives up with
FetchError after `FetchPolicy.max_failures` consecutive failures without progress or after the
deadline. Each stream waits only on its own peer and its own sink: a stalled sender blocks no
other stream, except through a sink that waits for other streams by design (the reducer's lockstep).

    .venv/bin/python -m pytest tests/integration/test_exchange_transfer.py -q
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import grpc
import torch
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential, wait_random

from peer.exchange import bulk, chunkwire, codec, protoconv
from peer.exchange.buffers import ChunkBuffers
from peer.exchange.planes import DEFAULT_PLANE, PLANES
from peer.exchange.service import SERVICE
from peer.exchange.store import MeanInputs
from peer.gen.sitemesh.v1 import exchange_pb2, exchange_pb2_grpc
from peer.transport import channels

log = logging.getLogger("sitemesh.exchange")

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
    """Where chunk k's bytes belong, if they can go there as they are (codec.chunk_targets: the
    destination's own memory). The bulk plane receives such a chunk straight into it and hands
    it to `placed` instead of `fn`: no receive buffer and no copy. Over gRPC every chunk goes to `fn`."""
    placed: Callable[[int, Sequence[memoryview]], None] | None = None


# Receives each verified chunk (index, data) in increasing index order.
ChunkSink = Callable[[int, memoryview], Awaitable[None]] | InThread

# Statuses that say our own request is wrong: retrying cannot help.
_FATAL = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.UNIMPLEMENTED}


@dataclass(frozen=True)
class FetchPolicy:
    stall_s: float = 20.0
    """A stream that delivers no chunk for this long is abandoned (a stalled or dead sender)."""
    max_failures: int = 8
    """Consecutive failed attempts without a single new chunk before giving up."""
    deadline_s: float = 900.0
    """Whole fetch, all retries included; the round deadline bounds it from above."""
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 5.0

    def __post_init__(self) -> None:
        if min(self.stall_s, self.deadline_s, self.backoff_initial_s) <= 0 or self.max_failures < 1:
            raise ValueError(f"invalid fetch policy {self}")

    @classmethod
    def wan(cls) -> FetchPolicy:
        """Cross-site links: a 1 MiB chunk takes ~0.1 s at 100 Mbit/s; 20 s of silence is a dead link."""
        return cls()

    @classmethod
    def local_test(cls) -> FetchPolicy:
        """Loopback tests: faults must be detected in well under a second, retries start at once."""
        return cls(stall_s=0.5, max_failures=4, deadline_s=30.0, backoff_initial_s=0.01, backoff_max_s=0.1)


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


class FetchError(RuntimeError):
    """A fetch that gave up; the message names the object, the chunk reached and the last fault."""


class _Retry(Exception):
    """One attempt failed in a way another attempt (same or next source) may fix."""


BULK_MISSES = 2
"""Bulk connections in a row that fail before their first frame, after which a client fetches over
FetchChunks: one can be a passing fault, two say the port cannot be reached from here (a firewall,
NAT, a listener of another address family) while gRPC, which gave the ticket, can."""


class ExchangeClient:
    """The Exchange service of one peer.

    `plane`: "bulk" fetches chunk ranges over the peer's bulk data plane (peer/exchange/bulk.py)
    when it offers one (OpenBulk), else over FetchChunks, saying so once in the log; "grpc" always
    over FetchChunks. `bulk_address` (host:port) dials the bulk plane there instead of the host of
    `address` and the ticket's port (a fault proxy or delay line in front of it).
    """

    def __init__(self, address: str, creds: channels.Credentials = channels.PLAINTEXT, plane: str = DEFAULT_PLANE,
                 bulk_address: str | None = None) -> None:
        if plane not in PLANES:
            raise ValueError(f"exchange plane {plane!r}: choose one of {', '.join(PLANES)}")
        self.address = address
        self._creds = creds
        self.plane = plane
        self._bulk_address = bulk_address
        self._bulk_tls: ssl.SSLContext | None = None
        self._bulk_misses = 0  # bulk connections in a row that failed before their first frame
        self._spare: tuple[float, asyncio.Future[exchange_pb2.BulkTicket]] | None = None
        """A ticket asked for ahead (prefetch_ticket): when it was asked for, and the call."""
        self._connect()

    def _connect(self) -> None:
        self._channel = channels.open_channel(self.address, self._creds)
        self._stub = exchange_pb2_grpc.ExchangeStub(self._channel)
        # FetchChunks with chunkwire's zero-copy parser instead of the generated Chunk.FromString.
        self._fetch_chunks = self._channel.unary_stream(
            f"/{SERVICE}/FetchChunks",
            request_serializer=exchange_pb2.FetchRequest.SerializeToString,
            response_deserializer=chunkwire.parse,
        )

    async def close(self) -> None:
        self._drop_spare()
        await self._channel.close()

    async def reconnect(self) -> None:
        """Moves to a new TCP connection after a stall.

        gRPC shares connections between channels to the same address, so only closing the old
        channel drops the wedged connection. Closing cancels other streams still on it; they see
        asyncio.CancelledError, which `_one_stream` turns into a retry (see `_closed_under_us`).
        """
        old = self._channel
        self._drop_spare()
        self._connect()
        await old.close()

    async def announce(self, manifest: codec.Manifest, timeout_s: float = 10.0) -> None:
        await self._stub.Announce(protoconv.manifest_to_proto(manifest), timeout=timeout_s)

    async def get_manifest(
        self, key: codec.ObjectKey, wait_s: float = 0.0, inputs: MeanInputs = ()
    ) -> codec.Manifest | None:
        """The peer's manifest for `key` (validated), waiting up to `wait_s` for it; None if it has none.
        `inputs`: for a mean shard, the contributors it must average (see ManifestRequest)."""
        request = exchange_pb2.ManifestRequest(
            key=protoconv.key_to_proto(key),
            wait_ms=int(wait_s * 1000),
            contributors=[exchange_pb2.MeanInput(site=s, address=a, root_hash=r) for s, a, r in inputs],
        )
        try:
            reply = await self._stub.GetManifest(request, timeout=wait_s + 10.0)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise
        manifest = protoconv.manifest_from_proto(reply)
        if manifest.key != key:
            raise codec.ManifestError(f"{self.address} answered {manifest.key} when asked for {key}")
        return manifest

    def bulk_reached(self, reached: bool, fault: str = "") -> None:
        """The outcome of one bulk connection: `reached` if its first frame arrived. BULK_MISSES
        misses in a row and this client fetches over FetchChunks from now on, saying so once."""
        self._bulk_misses = 0 if reached else self._bulk_misses + 1
        if self._bulk_misses >= BULK_MISSES and self.plane == "bulk":
            log.warning("%s: its bulk data plane cannot be reached from here (%d connections in a row failed "
                        "before their first frame; last: %s); fetching from it over gRPC FetchChunks",
                        self.address, self._bulk_misses, fault)
            self.plane = "grpc"

    def prefetch_ticket(self) -> None:
        """Asks for a bulk ticket now, for the next `bulk_target`: a fetch that follows a manifest
        then starts without OpenBulk's round trip (one RTT per exchange phase on a WAN link:
        docs/decisions/exchange-ticket-prefetch.md). At most one is held; one never used expires
        at the peer after its ttl, as any unused ticket does."""
        if self.plane == "bulk" and self._spare is None:
            call = self._stub.OpenBulk(exchange_pb2.BulkRequest(), timeout=10.0)
            spare = asyncio.ensure_future(call)
            spare.add_done_callback(lambda f: f.cancelled() or f.exception())  # one never awaited failed
            self._spare = (time.monotonic(), spare)

    def _drop_spare(self) -> None:
        if self._spare is not None:
            self._spare[1].cancel()
            self._spare = None

    async def _ticket(self, timeout_s: float) -> exchange_pb2.BulkTicket:
        spare, self._spare = self._spare, None
        if spare is not None and not spare[1].cancelled():
            asked, call = spare
            ticket = await call
            # Good for ttl from when the peer issued it; half of it from when it was asked for
            # leaves the connect and a clock slip ample room.
            if time.monotonic() < asked + ticket.ttl_ms / 2000:
                return ticket
        return await self._stub.OpenBulk(exchange_pb2.BulkRequest(), timeout=timeout_s)

    async def bulk_target(self, timeout_s: float = 10.0) -> bulk.BulkTarget | None:
        """A ticket for one bulk connection (the one `prefetch_ticket` asked for, while fresh), or
        None where the plane is off or the peer has none (then this client fetches over
        FetchChunks from now on, and says so once)."""
        if self.plane != "bulk":
            return None
        try:
            ticket = await self._ticket(timeout_s)
        except grpc.aio.AioRpcError as err:
            if err.code() not in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.FAILED_PRECONDITION):
                raise
            log.info("%s offers no bulk data plane (%s: %s); fetching from it over gRPC FetchChunks",
                     self.address, err.code().name, err.details())
            self.plane = "grpc"
            return None
        host = self.address.rsplit(":", 1)[0].strip("[]")
        port = ticket.port
        if self._bulk_address is not None:
            host, port_text = self._bulk_address.rsplit(":", 1)
            port = int(port_text)
        tls = None
        if ticket.tls:
            if self._creds.plaintext:
                raise FetchError(f"{self.address} serves its bulk plane over TLS but this peer has no certificates")
            if self._bulk_tls is None:
                self._bulk_tls = bulk.client_tls(self._creds)
            tls = self._bulk_tls
        return bulk.BulkTarget(host, port, ticket.token, tls, self.address.rsplit(":", 1)[0].strip("[]"))

    def stream(self, manifest: codec.Manifest, first: int, end: int, timeout_s: float) -> grpc.aio.UnaryStreamCall:
        request = exchange_pb2.FetchRequest(
            key=protoconv.key_to_proto(manifest.key), root_hash=manifest.root_hash, first_chunk=first, end_chunk=end
        )
        return self._fetch_chunks(request, timeout=timeout_s)


async def fetch_chunks(
    manifest: codec.Manifest,
    sources: Sequence[ExchangeClient],
    sink: ChunkSink,
    *,
    first: int = 0,
    end: int | None = None,
    policy: FetchPolicy = FetchPolicy(),
    stats: FetchStats | None = None,
    buffers: ChunkBuffers | None = None,
) -> FetchStats:
    """Delivers verified chunks [first, end) of `manifest` to `sink`, in order, each exactly once.
    `buffers`: the pool the bulk plane receives into (bulk.receive): one buffer per connection for
    an InThread sink, one per chunk for a coroutine sink, which gives it back when done with it;
    over gRPC the sink gets the message's bytes."""
    end = manifest.num_chunks if end is None else end
    if not sources:
        raise FetchError(f"{manifest.key}: no source to fetch from")
    stats = stats if stats is not None else FetchStats()
    progress = _Progress(next=first, at_last_failure=first)
    started = time.monotonic()

    def give_up(retry_state: RetryCallState) -> bool:
        # Consecutive failures count only while no new chunk arrives: a flaky link that drops every
        # few megabytes still finishes a gigabyte, a dead one is abandoned after max_failures tries.
        if progress.next != progress.at_last_failure:
            progress.at_last_failure, progress.failures = progress.next, 0
        progress.failures += 1
        return progress.failures >= policy.max_failures or time.monotonic() - started >= policy.deadline_s

    retrying = AsyncRetrying(
        retry=retry_if_exception_type(_Retry),
        stop=give_up,
        # Jitter keeps receivers that lost the same sender from reconnecting in lockstep.
        wait=wait_exponential(multiplier=policy.backoff_initial_s, max=policy.backoff_max_s)
        + wait_random(0, policy.backoff_initial_s),
        reraise=True,
    )
    try:
        async for attempt in retrying:
            with attempt:
                source = sources[(attempt.retry_state.attempt_number - 1) % len(sources)]
                remaining = policy.deadline_s - (time.monotonic() - started)
                stats.attempts += 1
                try:
                    await _one_stream(manifest, source, sink, progress, end, remaining, policy, stats, buffers)
                except _Retry as err:
                    progress.last_fault = f"{source.address}: {err}"
                    raise
    except _Retry:
        raise FetchError(
            f"{manifest.key}: gave up at chunk {progress.next} of [{first}, {end}) after "
            f"{progress.failures} failed attempts without progress; last: {progress.last_fault}"
        ) from None
    return stats


@dataclass
class _Progress:
    next: int
    """First chunk not yet delivered to the sink: where the next attempt resumes."""
    at_last_failure: int
    failures: int = 0
    last_fault: str = "none"


async def _one_stream(
    manifest: codec.Manifest,
    source: ExchangeClient,
    sink: ChunkSink,
    progress: _Progress,
    end: int,
    timeout_s: float,
    policy: FetchPolicy,
    stats: FetchStats,
    buffers: ChunkBuffers | None = None,
) -> None:
    """Reads one stream from `progress.next` up to `end`, advancing it; raises _Retry with the fault."""
    if progress.next >= end:
        return
    if source.plane == "bulk":
        try:
            target = await source.bulk_target(min(10.0, max(timeout_s, 0.001)))
        except grpc.aio.AioRpcError as err:
            stats.transport_errors += 1
            raise _Retry(f"OpenBulk: {err.code().name}: {err.details()}") from None
        if target is not None:
            await _one_bulk_stream(manifest, target, source, sink, progress, end, timeout_s, policy, stats, buffers)
            return
    call = source.stream(manifest, progress.next, end, max(timeout_s, 0.001))
    # Verified (and sunk, for an InThread sink) in a thread of this stream's own, as the bulk plane
    # does: an InThread sink may wait for other streams (the reducer takes chunks in lockstep), and
    # in the shared executor all its few threads could be waiting while the chunk they wait for
    # queues behind them.
    thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"grpc-fetch-{manifest.key}")
    loop = asyncio.get_running_loop()
    sinking: asyncio.Future[None] | None = None
    try:
        while progress.next < end:
            due = progress.next
            try:
                msg = await asyncio.wait_for(call.read(), policy.stall_s)
            except asyncio.TimeoutError:
                stats.stalls += 1
                # The TCP connection under the channel may be wedged (dead NAT entry, stopped
                # process): a retry on the same connection would stall too, so open a new one.
                await source.reconnect()
                raise _Retry(f"stalled: no chunk for {policy.stall_s} s at chunk {due}") from None
            except asyncio.CancelledError:
                if not _closed_under_us():
                    raise
                stats.transport_errors += 1
                raise _Retry("channel closed (reconnect after another stream's stall)") from None
            except grpc.aio.AioRpcError as err:
                if err.code() in _FATAL:
                    raise FetchError(
                        f"{manifest.key} from {source.address}: {err.code().name}: {err.details()}") from err
                stats.transport_errors += 1
                raise _Retry(f"{err.code().name}: {err.details()}") from None
            if msg is grpc.aio.EOF:
                stats.truncated_streams += 1
                raise _Retry(f"stream ended at chunk {due}, expected up to {end}")
            if msg.index != due:
                stats.misplaced_chunks += 1
                raise _Retry(f"got chunk {msg.index} when chunk {due} was due (duplicate or reordered)")
            try:
                # blake3 releases the GIL: hashing in a thread overlaps with the event loop's I/O.
                sinking = loop.run_in_executor(thread, _verified, manifest, msg.index, msg.data, sink)
                await asyncio.shield(sinking)
            except codec.ChunkError as err:
                stats.corrupt_chunks += 1
                raise _Retry(str(err)) from None
            if not isinstance(sink, InThread):
                await sink(msg.index, msg.data)
            stats.chunks += 1
            stats.bytes += len(msg.data)
            progress.next = due + 1
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


def _verified(manifest: codec.Manifest, index: int, data: memoryview, sink: ChunkSink) -> None:
    codec.verify_chunk(manifest, index, data)
    if isinstance(sink, InThread):
        sink.fn(index, data)


# How a failed bulk stream is counted; the first match wins (Truncated, Misplaced, socket.timeout
# and ssl.SSLError are OSErrors too).
_BULK_FAULTS: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], str], ...] = (
    (socket.timeout, "stalls"),
    (bulk.Truncated, "truncated_streams"),
    (bulk.Misplaced, "misplaced_chunks"),
    (codec.ChunkError, "corrupt_chunks"),
    ((OSError, concurrent.futures.CancelledError), "transport_errors"),
)
_BULK_RETRIED = (OSError, codec.ChunkError, concurrent.futures.CancelledError)


async def _one_bulk_stream(
    manifest: codec.Manifest,
    target: bulk.BulkTarget,
    source: ExchangeClient,
    sink: ChunkSink,
    progress: _Progress,
    end: int,
    timeout_s: float,
    policy: FetchPolicy,
    stats: FetchStats,
    buffers: ChunkBuffers | None = None,
) -> None:
    """_one_stream over the bulk plane: one connection, received and verified in its own thread
    (not the default executor: an InThread sink may wait there for other streams, the reducer's lockstep).
    Each chunk must arrive within policy.stall_s and the whole attempt within `timeout_s`."""
    loop = asyncio.get_running_loop()
    request = exchange_pb2.FetchRequest(key=protoconv.key_to_proto(manifest.key), root_hash=manifest.root_hash,
                                        first_chunk=progress.next, end_chunk=end)
    deadline = time.monotonic() + max(timeout_s, 0.001)
    done: asyncio.Future[None] = loop.create_future()
    stopped = threading.Event()
    reached = threading.Event()  # the first frame arrived: the plane can be reached from here
    held: list[socket.socket] = []
    delivering: set[asyncio.Task[object]] = set()
    moved = [0, 0]  # chunks, bytes: counted where delivered, added to `stats` on the loop at the end

    def advanced(index: int, nbytes: int) -> None:
        moved[0] += 1
        moved[1] += nbytes
        progress.next = index + 1

    async def deliver(index: int, data: memoryview) -> None:
        if stopped.is_set():  # scheduled before the attempt was cancelled, started after
            return
        task = asyncio.current_task()
        assert task is not None
        delivering.add(task)
        try:
            assert not isinstance(sink, InThread)
            await sink(index, data)
        finally:
            delivering.discard(task)
        advanced(index, len(data))

    def in_thread(index: int, data: memoryview) -> None:
        # The loop reads progress and `moved` only once this thread is done.
        assert isinstance(sink, InThread)
        if stopped.is_set():
            return
        sink.fn(index, data)
        advanced(index, len(data))

    def placed(index: int, targets: Sequence[memoryview]) -> None:
        assert isinstance(sink, InThread) and sink.placed is not None
        if stopped.is_set():
            return
        sink.placed(index, targets)
        advanced(index, sum(len(t) for t in targets))

    def settle(err: BaseException | None) -> None:
        if not done.done():
            done.set_result(None) if err is None else done.set_exception(err)

    def run() -> None:
        err: BaseException | None = None
        try:
            sock = bulk.connect(target, request, min(policy.stall_s, max(deadline - time.monotonic(), 0.001)))
            held.append(sock)
            if stopped.is_set():
                return
            bulk.receive(sock, manifest, progress.next, end, loop,
                         in_thread if isinstance(sink, InThread) else deliver, stopped,
                         stall_s=policy.stall_s, deadline=deadline, reached=reached, buffers=buffers,
                         into=sink.into if isinstance(sink, InThread) and sink.placed is not None else None,
                         placed=placed)
        except BaseException as caught:  # noqa: BLE001 - handed to the loop, raised there
            err = caught
        finally:
            for sock in held:
                sock.close()
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
            loop.call_soon_threadsafe(settle, err)

    # Cancelled, nobody reads what the thread ended with (the sink's own CancelledError, a refused
    # connect): mark it read, or the collector logs it as "Future exception was never retrieved".
    done.add_done_callback(lambda f: f.cancelled() or f.exception())
    threading.Thread(target=run, name=f"bulk-fetch-{manifest.key}", daemon=True).start()
    due = progress.next
    try:
        await asyncio.shield(done)  # a cancellation must leave `done` to the thread, awaited below
        source.bulk_reached(True)
    except asyncio.CancelledError:
        stopped.set()
        for task in delivering:  # the thread waits for it; cancelled, it ends the thread too
            task.cancel()
        for sock in held:  # wakes the thread's recv; it exits without delivering more
            bulk.shutdown(sock)
        # The thread may be inside the sink still: the fetch is over when it is, however often it is
        # cancelled meanwhile (a stopping node cancels again). Bounded: its socket is shut and the
        # sink's task cancelled, so the thread ends within one sink call, provided a sink that waits
        # for other streams is woken by its owner (the reducer's stop, called by allreduce._all).
        while held and not done.done():
            with contextlib.suppress(BaseException):
                await asyncio.shield(done)
        raise
    except bulk.ErrorFrame as err:
        source.bulk_reached(True)
        if err.code in _FATAL:
            raise FetchError(f"{manifest.key} from {source.address} (bulk): {err}") from err
        stats.transport_errors += 1
        raise _Retry(f"bulk {err}") from None
    except _BULK_RETRIED as err:
        counter = next(name for kinds, name in _BULK_FAULTS if isinstance(err, kinds))
        setattr(stats, counter, getattr(stats, counter) + 1)
        if isinstance(err, socket.timeout):
            fault = (f"bulk: chunk {progress.next} not in within {policy.stall_s} s"
                     if time.monotonic() < deadline else f"bulk: the fetch deadline passed at chunk {progress.next}")
        else:
            fault = f"bulk connection from chunk {due}: {type(err).__name__}: {err}"
        source.bulk_reached(reached.is_set(), fault)
        raise _Retry(fault) from None
    finally:
        stats.chunks += moved[0]
        stats.bytes += moved[1]


def _closed_under_us() -> bool:
    """True when a CancelledError came from our channel being closed, not from cancelling this task.

    Python 3.10 cannot tell the two apart (no Task.cancelling): it treats both as a cancellation.
    """
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    return cancelling is not None and cancelling() == 0


async def fetch_manifest(
    key: codec.ObjectKey,
    sources: Sequence[ExchangeClient],
    wait_s: float,
    policy: FetchPolicy = FetchPolicy(),
    inputs: MeanInputs = (),
) -> codec.Manifest:
    """The manifest of `key` from the first source that has it, long-polling each up to `wait_s`.
    Gives up early when every source has failed (not merely not published yet) for `policy.stall_s`:
    those peers are gone, not still training. `inputs`: see ExchangeClient.get_manifest."""
    errors: deque[str] = deque(maxlen=len(sources))  # the last answer of each source
    deadline = time.monotonic() + min(wait_s, policy.deadline_s)
    failing_since: float | None = None
    sources[0].prefetch_ticket()  # a fetch of the object's chunks follows, from the first source
    while True:
        failed = 0
        for source in sources:
            try:
                manifest = await source.get_manifest(key, max(0.0, deadline - time.monotonic()), inputs)
            except asyncio.CancelledError:
                if not _closed_under_us():
                    raise
                # A concurrent stream's stall reconnected the channel under this long poll: ask again.
                errors.append(f"{source.address}: channel closed under the request")
                continue
            except (grpc.aio.AioRpcError, codec.ManifestError) as err:
                errors.append(f"{source.address}: {err}")
                failed += 1
                await asyncio.sleep(policy.backoff_initial_s)
                continue
            if manifest is not None:
                return manifest
            errors.append(f"{source.address}: not published")
        now = time.monotonic()
        failing_since = (failing_since or now) if failed == len(sources) else None
        if now >= deadline or (failing_since is not None and now - failing_since >= policy.stall_s):
            raise FetchError(f"no manifest for {key} within {wait_s} s: {'; '.join(errors)}")


async def fetch_into(
    manifest: codec.Manifest,
    sources: Sequence[ExchangeClient],
    dest: Mapping[str, torch.Tensor],
    policy: FetchPolicy = FetchPolicy(),
) -> FetchStats:
    """Fetches a whole object and decodes it into preallocated `dest` (the manifest's names and shapes).

    `dest` is only meaningful when this returns: on any error it holds a partial mix and must not be
    used. NonFiniteError (NaN/Inf in verified data: the sender's fault) is raised without retrying.
    """
    codec.check_destination(manifest.layout, dest)
    return await fetch_chunks(manifest, sources, into_destination(manifest, dest), policy=policy)


def into_destination(manifest: codec.Manifest, dest: Mapping[str, torch.Tensor]) -> InThread:
    """The sink that decodes every chunk of `manifest` into `dest` (checked by check_destination);
    where `dest` is in the wire dtype, the bulk plane receives chunks straight into it."""

    def decode(index: int, data: memoryview) -> None:
        codec.decode_verified_chunk(manifest, index, data, dest)

    def placed(index: int, targets: Sequence[memoryview]) -> None:
        codec.check_placed(manifest, index, targets)

    return InThread(decode, lambda index: codec.chunk_targets(manifest, index, dest), placed)
