"""What the operator loop does next at each site, given what its queue shows: pure decisions.

A run outlives every allocation only if each site always has its next job queued in time: the
successor must be running, joined and caught up before the current job's wall time ends, so the
site hands over instead of dropping out. This core reads the site's jobs (from `squeue`, by name:
`sitemesh-<run>-<site>-<seq>`, ops/autopilot/queue.py, and the loop's state file) and says, with a
reason:

* **Submit** the next sequence number: at once when the site has no job running or queued (first
  start, or the last one ended or failed), or, while a job runs, a successor that Slurm may start
  from `handover_s` before the running job's end: it queues in the meantime, so its queue wait
  overlaps the running job instead of following it. Slurm counts a job's queue wait only from its
  `--begin`, so the loop sets that earlier than the window by the site's calibrated predicted wait
  (`led_begin`; ops/autopilot/loop.py asks `sbatch --test-only` for it);
* **StartNow** a queued successor whose `--begin` lies ahead when no job of the site runs any more
  (the one it was to follow died, was cancelled or left early): the site would be out until then;
* **Hold** while a job is queued, while the site is backed off after `max_failures` failed jobs
  in a row (failed: Slurm ended it other than by completing or reaching its wall time, or it ran
  under `min_useful_s`), doubling the pause each further failure, and once the run's target is
  reached.

A sequence number is never reused: the next is one above every number the queue or the state file
has seen (the loop enters the accounting's highest into the state on start: ops/autopilot/history.py),
so a restarted loop, or a second one by mistake, cannot submit a job twice under one name
(ops/autopilot/loop.py reconciles before each decision). No clock, no I/O.

    .venv/bin/python -m pytest tests/unit/test_autopilot_keeper.py -q
"""

from __future__ import annotations

import datetime as dt
import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_SITE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


class JobState(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    ENDED = "ended"
    """Completed, or stopped at its wall time: how a job of this run normally ends."""
    FAILED = "failed"
    """Failed, cancelled, lost its node, ran out of memory, or never started."""


_SLURM_STATES = {
    "PENDING": JobState.QUEUED, "REQUEUED": JobState.QUEUED, "RESV_DEL_HOLD": JobState.QUEUED,
    "CONFIGURING": JobState.RUNNING, "RUNNING": JobState.RUNNING, "COMPLETING": JobState.RUNNING,
    "SUSPENDED": JobState.RUNNING, "STOPPED": JobState.RUNNING,
    "COMPLETED": JobState.ENDED, "TIMEOUT": JobState.ENDED,
}


def job_state(slurm_state: str) -> JobState:
    """Slurm's state word ("CANCELLED by 1000" included) as the keeper sees it."""
    return _SLURM_STATES.get(slurm_state.split(" ", 1)[0].rstrip("+"), JobState.FAILED)


def job_name(run: str, site: str, seq: int) -> str:
    return f"sitemesh-{run}-{site}-{seq}"


def parse_job_name(name: str, run: str) -> tuple[str, int] | None:
    """(site, seq) of a job this run's loop submitted, else None (another run's, or a person's)."""
    prefix = f"sitemesh-{run}-"
    site, _, seq = name.removeprefix(prefix).rpartition("-")
    if not name.startswith(prefix) or _SITE.fullmatch(site) is None or not seq.isdigit():
        return None
    return site, int(seq)


@dataclass(frozen=True)
class Job:
    """One job of a site, as the queue or the accounting shows it (times in seconds, any epoch)."""

    site: str
    seq: int
    job_id: str
    state: JobState
    slurm_state: str
    wall_s: float
    start: float | None = None
    """When it started (None: not yet)."""
    end: float | None = None
    """When it ended (None: not yet)."""
    begin: float | None = None
    """Queued and held back by its `--begin`: that time (None otherwise)."""
    nodes: int = 1
    """Nodes of the allocation (asked for while queued): the accounting counts node-hours."""

    @property
    def ends_by(self) -> float | None:
        """When a running job reaches its wall time."""
        return None if self.start is None else self.start + self.wall_s


@dataclass(frozen=True)
class KeeperConfig:
    """When to submit and when to stop trying."""

    handover_s: float = 600.0
    """The successor may start this long before the running job's end: time for its peer to start,
    join, take θ and the log by state transfer and train a round beside the old one."""
    max_failures: int = 3
    """Failed jobs in a row before the site is backed off (a broken module or script fails every job)."""
    backoff_s: tuple[float, float] = (600.0, 6 * 3600.0)
    """The first pause after `max_failures`, doubled for each further failure, and its cap."""
    min_useful_s: float = 120.0
    """A job that ended sooner than this after its start did no useful work: counted as failed (or
    sooner than half its wall time, for jobs shorter than twice this: a 2-minute job that left at
    its SIGTERM ran its course)."""

    def __post_init__(self) -> None:
        if self.handover_s < 0 or self.max_failures < 1 or self.min_useful_s < 0:
            raise ValueError(f"bad keeper config {self}: handover_s and min_useful_s >= 0, max_failures >= 1")
        if not 0 < self.backoff_s[0] <= self.backoff_s[1]:
            raise ValueError(f"backoff_s {self.backoff_s}: 0 < first <= cap")


@dataclass(frozen=True)
class Submit:
    site: str
    seq: int
    begin: float | None
    """When the successor may start: its handover window opens (None: as soon as it can). Its
    `--begin` is this, led by the queue wait (`led_begin`)."""
    reason: str


@dataclass(frozen=True)
class Hold:
    site: str
    reason: str


@dataclass(frozen=True)
class StartNow:
    """Let a queued successor start now: the job it was to follow ended before it could begin."""

    site: str
    seq: int
    job_id: str
    reason: str


Decision = Submit | Hold | StartNow


def min_useful_s(job: Job, config: KeeperConfig) -> float:
    """How long `job` must have run to count as having done a job's work."""
    return min(config.min_useful_s, job.wall_s / 2)


def failed(job: Job, config: KeeperConfig) -> bool:
    """A job that did not do a job's work: Slurm failed or cancelled it, or it ended at once."""
    if job.state is JobState.FAILED:
        return True
    return (job.state is JobState.ENDED and job.start is not None and job.end is not None
            and job.end - job.start < min_useful_s(job, config))


def decide(now: float, site: str, jobs: Sequence[Job], seen_seq: int, target_reached: bool,
           config: KeeperConfig) -> Decision:
    """The next step at `site`, whose jobs are `jobs` and whose highest sequence number ever seen
    (state file included) is `seen_seq`."""
    if target_reached:
        return Hold(site, "the run reached its target: no more jobs")
    queued = [j for j in jobs if j.state is JobState.QUEUED]
    running = sorted((j for j in jobs if j.state is JobState.RUNNING), key=lambda j: j.seq)
    if queued:
        waiting = queued[-1]
        if not running and waiting.begin is not None and waiting.begin > now:
            # Its predecessor died, was cancelled or ended early: waiting for --begin leaves the site out.
            return StartNow(site, waiting.seq, waiting.job_id,
                            f"no job running, and job {waiting.seq} ({waiting.job_id}) was to begin at "
                            f"{_clock(waiting.begin)}: it may start now")
        return Hold(site, f"job {waiting.seq} ({waiting.job_id}) is queued")
    done = sorted((j for j in jobs if j.state in (JobState.ENDED, JobState.FAILED)), key=lambda j: j.seq)
    streak = 0
    for job in reversed(done):
        if not failed(job, config):
            break
        streak += 1
    if streak >= config.max_failures and not running:
        last = done[-1]
        pause = min(config.backoff_s[0] * 2 ** (streak - config.max_failures), config.backoff_s[1])
        until = (last.end if last.end is not None else now) + pause
        if now < until:
            states = ", ".join(f"{j.seq} {j.slurm_state}" for j in done[-streak:])
            return Hold(site, f"backed off for {until - now:.0f} s more: its last {streak} jobs failed ({states})")
    seq = max([seen_seq, *(j.seq for j in jobs)]) + 1
    if not running:
        why = (f"its last job {done[-1].seq} ({done[-1].job_id}) {_how(done[-1], config)}" if done
               else "it has no job yet")
        return Submit(site, seq, None, f"no job running or queued: {why}")
    current = running[-1]
    ends = current.ends_by
    begin = None if ends is None else max(now, ends - config.handover_s)
    return Submit(site, seq, begin, f"job {current.seq} ({current.job_id}) runs until {_clock(ends)}: its "
                                     f"successor may start from {_clock(begin)}, {config.handover_s:.0f} s before")


def led_begin(now: float, opens: float, wait_s: float | None, wall_s: float, handover_s: float,
              why: str) -> tuple[float, str]:
    """The `--begin` of a successor whose window opens at `opens`, and its reason: `wait_s` (the
    site's calibrated predicted queue wait for the job's shape) earlier, so the successor has waited
    the queue by then (Slurm counts the wait only from its --begin); never before `now`. `wait_s`
    None (no calibrated prediction, `why` says why: a raw `--test-only` wait plans with time limits
    and is far too long): not led.

    The lead is at most `max_lead_s`: half the time from the predecessor's start to the window. A
    prediction can be wrong, and a job led back to its predecessor's start that then starts at once
    is itself a running job whose successor is due at once: one soak chained ten 2-minute jobs in
    90 s that way. Half-way keeps a wrong prediction's cost under half an allocation and the site's
    job starts at most one per half of `wall_s - handover_s`."""
    if wait_s is None:
        begin = max(now, opens)
        return begin, f"--begin {_clock(begin)}, not led by a queue wait: {why}"
    most = max_lead_s(wall_s, handover_s)
    lead = min(max(0.0, wait_s), most)
    begin = max(now, opens - lead)
    capped = (f" (at most half the {wall_s - handover_s:.0f} s from the predecessor's start to the window; "
              f"{wait_s:.0f} s predicted)" if wait_s > most else "")
    return begin, (f"--begin {_clock(begin)} = {_clock(opens)} - calibrated wait {lead:.0f} s{capped}"
                   + (", but not before now" if begin > opens - lead else "") + f" ({why})")


def max_lead_s(wall_s: float, handover_s: float) -> float:
    """The most a successor's --begin is led ahead of its window (`led_begin`): half of what is left
    of a job of `wall_s` once its successor's window of `handover_s` is taken off."""
    return max(0.0, wall_s - handover_s) / 2


def _how(job: Job, config: KeeperConfig) -> str:
    if job.state is JobState.FAILED:
        return f"failed ({job.slurm_state})"
    if failed(job, config) and job.start is not None and job.end is not None:
        return f"ended after {job.end - job.start:.0f} s, under {min_useful_s(job, config):.0f} s"
    return f"ended ({job.slurm_state})"


def _clock(t: float | None) -> str:
    return "an unknown time" if t is None else dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%H:%M:%S UTC")


def decide_all(now: float, jobs: Mapping[str, Sequence[Job]], seen: Mapping[str, int], sites: Sequence[str],
               target_reached: bool, config: KeeperConfig) -> list[Decision]:
    """One decision per site, in the order given."""
    return [decide(now, s, jobs.get(s, ()), seen.get(s, 0), target_reached, config) for s in sites]
