"""`<data dir>/jobs/<job>.json`: when this peer's allocation began, trained and ended, for accounting.

A site is served over time by many jobs; `ops report` turns these records into allocation-hours
granted, training, joining and idle, and the run's goodput (ops/accounting.py). A peer keeps the
record of the job it runs in, rewritten atomically (peer/durable.py) at start, after every trainer
run and at exit, so a killed job still leaves what it did up to its last round.

One file per job, named by the Slurm job id (`SLURM_JOB_ID`; outside Slurm, by the process), so
several jobs that serve a site from one data dir keep their own records, and a peer restarted
inside the same allocation carries on its job's record. Wall-clock seconds since the epoch
throughout: the job's start comes from Slurm, on another clock than the peer's monotonic one.

    .venv/bin/python -m pytest tests/unit/test_job_record.py -q
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from peer.durable import write_atomic

__all__ = ["JOBS_DIR", "JobLog", "JobRecord", "job_end", "read_dir"]

log = logging.getLogger("sitemesh.job")

JOBS_DIR = "jobs"


@dataclass(frozen=True)
class JobRecord:
    """One job's life at one member, in wall-clock seconds since the epoch."""

    job: str
    """The Slurm job id, or `local-PID-START` for a peer started outside Slurm."""
    member: str
    """The member the job served (`SITE` or `SITE.jN`)."""
    nodes: int
    """Nodes of the allocation (SLURM_JOB_NUM_NODES; 1 outside Slurm): hours are node-hours."""
    job_start: float
    """When the allocation began (SLURM_JOB_START_TIME, else the peer's start)."""
    peer_start: float
    """When this peer process started: after the job's own set-up (modules, srun, imports)."""
    updated: float
    """The last time the record was written: a lower bound of the job's end when it has no exit."""
    job_end: float | None = None
    """When Slurm will end the allocation (SLURM_JOB_END_TIME); None when not under Slurm."""
    first_step: float | None = None
    """When the first trainer run's inner steps began; None while the job has trained nothing."""
    last_step: float | None = None
    """When the last trainer run's inner steps ended."""
    inner_s: float = 0.0
    """Seconds the trainer spent in inner steps (its own measurement, summed over runs)."""
    inner_steps: int = 0
    exited: float | None = None
    """When the peer stopped (a graceful leave, SIGTERM); None while it runs or after a kill -9."""

    @property
    def ran_until(self) -> float:
        """Until when the job ran, as far as the record knows: its exit, else its last write (a lower
        bound: the job was killed or still runs). Not `job_end`, which is Slurm's deadline."""
        return self.exited if self.exited is not None else self.updated

    @property
    def allocated_s(self) -> float:
        """Seconds of the allocation the job used, up to `ran_until` (never negative: two clocks)."""
        return max(self.ran_until - self.job_start, 0.0)

    @property
    def joining_s(self) -> float:
        """Seconds from the job's start to its first inner step: the set-up every job pays once. The
        one rule behind `sitemesh_job_joining_seconds` (peer/metrics.py) and `ops report`
        (ops/accounting.py). A job that has not trained has only joined, up to `ran_until`; the first
        step is clipped to `ran_until` too, so that joining never exceeds the job's allocated seconds
        (a wall clock stepped back between writes). Never negative: the start is read off Slurm's
        clock, the first step off this node's."""
        joined = self.ran_until if self.first_step is None else min(self.first_step, self.ran_until)
        return max(joined - self.job_start, 0.0)

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: object) -> JobRecord:
        """The record `obj` holds; ValueError naming what is missing or of the wrong type."""
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        known = {f.name for f in fields(cls)}
        try:
            record = cls(**{k: v for k, v in obj.items() if k in known})
        except TypeError as err:
            raise ValueError(str(err)) from None
        for name in ("job_start", "peer_start", "updated", "inner_s"):
            if not isinstance(getattr(record, name), int | float):
                raise ValueError(f"{name} is not a number")
        return record


def read_dir(data_dir: Path) -> list[JobRecord]:
    """The job records kept in one member's data dir, oldest job first; ValueError naming a bad file."""
    out = []
    for path in sorted((data_dir / JOBS_DIR).glob("*.json")):
        try:
            out.append(JobRecord.from_json(json.loads(path.read_text(encoding="utf-8"))))
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as err:
            raise ValueError(f"{path} is not a job record ({err}): move it aside; that job is then "
                             "left out of the accounting") from None
    return sorted(out, key=lambda r: r.job_start)


class JobLog:
    """Keeps this process's job record on disk. Never fails the peer: the record is for people,
    so a write that fails is logged and the next one tries again."""

    def __init__(self, data_dir: Path, member: str, env: Mapping[str, str] = os.environ,
                 wall: Callable[[], float] = time.time) -> None:
        self._wall = wall
        now = wall()
        job = env.get("SLURM_JOB_ID") or f"local-{os.getpid()}-{int(now)}"
        self.path = data_dir / JOBS_DIR / f"{job}.json"
        self.record = self._carried_on() or JobRecord(
            job=job, member=member, nodes=int(_number(env, "SLURM_JOB_NUM_NODES") or 1),
            job_start=_number(env, "SLURM_JOB_START_TIME") or now, peer_start=now, updated=now,
            job_end=job_end(env))

    def _carried_on(self) -> JobRecord | None:
        """The record of this job from an earlier process in the same allocation (a restart)."""
        try:
            previous = JobRecord.from_json(json.loads(self.path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:  # json's errors are ValueErrors
            log.warning("job record %s unreadable (%s); starting it afresh", self.path, err)
            return None
        return replace(previous, exited=None)

    def started(self) -> None:
        self._save(self.record)

    def live(self) -> JobRecord:
        """The record as of now, unwritten: a running job's seconds up to this moment (`ops status`)."""
        return replace(self.record, updated=self._wall())

    def trained(self, seconds: float, steps: int) -> None:
        """A trainer run ended now after `seconds` of inner steps (taken to be the run's last ones)."""
        if steps <= 0:
            return
        now, r = self._wall(), self.record
        first = now - seconds if r.first_step is None else r.first_step
        self._save(replace(r, first_step=first, last_step=now, inner_s=r.inner_s + seconds,
                           inner_steps=r.inner_steps + steps))

    def exited(self) -> None:
        self._save(replace(self.record, exited=self._wall()))

    def _save(self, record: JobRecord) -> None:
        self.record = replace(record, updated=self._wall())
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps(self.record.to_json(), sort_keys=True))
        except OSError as err:
            log.warning("job record %s not written: %s", self.path, err)


def job_end(env: Mapping[str, str] = os.environ) -> float | None:
    """When Slurm ends this process's allocation (SLURM_JOB_END_TIME, seconds since the epoch); None
    outside Slurm."""
    return _number(env, "SLURM_JOB_END_TIME")


def _number(env: Mapping[str, str], name: str) -> float | None:
    """`env[name]` as a number; None when unset or not one (logged: Slurm sets these, a person may not)."""
    text = env.get(name, "")
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        log.warning("%s=%r is not a number; ignored", name, text)
        return None
