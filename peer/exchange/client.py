"""Fetching exchange objects from peers: resume after drops, re-fetch corrupt chunks, give up cleanly.

`fetch_chunks` pulls a chunk range of one object from one or more peers that hold it. Every chunk is
checked against the manifest (index, length, blake3) before the sink sees it; a stream that breaks,
stalls, ends early or sends a bad or misplaced chunk is abandoned and re-opened from the first chunk
not yet held, on the next peer in turn, with exponential backoff (tenacity). It gives up with
FetchError after `FetchPolicy.max_failures` consecutive failures without progress or after the
deadline. Each stream waits only on its own peer and its own sink: a stalled sender blocks no
other stream, except through a sink that waits for other streams by design (the reducer's lockstep).

This is the one retry loop for every transport: each attempt, the peer's plane choice
(planes.PlaneChoice) picks a chunk source (sources.py: gRPC FetchChunks or the bulk data plane),
which reads the range and names the fault it ended with.

    .venv/bin/python -m pytest tests/integration/test_exchange_transfer.py -q
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import grpc
import torch
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential, wait_random

from peer.exchange import bulk, chunkwire, codec, decoding, protoconv
from peer.exchange.buffers import ChunkBuffers
from peer.exchange.bulk_source import BulkSource
from peer.exchange.grpc_source import GrpcSource
from peer.exchange.planes import DEFAULT_PLANE, PlaneChoice
from peer.exchange.service import SERVICE
from peer.exchange.sources import (
    Attempt, ChunkSink, ChunkSource, FetchError, FetchStats, InThread, Retry, closed_under_us, unanswerable
)
from peer.exchange.store import MeanInputs
from peer.gen.sitemesh.v1 import exchange_pb2, exchange_pb2_grpc
from peer.transport import channels, route, tls_context
from peer.transport.dialer import Dialer

log = logging.getLogger("sitemesh.exchange")


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


class ExchangeClient:
    """The Exchange service of one peer.

    `plane`: "bulk" fetches chunk ranges over the peer's bulk data plane (peer/exchange/bulk.py)
    when it offers one (OpenBulk), else over FetchChunks, saying so once in the log; "grpc" always
    over FetchChunks. `bulk_address` (host:port) dials the bulk plane there instead of the host of
    `address` and the ticket's port (a fault proxy or delay line in front of it). `dialer` opens
    both planes' connections the way `address` says (directly, through a proxy or a relay).
    """

    def __init__(self, address: str, creds: channels.Credentials = channels.PLAINTEXT, plane: str = DEFAULT_PLANE,
                 bulk_address: str | None = None, dialer: Dialer | None = None) -> None:
        self._planes = PlaneChoice(plane)
        self.address = address
        self._creds = creds
        self._dialer = dialer or channels.default_dialer()
        self._bulk_address = bulk_address
        self._bulk_tls: ssl.SSLContext | None = None
        self._spare: tuple[float, asyncio.Future[exchange_pb2.BulkTicket]] | None = None
        """A ticket asked for ahead (prefetch_ticket): when it was asked for, and the call."""
        self._connect()

    def _connect(self) -> None:
        self._channel = channels.open_channel(self.address, self._creds, self._dialer)
        self._stub = exchange_pb2_grpc.ExchangeStub(self._channel)
        # FetchChunks with chunkwire's zero-copy parser instead of the generated Chunk.FromString.
        self._fetch_chunks = self._channel.unary_stream(
            f"/{SERVICE}/FetchChunks",
            request_serializer=exchange_pb2.FetchRequest.SerializeToString,
            response_deserializer=chunkwire.parse,
        )

    @property
    def plane(self) -> str:
        """The plane the next fetch from this peer takes ("bulk" or "grpc")."""
        return self._planes.plane

    async def close(self) -> None:
        self._drop_spare()
        await self._channel.close()

    async def reconnect(self) -> None:
        """Moves to a new TCP connection after a stall.

        gRPC shares connections between channels to the same address, so only closing the old
        channel drops the wedged connection. Closing cancels other streams still on it; they see
        asyncio.CancelledError, which GrpcSource turns into a retry (see `sources.closed_under_us`).
        """
        old = self._channel
        self._drop_spare()
        self._connect()
        await old.close()

    async def get_manifest(
        self, key: codec.ObjectKey, wait_s: float = 0.0, inputs: MeanInputs = (), answer_s: float = 10.0
    ) -> codec.Manifest | None:
        """The peer's manifest for `key` (validated), waiting up to `wait_s` for it; None if it has none.
        `inputs`: for a mean shard, the contributors it must average (see ManifestRequest). The call
        fails (DEADLINE_EXCEEDED) if no answer came `answer_s` after the wait."""
        request = exchange_pb2.ManifestRequest(
            key=protoconv.key_to_proto(key),
            wait_ms=int(wait_s * 1000),
            contributors=[exchange_pb2.MeanInput(site=s, address=a, root_hash=r) for s, a, r in inputs],
        )
        try:
            reply = await self._stub.GetManifest(request, timeout=wait_s + answer_s)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise
        manifest = protoconv.manifest_from_proto(reply)
        if manifest.key != key:
            raise codec.ManifestError(f"{self.address} answered {manifest.key} when asked for {key}")
        return manifest

    def bulk_reached(self, reached: bool, fault: str = "") -> None:
        """The outcome of one bulk connection: `reached` if its first frame arrived. planes.BULK_MISSES
        misses in a row and this client fetches over FetchChunks from now on, saying so once."""
        reason = self._planes.bulk_reached(reached)
        if reason is not None:
            log.warning("%s: its bulk data plane cannot be reached from here (%s; last: %s); fetching from it "
                        "over gRPC FetchChunks", self.address, reason, fault)

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
            self._planes.no_bulk_plane()
            return None
        tls = None
        if ticket.tls:
            if self._creds.plaintext:
                raise FetchError(f"{self.address} serves its bulk plane over TLS but this peer has no certificates")
            if self._bulk_tls is None:
                self._bulk_tls = tls_context.client_tls(self._creds)
            tls = self._bulk_tls
        name = route.server_name(self.address)
        if self._bulk_address is not None:
            hop = route.host_port(self._bulk_address)
            return bulk.BulkTarget(hop.host, hop.port, ticket.token, tls, name, functools.partial(self._dialer.tcp, hop))
        dial = functools.partial(self._dialer.open, self.address, "bulk", ticket.port)
        return bulk.BulkTarget(name, ticket.port, ticket.token, tls, name, dial)

    async def source(self, timeout_s: float) -> ChunkSource:
        """The chunk source of the next attempt on this peer: a bulk connection where the plane
        choice says bulk and a ticket comes, else FetchChunks. Retry when OpenBulk fails."""
        if self.plane == "bulk":
            try:
                target = await self.bulk_target(min(10.0, max(timeout_s, 0.001)))
            except grpc.aio.AioRpcError as err:
                raise Retry("transport_errors", f"OpenBulk: {err.code().name}: {err.details()}") from None
            if target is not None:
                return BulkSource(target, self.address, self.bulk_reached)
        return GrpcSource(self)

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
        raise FetchError(f"{manifest.key}: no source to fetch from", manifest.key)
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
        retry=retry_if_exception_type(Retry),
        stop=give_up,
        # Jitter keeps receivers that lost the same sender from reconnecting in lockstep.
        wait=wait_exponential(multiplier=policy.backoff_initial_s, max=policy.backoff_max_s)
        + wait_random(0, policy.backoff_initial_s),
        reraise=True,
    )
    try:
        async for tried in retrying:
            with tried:
                peer = sources[(tried.retry_state.attempt_number - 1) % len(sources)]
                remaining = policy.deadline_s - (time.monotonic() - started)
                stats.attempts += 1
                if progress.next < end:
                    await _attempt(peer, Attempt(manifest, sink, progress.next, end, timeout_s=remaining,
                                                 stall_s=policy.stall_s, buffers=buffers), progress, stats)
    except Retry:
        raise FetchError(
            f"{manifest.key}: gave up at chunk {progress.next} of [{first}, {end}) after "
            f"{progress.failures} failed attempts without progress; last: {progress.last_fault}", manifest.key
        ) from None
    return stats


@dataclass
class _Progress:
    next: int
    """First chunk not yet delivered to the sink: where the next attempt resumes."""
    at_last_failure: int
    failures: int = 0
    last_fault: str = "none"


async def _attempt(peer: ExchangeClient, attempt: Attempt, progress: _Progress, stats: FetchStats) -> None:
    """One attempt on `peer`, over the source its plane choice picks; the fault it ends with, if any,
    is counted and kept for the error message here, for every source alike."""
    try:
        await (await peer.source(attempt.timeout_s)).read(attempt)
    except Retry as err:
        stats.count(err.counter)
        progress.last_fault = f"{peer.address}: {err}"
        raise
    finally:
        progress.next = attempt.next
        stats.chunks += attempt.chunks
        stats.bytes += attempt.bytes


async def fetch_manifest(
    key: codec.ObjectKey,
    sources: Sequence[ExchangeClient],
    wait_s: float,
    policy: FetchPolicy = FetchPolicy(),
    inputs: MeanInputs = (),
) -> codec.Manifest:
    """The manifest of `key` from the first source that has it, long-polling each up to `wait_s`.
    Gives up early when every source has failed (not merely not published yet) for `policy.stall_s`:
    those peers are gone, not still training; at once when no source can ever answer (the connection
    refused, or the object superseded: `sources.unanswerable`). `inputs`: see ExchangeClient.get_manifest."""
    errors: deque[str] = deque(maxlen=len(sources))  # the last answer of each source
    deadline = time.monotonic() + min(wait_s, policy.deadline_s)
    failing_since: float | None = None
    sources[0].prefetch_ticket()  # a fetch of the object's chunks follows, from the first source
    while True:
        failed = gone = 0
        for source in sources:
            try:
                manifest = await source.get_manifest(key, max(0.0, deadline - time.monotonic()), inputs)
            except asyncio.CancelledError:
                if not closed_under_us():
                    raise
                # A concurrent stream's stall reconnected the channel under this long poll: ask again.
                errors.append(f"{source.address}: channel closed under the request")
                continue
            except (grpc.aio.AioRpcError, codec.ManifestError) as err:
                why = f"{err.code().name}: {err.details()}" if isinstance(err, grpc.aio.AioRpcError) else str(err)
                errors.append(f"{source.address}: {why}")
                failed += 1
                if isinstance(err, grpc.aio.AioRpcError) and unanswerable(err):
                    gone += 1
                    continue
                await asyncio.sleep(policy.backoff_initial_s)
                continue
            if manifest is not None:
                return manifest
            errors.append(f"{source.address}: not published")
        now = time.monotonic()
        failing_since = (failing_since or now) if failed == len(sources) else None
        if (now >= deadline or gone == len(sources)
                or (failing_since is not None and now - failing_since >= policy.stall_s)):
            raise FetchError(f"no manifest for {key} within {wait_s} s: {'; '.join(errors)}", key)


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
    decoding.check_destination(manifest.layout, dest)
    return await fetch_chunks(manifest, sources, into_destination(manifest, dest), policy=policy)


def into_destination(manifest: codec.Manifest, dest: Mapping[str, torch.Tensor]) -> InThread:
    """The sink that decodes every chunk of `manifest` into `dest` (checked by check_destination);
    where `dest` is in the wire dtype, the bulk plane receives chunks straight into it."""

    def decode(index: int, data: memoryview) -> None:
        decoding.decode_verified_chunk(manifest, index, data, dest)

    def placed(index: int, targets: Sequence[memoryview]) -> None:
        decoding.check_placed(manifest, index, targets)

    return InThread(decode, lambda index: decoding.chunk_targets(manifest, index, dest), placed)
