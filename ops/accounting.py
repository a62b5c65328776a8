"""Where a run's allocations went: node-hours granted, training, joining, idle, and goodput.

Pure: it takes the peers' job records (peer/job_record.py, one per job and member data dir), and
optionally the run's jobs as Slurm showed them to the operator loop (its state file,
ops/autopilot/state.py), and computes, per job and per site, in node-hours (a job's seconds times
its nodes):

    allocated  job start -> job end (the peer's exit; without one, its record's last write)
    joining    job start -> first inner step (set-up, imports, state transfer, the first round's open;
               JobRecord.joining_s, the rule the peer's metric shares)
    training   seconds the trainer spent in inner steps (its own measurement)
    tail       last inner step -> job end (the leave at SIGTERM, the last exchange)
    idle       the rest: between inner steps (exchange, commit waits, evaluations not overlapped)
    no peer    the whole allocation of a job that Slurm ended with no peer record: its batch script
               failed before the peer started (a module that does not load, a missing venv, a crash
               in the imports) or its node did. Only the loop's state knows of such a job; it is
               matched to the records by site and Slurm job id, so a job with a record counts once.

    goodput    training / allocated, summed over jobs
    fixed      joining + tail of a job: what every job pays once, however long it runs

The fixed cost is why goodput depends on the wall time a site asks for. A job of wall time W that
trains F seconds less, and between its first and last inner step trains at the run's steady rate
g = training / (last step - first step), has

    goodput(W) = g * (W - F) / W        (0 when W <= F)

F is the mean fixed cost of the jobs that trained. With g = 1 this is the bound (W - F) / W that
the fixed cost alone allows (`fixed_only`); the gap to it is the per-round overhead.

    ops report --data-dir runs/X/lumi --data-dir runs/X/frontier --autopilot-state run.toml.autopilot.json --format md
    .venv/bin/python -m pytest tests/unit/test_accounting.py -q
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ops.autopilot.keeper import Job
from peer.core.site_names import job_member, site_of
from peer.job_record import JobRecord

__all__ = ["Accounting", "JobAccount", "Totals", "account", "no_peer_record", "table"]

HOUR = 3600.0


@dataclass(frozen=True)
class JobAccount:
    """One job's seconds (not node-weighted), split as the module docstring says."""

    record: JobRecord
    """The peer's record; for a no-peer job, its allocation as Slurm showed it (`no_peer_record`)."""
    no_peer: str = ""
    """Slurm's final state of a job that left no peer record (FAILED, NODE_FAIL, ...); empty for a
    job with one."""

    @property
    def end(self) -> float:
        """The job's end (`JobRecord.ran_until`): a lower bound when no exit is on record."""
        return self.record.ran_until

    @property
    def site(self) -> str:
        return site_of(self.record.member)

    @property
    def ended(self) -> bool:
        """The job's exit is on record; else it was killed or still runs, and its end is a lower bound."""
        return self.record.exited is not None

    @property
    def allocated_s(self) -> float:
        return self.record.allocated_s

    @property
    def training_s(self) -> float:
        return self.record.inner_s

    @property
    def joining_s(self) -> float:
        return 0.0 if self.no_peer else self.record.joining_s

    @property
    def no_peer_s(self) -> float:
        """The whole allocation of a job whose peer never started; 0 for one with a record."""
        return self.allocated_s if self.no_peer else 0.0

    @property
    def tail_s(self) -> float:
        last = self.record.last_step
        return 0.0 if last is None else max(self.end - last, 0.0)

    @property
    def steady_s(self) -> float:
        """First inner step -> last: the stretch in which the job trained at its steady rate."""
        r = self.record
        return 0.0 if r.first_step is None or r.last_step is None else max(r.last_step - r.first_step, 0.0)

    @property
    def idle_s(self) -> float:
        return max(self.allocated_s - self.joining_s - self.training_s - self.tail_s - self.no_peer_s, 0.0)

    @property
    def fixed_s(self) -> float:
        return self.joining_s + self.tail_s


@dataclass(frozen=True)
class Totals:
    """Node-hours of a set of jobs (one site's, or the run's)."""

    name: str
    jobs: tuple[JobAccount, ...]

    def _hours(self, seconds: Callable[[JobAccount], float]) -> float:
        return sum(seconds(j) * j.record.nodes for j in self.jobs) / HOUR

    @property
    def allocated_h(self) -> float:
        return self._hours(lambda j: j.allocated_s)

    @property
    def training_h(self) -> float:
        return self._hours(lambda j: j.training_s)

    @property
    def joining_h(self) -> float:
        return self._hours(lambda j: j.joining_s)

    @property
    def tail_h(self) -> float:
        return self._hours(lambda j: j.tail_s)

    @property
    def idle_h(self) -> float:
        return self._hours(lambda j: j.idle_s)

    @property
    def no_peer_h(self) -> float:
        return self._hours(lambda j: j.no_peer_s)

    @property
    def no_peer(self) -> tuple[JobAccount, ...]:
        return tuple(j for j in self.jobs if j.no_peer)

    @property
    def goodput(self) -> float:
        """Training / allocated node-hours; 0 before any allocation."""
        allocated = self.allocated_h
        return self.training_h / allocated if allocated > 0 else 0.0

    @property
    def trained(self) -> tuple[JobAccount, ...]:
        return tuple(j for j in self.jobs if j.record.first_step is not None)

    @property
    def fixed_s(self) -> float:
        """Mean fixed cost (joining + tail) of the jobs that trained, seconds; 0 when none did."""
        trained = self.trained
        return sum(j.fixed_s for j in trained) / len(trained) if trained else 0.0

    @property
    def steady(self) -> float:
        """Training / (last - first inner step) over the jobs that trained: goodput once joined."""
        steady = sum(j.steady_s * j.record.nodes for j in self.trained)
        training = sum(j.training_s * j.record.nodes for j in self.trained)
        return min(training / steady, 1.0) if steady > 0 else 1.0

    def projected(self, wall_s: float) -> float:
        """goodput(W) = steady * (W - fixed) / W of a job of wall time `wall_s` (module docstring)."""
        return self.steady * self.fixed_only(wall_s)

    def fixed_only(self, wall_s: float) -> float:
        """(W - fixed) / W: the goodput the fixed cost alone leaves a job of wall time `wall_s`."""
        if wall_s <= 0:
            raise ValueError(f"wall time {wall_s} s: give a positive number of seconds")
        return max(wall_s - self.fixed_s, 0.0) / wall_s


@dataclass(frozen=True)
class Accounting:
    sites: tuple[Totals, ...]
    """One per site, by name."""
    total: Totals
    """Every job of the run."""
    unended: tuple[Job, ...] = ()
    """Jobs of the loop's state that started, left no peer record, and were not seen to end: still
    running, or ended while no pass looked (Slurm lists an ended job for MinJobAge only). Not
    counted: their end is unknown."""


def account(records: Iterable[JobRecord], slurm_jobs: Iterable[Job] = ()) -> Accounting:
    """The accounting of the jobs `records` describe (each job once: the caller reads each member
    dir once, and a job serves one member), and of the jobs of `slurm_jobs` (the operator loop's
    view of the run's jobs) that left no record: those Slurm ended are counted as no-peer jobs, those
    it started and was not seen to end are named in `unended`. A job in neither that never started
    (cancelled while queued) allocated nothing and is left out."""
    records = list(records)
    recorded = {(site_of(r.member), r.job) for r in records}
    missing = [j for j in slurm_jobs if (j.site, j.job_id) not in recorded]
    no_peer = [JobAccount(no_peer_record(j), j.slurm_state) for j in missing
               if j.start is not None and j.end is not None and j.end > j.start]
    unended = tuple(j for j in missing if j.start is not None and j.end is None)
    jobs = tuple(sorted((*(JobAccount(r) for r in records), *no_peer), key=lambda j: (j.site, j.record.job_start)))
    sites = sorted({j.site for j in jobs})
    return Accounting(tuple(Totals(s, tuple(j for j in jobs if j.site == s)) for s in sites), Totals("total", jobs),
                      unended)


def no_peer_record(job: Job) -> JobRecord:
    """The record a job that ended before its peer started would have had: Slurm's start and end,
    exited at the end, nothing trained; its member is the one the loop named it for (`SITE.jN`)."""
    assert job.start is not None and job.end is not None, f"job {job.job_id} has not ended"
    member = job_member(job.site, job.seq) if job.seq >= 1 else job.site
    return JobRecord(job=job.job_id, member=member, nodes=job.nodes, job_start=job.start, peer_start=job.end,
                     updated=job.end, job_end=job.end, exited=job.end)


def table(acc: Accounting, wall_s: float = 2 * HOUR) -> str:
    """The accounting as a markdown table, a row per site and the run's total, then the
    projection at a job wall time of `wall_s`."""
    lines = ["| site | jobs | allocated h | training h | joining h | idle h | tail h | no peer h | goodput | "
             "fixed s/job |", "|---" * 10 + "|"]
    for t in (*acc.sites, acc.total):
        lines.append(f"| {t.name} | {len(t.jobs)} | {t.allocated_h:.3f} | {t.training_h:.3f} | {t.joining_h:.3f} | "
                     f"{t.idle_h:.3f} | {t.tail_h:.3f} | {t.no_peer_h:.3f} | {t.goodput:.3f} | {t.fixed_s:.1f} |")
    total = acc.total
    lines += ["", "Hours are node-hours. Goodput = inner-step hours / allocated hours; fixed = job start to "
              "first inner step plus last inner step to exit; no peer = the whole allocation of a job that ended "
              "with no peer record (the operator loop's state file, `--autopilot-state`)."]
    if total.trained:
        lines.append(f"At a {wall_s / HOUR:g} h wall time: goodput {total.projected(wall_s):.3f} = steady "
                     f"{total.steady:.3f} x (W - {total.fixed_s:.1f} s) / W; the fixed cost alone allows "
                     f"{total.fixed_only(wall_s):.3f}.")
    open_jobs = [j.record.job for j in total.jobs if not j.ended]
    if open_jobs:
        lines.append(f"No exit on record for job(s) {', '.join(open_jobs)} (still running, or killed): their "
                     "end is their record's last write, so their hours are a lower bound.")
    if total.no_peer:
        named = _named(f"{j.record.job} ({j.record.member}, {j.no_peer}, {Totals(j.site, (j,)).no_peer_h:.3f} h)"
                       for j in total.no_peer)
        lines.append(f"No peer record for job(s) {named}: Slurm ended them before their peer wrote one (the batch "
                     "script failed before the peer started, or the node did), so their whole allocation is counted, "
                     "under no peer h.")
    if acc.unended:
        named = _named(f"{j.job_id} ({j.site} job {j.seq}, last seen {j.slurm_state})" for j in acc.unended)
        lines.append(f"Started, no peer record, end not seen: job(s) {named} (still running, or ended while the "
                     "operator loop did not look: Slurm lists an ended job for MinJobAge only); not counted.")
    return "\n".join(lines)


def _named(items: Iterable[str], most: int = 10) -> str:
    """The first `most` of `items`, and how many more."""
    items = list(items)
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")
