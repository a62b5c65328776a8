"""A relay, an outbound site's tunnels and the dialer, in one process on real sockets with real TLS.

The site's "service" here is an echo server: the relay forwards bytes it never reads, so what
comes back is what went in. tests/integration/test_relay_mesh.py runs whole peers through relays.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from ops.certs import LOOPBACK, init_ca, issue, make_run
from peer.transport.channels import Credentials
from peer.transport.dialer import DialError, Dialer, Egress
from peer.transport.relay_server import RelayLimits, RelayServer
from peer.transport.route import Direct
from peer.transport.tunnel import TunnelAgent


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("certs")
    make_run("relaytest", out, ["lumi", "kit"])
    for relay in ("r1", "r2"):
        issue(out, relay, "relay", out, LOOPBACK)
    other = out / "other"
    init_ca("elsewhere", other)
    issue(other, "lumi", "site", other, LOOPBACK)
    return out


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


@asynccontextmanager
async def _echo_server() -> AsyncIterator[Direct]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    try:
        yield Direct("127.0.0.1", server.sockets[0].getsockname()[1])
    finally:
        server.close()


async def _relay(certs: Path, name: str = "r1", limits: RelayLimits = RelayLimits()) -> tuple[RelayServer, str]:
    relay = RelayServer(Credentials.from_dir(certs, name), limits)
    port = await relay.start("127.0.0.1", 0)
    return relay, f"127.0.0.1:{port}"


def _round_trip(dialer: Dialer, address: str, service: str, payload: bytes) -> bytes:
    with dialer.open(address, service) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        got = bytearray()
        while chunk := sock.recv(65536):
            got += chunk
    return bytes(got)


def _run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 60))


def test_bytes_reach_an_outbound_site_through_its_relay_unchanged(certs: Path) -> None:
    async def go() -> None:
        relay, at = await _relay(certs)
        async with _echo_server() as grpc_service, _echo_server() as bulk_service:
            agent = TunnelAgent("lumi", (at,), Credentials.from_dir(certs, "lumi"), Dialer(),
                                {"grpc": grpc_service, "bulk": bulk_service})
            agent.start()
            assert await agent.wait_up(10)
            assert relay.tunnels() == ["lumi"]
            payload = bytes(range(256)) * 4096  # 1 MiB: several splice reads, back-pressure on the way
            dialer = Dialer()
            for service in ("grpc", "bulk"):
                assert await asyncio.to_thread(_round_trip, dialer, f"relay://lumi@{at}", service, payload) == payload
            assert relay.stats.relayed == 2
            assert relay.stats.forwarded_bytes == 2 * 2 * len(payload)
            assert agent.states[at].relayed == 2
            await agent.close()
        await relay.close()

    _run(go)


def test_a_dead_relay_costs_one_refused_connection_then_the_next_carries_the_site(certs: Path) -> None:
    async def go() -> None:
        first, at1 = await _relay(certs, "r1")
        second, at2 = await _relay(certs, "r2")
        async with _echo_server() as service:
            agent = TunnelAgent("lumi", (at1, at2), Credentials.from_dir(certs, "lumi"), Dialer(), {"grpc": service})
            agent.start()
            assert await agent.wait_up(10)
            await asyncio.sleep(0.5)  # both tunnels up
            assert second.tunnels() == ["lumi"] and first.tunnels() == ["lumi"]
            dialer = Dialer()
            address = f"relay://lumi@{at1},{at2}"
            assert await asyncio.to_thread(_round_trip, dialer, address, "grpc", b"one") == b"one"
            assert dialer.path(address) == f"via relay {at1}"
            await first.close()  # the relay goes; the site's other tunnel stands
            assert await asyncio.to_thread(_round_trip, dialer, address, "grpc", b"two") == b"two"
            assert dialer.path(address) == f"via relay {at2}"
            assert second.stats.relayed == 1
            await agent.close()
        await second.close()

    _run(go)


def test_a_peer_that_relays_reaches_a_site_through_its_own_relay_first(certs: Path) -> None:
    """A direct site that also relays (`relay_listen`) dials a site tunnelled to it through itself,
    ahead of the relays the address names and never through its egress proxy; a site with no
    tunnel there goes by the named relays."""
    async def go() -> None:
        named, at1 = await _relay(certs, "r1")
        mine, at2 = await _relay(certs, "r2")
        async with _echo_server() as service:
            agent = TunnelAgent("lumi", (at1, at2), Credentials.from_dir(certs, "lumi"), Dialer(), {"grpc": service})
            agent.start()
            assert await agent.wait_up(10)
            while mine.local_route("lumi") is None or named.local_route("lumi") is None:
                await asyncio.sleep(0.05)
            dead = socket.create_server(("127.0.0.1", 0))  # a "proxy" that never answers a CONNECT
            dead_port = dead.getsockname()[1]
            dead.close()
            proxied = Dialer(Egress(proxy=Direct("127.0.0.1", dead_port), loopback_direct=False),
                             via_self=mine.local_route)
            address = f"relay://lumi@{at1}"  # names only the other relay, which the proxy cannot reach
            assert await asyncio.to_thread(_round_trip, proxied, address, "grpc", b"mine") == b"mine"
            assert (mine.stats.relayed, named.stats.relayed) == (1, 0)
            assert proxied.path(address) == "via this peer's relay"
            kit = TunnelAgent("kit", (at1,), Credentials.from_dir(certs, "kit"), Dialer(), {"grpc": service})
            kit.start()
            assert await kit.wait_up(10)
            plain = Dialer(via_self=mine.local_route)  # kit holds no tunnel at this peer's relay
            assert await asyncio.to_thread(_round_trip, plain, f"relay://kit@{at1}", "grpc", b"kit") == b"kit"
            assert (mine.stats.relayed, named.stats.relayed) == (1, 1)
            assert plain.path(f"relay://kit@{at1}") == f"via relay {at1}"
            await kit.close()
            await agent.close()
        await named.close()
        await mine.close()

    _run(go)


def test_no_tunnel_and_no_relay_are_errors_that_name_each_relay(certs: Path) -> None:
    async def go() -> None:
        relay, at = await _relay(certs)
        free = socket.socket()
        free.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{free.getsockname()[1]}"
        free.close()
        with pytest.raises(DialError) as err:
            await asyncio.to_thread(Dialer().open, f"relay://kit@{dead},{at}", "grpc")
        assert f"relay {dead}: " in str(err.value) and "503 no tunnel from site kit" in str(err.value)
        await relay.close()

    _run(go)


def _raw(at: str, data: bytes) -> bytes:
    host, port = at.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        got = bytearray()
        while chunk := sock.recv(4096):
            got += chunk
    return bytes(got)


def test_the_relay_refuses_malformed_and_oversized_requests_and_unknown_services(certs: Path) -> None:
    async def go() -> None:
        relay, at = await _relay(certs)
        assert (await asyncio.to_thread(_raw, at, b"GET / HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 400 expected CONNECT")
        assert b"unknown service 'ssh'" in await asyncio.to_thread(_raw, at, b"CONNECT lumi/ssh HTTP/1.1\r\n\r\n")
        # A header that never ends is cut at the reader's bound, answered with nothing.
        assert await asyncio.to_thread(_raw, at, b"CONNECT " + b"x" * 5000) == b""
        assert relay.stats.refused.get("bad request") == 1 and relay.stats.refused.get("bad service") == 1
        assert sum(relay.stats.refused.values()) == 3
        await relay.close()

    _run(go)


def test_a_relay_holds_tunnels_only_for_sites_of_its_run(certs: Path) -> None:
    async def go() -> None:
        relay, at = await _relay(certs)
        async with _echo_server() as service:
            # A relay certificate (any certificate not a site's) gets no tunnel: it cannot stand for a site.
            impostor = TunnelAgent("r2", (at,), Credentials.from_dir(certs, "r2"), Dialer(), {"grpc": service})
            impostor.start()
            assert not await impostor.wait_up(2)
            await impostor.close()
            assert relay.stats.refused.get("not a site", 0) >= 1
            # A site of another run fails the TLS handshake against this run's CA.
            stranger = TunnelAgent("lumi", (at,), Credentials.from_dir(certs / "other", "lumi"), Dialer(),
                                   {"grpc": service})
            stranger.start()
            assert not await stranger.wait_up(2)
            await stranger.close()
            assert relay.tunnels() == []
            assert stranger.states[at].why != "up"
        await relay.close()

    _run(go)


def test_connections_to_one_site_are_bounded(certs: Path) -> None:
    async def go() -> None:
        relay, at = await _relay(certs, limits=RelayLimits(per_tunnel=1))
        async with _echo_server() as service:
            agent = TunnelAgent("lumi", (at,), Credentials.from_dir(certs, "lumi"), Dialer(), {"grpc": service})
            agent.start()
            assert await agent.wait_up(10)
            dialer = Dialer()
            held = await asyncio.to_thread(dialer.open, f"relay://lumi@{at}", "grpc")
            with pytest.raises(DialError, match="503 1 connections to lumi open"):
                await asyncio.to_thread(dialer.open, f"relay://lumi@{at}", "grpc")
            held.close()
            await agent.close()
        await relay.close()

    _run(go)


def test_a_service_the_site_does_not_run_is_refused_at_once_and_the_tunnel_stands(certs: Path) -> None:
    async def go() -> None:
        relay, at = await _relay(certs)
        async with _echo_server() as service:  # a trainer-less site: gRPC, no bulk plane
            agent = TunnelAgent("lumi", (at,), Credentials.from_dir(certs, "lumi"), Dialer(), {"grpc": service})
            agent.start()
            assert await agent.wait_up(10)
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(DialError, match="503 site lumi: does not serve that service"):
                await asyncio.to_thread(Dialer().open, f"relay://lumi@{at}", "bulk")
            assert loop.time() - started < 5  # not the 10 s wait for a dial-back that never comes
            assert relay.tunnels() == ["lumi"] and agent.states[at].up
            assert await asyncio.to_thread(_round_trip, Dialer(), f"relay://lumi@{at}", "grpc", b"still") == b"still"
            await agent.close()
        await relay.close()

    _run(go)
