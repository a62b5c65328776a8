"""Held-open streams and slow-loris clients are bounded in count and in time, and announced
manifests in count, while health, status and honest peers keep being served
(peer/transport/limits.py, the server options in peer/transport/channels.py, peer/exchange/store.py).

The stream test runs a peer's real gRPC server (`channels.new_server`, mutual TLS, the guard, the
exchange servicer) in this process, so it can hold a large object without a trainer; the slow-loris
test probes a real `peer serve` process with raw TCP sockets.

    .venv/bin/python -m pytest -q tests/integration/test_stream_bounds.py
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ops.certs import make_run
from peer.exchange import codec, protoconv
from peer.exchange.service import add_exchange_service
from peer.exchange.store import MAX_ANNOUNCED_PER_SITE, ExchangeStore
from peer.gen.sitemesh.v1 import exchange_pb2, exchange_pb2_grpc
from peer.transport.channels import (HANDSHAKE_TIMEOUT_MS, Credentials, bind, channel_options, new_server,
                                     open_channel)
from peer.transport.guard import site_security
from peer.transport.limits import CallLimiter, CallLimits
from tests.integration.peers import Cluster

LIMITS = CallLimits(per_caller=16, total=40, max_call_s=8.0)


async def _serve(certs: Path) -> tuple[grpc.aio.Server, str, CallLimiter, codec.Encoded]:
    creds, guard = site_security(certs, "a", "test")
    limiter = CallLimiter(LIMITS)
    server = new_server((guard,), limiter)
    store = ExchangeStore()
    # 32 MB: far more than HTTP/2 flow control lets through to a client that reads nothing.
    held = codec.encode({"w": torch.ones(16 * 2**20)}, round=1, site="a", tokens=1)
    await store.publish(held)
    add_exchange_service(server, store)
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = bind(server, "127.0.0.1:0", creds)
    await server.start()
    return server, f"127.0.0.1:{port}", limiter, held


def _unreading_channel(address: str, creds: Credentials) -> grpc.aio.Channel:
    """A client channel whose receive windows stay at HTTP/2's 64 KiB. With gRPC's BDP probing on,
    a loaded machine grows them until the client's transport buffers a whole 32 MB stream the test
    never reads, the server's handler then ends normally, and the stream was never held (seen: 8 of
    40 calls, on 2 cores with 2 busy loops beside)."""
    return grpc.aio.secure_channel(address, creds.client(),
                                   options=channel_options(creds) + [("grpc.http2.bdp_probe", 0)])


def _fetch(stub: exchange_pb2_grpc.ExchangeStub, held: codec.Encoded) -> grpc.aio.UnaryStreamCall:
    m = held.manifest
    return stub.FetchChunks(exchange_pb2.FetchRequest(key=protoconv.key_to_proto(m.key), root_hash=m.root_hash,
                                                      first_chunk=0, end_chunk=m.num_chunks))


async def _settle(calls: list[grpc.aio.UnaryStreamCall], finished: int) -> tuple[list, list]:
    """(the calls that end within a few seconds, the ones still running); `finished` must end."""
    codes = {asyncio.ensure_future(c.code()): c for c in calls}
    pending, ended = set(codes), []
    while len(ended) < finished:
        done, pending = await asyncio.wait(pending, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        assert done, f"only {len(ended)} of {finished} calls ended"
        ended += [codes[f] for f in done]
    assert len(ended) == finished, (len(ended), finished)
    for f in pending:
        f.cancel()
    return ended, [c for c in calls if c not in ended]


def test_held_open_streams_are_bounded_per_caller_in_total_and_in_time(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    make_run("test", certs, ["a", "b", "d", "e", "f"])

    async def scenario() -> None:
        server, address, limiter, held = await _serve(certs)
        channels = {s: _unreading_channel(address, Credentials.from_dir(certs, s)) for s in ("b", "d", "e", "f")}
        try:
            # d opens 500 chunk streams and reads none of them: 16 run, the rest are refused at once.
            d = exchange_pb2_grpc.ExchangeStub(channels["d"])
            streams = [_fetch(d, held) for _ in range(500)]
            refused, holding = await _settle(streams, 484)
            # Refused by the limiter, or (streams past 256 on one connection) by HTTP/2 itself.
            reasons = {await s.details() for s in refused}
            assert reasons <= {"d has 16 calls open, the most one caller may have here: retry when some have finished",
                               "Stream removed (RST_STREAM (Received RST_STREAM with error code 7))"}, reasons
            assert {await s.code() for s in refused} <= {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE}
            assert limiter.refused[("/sitemesh.v1.Exchange/FetchChunks", "d")] >= 500 - 256
            assert limiter.open == {"d": LIMITS.per_caller}
            # e and f fill what is left of the total; the rest of f's calls are refused for the total.
            more = [_fetch(exchange_pb2_grpc.ExchangeStub(channels[s]), held) for s in ("e", "f") for _ in range(16)]
            late, more_holding = await _settle(more, 8)
            assert {await s.code() for s in late} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
            assert "40 calls are open, the most this peer runs at once" in await late[0].details()
            # Health answers under that load.
            health_stub = health_pb2_grpc.HealthStub(channels["b"])
            reply = await health_stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            # The server ends every held call at max_call_s (their status waits behind the chunks
            # the client never read, so it is the server's count that shows it).
            started = time.monotonic()
            while limiter.open and time.monotonic() - started < LIMITS.max_call_s + 2:
                await asyncio.sleep(0.1)
            assert not limiter.open and limiter.timed_out == 40, (limiter.open, limiter.timed_out)
            for call in holding + more_holding:
                call.cancel()
            # b is served in full.
            b = exchange_pb2_grpc.ExchangeStub(channels["b"])
            chunks = [c async for c in _fetch(b, held)]
            assert len(chunks) == held.manifest.num_chunks
        finally:
            for channel in channels.values():
                await channel.close()
            await server.stop(0)

    asyncio.run(scenario())


@pytest.fixture
def tls(tmp_path: Path):
    c = Cluster(tmp_path, tls=True)
    yield c
    c.close()


def test_slow_loris_connections_are_dropped_and_the_peer_keeps_serving(tls: Cluster) -> None:
    a = tls.start("a")
    host, port = a.address.rsplit(":", 1)
    socks = []
    for i in range(100):
        s = socket.create_connection((host, int(port)), timeout=5)
        # Half of them start a TLS record (a handshake message header) and never finish it, the
        # others send nothing at all.
        if i % 2:
            s.sendall(b"\x16\x03\x01")
        socks.append(s)
    started = time.monotonic()
    assert tls.status(a.address)["self"] == "a"  # served at once, beside the 100 stalled connections
    assert time.monotonic() - started < 5
    limit_s = HANDSHAKE_TIMEOUT_MS / 1000 + 5
    for s in socks:
        s.settimeout(max(limit_s - (time.monotonic() - started), 0.1))
        try:
            closed = s.recv(1) == b""
        except ConnectionResetError:
            closed = True
        except TimeoutError:
            closed = False
        s.close()
        assert closed, f"a stalled connection was still open {time.monotonic() - started:.1f} s later"
    assert tls.status(a.address)["self"] == "a"


def test_announcements_held_are_bounded_per_site(tmp_path: Path) -> None:
    """A site announcing round after future round (nothing would ever drop them) is refused past
    MAX_ANNOUNCED_PER_SITE; another site's announcement is still taken."""
    certs = tmp_path / "certs"
    make_run("test", certs, ["a", "b", "d"])

    def manifest(site: str, round_: int) -> exchange_pb2.Manifest:
        enc = codec.encode({"w": torch.ones(8)}, round=round_, site=site, tokens=1, chunk_size=16)
        return protoconv.manifest_to_proto(enc.manifest)

    async def scenario() -> None:
        server, address, _, _ = await _serve(certs)
        channels = {s: open_channel(address, Credentials.from_dir(certs, s)) for s in ("b", "d")}
        try:
            d = exchange_pb2_grpc.ExchangeStub(channels["d"])
            for round_ in range(1, MAX_ANNOUNCED_PER_SITE + 1):
                await d.Announce(manifest("d", 10**6 + round_), timeout=5)
            await d.Announce(manifest("d", 10**6 + 1), timeout=5)  # the same key again: held already
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await d.Announce(manifest("d", 1), timeout=5)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f"d has {MAX_ANNOUNCED_PER_SITE} announcements held here" in (err.value.details() or "")
            await exchange_pb2_grpc.ExchangeStub(channels["b"]).Announce(manifest("b", 1), timeout=5)
        finally:
            for channel in channels.values():
                await channel.close()
            await server.stop(0)

    asyncio.run(scenario())
