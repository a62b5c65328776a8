"""A run kept going across Slurm allocations by `ops autopilot`, with real peers and the real Slurm
the tests start (tests/integration/slurm_cluster.py): the harness of
tests/integration/test_autopilot_handover.py and of scripts/soak.

Site `a` is a long-lived direct site, a plain `peer serve` process (it keeps the commit log the
checks read). The job sites (`sites`, default just `b`) live only in Slurm jobs: `ops autopilot` (a
real process, `--interval` seconds between passes) submits `sitemesh-soak-SITE-N` from the
production template (scripts/slurm/snellius-h100.sbatch) whose batch shell runs the real `peer
serve ... --job N`, so job N of site b is member `b.jN` with its state in `b/jN`, and each
successor is queued with `--begin` to start `handover_s` before its predecessor's wall time ends.
Each job site has its own certificate (for all its jobs), data dir and run-file section.

Why a 3-minute wall time and not Slurm's shortest, 1 minute (measured here): slurmctld checks time
limits only every 30 s (PERIODIC_TIMEOUT); it sends `--signal=B:TERM@S` at the first check that
finds the job's end less than S + 30 s away, so anywhere in [end - S - 30, end - S), and a job that
is still running at its end is TIMEOUT even if its peer then leaves. So S must cover the graceful
leave (it waits for the round holding its samples and the next: ~20 s here under load, S = 30);
the successor must start its start-up and join (~30 s here under load) before its predecessor's
earliest SIGTERM, `handover_s` >= S + 30 + join; and at least 30 s after its predecessor, wall -
`handover_s` >= 30, or both get their SIGTERM at the same check and the site drops out. Together:
wall >= 2 x 30 + S + join, about 2.5 minutes. With 3 minutes and `handover_s` = 120 each successor
starts 60 s after its predecessor, has at least 60 s to join before the predecessor's SIGTERM, and
at most three jobs of a site run at once (`Allocation()`, the handover test's). Shorter jobs need
the peer to time its own leave (`leave_seconds`, `peer serve --leave-before`), exactly, with Slurm's
signal as the backstop: `SHORT`, the soak's 2-minute jobs. Every job site runs in the `shared` partition (each of
the node's 2 CPUs shared by up to four jobs): of tests/integration/slurm_cluster.py's partitions it
is the only one where a site's job and its successors run at once beside another site's (`busy`
and `free` hold one 1-CPU job each, `debug` gives every job one of the 2 CPUs to itself), and its
8 slots hold the up to 6 jobs of two job sites. A site is told apart by its name and run-file
section, not by a partition.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops import accounting
from ops.accounting import Totals
from ops.autopilot.keeper import parse_job_name
from ops.autopilot.state import AutopilotState
from ops.certs import LOOPBACK, issue
from peer import job_record
from peer.core.commitlog import RoundCommit, VoterChange
from peer.logstore import FileStore
from tests.integration.peers import REPO, Cluster, Peer, _env, commits, ops
from tests.integration.slurm_cluster import SlurmCluster

RUN = "soak"
TEMPLATE = REPO / "scripts/slurm/snellius-h100.sbatch"
_LIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING"}


@dataclass(frozen=True)
class Allocation:
    """The job sites' allocations: their wall time, when the loop starts a successor, and when a
    job's peer leaves."""

    wall: str = "3"
    """Slurm's wall-time limit (minutes)."""
    handover_s: float = 120.0
    """A successor starts this long before its predecessor's end (`ops autopilot --handover`)."""
    signal_s: int = 30
    """Slurm's SIGTERM to the batch shell this long before the wall time (at its 30 s granularity)."""
    leave_s: int | None = None
    """The peer leaves on its own this long before the job's end (`leave_seconds`; None: signal_s)."""


SHORT = Allocation(wall="2", handover_s=65.0, signal_s=5, leave_s=20)
"""2-minute allocations, possible because the peer times its own leave: at end - 20 s at the latest
(a leave took 3 s median, 8 s p90, 17 s at most in a 6-minute soak, 2026-12-07 15:37), or at
Slurm's SIGTERM@5 if that comes first (anywhere in [end - 35, end - 5)): on average 24 s before the
end, where a fixed 35 s left 11 s of every job's allocation unused. A leave that runs past the
wall time is a TIMEOUT, its samples back on their leases. A successor starts 65 s before its
predecessor's end, so at least 45 s before that leave (a peer joins in about 20 s), and at most two
jobs of a site run at once: with 80 s, job n+2 started while job n still trained, three trainers of
one site on this 2-core machine."""


def train_args(docs: int = 8, inner_steps: int = 4, round_deadline: float = 60.0,
               deadline_k: float = 0.0, budget_s: float = 0.0) -> list[str]:
    """Every site's training flags: a micro model over a few documents, epochs enough for hours;
    `deadline_k` > 0 adapts the round deadline to the sites' pace (`--round-deadline-k`);
    `budget_s` > 0 time-boxes the rounds (`--round-budget`)."""
    return ["--train", "micro", "--max-documents", str(docs), "--inner-steps", str(inner_steps),
            "--batch-size", "1", "--round-deadline", str(round_deadline), "--start-sites", "2",
            "--data-epochs", "100000", *(["--round-deadline-k", str(deadline_k)] if deadline_k > 0 else []),
            *(["--round-budget", str(budget_s)] if budget_s > 0 else [])]


def listed_jobs(slurm: SlurmCluster, site: str) -> dict[int, tuple[str, str]]:
    """seq -> (job id, Slurm state) of `site`'s jobs of the run that Slurm lists, read apart from
    the loop's own reading (ops/autopilot/queue.py), which is what is under test."""
    out = slurm.run("squeue", "--states=all", "--noheader", "--format=%i|%j|%T").stdout
    jobs = {}
    for line in out.splitlines():
        job_id, name, state = line.strip().split("|")
        named = parse_job_name(name, RUN)
        if named is not None and named[0] == site:
            assert named[1] not in jobs, f"job name {name} used twice"
            jobs[named[1]] = (job_id, state)
    return jobs


@dataclass
class Job:
    site: str
    seq: int
    job_id: str
    state: str

    @property
    def member(self) -> str:
        return f"{self.site}.j{self.seq}"


@dataclass(frozen=True)
class _RunLog:
    """What the run's log (a's) says of the members."""

    changes: dict[str, list[tuple[int, bool]]]
    """member -> (log index, added) of each of its voter changes, in log order."""
    left: dict[str, int]
    """member -> log index of its graceful leave."""
    trained: set[str]
    """The members that trained a committed round."""

    def voter_at(self, member: str, index: int) -> bool:
        """Whether `member` was a voter just before log index `index`."""
        before = [added for i, added in self.changes.get(member, []) if i < index]
        return bool(before) and before[-1]

    def relieved_by(self, jobs: dict[int, Job], n: int) -> list[str]:
        """The later jobs of job `n`'s site (its successor, or the successor's replacement after a
        fault) that were voters when job n left them gracefully."""
        at = self.left.get(jobs[n].member)
        return [] if at is None else [j.member for m, j in jobs.items() if m > n and self.voter_at(j.member, at)]


@dataclass
class AutopilotMesh:
    """Site a (a process), the job sites (jobs of the real Slurm) and the operator loop between them."""

    workdir: Path
    slurm: SlurmCluster
    cluster: Cluster
    a: Peer
    run_file: Path
    sites: tuple[str, ...]
    """The job sites, each living only in the loop's Slurm jobs."""
    loop: subprocess.Popen[str] | None = None
    train: list[str] = field(default_factory=train_args)

    @classmethod
    def start(cls, workdir: Path, slurm: SlurmCluster, alloc: Allocation = Allocation(),
              interval_s: float = 2.0, train: list[str] | None = None,
              sites: tuple[str, ...] = ("b",), preset: str = "lan", voters: tuple[str, ...] = ()) -> AutopilotMesh:
        """`preset`: every peer's membership and election timings (peer/config.py PRESETS);
        `voters`: long-lived trainer-less direct sites beside a (the README's week-long recipe, step
        1), so that a fault on one job's peer never leaves the voters without a majority."""
        train = train if train is not None else train_args()
        cluster = Cluster(workdir, tls=True, preset=preset)
        mesh: AutopilotMesh | None = None
        try:
            run_file = workdir / "run.toml"
            _write_run_file(run_file, workdir, slurm, cluster, "", alloc, train, sites, voters)
            a = cluster.start("a", extra=["--config", str(run_file), *train])
            for voter in voters:
                cluster.start(voter, join=[a.address], extra=["--config", str(run_file)])
            for site in sites:  # one certificate per site, for all its jobs
                issue(cluster.certs, site, "site", cluster.certs, LOOPBACK)
            _write_run_file(run_file, workdir, slurm, cluster, a.address, alloc, train, sites, voters)
            mesh = cls(workdir, slurm, cluster, a, run_file, sites, train=train)
            mesh.loop = subprocess.Popen(
                [sys.executable, "-m", "ops.cli", "autopilot", "--config", str(run_file), "--interval",
                 str(interval_s), "--handover", str(alloc.handover_s)],
                stdout=subprocess.DEVNULL, stderr=(workdir / "autopilot.log").open("a"), text=True, env=_env(),
                cwd=REPO)
            return mesh
        except BaseException:
            if mesh is not None:
                mesh.close()
            else:
                cluster.close()
            raise

    # -- what the checks read -------------------------------------------------------------------

    def jobs(self, site: str) -> dict[int, Job]:
        """seq -> `site`'s jobs as Slurm lists them (MinJobAge keeps ended ones 10 minutes)."""
        return {seq: Job(site, seq, job_id, state) for seq, (job_id, state) in listed_jobs(self.slurm, site).items()}

    def running(self) -> list[Job]:
        """The running jobs of every job site."""
        return [j for site in self.sites for j in self.jobs(site).values() if j.state == "RUNNING"]

    def jobs_run(self, site: str) -> int:
        """How many of `site`'s jobs started: their batch output stays when Slurm forgets them."""
        return len(list(self.workdir.glob(f"sitemesh-{site}-*.out")))

    def output(self, job: Job) -> str:
        """The job's batch output: its batch shell's lines and its peer's log."""
        path = self.workdir / f"sitemesh-{job.site}-{job.job_id}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def commits(self) -> list[RoundCommit]:
        return commits(self.workdir / "a")

    def _log(self) -> _RunLog:
        """The run's log as it is on a's disk now."""
        log = _RunLog({}, {}, set())
        for i, entry in enumerate(FileStore(self.workdir / "a" / "consensus").reload().entries):
            body = entry.body
            if isinstance(body, VoterChange):
                log.changes.setdefault(body.site, []).append((i, body.add))
                if body.reason == "graceful leave":
                    log.left.setdefault(body.site, i)
            elif isinstance(body, RoundCommit):
                log.trained.update(x.site for x in body.contributors)
        return log

    def handovers(self, site: str) -> list[int]:
        """Every N whose job N handed `site` over: a later job of the site was a voter when job N
        left and trained a committed round, and job N ended by that leave before its wall time, at
        Slurm's SIGTERM or its peer's own (`--leave-before`) (COMPLETED, not killed at its wall time
        nor made to leave early)."""
        jobs, log = self.jobs(site), self._log()
        return [n for n, job in sorted(jobs.items())
                if job.state == "COMPLETED" and _left_at_its_end(self.output(job))
                and any(m in log.trained for m in log.relieved_by(jobs, n))]

    def dropped(self, site: str) -> list[int]:
        """Every N whose job N of `site` ended without a handover: not by a graceful leave (killed,
        failed, cancelled), or with no later job of the site a voter when it left; a test fails on
        the first."""
        jobs, log = self.jobs(site), self._log()
        return [n for n, job in sorted(jobs.items())
                if job.state not in _LIVE and not (job.state == "COMPLETED" and log.relieved_by(jobs, n))]

    def _job_dirs(self) -> list[Path]:
        """The data dirs every job of every job site left."""
        return [d for site in self.sites for d in sorted((self.workdir / site).glob("j*"))]

    def audit(self) -> list[dict[str, Any]]:
        """`ops audit --json` over a and every job that left a data dir: every epoch's record."""
        dirs = [self.workdir / "a", *self._job_dirs()]
        result = ops("audit", *[a for d in dirs for a in ("--data-dir", str(d))], "--json", timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        return list(json.loads(result.stdout))

    def thetas(self) -> dict[str, dict[int, str]]:
        """member -> round -> the θ hash it logged on applying the round (a, and every job)."""
        out = {"a": self.a.thetas()}
        for path in sorted(self.workdir.glob("sitemesh-*.out")):  # jobs Slurm no longer lists too
            text = path.read_text(errors="replace")
            member = re.search(r"^peer (\S+\.j\d+) listening", text, re.M)
            if member is not None:
                out[member.group(1)] = {int(r): h for r, h in re.findall(r"round (\d+) applied: θ ([0-9a-f]+)", text)}
        return out

    def theta_splits(self) -> set[int]:
        """The rounds that members applied with different θ (empty: θ identical on every member)."""
        seen: dict[int, set[str]] = {}
        for applied in self.thetas().values():
            for r, h in applied.items():
                seen.setdefault(r, set()).add(h)
        return {r for r, hashes in seen.items() if len(hashes) > 1}

    def rounds_lost(self) -> int:
        """Committed rounds missing from a's log (a number skipped) or applied by members with
        different θ: rounds a handover or a fault discarded."""
        rounds = [c.round for c in self.commits()]
        missing = len(set(range(1, max(rounds, default=0) + 1)) - set(rounds))
        return missing + len(self.theta_splits())

    def round_gaps(self) -> list[float]:
        """The times a's log shows between two committed rounds (from its first one)."""
        times = [dt.datetime.strptime(t, "%Y-%m-%d %H:%M:%S,%f").timestamp() for t in
                 re.findall(r"^(\S+ \S+) INFO sitemesh.node: round \d+ committed", self.a.log(), re.M)]
        return [b - a for a, b in zip(times, times[1:])]

    def max_stall_s(self) -> float:
        """The longest time a's log shows between two committed rounds."""
        return max(self.round_gaps(), default=0.0)

    @property
    def state_path(self) -> Path:
        """The loop's state file (its default, beside the run file)."""
        return self.run_file.with_name(self.run_file.name + ".autopilot.json")

    def accounting(self) -> Totals | None:
        """The allocation accounting of every job site's jobs (ops/accounting.py): from their records,
        and from the loop's state those that Slurm ended with none (no peer); None if there is no job."""
        records = [r for d in self._job_dirs() for r in job_record.read_dir(d)]
        loop_jobs = AutopilotState.read(self.state_path).jobs.values() if self.state_path.exists() else ()
        total = accounting.account(records, loop_jobs).total
        return total if total.jobs else None

    def peer_pid(self, job: Job) -> int | None:
        """The process id of job `job`'s peer (`peer serve ... --job N`), None once it is gone."""
        found = subprocess.run(["pgrep", "-f", "--", f"--data-dir {self.workdir / job.site} .*--job {job.seq}$"],
                               capture_output=True, text=True).stdout.split()
        return int(found[0]) if found else None

    def decisions(self) -> list[str]:
        path = self.state_path
        return [d["line"] for d in json.loads(path.read_text())["decisions"]] if path.exists() else []

    # -- the end --------------------------------------------------------------------------------

    def stop_loop(self) -> None:
        if self.loop is not None and self.loop.poll() is None:
            self.loop.send_signal(signal.SIGTERM)
            self.loop.wait(timeout=30)

    def close(self) -> None:
        """Stops the loop, cancels the sites' jobs (waiting until Slurm lists none running) and stops a."""
        try:
            self.stop_loop()
            self.slurm.clear(timeout_s=60)
        finally:
            self.cluster.close()


def _left_at_its_end(output: str) -> bool:
    """Whether a job's output says its peer left because the job's end drew near: Slurm's SIGTERM
    (the template's trap) or the peer's own timer (peer/cli.py)."""
    return "SIGTERM before wall-time, peer leaving" in output or re.search(r"its job ends in -?\d+ s, leaving",
                                                                          output) is not None


def _write_run_file(path: Path, workdir: Path, slurm: SlurmCluster, cluster: Cluster, seed: str, alloc: Allocation,
                    train: list[str], sites: tuple[str, ...], voters: tuple[str, ...]) -> None:
    """The run file: site a and the trainer-less `voters` (no Slurm) and the job sites, whose jobs
    run `peer serve ... --join a`."""
    path.write_text(f"""
[run]
name = "{RUN}"
[placement]
target_tokens = 1e12
log = "placement.jsonl"
[sites.a]
""" + "".join(f"[sites.{voter}]\n" for voter in voters)
        + "".join(_job_site(site, workdir, slurm, cluster, seed, alloc, train) for site in sites))


def _job_site(site: str, workdir: Path, slurm: SlurmCluster, cluster: Cluster, seed: str, alloc: Allocation,
              train: list[str]) -> str:
    """A job site's run-file section: its jobs keep their state under `<workdir>/<site>`."""
    peer = (f"{sys.executable} -m peer.cli serve --listen 127.0.0.1:0 --preset {cluster.preset} --data-dir {workdir / site} "
            f"--certs {cluster.certs} {' '.join(train)}" + (f" --join {seed}" if seed else ""))
    return f"""[sites.{site}]
tokens_per_s = 1000.0
[sites.{site}.slurm]
nodes = 1
time = "{alloc.wall}"
partition = "shared"
signal_seconds = {alloc.signal_s}
{"" if alloc.leave_s is None else f"leave_seconds = {alloc.leave_s}"}
command_prefix = {json.dumps(slurm.prefix)}
template = "{TEMPLATE}"
peer_command = {json.dumps(peer)}
workdir = "{workdir}"
env = {{ PYTHONPATH = "{REPO}", SITEMESH_SRUN_ARGS = "", PYTHONUNBUFFERED = "1" }}
"""
