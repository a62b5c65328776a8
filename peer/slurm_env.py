"""When the peer's Slurm allocation began and ends, where Slurm does not say so itself.

Slurm 23.02 and later export SLURM_JOB_START_TIME and SLURM_JOB_END_TIME into a job's environment;
22.05 (Debian 12's, and some facilities') does not. The job record (peer/job_record.py: allocated
hours, goodput) and the self-timed leave (`peer serve --leave-before`) read those two variables,
so at start a peer inside such a job asks `squeue` once for them and sets them in its environment.
A peer outside Slurm, or whose squeue fails, goes on without: its leave then waits for the signal
and its record counts from the peer's own start.

    .venv/bin/python -m pytest tests/unit/test_slurm_env.py -q
"""

from __future__ import annotations

import datetime as dt
import subprocess
from collections.abc import Callable, MutableMapping

START, END = "SLURM_JOB_START_TIME", "SLURM_JOB_END_TIME"
SQUEUE_TIMEOUT_S = 20.0
"""A slow controller must not hold the peer's start for long."""

Squeue = Callable[[str], str]
"""Job id -> squeue's `%S|%e` line for it."""


def squeue(job_id: str) -> str:
    """The job's start and end as `squeue` prints them (local time, ISO 8601 without a zone)."""
    out = subprocess.run(["squeue", "--noheader", f"--jobs={job_id}", "--format=%S|%e"], capture_output=True,
                         text=True, timeout=SQUEUE_TIMEOUT_S, check=True)
    return out.stdout.strip()


def parse(line: str) -> tuple[float, float]:
    """(start, end) in seconds since the epoch from squeue's `%S|%e`; ValueError if either is not a
    time (`N/A`, `Unknown`, or another job's several lines)."""
    start, sep, end = line.partition("|")
    if not sep or "\n" in line:
        raise ValueError(f"expected one 'START|END' line, got {line!r}")
    return _local(start), _local(end)


def _local(text: str) -> float:
    try:
        # squeue prints the local time of its own process, which shares this one's time zone.
        return dt.datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise ValueError(f"{text.strip()!r} is not a time") from None


def complete(env: MutableMapping[str, str], ask: Squeue = squeue) -> str | None:
    """Set START and END in `env` from squeue where a Slurm job's environment lacks either. Returns
    a line for the log when they could not be learned, else None (also outside Slurm)."""
    job_id = env.get("SLURM_JOB_ID")
    if not job_id or (START in env and END in env):
        return None
    try:
        start, end = parse(ask(job_id))
    except (OSError, subprocess.SubprocessError, ValueError) as err:
        return (f"Slurm job {job_id}: no {START}/{END} in the environment and squeue did not give them "
                f"({err}): the peer leaves only at Slurm's signal, and its job record counts from its own start")
    env.setdefault(START, str(int(start)))
    env.setdefault(END, str(int(end)))
    return None
