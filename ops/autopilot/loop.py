"""`ops autopilot`: keeps every site's next job queued until the run is done.

    ops autopilot --config run.toml                       # every 60 s, until stopped
    ops autopilot --config run.toml --once                # one pass (cron, scrontab, tests)
    ops autopilot --config run.toml --peer HOST:PORT --certs certs/ --as alice   # stop at the end

Each pass, for each site with a `[sites.NAME.slurm]` table: list the run's jobs there (squeue,
through the site's command prefix: ops/autopilot/queue.py), decide (ops/autopilot/keeper.py),
submit what was decided (the site's sbatch template, ops/placement/templates.py; among its
`node_options`, the node count whose job trains the most tokens by `sbatch --test-only`:
ops/autopilot/shapes.py), and log the decision with its reason. With `--peer` the loop asks the mesh whether the
run's data epochs are done and then submits nothing more.

Its state is one JSON file (`--state`, default `<run file>.autopilot.json`, ops/autopilot/state.py):
the highest sequence number submitted per site, the decisions taken, and every job of the run as
squeue last showed it (its start, end, final state and nodes: `ops report --autopilot-state` counts
the ended ones that left no peer record). It is written before and after each sbatch, so a loop
killed between the two, restarted, or run twice by mistake still never reuses a job name: the next
number is above every one the file or the queue has seen. Where it is meant to live:
a login node under `scrontab` (`--once` every few minutes) or a small service machine, anywhere the
sites' command prefixes (`ssh lumi-uan01 ...`) work from; docs/decisions/autopilot-operator-loop.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
import time
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

import grpc

from ops.autopilot import queue
from ops.autopilot.keeper import Hold, Job, JobState, KeeperConfig, StartNow, Submit, decide, job_name
from ops.autopilot.shapes import ShapeChoice, ShapeOption, choose
from ops.autopilot.state import AutopilotState
from ops.certs import CertError, add_client_flags, client_credentials
from ops.placement import config as cfg
from ops.placement import templates
from ops.placement.predictions import PredictionLog, PredictionLogError
from ops.placement.probing import SiteProbe, probe_site, site_slurm
from ops.placement.slurm import SlurmError, SlurmSite, utc_now
from peer.gen.sitemesh.v1 import admin_pb2, admin_pb2_grpc
from peer.transport.channels import open_blocking_channel

log = logging.getLogger("sitemesh.autopilot")


def run_name(path: Path) -> str:
    """The run's name from the run file's `[run] name` (the job names carry it)."""
    return str(tomllib.loads(path.read_text()).get("run", {}).get("name", "sitemesh"))


def one_pass(run: cfg.PlacementRun, state: AutopilotState, state_path: Path, target_reached: bool,
             keeper: KeeperConfig, now: float | None = None) -> list[str]:
    """Decides and submits for every site once; the decision lines, also logged and recorded."""
    lines = []
    for site in run.select(None):
        slurm = site_slurm(site, run)
        try:
            jobs = queue.site_jobs(slurm, state.run, site.name)
            state.listed(site.name, jobs)
            decision = decide(time.time() if now is None else now, site.name, jobs, state.seen[site.name],
                              target_reached, keeper)
            if isinstance(decision, Submit):
                line = _submit(run, site, slurm, state, state_path, decision)
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


def _submit(run: cfg.PlacementRun, site: cfg.SiteSlurm, slurm: SlurmSite, state: AutopilotState, state_path: Path,
            decision: Submit) -> str:
    # Recorded first: if the loop dies during sbatch, the number is burnt, never reused.
    state.seen[site.name] = decision.seq
    state.save(state_path)
    name = job_name(state.run, site.name, decision.seq)
    choice = _shape(run, site, name, decision.begin)
    job_id = queue.submit(slurm, choice.shape, name, templates.render(site, run.path, decision.seq), decision.begin)
    state.submitted(Job(site.name, decision.seq, job_id, JobState.QUEUED, "PENDING", float(choice.shape.time_s),
                        begin=decision.begin, nodes=choice.shape.nodes))
    if choice.start is not None:  # the prediction log learns how this site's predictions come true
        try:
            PredictionLog(run.placement.log).record_submit(
                site.name, job_id, utc_now(), dt.datetime.fromtimestamp(choice.start, dt.timezone.utc), choice.shape)
        except OSError as err:  # the job is queued: a log we cannot write must not hide that
            log.warning("%s: job %s not recorded in the prediction log: %s", site.name, job_id, err)
    return (f"{site.name}: submitted {name} as job {job_id} ({choice.shape.describe()}): {decision.reason}"
            + (f"; {choice.reason}" if choice.reason else ""))


def _shape(run: cfg.PlacementRun, site: cfg.SiteSlurm, name: str, begin: float | None) -> ShapeChoice:
    """The node count to ask for: the configured one where the site lists no other, else the one
    whose job trains the most tokens by the probes (ops/autopilot/shapes.py). SlurmError where squeue
    fails on the site's earlier jobs: the pass skips the site, as for any Slurm failure."""
    if len(site.shapes()) == 1:
        return ShapeChoice(site.shape, None, "")
    try:  # probed under the job's own name, as the job it stands for
        probe = probe_site(site, run, PredictionLog(run.placement.log), job_name=name)
    except PredictionLogError as err:
        return ShapeChoice(site.shape, None, f"{site.shape.nodes} nodes (configured): {err}")
    if not probe.predictions and not probe.refused:  # squeue failed before any shape was probed
        raise SlurmError(probe.error)
    return choose(_options(site, probe), site.shape, time.time(), begin)


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
    while True:
        one_pass(run, state, state_path, _target_reached(args), keeper)
        if args.once:
            return 0
        time.sleep(args.interval)
