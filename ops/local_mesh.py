"""A mesh of real `peer serve` processes on this machine, started together: the demo's and the benchmarks'.

Every site starts at once: the first on a port chosen here founds the run, the others join it, and
`--start-sites N` holds the run's first round until all N are live. One after the other, the first
site trained for a minute alone while the others built their trainers.

    with local_mesh.running(workdir, ["a", "b"], lambda site: ["--insecure", "--train", "tiny"]) as procs:
        ...   # each peer's stdout is a pipe (its first line says where it listens), its log workdir/SITE.log

By default every site listens on loopback; `place(site)` puts a site elsewhere, e.g. in a network
namespace of the WAN emulation (tests/support/netns.py, scripts/bench_overhead --net wan):
`Placement(host="10.212.0.2", prefix=("ip", "netns", "exec", "x12p42n1"))`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Placement:
    """Where one site's peer runs."""

    host: str = LOOPBACK
    """Address it listens on (port 0, the first site's chosen here) and other sites dial."""
    prefix: tuple[str, ...] = ()
    """Command prefix it runs under, e.g. `ip netns exec NS` (empty: as this process)."""


def free_port() -> int:
    """A loopback TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def start(workdir: Path, sites: list[str], serve_args: Callable[[str], list[str]],
          env: Callable[[str], Mapping[str, str]] | None = None,
          cwd: Path | None = None,
          place: Callable[[str], Placement] | None = None) -> dict[str, subprocess.Popen[str]]:
    """One `peer serve` per site, data dir `workdir/SITE`, stderr appended to `workdir/SITE.log`;
    `serve_args(site)` adds the flags of the run (later flags win), `env(site)` the site's environment,
    `place(site)` where it runs (default: loopback, as this process).
    The sites share this machine's cores: each trainer gets its share of them as torch threads."""
    where = {site: place(site) if place else Placement() for site in sites}
    # The port is free on this machine's loopback; a site elsewhere (an empty namespace) has it free too.
    seed = f"{where[sites[0]].host}:{free_port()}"
    threads = max(1, (os.cpu_count() or 1) // max(1, len(sites)))
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        for i, site in enumerate(sites):
            cmd = [*where[site].prefix, sys.executable, "-m", "peer.cli", "serve", "--site", site,
                   "--listen", seed if i == 0 else f"{where[site].host}:0", "--data-dir", str(workdir / site),
                   "--start-sites", str(len(sites)), *(["--join", seed] if i else []),
                   "--trainer-threads", str(threads), *serve_args(site)]
            with open(workdir / f"{site}.log", "a") as log:  # the child keeps its own descriptor
                procs[site] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, cwd=cwd,
                                               env={**os.environ, **(env(site) if env else {})})
    except BaseException:
        stop(procs)
        raise
    return procs


def stop(procs: Mapping[str, subprocess.Popen[str]], timeout_s: float = 60.0) -> None:
    """SIGTERM (a graceful leave) to every peer still running, then SIGKILL what has not exited."""
    for proc in procs.values():
        if proc.poll() is None:
            proc.terminate()
    for proc in procs.values():
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@contextlib.contextmanager
def running(workdir: Path, sites: list[str], serve_args: Callable[[str], list[str]],
            env: Callable[[str], Mapping[str, str]] | None = None,
            cwd: Path | None = None,
            place: Callable[[str], Placement] | None = None) -> Iterator[dict[str, subprocess.Popen[str]]]:
    """`start`, and `stop` however the block ends."""
    procs = start(workdir, sites, serve_args, env, cwd, place)
    try:
        yield procs
    finally:
        stop(procs)
