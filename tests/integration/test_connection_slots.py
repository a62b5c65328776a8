"""Connection slots: a reader, an operator or a client that never finishes TLS cannot take the
connections the sites need, and connections that do nothing are closed (peer/transport/slots.py,
peer/transport/front.py; docs/decisions/security-connection-slots.md).

The first test is issue 38's probe on real `peer serve` processes with mutual TLS; the others run
a peer's server (`channels.new_server`, the guard, health) in this process with short bounds, so
they can read the front's counts and take seconds, not minutes.

    .venv/bin/python -m pytest -q tests/integration/test_connection_slots.py
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ops.certs import issue, make_run
from peer.transport.channels import Credentials, bind, new_server, open_channel
from peer.transport.front import FrontedServer
from peer.transport.guard import site_security
from peer.transport.slots import SlotLimits
from tests.integration.peers import Cluster, wait_for

# The client's HTTP/2 connection preface and an empty SETTINGS frame: what a gRPC client sends
# first, after which it holds the connection without a call.
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


@pytest.fixture(autouse=True)
def _open_files() -> Iterator[None]:
    """Room for a few hundred sockets in this process whatever the soft limit was."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _tcp(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _idle_tls(address: str, certs: Path, name: str) -> ssl.SSLSocket:
    """A finished TLS handshake with `name`'s certificate and the HTTP/2 preface, then nothing."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(certs / "ca.crt")
    ctx.load_cert_chain(certs / f"{name}.crt", certs / f"{name}.key")
    ctx.set_alpn_protocols(["h2"])
    sock = ctx.wrap_socket(_tcp(address), server_hostname="127.0.0.1")
    sock.sendall(H2_PREFACE)
    return sock


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes `sock` within `seconds` (what it sends before, SETTINGS or a
    GOAWAY, is read and dropped)."""
    deadline = time.monotonic() + seconds
    try:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, ssl.SSLError, OSError) as err:
        return not isinstance(err, TimeoutError)
    return False


def _health(channel: grpc.Channel | grpc.aio.Channel) -> health_pb2_grpc.HealthStub:
    return health_pb2_grpc.HealthStub(channel)


@pytest.fixture
def tls(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, tls=True)
    yield c
    c.close()


def test_a_reader_and_unfinished_handshakes_do_not_keep_a_site_out(tls: Cluster) -> None:
    """Issue 38: 520 idle TLS connections of a reader, 20 more that each made a call, and 100 TCP
    connections that never start TLS, all held open against a: a new site still joins through a,
    and the operator still reads a's status."""
    a = tls.start("a")
    tls.start("b", join=[a.address])
    wait_for(lambda: len(tls.status(a.address)["members"]) == 2, 20, "b to join a")
    issue(tls.certs, "bob", "reader", tls.certs)
    held: list[socket.socket] = []
    for _ in range(520):
        try:
            held.append(_idle_tls(a.address, tls.certs, "bob"))
        except (ssl.SSLError, OSError):
            pass  # (with gRPC's one pool of connections, the ones past it are refused)
    held += [_tcp(a.address) for _ in range(100)]
    reader = Credentials.from_dir(tls.certs, "bob")
    channels = [grpc.secure_channel(a.address, reader.client()) for _ in range(20)]  # one connection each
    refused = []
    try:
        for channel in channels:
            try:
                _health(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            except grpc.RpcError as err:
                refused.append((err.code(), err.details()))
        c = tls.start("c", join=[a.address], extra=["--join-timeout", "15"])
        assert c.proc.stdout is not None
        line = c.proc.stdout.readline()  # "joined", or nothing when it gives up and exits
        assert line.startswith("peer c joined: 3 members"), f"c said {line!r}:\n{c.log()}"
        assert {m["site"]: m["state"] for m in tls.status(a.address)["members"]}["c"] == "alive"
        # A reader keeps 8 connections that made calls; the 9th and later are refused with the reason.
        assert len(refused) == 12, refused
        assert set(refused) == {(grpc.StatusCode.RESOURCE_EXHAUSTED, "reader bob holds 8 connections here, the most "
                                 "one operator or reader may: close some and retry")}, refused
        log = a.log()
        # Logged once per (cause, who), then only counted.
        assert log.count("127.0.0.1 has 16 connections that made no call yet") == 1, log[-3000:]
        assert log.count("reader bob holds 8 connections here") == 1, log[-3000:]
    finally:
        for sock in held:
            sock.close()
        for channel in channels:
            channel.close()


async def _serve(certs: Path, limits: SlotLimits) -> tuple[FrontedServer, str]:
    creds, guard = site_security(certs, "a", "test")
    server = new_server((guard,), slots=limits)
    assert isinstance(server, FrontedServer)
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = bind(server, "127.0.0.1:0", creds)
    await server.start()
    return server, f"127.0.0.1:{port}"


def test_idle_and_silent_connections_are_closed(tmp_path: Path) -> None:
    """A connection with no call open for idle_s is closed (the client's next call reconnects);
    one that makes no call within identify_s is closed, whether it finished TLS or not, long
    before gRPC's own 10 s handshake timeout."""
    certs = tmp_path / "certs"
    make_run("test", certs, ["a", "b"])
    limits = SlotLimits(idle_s=1.0, identify_s=2.0)

    async def scenario() -> None:
        server, address = await _serve(certs, limits)
        front = server.front
        channel = open_channel(address, Credentials.from_dir(certs, "b"))
        try:
            await _health(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert front.slots.holding() == {"pending": 0, "site": 1, "other": 0}
            started = time.monotonic()
            while front.slots.holding()["site"] and time.monotonic() - started < limits.idle_s + 3:
                await asyncio.sleep(0.05)
            assert front.slots.holding()["site"] == 0, "an idle site connection was still open"
            await _health(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)  # reconnects
            silent = await asyncio.to_thread(_tcp, address)
            idle_tls = await asyncio.to_thread(_idle_tls, address, certs, "b")
            for sock in (silent, idle_tls):
                assert await asyncio.to_thread(_closed_within, sock, limits.identify_s + 2), \
                    "a connection that made no call was still open"
                sock.close()
            # The silent one by the front; the TLS one by the front or, idle before, by gRPC.
            assert front.closed[("no call", "127.0.0.1")] >= 1
        finally:
            await channel.close()
            await server.stop(0)

    asyncio.run(scenario())


def test_connections_are_bounded_per_identity_and_address_and_sites_keep_their_share(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Readers and operators are bounded per identity and together; connections that made no call
    per address, the oldest giving way to the newest; a site connects and calls all along."""
    certs = tmp_path / "certs"
    make_run("test", certs, ["a", "b"], operators=("olga", "oscar"))
    issue(certs, "bob", "reader", certs)
    limits = SlotLimits(total=64, pending_total=24, pending_per_address=8, others_total=3, per_other=2)

    async def scenario() -> None:
        server, address = await _serve(certs, limits)
        front = server.front
        opened: list[grpc.aio.Channel] = []

        async def call(name: str) -> tuple[grpc.StatusCode, str]:
            channel = open_channel(address, Credentials.from_dir(certs, name))
            opened.append(channel)
            try:
                await _health(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            except grpc.aio.AioRpcError as err:
                return err.code(), err.details() or ""
            return grpc.StatusCode.OK, ""

        try:
            assert [await call("bob") for _ in range(3)] == [(grpc.StatusCode.OK, "")] * 2 + [
                (grpc.StatusCode.RESOURCE_EXHAUSTED,
                 "reader bob holds 2 connections here, the most one operator or reader may: close some and retry")]
            assert await call("olga") == (grpc.StatusCode.OK, "")
            assert await call("oscar") == (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "operators and readers hold 3 connections here, the most they may together (the rest is the "
                "sites'): close some and retry")
            # 20 connections that never call, from one address: the 12 oldest give way at once.
            silent = [await asyncio.to_thread(_tcp, address) for _ in range(20)]
            closed = await asyncio.gather(*(asyncio.to_thread(_closed_within, s, 1.0) for s in silent))
            assert closed == [True] * 12 + [False] * 8, closed
            # A site connects beside all of them (pushing out the oldest silent one) and calls.
            assert await call("b") == (grpc.StatusCode.OK, "")
            assert front.slots.holding() == {"pending": 7, "site": 1, "other": 3}
            assert front.closed[("pending per address", "127.0.0.1")] == 13
            assert front.closed[("per identity", "reader bob")] == 1
            for sock in silent:
                sock.close()
        finally:
            for channel in opened:
                await channel.close()
            await server.stop(0)

    with caplog.at_level(logging.WARNING, logger="sitemesh.front"):
        asyncio.run(scenario())
    pushed = [r for r in caplog.records if "connections that made no call yet" in r.getMessage()]
    assert len(pushed) == 1, [r.getMessage() for r in pushed]  # 13 closes, one line
