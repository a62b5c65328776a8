"""The run's jobs as Slurm's accounting remembers them (ops/autopilot/history.py), and what the
loop makes of them on start (ops/autopilot/loop.py `_reconcile`): sacct's lines as a real process
prints them, through a command prefix that answers for Slurm (the sacct command line becomes $0,
unused), as tests/unit/test_autopilot_state.py does for squeue."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ops.autopilot import history, loop
from ops.autopilot.keeper import JobState
from ops.autopilot.state import AutopilotState
from ops.placement.slurm import SlurmError, SlurmSite

LINES = (
    "4712|sitemesh-c4-b-2|FAILED|2027-01-15T08:00:00|2027-01-15T08:01:00|02:00:00|4|4\n"
    "4790|sitemesh-c4-b-41|COMPLETED|2027-01-15T09:00:00|2027-01-15T11:00:00|02:00:00|4|4\n"
    # Cancelled while queued: sacct prints the cancellation as its start too; AllocNodes 0 says it never ran.
    "4795|sitemesh-c4-b-40|CANCELLED by 1000|2027-01-15T09:30:00|2027-01-15T09:30:00|Partition_Limit|4|0\n"
    "4801|sitemesh-c4-b-42|RUNNING|2027-01-15T11:00:00|Unknown|02:00:00|4|4\n"
    "4802|sitemesh-c4-lumi-50|COMPLETED|2027-01-15T09:00:00|2027-01-15T10:00:00|01:00:00|1|1\n"
    "4803|sitemesh-other-b-60|COMPLETED|2027-01-15T09:00:00|2027-01-15T10:00:00|01:00:00|1|1\n"
    "4804|interactive|COMPLETED|2027-01-15T09:00:00|2027-01-15T10:00:00|01:00:00|1|1\n"
)


def _site(tmp_path: Path, text: str) -> SlurmSite:
    out = tmp_path / "sacct.txt"
    out.write_text(text)
    return SlurmSite(["bash", "-c", f"cat {out}"])


def test_the_accounting_gives_the_runs_jobs_at_the_site_by_sequence_number(tmp_path: Path) -> None:
    found = history.site_history(_site(tmp_path, LINES), "c4", "b")
    assert found.no_accounting == ""
    assert [(j.seq, j.job_id, j.state) for j in found.jobs] == [
        (2, "4712", JobState.FAILED), (40, "4795", JobState.FAILED), (41, "4790", JobState.ENDED),
        (42, "4801", JobState.RUNNING)]
    failed, cancelled, ended, running = found.jobs
    assert failed.start is not None and failed.end == failed.start + 60 and failed.nodes == 4
    assert ended.end is not None and ended.start is not None and ended.end - ended.start == 7200
    assert (cancelled.start, cancelled.wall_s, cancelled.nodes) == (None, math.inf, 4)
    assert cancelled.end is not None  # when it was cancelled
    assert (running.end, running.wall_s) == (None, 7200.0)


def test_a_site_without_accounting_says_so_and_is_no_error(tmp_path: Path) -> None:
    slurm = SlurmSite(["bash", "-c", "echo 'Slurm accounting storage is disabled'; exit 1"])
    assert history.site_history(slurm, "c4", "b") == history.History(
        no_accounting="Slurm accounting storage is disabled")


@pytest.mark.parametrize("answer, match", [
    ("echo 'sacct: error: Problem talking to the database: Connection refused' >&2; exit 1",
     "failed with exit 1\nsacct: error: Problem talking to the database"),
    ("echo '4712|sitemesh-c4-b-2|FAILED'", "unexpected sacct line '4712|sitemesh-c4-b-2|FAILED'"),
    ("echo '4712|sitemesh-c4-b-2|FAILED|N/A|N/A|1:00|1-2|0'", "unexpected node counts '1-2', '0'"),
])
def test_other_sacct_failures_are_slurm_errors(answer: str, match: str) -> None:
    with pytest.raises(SlurmError, match=match):
        history.site_history(SlurmSite(["bash", "-c", answer]), "c4", "b")


def test_the_loop_raises_the_highest_number_to_the_accountings_and_says_so(tmp_path: Path) -> None:
    state = AutopilotState("c4", {"b": 3})  # a second loop's file: it knows only its own jobs
    line = loop._reconcile(_site(tmp_path, LINES), state, "b")
    assert line == ("reconciled b from sacct on the loop's first pass there: highest sequence 42 (state file had 3); "
                    "3 ended job(s) entered")
    assert state.seen == {"b": 42} and sorted(state.jobs) == [("b", 2), ("b", 40), ("b", 41)]


def test_without_accounting_the_loop_says_it_goes_on_with_squeue_and_the_state_file() -> None:
    state = AutopilotState("c4", {"b": 3})
    slurm = SlurmSite(["bash", "-c", "echo 'Slurm accounting storage is disabled'; exit 1"])
    line = loop._reconcile(slurm, state, "b")
    assert line.startswith("no Slurm accounting at b (sacct: Slurm accounting storage is disabled): its job numbers "
                           "come from squeue and the state file only")
    assert state == AutopilotState("c4", {"b": 3})
