"""A site's jobs of this run as its Slurm shows them (the operator loop's eyes), and submission.

`squeue --me --states=all` lists the user's jobs, queued, running and recently ended (Slurm keeps
ended jobs for `MinJobAge`, 300 s by default); jobs are recognised by name
(`sitemesh-<run>-<site>-<seq>`, ops/autopilot/keeper.py), so jobs of other runs and a person's own
are left alone. Older ended jobs need no listing each pass: the loop's state file remembers their
sequence numbers, which is all the keeper needs of them, and on start the loop asks the site's
accounting for them as well (`sacct`, ops/autopilot/history.py), in case the file was lost. Every
command goes through the site's command prefix (ops/placement/slurm.py), as `ops probe` and
`ops submit` do.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

from ops.autopilot.keeper import Job, job_state, parse_job_name
from ops.placement.config import JobShape, parse_slurm_time
from ops.placement.slurm import SlurmError, SlurmSite, parse_slurm_timestamp

_FORMAT = "%i|%j|%T|%S|%e|%l|%r|%D"
"""Job id, name, state, start, end, time limit, why it is pending, nodes."""


def site_jobs(slurm: SlurmSite, run: str, site: str) -> list[Job]:
    """This run's jobs at `site` that Slurm still lists, by sequence number."""
    proc = slurm.run(["squeue", "--me", "--states=all", "--noheader", f"--format={_FORMAT}"])
    jobs: list[Job] = []
    for seq, (job_id, _, state, start, end, limit, why, nodes), line in run_rows(proc.stdout, run, site, "squeue"):
        if not nodes.isdigit():  # the loop asks an exact --nodes: Slurm prints that number
            raise SlurmError(f"unexpected node count {nodes!r} in squeue line {line!r}")
        kind = job_state(state)
        queued = kind.name == "QUEUED"
        jobs.append(Job(site, seq, job_id, kind, state, parse_limit_s(limit),
                        None if queued else parse_when(start),
                        parse_when(end) if kind.name in ("ENDED", "FAILED") else None,
                        # Held back by its --begin: the start column is then that time (else a prediction).
                        parse_when(start) if queued and why == "BeginTime" else None, int(nodes)))
    return sorted(jobs, key=lambda j: j.seq)


def run_rows(text: str, run: str, site: str, tool: str) -> Iterator[tuple[int, list[str], str]]:
    """(sequence number, its 8 fields, the line) of each `|`-separated line of `tool`'s output whose
    second field names a job of `run` at `site`; SlurmError for a line of another shape."""
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.strip().split("|")
        if len(parts) != 8:
            raise SlurmError(f"unexpected {tool} line {line!r} in:\n{text.strip()}")
        named = parse_job_name(parts[1], run)
        if named is not None and named[0] == site:
            yield named[1], parts, line


def submit(slurm: SlurmSite, shape: JobShape, name: str, script: str, begin: float | None) -> str:
    """Submits `script` as `name`, not to start before `begin` (Unix seconds); the job id."""
    extra = [] if begin is None else [f"--begin={dt.datetime.fromtimestamp(begin, dt.timezone.utc):%Y-%m-%dT%H:%M:%S}"]
    return slurm.submit(shape, name, script, extra)


def start_now(slurm: SlurmSite, job_id: str) -> None:
    """Lets queued `job_id` start as soon as Slurm can (clears its --begin)."""
    slurm.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"])


def parse_when(text: str) -> float | None:
    """Unix seconds of a time squeue or sacct printed (TZ=UTC, standard format); None for none yet."""
    return None if text in ("N/A", "", "Unknown", "None") else parse_slurm_timestamp(text).timestamp()


def parse_limit_s(text: str) -> float:
    """Seconds of a time limit squeue or sacct printed; infinite where there is none of the job's own
    (sacct says Partition_Limit for a job submitted without --time)."""
    return (float(parse_slurm_time(text)) if text not in ("UNLIMITED", "INVALID", "Partition_Limit", "")
            else float("inf"))
