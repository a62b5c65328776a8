"""The chaos soak's faults, each on the peer of one running Slurm job (tests/integration/soak_run.py):

    kill   kill -9 of the peer: its batch shell then ends, the job fails and the loop replaces it
    stop   SIGSTOP of the peer for `stop_s` (past its data leases' 10 s), then SIGCONT
    leave  SIGTERM to the peer: a graceful leave long before the wall time
    slow   the peer and its trainer run only part of the time for `slow_s`: a SIGSTOP/SIGCONT duty
           cycle, stopped `slow_duty` of every second (a slow site, with no other tool)
    cut    a network cut for `cut_s`: nftables (table `inet sitemesh_soak`) drops every TCP packet
           to the peer's listening ports (gRPC and the bulk plane) on the loopback interface, so
           nobody reaches it (the table is made for the cut and deleted after it, in a `finally`).
           One-way: it still dials out, and the answers on its own connections come back (their
           packets go to its ephemeral ports, not to the ones it listens on)

The job's processes are read from /proc: the peer is not its trainer's parent under Slurm (the
peer's `srun` asks slurmstepd to start the rank), so the trainer is found by the job id in its
environment. A cut needs root and `nft`; `cut_unavailable` says why it cannot be had here.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tests.integration.autopilot_mesh import Job

KINDS = ("kill", "stop", "leave", "slow", "cut")
TABLE = "inet sitemesh_soak"
_PERIOD_S = 1.0
"""The slow fault's duty cycle period: short beside a round (tens of seconds), long beside a
scheduler tick, so the peer's work is slowed, not merely delayed once."""


@dataclass(frozen=True)
class FaultConfig:
    stop_s: float = 15.0
    """How long a stopped peer stays stopped: past its data leases' 10 s (LeaseConfig.lan)."""
    slow_s: float = 60.0
    """How long a slowed peer runs slow: a few rounds."""
    slow_duty: float = 0.5
    """The share of every second a slowed peer and its trainer are stopped."""
    cut_s: float = 20.0
    """How long a cut peer is unreachable: a round deadline of the soak's, so a round it is in waits."""

    def __post_init__(self) -> None:
        if not 0 < self.slow_duty < 1 or min(self.stop_s, self.slow_s, self.cut_s) <= 0:
            raise ValueError(f"bad fault config {self}")

    def duration_s(self, kind: str) -> float:
        """How long the fault `kind` goes on (kill and leave are at once)."""
        return {"stop": self.stop_s, "slow": self.slow_s, "cut": self.cut_s}.get(kind, 0.0)


def cut_unavailable() -> str | None:
    """Why the cut fault cannot be had here (no root, no `nft`, nftables refused), or None."""
    if os.geteuid() != 0:
        return "a network cut needs root (nftables)"
    if shutil.which("nft") is None:
        return "no `nft` here (apt-get install nftables): no network cuts"
    done = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=False)
    return f"nftables refused here ({done.stderr.strip()}): no network cuts" if done.returncode else None


def hit(kind: str, job: Job, pid: int, config: FaultConfig) -> str:
    """Does fault `kind` to job `job`'s peer (process `pid`), returns when it is over and says what it did."""
    what = f"{kind} {job.member} (job {job.job_id}, pid {pid})"
    if kind == "kill":
        _signal([pid], signal.SIGKILL)
    elif kind == "leave":
        _signal([pid], signal.SIGTERM)
    elif kind == "stop":
        _stopped([pid], config.stop_s)
    elif kind == "slow":
        n = _slowed(lambda: job_processes(pid, job.job_id), config.slow_s, config.slow_duty)
        what += f" {config.slow_s:.0f} s stopped {config.slow_duty:.0%} of each second, {n} processes"
    elif kind == "cut":
        ports = listening_ports(pid)
        _cut(ports, config.cut_s)
        what += f" {config.cut_s:.0f} s, ports {ports}"
    else:
        raise ValueError(f"unknown fault {kind!r}: one of {', '.join(KINDS)}")
    return what


def _signal(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            continue  # it ended meanwhile (its job ended)


def _stopped(pids: list[int], seconds: float) -> None:
    try:
        _signal(pids, signal.SIGSTOP)
        time.sleep(seconds)
    finally:
        _signal(pids, signal.SIGCONT)


def _slowed(processes: Callable[[], list[int]], seconds: float, duty: float) -> int:
    """The duty cycle over `processes()`, read again every period (a trainer restarted meanwhile
    is slowed too); returns how many processes it stopped. Nothing is left stopped."""
    stopped: set[int] = set()
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            pids = processes()
            stopped |= set(pids)
            _stopped(pids, duty * _PERIOD_S)
            time.sleep((1 - duty) * _PERIOD_S)
    finally:
        _signal(stopped, signal.SIGCONT)
    return len(stopped)


def _cut(ports: list[int], seconds: float) -> None:
    if not ports:
        return
    # Created fresh (a table a killed soak left is replaced), deleted whatever happens.
    rules = f"""table {TABLE} {{}}
delete table {TABLE}
table {TABLE} {{
    chain input {{
        type filter hook input priority 0; policy accept;
        iifname "lo" tcp dport {{ {', '.join(map(str, ports))} }} drop
    }}
}}
"""
    try:
        subprocess.run(["nft", "-f", "-"], input=rules, capture_output=True, text=True, check=True)
        time.sleep(seconds)
    finally:
        remove_cut()


def remove_cut() -> None:
    """Deletes the cut's nftables table."""
    subprocess.run(["nft", "delete", "table", *TABLE.split()], capture_output=True, check=False)


def listening_ports(pid: int) -> list[int]:
    """The TCP ports process `pid` listens on (`ss -ltnp`): a peer's gRPC front and bulk plane."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    return sorted({int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines() if f"pid={pid}," in line})


def job_processes(peer: int, job_id: str) -> list[int]:
    """The peer and its trainer: every process with the job's id in its environment (the peer,
    its `srun`, the rank slurmstepd started) except the batch shell, which must stay able to pass
    Slurm's SIGTERM on, and slurmstepd itself."""
    mark = f"SLURM_JOB_ID={job_id}".encode()
    shell = _parent(peer)
    found = {peer}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == shell:
            continue
        try:
            if mark in (proc / "environ").read_bytes().split(b"\0") and \
                    not (proc / "comm").read_text().startswith("slurmstepd"):
                found.add(int(proc.name))
        except OSError:
            continue  # it ended meanwhile
    return sorted(found)


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
