"""The operator loop's submission (ops/autopilot/loop.py) without Slurm: the --begin it gives a
successor, and what it tells the prediction log, with sbatch and the probe stood in for."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import pytest

from ops.autopilot import loop
from ops.autopilot.keeper import Submit
from ops.autopilot.state import AutopilotState
from ops.placement import config as cfg
from ops.placement.predictions import Calibration
from ops.placement.probing import SiteProbe, site_slurm
from ops.placement.slurm import Prediction, TestOnlyAnswer

REPO = Path(__file__).resolve().parents[2]
RAW_WAIT_S = 400.0  # what Slurm's --test-only answers: far too long, as it plans with time limits
CALIBRATED = Calibration("s", 0.25, 5, "median real/predicted wait over 5 jobs = 0.25")
UNCALIBRATED = Calibration("s", 1.0, 2, "2 of 3 pairs needed: uncalibrated", calibrated=False)


def _run(tmp_path: Path, node_options: str = "") -> cfg.PlacementRun:
    path = tmp_path / "run.toml"
    path.write_text(f"""[run]\nname = "r"\n[placement]\ntarget_tokens = 1e9\nlog = "placement.jsonl"
[sites.s]\ntokens_per_s = 1000.0\n[sites.s.slurm]\nnodes = 1\ntime = "60"\n{node_options}
template = "{REPO / 'scripts/slurm/snellius-h100.sbatch'}"\npeer_command = "true"\nworkdir = "{tmp_path}"
""")
    return cfg.load(path)


def _submit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run: cfg.PlacementRun,
            calibration: Calibration, begin: float | None) -> tuple[str, float | None, dict[str, str]]:
    """One Submit through the loop: its decision line, the --begin sbatch got, the submit record."""
    asked: list[float | None] = []

    def probe(site: cfg.SiteSlurm, *_: object, **__: object) -> SiteProbe:
        at = dt.datetime.now(dt.timezone.utc)
        answer = TestOnlyAnswer(at + dt.timedelta(seconds=RAW_WAIT_S), 1, "n1", "p")
        return SiteProbe(site, tuple(Prediction(site.name, shape, at, answer) for shape in site.shapes()),
                         calibration)

    def sbatch(*args: object) -> str:
        asked.append(args[-1])  # type: ignore[arg-type]
        return "77"

    monkeypatch.setattr(loop, "probe_site", probe)
    monkeypatch.setattr(loop.queue, "submit", sbatch)
    monkeypatch.setattr(loop.templates, "render", lambda *_: "#!/bin/bash\n")
    site = run.sites["s"]
    line = loop._submit(run, site, site_slurm(site, run), AutopilotState.load(tmp_path / "state.json", "r"),
                        tmp_path / "state.json", Submit("s", 2, begin, "job 1 runs"), 600.0)
    records = [json.loads(x) for x in (tmp_path / "placement.jsonl").read_text().splitlines()]
    [record] = [r for r in records if r["kind"] == "submit"]
    return line, asked[0], record


def _wait_s(record: dict[str, str]) -> float:
    at, start = (dt.datetime.fromisoformat(record[k]) for k in ("at", "predicted_start"))
    return (start - at).total_seconds()


def test_the_log_learns_from_slurms_raw_prediction_not_the_calibrated_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Several node counts: the choice compares calibrated starts, the log keeps Slurm's own answer.
    run = _run(tmp_path, "node_options = [1, 2]")
    line, begin, record = _submit(tmp_path, monkeypatch, run, CALIBRATED, None)
    assert begin is None and "predicted start" in line
    assert _wait_s(record) == pytest.approx(RAW_WAIT_S, abs=1)  # not (400 + 60) x 0.25 - 60 = 55


def test_a_successors_begin_leads_its_window_and_its_wait_counts_from_its_begin(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opens = time.time() + 3600
    line, begin, record = _submit(tmp_path, monkeypatch, _run(tmp_path), CALIBRATED, opens)
    assert begin == pytest.approx(opens - 55, abs=1)  # one shape, probed all the same: the calibrated wait
    assert "- calibrated wait 55 s (Slurm's 400 s x median real/predicted wait over 5 jobs = 0.25)" in line
    # The pair pairs Slurm's raw wait with the real one, both from when the job may start: its begin.
    assert dt.datetime.fromisoformat(record["at"]).timestamp() == pytest.approx(begin, abs=1)
    assert _wait_s(record) == pytest.approx(RAW_WAIT_S, abs=1)


def test_an_uncalibrated_site_does_not_lead_by_slurms_raw_wait(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opens = time.time() + 3600
    line, begin, record = _submit(tmp_path, monkeypatch, _run(tmp_path), UNCALIBRATED, opens)
    assert begin == opens and "not led by a queue wait: 2 of 3 pairs needed: uncalibrated" in line
    assert dt.datetime.fromisoformat(record["at"]).timestamp() == pytest.approx(opens, abs=1)
