"""`ops autopilot`: keeps every site's next job queued until the run is done.

    ops autopilot --config run.toml                       # every 60 s, until stopped
    ops autopilot --config run.toml --once                # one pass (cron, scrontab, tests)
    ops autopilot --config run.toml --peer HOST:PORT --certs certs/ --as alice   # stop at the end

On its first pass at each site the loop reconciles its state with the site's accounting: `sacct`
(ops/autopilot/history.py) lists the run's jobs there long after squeue forgot them, and the
highest sequence number it shows is entered as seen, with the ended jobs the state file lacks; a
site without accounting is logged once and goes on with squeue and the state file. Then each pass,
for each site with a `[sites.NAME.slurm]` table: list the run's jobs there (squeue,
through the site's command prefix: ops/autopilot/queue.py), decide (ops/autopilot/keeper.py),
submit what was decided (the site's sbatch template, ops/placement/templates.py; among its
`node_options`, the node count whose job trains the most tokens by `sbatch --test-only`:
ops/autopilot/shapes.py), and log the decision with its reason. A successor's `--begin` is led by
the calibrated predicted queue wait of the shape submitted (one `--test-only` probe, also where the
site has one shape; not led while the site is uncalibrated: keeper.led_begin), and the submission
goes to the prediction log with Slurm's raw predicted wait counted from when the job may start
(ops/placement/predictions.py), which calibrates the next. With `--peer` the loop asks the mesh
whether the run's data epochs are done and then submits nothing more.

Its state is one JSON file (`--state`, default `<run file>.autopilot.json`, ops/autopilot/state.py):
the highest sequence number submitted per site, the decisions taken, and every job of the run as
squeue last showed it (its start, end, final state and nodes: `ops report --autopilot-state` counts
the ended ones that left no peer record). It is written before and after each sbatch, so a loop
killed between the two, restarted, or run twice by mistake still never reuses a job name: the next
number is above every one the file, the queue or the accounting has seen (a lost file, or a second
loop with its own, included, where the site keeps accounting). Where it is meant to live:
a login node under `scrontab` (`--once` every few minutes) or a small service machine, anywhere the
sites' command prefixes (`ssh lumi-uan01 ...`) work from; docs/decisions/autopilot-operator-loop.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

import grpc

from ops.autopilot import history, queue
from ops.autopilot.keeper import (
    Hold, Job, JobState, KeeperConfig, StartNow, Submit, decide, job_name, led_begin
)
from ops.autopilot.shapes import ShapeChoice, ShapeOption, choose
from ops.autopilot.state import AutopilotState
from ops.certs import CertError, add_client_flags, client_credentials
from ops.placement import config as cfg
from ops.placement import templates
from ops.placement.predictions import Calibration, PredictionLog, PredictionLogError
from ops.placement.probing import SiteProbe, probe_site, site_slurm
from ops.placement.slurm import Prediction, SlurmError, SlurmSite, utc_now
from peer.gen.sitemesh.v1 import admin_pb2, admin_pb2_grpc
from peer.transport.channels import open_blocking_channel

log = logging.getLogger("sitemesh.autopilot")


def run_name(path: Path) -> str:
    """The run's name from the run file's `[run] name` (the job names carry it)."""
    return str(tomllib.loads(path.read_text()).get("run", {}).get("name", "sitemesh"))


def one_pass(run: cfg.PlacementRun, state: AutopilotState, state_path: Path, target_reached: bool,
             keeper: KeeperConfig, reconciled: set[str], now: float | None = None) -> list[str]:
    """Decides and submits for every site once, after reconciling with the accounting each site not
    in `reconciled` (which it adds them to); the decision lines, also logged and recorded."""
    lines = []
    for site in run.select(None):
        slurm = site_slurm(site, run)
        try:
            if site.name not in reconciled:  # a sacct that fails leaves it for the next pass: nothing is submitted
                log.info("%s", _reconcile(slurm, state, site.name))
                reconciled.add(site.name)
            jobs = queue.site_jobs(slurm, state.run, site.name)
            state.listed(site.name, jobs)
            decision = decide(time.time() if now is None else now, site.name, jobs, state.seen[site.name],
                              target_reached, keeper)
            if isinstance(decision, Submit):
                line = _submit(run, site, slurm, state, state_path, decision, keeper.handover_s)
            elif isinstance(decision, StartNow):
                queue.start_now(slurm, decision.job_id)
                line = f"{site.name}: starting job {decision.seq} ({decision.job_id}) now: {decision.reason}"
            else:
                line = f"{site.name}: holding: {decision.reason}"
        except (SlurmError, templates.TemplateError, OSError) as err:
            line = f"{site.name}: cannot act this pass: {err}"
            decision = Hold(site.name, str(err))
        state.decisions.append({"at": time.time(), "site": site.name, "line": line,
                                "kind": type(decision).__name__.lower()})
        log.info("%s", line)
        lines.append(line)
    state.save(state_path)
    return lines


def _reconcile(slurm: SlurmSite, state: AutopilotState, site: str) -> str:
    """Enters `site`'s jobs of the run that its accounting remembers into `state` (the highest
    sequence number, the ended jobs); the line that says what it found. Once per site and process:
    a running loop then sees every job in squeue, which lists an ended one for MinJobAge (300 s by
    default) while passes come every `--interval` (60 s); under scrontab every `--once` is a start."""
    found = history.site_history(slurm, state.run, site)
    if found.no_accounting:
        return (f"no Slurm accounting at {site} (sacct: {found.no_accounting}): its job numbers come from squeue "
                "and the state file only, so a lost state file can reuse the number of a job squeue forgot")
    highest = max((j.seq for j in found.jobs), default=0)
    before, entered = state.reconciled(site, found.jobs)
    return (f"reconciled {site} from sacct on the loop's first pass there: highest sequence {highest} (state file "
            f"had {before}); {entered} ended job(s) entered")


def _submit(run: cfg.PlacementRun, site: cfg.SiteSlurm, slurm: SlurmSite, state: AutopilotState, state_path: Path,
            decision: Submit, handover_s: float) -> str:
    # Recorded first: if the loop dies during sbatch, the number is burnt, never reused.
    state.seen[site.name] = decision.seq
    state.save(state_path)
    name = job_name(state.run, site.name, decision.seq)
    probed = _shape(run, site, name, decision.begin)
    shape, begin, led = probed.choice.shape, decision.begin, ""
    if decision.begin is not None:
        wait, why = _calibrated_wait(probed)
        begin, led = led_begin(time.time(), decision.begin, wait, float(shape.time_s), handover_s, why)
    job_id = queue.submit(slurm, shape, name, templates.render(site, run.path, decision.seq), begin)
    state.submitted(Job(site.name, decision.seq, job_id, JobState.QUEUED, "PENDING", float(shape.time_s),
                        begin=begin, nodes=shape.nodes))
    if probed.prediction is not None:  # the prediction log learns how this site's predictions come true
        # Its wait counts from when it may start, not from a submission held back by --begin.
        at = utc_now() if begin is None else max(utc_now(), dt.datetime.fromtimestamp(begin, dt.timezone.utc))
        try:
            PredictionLog(run.placement.log).record_submit(
                site.name, job_id, at, at + dt.timedelta(seconds=probed.prediction.wait_s), shape)
        except OSError as err:  # the job is queued: a log we cannot write must not hide that
            log.warning("%s: job %s not recorded in the prediction log: %s", site.name, job_id, err)
    return (f"{site.name}: submitted {name} as job {job_id} ({shape.describe()}): {decision.reason}"
            + "".join(f"; {part}" for part in (led, probed.choice.reason) if part))


@dataclass(frozen=True)
class _Probed:
    """The shape to submit, and what the probe said of it."""

    choice: ShapeChoice
    prediction: Prediction | None = None
    """Slurm's own answer for the chosen shape, uncalibrated (None: not probed, or refused)."""
    calibration: Calibration | None = None
    error: str = ""
    """Why there is no prediction, where a probe was asked for."""


def _shape(run: cfg.PlacementRun, site: cfg.SiteSlurm, name: str, begin: float | None) -> _Probed:
    """The node count to ask for: the configured one where the site lists no other, else the one
    whose job trains the most tokens by the probes (ops/autopilot/shapes.py). Probed also with one
    shape when a successor is queued (`begin`): its --begin is led by the predicted wait. SlurmError
    where squeue fails on the site's earlier jobs of a site with several shapes: the pass skips the
    site, as for any Slurm failure."""
    single = len(site.shapes()) == 1
    if single and begin is None:
        return _Probed(ShapeChoice(site.shape, None, ""))
    try:  # probed under the job's own name, as the job it stands for
        probe = probe_site(site, run, PredictionLog(run.placement.log), job_name=name)
    except PredictionLogError as err:
        why = "" if single else f"{site.shape.nodes} nodes (configured): {err}"
        return _Probed(ShapeChoice(site.shape, None, why), error=str(err))
    if not probe.predictions and not probe.refused and not single:  # squeue failed before any probe
        raise SlurmError(probe.error)
    choice = (ShapeChoice(site.shape, None, "") if single
              else choose(_options(site, probe), site.shape, time.time(), begin))
    prediction = next((p for p in probe.predictions if p.shape == choice.shape), None)
    error = probe.refused.get(choice.shape) or (probe.error.splitlines() or ["not probed"])[-1]
    return _Probed(choice, prediction, probe.calibration, "" if prediction else error)


def _calibrated_wait(probed: _Probed) -> tuple[float | None, str]:
    """The chosen shape's calibrated predicted queue wait, and where it comes from; None where
    there is none to trust (no answer, or too few pairs: a raw answer is far too long)."""
    if probed.prediction is None or probed.calibration is None:
        return None, f"no --test-only answer ({probed.error or 'not probed'})"
    if not probed.calibration.calibrated:
        return None, (f"{probed.calibration.reason}, Slurm's own {probed.prediction.wait_s:.0f} s "
                      "is not trusted")
    return (probed.calibration.wait_s(probed.prediction.wait_s),
            f"Slurm's {probed.prediction.wait_s:.0f} s x {probed.calibration.reason}")


def _options(site: cfg.SiteSlurm, probe: SiteProbe) -> list[ShapeOption]:
    """Each shape of the site as the choice sees it: its calibrated start, or Slurm's refusal."""
    assert probe.calibration is not None
    starts = {p.shape: p.probed_at.timestamp() + probe.calibration.wait_s(p.wait_s) for p in probe.predictions}
    return [ShapeOption(shape, starts.get(shape), site.tokens_per_s_for(shape), probe.refused.get(shape, ""))
            for shape in site.shapes()]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("autopilot", help="keep every site's next Slurm job queued until the run is done")
    p.add_argument("--config", type=Path, required=True, help="the run file ([sites.NAME.slurm] tables)")
    p.add_argument("--state", type=Path, help="state file (default: <run file>.autopilot.json)")
    p.add_argument("--once", action="store_true", help="one pass, then exit (scrontab, cron, tests)")
    p.add_argument("--interval", type=float, default=60.0, help="seconds between passes (default 60)")
    p.add_argument("--handover", type=float, default=KeeperConfig.handover_s,
                   help=f"seconds before a job's end its successor may start (default {KeeperConfig.handover_s:.0f})")
    p.add_argument("--peer", help="a member of the run: stop submitting once its data epochs are done")
    add_client_flags(p)
    p.set_defaults(func=_main)


def _target_reached(args: argparse.Namespace) -> bool:
    """Whether the mesh says its data epochs are done (False without --peer, or when nobody answers)."""
    if not args.peer:
        return False
    try:
        with open_blocking_channel(args.peer, client_credentials(args)) as channel:
            reply = admin_pb2_grpc.AdminStub(channel).Status(admin_pb2.StatusRequest(), timeout=30)
    except (grpc.RpcError, CertError) as err:  # a mesh that does not answer must not stop the queues
        log.warning("cannot ask %s whether the run is done (%s): going on", args.peer, err)
        return False
    return reply.HasField("training") and reply.training.epoch_complete


def _main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        run = cfg.load(args.config)
        state_path = args.state or args.config.with_name(args.config.name + ".autopilot.json")
        state = AutopilotState.load(state_path, run_name(args.config))
        keeper = KeeperConfig(handover_s=args.handover)
    except (cfg.PlacementConfigError, ValueError, OSError) as err:
        print(f"ops autopilot: error: {err}", file=sys.stderr)
        return 2
    reconciled: set[str] = set()
    while True:
        one_pass(run, state, state_path, _target_reached(args), keeper, reconciled)
        if args.once:
            return 0
        time.sleep(args.interval)
