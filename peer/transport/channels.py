"""The one place where gRPC channels and server ports are opened.

Every client (peer-to-peer transport, `ops`, the exchange) calls `open_channel`, every server calls
`bind`, so mutual TLS (a `Credentials` from `ops certs`) is decided here and nowhere in the
protocol code. Who may call what over those channels is peer/transport/guard.py's business; who
may hold how many connections, peer/transport/front.py's, whose listener `bind` opens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from peer.transport.dialer import Dialer, Egress
from peer.transport.front import Front, FrontedServer, SlotKeeper
from peer.transport.intercept import SafeDecode
from peer.transport.limits import CallLimiter
from peer.transport.slots import SlotLimits

# Chunked transfers keep messages far below this; it is a guard against garbage, not a tuning knob.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024

_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # WAN links (100-150 ms RTT) and idle periods between rounds: keep connections warm, but
    # not so aggressively that a paused peer's connection is torn down under it.
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Each channel its own TCP connection: with gRPC's global pool a channel opened to escape a
    # wedged connection (ExchangeClient.reconnect) would share that very connection.
    ("grpc.use_local_subchannel_pool", 1),
    # Proxies are the dialer's business (peer/transport/dialer.py reads https_proxy and no_proxy
    # itself): gRPC's own reading of the environment would send relayed and loopback-forwarded
    # connections to the proxy too.
    ("grpc.enable_http_proxy", 0),
]


@dataclass(frozen=True)
class Credentials:
    """Transport security: mutual TLS against the run CA, or plaintext (`--insecure`, unit tests).

    `cert`/`key` are this process's own certificate (a site's, or an operator's for `ops`), `ca`
    the run CA every peer's certificate must chain to (ops/certs.py makes all three).
    """

    ca: bytes = b""
    cert: bytes = b""
    key: bytes = b""
    name: str = ""
    """Whose certificate this is (the file stem), for messages."""
    run_id: str = ""
    """The run this process belongs to, named to every peer it calls (`RUN_AGENT`); a peer's own
    (guard.site_security), empty for `ops` and other tools."""

    def __post_init__(self) -> None:
        if bool(self.ca) != bool(self.cert) or bool(self.cert) != bool(self.key):
            raise ValueError("TLS credentials need all of ca, cert and key (or none for plaintext)")

    @property
    def plaintext(self) -> bool:
        return not self.ca

    @classmethod
    def from_dir(cls, directory: Path, name: str) -> Credentials:
        """`ca.crt`, `NAME.crt` and `NAME.key` from `directory`; OSError naming the missing file."""
        paths = (directory / "ca.crt", directory / f"{name}.crt", directory / f"{name}.key")
        for path in paths:
            if not path.is_file():
                raise FileNotFoundError(
                    f"{path} does not exist: make it with `ops certs init` / `ops certs issue` (see README, Security)")
        ca, cert, key = (p.read_bytes() for p in paths)
        return cls(ca, cert, key, name)

    def server(self) -> grpc.ServerCredentials:
        # require_client_auth: a client without a certificate of this run's CA never gets a stream.
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca,
                                           require_client_auth=True)

    def client(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)


PLAINTEXT = Credentials()


RUN_AGENT = "sitemesh-run/"
"""The run id travels in the user agent of every call (`grpc.primary_user_agent`, which gRPC puts
before its own): set once per channel, it reaches every method, blocking and asyncio clients alike,
and a plaintext peer (`--insecure`) has nothing else to carry it (peer/transport/guard.py)."""


def run_named(user_agent: str) -> str | None:
    """The run id a caller's user agent names, or None (a tool such as grpcurl names none)."""
    first = user_agent.split(" ", 1)[0]
    return first.removeprefix(RUN_AGENT) if first.startswith(RUN_AGENT) else None


def channel_options(creds: Credentials = PLAINTEXT) -> list[tuple[str, int | str]]:
    options: list[tuple[str, int | str]] = list(_OPTIONS)
    if creds.run_id:
        options.append(("grpc.primary_user_agent", RUN_AGENT + creds.run_id))
    return options


_DEFAULT_DIALER: Dialer | None = None


def default_dialer() -> Dialer:
    """The process's dialer when none is given: the environment's proxy (`https_proxy`, `no_proxy`).
    A peer passes its own (its run file's proxy); tools such as `ops` use this one."""
    global _DEFAULT_DIALER
    if _DEFAULT_DIALER is None:
        _DEFAULT_DIALER = Dialer(Egress.from_env())
    return _DEFAULT_DIALER


def _dial(address: str, creds: Credentials, dialer: Dialer | None) -> tuple[str, list[tuple[str, int | str]]]:
    target, name = (dialer or default_dialer()).grpc_target(address)
    options = channel_options(creds)
    if name and not creds.plaintext:  # a forwarded connection: the certificate names the peer, not 127.0.0.1
        options.append(("grpc.ssl_target_name_override", name))
    return target, options


def open_channel(address: str, creds: Credentials = PLAINTEXT, dialer: Dialer | None = None) -> grpc.aio.Channel:
    """An asyncio channel to the peer at `address` (``host:port`` or a relayed address,
    peer/transport/route.py), opened the way `dialer` says (default: `default_dialer()`)."""
    target, options = _dial(address, creds, dialer)
    if creds.plaintext:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, creds.client(), options=options)


def open_blocking_channel(address: str, creds: Credentials = PLAINTEXT, dialer: Dialer | None = None) -> grpc.Channel:
    """A blocking channel, for command-line tools that make one call and exit."""
    target, options = _dial(address, creds, dialer)
    if creds.plaintext:
        return grpc.insecure_channel(target, options=options)
    return grpc.secure_channel(target, creds.client(), options=options)


HANDSHAKE_TIMEOUT_MS = 10_000
MAX_CONNECTIONS = SlotLimits().total + SlotLimits().pending_total
"""On gRPC's own socket, behind the front (peer/transport/front.py, which keeps `SlotLimits.total`):
the front's connections and those it let go of that gRPC has not seen close yet."""
MAX_STREAMS_PER_CONNECTION = 256

# Servers must accept the clients' keepalive pings, or gRPC's default policy (one ping per 5 min)
# answers them with GOAWAY "too_many_pings" and tears down connections mid-transfer.
_SERVER_OPTIONS: list[tuple[str, int | str]] = [
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 1_000),
    ("grpc.http2.max_ping_strikes", 0),
    # Off, so a second peer cannot bind a running peer's port beside it and take its connections.
    ("grpc.so_reuseport", 0),
    # Bounds on what a client holds without finishing anything (docs/decisions/security-stream-bounds.md).
    # A TLS handshake (and the HTTP/2 preface) not done in 10 s is dropped: a WAN handshake takes
    # one or two 150 ms round trips, a slow-loris client that sends a byte now and then takes forever.
    ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
    # Connections at once, open or handshaking: the front bounds them per identity and address
    # (peer/transport/slots.py); this is a backstop on the private socket it relays them to.
    ("grpc.max_allowed_incoming_connections", MAX_CONNECTIONS),
    # HTTP/2 streams open at once on one connection (gRPC's default is unlimited); peer/transport/
    # limits.py bounds the calls each caller runs over all its connections.
    ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
]


def new_server(interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
               limiter: CallLimiter | None = None, slots: SlotLimits = SlotLimits()) -> grpc.aio.Server:
    """A server whose every method refuses unparsable requests with INVALID_ARGUMENT (SafeDecode) and
    calls over the limiter's bounds (default `CallLimits()`, peer/transport/limits.py) with
    RESOURCE_EXHAUSTED before `interceptors` (e.g. peer/transport/guard.py) and the servicer see them.

    Its addresses (`bind`) are a front's (peer/transport/front.py), which keeps connections within
    `slots` per identity and address; gRPC closes those with no call open for `slots.idle_s`."""
    front = Front(slots)
    options = channel_options() + _SERVER_OPTIONS + [("grpc.max_connection_idle_ms", int(slots.idle_s * 1000))]
    server = grpc.aio.server(options=options,
                             interceptors=(SlotKeeper(front), SafeDecode(), limiter or CallLimiter(), *interceptors))
    return FrontedServer(server, front)


def bind(server: grpc.aio.Server, address: str, creds: Credentials = PLAINTEXT) -> int:
    """Binds `address` (port 0 picks a free port) and returns the bound port.

    Raises OSError with a readable message when the port is taken or the address is malformed.
    """
    if isinstance(server, FrontedServer):
        return server.listen(address, None if creds.plaintext else creds.server())
    try:
        port = server.add_insecure_port(address) if creds.plaintext else server.add_secure_port(address, creds.server())
    except RuntimeError as err:  # grpc raises RuntimeError("Failed to bind to address ...")
        raise OSError(f"cannot listen on {address}: {err} (is the port in use?)") from err
    if port == 0:
        raise OSError(f"cannot listen on {address}: port in use or address not valid")
    return port


class ChannelPool:
    """One asyncio channel per peer address, shared by every service that talks to it."""

    def __init__(self, creds: Credentials = PLAINTEXT, dialer: Dialer | None = None) -> None:
        self._creds = creds
        self._dialer = dialer
        self._channels: dict[str, grpc.aio.Channel] = {}

    def get(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_channel(address, self._creds, self._dialer)
        return channel

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
