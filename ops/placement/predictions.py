"""The prediction log: every probe, every submission with its predicted start, every real start;
and the per-site calibration of predicted queue waits learned from it.

    python -c "from ops.placement.predictions import PredictionLog; \
print(PredictionLog('runs/placement.jsonl').calibration('lumi', 3))"

Why calibrate: `sbatch --test-only` plans with the time limits of running jobs, so it is usually
pessimistic, and some clusters answer a fixed far-away time even when nodes sit idle. For each
site the log pairs a submission's predicted wait with its real wait; the calibration factor is the
median of `(real + 60 s) / (predicted + 60 s)` over the last `_WINDOW` pairs (the 60 s keeps the
ratio meaningful when Slurm predicted "now"), and a calibrated wait is
`(predicted + 60 s) * factor - 60 s`, never below 0. Fewer than `min_samples` pairs: factor 1,
and the site is uncalibrated (`Calibration.calibrated`).

The log is JSON lines, one object per event, appended (a crash loses at most the last line):
    {"kind": "probe",  "site", "at", "predicted_start", "partition", "nodelist", "shape"}
    {"kind": "submit", "site", "at", "job_id", "predicted_start", "shape"}
    {"kind": "start",  "site", "at", "job_id", "started_at"}
A submit's `at` is when the job could first start: its submission, or its `--begin` when that lies
later (the operator loop's successors: a wait counted from the submission would include the
deliberate delay and inflate the factor); its `predicted_start` is `at` plus Slurm's own predicted
wait (`--test-only`, uncalibrated: the calibration learns from raw answers).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from ops.placement.config import JobShape
from ops.placement.slurm import JobStart, Prediction, SlurmSite


class PredictionLogError(ValueError):
    """The prediction log cannot be read (a damaged line); the message names file and line."""


_WINDOW = 20  # recent pairs only: queue policies and loads drift over weeks
_SLACK_S = 60.0


@dataclass(frozen=True)
class Calibration:
    """How a site's predicted waits are corrected, and why."""

    site: str
    factor: float
    samples: int
    reason: str
    calibrated: bool = True
    """False while the site has fewer pairs than needed: `factor` is 1, Slurm's answer as it is."""

    def __post_init__(self) -> None:
        if self.factor < 0:
            raise ValueError(f"calibration factor must be >= 0, got {self.factor}")

    def wait_s(self, predicted_wait_s: float) -> float:
        return max(0.0, (predicted_wait_s + _SLACK_S) * self.factor - _SLACK_S)


class PredictionLog:
    """Append-only JSON-lines log at `path` (created with its directory on first write)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def _append(self, record: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        for n, line in enumerate(self.path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise PredictionLogError(f"{self.path}:{n}: not a JSON record: {err}") from err
        return out

    def record_probe(self, p: Prediction) -> None:
        self._append(
            {
                "kind": "probe",
                "site": p.site,
                "at": p.probed_at.isoformat(),
                "predicted_start": p.answer.start.isoformat(),
                "partition": p.answer.partition,
                "nodelist": p.answer.nodelist,
                "shape": p.shape.to_json(),
            }
        )

    def record_submit(
        self, site: str, job_id: str, at: datetime, predicted_start: datetime, shape: JobShape
    ) -> None:
        self._append(
            {
                "kind": "submit",
                "site": site,
                "at": at.isoformat(),
                "job_id": job_id,
                "predicted_start": predicted_start.isoformat(),
                "shape": shape.to_json(),
            }
        )

    def record_start(self, site: str, job_id: str, started_at: datetime, at: datetime) -> None:
        self._append(
            {
                "kind": "start",
                "site": site,
                "at": at.isoformat(),
                "job_id": job_id,
                "started_at": started_at.isoformat(),
            }
        )

    def submissions(self, site: str) -> list[dict[str, Any]]:
        """The submit records of `site`, oldest first."""
        return [r for r in self.records() if r["kind"] == "submit" and r["site"] == site]

    def refresh(self, site: str, slurm: SlurmSite, at: datetime) -> dict[str, JobStart]:
        """Asks Slurm about the site's recent submissions, logs real starts not logged yet, and
        returns what Slurm says of each job it still knows."""
        recent = [r["job_id"] for r in self.submissions(site)[-_WINDOW:]]
        logged = {r["job_id"] for r in self.records() if r["kind"] == "start" and r["site"] == site}
        states = slurm.job_starts(recent)
        for job_id, js in states.items():
            if js.started and js.start is not None and job_id not in logged:
                self.record_start(site, job_id, js.start, at)
        return states

    def pairs(self, site: str) -> list[tuple[float, float]]:
        """(predicted wait, real wait) in seconds for each started submission at `site`, oldest first."""
        records = self.records()
        starts = {r["job_id"]: r for r in records if r["kind"] == "start" and r["site"] == site}
        out = []
        for r in records:
            if r["kind"] == "submit" and r["site"] == site and r["job_id"] in starts:
                at = datetime.fromisoformat(r["at"])
                predicted = (datetime.fromisoformat(r["predicted_start"]) - at).total_seconds()
                real = (datetime.fromisoformat(starts[r["job_id"]]["started_at"]) - at).total_seconds()
                out.append((max(0.0, predicted), max(0.0, real)))
        return out

    def calibration(self, site: str, min_samples: int) -> Calibration:
        pairs = self.pairs(site)[-_WINDOW:]
        if len(pairs) < min_samples:
            return Calibration(
                site, 1.0, len(pairs), f"{len(pairs)} of {min_samples} pairs needed: uncalibrated",
                calibrated=False,
            )
        factor = statistics.median((real + _SLACK_S) / (pred + _SLACK_S) for pred, real in pairs)
        return Calibration(
            site, factor, len(pairs), f"median real/predicted wait over {len(pairs)} jobs = {factor:.2f}"
        )
