"""Where a run's allocations went: node-hours granted, training, joining, idle, and goodput.

Pure: it takes the peers' job records (peer/job_record.py, one per job and member data dir) and
computes, per job and per site, in node-hours (a job's seconds times its nodes):

    allocated  job start -> job end (the peer's exit; without one, its record's last write)
    joining    job start -> first inner step (set-up, imports, state transfer, the first round's open;
               JobRecord.joining_s, the rule the peer's metric shares)
    training   seconds the trainer spent in inner steps (its own measurement)
    tail       last inner step -> job end (the leave at SIGTERM, the last exchange)
    idle       the rest: between inner steps (exchange, commit waits, evaluations not overlapped)

    goodput    training / allocated, summed over jobs
    fixed      joining + tail of a job: what every job pays once, however long it runs

The fixed cost is why goodput depends on the wall time a site asks for. A job of wall time W that
trains F seconds less, and between its first and last inner step trains at the run's steady rate
g = training / (last step - first step), has

    goodput(W) = g * (W - F) / W        (0 when W <= F)

F is the mean fixed cost of the jobs that trained. With g = 1 this is the bound (W - F) / W that
the fixed cost alone allows (`fixed_only`); the gap to it is the per-round overhead.

    ops report --data-dir runs/X/lumi --data-dir runs/X/frontier --format md
    .venv/bin/python -m pytest tests/unit/test_accounting.py -q
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from peer.core.site_names import site_of
from peer.job_record import JobRecord

__all__ = ["Accounting", "JobAccount", "Totals", "account", "table"]

HOUR = 3600.0


@dataclass(frozen=True)
class JobAccount:
    """One job's seconds (not node-weighted), split as the module docstring says."""

    record: JobRecord

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
        return self.record.joining_s

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
        return max(self.allocated_s - self.joining_s - self.training_s - self.tail_s, 0.0)

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


def account(records: Iterable[JobRecord]) -> Accounting:
    """The accounting of the jobs `records` describe (each job once: the caller reads each member
    dir once, and a job serves one member)."""
    jobs = tuple(sorted((JobAccount(r) for r in records), key=lambda j: (j.site, j.record.job_start)))
    sites = sorted({j.site for j in jobs})
    return Accounting(tuple(Totals(s, tuple(j for j in jobs if j.site == s)) for s in sites), Totals("total", jobs))


def table(acc: Accounting, wall_s: float = 2 * HOUR) -> str:
    """The accounting as a markdown table, a row per site and the run's total, then the
    projection at a job wall time of `wall_s`."""
    lines = ["| site | jobs | allocated h | training h | joining h | idle h | tail h | goodput | fixed s/job |",
             "|---" * 9 + "|"]
    for t in (*acc.sites, acc.total):
        lines.append(f"| {t.name} | {len(t.jobs)} | {t.allocated_h:.3f} | {t.training_h:.3f} | {t.joining_h:.3f} | "
                     f"{t.idle_h:.3f} | {t.tail_h:.3f} | {t.goodput:.3f} | {t.fixed_s:.1f} |")
    total = acc.total
    lines += ["", "Hours are node-hours. Goodput = inner-step hours / allocated hours; fixed = job start to "
              "first inner step plus last inner step to exit."]
    if total.trained:
        lines.append(f"At a {wall_s / HOUR:g} h wall time: goodput {total.projected(wall_s):.3f} = steady "
                     f"{total.steady:.3f} x (W - {total.fixed_s:.1f} s) / W; the fixed cost alone allows "
                     f"{total.fixed_only(wall_s):.3f}.")
    open_jobs = [j.record.job for j in total.jobs if not j.ended]
    if open_jobs:
        lines.append(f"No exit on record for job(s) {', '.join(open_jobs)} (still running, or killed): their "
                     "end is their record's last write, so their hours are a lower bound.")
    return "\n".join(lines)
