"""The one place where gRPC channels and server ports are opened.

Every client (peer-to-peer transport, `ops`, the exchange) calls `open_channel`, every server calls
`bind`, so switching on mutual TLS later is a change here (a `Credentials` with certificate paths)
and nowhere in the protocol code.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

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
]


@dataclass(frozen=True)
class Credentials:
    """Transport security for a run. Plaintext today (loopback, site-internal tunnels)."""

    plaintext: bool = True

    def __post_init__(self) -> None:
        if not self.plaintext:
            raise ValueError("TLS is not implemented yet: set plaintext = true (see docs/decisions/)")


PLAINTEXT = Credentials()


def channel_options() -> list[tuple[str, int]]:
    return list(_OPTIONS)


def open_channel(address: str, creds: Credentials = PLAINTEXT) -> grpc.aio.Channel:
    """An asyncio channel to `host:port`."""
    return grpc.aio.insecure_channel(address, options=channel_options())


def open_blocking_channel(address: str, creds: Credentials = PLAINTEXT) -> grpc.Channel:
    """A blocking channel, for command-line tools that make one call and exit."""
    return grpc.insecure_channel(address, options=channel_options())


# Servers must accept the clients' keepalive pings, or gRPC's default policy (one ping per 5 min)
# answers them with GOAWAY "too_many_pings" and tears down connections mid-transfer.
_SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 1_000),
    ("grpc.http2.max_ping_strikes", 0),
]


def new_server(creds: Credentials = PLAINTEXT) -> grpc.aio.Server:
    return grpc.aio.server(options=channel_options() + _SERVER_OPTIONS)


def bind(server: grpc.aio.Server, address: str, creds: Credentials = PLAINTEXT) -> int:
    """Binds `address` (port 0 picks a free port) and returns the bound port.

    Raises OSError with a readable message when the port is taken or the address is malformed.
    """
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as err:  # grpc raises RuntimeError("Failed to bind to address ...")
        raise OSError(f"cannot listen on {address}: {err} (is the port in use?)") from err
    if port == 0:
        raise OSError(f"cannot listen on {address}: port in use or address not valid")
    return port


class ChannelPool:
    """One asyncio channel per peer address, shared by every service that talks to it."""

    def __init__(self, creds: Credentials = PLAINTEXT) -> None:
        self._creds = creds
        self._channels: dict[str, grpc.aio.Channel] = {}

    def get(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_channel(address, self._creds)
        return channel

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
