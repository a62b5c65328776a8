"""A throw-away single-node Slurm cluster on localhost (munged, slurmctld, slurmd) for the
placement tests: real daemons, real `sbatch`, nothing mocked.

    .venv/bin/python -m pytest tests/integration/test_slurm_probe.py -v

Needs root (slurmd runs jobs as any user) and Debian's slurm-wlm and munge
(scripts/setup_slurm_packages.sh); otherwise the tests that use it are skipped with the reason.
Everything lives under one temp dir: munge key and socket, slurm.conf, state, spool, logs. Ports
are picked free, so concurrent test sessions do not collide. The node has 2 CPUs whatever the
machine has (`config_overrides`; `start(cpus=...)` for more, as scripts/bench_successor's sleep
jobs take) and four partitions over it:
  debug  all CPUs (default)        busy, free  at most 1 CPU each, to load one and not the other
  shared  all CPUs, each shared by up to 4 jobs (a site's job and its successor, of several sites)
Scheduling runs every second (sched_interval, bf_interval) so predictions and starts are prompt.
Without accounting (`sacct` says it is disabled) unless a test asks for it: `start(accounting=True)`
adds a private MariaDB and slurmdbd (tests/integration/slurm_accounting.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration import slurm_accounting

_BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")


def skip_reason() -> str | None:
    """Why a local Slurm cluster cannot be started here, or None."""
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root (slurmd runs jobs as their owner)"
    missing = [b for b in _BINARIES if shutil.which(b) is None]
    if missing:
        return (
            f"Slurm/munge not installed (missing {', '.join(missing)}): run scripts/setup_slurm_packages.sh"
        )
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    node: str

    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm clients of this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    @property
    def prefix(self) -> list[str]:
        """A command prefix that reaches this cluster (how a site's `ssh login-node` is tested)."""
        return ["env", f"SLURM_CONF={self.conf}", "bash", "-c"]

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=30, check=check
        )

    def sbatch(self, *args: str) -> str:
        """Submits a job directly (for load); returns its id."""
        return self.run("sbatch", "--parsable", *args).stdout.strip().split(";")[0]

    def state(self, job_id: str) -> str:
        return self.run(
            "squeue", "--states=all", "--noheader", "--format=%T", f"--jobs={job_id}"
        ).stdout.strip()

    def wait_for(self, job_id: str, states: set[str], timeout_s: float) -> str:
        """Polls Slurm until the job reaches one of `states` (real daemons: there is no event to await)."""
        deadline = time.monotonic() + timeout_s
        while (state := self.state(job_id)) not in states:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"job {job_id} still {state!r} after {timeout_s} s, wanted {sorted(states)}"
                )
            time.sleep(0.2)
        return state

    def clear(self, timeout_s: float = 30.0) -> None:
        """Cancels every job and waits until the node is idle again, so tests do not see each other."""
        self.run("scancel", "--user=root", check=False)
        deadline = time.monotonic() + timeout_s
        while self.run("squeue", "--noheader").stdout.strip():
            if time.monotonic() > deadline:
                raise TimeoutError("jobs still in the queue after scancel")
            time.sleep(0.2)


CLUSTER_NAME = "sitemesh-test"


def _conf(root: Path, node: str, cpus: int, extra: str, accounting: str, min_job_age_s: int) -> str:
    return f"""\
ClusterName={CLUSTER_NAME}
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1,sched_min_interval=100000
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
KillWait=2
MinJobAge={min_job_age_s}
JobAcctGatherType=jobacct_gather/none
{accounting}NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=10 State=UP
PartitionName=busy Nodes={node} MaxCPUsPerNode=1 MaxTime=10 State=UP
PartitionName=free Nodes={node} MaxCPUsPerNode=1 MaxTime=10 State=UP
PartitionName=shared Nodes={node} OverSubscribe=FORCE:4 MaxTime=10 State=UP
{extra}"""


def stop(root: Path) -> None:
    """SIGTERM to the daemons at once (each takes ~2 s to shut down), then waits for all."""
    pids = []
    for pidfile in ("slurmd.pid", "slurmctld.pid", *slurm_accounting.PID_FILES, "munge/pid"):
        try:
            pid = int((root / pidfile).read_text().strip())
            os.kill(pid, signal.SIGTERM)
            pids.append(pid)
        except (OSError, ValueError):
            continue  # never started, or already gone
    deadline = time.monotonic() + 15
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)


def start(root: Path, cpus: int = 2, extra_conf: str = "", accounting: bool = False,
          min_job_age_s: int = 600) -> SlurmCluster:
    """Starts munged, slurmctld and slurmd under `root` and waits until the node is idle; the node
    has `cpus` CPUs, and `extra_conf` (slurm.conf lines for keys the conf above leaves unset, e.g. a
    priority plugin) is appended. `accounting`: MariaDB and slurmdbd as well, so `sacct` answers
    (slurm_accounting.skip_reason() says whether they are installed). Slurm lists an ended job for
    `min_job_age_s` (its MinJobAge; 2 is the least Slurm advises: squeue then forgot a job ~10 s
    after its end here, the purge running between scheduling cycles)."""
    for d in ("munge", "state", "spool", "log"):
        (root / d).mkdir(mode=0o700)
    node = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    dbd_port = _free_port()
    storage = (slurm_accounting.slurm_conf(root, dbd_port) if accounting
               else "AccountingStorageType=accounting_storage/none\n")
    conf.write_text(_conf(root, node, cpus, extra_conf, storage, min_job_age_s))
    m = root / "munge"
    subprocess.run(["mungekey", "--create", f"--keyfile={m}/key"], check=True, capture_output=True)
    subprocess.run(
        [
            "munged",
            "--force",
            f"--key-file={m}/key",
            f"--socket={m}/socket",
            f"--pid-file={m}/pid",
            f"--log-file={m}/log",
            f"--seed-file={m}/seed",
        ],
        check=True,
        capture_output=True,
    )
    cluster = SlurmCluster(root=root, conf=conf, node=node)
    if accounting:
        try:
            slurm_accounting.start(root, CLUSTER_NAME, dbd_port, _free_port(), cluster.env)
        except (RuntimeError, subprocess.SubprocessError):
            stop(root)
            raise
    subprocess.run(
        ["slurmctld", "-c", "-i", "-f", str(conf)], check=True, capture_output=True, env=cluster.env
    )
    subprocess.run(["slurmd", "-f", str(conf)], check=True, capture_output=True, env=cluster.env)
    deadline = time.monotonic() + 30
    while (
        cluster.run("sinfo", "--noheader", "--format=%T", "--partition=debug", check=False).stdout.strip()
        != "idle"
    ):
        if time.monotonic() > deadline:
            logs = "\n".join(p.read_text()[-2000:] for p in (root / "log").glob("*.log"))
            stop(root)
            raise RuntimeError(f"local Slurm cluster did not come up within 30 s:\n{logs}")
        time.sleep(0.1)
    return cluster


# Test modules import these two functions; pytest knows them by their `name`.
@pytest.fixture(scope="session", name="slurm_session")
def slurm_session_fixture() -> Iterator[SlurmCluster]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="sitemesh-slurm-"))
    try:
        cluster = start(root)
        yield cluster
    finally:
        stop(root)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(name="slurm")
def slurm_fixture(slurm_session: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session's cluster, emptied of jobs after each test."""
    yield slurm_session
    slurm_session.clear()
