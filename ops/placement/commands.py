"""`ops probe`, `ops place`, `ops submit` and `ops simulate-queue`: placement from the command line.

    ops probe --config examples/run.toml --site lumi
    ops place --config examples/run.toml --json
    ops submit --config examples/run.toml --dry-run
    ops simulate-queue --trials 200

probe: one `sbatch --test-only` per site and node option (ops/placement/probing.py); prints
predicted and calibrated waits, and the node options Slurm refused with its reason, and logs every
prediction (and the real start of jobs submitted earlier) in the prediction log.
place: probes, then the plan (ops/placement/plan.py) over the answered options with its reason per
site. submit: places, then submits the planned jobs with the site's sbatch template. Exit status:
0 fine, 1 a site failed (squeue failed, or Slurm refused every node option: its error and Slurm's
raw answer are printed), 2 a configuration error. The `--json`
layouts are documented in docs/placement.md and only grow new keys.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import grpc

from ops.certs import CertError, add_client_flags, client_credentials
from ops.placement import config as cfg
from ops.placement import queue_model, templates
from ops.placement.plan import Option, Plan, after, make_plan
from ops.placement.predictions import PredictionLog, PredictionLogError
from ops.placement.probing import SiteProbe, probe_site, site_slurm
from ops.placement.slurm import SlurmError, utc_now
from peer.gen.sitemesh.v1 import admin_pb2, admin_pb2_grpc
from peer.transport.channels import open_blocking_channel


def options_for(probe: SiteProbe, now: datetime) -> tuple[list[Option], Option]:
    """The planner's options for one probed site (its shapes Slurm did not refuse), and its default:
    the configured shape, or where Slurm refused that, the answered shape nearest to it in nodes."""
    site, cal = probe.site, probe.calibration
    assert cal is not None and not probe.error, "options of a site whose probe failed"
    options = []
    for p in probe.predictions:
        wait = cal.wait_s(p.wait_s)
        options.append(Option(site.name, p.shape, wait, site.tokens_per_s_for(p.shape), wait))
    # The default stands for what the site is configured to ask for (the plan's naive baseline).
    default = min(options, key=lambda o: (abs(o.shape.nodes - site.shape.nodes), o.shape.nodes))
    job = probe.active_job()
    if job is None:
        return options, default
    # The site already has an allocation coming or running: plan around it, submit nothing more.
    shape = probe.job_shapes[job.job_id]
    if job.started and job.start is not None:
        start, end = 0.0, max(0.0, (job.start + timedelta(seconds=shape.time_s) - now).total_seconds())
    else:
        start = max(0.0, (job.start - now).total_seconds()) if job.start else default.start_s
        end = start + shape.time_s
    same = next((o for o in options if o.shape == shape), default)
    existing = Option(
        site.name, shape, start, site.tokens_per_s_for(shape), same.resubmit_wait_s, end, job.job_id
    )
    return [existing], existing


class PeerError(RuntimeError):
    """The peer named by --peer did not answer."""


def _gossiped_tokens_per_s(args: argparse.Namespace, timeout_s: float) -> dict[str, float]:
    """tokens/s that running peers measured and gossiped, as the Admin/Status of the peer named by
    --peer reports them; dialled with --certs/--as (mutual TLS) like every other ops command."""
    address = args.peer
    try:
        creds = client_credentials(args)
    except CertError as err:
        raise PeerError(str(err)) from err
    with open_blocking_channel(address, creds) as channel:
        try:
            reply = admin_pb2_grpc.AdminStub(channel).Status(admin_pb2.StatusRequest(), timeout=timeout_s)
        except grpc.RpcError as err:
            raise PeerError(f"peer {address} did not answer Admin/Status: {err.code().name}") from err
    return {m.site: m.meta.tokens_per_s for m in reply.members if m.meta.tokens_per_s > 0}


def _parse_rate(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        rate = float(value)
    except ValueError:
        rate = -1.0
    if not sep or not name or not rate >= 0:
        raise argparse.ArgumentTypeError(f"expected SITE=TOKENS_PER_S, e.g. lumi=768000, got {text!r}")
    return name, rate


def _throughputs(run: cfg.PlacementRun, args: argparse.Namespace) -> cfg.PlacementRun:
    """The run with tokens/s from running peers (--peer), then from --tokens-per-s, applied."""
    rates: dict[str, float] = {}
    if getattr(args, "peer", None):
        rates.update(_gossiped_tokens_per_s(args, run.placement.probe_timeout_s))
    given = dict(getattr(args, "tokens_per_s", None) or [])
    unknown = sorted(set(given) - set(run.sites))
    if unknown:
        raise cfg.PlacementConfigError(
            f"--tokens-per-s names site(s) without a slurm table: {', '.join(unknown)}"
        )
    rates.update(given)
    sites = {n: replace(s, tokens_per_s=rates.get(n, s.tokens_per_s)) for n, s in run.sites.items()}
    return replace(run, sites=sites)


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _probe_json(probe: SiteProbe) -> dict[str, Any]:
    cal = probe.calibration
    return {
        "site": probe.site.name,
        "error": probe.error or None,
        "calibration": {"factor": cal.factor, "samples": cal.samples, "reason": cal.reason} if cal else None,
        "probes": [
            {
                "shape": p.shape.to_json(),
                "probed_at": _iso(p.probed_at),
                "predicted_start": _iso(p.answer.start),
                "predicted_wait_s": p.wait_s,
                "calibrated_wait_s": cal.wait_s(p.wait_s) if cal else None,
                "partition": p.answer.partition,
                "nodelist": p.answer.nodelist,
                "processors": p.answer.processors,
            }
            for p in probe.predictions
        ],
        "refused": [{"shape": shape.to_json(), "reason": why} for shape, why in probe.refused.items()],
        "jobs": [
            {
                "job_id": j.job_id,
                "state": j.state,
                "start": _iso(j.start) if j.start else None,
                "started": j.started,
            }
            for j in probe.jobs.values()
        ],
    }


def _print_errors(probes: Sequence[SiteProbe]) -> None:
    for p in probes:
        if p.error:
            print(f"error: site {p.site.name}: {p.error}", file=sys.stderr)


def _print_refused(probe: SiteProbe) -> None:
    for shape, why in probe.refused.items():
        print(f"{probe.site.name}: {shape.describe()} refused: {why}")


def _print_table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def cmd_probe(args: argparse.Namespace) -> int:
    run = cfg.load(args.config)
    log = PredictionLog(run.placement.log)
    probes = [probe_site(s, run, log) for s in run.select(args.site)]
    if args.json:
        print(json.dumps({"sites": [_probe_json(p) for p in probes]}, indent=2, sort_keys=True))
    else:
        rows = [["SITE", "SHAPE", "PREDICTED START (UTC)", "WAIT", "CALIBRATED", "PARTITION", "NODES"]]
        for p in probes:
            for pr in p.predictions:
                assert p.calibration is not None
                rows.append(
                    [
                        p.site.name,
                        pr.shape.describe(),
                        _iso(pr.answer.start),
                        after(pr.wait_s),
                        after(p.calibration.wait_s(pr.wait_s)),
                        pr.answer.partition,
                        pr.answer.nodelist,
                    ]
                )
        if len(rows) > 1:
            _print_table(rows)
        for p in probes:
            if p.calibration:
                print(f"{p.site.name}: calibration {p.calibration.reason}")
            _print_refused(p)
            for j in p.jobs.values():
                print(f"{p.site.name}: job {j.job_id} {j.state} start {_iso(j.start) if j.start else '?'}")
    _print_errors(probes)
    return 1 if any(p.error for p in probes) else 0


def place(run: cfg.PlacementRun, log: PredictionLog) -> tuple[Plan | None, list[SiteProbe], datetime]:
    """Probes every site and plans over those that answered (None if none did)."""
    probes = [probe_site(s, run, log) for s in run.select(None)]
    now = utc_now()
    answered = [p for p in probes if not p.error]
    if not answered:
        return None, probes, now
    options = {p.site.name: options_for(p, now) for p in answered}
    plan = make_plan(
        {n: o[0] for n, o in options.items()},
        {n: o[1] for n, o in options.items()},
        run.placement.target_tokens,
    )
    return plan, probes, now


def _print_plan(plan: Plan, now: datetime) -> None:
    print(f"plan for {plan.target_tokens:.3g} tokens, from probes at {_iso(now)}:")
    rows = [["SITE", "ACTION", "SHAPE", "START", "TOK/S", "REASON"]]
    for d in plan.decisions:
        action = "submit" if d.submit else ("has job" if d.option and d.option.existing_job else "skip")
        rows.append(
            [
                d.site,
                action,
                d.option.shape.describe() if d.option else "-",
                after(d.option.start_s) if d.option else "-",
                f"{d.option.tokens_per_s:,.0f}" if d.option else "-",
                d.reason,
            ]
        )
    _print_table(rows)
    gain = 1 - plan.time_to_target_s / plan.wait_for_all_s if math.isfinite(plan.wait_for_all_s) else 1.0
    print(
        f"time-to-target: queue-aware {after(plan.time_to_target_s)} (training starts "
        f"{after(plan.training_starts_s)}), start-with-any {after(plan.start_with_any_s)}, "
        f"wait-for-all {after(plan.wait_for_all_s)}; reduction vs wait-for-all {gain:.1%}"
    )


def cmd_place(args: argparse.Namespace) -> int:
    run = _throughputs(cfg.load(args.config), args)
    plan, probes, now = place(run, PredictionLog(run.placement.log))
    if args.json:
        body = plan.to_json() if plan else {}
        print(
            json.dumps(
                {"planned_at": _iso(now), "plan": body, "probes": [_probe_json(p) for p in probes]},
                indent=2,
                sort_keys=True,
            )
        )
    elif plan:
        _print_plan(plan, now)
        for p in probes:  # why a node count is missing from the plan's alternatives
            _print_refused(p)
    _print_errors(probes)
    return 1 if plan is None or any(p.error for p in probes) else 0


def cmd_submit(args: argparse.Namespace) -> int:
    run = _throughputs(cfg.load(args.config), args)
    log = PredictionLog(run.placement.log)
    plan, probes, _ = place(run, log)
    _print_errors(probes)
    if plan is None or any(p.error for p in probes):
        print(
            "nothing submitted: every site must answer its probe before a plan is submitted", file=sys.stderr
        )
        return 1
    wanted = set(args.site or run.sites)
    if wanted - set(run.sites):
        raise cfg.PlacementConfigError(
            f"--site names site(s) without a slurm table: {sorted(wanted - set(run.sites))}"
        )
    predicted = {(p.site.name, pr.shape): pr for p in probes for pr in p.predictions}
    submitted = []
    for d in plan.decisions:
        if not d.submit or d.site not in wanted:
            continue
        assert d.option is not None
        site = run.sites[d.site]
        script = templates.render(site, run.path)
        slurm = site_slurm(site, run)
        name = f"sitemesh-{site.name}"
        if args.dry_run:
            cmd = slurm.command(["sbatch", "--parsable", f"--job-name={name}", *d.option.shape.sbatch_args()])
            print(f"# {d.site}: would run (script on stdin): {' '.join(cmd)}\n{script}")
            continue
        job_id = slurm.submit(d.option.shape, name, script)
        log.record_submit(
            d.site, job_id, utc_now(), predicted[(d.site, d.option.shape)].answer.start, d.option.shape
        )
        submitted.append({"site": d.site, "job_id": job_id, "shape": d.option.shape.to_json()})
        if not args.json:
            print(f"{d.site}: submitted job {job_id} ({d.option.shape.describe()}); {d.reason}")
    if args.json:
        print(
            json.dumps(
                {"plan": plan.to_json(), "submitted": submitted, "dry_run": bool(args.dry_run)},
                indent=2,
                sort_keys=True,
            )
        )
    return 0


def _guard(func: Any) -> Any:
    """Turns the user-fixable errors into a message and exit status instead of a traceback."""

    def run(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except (cfg.PlacementConfigError, templates.TemplateError, PredictionLogError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except (SlurmError, PeerError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 1

    return run


def register(subparsers: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config", required=True, help="the run file (TOML) with [placement] and [sites.NAME.slurm]"
    )
    common.add_argument("--json", action="store_true", help="machine-readable output (see docs/placement.md)")
    rates = argparse.ArgumentParser(add_help=False)
    rates.add_argument(
        "--tokens-per-s",
        metavar="SITE=RATE",
        type=_parse_rate,
        action="append",
        help="measured tokens/s of SITE's configured shape, overriding the run file (repeatable)",
    )
    rates.add_argument(
        "--peer",
        metavar="HOST:PORT",
        help="a running peer whose Admin/Status gives the tokens/s the sites gossip",
    )
    add_client_flags(rates)  # --certs/--as: dial --peer with mutual TLS

    p = subparsers.add_parser(
        "probe", parents=[common], help="predicted start per site and shape (sbatch --test-only)"
    )
    p.add_argument(
        "--site", help="probe only this site (default: every site with a [sites.NAME.slurm] table)"
    )
    p.set_defaults(func=_guard(cmd_probe))

    p = subparsers.add_parser(
        "place", parents=[common, rates], help="plan which sites to ask for which shape"
    )
    p.set_defaults(func=_guard(cmd_place))

    p = subparsers.add_parser(
        "submit", parents=[common, rates], help="submit the planned jobs with sbatch templates"
    )
    p.add_argument(
        "--site", action="append", help="submit only at this site (repeatable; the plan still uses all)"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the sbatch commands and scripts, submit nothing"
    )
    p.set_defaults(func=_guard(cmd_submit))

    queue_model.register(subparsers)
