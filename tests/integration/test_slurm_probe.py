"""`sbatch --test-only` probes against a real local Slurm cluster (tests/integration/slurm_cluster.py)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from ops.placement.config import JobShape
from ops.placement.predictions import PredictionLog
from ops.placement.slurm import SlurmError, SlurmSite, utc_now
from tests.integration.slurm_cluster import SlurmCluster, slurm_fixture, slurm_session_fixture  # noqa: F401

ONE_CPU_MINUTE = JobShape(nodes=1, time_s=60, partition="debug")


def test_probe_parses_a_real_answer_and_submits_nothing(slurm: SlurmCluster) -> None:
    before = utc_now()
    p = SlurmSite(slurm.prefix).test_only(ONE_CPU_MINUTE, job_name="sitemesh-probe", site="local")
    assert (p.answer.partition, p.answer.nodelist, p.answer.processors) == ("debug", slurm.node, 1)
    # An idle node: Slurm answers "now", i.e. within the second the probe was made (UTC both).
    assert abs((p.answer.start - before).total_seconds()) < 5
    assert p.wait_s < 5
    assert slurm.run("squeue", "--noheader", "--states=all").stdout.strip() == ""


def test_busy_node_moves_the_prediction_and_the_real_start_matches_it(
    slurm: SlurmCluster,
    tmp_path: Path,
) -> None:
    site = SlurmSite(slurm.prefix)
    idle = site.test_only(ONE_CPU_MINUTE, job_name="sitemesh-probe", site="local")
    # Fill both CPUs for (almost) a full minute, the blocker's time limit: Slurm plans with limits,
    # and the blocker really runs to 57 s of its 60 s, so the prediction should hold.
    blocker = slurm.sbatch("--exclusive", "--time=1", "--partition=debug", "--wrap=sleep 57")
    slurm.wait_for(blocker, {"RUNNING"}, timeout_s=15)
    busy = site.test_only(ONE_CPU_MINUTE, job_name="sitemesh-probe", site="local")
    assert busy.answer.start - idle.answer.start >= timedelta(seconds=45)
    assert 45 <= busy.wait_s <= 65

    log = PredictionLog(tmp_path / "placement.jsonl")
    submitted_at = utc_now()
    job = site.submit(ONE_CPU_MINUTE, "sitemesh-probed", "#!/bin/sh\nsleep 1\n")
    log.record_submit("local", job, submitted_at, busy.answer.start, ONE_CPU_MINUTE)
    slurm.wait_for(job, {"RUNNING", "COMPLETING", "COMPLETED"}, timeout_s=90)
    states = log.refresh("local", site, utc_now())
    assert states[job].started and states[job].start is not None
    error = (states[job].start - busy.answer.start).total_seconds()
    assert abs(error) <= 10, f"real start {states[job].start} vs predicted {busy.answer.start}"
    # The real start is in the log now, paired with its prediction for calibration.
    [(predicted, real)] = log.pairs("local")
    assert abs(predicted - busy.wait_s) < 5 and abs(real - predicted) <= 12
    assert log.calibration("local", min_samples=1).samples == 1


def test_refused_probe_shows_slurms_answer(slurm: SlurmCluster) -> None:
    shape = JobShape(nodes=1, time_s=60, partition="no-such-partition")
    with pytest.raises(SlurmError, match="invalid partition"):
        SlurmSite(slurm.prefix).test_only(shape, job_name="sitemesh-probe")
    with pytest.raises(SlurmError, match="exit 1.*\n.*Requested node configuration is not available"):
        SlurmSite(slurm.prefix).test_only(JobShape(nodes=3, time_s=60), job_name="sitemesh-probe")
