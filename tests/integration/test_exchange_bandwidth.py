"""A transfer over a bandwidth-limited link runs at the link's rate, with no false stall or retry.

The link is the loopback device of a fresh network namespace shaped by `tc tbf` (this kernel has no
netem; tbf works), so traffic stays on 127.0.0.1. Needs root and iproute2; skipped otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RATE_BYTES_S = 10_000_000  # 80 Mbit/s: a modest WAN share
ELEMENTS = 3_000_000  # 6 MB in bf16

# Runs inside the namespace: serve one object, fetch it through the shaped loopback, report.
_PROGRAM = """
import asyncio, json, sys, time, torch
from peer.exchange import codec
from peer.exchange.client import ExchangeClient, FetchPolicy, fetch_into
from peer.exchange.store import ExchangeStore
from tests.support.exchange import decoded, serving

async def main():
    store = ExchangeStore()
    enc = codec.encode({"w": torch.randn(%d)}, round=1, site="far", tokens=1)
    await store.publish(enc)
    async with serving(store) as address:
        client = ExchangeClient(address)
        dest = {"w": torch.empty(%d)}
        started = time.monotonic()
        stats = await fetch_into(enc.manifest, [client], dest, FetchPolicy.wan())
        elapsed = time.monotonic() - started
        await client.close()
    exact = torch.equal(dest["w"], decoded(enc)["w"])
    print(json.dumps({"elapsed": elapsed, "bytes": stats.bytes, "attempts": stats.attempts,
                      "stalls": stats.stalls, "exact": exact}))

asyncio.run(main())
""" % (ELEMENTS, ELEMENTS)


def _can_shape() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None


@pytest.mark.skipif(not _can_shape(), reason="needs root, ip and tc for a shaped network namespace")
def test_transfer_over_a_shaped_link_runs_at_link_rate_without_false_stalls() -> None:
    ns = f"smx-exchange-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        # A WAN-sized MTU: tbf drops any packet larger than its burst, and lo's is 64 KiB.
        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "mtu", "1500", "up"], check=True)
        rate = f"{RATE_BYTES_S * 8 // 1_000_000}mbit"
        subprocess.run(
            ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "tbf",
             "rate", rate, "burst", "32kb", "latency", "100ms"],
            check=True,
        )  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO), "GRPC_VERBOSITY": "ERROR"}
        done = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", _PROGRAM],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=90,
        )  # fmt: skip
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"shaped link: {result}")
    assert result["exact"] and result["bytes"] == ELEMENTS * 2
    assert (result["attempts"], result["stalls"]) == (1, 0)
    # The shaping is real (not faster than the link) and the exchange uses most of it.
    floor = result["bytes"] / RATE_BYTES_S
    assert 0.8 * floor <= result["elapsed"] <= 4 * floor, result
