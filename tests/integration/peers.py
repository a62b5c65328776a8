"""Real `peer serve` processes on loopback for integration tests, and `ops` invocations.

Each peer binds port 0 and the harness reads the bound address from its first stdout line. Every
process started here is killed when the cluster closes, SIGSTOPped ones included.

A cluster runs `--insecure` (plaintext) unless made with `tls=True`: then it makes a run CA and an
operator certificate in `<workdir>/certs`, issues each site's certificate on its first start, and
`cluster.ops(...)` / `cluster.status(...)` dial as the operator.
"""

from __future__ import annotations

import json
import socket
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops.certs import LOOPBACK, issue, make_run
from peer.core.commitlog import RoundCommit
from peer.logstore import FileStore

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class Peer:
    site: str
    proc: subprocess.Popen[str]
    address: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text()

    def thetas(self) -> dict[int, str]:
        """round -> the θ hash prefix this peer logged when it applied the round."""
        return {int(r): h for r, h in re.findall(r"round (\d+) applied: θ ([0-9a-f]+)", self.log())}


@dataclass
class Cluster:
    workdir: Path
    preset: str = "local_test"
    tls: bool = False
    peers: dict[str, Peer] = field(default_factory=dict)
    helpers: list[subprocess.Popen[str]] = field(default_factory=list)
    """Processes started beside the peers (relays): killed with them."""

    @property
    def certs(self) -> Path:
        return self.workdir / "certs"

    def _security(self, site: str) -> list[str]:
        if not self.tls:
            return ["--insecure"]
        if not (self.certs / "ca.crt").exists():
            make_run("test", self.certs, [], operators=("operator",))
        if not (self.certs / f"{site}.crt").exists():
            issue(self.certs, site, "site", self.certs, LOOPBACK)
        return ["--certs", str(self.certs)]

    def start(self, site: str, join: list[str] | None = None, extra: list[str] | None = None,
              env: dict[str, str] | None = None) -> Peer:
        log_path = self.workdir / f"{site}.log"  # a restart appends to the same log
        args = [sys.executable, "-m", "peer.cli", "serve", "--site", site, "--listen", "127.0.0.1:0",
                "--preset", self.preset, "--data-dir", str(self.workdir / site), *self._security(site),
                *(extra or [])]
        for seed in join or []:
            args += ["--join", seed]
        log_file = log_path.open("a")
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log_file, text=True, env={**_env(), **(env or {})},
                                cwd=REPO)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "listening on" not in line:
            proc.kill()
            raise AssertionError(f"peer {site} did not start: {line!r}\n{log_path.read_text()}")
        peer = Peer(site, proc, line.strip().rsplit(" ", 1)[-1], log_path)
        self.peers[site] = peer
        return peer

    def ops(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """`ops` as this cluster's operator (its certificate when tls)."""
        return ops(*args, *(["--certs", str(self.certs), "--as", "operator"] if self.tls else []), timeout=timeout)

    def status(self, address: str) -> dict[str, Any]:
        result = self.ops("status", "--peer", address, "--json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def close(self) -> None:
        for proc in self.helpers:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        for peer in self.peers.values():
            if peer.proc.poll() is None:
                peer.proc.send_signal(signal.SIGCONT)
                peer.proc.kill()
            peer.proc.wait(timeout=10)


def ops(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ops.cli", *args], capture_output=True, text=True,
                          env=_env(), cwd=REPO, timeout=timeout)


def audit(*data_dirs: Path) -> dict[str, Any]:
    """`ops audit --json` over the data dirs of a run of one data epoch: that epoch's record."""
    result = ops("audit", *[a for d in data_dirs for a in ("--data-dir", str(d))], "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    (epoch,) = json.loads(result.stdout)
    return epoch


def commits(data_dir: Path) -> list[RoundCommit]:
    """The round commits in the commit log on disk of a (stopped or running) peer."""
    return [e.body for e in FileStore(data_dir / "consensus").reload().entries if isinstance(e.body, RoundCommit)]


def status(address: str) -> dict[str, Any]:
    result = ops("status", "--peer", address, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def states(address: str) -> dict[str, str]:
    """site -> state in the view of the peer at `address`."""
    return {m["site"]: m["state"] for m in status(address)["members"]}


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.2) -> float:
    """Polls `predicate` until true; returns the seconds it took, fails the test after timeout_s."""
    start = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"timed out after {timeout_s:.1f}s waiting for {what}")
        time.sleep(interval_s)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Relay:
    """A `peer serve --role relay` process on loopback."""

    def __init__(self, cluster: Cluster, name: str) -> None:
        if not (cluster.certs / "ca.crt").exists():
            make_run("test", cluster.certs, [], operators=("operator",))
        if not (cluster.certs / f"{name}.crt").exists():
            issue(cluster.certs, name, "relay", cluster.certs, LOOPBACK)
        self.log_path = cluster.workdir / f"{name}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "peer.cli", "serve", "--role", "relay", "--site", name, "--listen", "127.0.0.1:0",
             "--certs", str(cluster.certs)],
            stdout=subprocess.PIPE, stderr=self.log_path.open("a"), text=True, env=_env(), cwd=REPO)
        cluster.helpers.append(self.proc)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert "listening on" in line, f"relay {name} did not start: {line!r} {self.log_path.read_text()}"
        self.address = line.strip().rsplit(" ", 1)[-1]

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> str:
        """SIGTERM; the relay's last line (what it forwarded and what that cost)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=10)
        assert self.proc.stdout is not None
        return self.proc.stdout.read().strip().splitlines()[-1]


def outbound(relays: list[Relay | str], proxy: str = "") -> list[str]:
    args = ["--reach", "outbound"]
    for relay in relays:
        args += ["--relay", relay if isinstance(relay, str) else relay.address]
    return args + (["--proxy", proxy] if proxy else [])
