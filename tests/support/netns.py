"""WAN emulation in network namespaces: sites behind shaped access links, with a transparent delay line.

`Namespaces(n, rate_mbit, rtt_s)` (root) creates one network namespace per site and a hub namespace
holding a bridge, joined by veth pairs, and `tc tbf` shapes both ends of every veth to the link rate
(a site's uplink and its downlink). This kernel has no netem, so the delay is a user-space delay
line: in each site's namespace an nftables `nat output` rule redirects every TCP connection to
another site's address to a local `FaultProxy(original_destination, latency_s=rtt_s / 2)`
(tests/support/faultproxy.py), which reads where the connection was going (SO_ORIGINAL_DST),
connects there itself (its own sockets carry MARK, which the rule lets pass) and holds every byte
RTT/2 in each direction. The connection's initiator pays both halves, so every TCP connection
between two sites -- gRPC to an advertised address, the bulk plane's ephemeral ports, anything --
sees the round trip without the programs knowing: no ports to list in advance, no flags.

Honest limit: the TCP connections under the proxy see the veth's sub-millisecond round trip, so
TCP's own window growth is not exercised; what sees the RTT is everything above TCP (HTTP/2 windows,
gRPC requests, the protocols' request/response steps). `probe` measures what was achieved.

    with Namespaces(3, rate_mbit=200, rtt_s=0.1) as ns:
        subprocess.run([*ns.exec(0), "curl", f"http://{ns.ips[1]}:8080/"])  # 100 ms RTT, 200 Mbit/s
        print(ns.probe(0, 1))                                               # what was achieved

Everything is removed on exit (the context manager's, and SIGTERM if the caller turns it into
SystemExit). Used by scripts/bench_wan, scripts/bench_overhead (`--net wan`) and
tests/integration/test_wan_emulation.py; docs/decisions/exchange-wan-emulation.md says why.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

REPO = Path(__file__).resolve().parents[2]
MARK = 0x5A7E
"""SO_MARK of the delay line's own connections: the redirect lets them through to the other site."""
DELAY_PORT = 4099
"""The delay line's port on each site namespace's loopback (the namespace is empty: nothing else
listens there)."""


def unavailable(nft: bool = True) -> str | None:
    """Why namespaces (with the delay line's nftables redirect when `nft`) cannot be used here, or None."""
    if os.geteuid() != 0:
        return "not root"
    missing = [c for c in ("ip", "tc", *(["nft"] if nft else [])) if shutil.which(c) is None]
    if missing:
        return f"missing commands: {', '.join(missing)} (apt-get install iproute2 nftables)"
    probe = f"x12probe{os.getpid() % 100_000}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if done.returncode:
        return f"`ip netns add` failed: {done.stderr.strip()}"
    try:
        if nft:
            done = subprocess.run(["ip", "netns", "exec", probe, "nft", "-f", "-"], input=_ruleset([]),
                                  capture_output=True, text=True, check=False)
            if done.returncode:
                return f"nftables nat unavailable: {done.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


_SYN = "tcp flags & (fin | syn | rst | ack) == syn"
"""A TCP packet that opens a connection (what a firewall refusing inbound connections drops)."""


def _ruleset(others: list[str]) -> str:
    """nftables rules of one site's namespace: TCP from here to the other sites goes to the delay line."""
    to_others = (f"ip daddr {{ {', '.join(others)} }} meta l4proto tcp redirect to :{DELAY_PORT}"
                 if others else "")
    return f"""
table ip wan_delay {{
    chain out {{
        type nat hook output priority -100; policy accept;
        meta mark {MARK:#x} return
        {to_others}
    }}
}}
"""  # the site's own address stays out: a site dialing itself is not a WAN connection


@dataclass(frozen=True)
class Probe:
    """What one site achieved towards another through the emulation."""

    rtt_ms: float
    """Fastest of several 1-byte round trips on one TCP connection."""
    rate_mbit: float
    """An echoed transfer's payload rate: bytes x 8 / (its time - one round trip)."""
    intact: bool
    """The echoed bytes came back identical."""
    port: int
    """The far end's (ephemeral) port."""


class Namespaces:
    """A hub (bridge) + one namespace per site, veths shaped by tbf at both ends, and with `rtt_s`
    the transparent delay line in every site namespace; all removed on exit. `rates`: a site's own
    link rate where it is not `rate_mbit` (a relay on a data-transfer node, say)."""

    def __init__(self, sites: int, rate_mbit: float, rtt_s: float = 0.0, subnet: str = "10.212.0",
                 rates: Mapping[int, float] | None = None) -> None:
        tag = os.getpid() % 100_000
        self.hub = f"x12h{tag}"
        self.names = [f"x12p{tag}n{i}" for i in range(sites)]
        self.ips = [f"{subnet}.{i + 1}" for i in range(sites)]
        self.rate_mbit, self.rtt_s = rate_mbit, rtt_s
        self.rates = {i: (rates or {}).get(i, rate_mbit) for i in range(sites)}
        self._tag = tag
        self._delays: list[subprocess.Popen[str]] = []  # the delay line processes, one per site

    def exec(self, site: int) -> list[str]:
        """The command prefix that runs a program in `site`'s namespace."""
        return ["ip", "netns", "exec", self.names[site]]

    def __enter__(self) -> Namespaces:
        try:
            self._create()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.remove()

    def _create(self) -> None:
        _ip("netns", "add", self.hub)
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        for i, ns in enumerate(self.names):
            _ip("netns", "add", ns)
            here, there = f"v{self._tag}p{i}", f"v{self._tag}h{i}"
            _ip("link", "add", here, "netns", ns, "type", "veth", "peer", "name", there, "netns", self.hub)
            _ip("-n", ns, "addr", "add", f"{self.ips[i]}/24", "dev", here)
            _ip("-n", ns, "link", "set", here, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", self.hub, "link", "set", there, "master", "br0", "up")
            # Both directions of the access link: the site's uplink and its downlink.
            for where, dev in ((ns, here), (self.hub, there)):
                _run(["ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                      "rate", f"{self.rates[i]:g}mbit", "burst", "256kb", "latency", "200ms"])
        if self.rtt_s > 0:
            for i in range(len(self.names)):
                self._start_delay(i)

    def _start_delay(self, site: int) -> None:
        others = [a for j, a in enumerate(self.ips) if j != site]
        _run([*self.exec(site), "nft", "-f", "-"], stdin=_ruleset(others))
        proc = subprocess.Popen([*self.exec(site), sys.executable, "-m", "tests.support.netns", "delay",
                                 "--latency-s", repr(self.rtt_s / 2)],
                                cwd=REPO, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        self._delays.append(proc)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the delay line in {self.names[site]} did not start (exit {proc.poll()})")

    def outbound_only(self, site: int, reach: Sequence[int] | None = None) -> None:
        """Makes `site` a compute node that only dials out: nftables drops every TCP connection
        attempt (a SYN) into its namespace from another (loopback stays open: the delay line and a
        site's own tunnel agent use it; replies to what it dialled pass), and with `reach` every one
        it makes to a namespace not listed. By SYN, not by conntrack's "new": connections open
        before the rules (untracked where no rule needed conntrack yet) must go on, not be taken
        for new ones mid-stream. `dropped(site)` counts the packets dropped since."""
        allowed = ", ".join(self.ips[j] for j in reach or ())
        egress = "" if reach is None else (
            f'oifname != "lo" ip daddr != {{ {allowed} }} {_SYN} counter drop' if allowed
            else f'oifname != "lo" {_SYN} counter drop')
        _run([*self.exec(site), "nft", "-f", "-"], stdin=f"""
table inet outbound_only {{
    chain inbound {{
        type filter hook input priority 0; policy accept;
        iifname "lo" accept
        {_SYN} counter drop
    }}
    chain outbound {{
        type filter hook output priority 0; policy accept;
        {egress}
    }}
}}
""")

    def dropped(self, site: int) -> int:
        """Packets `outbound_only` rules of `site` have dropped (each retried SYN counts)."""
        done = subprocess.run([*self.exec(site), "nft", "list", "table", "inet", "outbound_only"],
                              capture_output=True, text=True, check=True)
        return sum(int(n) for n in re.findall(r"counter packets (\d+)", done.stdout))

    def remove(self) -> None:
        for proc in self._delays:
            proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        self._delays.clear()
        for ns in [*self.names, self.hub]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)

    def probe(self, src: int, dst: int, nbytes: int = 12_500_000, timeout_s: float = 60.0) -> Probe:
        """RTT and rate from site `src` to an echo server on an ephemeral port of site `dst`."""
        echo = subprocess.Popen([*self.exec(dst), sys.executable, "-m", "tests.support.netns", "echo",
                                 "--host", self.ips[dst]], cwd=REPO, stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
        try:
            assert echo.stdout is not None
            port = int(echo.stdout.readline())
            done = subprocess.run([*self.exec(src), sys.executable, "-m", "tests.support.netns", "probe",
                                   "--to", f"{self.ips[dst]}:{port}", "--bytes", str(nbytes)],
                                  cwd=REPO, capture_output=True, text=True, timeout=timeout_s,
                                  env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
            if done.returncode:
                raise RuntimeError(f"probe {src} -> {dst}: {done.stderr.strip()[-2000:]}")
            return Probe(**json.loads(done.stdout), port=port)
        finally:
            echo.kill()
            echo.wait()
            if echo.stdout is not None:
                echo.stdout.close()


def _ip(*args: str) -> None:
    _run(["ip", *args])


def _run(cmd: list[str], stdin: str | None = None) -> None:
    done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")


# ---------------------------------------------------------------------------- in a site's namespace


def _delay(latency_s: float) -> None:
    """The transparent delay line on 127.0.0.1:DELAY_PORT, until killed."""
    from tests.support.faultproxy import FaultProxy, original_destination

    async def main() -> None:
        await FaultProxy(original_destination, latency_s=latency_s, listen_port=DELAY_PORT, mark=MARK).start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def _echo(host: str) -> None:
    """Echoes every connection's bytes back, on an ephemeral port of `host` (printed first)."""
    with socket.create_server((host, 0)) as listener:
        print(listener.getsockname()[1], flush=True)
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=_echo_one, args=(conn,), daemon=True).start()


def _echo_one(conn: socket.socket) -> None:
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while data := conn.recv(1 << 20):
            conn.sendall(data)


def _probe(host: str, port: int, nbytes: int, trips: int = 6) -> dict[str, object]:
    """1-byte round trips, then `nbytes` of random bytes echoed back: RTT, rate, intact."""
    payload = os.urandom(nbytes)
    with socket.create_connection((host, port), timeout=30) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ in range(trips):
            t0 = time.monotonic()
            s.sendall(b"?")
            if s.recv(1) != b"?":
                raise RuntimeError("the echo answered something else")
            rtts.append(time.monotonic() - t0)
        rtt = min(rtts)
        got = hashlib.sha256()
        t0 = time.monotonic()
        sender = threading.Thread(target=s.sendall, args=(payload,))
        sender.start()
        left, buf = nbytes, bytearray(1 << 20)
        while left > 0:
            n = s.recv_into(buf, min(left, len(buf)))
            if not n:
                break
            got.update(memoryview(buf)[:n])
            left -= n
        seconds = time.monotonic() - t0
        sender.join()
    return {"rtt_ms": rtt * 1000, "rate_mbit": nbytes * 8 / max(seconds - rtt, 1e-9) / 1e6,
            "intact": left == 0 and got.digest() == hashlib.sha256(payload).digest()}


def main() -> None:
    ap = argparse.ArgumentParser(description="the parts of the WAN emulation that run in a site's namespace")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("delay", help="the transparent delay line on 127.0.0.1:%d" % DELAY_PORT)
    d.add_argument("--latency-s", type=float, required=True, help="seconds each byte is held, each direction")
    e = sub.add_parser("echo", help="an echo server on an ephemeral port (printed)")
    e.add_argument("--host", required=True, help="address to listen on")
    p = sub.add_parser("probe", help="RTT and rate to an echo server, as JSON")
    p.add_argument("--to", required=True, help="host:port of the echo server")
    p.add_argument("--bytes", type=int, default=12_500_000, help="bytes to send and have echoed")
    args = ap.parse_args()
    if args.cmd == "delay":
        _delay(args.latency_s)
    elif args.cmd == "echo":
        _echo(args.host)
    else:
        host, port = args.to.rsplit(":", 1)
        print(json.dumps(_probe(host, int(port), args.bytes)))


if __name__ == "__main__":
    main()
