"""The bulk data plane on real sockets with real gRPC: who may connect, what it refuses, how it fails.

The fault-proxy transfers of every wire format over the bulk plane are in test_exchange_transfer.py
(parametrized over both planes); here: tokens, refusals with clear error frames, bounds, a
misbehaving bulk server, a persistently corrupt source, the fallback to gRPC, and mutual TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch

from ops.certs import make_run
from peer.exchange import bulk, codec, protoconv
from peer.exchange.bulk import BulkConfig, BulkServer
from peer.exchange.client import (
    ExchangeClient,
    FetchPolicy,
    fetch_chunks,
    fetch_into,
    fetch_manifest,
)
from peer.exchange.sources import FetchError, InThread
from peer.exchange.store import ExchangeStore
from peer.gen.sitemesh.v1 import exchange_pb2
from peer.transport import tls_context
from peer.transport.channels import PLAINTEXT, Credentials
from tests.support.exchange import decoded, random_model, rehashed, serving, serving_bulk

CHUNK = 16 * 1024
SIZES = {"emb": (96, 1000), "layer.0.w": (301, 7), "scalar": ()}
POLICY = FetchPolicy.local_test()
WIRES = list(codec.WireDtype)


def run(make: Any, timeout_s: float = 30.0) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(make(), timeout_s)

    return asyncio.run(bounded())


def _encoded(wire: codec.WireDtype = codec.WireDtype.BF16) -> codec.Encoded:
    return codec.encode(random_model(0, SIZES), round=3, site="a", tokens=10, chunk_size=CHUNK, wire=wire,
                        keep=4096 if wire is codec.WireDtype.SPARSE else 0)  # deep enough for the faults


async def _store(enc: codec.Encoded) -> ExchangeStore:
    store = ExchangeStore()
    await store.publish(enc)
    return store


def _dest(enc: codec.Encoded) -> dict[str, torch.Tensor]:
    return {e.name: torch.full(e.shape, float("nan")) for e in enc.manifest.layout.tensors}


def _exact(dest: dict[str, torch.Tensor], enc: codec.Encoded) -> bool:
    return all(torch.equal(dest[n], t) for n, t in decoded(enc).items())


def _request(enc: codec.Encoded, first: int = 0, end: int | None = None, root: bytes | None = None) -> bytes:
    m = enc.manifest
    return exchange_pb2.FetchRequest(key=protoconv.key_to_proto(m.key), root_hash=m.root_hash if root is None else root,
                                     first_chunk=first, end_chunk=m.num_chunks if end is None else end
                                     ).SerializeToString()  # fmt: skip


def _raw(port: int, payload: bytes) -> bytes:
    """Sends `payload` raw on a new connection; all it got back before the end (or a reset)."""
    data = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, contextlib.suppress(ConnectionResetError):
        sock.sendall(payload)
        while chunk := sock.recv(1 << 20):
            data += chunk
    return data


def _exchange(port: int, payload: bytes) -> tuple[list[tuple[int, int, int]], bytes]:
    """Sends `payload` raw on a new connection; the frames' headers it got back and the error text."""
    frames, text = [], b""
    data = _raw(port, payload)
    pos = 0
    while pos + bulk.HEADER.size <= len(data):
        kind, a, b = bulk.HEADER.unpack_from(data, pos)
        frames.append((kind, a, b))
        pos += bulk.HEADER.size
        if kind == bulk.FRAME_ERROR:
            text = data[pos : pos + b]
        pos += b
    return frames, text


async def _ticket(address: str) -> exchange_pb2.BulkTicket:
    client = ExchangeClient(address)
    try:
        return await client._stub.OpenBulk(exchange_pb2.BulkRequest())
    finally:
        await client.close()


def _hello(token: bytes, request: bytes) -> bytes:
    return bulk.MAGIC + token + bulk._LENGTH.pack(len(request)) + request


def test_a_ticket_opens_one_connection_and_an_unknown_token_gets_nothing() -> None:
    async def scenario() -> None:
        enc = _encoded()
        store = await _store(enc)
        async with serving_bulk(store, bulk=BulkServer(store)) as (address, server):
            assert server is not None
            ticket = await _ticket(address)
            assert ticket.port == server.port and len(ticket.token) == bulk.TOKEN_BYTES and not ticket.tls
            frames, _ = await asyncio.to_thread(_exchange, server.port, _hello(ticket.token, _request(enc)))
            assert [f[1] for f in frames] == list(range(enc.manifest.num_chunks))
            assert all(kind == bulk.FRAME_CHUNK for kind, _, _ in frames)
            for token in (ticket.token, bytes(32), b"\1" * 32):  # used once already, never issued
                frames, text = await asyncio.to_thread(_exchange, server.port, _hello(token, _request(enc)))
                assert frames == [(bulk.FRAME_ERROR, grpc.StatusCode.UNAUTHENTICATED.value[0], len(text))]
                assert b"ask OpenBulk" in text
            assert server.refused == {"UNAUTHENTICATED": 3}

    run(scenario)


def test_an_expired_ticket_is_refused() -> None:
    async def scenario() -> None:
        enc = _encoded()
        store = await _store(enc)
        async with serving_bulk(store, bulk=BulkServer(store, BulkConfig(ticket_ttl_s=0.05))) as (address, server):
            assert server is not None
            ticket = await _ticket(address)
            await asyncio.sleep(0.2)
            frames, text = await asyncio.to_thread(_exchange, server.port, _hello(ticket.token, _request(enc)))
            assert frames[0][:2] == (bulk.FRAME_ERROR, grpc.StatusCode.UNAUTHENTICATED.value[0]), text

    run(scenario)


def test_bad_requests_get_a_clear_error_frame_and_the_server_keeps_serving() -> None:
    async def scenario() -> None:
        enc = _encoded()
        store = await _store(enc)
        async with serving_bulk(store, bulk=BulkServer(store)) as (address, server):
            assert server is not None
            n = enc.manifest.num_chunks
            other = codec.encode(random_model(1, SIZES), round=4, site="a", tokens=1, chunk_size=CHUNK)
            cases = [
                (b"GET / HTTP/1.1\r\n\r\n" + bytes(40), grpc.StatusCode.INVALID_ARGUMENT, b"not a sitemesh bulk"),
                (None, grpc.StatusCode.INVALID_ARGUMENT, b"4096"),  # oversized: below
                (b"\xff" * 20, grpc.StatusCode.INVALID_ARGUMENT, b"not a FetchRequest"),
                (_request(other), grpc.StatusCode.NOT_FOUND, b"round 4"),
                (_request(enc, root=b"x" * 32), grpc.StatusCode.FAILED_PRECONDITION, b"root hash"),
                (_request(enc, 0, n + 1), grpc.StatusCode.OUT_OF_RANGE, b"outside"),
            ]
            for payload, code, words in cases:
                ticket = await _ticket(address)
                if payload is None:
                    raw = bulk.MAGIC + ticket.token + bulk._LENGTH.pack(bulk.MAX_REQUEST_BYTES + 1)
                elif payload.startswith(b"GET"):
                    raw = payload
                else:
                    raw = _hello(ticket.token, payload)
                frames, text = await asyncio.to_thread(_exchange, server.port, raw)
                assert frames == [(bulk.FRAME_ERROR, code.value[0], len(text))], (code, text)
                assert words in text, text
            # Our own out-of-range request is refused at once over the bulk plane too, not retried.
            client = ExchangeClient(address)

            async def sink(i: int, data: memoryview) -> None:
                pass

            with pytest.raises(FetchError, match="OUT_OF_RANGE"):
                await fetch_chunks(enc.manifest, [client], sink, first=0, end=n + 1, policy=POLICY)
            dest = _dest(enc)
            stats = await fetch_into(enc.manifest, [client], dest, POLICY)
            assert _exact(dest, enc) and stats.attempts == 1
            await client.close()

    run(scenario)


def test_open_connections_are_bounded_and_idle_ones_dropped() -> None:
    async def scenario() -> None:
        enc = _encoded()
        store = await _store(enc)
        config = BulkConfig(max_connections=2, request_timeout_s=0.5)
        async with serving_bulk(store, bulk=BulkServer(store, config)) as (address, server):
            assert server is not None
            idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2)]
            await asyncio.sleep(0.1)
            frames, text = await asyncio.to_thread(_exchange, server.port, b"")
            assert frames == [(bulk.FRAME_ERROR, grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], len(text))]
            assert b"2 bulk connections are open" in text
            for sock in idle:  # the server drops them when no request came within request_timeout_s
                sock.settimeout(3)
                assert await asyncio.to_thread(sock.recv, 10) == b""
                sock.close()
            client = ExchangeClient(address)
            dest = _dest(enc)
            await fetch_into(enc.manifest, [client], dest, POLICY)
            assert _exact(dest, enc)
            await client.close()

    run(scenario)


def test_outstanding_tickets_are_bounded() -> None:
    async def scenario() -> None:
        store = await _store(_encoded())
        async with serving_bulk(store, bulk=BulkServer(store, BulkConfig(max_tickets=3))) as (address, _):
            for _ in range(3):
                await _ticket(address)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await _ticket(address)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "outstanding" in info.value.details()

    run(scenario)


class MisbehavingBulk(BulkServer):
    """Streams one bad response (mode) on its first connection, then behaves."""

    mode = ""

    def __init__(self, store: ExchangeStore) -> None:
        super().__init__(store)
        self.calls = 0

    def _stream(self, sock: socket.socket, encoded: codec.Encoded, first: int, end: int) -> None:
        self.calls += 1
        if self.calls > 1:
            return super()._stream(sock, encoded, first, end)
        chunk = [bytes(codec.as_memoryview(encoded.chunk(i))) for i in (first, first + 1)]
        frame = [bulk.HEADER.pack(bulk.FRAME_CHUNK, first + k, len(c)) + c for k, c in enumerate(chunk)]
        short = bulk.HEADER.pack(bulk.FRAME_CHUNK, first, len(chunk[0]) - 4) + chunk[0][:-4]
        corrupt = bulk.HEADER.pack(bulk.FRAME_CHUNK, first, len(chunk[0])) + b"\0" + chunk[0][1:]
        if self.mode == "trickle":  # a byte at a time, never silent for long: a per-read timeout never fires
            for byte in frame[0]:
                sock.sendall(bytes([byte]))
                time.sleep(0.02)
            return None
        sock.sendall({
            "duplicate": frame[0] + frame[0],
            "reorder": frame[1] + frame[0],
            "truncate": frame[0],
            "cut_inside": frame[0][: len(frame[0]) // 2],
            "short": short,
            "corrupt": corrupt,
            "unknown_kind": bulk.HEADER.pack(7, 0, 0),
            "huge_length": bulk.HEADER.pack(bulk.FRAME_CHUNK, first, 0xFFFF_FFF0),  # refused before any allocation
        }[self.mode])


@pytest.mark.parametrize("mode, counter", [
    ("duplicate", "misplaced_chunks"), ("reorder", "misplaced_chunks"), ("unknown_kind", "misplaced_chunks"),
    ("truncate", "truncated_streams"), ("cut_inside", "truncated_streams"),
    ("short", "corrupt_chunks"), ("corrupt", "corrupt_chunks"), ("huge_length", "corrupt_chunks"),
    ("trickle", "stalls"),
])  # fmt: skip
@pytest.mark.parametrize("wire", WIRES)
def test_misbehaving_bulk_stream_is_detected_counted_and_recovered(mode: str, counter: str,
                                                                  wire: codec.WireDtype) -> None:
    async def scenario() -> None:
        enc = _encoded(wire)
        store = await _store(enc)
        server = type(f"Misbehaving_{mode}", (MisbehavingBulk,), {"mode": mode})(store)
        async with serving_bulk(store, bulk=server) as (address, _):
            client = ExchangeClient(address)
            dest = _dest(enc)
            stats = await fetch_into(enc.manifest, [client], dest, POLICY)
            await client.close()
        assert _exact(dest, enc)
        assert getattr(stats, counter) == 1 and server.calls == 2
        assert stats.chunks == enc.manifest.num_chunks

    run(scenario)


def test_a_source_whose_bytes_never_match_ends_in_a_clear_error_and_nothing_is_delivered() -> None:
    async def scenario() -> None:
        enc = _encoded()
        tampered = codec.Encoded(enc.manifest, enc.data.clone())
        tampered.data[5] ^= 0xFF  # chunk 0 is corrupt on every connection: a broken holder, not a flaky link
        store = await _store(tampered)
        async with serving(store) as address:
            client = ExchangeClient(address)
            got: list[int] = []

            async def sink(i: int, data: memoryview) -> None:
                got.append(i)

            with pytest.raises(FetchError, match="gave up at chunk 0 .* chunk 0 hash mismatch"):
                await fetch_chunks(enc.manifest, [client], sink, policy=POLICY)
            await client.close()
            assert got == [], "a chunk that failed its hash reached the sink"

    run(scenario)


@pytest.mark.parametrize("dest_dtype", [torch.float32, torch.bfloat16])  # bf16: received in place
def test_non_finite_values_are_refused_over_the_bulk_plane_without_retrying(dest_dtype: torch.dtype) -> None:
    async def scenario() -> None:
        enc = codec.encode({"w": torch.ones(64)}, round=1, site="a", tokens=1, chunk_size=32)
        enc.data.view(torch.bfloat16)[40] = float("inf")
        enc = rehashed(enc)
        store = await _store(enc)
        async with serving(store) as address:
            client = ExchangeClient(address)
            with pytest.raises(codec.NonFiniteError, match="chunk 2"):
                await fetch_into(enc.manifest, [client], {"w": torch.empty(64, dtype=dest_dtype)}, POLICY)
            await client.close()

    run(scenario)


def test_a_peer_without_a_bulk_plane_is_fetched_from_over_grpc_and_the_log_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        enc = _encoded()
        store = await _store(enc)
        async with serving(store, bulk=False) as address:
            client = ExchangeClient(address)
            dest = _dest(enc)
            stats = await fetch_into(enc.manifest, [client], dest, POLICY)
            assert _exact(dest, enc) and stats.attempts == 1 and client.plane == "grpc"
            await client.close()

    with caplog.at_level(logging.INFO, logger="sitemesh.exchange"):
        run(scenario)
    assert any("offers no bulk data plane" in r.getMessage() and "FAILED_PRECONDITION" in r.getMessage()
               for r in caplog.records)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Credentials, Credentials, Credentials]:
    """Two sites of one run, and a site of another run (an outsider with a valid-looking certificate)."""
    ours, theirs = tmp_path_factory.mktemp("ours"), tmp_path_factory.mktemp("theirs")
    run_id = make_run("bulk", ours, ["a", "b"])
    make_run("other", theirs, ["b"])

    def creds(d: Path, name: str) -> Credentials:
        return dataclasses.replace(Credentials.from_dir(d, name), run_id=run_id)

    return creds(ours, "a"), creds(ours, "b"), creds(theirs, "b")


def test_under_mutual_tls_the_bulk_plane_is_tls_and_outsiders_read_nothing(
    tls: tuple[Credentials, Credentials, Credentials],
) -> None:
    server_creds, client_creds, outsider = tls

    async def scenario() -> None:
        enc = _encoded()
        store = await _store(enc)
        async with serving_bulk(store, bulk=BulkServer(store, creds=server_creds), creds=server_creds) as (
            address, server,
        ):  # fmt: skip
            assert server is not None
            address = address.replace("127.0.0.1", "localhost")  # the certificates name localhost
            client = ExchangeClient(address, client_creds)
            dest = _dest(enc)
            stats = await fetch_into(enc.manifest, [client], dest, POLICY)
            assert _exact(dest, enc) and stats.attempts == 1 and client.plane == "bulk"
            ticket = await client._stub.OpenBulk(exchange_pb2.BulkRequest())
            assert ticket.tls
            # A valid token over plain TCP: the server expects a TLS handshake and sends no chunk.
            data = await asyncio.to_thread(_raw, server.port, _hello(ticket.token, _request(enc)))
            assert len(data) < 100 and bytes(codec.as_memoryview(enc.chunk(0)))[:32] not in data
            # A certificate of another run's CA: the handshake fails, before any token is read.
            ticket = await client._stub.OpenBulk(exchange_pb2.BulkRequest())
            with pytest.raises((ssl.SSLError, ConnectionError)):
                target = bulk.BulkTarget("localhost", server.port, ticket.token, tls_context.client_tls(outsider))
                sock = await asyncio.to_thread(bulk.connect, target, exchange_pb2.FetchRequest.FromString(
                    _request(enc)), 5.0)
                await asyncio.to_thread(sock.recv, 1)  # TLS 1.3: the server's refusal arrives on the first read
            await client.close()

    run(scenario)


def _trickle(port: int, first: bytes, then: bytes, period_s: float = 0.3, give_up_s: float = 6.0) -> float:
    """Sends `first`, then `then` one byte every `period_s`: seconds until the server had closed the
    connection (a send fails), or infinity if it still stood after `give_up_s`."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(first)
        for byte in then:
            time.sleep(period_s)
            try:
                sock.send(bytes([byte]))
            except OSError:  # the reset answering a byte sent after the server closed
                return time.monotonic() - start
            if time.monotonic() - start > give_up_s:
                break
    return float("inf")


@pytest.mark.parametrize("stage", ["request", "handshake", "refusal"])
def test_a_trickling_connection_is_dropped_at_the_request_deadline(
    stage: str, tls: tuple[Credentials, Credentials, Credentials],
) -> None:
    """One byte every 0.3 s against a 0.5 s deadline: a timeout per read would never fire."""
    creds = tls[0] if stage == "handshake" else PLAINTEXT

    async def scenario() -> None:
        enc = _encoded()
        store = await _store(enc)
        server = BulkServer(store, BulkConfig(request_timeout_s=0.5), creds)
        async with serving_bulk(store, bulk=server, creds=creds):
            hello = _hello(bytes(32), _request(enc))
            first, then = {
                "request": (b"", hello),
                "handshake": (b"", b"\x16\x03\x01\x02\x00" + bytes(512)),  # a TLS record that never ends
                "refusal": (hello, bytes(1000)),  # refused at once; then the drain must not last
            }[stage]
            took = await asyncio.to_thread(_trickle, server.port, first, then)
            assert took < 3.0, f"the connection stood {took} s against a 0.5 s deadline"
            assert server.refused == ({"UNAUTHENTICATED": 1} if stage == "refusal" else {})

    run(scenario)


@pytest.mark.parametrize("secure", [False, True])
def test_close_drops_open_connections_plain_and_tls(
    secure: bool, tls: tuple[Credentials, Credentials, Credentials],
) -> None:
    server_creds, client_creds, _ = tls

    async def scenario() -> None:
        store = await _store(_encoded())
        config = BulkConfig(request_timeout_s=30.0)
        creds = server_creds if secure else PLAINTEXT
        server = BulkServer(store, config, creds)
        async with serving_bulk(store, bulk=server, creds=creds):
            raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            sock = tls_context.client_tls(client_creds).wrap_socket(raw, server_hostname="localhost") if secure else raw
            await asyncio.sleep(0.2)  # the server waits for the request now
            start = time.monotonic()
            server.close()

            def ends() -> bytes:
                with contextlib.suppress(ConnectionError, ssl.SSLError):
                    return sock.recv(10)
                return b""

            assert await asyncio.to_thread(ends) == b""
            assert time.monotonic() - start < 3.0, "close() left the connection open until its deadline"
            sock.close()
            with pytest.raises(OSError):  # the listener is gone
                socket.create_connection(("127.0.0.1", server.port), timeout=2).close()

    run(scenario)


def test_a_failed_accept_does_not_stop_the_listener(caplog: pytest.LogCaptureFixture) -> None:
    """Out of descriptors for a moment (a real EMFILE from accept()): the listener serves again after."""
    import resource

    async def scenario() -> None:
        enc = _encoded()
        store = await _store(enc)
        async with serving_bulk(store, bulk=BulkServer(store)) as (address, server):
            assert server is not None
            sock = socket.socket()
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            lowest_free = os.dup(0)
            os.close(lowest_free)
            resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # no new descriptor
            filler: list[int] = []  # and none freed meanwhile below the limit (gRPC closes lazily)
            try:
                with contextlib.suppress(OSError):
                    while True:
                        filler.append(os.dup(0))
                sock.connect(("127.0.0.1", server.port))  # accept() fails with EMFILE now
                await asyncio.sleep(0.3)
            finally:
                for fd in filler:
                    os.close(fd)
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

            sock.close()
            ticket = await _ticket(address)  # a connection after the failure is served
            frames, _ = await asyncio.to_thread(_exchange, server.port, _hello(ticket.token, _request(enc)))
            assert [f[:2] for f in frames] == [(bulk.FRAME_CHUNK, i) for i in range(enc.manifest.num_chunks)]

    with caplog.at_level(logging.INFO, logger="sitemesh.exchange"):
        run(scenario)
    assert any("accept failed" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]


@pytest.mark.skipif(not socket.has_dualstack_ipv6(), reason="no dual-stack IPv6 here")
def test_a_listener_on_all_ipv6_interfaces_takes_ipv4_too() -> None:
    async def scenario() -> None:
        enc = _encoded()
        store = await _store(enc)
        async with serving_bulk(store, bulk=BulkServer(store, BulkConfig(host="::"))) as (address, server):
            client = ExchangeClient(address)  # 127.0.0.1: IPv4
            dest = _dest(enc)
            stats = await fetch_into(enc.manifest, [client], dest, POLICY)
            assert _exact(dest, enc) and stats.attempts == 1 and client.plane == "bulk"
            await client.close()

    run(scenario)


class Trickling(BulkServer):
    """Sends every connection its chunks a few bytes at a time, never silent for long."""

    def _stream(self, sock: socket.socket, encoded: codec.Encoded, first: int, end: int) -> None:
        data = bulk.HEADER.pack(bulk.FRAME_CHUNK, first, len(encoded.chunk(first))) + bytes(
            codec.as_memoryview(encoded.chunk(first)))
        for k in range(0, len(data), 16):
            sock.sendall(data[k : k + 16])
            time.sleep(0.02)


def test_a_trickling_bulk_sender_is_given_up_at_the_fetch_deadline() -> None:
    async def scenario() -> None:
        enc = _encoded()
        store = await _store(enc)
        policy = FetchPolicy(stall_s=10.0, max_failures=4, deadline_s=1.0, backoff_initial_s=0.01, backoff_max_s=0.1)
        async with serving_bulk(store, bulk=Trickling(store)) as (address, _):
            client = ExchangeClient(address)
            start = time.monotonic()
            with pytest.raises(FetchError, match="the fetch deadline passed at chunk 0"):
                await fetch_into(enc.manifest, [client], _dest(enc), policy)
            assert time.monotonic() - start < 4.0, "the bulk attempt outlived the fetch deadline"
            assert client.plane == "bulk"  # bytes came: the plane is reachable
            await client.close()

    run(scenario)


def test_an_unreachable_bulk_port_falls_back_to_grpc_after_two_misses_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A firewalled port, or NAT: OpenBulk answers, its port does not."""
    async def scenario() -> None:
        enc = _encoded()
        store = await _store(enc)
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            nowhere = f"127.0.0.1:{closed.getsockname()[1]}"  # nothing listens there once closed
        async with serving(store) as address:
            client = ExchangeClient(address, bulk_address=nowhere)
            dest = _dest(enc)
            stats = await fetch_into(enc.manifest, [client], dest, POLICY)
            assert _exact(dest, enc) and client.plane == "grpc"
            assert stats.attempts == 3 and stats.transport_errors == 2
            stats = await fetch_into(enc.manifest, [client], _dest(enc), POLICY)
            assert stats.attempts == 1
            await client.close()

    with caplog.at_level(logging.INFO, logger="sitemesh.exchange"):
        run(scenario)
    said = [r.getMessage() for r in caplog.records if "cannot be reached" in r.getMessage()]
    assert len(said) == 1 and "ConnectionRefusedError" in said[0], said


def test_a_cancelled_bulk_fetch_returns_only_once_its_sink_is_done() -> None:
    """The receiving thread may be inside an InThread sink (writing the destination) when the fetch
    is cancelled: the cancelled fetch must not return before it is out, nor may the sink run after."""
    async def scenario() -> None:
        enc = _encoded()
        store = await _store(enc)
        entered = threading.Event()
        inside, calls = [False], [0]

        def slow(index: int, data: memoryview) -> None:
            inside[0] = True
            calls[0] += 1
            entered.set()
            time.sleep(0.3)
            inside[0] = False

        async with serving(store) as address:
            client = ExchangeClient(address)
            task = asyncio.create_task(fetch_chunks(enc.manifest, [client], InThread(slow), policy=POLICY))
            assert await asyncio.to_thread(entered.wait, 10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not inside[0], "the cancelled fetch returned while its sink still ran"
            seen = calls[0]
            await asyncio.sleep(0.5)
            assert calls[0] == seen
            await client.close()

    run(scenario)


def test_a_fetch_cancelled_twice_while_its_sink_finishes_leaves_no_unretrieved_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sink that must finish what it started (a reducer's window) outlives the first cancel; a
    second cancel (a stopping node) lands while the fetch waits for it. The receiving thread then
    ends with the sink's CancelledError, which nobody awaits any more: it must not be left to the
    garbage collector to log as "Future exception was never retrieved" (CI saw exactly that)."""
    import gc

    async def scenario() -> None:
        enc = _encoded()
        store = await _store(enc)
        entered, first_cancel = asyncio.Event(), asyncio.Event()
        finished = [False]

        async def finishing(index: int, data: memoryview) -> None:
            entered.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                first_cancel.set()
                await asyncio.shield(asyncio.sleep(0.3))  # finishes its window, then gives up
                raise
            finally:
                finished[0] = True

        async with serving(store) as address:
            client = ExchangeClient(address)
            task = asyncio.create_task(fetch_chunks(enc.manifest, [client], finishing, policy=POLICY))
            await asyncio.wait_for(entered.wait(), 10)
            assert any(t.name.startswith("bulk-fetch-") for t in threading.enumerate()), "not on the bulk plane"
            task.cancel()
            await asyncio.wait_for(first_cancel.wait(), 10)
            await asyncio.sleep(0.05)  # the fetch now waits for the thread, which waits for the sink
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert finished[0], "the twice-cancelled fetch returned while its sink still ran"
            await asyncio.sleep(0.1)
            await client.close()
        gc.collect()

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        run(scenario)
        gc.collect()
    left = [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]
    assert not left, left


def test_the_private_key_is_loaded_without_a_temporary_file(
    tls: tuple[Credentials, Credentials, Credentials], monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tempfile

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the private key was written to a temporary file")

    monkeypatch.setattr(tempfile, "TemporaryDirectory", refuse)
    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refuse)
    assert tls_context.server_tls(tls[0]).verify_mode == ssl.CERT_REQUIRED
    tls_context.client_tls(tls[1])


def test_the_ticket_is_asked_for_beside_the_manifests_long_poll_and_used_by_the_fetch() -> None:
    """An exchange phase fetches a manifest, then its chunks: were the bulk ticket asked for only
    then, every phase would pay one more round trip (100 ms on a WAN link) before its first byte."""
    async def scenario() -> None:
        enc = _encoded()
        store = ExchangeStore()
        server = BulkServer(store)
        async with serving_bulk(store, bulk=server) as (address, _):
            client = ExchangeClient(address)
            manifest = asyncio.create_task(fetch_manifest(enc.manifest.key, [client], 10.0, POLICY))
            # The object is not published yet: the manifest's long poll waits, the ticket does not.
            for _ in range(200):
                if server._tickets:
                    break
                await asyncio.sleep(0.01)
            assert len(server._tickets) == 1 and not manifest.done()
            await store.publish(enc)
            dest = _dest(enc)
            stats = await fetch_into(await manifest, [client], dest, POLICY)
            assert _exact(dest, enc) and stats.attempts == 1
            assert not server._tickets, "the fetch asked for a ticket of its own; the prefetched one is unused"
            # Stale (asked for longer ago than half its ttl): a fresh one is asked for instead.
            client.prefetch_ticket()
            assert client._spare is not None
            client._spare = (client._spare[0] - 16.0, client._spare[1])
            stats = await fetch_into(enc.manifest, [client], _dest(enc), POLICY)
            assert stats.attempts == 1 and len(server._tickets) == 1  # the stale one, never used
            await client.close()

    run(scenario)
