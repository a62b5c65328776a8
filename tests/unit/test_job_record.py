"""peer/job_record.py: the record a peer keeps of its job, with Slurm's environment and a manual clock."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from peer.job_record import JobLog, JobRecord, read_dir

SLURM = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "4", "SLURM_JOB_START_TIME": "900",
         "SLURM_JOB_END_TIME": "8100"}


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_slurm_job_is_recorded_from_start_through_training_to_exit(tmp_path: Path) -> None:
    clock = Clock(1000.0)
    job = JobLog(tmp_path, "lumi.j3", SLURM, clock)
    job.started()
    assert read_dir(tmp_path) == [JobRecord("4242", "lumi.j3", nodes=4, job_start=900.0, peer_start=1000.0,
                                            updated=1000.0, job_end=8100.0)]
    clock.now = 1130.0
    job.trained(30.0, 5)  # its steps began 30 s before the run ended
    clock.now = 1200.0
    job.trained(20.0, 5)
    clock.now = 1220.0
    job.trained(0.0, 0)  # a run that stepped nothing is not training: the last step stays 1200
    clock.now = 1250.0
    job.exited()
    (rec,) = read_dir(tmp_path)
    assert (rec.first_step, rec.last_step, rec.inner_s, rec.inner_steps) == (1100.0, 1200.0, 50.0, 10)
    assert (rec.exited, rec.updated) == (1250.0, 1250.0)
    assert (tmp_path / "jobs" / "4242.json").is_file()


def test_outside_slurm_the_process_is_the_job(tmp_path: Path) -> None:
    job = JobLog(tmp_path, "a", {"SLURM_JOB_NUM_NODES": "many"}, Clock(500.0))  # not a number: ignored
    job.started()
    (rec,) = read_dir(tmp_path)
    assert rec.job == f"local-{os.getpid()}-500" and (rec.nodes, rec.job_start, rec.job_end) == (1, 500.0, None)


def test_a_peer_restarted_in_its_allocation_carries_on_the_jobs_record(tmp_path: Path) -> None:
    clock = Clock(1000.0)
    first = JobLog(tmp_path, "a", SLURM, clock)
    first.started()
    clock.now = 1100.0
    first.trained(40.0, 4)
    first.exited()
    clock.now = 1300.0
    again = JobLog(tmp_path, "a", SLURM, clock)
    again.started()
    clock.now = 1400.0
    again.trained(60.0, 6)
    (rec,) = read_dir(tmp_path)
    assert (rec.peer_start, rec.first_step, rec.last_step, rec.inner_s, rec.exited) == (1000.0, 1060.0, 1400.0,
                                                                                        100.0, None)


def test_a_record_that_cannot_be_written_never_stops_the_peer(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocked = tmp_path / "data"
    blocked.mkdir()
    (blocked / "jobs").write_text("a file where the jobs dir goes")
    job = JobLog(blocked, "a", SLURM, Clock(1.0))
    job.started()
    job.trained(1.0, 1)
    assert "not written" in caplog.text and job.record.inner_s == 1.0


def test_the_metrics_say_when_the_job_began_and_how_long_it_trained() -> None:
    from peer.metrics import _job_families

    rec = JobRecord("1", "a", nodes=2, job_start=900.0, peer_start=1000.0, updated=1200.0, job_end=8100.0,
                    first_step=1100.0, last_step=1200.0, inner_s=80.0)
    values = {s.name: s.value for family in _job_families(rec) for s in family.samples}
    assert values == {"sitemesh_job_start_timestamp_seconds": 900.0, "sitemesh_job_end_timestamp_seconds": 8100.0,
                      "sitemesh_job_nodes": 2.0, "sitemesh_job_inner_seconds_total": 80.0,
                      "sitemesh_job_joining_seconds": 200.0}


# (first_step, exited, joining_s): started at 900, last written at 1200.
JOINING = [
    (1100.0, None, 200.0),  # trained: start -> first inner step
    (None, None, 300.0),  # has not trained (yet): it has only joined, up to its last write
    (None, 1250.0, 350.0),  # never trained and left: joined until its exit
    (850.0, None, 0.0),  # Slurm's start after the node's first step (two clocks): never negative
    (1300.0, 1250.0, 350.0),  # first step after the exit (the wall clock stepped back): clipped to the exit
]


@pytest.mark.parametrize(("first_step", "exited", "joining"), JOINING)
def test_joining_is_one_rule_for_the_metric_and_the_accounting(first_step: float | None, exited: float | None,
                                                               joining: float) -> None:
    """`JobRecord.joining_s` is what the peer exports and what `ops report` accounts: both read it,
    so a job's joining seconds are the same number on a dashboard and in the report."""
    from ops.accounting import account
    from peer.metrics import _job_families

    rec = JobRecord("1", "a", nodes=1, job_start=900.0, peer_start=1000.0, updated=1200.0,
                    first_step=first_step, last_step=first_step, exited=exited)
    assert rec.joining_s == joining
    (job,) = account([rec]).total.jobs
    assert job.joining_s == joining
    exported = {s.name: s.value for family in _job_families(rec) for s in family.samples}
    # The gauge appears with the first inner step: before it, the joining is not over.
    assert exported.get("sitemesh_job_joining_seconds") == (joining if first_step is not None else None)
