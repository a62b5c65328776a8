"""A site and its jobs: one site of a run is served over time by many Slurm jobs, and a job that
hands over to its successor runs beside it for a while, so each job is a member of its own.

A job's member is named `SITE.jN` (N: the job's sequence number, which `ops autopilot` gives every
job it submits): the successor joins as a new member while its predecessor still trains, takes θ
and the log by state transfer, and the predecessor leaves gracefully at its SIGTERM; nothing in
membership, consensus or the data leases changes for it (a late join and a leave). A second process
under one member's name is still refused (peer/core/member_admission.py). The certificate stays
the site's: a site's certificate speaks for the site and its jobs, no other
(peer/transport/auth.py), and a relayed job proves the site's name (peer/transport/route.py).

    .venv/bin/python -m pytest tests/unit/test_site_names.py -q
"""

from __future__ import annotations

import re

_JOB = re.compile(r"(?P<site>.+)\.j(?P<job>[0-9]{1,9})")


def job_member(site: str, job: int) -> str:
    """The member name of `site`'s job number `job` (>= 1)."""
    if job < 1:
        raise ValueError(f"job number {job}: give 1 or more")
    return f"{site}.j{job}"


def site_of(member: str) -> str:
    """The site a member name belongs to: itself, or the site of a job's member."""
    m = _JOB.fullmatch(member)
    return m.group("site") if m else member


def is_job_member(name: str) -> bool:
    """True for a name that reads as a job's member (a site may not be named so)."""
    return _JOB.fullmatch(name) is not None


def job_number(member: str) -> int | None:
    """The job number of a job's member name, None for a site's own name."""
    m = _JOB.fullmatch(member)
    return int(m.group("job")) if m else None
