"""The operator loop's state file: the job numbers it has used, its decisions, and the run's jobs.

`ops autopilot --state FILE` (default `<run file>.autopilot.json`) keeps it between passes and
restarts (ops/autopilot/loop.py); `ops report --autopilot-state FILE` reads its jobs to count the
allocations that left no peer record (ops/accounting.py):

    {"run": "c4", "seen": {"lumi": 12},
     "decisions": [{"at": 1.8e9, "site": "lumi", "line": "lumi: holding: ...", "kind": "hold"}, ...],
     "jobs": [{"site": "lumi", "seq": 12, "job_id": "4711", "state": "failed", "slurm_state": "FAILED",
               "wall_s": 7200.0, "start": 1.8e9, "end": 1.8e9, "begin": null, "nodes": 2}, ...]}

A job is entered when the loop submits it and rewritten from every squeue listing that shows it
(ops/autopilot/queue.py), so what it holds of an ended job is what Slurm said of it last: its
state, start, end and nodes. A job Slurm forgot before a pass saw it end (Slurm lists ended jobs
for `MinJobAge`, 300 s by default) keeps the state it was last seen in, until the loop's next
start reads the site's accounting (sacct, ops/autopilot/history.py): that enters every ended job
of the run it lists and the file lacks or holds as not ended, and raises the highest number seen
to the accounting's. Files written before jobs were kept have none, and read as such.

    .venv/bin/python -m pytest tests/unit/test_autopilot_state.py -q
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ops.autopilot.keeper import Job, JobState
from peer.durable import write_atomic

__all__ = ["KEEP_DECISIONS", "AutopilotState"]

KEEP_DECISIONS = 1000
"""Decisions kept in the state file (the newest): a week of a three-site run at one a minute is
more than this only while nothing changes, and those are holds."""


@dataclass
class AutopilotState:
    """What the loop must remember between passes and restarts."""

    run: str
    seen: dict[str, int] = field(default_factory=dict)
    """Site -> the highest sequence number submitted (or seen in its queue)."""
    decisions: list[dict[str, Any]] = field(default_factory=list)
    jobs: dict[tuple[str, int], Job] = field(default_factory=dict)
    """(site, seq) -> the job as Slurm last listed it, or as submitted before any listing. Every
    job of the run is kept, not only the newest: the accounting needs each one (~250 bytes a job)."""

    @classmethod
    def read(cls, path: Path) -> AutopilotState:
        """The state in `path`; OSError when it cannot be read, ValueError naming a damaged file."""
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            jobs = [_job_from_json(j) for j in doc.get("jobs", [])]
            return cls(str(doc["run"]), {str(k): int(v) for k, v in doc["seen"].items()}, list(doc["decisions"]),
                       {(j.site, j.seq): j for j in jobs})
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"{path} is not an autopilot state file ({err}): move it aside only if no job of this "
                             "run is queued or running (or their numbers would be reused)") from None

    @classmethod
    def load(cls, path: Path, run: str) -> AutopilotState:
        """The loop's state of `run` in `path` (a fresh one if there is none); ValueError naming a
        damaged file or one of another run."""
        if not path.exists():
            return cls(run)
        state = cls.read(path)
        if state.run != run:
            raise ValueError(f"{path} belongs to run {state.run!r}, not {run!r}: give --state another file")
        return state

    def save(self, path: Path) -> None:
        self.decisions = self.decisions[-KEEP_DECISIONS:]
        doc = {"run": self.run, "seen": self.seen, "decisions": self.decisions,
               "jobs": [_job_json(self.jobs[k]) for k in sorted(self.jobs)]}
        write_atomic(path, json.dumps(doc, indent=1).encode())

    def listed(self, site: str, jobs: Iterable[Job]) -> None:
        """`site`'s jobs as its queue lists them now: each replaces what was known of it, and the
        highest number seen rises to theirs."""
        jobs = list(jobs)
        self.seen[site] = max([self.seen.get(site, 0), *(j.seq for j in jobs)])
        self.jobs.update(((j.site, j.seq), j) for j in jobs)

    def reconciled(self, site: str, jobs: Iterable[Job]) -> tuple[int, int]:
        """`site`'s jobs as Slurm's accounting remembers them (ops/autopilot/history.py): the highest
        number seen rises to theirs, and each ended job the file lacks, or holds as not ended (Slurm
        forgot it before a pass saw it end), is entered as the accounting says it ended. Live jobs
        are left to the squeue listing that follows. (The highest number before, jobs entered.)"""
        jobs = list(jobs)
        before = self.seen.get(site, 0)
        self.seen[site] = max([before, *(j.seq for j in jobs)])
        ended = (JobState.ENDED, JobState.FAILED)
        entered = [j for j in jobs if j.state in ended and (
            (j.site, j.seq) not in self.jobs or self.jobs[(j.site, j.seq)].state not in ended)]
        self.jobs.update(((j.site, j.seq), j) for j in entered)
        return before, len(entered)

    def submitted(self, job: Job) -> None:
        """A job just submitted, until a listing shows it."""
        self.jobs[(job.site, job.seq)] = job


def _job_json(job: Job) -> dict[str, Any]:
    # JSON has no infinity: an UNLIMITED wall time is null.
    return {**asdict(job), "state": job.state.value, "wall_s": None if math.isinf(job.wall_s) else job.wall_s}


def _job_from_json(obj: Any) -> Job:
    job = Job(**{**obj, "state": JobState(obj["state"]),
                 "wall_s": math.inf if obj["wall_s"] is None else float(obj["wall_s"])})
    for name in ("start", "end", "begin"):
        value = getattr(job, name)
        if value is not None and not isinstance(value, int | float):
            raise ValueError(f"job {job.job_id}: {name} is not a number")
    if not isinstance(job.nodes, int) or job.nodes < 1:
        raise ValueError(f"job {job.job_id}: nodes {job.nodes!r} is not a count of nodes")
    return job
