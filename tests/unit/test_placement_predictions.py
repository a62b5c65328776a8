"""The prediction log and its per-site calibration."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from ops.placement.config import JobShape
from ops.placement.predictions import Calibration, PredictionLog
from ops.placement.slurm import Prediction, TestOnlyAnswer

T0 = datetime(2026, 11, 30, 6, 0, tzinfo=timezone.utc)
SHAPE = JobShape(nodes=2, time_s=3600)


def _job(log: PredictionLog, site: str, n: int, predicted_wait_s: float, real_wait_s: float) -> None:
    at = T0 + timedelta(hours=n)
    log.record_submit(site, str(n), at, at + timedelta(seconds=predicted_wait_s), SHAPE)
    log.record_start(site, str(n), at + timedelta(seconds=real_wait_s), at + timedelta(days=1))


def test_uncalibrated_until_enough_pairs(tmp_path: Path) -> None:
    log = PredictionLog(tmp_path / "p.jsonl")
    _job(log, "lumi", 1, 3600, 600)
    _job(log, "lumi", 2, 3600, 600)
    cal = log.calibration("lumi", min_samples=3)
    assert (cal.factor, cal.samples, cal.calibrated) == (1.0, 2, False)
    assert cal.wait_s(3600) == 3600
    _job(log, "lumi", 3, 3600, 600)
    assert log.calibration("lumi", min_samples=3).calibrated


def test_fixed_pessimistic_predictions_calibrate_to_near_zero(tmp_path: Path) -> None:
    # A cluster that always answers "in a week" while its nodes sit idle (jobs start at once).
    log = PredictionLog(tmp_path / "p.jsonl")
    for n in range(5):
        _job(log, "frontier", n, 7 * 86400, 0)
    _job(log, "lumi", 9, 100, 100)  # another site's pairs do not count
    cal = log.calibration("frontier", min_samples=3)
    assert cal.samples == 5 and cal.factor == pytest.approx(60 / (7 * 86400 + 60))
    assert cal.wait_s(7 * 86400) == pytest.approx(0.0, abs=1e-6)


def test_median_of_recent_pairs(tmp_path: Path) -> None:
    log = PredictionLog(tmp_path / "p.jsonl")
    for n in range(10):  # old behaviour, out of the 20-pair window
        _job(log, "snellius", n, 3540, 0)
    for n in range(10, 30):  # recent: real waits twice the prediction
        _job(log, "snellius", n, 3540, 2 * 3540 + 60)
    cal = log.calibration("snellius", min_samples=3)
    assert cal.samples == 20 and cal.factor == pytest.approx(2.0)
    assert cal.wait_s(3540) == pytest.approx(2 * 3600 - 60)


def test_submissions_without_a_start_are_not_pairs(tmp_path: Path) -> None:
    log = PredictionLog(tmp_path / "p.jsonl")
    log.record_submit("lumi", "7", T0, T0 + timedelta(hours=1), SHAPE)
    assert log.pairs("lumi") == []
    assert [r["job_id"] for r in log.submissions("lumi")] == ["7"]


def test_probe_records_round_trip(tmp_path: Path) -> None:
    log = PredictionLog(tmp_path / "sub" / "p.jsonl")
    answer = TestOnlyAnswer(T0 + timedelta(minutes=5), 64, "nid[1-8]", "standard-g")
    p = Prediction("lumi", SHAPE, T0, answer)
    assert p.wait_s == 300
    log.record_probe(p)
    [r] = log.records()
    assert r["kind"] == "probe" and r["predicted_start"] == (T0 + timedelta(minutes=5)).isoformat()
    assert r["shape"]["nodes"] == 2 and r["nodelist"] == "nid[1-8]"


def test_a_damaged_line_is_reported_with_its_place(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"kind": "probe"}\n{oops\n')
    with pytest.raises(ValueError, match=r"p.jsonl:2: not a JSON record"):
        PredictionLog(path).records()


def test_negative_factor_is_rejected() -> None:
    with pytest.raises(ValueError):
        Calibration("x", -1.0, 3, "")
