"""Real gRPC transfers on loopback, through a fault-injecting proxy and misbehaving test servers.

Every fault must end in a verified tensor (equal to the local decode of what was published) or a
clear error, and the server must keep serving after every refusal.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
import torch

from peer.exchange import codec, decoding, protoconv
from peer.exchange.bulk import BulkServer
from peer.exchange.chunkwire import WireChunk
from peer.exchange.client import (
    ExchangeClient,
    FetchPolicy,
    fetch_chunks,
    fetch_into,
    fetch_manifest,
)
from peer.exchange.service import ExchangeServicer
from peer.exchange.sources import FetchError, FetchStats
from peer.exchange.store import ExchangeStore
from peer.gen.sitemesh.v1 import exchange_pb2, exchange_pb2_grpc
from tests.support.exchange import decoded, random_model, rehashed, serving, serving_bulk
from tests.support.faultproxy import Fault, FaultProxy

CHUNK = 16 * 1024
SIZES = {"emb": (96, 1000), "layer.0.w": (301, 7), "layer.0.b": (5,), "scalar": ()}  # ~196 kB in bf16
POLICY = FetchPolicy.local_test()
WIRES = list(codec.WireDtype)


# Sparse objects streamed at full density (every entry kept): ~1.75 bytes per element, so that they
# too are deep enough for the fault offsets below; what density keeps is test_exchange_sparse's.
STREAM_KEEP = 4096


def sizes(wire: codec.WireDtype) -> dict[str, tuple[int, ...]]:
    """SIZES, with more elements for the quantized formats: every format streams >= ~200 kB, so the
    fault offsets below land at the same depth of the stream (past gRPC's first buffers)."""
    return {**SIZES, "emb": (96, 4000)} if wire.quantized else SIZES


def run(make: Callable[[], Awaitable[Any]], timeout_s: float = 30.0) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(make(), timeout_s)

    return asyncio.run(bounded())


def _published(
    seed: int = 0, site: str = "a", round_: int = 7, wire: codec.WireDtype = codec.WireDtype.BF16
) -> tuple[ExchangeStore, codec.Encoded]:
    enc = codec.encode(random_model(seed, sizes(wire)), round=round_, site=site, tokens=1000, chunk_size=CHUNK,
                       wire=wire, keep=STREAM_KEEP if wire is codec.WireDtype.SPARSE else 0)
    store = ExchangeStore()
    store._objects[enc.manifest.key] = enc  # synchronous publish for set-up (publish() needs a loop)
    return store, enc


def _dest(enc: codec.Encoded, in_wire: bool = False) -> dict[str, torch.Tensor]:
    """NaN-filled destination tensors, in the parameters' dtype or (`in_wire`) the wire's, which the
    bulk plane receives straight into (decoding.chunk_targets)."""
    dtype = enc.manifest.layout.wire.torch_dtype if in_wire else torch.float32
    return {e.name: torch.full(e.shape, float("nan"), dtype=dtype) for e in enc.manifest.layout.tensors}


def _assert_exact(dest: dict[str, torch.Tensor], enc: codec.Encoded) -> None:
    want = decoded(enc)
    for name, t in want.items():
        assert torch.equal(dest[name].float(), t), name


class RecordingServicer(ExchangeServicer):
    """The real servicer, remembering the first chunk of every FetchChunks request."""

    def __init__(self, store: ExchangeStore) -> None:
        super().__init__(store)
        self.requests: list[int] = []

    async def FetchChunks(
        self, request: exchange_pb2.FetchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[WireChunk]:
        self.requests.append(request.first_chunk)
        async for chunk in super().FetchChunks(request, context):
            yield chunk


class RecordingBulk(BulkServer):
    """The real bulk server, remembering the first chunk of every request it accepted."""

    def __init__(self, store: ExchangeStore) -> None:
        super().__init__(store)
        self.requests: list[int] = []

    def _request(self, sock: Any, deadline: float) -> tuple[codec.Encoded, exchange_pb2.FetchRequest]:
        encoded, request = super()._request(sock, deadline)
        self.requests.append(request.first_chunk)
        return encoded, request


PLANES = ["grpc", "bulk"]
# (wire, plane, destination in the wire dtype): every wire on both planes into fp32 (fp32 chunks go
# straight into it on the bulk plane), and bf16 into bf16, received in place on the bulk plane and
# decoded into it over gRPC.
CASES = [(w, p, False) for w in WIRES for p in PLANES] + [(codec.WireDtype.BF16, p, True) for p in PLANES]


async def _fetch_through(
    faults: list[Fault],
    servicer_cls: type[ExchangeServicer] = RecordingServicer,
    wire: codec.WireDtype = codec.WireDtype.BF16,
    plane: str = "grpc",
    in_wire: bool = False,
) -> Any:
    """Fetches one object with `faults` on the path its chunks take: the gRPC connection, or
    (plane "bulk") the bulk connections, whose manifest and tickets go over gRPC directly.
    `in_wire`: into a destination in the wire dtype (received in place on the bulk plane)."""
    store, enc = _published(wire=wire)
    servicer = servicer_cls(store)
    bulk = RecordingBulk(store) if plane == "bulk" else None
    async with serving_bulk(store, servicer, bulk) as (address, _):
        host, port = address.rsplit(":", 1)
        target = (host, bulk.port) if bulk is not None else (host, int(port))
        async with FaultProxy(target, faults) as proxy:
            client = (ExchangeClient(address, plane="bulk", bulk_address=proxy.address) if bulk is not None
                      else ExchangeClient(proxy.address, plane="grpc"))
            try:
                manifest = await fetch_manifest(enc.manifest.key, [client], wait_s=5, policy=POLICY)
                dest = _dest(enc, in_wire)
                stats = await fetch_into(manifest, [client], dest, POLICY)
                stalls_sat_out = proxy.stalls_over  # read at once: the proxy's stall may end any moment
            finally:
                await client.close()
    _assert_exact(dest, enc)
    assert stats.chunks == enc.manifest.num_chunks and stats.bytes == enc.manifest.wire_nbytes
    requests = bulk.requests if bulk is not None else getattr(servicer, "requests", [])
    return stats, servicer, proxy, stalls_sat_out, requests


@pytest.mark.parametrize(("wire", "plane", "in_wire"), CASES)
def test_clean_transfer_is_exact_and_uses_one_stream(wire: codec.WireDtype, plane: str, in_wire: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    ways = {"decoded": 0, "placed": 0}  # how the chunks reached the destination

    def counted(way: str, fn: Callable[..., None]) -> Callable[..., None]:
        def call(*args: Any) -> None:
            ways[way] += 1
            fn(*args)
        return call

    monkeypatch.setattr(decoding, "decode_verified_chunk", counted("decoded", decoding.decode_verified_chunk))
    monkeypatch.setattr(decoding, "check_placed", counted("placed", decoding.check_placed))
    stats, servicer, proxy, _, requests = run(lambda: _fetch_through([], wire=wire, plane=plane, in_wire=in_wire))
    # Received in place exactly where the destination holds the wire's values and the bulk plane carries them.
    placed = plane == "bulk" and (in_wire or wire is codec.WireDtype.FP32)
    # (_fetch_through's own check decodes every chunk once more, from the published object.)
    assert ways == {"decoded": stats.chunks * (1 if placed else 2), "placed": stats.chunks if placed else 0}
    assert requests == [0]
    assert (stats.attempts, stats.corrupt_chunks, stats.transport_errors) == (1, 0, 0)
    if plane == "bulk":
        assert servicer.requests == [], "the chunks came over gRPC, not the bulk plane"


@pytest.mark.parametrize(("wire", "plane", "in_wire"), CASES)
def test_dropped_connection_resumes_from_the_first_missing_chunk(wire: codec.WireDtype, plane: str, in_wire: bool) -> None:
    # The delay lets the client take the first chunks before the reset (gRPC discards what it
    # buffered but had not handed over when a connection dies).
    drop = 100_000
    stats, _, proxy, _, requests = run(
        lambda: _fetch_through([Fault(drop_after=drop, delay_s=0.05)], wire=wire, plane=plane, in_wire=in_wire))
    assert proxy.faults_fired == [f"conn 1: dropped after {drop} bytes"]
    assert stats.transport_errors + stats.truncated_streams >= 1
    assert len(requests) >= 2 and requests[0] == 0
    # Exactly-once delivery (chunks == num_chunks above) plus a second request starting past 0: the
    # retry resumed at the first chunk not yet held instead of starting over.
    assert requests[1] >= 1


@pytest.mark.parametrize(("wire", "plane", "in_wire"), CASES)
def test_flipped_byte_is_detected_and_the_chunk_refetched(wire: codec.WireDtype, plane: str, in_wire: bool) -> None:
    # 60_000 bytes in: inside the payload of a chunk (neither HTTP/2 nor bulk frames carry a checksum).
    flip = 60_000
    stats, _, proxy, _, requests = run(lambda: _fetch_through([Fault(flip_at=flip)], wire=wire, plane=plane, in_wire=in_wire))
    assert proxy.faults_fired == [f"conn 1: flipped byte {flip}"]
    assert stats.corrupt_chunks + stats.transport_errors + stats.misplaced_chunks == 1
    assert requests[-1] > 0


@pytest.mark.parametrize(("wire", "plane", "in_wire"), CASES)
def test_stalled_sender_is_abandoned_after_the_stall_timeout(wire: codec.WireDtype, plane: str, in_wire: bool) -> None:
    stall = 50_000
    stats, _, proxy, stalls_sat_out, _ = run(
        lambda: _fetch_through([Fault(stall_after=stall, stall_s=5.0)], wire=wire, plane=plane, in_wire=in_wire))
    assert stats.stalls == 1 and proxy.faults_fired
    # An ordering, not a wall-clock window: the fetch finished while the proxy still held the stall.
    assert stalls_sat_out == 0, "the fetch waited for the stalled stream instead of abandoning it"


@pytest.mark.parametrize(("wire", "plane", "in_wire"), CASES)
def test_slow_link_completes(wire: codec.WireDtype, plane: str, in_wire: bool) -> None:
    stats, *_ = run(lambda: _fetch_through([Fault(delay_s=0.002)], wire=wire, plane=plane, in_wire=in_wire))
    assert stats.attempts == 1


def test_stalled_peer_does_not_block_fetches_from_other_peers() -> None:
    async def scenario() -> tuple[list[str], float, int]:
        slow_store, slow = _published(seed=1, site="slow")
        fast_store, fast = _published(seed=2, site="fast")
        async with serving(slow_store) as slow_addr, serving(fast_store) as fast_addr:
            host, port = slow_addr.rsplit(":", 1)
            async with FaultProxy((host, int(port)), [Fault(stall_after=1, stall_s=5.0)]) as proxy:
                clients = [ExchangeClient(proxy.address, plane="grpc"), ExchangeClient(fast_addr, plane="grpc")]
                started = time.monotonic()
                order: list[str] = []
                slow_s, stalls_sat_out = 0.0, -1
                policy = dataclasses.replace(POLICY, stall_s=1.5)

                async def one(client: ExchangeClient, enc: codec.Encoded) -> None:
                    nonlocal slow_s, stalls_sat_out
                    dest = _dest(enc)
                    await fetch_into(enc.manifest, [client], dest, policy)
                    if enc is slow:
                        slow_s, stalls_sat_out = time.monotonic() - started, proxy.stalls_over
                    order.append(enc.manifest.key.site)
                    _assert_exact(dest, enc)

                await asyncio.gather(one(clients[0], slow), one(clients[1], fast))
                for c in clients:
                    await c.close()
        return order, slow_s, stalls_sat_out

    order, slow_s, stalls_sat_out = run(scenario)
    # Orderings, not wall-clock windows: the fast peer's fetch ended first; the stalled one was
    # abandoned (no sooner than its stall timeout, a lower bound no load can break) and retried
    # while the proxy still held the stall.
    assert order == ["fast", "slow"] and slow_s >= 1.5 and stalls_sat_out == 0


def test_bad_source_falls_back_to_another_peer_holding_the_object() -> None:
    async def scenario() -> FetchStats:
        store, enc = _published()
        async with serving(store) as a, serving(store) as b:
            host, port = a.rsplit(":", 1)
            dead = [Fault(drop_after=0)] * 50
            async with FaultProxy((host, int(port)), dead) as proxy:
                clients = [ExchangeClient(proxy.address, plane="grpc"), ExchangeClient(b, plane="grpc")]
                dest = _dest(enc)
                stats = await fetch_into(enc.manifest, clients, dest, POLICY)
                for c in clients:
                    await c.close()
        _assert_exact(dest, enc)
        assert proxy.connections >= 1
        return stats

    stats = run(scenario)
    assert stats.transport_errors >= 1 and stats.chunks > 0


def test_dead_peer_ends_in_a_clear_error() -> None:
    async def scenario() -> None:
        store, enc = _published()
        async with serving(store) as a:
            host, port = a.rsplit(":", 1)
            async with FaultProxy((host, int(port)), [Fault(drop_after=0)] * 50) as proxy:
                client = ExchangeClient(proxy.address, plane="grpc")
                try:
                    with pytest.raises(FetchError, match="gave up at chunk 0 .* 4 failed attempts"):
                        await fetch_into(enc.manifest, [client], _dest(enc), POLICY)
                finally:
                    await client.close()

    run(scenario)


def test_a_manifest_of_a_peer_whose_process_is_gone_fails_at_once() -> None:
    """Nothing listens where the object was published any more (its peer was killed): the objects it
    served went with its process, so the manifest fetch gives up at once, naming the object, not
    after the policy's 20 s of failures or the long poll's wait."""
    async def scenario() -> None:
        with socket.create_server(("127.0.0.1", 0)) as sock:
            address = f"127.0.0.1:{sock.getsockname()[1]}"
        client = ExchangeClient(address, plane="grpc")
        key = codec.ObjectKey(3, "b")
        try:
            started = time.monotonic()
            with pytest.raises(FetchError, match="Connection refused") as err:
                await asyncio.wait_for(fetch_manifest(key, [client], 600.0, FetchPolicy.wan()), 30)
            assert time.monotonic() - started < 3.0, "refused connections were retried as if the peer might come back"
            assert err.value.key == key
        finally:
            await client.close()

    run(scenario)


def test_a_global_state_older_than_the_one_served_fails_at_once() -> None:
    """A peer serves only its newest global state, so a joiner asking for an older round's state (its
    log not yet caught up) is told so at once, naming the newer round, and not kept waiting the long
    poll for a state that will never be published there: the state transfer goes on at once. A
    round newer than the one served is still waited for (the peer may apply it any moment)."""
    async def scenario() -> None:
        state = codec.encode(random_model(0, SIZES), round=363, site="a", tokens=0, chunk_size=CHUNK,
                             wire=codec.WireDtype.FP32, kind=codec.ObjectKind.GLOBAL_STATE)
        store = ExchangeStore()
        await store.publish(state)
        async with serving(store) as address:
            client = ExchangeClient(address, plane="grpc")
            try:
                old = codec.ObjectKey(102, "a", codec.ObjectKind.GLOBAL_STATE)
                started = time.monotonic()
                with pytest.raises(FetchError, match="superseded here by the state of round 363") as err:
                    await fetch_manifest(old, [client], 10.0)
                assert time.monotonic() - started < 2.0, "a superseded state was waited for as if it might come"
                assert err.value.key == old
                newer = codec.ObjectKey(364, "a", codec.ObjectKind.GLOBAL_STATE)
                started = time.monotonic()
                with pytest.raises(FetchError, match="not published"):
                    await fetch_manifest(newer, [client], 1.0)
                assert time.monotonic() - started >= 0.9, "a state not yet applied was not waited for"
                assert (await fetch_manifest(state.manifest.key, [client], 1.0)) == state.manifest
            finally:
                await client.close()

    run(scenario)


class Misbehaving(ExchangeServicer):
    """Serves one bad stream (mode), then behaves: the client must notice, count and recover."""

    mode = ""

    def __init__(self, store: ExchangeStore) -> None:
        super().__init__(store)
        self.calls = 0

    async def FetchChunks(
        self, request: exchange_pb2.FetchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[WireChunk]:
        self.calls += 1
        good = [c async for c in super().FetchChunks(request, context)]
        if self.calls > 1:
            for c in good:
                yield c
            return
        first, second = good[0], good[1]
        bad = {
            "duplicate": [first, first, second],
            "reorder": [second, first],
            "truncate": [first],
            "short": [WireChunk(first.index, first.data[:-4])],
            "corrupt": [WireChunk(first.index, b"\0" + bytes(first.data[1:]))],
        }[self.mode]
        for c in bad:
            yield c


@pytest.mark.parametrize(
    "mode, counter",
    [
        ("duplicate", "misplaced_chunks"),
        ("reorder", "misplaced_chunks"),
        ("truncate", "truncated_streams"),
        ("short", "corrupt_chunks"),
        ("corrupt", "corrupt_chunks"),
    ],
)
@pytest.mark.parametrize("wire", WIRES)
def test_misbehaving_stream_is_detected_counted_and_recovered(mode: str, counter: str, wire: codec.WireDtype) -> None:
    cls = type(f"Misbehaving_{mode}", (Misbehaving,), {"mode": mode})
    stats, servicer, _, _, _ = run(lambda: _fetch_through([], cls, wire))
    assert getattr(stats, counter) == 1
    assert servicer.calls == 2


def test_refusals_carry_a_clear_status_and_the_server_keeps_serving() -> None:
    async def scenario() -> None:
        store, enc = _published()
        async with serving(store) as address:
            client = ExchangeClient(address, plane="grpc")
            stub = client._stub
            key = protoconv.key_to_proto(enc.manifest.key)

            async def status_of(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call
                return info.value.code(), info.value.details() or ""

            async def stream_status(req: exchange_pb2.FetchRequest) -> tuple[grpc.StatusCode, str]:
                async def drain() -> None:
                    async for _ in stub.FetchChunks(req):
                        pass

                return await status_of(drain())

            unknown_round = codec.ObjectKey(99, "a")
            assert await client.get_manifest(unknown_round) is None
            assert await client.get_manifest(codec.ObjectKey(7, "zz")) is None
            code, details = await stream_status(exchange_pb2.FetchRequest(key=protoconv.key_to_proto(unknown_round)))
            assert code == grpc.StatusCode.NOT_FOUND and "round 99" in details
            root = enc.manifest.root_hash
            code, details = await stream_status(exchange_pb2.FetchRequest(key=key, root_hash=b"x" * 32))
            assert code == grpc.StatusCode.FAILED_PRECONDITION and "root hash" in details
            n = enc.manifest.num_chunks
            req = exchange_pb2.FetchRequest(key=key, root_hash=root, first_chunk=0, end_chunk=n + 1)
            assert (await stream_status(req))[0] == grpc.StatusCode.OUT_OF_RANGE
            bad_kind = exchange_pb2.ManifestRequest(key=exchange_pb2.ObjectKey(round=7, site="a", kind=0))
            assert (await status_of(stub.GetManifest(bad_kind)))[0] == grpc.StatusCode.INVALID_ARGUMENT
            tampered = protoconv.manifest_to_proto(enc.manifest)
            tampered.chunk_hashes[0] = b"\1" * 32
            code, details = await status_of(stub.Announce(tampered))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "root_hash" in details
            oversized = protoconv.manifest_to_proto(enc.manifest)
            oversized.key.site = "x" * (9 << 20)
            assert (await status_of(stub.Announce(oversized)))[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
            # An out-of-range request is our own bug: refused at once, not retried.
            with pytest.raises(FetchError, match="OUT_OF_RANGE"):
                async def sink(i: int, data: memoryview) -> None:
                    pass

                await fetch_chunks(enc.manifest, [client], sink, first=0, end=n + 1, policy=POLICY)
            # ...and after all that, a normal fetch still works.
            dest = _dest(enc)
            await fetch_into(enc.manifest, [client], dest, POLICY)
            _assert_exact(dest, enc)
            await client.close()

    run(scenario)


def test_non_finite_pseudo_gradient_is_refused_without_retrying() -> None:
    async def scenario() -> None:
        enc = codec.encode({"w": torch.ones(64)}, round=1, site="a", tokens=1, chunk_size=32)
        enc.data.view(torch.bfloat16)[40] = float("inf")
        enc = rehashed(enc)
        m = enc.manifest
        store = ExchangeStore()
        await store.publish(enc)
        async with serving(store) as address:
            client = ExchangeClient(address)
            manifest = await client.get_manifest(m.key)
            assert manifest is not None
            with pytest.raises(codec.NonFiniteError, match="chunk 2"):
                await fetch_into(manifest, [client], {"w": torch.empty(64)}, POLICY)
            await client.close()

    run(scenario)


def test_manifest_long_poll_and_announce() -> None:
    async def scenario() -> None:
        store, enc = _published()
        late = codec.encode(random_model(3, SIZES), round=8, site="a", tokens=1, chunk_size=CHUNK)
        async with serving(store) as address:
            client = ExchangeClient(address)

            async def publish_later() -> None:
                await asyncio.sleep(0.3)
                await store.publish(late)

            task = asyncio.ensure_future(publish_later())
            started = time.monotonic()
            got = await client.get_manifest(late.manifest.key, wait_s=5.0)
            assert got == late.manifest and 0.25 < time.monotonic() - started < 3.0
            await task
            # A producer announces over the Exchange service's Announce RPC; the store holds it.
            async with grpc.aio.insecure_channel(address) as channel:
                await exchange_pb2_grpc.ExchangeStub(channel).Announce(
                    protoconv.manifest_to_proto(enc.manifest), timeout=10.0)
            assert await store.wait_announced(enc.manifest.key, 1.0) == enc.manifest
            await client.close()

    run(scenario)


def test_streams_sharing_a_stalled_connection_both_recover() -> None:
    """Two fetches through one client share its TCP connection: when it wedges, the first to notice
    reconnects, which cancels the other's stream; that one must retry, not die of CancelledError."""

    async def scenario() -> list[FetchStats]:
        store, one = _published(seed=1, site="a")
        two = codec.encode(random_model(2, SIZES), round=7, site="b", tokens=1, chunk_size=CHUNK)
        await store.publish(two)
        async with serving(store) as address:
            host, port = address.rsplit(":", 1)
            async with FaultProxy((host, int(port)), [Fault(stall_after=60_000, stall_s=5.0)]) as proxy:
                client = ExchangeClient(proxy.address, plane="grpc")
                dests = [_dest(one), _dest(two)]
                policy = dataclasses.replace(POLICY, stall_s=0.5)
                stats = await asyncio.gather(
                    *(fetch_into(enc.manifest, [client], d, policy) for enc, d in zip((one, two), dests))
                )
                await client.close()
        _assert_exact(dests[0], one)
        _assert_exact(dests[1], two)
        assert proxy.connections >= 2
        return list(stats)

    stats = run(scenario)
    assert sum(s.stalls + s.transport_errors for s in stats) >= 2  # both streams saw the fault


def test_a_reconnect_gets_its_own_connection_not_the_wedged_one() -> None:
    """Two clients of one address, the second opened while the first is still open, as
    `reconnect` does: they must not share a TCP connection (gRPC's global subchannel pool would hand
    the new channel the wedged connection it was opened to escape)."""

    async def scenario() -> int:
        store, enc = _published(seed=3, site="a")
        async with serving(store) as address:
            host, port = address.rsplit(":", 1)
            async with FaultProxy((host, int(port)), []) as proxy:
                first, second = (ExchangeClient(proxy.address, plane="grpc") for _ in range(2))
                for client in (first, second):
                    d = _dest(enc)
                    await fetch_into(enc.manifest, [client], d, POLICY)
                    _assert_exact(d, enc)
                await first.close()
                await second.close()
                return proxy.connections

    assert run(scenario) == 2
