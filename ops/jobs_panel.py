"""The `ops report` panel of jobs per site over time: a bar per job, joining, training and tail.

A site's row shows its allocations one after another; a successor that joins while its
predecessor still trains (a handover, ops autopilot) is drawn just above it, so overlap shows.
Training spans the first to the last inner step (the idle seconds between steps included: the
accounting table gives those); a job with no exit on record ends at its record's last write,
hatched; a job that ended with no peer record (its batch script failed first) is one grey bar.
Times are hours since the run's first job began.
"""

from __future__ import annotations

from ops.accounting import HOUR, Accounting

SEGMENTS = (("joining", "tab:orange"), ("training", "tab:green"), ("tail", "tab:red"))
NO_PEER = ("no peer", "tab:gray")
"""A job that ended with no peer record (ops/accounting.py): its whole allocation, one grey bar."""
LANE = 0.35
"""Height of a job's bar; overlapping jobs of a site take turns between two lanes."""


def draw(ax, acc: Accounting) -> None:  # ax: matplotlib Axes (lazy matplotlib: `ops` starts fast)
    jobs = acc.total.jobs
    origin = min((j.record.job_start for j in jobs), default=0.0)
    seen: set[str] = set()
    for row, site in enumerate(acc.sites):
        for k, job in enumerate(site.jobs):
            r = job.record
            first = r.first_step if r.first_step is not None else job.end
            last = r.last_step if r.last_step is not None else first
            spans = ((r.job_start, first), (first, last), (last, job.end))
            bars = [(NO_PEER, (r.job_start, job.end))] if job.no_peer else zip(SEGMENTS, spans)
            y = row + (k % 2) * LANE * 1.1
            for (name, color), (a, b) in bars:
                if b > a:
                    ax.barh(y, (b - a) / HOUR, left=(a - origin) / HOUR, height=LANE, color=color,
                            hatch=None if job.ended else "//", edgecolor="black", linewidth=0.4,
                            label=name if name not in seen else None)
                    seen.add(name)
            ax.text((job.end - origin) / HOUR, y, f" {r.member}", va="center", fontsize="x-small")
    ax.set_yticks([row + LANE * 0.55 for row in range(len(acc.sites))], [s.name for s in acc.sites])
    ax.set_title(f"Jobs per site over time (goodput {acc.total.goodput:.2f}, fixed {acc.total.fixed_s:.0f} s/job)")
    ax.set_xlabel("hours since the first job began")
    ax.grid(alpha=0.3, axis="x")
    if seen:
        ax.legend(fontsize="small", loc="lower right")
