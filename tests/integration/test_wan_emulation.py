"""The WAN emulation (tests/support/netns.py) delays every TCP connection between site namespaces.

A connection to a port no one knew in advance (an echo server's ephemeral port, as the bulk data
plane's) must see at least the RTT and carry its bytes intact: the transparent redirect covers every
port, not a list. Needs root, `ip netns` and nftables; skipped with the reason otherwise.

    .venv/bin/python -m pytest tests/integration/test_wan_emulation.py -q
"""

from __future__ import annotations

import pytest

from tests.support import netns

RTT_S = 0.1


def test_ephemeral_port_sees_the_rtt_and_bytes_arrive_intact() -> None:
    why = netns.unavailable()
    if why is not None:
        pytest.skip(f"WAN emulation unavailable: {why}")
    with netns.Namespaces(2, rate_mbit=200, rtt_s=RTT_S) as ns:
        there = ns.probe(0, 1, nbytes=2_000_000)
        back = ns.probe(1, 0, nbytes=2_000_000)
    for p in (there, back):
        assert p.intact, p
        assert p.port >= 1024, p  # ephemeral: the redirect was not told about it
        # The fastest of 6 round trips: never below the delay line's RTT, and not far above it
        # (a loaded machine adds scheduling delays, hence the generous upper bound).
        assert RTT_S * 1000 <= p.rtt_ms < RTT_S * 1000 + 150, p
