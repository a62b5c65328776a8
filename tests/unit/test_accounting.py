"""ops/accounting.py on job records written by hand, every number computed by hand in the comments."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import matplotlib.colors
import matplotlib.image
import pytest

from ops import accounting, report
from ops.autopilot.keeper import Job, JobState
from ops.autopilot.state import AutopilotState
from peer import timeline_file
from peer.core.timeline import RoundTimeline
from peer.job_record import JOBS_DIR, JobRecord

REPO = Path(__file__).resolve().parents[2]

# Site a: two 2-node jobs that overlap (a handover); site b: one 1-node job that never trained
# and has no exit on record (killed, or still starting).
A1 = JobRecord("101", "a.j1", nodes=2, job_start=1000.0, peer_start=1030.0, updated=4700.0,
               first_step=1100.0, last_step=4600.0, inner_s=3000.0, inner_steps=300, exited=4700.0)
A2 = JobRecord("102", "a.j2", nodes=2, job_start=4000.0, peer_start=4020.0, updated=8000.0,
               first_step=4300.0, last_step=7900.0, inner_s=3240.0, inner_steps=324, exited=8000.0)
B1 = JobRecord("201", "b", nodes=1, job_start=2000.0, peer_start=2010.0, updated=2600.0)

# The same run as the operator loop saw it in squeue (its state file): a.j1 and a.j2 have records;
# b's job 2 (4 nodes) failed 300 s after its start before its peer wrote one (a module that does not
# load); b's job 3 was cancelled while queued (Slurm gives it its cancel time as start and end); job
# 4 runs, its peer not yet up; job 5 waits in the queue.
SEEN_A1 = Job("a", 1, "101", JobState.ENDED, "COMPLETED", 7200, start=1000.0, end=4700.0, nodes=2)
SEEN_A2 = Job("a", 2, "102", JobState.ENDED, "TIMEOUT", 7200, start=4000.0, end=8000.0, nodes=2)
FAILED_B2 = Job("b", 2, "202", JobState.FAILED, "FAILED", 3600, start=3000.0, end=3300.0, nodes=4)
CANCELLED_B3 = Job("b", 3, "203", JobState.FAILED, "CANCELLED by 0", 3600, start=3100.0, end=3100.0)
RUNNING_B4 = Job("b", 4, "204", JobState.RUNNING, "RUNNING", 3600, start=9000.0)
QUEUED_B5 = Job("b", 5, "205", JobState.QUEUED, "PENDING", 3600, begin=12000.0)
LOOP = [SEEN_A1, SEEN_A2, FAILED_B2, CANCELLED_B3, RUNNING_B4, QUEUED_B5]


def test_a_job_splits_into_joining_training_idle_and_tail() -> None:
    acc = accounting.account([A1, A2, B1])
    a1, a2 = acc.sites[0].jobs
    # a.j1: 3700 s allocated = 100 joining + 3000 training + 500 idle + 100 tail; fixed 200
    assert (a1.allocated_s, a1.joining_s, a1.training_s, a1.idle_s, a1.tail_s) == (3700, 100, 3000, 500, 100)
    assert a1.fixed_s == 200 and a1.steady_s == 3500 and a1.ended
    # a.j2: 4000 = 300 + 3240 + 360 + 100; fixed 400
    assert (a2.allocated_s, a2.joining_s, a2.idle_s, a2.tail_s, a2.fixed_s) == (4000, 300, 360, 100, 400)
    (b1,) = acc.sites[1].jobs
    # b: no exit, so it ends at its last write (2600): 600 s, all of it joining
    assert not b1.ended and (b1.allocated_s, b1.joining_s, b1.training_s, b1.idle_s, b1.tail_s) == (600, 600, 0, 0, 0)


def test_sites_and_the_run_in_node_hours_goodput_and_the_projection() -> None:
    acc = accounting.account([B1, A2, A1])
    a, b = acc.sites
    assert [a.name, b.name] == ["a", "b"]
    # a: 2 nodes x (3700 + 4000) s = 15400 node-s; training 2 x (3000 + 3240) = 12480
    assert a.allocated_h == pytest.approx(15400 / 3600) and a.training_h == pytest.approx(12480 / 3600)
    assert a.joining_h == pytest.approx(2 * 400 / 3600) and a.tail_h == pytest.approx(2 * 200 / 3600)
    assert a.idle_h == pytest.approx(2 * 860 / 3600)
    assert a.goodput == pytest.approx(12480 / 15400)
    assert a.fixed_s == 300  # (200 + 400) / 2
    assert b.goodput == 0 and b.fixed_s == 0  # it never trained: no fixed cost to project from
    total = acc.total
    assert total.allocated_h == pytest.approx(16000 / 3600)
    assert total.goodput == pytest.approx(0.78)  # 12480 / 16000
    assert total.fixed_s == 300  # b never trained: left out of the mean
    # steady = 12480 / (2 x (3500 + 3600)) = 0.878873...; at W = 2 h: steady x (7200 - 300) / 7200
    assert total.steady == pytest.approx(12480 / 14200)
    assert total.fixed_only(7200) == pytest.approx(6900 / 7200)
    assert total.projected(7200) == pytest.approx(12480 / 14200 * 6900 / 7200)
    assert total.projected(200) == 0  # shorter than the fixed cost: nothing left to train
    with pytest.raises(ValueError, match="positive"):
        total.fixed_only(0)


def test_the_table_a_person_reads() -> None:
    text = accounting.table(accounting.account([A1, A2, B1]), wall_s=7200)
    assert "| a | 2 | 4.278 | 3.467 | 0.222 | 0.478 | 0.111 | 0.000 | 0.810 | 300.0 |" in text, text
    assert "| b | 1 | 0.167 | 0.000 | 0.167 | 0.000 | 0.000 | 0.000 | 0.000 | 0.0 |" in text, text
    assert "| total | 3 | 4.444 | 3.467 | 0.389 | 0.478 | 0.111 | 0.000 | 0.780 | 300.0 |" in text, text
    assert "At a 2 h wall time: goodput 0.842 = steady 0.879 x (W - 300.0 s) / W; the fixed cost alone allows 0.958." \
        in text, text
    assert "No exit on record for job(s) 201" in text
    assert "No peer record" not in text and "end not seen" not in text


def test_a_job_slurm_ended_with_no_peer_record_counts_its_whole_allocation() -> None:
    acc = accounting.account([A1, A2, B1], LOOP)
    a, b = acc.sites
    assert [j.record.job for j in a.jobs] == ["101", "102"]  # a's jobs have records: each counted once
    assert [j.record.job for j in b.jobs] == ["201", "202"]  # the cancelled, running and queued ones: not
    b2 = b.jobs[1]
    assert (b2.no_peer, b2.record.member, b2.record.nodes, b2.ended) == ("FAILED", "b.j2", 4, True)
    # 300 s, all of it no peer: not joining (no peer set anything up), not idle
    assert (b2.allocated_s, b2.no_peer_s, b2.joining_s, b2.training_s, b2.idle_s, b2.tail_s) == (300, 300, 0, 0, 0, 0)
    # b: 600 node-s of B1 (joining) + 4 x 300 of job 2 (no peer) = 1800 node-s
    assert b.allocated_h == pytest.approx(1800 / 3600) and b.no_peer_h == pytest.approx(1200 / 3600)
    assert b.joining_h == pytest.approx(600 / 3600) and a.no_peer_h == 0
    total = acc.total
    assert total.allocated_h == pytest.approx(17200 / 3600)  # 16000 of the records + 1200
    assert total.goodput == pytest.approx(12480 / 17200)  # 0.726, down from 0.780 without the loop's view
    assert total.goodput < accounting.account([A1, A2, B1]).total.goodput
    # It never trained: the fixed cost and the steady rate, and so the projection, are the trained jobs'.
    assert total.fixed_s == 300 and total.steady == pytest.approx(12480 / 14200)
    assert acc.unended == (RUNNING_B4,)


def test_a_record_is_matched_by_site_and_slurm_job_id() -> None:
    """Two clusters may give the same job id: site b's job 101 is not site a's."""
    other = Job("b", 7, "101", JobState.FAILED, "NODE_FAIL", 3600, start=0.0, end=360.0)
    acc = accounting.account([A1], [SEEN_A1, other])
    assert [(j.site, j.record.job, j.no_peer) for j in acc.total.jobs] == [("a", "101", ""), ("b", "101", "NODE_FAIL")]
    assert accounting.account([A1], [SEEN_A1]).total.allocated_h == accounting.account([A1]).total.allocated_h


def test_the_table_names_the_jobs_with_no_peer_and_those_not_seen_to_end() -> None:
    text = accounting.table(accounting.account([A1, A2, B1], LOOP), wall_s=7200)
    assert "| b | 2 | 0.500 | 0.000 | 0.167 | 0.000 | 0.000 | 0.333 | 0.000 | 0.0 |" in text, text
    assert "| total | 4 | 4.778 | 3.467 | 0.389 | 0.478 | 0.111 | 0.333 | 0.726 | 300.0 |" in text, text
    assert "No peer record for job(s) 202 (b.j2, FAILED, 0.333 h): Slurm ended them" in text, text
    assert "end not seen: job(s) 204 (b job 4, last seen RUNNING)" in text, text
    assert "No exit on record for job(s) 201 (" in text  # job 202's end is Slurm's, not a lower bound


def _member_dir(root: Path, records: list[JobRecord]) -> None:
    (root / JOBS_DIR).mkdir(parents=True)
    for r in records:
        (root / JOBS_DIR / f"{r.job}.json").write_text(json.dumps(r.to_json()))


def _site_with_two_jobs(tmp_path: Path) -> Path:
    """Site a's data dir: a round's timeline and the records of its members a.j1 and a.j2."""
    site = tmp_path / "a"
    site.mkdir()
    timeline_file.append(site, RoundTimeline(1, "a", compute_s=1.0))
    _member_dir(site / "j1", [A1])
    _member_dir(site / "j2", [A2])
    return site


def test_report_reads_a_sites_dir_and_its_job_members(tmp_path: Path) -> None:
    site = _site_with_two_jobs(tmp_path)
    _member_dir(site, [B1])  # a job served from the site's own dir (no --job) is read too
    data = report.collect([site])
    assert sorted(r.job for r in data.jobs) == ["101", "102", "201"]
    assert "| total | 3 | 4.444 |" in report.markdown(data)
    jobs = report.figure(data).axes[-1]
    assert jobs.get_title().startswith("Jobs per site over time (goodput 0.78")
    assert len(jobs.patches) == 7  # a.j1 and a.j2: joining, training, tail; b: joining only
    out = tmp_path / "r.png"
    report.render(data, out)
    assert matplotlib.image.imread(out).shape[:2] == (1140, 1440)  # a third row under the 2 x 3 panels


def test_report_counts_the_loops_jobs_of_the_sites_it_was_given(tmp_path: Path) -> None:
    site = _site_with_two_jobs(tmp_path)
    state = AutopilotState("run")
    failed_a3 = Job("a", 3, "103", JobState.FAILED, "FAILED", 7200, start=8000.0, end=8060.0, nodes=2)
    for job in (*LOOP, failed_a3):
        state.submitted(job)
    path = tmp_path / "run.toml.autopilot.json"
    state.save(path)
    data = report.collect([site], autopilot_state=path)
    assert [j.site for j in data.slurm_jobs] == ["a", "a", "a"] and data.unreported == ["b"]
    text = report.markdown(data)
    # a: 15400 + 2 x 60 node-s = 15520 = 4.311 h, of which 120 = 0.033 h no peer
    assert "| a | 3 | 4.311 | 3.467 | 0.222 | 0.478 | 0.111 | 0.033 | 0.804 | 300.0 |" in text, text
    assert "state has jobs of b, whose data dirs were not given" in text, text
    jobs = report.figure(data).axes[-1]
    assert len(jobs.patches) == 7  # a.j1, a.j2: joining, training, tail; a.j3: one no-peer bar
    assert jobs.patches[-1].get_facecolor()[:3] == pytest.approx(matplotlib.colors.to_rgb("tab:gray"))
    out = subprocess.run([sys.executable, "-m", "ops.cli", "report", "--data-dir", str(site), "--format", "md",
                          "--autopilot-state", str(path)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "| 0.033 | 0.804 |" in out.stdout, out.stdout + out.stderr
    missing = subprocess.run([sys.executable, "-m", "ops.cli", "report", "--data-dir", str(site), "--format", "md",
                              "--autopilot-state", str(tmp_path / "nope.json")],
                             cwd=REPO, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "nope.json" in missing.stderr and "Traceback" not in missing.stderr


def test_a_corrupt_record_is_named_with_the_fix_and_no_traceback(tmp_path: Path) -> None:
    site = tmp_path / "a"
    site.mkdir()
    timeline_file.append(site, RoundTimeline(1, "a", compute_s=1.0))
    (site / "j3" / JOBS_DIR).mkdir(parents=True)
    bad = site / "j3" / JOBS_DIR / "77.json"
    bad.write_text('{"job": "77", "member": "a.j3"}')  # no times
    with pytest.raises(ValueError, match="77.json is not a job record .*move it aside"):
        report.collect([site])
    out = subprocess.run([sys.executable, "-m", "ops.cli", "report", "--data-dir", str(site), "--format", "md"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "77.json is not a job record" in out.stderr
    assert "Traceback" not in out.stderr, out.stderr
