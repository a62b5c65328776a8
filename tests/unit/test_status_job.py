"""`ops status` shows the job a training peer runs in (StatusReply.training.job, peer/job_record.py):
its seconds so far in the --json document and as the table's `job ...` line (issue #35's accounting,
per job, where the operator looks first).

    .venv/bin/python -m pytest -q tests/unit/test_status_job.py
"""

from __future__ import annotations

from pathlib import Path

from ops import mesh
from ops.durations import duration
from peer.admin_rpc import job_to_proto
from peer.gen.sitemesh.v1 import admin_pb2
from peer.job_record import JobLog

SLURM = {"SLURM_JOB_ID": "4711", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_START_TIME": "1000",
         "SLURM_JOB_END_TIME": "8200"}


def _reply(job: admin_pb2.JobStatus) -> admin_pb2.StatusReply:
    return admin_pb2.StatusReply(self="lumi.j3", version="test", consensus=admin_pb2.ConsensusStatus(role="follower"),
                                 training=admin_pb2.TrainingStatus(applied_round=9, job=job))


def test_a_running_job_shows_its_seconds_so_far_and_its_end(tmp_path: Path) -> None:
    clock = iter([1030.0, 1030.0, 2400.0, 2400.0, 3460.0])  # created, started, trained (and saved), asked
    log = JobLog(tmp_path, "lumi.j3", env=SLURM, wall=lambda: next(clock))
    log.started()
    log.trained(1200.0, 300)  # inner steps 1200 s, the first of them at 1200
    doc = mesh.status_document(_reply(job_to_proto(log.live())))
    assert doc["training"]["job"] == {"job": "4711", "member": "lumi.j3", "nodes": 2, "allocated_s": 2460.0,
                                      "joining_s": 200.0, "training_s": 1200.0, "goodput": round(1200 / 2460, 3),
                                      "ends_in_s": 4740.0}
    line = "job 4711 (lumi.j3, 2 nodes): up 41m, joining 3m, training 20m (goodput 0.49), ends in 79m"
    assert line in mesh._table(doc).splitlines()


def test_a_job_that_has_not_trained_has_joined_until_now_and_outside_slurm_no_end(tmp_path: Path) -> None:
    clock = iter([50.0, 50.0, 110.0])
    log = JobLog(tmp_path, "a", env={}, wall=lambda: next(clock))
    log.started()
    job = mesh.status_document(_reply(job_to_proto(log.live())))["training"]["job"]
    assert (job["allocated_s"], job["joining_s"], job["training_s"], job["goodput"]) == (60.0, 60.0, 0.0, 0.0)
    assert job["ends_in_s"] is None and job["nodes"] == 1
    assert "ends in" not in mesh._job_line(job)


def test_no_job_is_null_and_no_line() -> None:
    doc = mesh.status_document(admin_pb2.StatusReply(self="a", training=admin_pb2.TrainingStatus(applied_round=1)))
    assert doc["training"]["job"] is None
    assert "\njob " not in mesh._table(doc)


def test_durations_read_as_people_say_them() -> None:
    assert [duration(s) for s in (45, 200, 89 * 60, 5 * 3600 + 7 * 60, 3 * 86400 + 4 * 3600, float("inf"))] == [
        "45s", "3m", "89m", "5h07m", "3d04h", "never"]
