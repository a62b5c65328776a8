"""A site's jobs of this run as Slurm's accounting remembers them (`sacct`): what the operator loop
reconciles its state with on start, so that no sequence number is reused after squeue forgot them.

squeue lists an ended job only for `MinJobAge` (300 s by default), and the loop's state file is
the only other memory of the numbers used; a lost state file, or a second loop elsewhere with its
own, would start again below a job that ended long ago and give a new job the name (and its peer
the member name `<site>.j<seq>`) of that earlier one. `sacct --allocations` lists the user's jobs
from the accounting database for as long as the site keeps them, recognised by name as squeue's
are (ops/autopilot/queue.py). A site without accounting (`AccountingStorageType=accounting_storage/none`:
sacct says "Slurm accounting storage is disabled") answers with `no_accounting` and the loop goes
on with squeue and the state file, as before. The command goes through the site's command prefix.

    .venv/bin/python -m pytest tests/unit/test_autopilot_history.py -q
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from ops.autopilot.keeper import Job, JobState, job_state
from ops.autopilot.queue import parse_limit_s, parse_when, run_rows
from ops.placement.slurm import SlurmError, SlurmSite

_SINCE = "2000-01-01T00:00:00"
"""sacct's `--starttime`. Its default is today's midnight, and the run's first job may be older
than anything this loop remembers (its state file lost is the very case), so: as far back as the
site keeps accounting. The cost is one query of the user's own jobs when the loop starts."""

_FIELDS = "JobID,JobName,State,Start,End,Timelimit,NNodes,AllocNodes"
"""NNodes is the count allocated, or asked for where none was; AllocNodes 0 marks a job that never
ran (sacct then prints its cancellation as its start as well as its end)."""
_DISABLED = "accounting storage is disabled"
"""What sacct says (exit 1) where Slurm keeps no accounting; older releases spell Slurm in capitals."""


@dataclass(frozen=True)
class History:
    """What a site's accounting holds of the run's jobs there."""

    jobs: tuple[Job, ...] = ()
    """The run's jobs at the site that sacct lists, by sequence number. sacct lists only jobs that
    became eligible: one cancelled while its --begin lay ahead never ran, so no peer ever had its
    name, and it is missing here."""
    no_accounting: str = ""
    """Why the site has no accounting to ask, in sacct's words ('' where sacct answered)."""


def site_history(slurm: SlurmSite, run: str, site: str) -> History:
    """This run's jobs at `site` in its accounting; SlurmError where sacct fails otherwise than by
    the site keeping no accounting."""
    argv = ["sacct", "--allocations", "--noheader", "--parsable2", f"--starttime={_SINCE}", "--endtime=now",
            f"--format={_FIELDS}"]
    proc = slurm.run(argv, check=False)
    said = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0 and _DISABLED in said.lower():
        return History(no_accounting=said.splitlines()[-1])
    if proc.returncode != 0:
        raise SlurmError(f"{shlex.join(slurm.command(argv))} failed with exit {proc.returncode}\n{said or '(no output)'}")
    return History(tuple(parse_sacct(proc.stdout, run, site)))


def parse_sacct(text: str, run: str, site: str) -> list[Job]:
    """`site`'s jobs of `run` in sacct's `--parsable2` lines of `_FIELDS`, by sequence number."""
    jobs: list[Job] = []
    for seq, (job_id, _, state, start, end, limit, nodes, allocated), line in run_rows(text, run, site, "sacct"):
        if not (nodes.isdigit() and int(nodes) >= 1 and allocated.isdigit()):
            raise SlurmError(f"unexpected node counts {nodes!r}, {allocated!r} in sacct line {line!r}")
        kind = job_state(state)
        ran = allocated != "0"
        jobs.append(Job(site, seq, job_id, kind, state, parse_limit_s(limit), parse_when(start) if ran else None,
                        parse_when(end) if kind in (JobState.ENDED, JobState.FAILED) else None, nodes=int(nodes)))
    return sorted(jobs, key=lambda j: j.seq)
