"""One site's probe: `sbatch --test-only` per node-count shape, logged and calibrated.

    ops probe --config examples/run.toml --site lumi

Shared by `ops probe`/`ops place` (ops/placement/commands.py) and the operator loop's choice of
node count (ops/autopilot/loop.py). First the real starts of the site's earlier submissions are
asked for (squeue) and logged, so the calibration learns from them; then each shape is probed and
every answer logged. A shape Slurm refuses (more nodes than its partition has, a limit of the
account) is kept with Slurm's reason and the other shapes still count: the site is an `error` only
when squeue fails or every shape is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ops.placement import config as cfg
from ops.placement.predictions import Calibration, PredictionLog
from ops.placement.slurm import JobStart, Prediction, SlurmError, SlurmSite, utc_now


@dataclass(frozen=True)
class SiteProbe:
    """Everything one site answered: probes per shape, calibration, jobs it already has."""

    site: cfg.SiteSlurm
    predictions: tuple[Prediction, ...] = ()
    calibration: Calibration | None = None
    jobs: dict[str, JobStart] = field(default_factory=dict)
    """Slurm's word on the site's recent submissions (from the prediction log), by job id."""
    job_shapes: dict[str, cfg.JobShape] = field(default_factory=dict)
    """The shape each of those jobs was submitted with."""
    error: str = ""
    refused: dict[cfg.JobShape, str] = field(default_factory=dict)
    """Shapes whose probe Slurm refused, with its reason (the last line of its answer)."""

    def active_job(self) -> JobStart | None:
        active = [j for j in self.jobs.values() if j.active]
        return max(active, key=lambda j: int(j.job_id)) if active else None


def site_slurm(site: cfg.SiteSlurm, run: cfg.PlacementRun) -> SlurmSite:
    """The Slurm adaptor of `site`, with the run's probe timeout."""
    return SlurmSite(site.command_prefix, timeout_s=run.placement.probe_timeout_s)


def _reason(err: SlurmError) -> str:
    """The line of a SlurmError that says why (Slurm's own last word, after the command line)."""
    return str(err).splitlines()[-1]


def probe_site(
    site: cfg.SiteSlurm, run: cfg.PlacementRun, log: PredictionLog, job_name: str | None = None
) -> SiteProbe:
    """Probes every shape of `site` as job `job_name` (default `sitemesh-SITE`), logging each
    prediction; PredictionLogError if the log is damaged (see the module docstring)."""
    slurm = site_slurm(site, run)
    try:
        jobs = log.refresh(site.name, slurm, utc_now()) if log.submissions(site.name) else {}
    except SlurmError as err:
        return SiteProbe(site=site, error=str(err))
    predictions, errors = _probe_shapes(site, slurm, log, job_name or f"sitemesh-{site.name}")
    calibration = log.calibration(site.name, run.placement.calibration_min_samples)
    shapes = {r["job_id"]: cfg.JobShape.from_json(r["shape"]) for r in log.submissions(site.name)}
    return SiteProbe(
        site,
        tuple(predictions),
        calibration,
        jobs,
        {j: shapes[j] for j in jobs},
        # Every shape refused: the first refusal in full (command line and raw answer) says why.
        "" if predictions else str(next(iter(errors.values()))),
        {shape: _reason(err) for shape, err in errors.items()},
    )


def _probe_shapes(
    site: cfg.SiteSlurm, slurm: SlurmSite, log: PredictionLog, job_name: str
) -> tuple[Sequence[Prediction], dict[cfg.JobShape, SlurmError]]:
    """Each shape's logged prediction, or the SlurmError that refused it."""
    predictions: list[Prediction] = []
    errors: dict[cfg.JobShape, SlurmError] = {}
    for shape in site.shapes():
        try:
            p = slurm.test_only(shape, job_name=job_name, site=site.name)
        except SlurmError as err:  # one shape over a partition's limit must not hide the others
            errors[shape] = err
            continue
        log.record_probe(p)
        predictions.append(p)
    return predictions, errors
