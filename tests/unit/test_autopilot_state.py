"""The operator loop's state file (ops/autopilot/state.py): the run's jobs kept from submission to
what squeue last said of them, across saves, and the files written before jobs were kept."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest

from ops.autopilot import queue
from ops.autopilot.keeper import Job, JobState
from ops.autopilot.state import AutopilotState
from ops.placement.slurm import SlurmSite

SUBMITTED = Job("b", 2, "4712", JobState.QUEUED, "PENDING", 7200.0, begin=1_800_000_000.0, nodes=4)
ENTRY = {**asdict(SUBMITTED), "state": "queued"}


def test_a_job_is_kept_from_its_submission_to_what_squeue_last_said(tmp_path: Path) -> None:
    state = AutopilotState("c4", {"b": 2})
    state.submitted(SUBMITTED)
    assert state.jobs == {("b", 2): SUBMITTED}
    failed = Job("b", 2, "4712", JobState.FAILED, "FAILED", 7200.0, start=1_800_000_100.0, end=1_800_000_160.0,
                 nodes=4)
    other = Job("b", 5, "4790", JobState.RUNNING, "RUNNING", math.inf, start=1_800_000_200.0)
    state.listed("b", [failed, other])  # a job a second loop submitted is kept as well
    assert state.jobs == {("b", 2): failed, ("b", 5): other} and state.seen == {"b": 5}
    path = tmp_path / "run.toml.autopilot.json"
    state.save(path)
    assert json.loads(path.read_text())["jobs"][1]["wall_s"] is None  # UNLIMITED: JSON has no infinity
    assert AutopilotState.load(path, "c4") == state
    assert AutopilotState.read(path).jobs[("b", 5)].wall_s == math.inf
    with pytest.raises(ValueError, match="belongs to run 'c4', not 'x'"):
        AutopilotState.load(path, "x")


def test_a_file_from_before_jobs_were_kept_reads_with_none(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"run": "c4", "seen": {"b": 9}, "decisions": []}))
    assert AutopilotState.read(path) == AutopilotState("c4", {"b": 9})


@pytest.mark.parametrize("job", [{"site": "b"}, {**ENTRY, "state": "gone"}, {**ENTRY, "start": "noon"},
                                 {**ENTRY, "nodes": 0}, {**ENTRY, "colour": "red"}])
def test_a_damaged_job_entry_names_the_file(tmp_path: Path, job: dict[str, object]) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"run": "c4", "seen": {}, "decisions": [], "jobs": [job]}))
    with pytest.raises(ValueError, match="state.json is not an autopilot state file"):
        AutopilotState.read(path)


def test_the_queue_gives_each_job_its_nodes(tmp_path: Path) -> None:
    """squeue's lines as a real process prints them (a prefix that answers for Slurm)."""
    lines = tmp_path / "squeue.txt"
    lines.write_text("4712|sitemesh-c4-b-2|FAILED|2027-01-15T08:00:00|2027-01-15T08:01:00|2:00:00|NonZeroExitCode|4\n"
                     "4713|sitemesh-c4-b-3|PENDING|2027-01-15T09:50:00|N/A|2:00:00|BeginTime|4\n"
                     "4714|interactive|RUNNING|2027-01-15T08:00:00|2027-01-15T10:00:00|2:00:00|None|1-2\n")
    site = SlurmSite(["bash", "-c", f"cat {lines}"])  # the squeue command line becomes $0, unused
    failed, queued = queue.site_jobs(site, "c4", "b")
    assert (failed.job_id, failed.state, failed.nodes) == ("4712", JobState.FAILED, 4)
    assert failed.start is not None and failed.end == failed.start + 60
    assert (queued.state, queued.nodes, queued.start) == (JobState.QUEUED, 4, None)


def test_the_accounting_enters_ended_jobs_and_raises_the_highest_number() -> None:
    """On start the loop enters what sacct remembers (ops/autopilot/history.py): ended jobs the file
    lacks or last saw live, never a live one (squeue's listing follows), nor over one it saw end."""
    running = Job("b", 2, "4712", JobState.RUNNING, "RUNNING", 7200.0, start=1_800_000_100.0, nodes=4)
    seen_end = Job("b", 1, "4711", JobState.ENDED, "TIMEOUT", 7200.0, start=1_800_000_000.0, end=1_800_007_200.0)
    state = AutopilotState("c4", {"b": 2}, jobs={("b", 1): seen_end, ("b", 2): running})
    ended = Job("b", 2, "4712", JobState.FAILED, "NODE_FAIL", 7200.0, start=1_800_000_100.0, end=1_800_000_900.0,
                nodes=4)
    older = Job("b", 9, "4720", JobState.ENDED, "COMPLETED", 7200.0, start=1_800_010_000.0, end=1_800_017_000.0)
    live = Job("b", 11, "4730", JobState.QUEUED, "PENDING", 7200.0)
    again = Job("b", 1, "4711", JobState.ENDED, "COMPLETED", 7200.0, start=1.0, end=2.0)
    assert state.reconciled("b", [again, ended, older, live]) == (2, 2)
    assert state.seen == {"b": 11}
    assert state.jobs == {("b", 1): seen_end, ("b", 2): ended, ("b", 9): older}
    assert state.reconciled("c", []) == (0, 0) and state.seen["c"] == 0
