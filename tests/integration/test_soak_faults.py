"""The chaos soak's faults (tests/integration/soak_faults.py) on a stand-in for a job's peer: a
process listening on two ports with a child (its "trainer"), both with a Slurm job id in their
environment. The faults find both processes and both ports, a slowed peer is stopped part of every
second and left running, and a cut peer cannot be reached until the cut ends, nothing left behind.

    .venv/bin/python -m pytest tests/integration/test_soak_faults.py -q
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.autopilot_mesh import Job
from tests.integration.peers import wait_for
from tests.integration.soak_faults import (TABLE, FaultConfig, cut_unavailable, hit, job_processes,
                                            listening_ports)

JOB_ID = f"soak-test-{os.getpid()}"
_STANDIN = """
import socket, subprocess, sys, time
servers = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, *[s.getsockname()[1] for s in servers], flush=True)
time.sleep(120)
"""


@dataclass
class Standin:
    proc: subprocess.Popen[str]
    child: int
    ports: list[int]

    @property
    def job(self) -> Job:
        return Job("b", 1, JOB_ID, "RUNNING")


@pytest.fixture
def standin() -> Iterator[Standin]:
    proc = subprocess.Popen([sys.executable, "-c", _STANDIN], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "SLURM_JOB_ID": JOB_ID})
    assert proc.stdout is not None
    child, *ports = map(int, proc.stdout.readline().split())
    yield Standin(proc, child, sorted(ports))
    for pid in (child, proc.pid):
        try:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    proc.wait(timeout=10)


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _table_listed() -> bool:
    return subprocess.run(["nft", "list", "table", *TABLE.split()], capture_output=True, check=False).returncode == 0


def test_the_faults_find_the_peers_processes_and_ports(standin: Standin) -> None:
    assert job_processes(standin.proc.pid, JOB_ID) == sorted([standin.proc.pid, standin.child])
    assert listening_ports(standin.proc.pid) == standin.ports


def test_a_slowed_peer_is_stopped_part_of_every_second_and_left_running(standin: Standin) -> None:
    pids = (standin.proc.pid, standin.child)
    config = FaultConfig(slow_s=3.0, slow_duty=0.5)
    fault = threading.Thread(target=hit, args=("slow", standin.job, standin.proc.pid, config))
    fault.start()
    seen = []
    while fault.is_alive():
        seen.append(tuple(_state(p) for p in pids))
        time.sleep(0.05)
    assert ("T", "T") in seen and any("T" not in s for s in seen), seen
    assert all(_state(p) != "T" for p in pids)


@pytest.mark.skipif(cut_unavailable() is not None, reason=str(cut_unavailable()))
def test_a_cut_peer_cannot_be_reached_until_the_cut_ends(standin: Standin) -> None:
    fault = threading.Thread(target=hit, args=("cut", standin.job, standin.proc.pid, FaultConfig(cut_s=3.0)))
    fault.start()
    wait_for(_table_listed, 2, "the cut's rules", interval_s=0.05)
    for port in standin.ports:
        with pytest.raises(TimeoutError):
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    fault.join()
    for port in standin.ports:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert not _table_listed(), "the cut's table is gone"
