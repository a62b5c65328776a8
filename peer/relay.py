"""`peer serve --role relay`: a process that only relays connections to outbound sites.

It runs on a host every site can dial (a login, service or data-transfer node, or a small rented
machine), holds no state, trains nothing and is no member of the run: its certificate (`ops certs
issue --relay NAME`) lets it hold connections it cannot read and call nothing a site may
(peer/transport/auth.py). A direct site can relay too (`relay_listen`, peer/reach.py); the
protocol is in peer/transport/relay_server.py. Every minute it forwarded something, and when it
stops, it prints what it forwarded and what that cost (CPU seconds per GB, peak memory).

    peer serve --role relay --site relay1 --listen 0.0.0.0:7100 --certs certs/
"""

from __future__ import annotations

import asyncio
import resource
import signal
import sys
from pathlib import Path

from peer.config import ConfigError, parse_address
from peer.transport.channels import Credentials
from peer.transport.relay_server import RelayServer, RelayStats

REPORT_EVERY_S = 60.0


def cost_line(name: str, stats: RelayStats, cpu_s: float) -> str:
    """What the relay forwarded and its CPU and memory for it (scripts/bench_relay reads it)."""
    gb = stats.forwarded_bytes / 1e9
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    per_gb = f"{cpu_s / gb:.2f}" if gb > 0 else "n/a"
    refused = ", ".join(f"{why} {n}" for why, n in sorted(stats.refused.items())) or "none"
    return (f"relay {name}: forwarded {gb:.3f} GB over {stats.relayed} connections; cpu {cpu_s:.1f} s "
            f"({per_gb} s/GB); peak memory {peak_mib:.0f} MiB; refused: {refused}")


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def serve(name: str, listen: str, certs: Path | None) -> int:
    """Runs the relay until SIGTERM or SIGINT; the exit status."""
    if certs is None:
        print("peer: error: a relay needs --certs DIR with ca.crt, NAME.crt, NAME.key (ops certs issue --relay NAME)",
              file=sys.stderr)
        return 2
    try:
        host, port = parse_address(listen, "listen address")
        creds = Credentials.from_dir(certs, name)
    except (ConfigError, OSError) as err:
        print(f"peer: error: {err}", file=sys.stderr)
        return 2
    server = RelayServer(creds)
    try:
        bound = await server.start(host.strip("[]"), port)
    except OSError as err:
        print(f"peer: error: cannot listen on {listen}: {err}", file=sys.stderr)
        return 2
    print(f"relay {name} listening on {host}:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    cpu0, reported = _cpu_s(), 0
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), REPORT_EVERY_S)
        except asyncio.TimeoutError:
            if server.stats.forwarded_bytes != reported:
                reported = server.stats.forwarded_bytes
                print(cost_line(name, server.stats, _cpu_s() - cpu0), flush=True)
    await server.close()
    print(cost_line(name, server.stats, _cpu_s() - cpu0), flush=True)
    return 0
